"""Masks held on ordinary dense layers, for fine-tuning with the mask applied.

``apply_masks`` registers a ``MaskParametrization`` on the ``weight`` of each layer
(``torch.nn.utils.parametrize``): the layer computes with ``weight = original * mask``, so pruned weights
contribute nothing and receive zero gradient, whatever the optimizer does to ``original``. The layer stays an
``nn.Linear`` (or transformers ``Conv1D``), so any training loop, Trainer, DDP or checkpoint code keeps
working; the parameter the optimizer sees is ``<layer>.parametrizations.weight.original`` -- the same Parameter
object as the old ``<layer>.weight``, so an optimizer built before ``apply_masks`` still trains it.

``convert_masked_model`` turns every masked layer into a BlockSparseLinear / SemiStructuredLinear holding the
masked weights (same outputs); ``remove_masks`` bakes the masks into plain dense layers.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
from torch import nn
from torch.nn.utils import parametrize

from ..modules import _is_hf_conv1d
from ..patcher import PatchReport
from .spec import LayerMask, PruneSpec

__all__ = ["MaskParametrization", "apply_masks", "masked_layers", "convert_masked_model", "remove_masks",
           "masked_density"]


class MaskParametrization(nn.Module):
    """weight -> weight * mask. ``mask`` is a bool buffer in the parameter's own layout (transposed for a
    transformers Conv1D); ``spec`` says which accelerated layer the mask converts into."""

    def __init__(self, mask: torch.Tensor, spec: PruneSpec, transposed: bool = False):
        super().__init__()
        self.register_buffer("mask", mask.to(torch.bool))
        self.spec = spec
        self.transposed = transposed

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight * self.mask

    def layer_mask(self) -> torch.Tensor:
        """The mask as (out_features, in_features)."""
        return self.mask.t() if self.transposed else self.mask

    def extra_repr(self) -> str:
        density = float(self.mask.float().mean()) if self.mask.numel() else 1.0
        return f"density={density:.4g}"


def _mask_of(module: nn.Module) -> Optional[MaskParametrization]:
    if not parametrize.is_parametrized(module, "weight"):
        return None
    found = [p for p in module.parametrizations.weight if isinstance(p, MaskParametrization)]
    return found[0] if found else None


def masked_layers(model: nn.Module) -> Dict[str, Tuple[nn.Module, MaskParametrization]]:
    """name -> (layer, its MaskParametrization) for every layer of ``model`` holding a mask."""
    found = {}
    for name, module in model.named_modules():
        parametrization = _mask_of(module)
        if name and parametrization is not None:
            found[name] = (module, parametrization)
    return found


@torch.no_grad()
def apply_masks(model: nn.Module, masks: Dict[str, LayerMask], zero_pruned: bool = True) -> None:
    """Hold each ``LayerMask`` on its layer (registering a MaskParametrization, or updating the mask of one
    already there, in place). ``zero_pruned`` also zeroes the pruned entries of the underlying weight, so that
    a weight pruned once scores zero from then on (masks only shrink under magnitude scores)."""
    modules = dict(model.named_modules())
    for name, layer_mask in masks.items():
        module = modules.get(name)
        if module is None or not (isinstance(module, nn.Linear) or _is_hf_conv1d(module)):
            raise ValueError(f"apply_masks: '{name}' is not an nn.Linear / Conv1D layer of {type(model).__name__}")
        transposed = not isinstance(module, nn.Linear)
        mask = layer_mask.mask.t() if transposed else layer_mask.mask
        existing = _mask_of(module)
        weight = module.parametrizations.weight.original if existing is not None else module.weight
        if tuple(mask.shape) != tuple(weight.shape):
            raise ValueError(f"apply_masks: mask for '{name}' has shape {tuple(layer_mask.mask.shape)}, the layer's "
                             f"weight is (out_features, in_features)="
                             f"{tuple(weight.shape[::-1]) if transposed else tuple(weight.shape)}")
        mask = mask.to(weight.device)
        if existing is None:
            parametrize.register_parametrization(module, "weight", MaskParametrization(mask, layer_mask.spec,
                                                                                      transposed))
        else:
            existing.mask.copy_(mask)
            existing.spec = layer_mask.spec
        if zero_pruned:
            weight.mul_(mask)


def masked_density(model: nn.Module) -> float:
    """Fraction of the weights of the masked layers that are kept."""
    kept = total = 0
    for _, parametrization in masked_layers(model).values():
        kept += int(parametrization.mask.sum())
        total += parametrization.mask.numel()
    return kept / total if total else 1.0


def current_masks(model: nn.Module) -> Dict[str, LayerMask]:
    """The masks held on ``model`` as LayerMasks (block masks recovered as 'any weight kept in the block')."""
    result = {}
    for name, (_, parametrization) in masked_layers(model).items():
        mask, spec = parametrization.layer_mask(), parametrization.spec
        block_mask = None
        if not spec.is_nm:
            rows, cols = mask.shape
            br, bc = spec.block_shape
            block_mask = mask.reshape(rows // br, br, cols // bc, bc).any(dim=3).any(dim=1)
        result[name] = LayerMask(name, spec, mask, block_mask)
    return result


def convert_masked_model(model: nn.Module) -> PatchReport:
    """Replace every masked layer of ``model`` by the accelerated layer its pattern names -- BlockSparseLinear
    (block / vector) or SemiStructuredLinear (N:M) -- holding the masked weights and the bias, so the model
    computes the same outputs. Returns the patcher's report. The old layers (and the optimizer's hold on
    their parameters) are dropped: build a new optimizer to train further."""
    from .oneshot import convert_with_masks

    masks = current_masks(model)
    if not masks:
        raise ValueError(f"convert_masked_model: {type(model).__name__} holds no masks (use apply_masks, "
                         f"prune_model(convert=False) or GradualPruner first)")
    # Plain layers first (the patcher recognises nn.Linear subclasses but not a parametrized Conv1D); the
    # weights are baked as weight * mask, so the function does not change. On error the masks go back on.
    remove_masks(model)
    try:
        return convert_with_masks(model, masks)
    except Exception:
        apply_masks(model, masks, zero_pruned=False)
        raise


def remove_masks(model: nn.Module) -> None:
    """Bake each mask into its layer's weight and remove the parametrization (plain dense layers again)."""
    for module, _ in masked_layers(model).values():
        parametrize.remove_parametrizations(module, "weight", leave_parametrized=True)
