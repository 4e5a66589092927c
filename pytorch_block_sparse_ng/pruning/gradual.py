"""Gradual pruning during fine-tuning (Zhu & Gupta 2017, "To prune, or not to prune").

The density follows a cubic ramp from 1 at ``begin_step`` to the target at ``end_step``; every ``frequency``
steps the masks are recomputed from the current (masked) weights and held on the dense layers
(``masked.apply_masks``), so training continues with the mask applied:

    pruner = GradualPruner(model, {r".*mlp\\..*": {"density": 0.5, "block_shape": (32, 32)}},
                           begin_step=0, end_step=1000, frequency=100)
    optimizer = torch.optim.AdamW(model.parameters())   # after the pruner: it trains the same Parameters
    for step in range(steps):
        loss(model(x)).backward(); optimizer.step(); optimizer.zero_grad()
        pruner.step()                                   # counts steps itself, or pruner.step(global_step)
    pruner.convert()                                    # BlockSparseLinear / SemiStructuredLinear, same outputs

With transformers' Trainer: ``Trainer(..., callbacks=[GradualPruningCallback(pruner)])``.

N:M rules ramp the number kept per group of M from M down to N (for 2:4: 4 -> 3 -> 2) as the cubic
density passes (N + k) / M. Pruned weights are zeroed in the underlying weight, so under magnitude scores a
weight pruned once never comes back (masks only shrink). Scores: "l2" / "l1" (magnitude of the masked weight).
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional

import torch
from torch import nn

from ..layout import count_blocks
from ..patcher import PatchReport
from .masked import apply_masks, convert_masked_model, masked_density
from .oneshot import compute_masks
from .spec import LayerMask, Rules, match_layers

__all__ = ["cubic_density", "GradualPruner", "GradualPruningCallback"]


def cubic_density(step: int, final_density: float, begin_step: int, end_step: int,
                  initial_density: float = 1.0) -> float:
    """Zhu & Gupta's schedule written for density: d(t) = d_f + (d_i - d_f) (1 - (t - t0) / (t1 - t0))³ for
    t0 <= t <= t1; d_i before t0 and d_f after t1."""
    if end_step < begin_step:
        raise ValueError(f"cubic_density: end_step={end_step} must be >= begin_step={begin_step}")
    if step <= begin_step:
        return initial_density if end_step > begin_step or step < begin_step else final_density
    if step >= end_step:
        return final_density
    progress = (step - begin_step) / (end_step - begin_step)
    return final_density + (initial_density - final_density) * (1.0 - progress) ** 3


class GradualPruner:
    """Cubic gradual pruning of the layers matched by ``rules`` (the format of ``prune_model``; a rule's
    density is its target), or to one ``global_density`` spread over the block/vector layers by score.

    begin_step, end_step: the ramp; frequency: masks are recomputed every ``frequency`` steps from
    ``begin_step`` on, and at ``end_step``. score: "l2" or "l1". The masks (all ones at first) are registered
    on the layers at construction: build the optimizer after the pruner (or before: it is the same Parameter).
    """

    def __init__(self, model: nn.Module, rules: Rules, *, end_step: int, begin_step: int = 0, frequency: int = 100,
                 score: str = "l2", global_density: Optional[float] = None, min_density: float = 0.0):
        owner = "GradualPruner"
        for name, value in (("begin_step", begin_step), ("end_step", end_step), ("frequency", frequency)):
            if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "frequency" else 0):
                raise ValueError(f"{owner}: {name}={value!r} must be an integer >= {1 if name == 'frequency' else 0}")
        if end_step < begin_step:
            raise ValueError(f"{owner}: end_step={end_step} must be >= begin_step={begin_step}")
        if score not in ("l2", "l1"):
            raise ValueError(f"{owner}: score={score!r} must be 'l2' or 'l1' (magnitude; use prune_model for "
                             f"'wanda')")
        if global_density is not None:
            count_blocks(1, density=global_density, owner=f"{owner}: global_density")
        self.model, self.rules = model, rules
        self.begin_step, self.end_step, self.frequency = begin_step, end_step, frequency
        self.score, self.global_density, self.min_density = score, global_density, min_density
        self.layers = match_layers(model, rules, owner)
        for name, (_, spec) in self.layers.items():
            if spec.score not in (None, "l2", "l1"):
                raise ValueError(f"{owner}: score={spec.score!r} in the rule {spec.rule!r} must be 'l2' or 'l1'")
            if not spec.is_nm and (spec.density is None) == (global_density is None):
                raise ValueError(f"{owner}: the rule {spec.rule!r} (layer '{name}') sets density={spec.density}; "
                                 f"give a density per rule or global_density={global_density}, exactly one")
        self.last_step: Optional[int] = None
        self.last_density = 1.0
        self._count = -1
        ones = {}
        for name, (module, spec) in self.layers.items():
            weight = module.weight
            shape = tuple(weight.shape) if isinstance(module, nn.Linear) else tuple(weight.shape[::-1])
            ones[name] = LayerMask(name, spec, torch.ones(shape, dtype=torch.bool, device=weight.device))
        apply_masks(model, ones, zero_pruned=False)

    def density_at(self, step: int) -> float:
        """Scheduled density of the pruned weights at ``step`` (global target, or the first rule's)."""
        target = self.global_density if self.global_density is not None else \
            next(iter(self.layers.values()))[1].target_density
        return cubic_density(step, target, self.begin_step, self.end_step)

    def _due(self, step: int) -> bool:
        if step < self.begin_step:
            return False
        if step >= self.end_step:
            return self.last_step is None or self.last_step < self.end_step
        return (step - self.begin_step) % self.frequency == 0

    def step(self, step: Optional[int] = None) -> bool:
        """Call once per optimizer step (after it). ``step``: the global step (default: an internal counter
        starting at 0). Recomputes the masks when a pruning step is due; returns True if it did."""
        self._count = self._count + 1 if step is None else int(step)
        step = self._count
        if not self._due(step):
            return False
        self.prune_to(step)
        return True

    def prune_to(self, step: int) -> Dict[str, LayerMask]:
        """Recompute and apply the masks for the scheduled densities at ``step`` (whatever the frequency)."""
        densities, nm_keep = {}, {}
        for name, (_, spec) in self.layers.items():
            if spec.is_nm:
                n, m = spec.nm
                d = cubic_density(step, n / m, self.begin_step, self.end_step)
                # the nearest whole number of weights per group, from M down to N
                nm_keep[name] = max(n, min(m, int(math.floor(d * m + 0.5))))
            elif self.global_density is None:
                densities[name] = cubic_density(step, spec.density, self.begin_step, self.end_step)
        global_density = None if self.global_density is None else \
            cubic_density(step, self.global_density, self.begin_step, self.end_step)
        min_density = 0.0 if global_density is None else min(self.min_density, global_density)
        masks = compute_masks(self.model, self.rules, score=self.score, global_density=global_density,
                              min_density=min_density, progress=False, _densities=densities or {},
                              _nm_keep=nm_keep, _owner="GradualPruner")
        apply_masks(self.model, masks, zero_pruned=True)
        self.last_step = step
        self.last_density = masked_density(self.model)
        return masks

    def density(self) -> float:
        """Fraction of the pruned layers' weights currently kept."""
        return masked_density(self.model)

    def convert(self) -> PatchReport:
        """``convert_masked_model``: the masked layers become accelerated layers with the same outputs."""
        return convert_masked_model(self.model)

    def state_dict(self) -> Dict[str, Any]:
        return dict(count=self._count, last_step=self.last_step)

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self._count, self.last_step = state["count"], state["last_step"]


_CALLBACK_CLASS = None


def GradualPruningCallback(pruner: GradualPruner):  # noqa: N802 -- a class, built when transformers is imported
    """A ``transformers.TrainerCallback`` that calls ``pruner.step(state.global_step)`` after every optimizer
    step (``on_step_end``). transformers is imported here, not when this package is."""
    global _CALLBACK_CLASS
    if _CALLBACK_CLASS is None:
        from transformers import TrainerCallback

        class _GradualPruningCallback(TrainerCallback):
            def __init__(self, pruner):
                self.pruner = pruner

            def on_step_end(self, args, state, control, **kwargs):
                self.pruner.step(state.global_step)
                return control

        _GradualPruningCallback.__name__ = _GradualPruningCallback.__qualname__ = "GradualPruningCallback"
        _CALLBACK_CLASS = _GradualPruningCallback
    if not isinstance(pruner, GradualPruner):
        raise TypeError(f"GradualPruningCallback: pruner must be a GradualPruner, got {type(pruner).__name__}")
    return _CALLBACK_CLASS(pruner)
