"""Pruning masks for a weight of shape (out_features, in_features): N:M, block and vector-wise.

Every function looks at magnitudes only and returns a bool mask (True = keep); none modifies the weight.
Scores are computed in fp32 so that fp16/bf16 weights give the same choice as their fp32 copy.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from .layout import block_grid, check_block_shape, count_blocks

__all__ = [
    "parse_nm",
    "nm_mask",
    "block_scores",
    "block_mask_by_magnitude",
    "top_blocks",
    "expand_block_mask",
    "vector_mask",
    "mask_density",
]


def parse_nm(sparsity: Union[str, Tuple[int, int]], owner: str = "nm_mask") -> Tuple[int, int]:
    """``"2:4"`` or ``(2, 4)`` -> (2, 4): keep N of every M consecutive weights; requires 0 < N < M."""
    try:
        if isinstance(sparsity, str):
            n_str, m_str = sparsity.split(":")
            n, m = int(n_str), int(m_str)
        else:
            n, m = (int(v) for v in sparsity)
    except (TypeError, ValueError):
        raise ValueError(f"{owner}: sparsity={sparsity!r} must look like '2:4' (keep N of every M)") from None
    if not 0 < n < m:
        raise ValueError(f"{owner}: sparsity={sparsity!r} must have 0 < N < M")
    return n, m


def nm_mask(weight: torch.Tensor, sparsity: Union[str, Tuple[int, int]] = "2:4", dim: int = -1) -> torch.Tensor:
    """Keep the N largest-magnitude weights of every M consecutive ones along ``dim`` (default: the input
    dimension of a Linear weight). Greedy top-k per group: linear in M, any N < M.

    weight: any shape whose size along ``dim`` is a multiple of M. Returns a bool mask of the same shape.
    """
    n, m = parse_nm(sparsity)
    if weight.dim() == 0:
        raise ValueError("nm_mask: weight must have at least one dimension")
    size = weight.shape[dim]
    if size % m:
        raise ValueError(f"nm_mask: weight.shape[{dim}]={size} must be a multiple of M={m} for sparsity "
                         f"{n}:{m}")
    scores = weight.detach().float().abs().movedim(dim, -1)
    moved_shape = scores.shape
    groups = scores.reshape(-1, m)
    keep = torch.zeros_like(groups, dtype=torch.bool)
    keep.scatter_(1, groups.topk(n, dim=1).indices, True)
    return keep.reshape(moved_shape).movedim(-1, dim)


def block_scores(weight: torch.Tensor, block_shape, norm: str = "l2") -> torch.Tensor:
    """Norm of every (BR, BC) block of a 2-D ``weight``: fp32 [R, C]. ``norm`` is "l2" or "l1"."""
    if weight.dim() != 2:
        raise ValueError(f"block_scores: weight must be 2-D, got shape {tuple(weight.shape)}")
    n_rows, n_cols = block_grid(weight.shape, block_shape, "block_scores")
    br, bc = check_block_shape(block_shape)
    tiles = weight.detach().float().reshape(n_rows, br, n_cols, bc)
    if norm == "l2":
        return tiles.pow(2).sum(dim=(1, 3)).sqrt()
    if norm == "l1":
        return tiles.abs().sum(dim=(1, 3))
    raise ValueError(f"block_scores: norm={norm!r} must be 'l2' or 'l1'")


def top_blocks(scores: torch.Tensor, density: Optional[float] = None, block_count: Optional[int] = None,
               owner: str = "top_blocks") -> torch.Tensor:
    """Bool mask of the same shape as ``scores`` keeping the ``density`` fraction (or ``block_count``)
    of entries with the largest score."""
    count = count_blocks(scores.numel(), block_count, density, owner)
    mask = torch.zeros(scores.numel(), dtype=torch.bool, device=scores.device)
    if count:
        mask[scores.flatten().topk(count).indices] = True
    return mask.view(scores.shape)


def block_mask_by_magnitude(weight: torch.Tensor, block_shape, density: Optional[float] = None,
                            block_count: Optional[int] = None, norm: str = "l2") -> torch.Tensor:
    """Bool [R, C] block mask keeping the blocks of ``weight`` with the largest L2 (or L1) norm."""
    return top_blocks(block_scores(weight, block_shape, norm), density, block_count, "block_mask_by_magnitude")


def expand_block_mask(block_mask: torch.Tensor, block_shape) -> torch.Tensor:
    """Bool [R, C] block mask -> element mask [R * BR, C * BC]."""
    br, bc = check_block_shape(block_shape, "expand_block_mask")
    return block_mask.repeat_interleave(br, 0).repeat_interleave(bc, 1)


def vector_mask(weight: torch.Tensor, vector_length: int, density: float, dim: int = 1,
                norm: str = "l2") -> torch.Tensor:
    """Vector-wise pruning of a 2-D ``weight``: split it into vectors of ``vector_length`` consecutive
    weights along ``dim`` (1: along the inputs, 0: along the outputs) and keep the ``density`` fraction with
    the largest norm, over the whole matrix. Returns an element mask of the weight's shape."""
    if dim not in (0, 1, -1, -2):
        raise ValueError(f"vector_mask: dim={dim} must be 0 or 1 (a 2-D weight)")
    block_shape = (1, vector_length) if dim in (1, -1) else (vector_length, 1)
    blocks = block_mask_by_magnitude(weight, block_shape, density=density, norm=norm)
    return expand_block_mask(blocks, block_shape)


def mask_density(mask: torch.Tensor) -> float:
    """Fraction of True entries of a bool mask."""
    return float(mask.float().mean()) if mask.numel() else 1.0
