"""Pruning rules: which layers, which pattern, which density; and the masks they produce.

A rule maps a regex (fullmatched against the qualified layer name, first match wins, like the patcher) to a
pattern description: a dict, a float (shorthand for ``{"density": value}``) or None (leave the layer alone).

Pattern keys:
    sparsity ("block"): "block", "vector", or "N:M" such as "2:4".
    density: fraction of weights kept, in [0, 1] (block and vector; N:M keeps N/M). Required unless a
        global budget is given.
    block_shape ((32, 32)): (rows along out_features, columns along in_features), for "block".
    vector_length (4) and vector_dim (1): for "vector", vectors of ``vector_length`` consecutive weights
        along the inputs (vector_dim=1) or the outputs (0); a vector pattern is a block pattern of block shape
        (1, L) or (L, 1), and converts into a BlockSparseLinear of that block shape.
    transposable (False): for "2:4", a mask that is 2:4 along the rows and the columns (see transposable.py).
    score: overrides the pruner's score ("l2", "l1" or "wanda") for the matched layers.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import regex
import torch
from torch import nn

from ..layout import check_block_shape, count_blocks
from ..masks import expand_block_mask, parse_nm
from .scores import SCORES, linear_layers

__all__ = ["PruneSpec", "LayerMask", "parse_rules", "match_layers"]

_KEYS = {"sparsity", "density", "block_shape", "vector_length", "vector_dim", "transposable", "score"}

Rules = Union[Dict[str, Any], Sequence[Tuple[str, Any]]]


@dataclasses.dataclass(frozen=True)
class PruneSpec:
    """One layer's pattern: ``nm`` = (N, M) for N:M sparsity, else ``block_shape`` for block/vector sparsity."""
    density: Optional[float] = None
    block_shape: Tuple[int, int] = (32, 32)
    nm: Optional[Tuple[int, int]] = None
    transposable: bool = False
    score: Optional[str] = None
    rule: str = ""

    @property
    def is_nm(self) -> bool:
        return self.nm is not None

    @property
    def target_density(self) -> Optional[float]:
        return self.nm[0] / self.nm[1] if self.nm is not None else self.density


@dataclasses.dataclass
class LayerMask:
    """The mask chosen for one layer. ``mask``: bool (out_features, in_features), True = keep;
    ``block_mask``: bool [out/BR, in/BC] for block/vector patterns, None for N:M."""
    name: str
    spec: PruneSpec
    mask: torch.Tensor
    block_mask: Optional[torch.Tensor] = None

    @property
    def density(self) -> float:
        return float(self.mask.float().mean()) if self.mask.numel() else 1.0

    @classmethod
    def from_block_mask(cls, name: str, spec: PruneSpec, block_mask: torch.Tensor) -> "LayerMask":
        return cls(name, spec, expand_block_mask(block_mask, spec.block_shape), block_mask)


def _parse_one(pattern: str, info: Any, owner: str) -> Optional[PruneSpec]:
    if info is None:
        return None
    if isinstance(info, (int, float)) and not isinstance(info, bool):
        info = {"density": float(info)}
    if not isinstance(info, dict):
        raise TypeError(f"{owner}: the rule for {pattern!r} must be a dict, a density (float) or None, got "
                        f"{type(info).__name__}")
    unknown = set(info) - _KEYS
    if unknown:
        raise ValueError(f"{owner}: unknown keys {sorted(unknown)} in the rule for {pattern!r}; known keys: "
                         f"{sorted(_KEYS)}")
    sparsity = info.get("sparsity", "block")
    score = info.get("score")
    if score is not None and score not in SCORES:
        raise ValueError(f"{owner}: score={score!r} in the rule for {pattern!r} must be one of {SCORES}")
    density = info.get("density")
    if density is not None:
        count_blocks(1, density=density, owner=f"{owner} (rule {pattern!r})")
        density = float(density)
    transposable = bool(info.get("transposable", False))
    if sparsity == "block":
        block_shape = check_block_shape(info.get("block_shape", (32, 32)), f"{owner} (rule {pattern!r})")
        spec = PruneSpec(density, block_shape, score=score, rule=pattern)
    elif sparsity == "vector":
        length = info.get("vector_length", 4)
        dim = info.get("vector_dim", 1)
        if isinstance(length, bool) or not isinstance(length, int) or length <= 0:
            raise ValueError(f"{owner}: vector_length={length!r} in the rule for {pattern!r} must be a positive int")
        if dim not in (0, 1):
            raise ValueError(f"{owner}: vector_dim={dim!r} in the rule for {pattern!r} must be 0 (along the outputs) "
                             f"or 1 (along the inputs)")
        spec = PruneSpec(density, (1, length) if dim == 1 else (length, 1), score=score, rule=pattern)
    else:
        nm = parse_nm(sparsity, f"{owner} (rule {pattern!r})")
        if density is not None:
            raise ValueError(f"{owner}: density={density} in the rule for {pattern!r} conflicts with "
                             f"sparsity={sparsity!r} (N:M keeps N/M={nm[0] / nm[1]:g})")
        if transposable and nm != (2, 4):
            raise ValueError(f"{owner}: transposable=True in the rule for {pattern!r} needs sparsity='2:4', got "
                             f"{sparsity!r}")
        spec = PruneSpec(None, nm=nm, transposable=transposable, score=score, rule=pattern)
    if transposable and not spec.is_nm:
        raise ValueError(f"{owner}: transposable=True in the rule for {pattern!r} needs sparsity='2:4', got "
                         f"{sparsity!r}")
    return spec


def parse_rules(rules: Rules, owner: str) -> List[Tuple[str, Any, Optional[PruneSpec]]]:
    """[(pattern, compiled regex, spec or None)] in order; raises ValueError/TypeError naming the rule."""
    if isinstance(rules, dict):
        items = list(rules.items())
    elif isinstance(rules, (list, tuple)):
        items = list(rules)
        for item in items:
            if not isinstance(item, (list, tuple)) or len(item) != 2:
                raise TypeError(f"{owner}: rules must be a dict {{pattern: pattern_info}} or a list of "
                                f"(pattern, pattern_info) pairs, got the item {item!r}")
    else:
        raise TypeError(f"{owner}: rules must be a dict or a list of (pattern, pattern_info) pairs, got "
                        f"{type(rules).__name__}")
    if not items:
        raise ValueError(f"{owner}: rules is empty; give at least one (pattern, pattern_info) rule")
    parsed = []
    for pattern, info in items:
        try:
            compiled = regex.compile(pattern)
        except (regex.error, TypeError) as error:
            raise ValueError(f"{owner}: pattern={pattern!r} is not a valid regex: {error}") from None
        parsed.append((pattern, compiled, _parse_one(pattern, info, owner)))
    return parsed


def match_layers(model: nn.Module, rules: Rules, owner: str) -> Dict[str, Tuple[nn.Module, PruneSpec]]:
    """name -> (layer, spec) for every nn.Linear / Conv1D whose name a rule with a pattern fullmatches first.
    Checks that the layer's sizes fit the pattern. Raises ValueError if no layer is matched."""
    parsed = parse_rules(rules, owner)
    layers = linear_layers(model)
    found: Dict[str, Tuple[nn.Module, PruneSpec]] = {}
    for name, module in layers.items():
        for pattern, compiled, spec in parsed:
            if compiled.fullmatch(name):
                if spec is not None:
                    found[name] = (module, spec)
                break
    if not found:
        shown = ", ".join(list(layers)[:20]) + (f", ... ({len(layers)} in all)" if len(layers) > 20 else "")
        raise ValueError(f"{owner}: no rule of {[p for p, _, _ in parsed]} matched a linear layer of "
                         f"{type(model).__name__} (rules fullmatch the qualified name); linear layers: "
                         f"{shown or 'none'}")
    for name, (module, spec) in found.items():
        out_features, in_features = module.weight.shape if isinstance(module, nn.Linear) else module.weight.shape[::-1]
        if spec.is_nm:
            n, m = spec.nm
            if in_features % m:
                raise ValueError(f"{owner}: layer '{name}' (rule {spec.rule!r}): in_features={in_features} must be a "
                                 f"multiple of M={m} for sparsity {n}:{m}")
            if spec.transposable and out_features % 4:
                raise ValueError(f"{owner}: layer '{name}' (rule {spec.rule!r}): out_features={out_features} must be "
                                 f"a multiple of 4 for a transposable 2:4 mask")
        else:
            for axis, (label, size) in enumerate((("out_features", out_features), ("in_features", in_features))):
                if size % spec.block_shape[axis]:
                    raise ValueError(f"{owner}: layer '{name}' (rule {spec.rule!r}): {label}={size} must be a "
                                     f"multiple of block_shape[{axis}]={spec.block_shape[axis]}")
    return found
