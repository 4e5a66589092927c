"""Pure-PyTorch versions of the three block-sparse products: the CPU path and the oracle of every kernel.

W is the (N, K) block-sparse weight of ``layout.BlockSparseMatrix`` (N = out_features, K = in_features):

- ``dsd``: y  = x Wᵀ + bias        x: (M, K)  -> y:  (M, N)        dense = dense x sparseᵀ
- ``dds``: dx = dy W               dy: (M, N) -> dx: (M, K)        walks the column-major (transposed) index
- ``sdd``: dW_b = dyᵀ x on kept blocks only  -> [nnz, BR, BC]       sparse = dense x dense, sampled

Two exact, vectorised strategies (no Python loop over blocks):

- "gather": gather the slices of the dense operand that every block touches, multiply all blocks in one
  ``bmm`` and sum the results into their block row (or column) with ``index_add_``. Work scales with the
  density; rows of M are processed in chunks so the gathered copy stays under ``_CHUNK_ELEMENTS``.
- "dense": scatter the blocks into the dense weight and use one GEMM (for sdd: one GEMM, then gather the
  kept blocks). Work does not shrink with the density, but CPU GEMMs run ~10x more FLOP/s than small
  batched ones, so it is faster from moderate densities on.

``DENSE_STRATEGY_MIN_DENSITY`` picks between them. fp16/bf16 inputs are accumulated in fp32 and rounded
once at the end, as the kernels do.

All functions take the index tensors in the order of ``layout.INDEX_NAMES``, optionally followed by the
``layout.ORDER_NAMES`` schedules (ignored here: they only order the kernels' work), and return new tensors.
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["dsd", "dds", "sdd"]

# Upper bound on the elements of one gathered chunk (64 MiB in fp32).
_CHUNK_ELEMENTS = 1 << 24
# At or above this fraction of kept blocks the "dense" strategy is used (measured on a 2-core CPU: at
# 1024x1024, blocks 32 or 64, M=2048, "gather" is 1-2x slower at density 0.1 and 3-5x at 0.5;
# below 0.1 it wins for small M or large blocks).
DENSE_STRATEGY_MIN_DENSITY = 0.1


def _use_dense_strategy(nnz: int, n_block_rows: int, n_block_cols: int) -> bool:
    return nnz > 0 and nnz >= DENSE_STRATEGY_MIN_DENSITY * n_block_rows * n_block_cols


def _dense_weight(data: torch.Tensor, row_indices: torch.Tensor, col_indices: torch.Tensor, n_block_rows: int,
                  n_block_cols: int) -> torch.Tensor:
    nnz, br, bc = data.shape
    dense = data.new_zeros((n_block_rows, br, n_block_cols, bc))
    dense.permute(0, 2, 1, 3)[row_indices.long(), col_indices.long()] = data
    return dense.view(n_block_rows * br, n_block_cols * bc)


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _rounded(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t in dtype, as a new tensor only where the dtype changes. (torch 2.11's dynamo lost the gradient of an
    autograd.Function whose forward returned ``t.to(t.dtype)`` or an in-place sum: zero grads under
    torch.compile; tests/test_distributed_and_compile.py.)"""
    return t if t.dtype == dtype else t.to(dtype)


def _row_chunks(m: int, per_row_elements: int):
    step = max(1, _CHUNK_ELEMENTS // max(1, per_row_elements))
    for start in range(0, m, step):
        yield start, min(m, start + step)


def dsd(x: torch.Tensor, data: torch.Tensor, bias: Optional[torch.Tensor], row_offsets: torch.Tensor,
        col_indices: torch.Tensor, row_indices: torch.Tensor, col_offsets_t: torch.Tensor,
        row_indices_t: torch.Tensor, perm_t: torch.Tensor, row_order: Optional[torch.Tensor] = None,
        col_order: Optional[torch.Tensor] = None) -> torch.Tensor:
    """y = x Wᵀ + bias. x: (M, K), data: [nnz, BR, BC], bias: (N,) or None -> (M, N) in x's dtype."""
    m = x.shape[0]
    nnz, br, bc = data.shape
    n_block_rows, n_block_cols = row_offsets.numel() - 1, col_offsets_t.numel() - 1
    acc = _accumulation_dtype(x.dtype)
    if _use_dense_strategy(nnz, n_block_rows, n_block_cols):
        weight = _dense_weight(data.to(acc), row_indices, col_indices, n_block_rows, n_block_cols)
        y = x.to(acc) @ weight.T
        if bias is not None:
            y = y + bias.to(acc)
        return _rounded(y, x.dtype)
    # Block rows first, so that index_add_ adds whole contiguous [m, BR] slices (fast on CPU).
    y = torch.zeros((n_block_rows, m, br), dtype=acc, device=x.device)
    if nnz:
        xb = x.reshape(m, n_block_cols, bc)
        weight_t = data.to(acc).transpose(1, 2)  # [nnz, BC, BR]
        rows, cols = row_indices.long(), col_indices.long()
        for start, stop in _row_chunks(m, nnz * bc):
            gathered = xb[start:stop].to(acc).index_select(1, cols).transpose(0, 1)  # [nnz, m, BC]
            chunk = torch.zeros((n_block_rows, stop - start, br), dtype=acc, device=x.device)
            y[:, start:stop] = chunk.index_add_(0, rows, torch.bmm(gathered, weight_t))  # bmm: [nnz, m, BR]
    y = y.permute(1, 0, 2).reshape(m, n_block_rows * br)
    if bias is not None:
        y = y + bias.to(acc)
    return _rounded(y, x.dtype)


def dds(dy: torch.Tensor, data: torch.Tensor, row_offsets: torch.Tensor, col_indices: torch.Tensor,
        row_indices: torch.Tensor, col_offsets_t: torch.Tensor, row_indices_t: torch.Tensor,
        perm_t: torch.Tensor, row_order: Optional[torch.Tensor] = None,
        col_order: Optional[torch.Tensor] = None) -> torch.Tensor:
    """dx = dy W through the column-major index. dy: (M, N) -> (M, K) in dy's dtype."""
    m = dy.shape[0]
    nnz, br, bc = data.shape
    n_block_rows, n_block_cols = row_offsets.numel() - 1, col_offsets_t.numel() - 1
    acc = _accumulation_dtype(dy.dtype)
    if _use_dense_strategy(nnz, n_block_rows, n_block_cols):
        weight = _dense_weight(data.to(acc), row_indices, col_indices, n_block_rows, n_block_cols)
        return _rounded(dy.to(acc) @ weight, dy.dtype)
    dx = torch.zeros((n_block_cols, m, bc), dtype=acc, device=dy.device)
    if nnz:
        dyb = dy.reshape(m, n_block_rows, br)
        weight = data.to(acc).index_select(0, perm_t.long())  # [nnz, BR, BC], column-major order
        rows = row_indices_t.long()
        cols = torch.repeat_interleave(torch.arange(n_block_cols, device=dy.device),
                                       (col_offsets_t[1:] - col_offsets_t[:-1]).long())
        for start, stop in _row_chunks(m, nnz * br):
            gathered = dyb[start:stop].to(acc).index_select(1, rows).transpose(0, 1)  # [nnz, m, BR]
            chunk = torch.zeros((n_block_cols, stop - start, bc), dtype=acc, device=dy.device)
            dx[:, start:stop] = chunk.index_add_(0, cols, torch.bmm(gathered, weight))  # bmm: [nnz, m, BC]
    return _rounded(dx.permute(1, 0, 2).reshape(m, n_block_cols * bc), dy.dtype)


def sdd(dy: torch.Tensor, x: torch.Tensor, row_offsets: torch.Tensor, col_indices: torch.Tensor,
        row_indices: torch.Tensor, col_offsets_t: torch.Tensor, row_indices_t: torch.Tensor,
        perm_t: torch.Tensor, row_order: Optional[torch.Tensor], col_order: Optional[torch.Tensor],
        block_shape) -> torch.Tensor:
    """dW_b = dyᵀ x on the kept blocks only. dy: (M, N), x: (M, K) -> [nnz, BR, BC] in x's dtype."""
    m = x.shape[0]
    br, bc = block_shape
    nnz = col_indices.numel()
    n_block_rows, n_block_cols = row_offsets.numel() - 1, col_offsets_t.numel() - 1
    acc = _accumulation_dtype(x.dtype)
    if _use_dense_strategy(nnz, n_block_rows, n_block_cols):
        dense = dy.to(acc).T @ x.to(acc)  # (N, K)
        tiles = dense.view(n_block_rows, br, n_block_cols, bc).permute(0, 2, 1, 3)
        return _rounded(tiles[row_indices.long(), col_indices.long()], x.dtype)
    grad = torch.zeros((nnz, br, bc), dtype=acc, device=x.device)
    if nnz:
        dyb = dy.reshape(m, n_block_rows, br)
        xb = x.reshape(m, n_block_cols, bc)
        rows, cols = row_indices.long(), col_indices.long()
        for start, stop in _row_chunks(m, nnz * (br + bc)):
            g_dy = dyb[start:stop].to(acc).index_select(1, rows).permute(1, 2, 0)  # [nnz, BR, m]
            g_x = xb[start:stop].to(acc).index_select(1, cols).transpose(0, 1)  # [nnz, m, BC]
            grad.baddbmm_(g_dy, g_x)
    return _rounded(grad, x.dtype)
