"""Rewrite the layers of any model by regex rules on their qualified names.

``ModelPatcher`` holds the rules and does the walking; subclasses say which modules can be patched and
what replaces them. ``BlockSparseModelPatcher`` turns ``nn.Linear`` (and transformers' GPT-2 ``Conv1D``)
layers into ``BlockSparseLinear`` or ``SemiStructuredLinear``.

Matching differs from pytorch_block_sparse 0.1.2 on purpose: a rule must match the *whole* qualified name
(``regex.fullmatch``), so ``encoder\\.layer\\.1\\.output\\.dense`` no longer also hits ``encoder.layer.10...``
as ``re.match`` did. Write ``.*`` where a prefix or suffix may vary.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Dict, List, Optional, Tuple

import regex
import torch
from torch import nn

from .layout import check_block_shape, count_blocks
from .masks import parse_nm
from .modules import (BlockSparseLinear, MaskedLinear, PseudoBlockSparseLinear, SemiStructuredLinear,
                      _is_hf_conv1d, dense_weight_of)

__all__ = ["ModelPatcher", "BlockSparseModelPatcher", "PatchRecord", "PatchReport"]


def _count_parameters(module: Optional[nn.Module]) -> int:
    return 0 if module is None else sum(p.numel() for p in module.parameters())


@dataclasses.dataclass
class PatchRecord:
    """One replaced layer: its qualified name, the rule that matched, both modules and their parameter counts."""
    name: str
    pattern: str
    old_module: nn.Module
    new_module: nn.Module
    params_before: int
    params_after: int


class PatchReport(List[PatchRecord]):
    """The list of ``PatchRecord`` of one ``patch_model`` call, with totals and a printable table."""

    dry_run: bool = False

    @property
    def params_before(self) -> int:
        return sum(r.params_before for r in self)

    @property
    def params_after(self) -> int:
        return sum(r.params_after for r in self)

    def __str__(self) -> str:
        verb = "would replace" if self.dry_run else "replaced"
        lines = [f"{verb} {len(self)} layers: {self.params_before:,} -> {self.params_after:,} parameters"]
        for r in self:
            new = f"{type(r.new_module).__name__}({r.new_module.extra_repr()})"
            lines.append(f"  {r.name}: {type(r.old_module).__name__} -> {new} "
                         f"({r.params_before:,} -> {r.params_after:,})")
        return "\n".join(lines)


class ModelPatcher:
    """Regex rules -> module replacement. Subclasses implement ``is_patchable`` and ``new_child_module``.

    ``add_pattern(pattern, patch_info)`` appends a rule; for each module the first rule whose pattern
    fullmatches its qualified name (as in ``model.named_modules()``) decides: ``patch_info=None`` leaves it
    alone, anything else is handed to ``new_child_module``.
    """

    def __init__(self):
        self.patterns: List[Dict[str, Any]] = []

    # ------------------------------------------------------------------ rules
    def add_pattern(self, pattern: str, patch_info: Optional[Dict[str, Any]]) -> None:
        try:
            compiled = regex.compile(pattern)
        except regex.error as error:
            raise ValueError(f"{type(self).__name__}.add_pattern: pattern={pattern!r} is not a valid regex: "
                             f"{error}") from None
        if patch_info is not None and not isinstance(patch_info, dict):
            raise TypeError(f"{type(self).__name__}.add_pattern: patch_info for {pattern!r} must be a dict or None, "
                            f"got {type(patch_info).__name__}")
        self.patterns.append(dict(pattern=pattern, compiled=compiled, patch_info=patch_info))

    def pattern_match(self, module_name: str) -> Tuple[bool, Optional[str], Optional[Dict[str, Any]]]:
        """(matched, pattern, patch_info) of the first rule that fullmatches ``module_name``."""
        for rule in self.patterns:
            if rule["compiled"].fullmatch(module_name):
                return True, rule["pattern"], rule["patch_info"]
        return False, None, None

    # ------------------------------------------------------------------ to implement
    def is_patchable(self, module_name: str, module: nn.Module, raise_error: bool) -> bool:
        return True

    def new_child_module(self, child_module_name: str, child_module: nn.Module,
                         patch_info: Dict[str, Any]) -> Optional[nn.Module]:
        """The replacement of ``child_module``, or None to leave it (subclasses may warn why)."""
        raise NotImplementedError(f"{type(self).__name__} must implement new_child_module")

    # ------------------------------------------------------------------ walking
    def get_patchable_layers(self, model: nn.Module, number_rewrite: bool = False) -> List[Dict[str, Any]]:
        """The layers rules could replace: [{"name", "regexp", "layer"}]. With ``number_rewrite`` the digits
        of each name become ``[0-9]+`` and equal patterns are listed once (``layer`` is the first match)."""
        found: Dict[str, Dict[str, Any]] = {}
        for name, module in model.named_modules():
            if not name or not self.is_patchable(name, module, raise_error=False):
                continue
            pattern = regex.escape(name)
            if number_rewrite:
                pattern = regex.sub(r"(?<=^|\\\.)[0-9]+(?=\\\.|$)", "[0-9]+", pattern)
            found.setdefault(pattern, dict(name=name, regexp=pattern, layer=module))
        return list(found.values())

    def patch_model(self, model: nn.Module, dry_run: bool = False) -> PatchReport:
        """Replace every matched layer of ``model`` in place and return a ``PatchReport``.

        All replacements are built first and installed only when every matched layer converted, so an error
        leaves the model untouched. ``dry_run=True`` builds them and reports without installing. A module
        reachable under several names (shared or tied) is replaced by one new module everywhere.
        """
        report = PatchReport()
        report.dry_run = dry_run
        replacements: Dict[int, Optional[nn.Module]] = {}
        sites: List[Tuple[str, nn.Module]] = []
        any_rule_matched = False
        for name, module in model.named_modules(remove_duplicate=False):
            if not name:
                continue  # the root has no parent to be replaced in
            matched, pattern, patch_info = self.pattern_match(name)
            if not matched:
                continue
            any_rule_matched = True
            if patch_info is None:
                continue
            if id(module) not in replacements:
                self.is_patchable(name, module, raise_error=True)
                new_module = self.new_child_module(name, module, patch_info)
                replacements[id(module)] = new_module
                if new_module is not None:
                    report.append(PatchRecord(name, pattern, module, new_module, _count_parameters(module),
                                              _count_parameters(new_module)))
            if replacements[id(module)] is not None:
                sites.append((name, module))

        # A shared module is replaced under all of its names, matched or not, so that it stays shared.
        sited = {name for name, _ in sites}
        for name, module in model.named_modules(remove_duplicate=False):
            if name and name not in sited and replacements.get(id(module)) is not None:
                sites.append((name, module))

        if not any_rule_matched:
            layers = [layer["regexp"] for layer in self.get_patchable_layers(model, number_rewrite=True)]
            shown = ", ".join(layers[:20]) + (f", ... ({len(layers)} in all)" if len(layers) > 20 else "")
            warnings.warn(f"{type(self).__name__}.patch_model: no rule matched any layer of {type(model).__name__}; "
                          f"patchable layers: {shown or 'none'}", UserWarning, stacklevel=2)
        if not dry_run:
            for name, module in sites:
                parent_name, _, child_name = name.rpartition(".")
                setattr(model.get_submodule(parent_name), child_name, replacements[id(module)])
            if report:  # transformers models: keep the sparse layout in model.config for save_pretrained
                from .serialization import _note_replaced  # serialization imports this package's modules
                _note_replaced(model, {r.name: type(r.old_module).__name__ for r in report})
        return report


_BLOCK_KEYS = {"density", "block_shape", "sparsity", "init", "norm", "pseudo_linear", "skip_incompatible",
               "block_mask", "mask"}
_INITS = ("magnitude", "random")


class BlockSparseModelPatcher(ModelPatcher):
    """Replace ``nn.Linear`` / transformers ``Conv1D`` layers by sparse ones.

    patch_info keys (all optional):
        density (0.5): fraction of blocks kept (block sparsity).
        block_shape ((32, 32)): (rows along out_features, columns along in_features).
        sparsity ("block"): "block", or "N:M" such as "2:4" for ``SemiStructuredLinear``.
        init ("magnitude"): "magnitude" keeps the blocks (or N of M weights) of largest norm *with their
            values* -- right after pruning a trained model, and harmless on a fresh one, whose random weights
            give a random pattern; "random" draws a fresh pattern and fresh values scaled for the density.
        norm ("l2"): block norm used by "magnitude", "l2" or "l1".
        pseudo_linear (False): a ``PseudoBlockSparseLinear`` (masked dense, same function) for debugging.
        skip_incompatible (the patcher's default): skip a layer whose sizes the blocks (or M) do not divide,
            with a warning, instead of raising a ValueError.
        block_mask (None): a precomputed bool [out/BR, in/BC] pattern to keep, with the trained values
            (block sparsity, init "magnitude"; replaces density). Made for rules that match one layer, as
            ``pruning.prune_model`` writes them.
        mask (None): a precomputed bool (out_features, in_features) N:M mask (at most N of every M inputs
            kept), for ``sparsity="N:M"`` and init "magnitude".
    """

    def __init__(self, skip_incompatible: bool = False):
        super().__init__()
        self.skip_incompatible = skip_incompatible

    def is_patchable(self, module_name: str, module: nn.Module, raise_error: bool) -> bool:
        if isinstance(module, nn.Linear) or _is_hf_conv1d(module):
            return True
        if raise_error:
            if isinstance(module, (BlockSparseLinear, MaskedLinear)):
                raise ValueError(f"{type(self).__name__}: cannot patch '{module_name}': it is already a sparse "
                                 f"{type(module).__name__}")
            raise ValueError(f"{type(self).__name__}: cannot patch '{module_name}': it is a "
                             f"{type(module).__module__}.{type(module).__name__}, not an nn.Linear or transformers "
                             f"Conv1D (make the rule match the linear layers only)")
        return False

    def add_pattern(self, pattern: str, patch_info: Optional[Dict[str, Any]]) -> None:
        if patch_info is not None and isinstance(patch_info, dict):
            unknown = set(patch_info) - _BLOCK_KEYS
            if unknown:
                raise ValueError(f"BlockSparseModelPatcher.add_pattern: unknown patch_info keys {sorted(unknown)} for "
                                 f"{pattern!r}; known keys: {sorted(_BLOCK_KEYS)}")
            init = patch_info.get("init", "magnitude")
            if init not in _INITS:
                raise ValueError(f"BlockSparseModelPatcher.add_pattern: init={init!r} must be one of {_INITS}")
            sparsity = patch_info.get("sparsity", "block")
            if sparsity != "block":
                parse_nm(sparsity, "BlockSparseModelPatcher.add_pattern")
            check_block_shape(patch_info.get("block_shape", (32, 32)), "BlockSparseModelPatcher.add_pattern")
            count_blocks(1, density=patch_info.get("density", 0.5), owner="BlockSparseModelPatcher.add_pattern")
            for key, kind in (("block_mask", "block"), ("mask", "N:M")):
                given = patch_info.get(key)
                if given is None:
                    continue
                if not isinstance(given, torch.Tensor) or given.dtype != torch.bool or given.dim() != 2:
                    raise ValueError(f"BlockSparseModelPatcher.add_pattern: {key} for {pattern!r} must be a 2-D bool "
                                     f"tensor, got {getattr(given, 'dtype', type(given).__name__)}")
                if (sparsity == "block") != (kind == "block") or init != "magnitude" or "density" in patch_info:
                    raise ValueError(f"BlockSparseModelPatcher.add_pattern: {key} for {pattern!r} needs "
                                     f"sparsity={'block' if kind == 'block' else 'N:M'!r}, init='magnitude' and no "
                                     f"density (got sparsity={sparsity!r}, init={init!r}, "
                                     f"density={patch_info.get('density')!r})")
        super().add_pattern(pattern, patch_info)

    def _incompatible(self, name: str, message: str, patch_info: Dict[str, Any]) -> None:
        if patch_info.get("skip_incompatible", self.skip_incompatible):
            warnings.warn(f"{type(self).__name__}: skipping '{name}': {message}", UserWarning, stacklevel=4)
            return None
        raise ValueError(f"{type(self).__name__}: cannot patch '{name}': {message} (pass skip_incompatible=True "
                         f"to skip such layers)")

    def new_child_module(self, child_module_name: str, child_module: nn.Module,
                         patch_info: Dict[str, Any]) -> Optional[nn.Module]:
        weight, bias = dense_weight_of(child_module)
        out_features, in_features = weight.shape
        init = patch_info.get("init", "magnitude")
        sparsity = patch_info.get("sparsity", "block")
        factory = dict(device=weight.device, dtype=weight.dtype)

        if sparsity != "block":
            n, m = parse_nm(sparsity, type(self).__name__)
            if in_features % m:
                return self._incompatible(child_module_name, f"in_features={in_features} is not a multiple of "
                                          f"M={m} (sparsity {n}:{m})", patch_info)
            if init == "magnitude":
                return SemiStructuredLinear.from_dense(child_module, (n, m), mask=patch_info.get("mask"))
            return SemiStructuredLinear(in_features, out_features, bias is not None, sparsity=(n, m), **factory)

        block_shape = tuple(patch_info.get("block_shape", (32, 32)))
        density = patch_info.get("density", 0.5)
        for axis, (label, size) in enumerate((("out_features", out_features), ("in_features", in_features))):
            if len(block_shape) == 2 and isinstance(block_shape[axis], int) and block_shape[axis] > 0 \
                    and size % block_shape[axis]:
                return self._incompatible(child_module_name, f"{label}={size} is not a multiple of "
                                          f"block_shape[{axis}]={block_shape[axis]} (block_shape={block_shape})",
                                          patch_info)
        if patch_info.get("block_mask") is not None:
            block_mask = patch_info["block_mask"]
            grid = (out_features // block_shape[0], in_features // block_shape[1])
            if tuple(block_mask.shape) != grid:
                raise ValueError(f"{type(self).__name__}: cannot patch '{child_module_name}': block_mask.shape="
                                 f"{tuple(block_mask.shape)} must be the block grid {grid} of weight "
                                 f"{(out_features, in_features)} with block_shape={block_shape}")
            new_module = BlockSparseLinear.from_dense(child_module, block_shape=block_shape,
                                                      block_mask=block_mask.to(weight.device))
        elif init == "magnitude":
            new_module = BlockSparseLinear.from_dense(child_module, density, block_shape,
                                                      norm=patch_info.get("norm", "l2"))
        else:
            new_module = BlockSparseLinear(in_features, out_features, bias is not None, density,
                                           block_shape=block_shape, **factory)
        if patch_info.get("pseudo_linear", False):
            new_module = PseudoBlockSparseLinear(new_module)
        return new_module

