"""One-shot pruning of a trained model: score every weight, choose a mask per layer, then either convert the
layers into BlockSparseLinear / SemiStructuredLinear (through the patcher) or keep the masks on the dense
layers for a recovery fine-tune (see masked.py).

    result = prune_model(model, {r".*mlp\\.(fc1|fc2)": {"density": 0.5, "block_shape": (32, 32)},
                                 r".*attn\\.(q|k|v|o)_proj": {"sparsity": "2:4"}},
                         score="wanda", calibration=batches)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Dict, Iterable, Optional, Tuple

import regex
import torch
from torch import nn
from tqdm.auto import tqdm

from ..layout import count_blocks
from ..masks import nm_mask, top_blocks
from ..patcher import BlockSparseModelPatcher, PatchReport
from .scores import SCORES, collect_input_norms, element_scores
from .spec import LayerMask, PruneSpec, Rules, match_layers
from .transposable import transposable_nm_mask

__all__ = ["PruningResult", "compute_masks", "prune_model", "convert_with_masks"]


@dataclasses.dataclass
class PruningResult:
    """What ``prune_model`` did: the mask of every pruned layer, and the patcher's report when converted."""
    masks: Dict[str, LayerMask]
    report: Optional[PatchReport] = None

    @property
    def density(self) -> float:
        """Fraction of the pruned layers' weights that are kept."""
        kept = sum(int(m.mask.sum()) for m in self.masks.values())
        total = sum(m.mask.numel() for m in self.masks.values())
        return kept / total if total else 1.0

    def __str__(self) -> str:
        lines = [f"pruned {len(self.masks)} layers to density {self.density:.4g}"]
        for name, m in self.masks.items():
            pattern = f"{m.spec.nm[0]}:{m.spec.nm[1]}{' transposable' if m.spec.transposable else ''}" \
                if m.spec.is_nm else f"blocks {m.spec.block_shape}"
            lines.append(f"  {name}: {pattern}, density {m.density:.4g}")
        return "\n".join(lines)


def _block_sums(scores: torch.Tensor, block_shape: Tuple[int, int]) -> torch.Tensor:
    br, bc = block_shape
    rows, cols = scores.shape
    return scores.reshape(rows // br, br, cols // bc, bc).sum(dim=(1, 3))


def _global_block_masks(block_scores: Dict[str, torch.Tensor], specs: Dict[str, PruneSpec], global_density: float,
                        min_density: float, owner: str) -> Dict[str, torch.Tensor]:
    """Spread one budget of ``global_density`` x (all weights of these layers) over the layers: blocks are
    ranked by their mean per-weight score (so layers of different block shapes compete fairly); every layer
    first gets its ``min_density`` share of its best blocks."""
    count_blocks(1, density=global_density, owner=f"{owner}: global_density")
    count_blocks(1, density=min_density, owner=f"{owner}: min_density")
    if min_density > global_density:
        raise ValueError(f"{owner}: min_density={min_density} must not exceed global_density={global_density}")
    masks, candidates = {}, []
    total = sum(s.numel() * math.prod(specs[n].block_shape) for n, s in block_scores.items())
    budget = int(math.floor(global_density * total + 0.5))
    for index, (name, sums) in enumerate(block_scores.items()):
        size = math.prod(specs[name].block_shape)
        reserved = top_blocks(sums, density=min_density)
        masks[name] = reserved
        budget -= int(reserved.sum()) * size
        free = (~reserved).flatten().nonzero().squeeze(1)
        mean = sums.flatten()[free] / size
        candidates.append((mean, torch.full_like(free, index), free, torch.full_like(free, size)))
    if candidates and budget > 0:
        mean, layer, position, size = (torch.cat(parts) for parts in zip(*candidates))
        order = mean.argsort(descending=True, stable=True)
        take = order[size[order].cumsum(0) <= budget]
        names = list(block_scores)
        for index in layer[take].unique().tolist():
            chosen = position[take][layer[take] == index]
            masks[names[index]].view(-1)[chosen] = True
    return masks


def compute_masks(model: nn.Module, rules: Rules, *, score: str = "l2", calibration: Optional[Iterable[Any]] = None,
                  forward: Optional[Callable[[nn.Module, Any], Any]] = None,
                  input_norms: Optional[Dict[str, torch.Tensor]] = None, global_density: Optional[float] = None,
                  min_density: float = 0.0, progress: bool = True, _densities: Optional[Dict[str, float]] = None,
                  _nm_keep: Optional[Dict[str, int]] = None, _owner: str = "compute_masks") -> Dict[str, LayerMask]:
    """Choose a mask for every layer the ``rules`` match (see spec.py for the rule format); the model is not
    changed.

    score: "l2" (block L2 norm / |W| for N:M), "l1" (block L1 norm), or "wanda" (|W| x input-feature norm over
        the ``calibration`` batches, gathered by forward hooks; or give ``input_norms`` from
        ``collect_input_norms``). A rule's own "score" key overrides it. Block scores sum the element scores
        of the block; N:M keeps the N best scores of every M consecutive inputs.
    global_density: instead of per-rule densities, keep this fraction of all the weights of the block/vector
        layers, the best blocks over all of them (ranked by mean score per weight); each layer keeps at least
        ``min_density``. N:M layers keep their N/M and do not take part.
    progress: a tqdm bar over the layers.
    Returns {name: LayerMask}.
    """
    owner = _owner
    if score not in SCORES:
        raise ValueError(f"{owner}: score={score!r} must be one of {SCORES}")
    layers = match_layers(model, rules, owner)
    specs = {name: spec for name, (_, spec) in layers.items()}
    for name, spec in specs.items():
        if spec.is_nm:
            continue
        if global_density is not None and spec.density is not None and _densities is None:
            raise ValueError(f"{owner}: the rule {spec.rule!r} sets density={spec.density} but global_density="
                             f"{global_density} is given; give one or the other")
        if global_density is None and spec.density is None and _densities is None:
            raise ValueError(f"{owner}: the rule {spec.rule!r} (layer '{name}') needs a density, or give "
                             f"global_density")
    if global_density is not None and not any(not s.is_nm for s in specs.values()):
        raise ValueError(f"{owner}: global_density={global_density} needs at least one block or vector rule; "
                         f"N:M layers keep N/M")
    wanda = [n for n, s in specs.items() if (s.score or score) == "wanda"]
    if wanda and input_norms is None:
        if calibration is None:
            raise ValueError(f"{owner}: score='wanda' (layers {wanda[:3]}{'...' if len(wanda) > 3 else ''}) needs "
                             f"calibration batches (calibration=...) or input_norms")
        input_norms = collect_input_norms(model, calibration, wanda, forward)

    block_sums: Dict[str, torch.Tensor] = {}
    result: Dict[str, LayerMask] = {}
    for name in tqdm(specs, desc="pruning", unit="layer", disable=not progress):
        module, spec = layers[name]
        scores = element_scores(module, spec.score or score, (input_norms or {}).get(name))
        if spec.is_nm:
            n, m = spec.nm
            keep = n if _nm_keep is None else _nm_keep[name]
            if keep >= m:
                mask = torch.ones_like(scores, dtype=torch.bool)
            elif spec.transposable and keep == 2:
                mask = transposable_nm_mask(scores, scores=scores)
            else:
                mask = nm_mask(scores, (keep, m), dim=1)
            result[name] = LayerMask(name, spec, mask)
        else:
            sums = _block_sums(scores, spec.block_shape)
            if global_density is None:
                density = spec.density if _densities is None else _densities[name]
                result[name] = LayerMask.from_block_mask(name, spec, top_blocks(sums, density=density, owner=owner))
            else:
                block_sums[name] = sums
    if block_sums:
        chosen = _global_block_masks(block_sums, specs, global_density, min_density, owner)
        for name, block_mask in chosen.items():
            result[name] = LayerMask.from_block_mask(name, specs[name], block_mask)
    return {name: result[name] for name in specs}


def convert_with_masks(model: nn.Module, masks: Dict[str, LayerMask]) -> PatchReport:
    """Replace every layer of ``masks`` by a BlockSparseLinear (block/vector mask: the kept blocks with their
    trained values) or a SemiStructuredLinear (N:M mask), through ``BlockSparseModelPatcher`` with one rule
    per layer. A dense layer already masked (parametrized) is converted from its masked weight."""
    patcher = BlockSparseModelPatcher()
    for name, layer_mask in masks.items():
        spec = layer_mask.spec
        if spec.is_nm:
            info = dict(sparsity=f"{spec.nm[0]}:{spec.nm[1]}", mask=layer_mask.mask)
        else:
            block_mask = layer_mask.block_mask
            if block_mask is None:  # from an element mask: keep every block that keeps anything
                rows, cols = layer_mask.mask.shape
                br, bc = spec.block_shape
                block_mask = layer_mask.mask.reshape(rows // br, br, cols // bc, bc).any(dim=3).any(dim=1)
            info = dict(block_shape=spec.block_shape, block_mask=block_mask)
        patcher.add_pattern(regex.escape(name), info)
    return patcher.patch_model(model)


def prune_model(model: nn.Module, rules: Rules, *, score: str = "l2", calibration: Optional[Iterable[Any]] = None,
                forward: Optional[Callable[[nn.Module, Any], Any]] = None,
                input_norms: Optional[Dict[str, torch.Tensor]] = None, global_density: Optional[float] = None,
                min_density: float = 0.0, convert: bool = True, progress: bool = True) -> PruningResult:
    """One-shot pruning: ``compute_masks`` (same arguments), then

    convert=True: replace the layers by BlockSparseLinear / SemiStructuredLinear holding the kept weights
        (``result.report`` is the patcher's report);
    convert=False: keep the dense layers and hold the masks on them (``apply_masks``) for a recovery
        fine-tune; ``convert_masked_model(model)`` converts them later with identical outputs.
    """
    masks = compute_masks(model, rules, score=score, calibration=calibration, forward=forward,
                          input_norms=input_norms, global_density=global_density, min_density=min_density,
                          progress=progress, _owner="prune_model")
    if convert:
        return PruningResult(masks, convert_with_masks(model, masks))
    from .masked import apply_masks

    apply_masks(model, masks)
    return PruningResult(masks)
