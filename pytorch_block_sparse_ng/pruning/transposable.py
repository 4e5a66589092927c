"""Transposable N:M masks: W and Wᵀ both 2:4, so that the backward product dy W (grad input) can use sparse
tensor cores as well as the forward x Wᵀ.

For every 4x4 block of the weight we choose, among the 90 4x4 0/1 patterns whose every row and every column
keeps exactly 2 entries, the one that keeps the largest total score (|W| by default). The choice is exact
(all 90 candidates are scored) and vectorised: one [blocks, 16] x [16, 90] product and an argmax.
"""

from __future__ import annotations

import itertools
from typing import Dict, Optional

import torch

from ..masks import nm_mask

__all__ = ["transposable_patterns", "transposable_nm_mask", "kept_magnitude", "compare_transposable"]

_PATTERNS: Optional[torch.Tensor] = None


def transposable_patterns() -> torch.Tensor:
    """The 90 bool 4x4 patterns with exactly two True per row and per column: [90, 4, 4]."""
    global _PATTERNS
    if _PATTERNS is None:
        rows = [r for r in itertools.product((0, 1), repeat=4) if sum(r) == 2]  # the 6 ways to keep 2 of 4
        found = [p for p in itertools.product(rows, repeat=4) if all(sum(col) == 2 for col in zip(*p))]
        _PATTERNS = torch.tensor(found, dtype=torch.bool)
    return _PATTERNS


def transposable_nm_mask(weight: torch.Tensor, sparsity: str = "2:4", scores: Optional[torch.Tensor] = None
                         ) -> torch.Tensor:
    """Bool mask of ``weight``'s shape (out_features, in_features) that is 2:4 along the rows *and* along
    the columns: every 4x4 block keeps the candidate pattern of largest kept ``scores`` (default |weight|).

    weight: 2-D, both sizes multiples of 4. Only "2:4" is supported (the pattern used by sparse tensor cores).
    """
    if sparsity not in ("2:4", (2, 4)):
        raise ValueError(f"transposable_nm_mask: sparsity={sparsity!r} must be '2:4' (the only transposable pattern "
                         f"implemented)")
    if weight.dim() != 2:
        raise ValueError(f"transposable_nm_mask: weight must be 2-D, got shape {tuple(weight.shape)}")
    rows, cols = weight.shape
    for axis, size in enumerate((rows, cols)):
        if size % 4:
            raise ValueError(f"transposable_nm_mask: weight.shape[{axis}]={size} must be a multiple of 4")
    if scores is None:
        scores = weight.detach().abs()
    elif tuple(scores.shape) != (rows, cols):
        raise ValueError(f"transposable_nm_mask: scores.shape={tuple(scores.shape)} must be "
                         f"weight.shape={(rows, cols)}")
    tiles = scores.detach().float().reshape(rows // 4, 4, cols // 4, 4).permute(0, 2, 1, 3).reshape(-1, 16)
    patterns = transposable_patterns().to(tiles.device)
    best = (tiles @ patterns.reshape(-1, 16).float().t()).argmax(dim=1)  # [blocks]
    chosen = patterns[best].reshape(rows // 4, cols // 4, 4, 4)
    return chosen.permute(0, 2, 1, 3).reshape(rows, cols)


def kept_magnitude(weight: torch.Tensor, mask: torch.Tensor, norm: str = "l1") -> float:
    """Fraction of the weight's magnitude a mask keeps: sum |W| (or W², norm="l2") over kept entries
    divided by the same sum over all entries (1.0 for an all-zero weight)."""
    if mask.shape != weight.shape:
        raise ValueError(f"kept_magnitude: mask.shape={tuple(mask.shape)} must be weight.shape={tuple(weight.shape)}")
    if norm == "l1":
        values = weight.detach().float().abs()
    elif norm == "l2":
        values = weight.detach().float().pow(2)
    else:
        raise ValueError(f"kept_magnitude: norm={norm!r} must be 'l1' or 'l2'")
    total = float(values.sum())
    return float(values[mask].sum()) / total if total > 0 else 1.0


def compare_transposable(weight: torch.Tensor, norm: str = "l1") -> Dict[str, float]:
    """How much magnitude a transposable 2:4 mask keeps compared with a plain (row-wise) 2:4 mask.

    Returns {"plain": kept fraction of the plain mask, "transposable": of the transposable mask,
    "ratio": transposable / plain (<= 1)}.
    """
    plain = kept_magnitude(weight, nm_mask(weight, "2:4", dim=1), norm)
    transposable = kept_magnitude(weight, transposable_nm_mask(weight), norm)
    return dict(plain=plain, transposable=transposable, ratio=transposable / plain if plain > 0 else 1.0)
