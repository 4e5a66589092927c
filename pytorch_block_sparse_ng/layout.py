"""The block-sparse format: packed blocks plus int32 indices in row-major and column-major order.

A ``BlockSparseMatrix`` of ``shape = (rows, cols)`` and ``block_shape = (BR, BC)`` is a grid of
``R = rows // BR`` block rows and ``C = cols // BC`` block columns, of which ``nnz`` blocks are kept.

Tensors (all on the same device; the indices are int32 so kernels can read them directly):

==================  ===============  ==========================================================
``data``            [nnz, BR, BC]    the kept blocks, in row-major block order (an nn.Parameter)
``row_offsets``     [R + 1]          blocks of block row r are ``data[row_offsets[r]:row_offsets[r+1]]``
``col_indices``     [nnz]            block column of each block; increasing within a block row
``row_indices``     [nnz]            block row of each block (derivable, stored so kernels never expand it)
``col_offsets_t``   [C + 1]          column-major order: blocks of block column c are entries
                                     ``col_offsets_t[c]:col_offsets_t[c+1]`` of the two tensors below
``row_indices_t``   [nnz]            block row of each block in column-major order; increasing per column
``perm_t``          [nnz]            index into ``data`` of each block in column-major order
``row_order``       [R]              a schedule, not part of the pattern: the block rows in the order the Hopper
                                     kernels take them, longest first; with blocks of 64, two at a time (rows
                                     sharing many block columns side by side, so that they share activation
                                     tiles); any permutation gives the same results
``col_order``       [C]              the same for the block columns (dx = dy W)
==================  ===============  ==========================================================

The two orders are derived from the pattern (``line_orders``) and are not saved in the ``state_dict``.

The product kernels use them as follows (``W`` is the dense matrix this one stands for, shape (rows, cols)):
y = x Wᵀ walks ``row_offsets``/``col_indices``; dx = dy W walks the column-major index; the weight gradient
dW = dyᵀ x sampled on the kept blocks walks ``row_indices``/``col_indices``.
"""

from __future__ import annotations

import math
from typing import Iterable, Optional, Sequence, Tuple

import torch
from torch import nn

__all__ = ["BlockSparseMatrix", "block_grid", "check_block_shape", "count_blocks"]

_INDEX_DTYPE = torch.int32
# Buffers that hold the pattern, in the order the autograd Function takes them.
INDEX_NAMES = ("row_offsets", "col_indices", "row_indices", "col_offsets_t", "row_indices_t", "perm_t")
# Schedules derived from the pattern (non-persistent buffers), passed to the products after INDEX_NAMES.
ORDER_NAMES = ("row_order", "col_order")
_ALL_INDEX_NAMES = INDEX_NAMES + ORDER_NAMES


def check_block_shape(block_shape, owner: str = "BlockSparseMatrix") -> Tuple[int, int]:
    """Return ``block_shape`` as a tuple of two positive ints, or raise a ValueError that says why not."""
    try:
        br, bc = (int(v) for v in block_shape)
        ok = (br, bc) == tuple(block_shape) and br > 0 and bc > 0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"{owner}: block_shape={block_shape!r} must be a pair of positive integers, e.g. (32, 32)")
    return br, bc


def block_grid(shape, block_shape, owner: str = "BlockSparseMatrix") -> Tuple[int, int]:
    """Number of block rows and block columns of a (rows, cols) matrix; raises if the blocks do not tile it."""
    br, bc = check_block_shape(block_shape, owner)
    if len(tuple(shape)) != 2:
        raise ValueError(f"{owner}: shape={tuple(shape)} must have two dimensions (rows, cols)")
    rows, cols = (int(s) for s in shape)
    if rows < 0 or cols < 0:
        raise ValueError(f"{owner}: shape={(rows, cols)} must not be negative")
    if rows % br:
        raise ValueError(f"{owner}: shape[0]={rows} must be a multiple of block_shape[0]={br}")
    if cols % bc:
        raise ValueError(f"{owner}: shape[1]={cols} must be a multiple of block_shape[1]={bc}")
    return rows // br, cols // bc


def count_blocks(total_blocks: int, block_count=None, density=None, owner: str = "BlockSparseMatrix") -> int:
    """Resolve ``block_count`` or ``density`` (exactly one) into a number of kept blocks.

    ``density`` is rounded to the nearest block count: density=0.5 of 7 blocks keeps 4 (round half to even
    is avoided so that the count never depends on float noise).
    """
    if (block_count is None) == (density is None):
        raise ValueError(f"{owner}: give exactly one of block_count={block_count!r} and density={density!r}")
    if density is not None:
        density = float(density)
        if not 0.0 <= density <= 1.0 or math.isnan(density):
            raise ValueError(f"{owner}: density={density} must be in [0, 1]")
        return int(math.floor(density * total_blocks + 0.5))
    if isinstance(block_count, bool) or int(block_count) != block_count or not 0 <= block_count <= total_blocks:
        raise ValueError(f"{owner}: block_count={block_count!r} must be an integer in [0, {total_blocks}]")
    return int(block_count)


def _random_block_mask(n_rows: int, n_cols: int, count: int, device, generator) -> torch.Tensor:
    # randperm on the generator's device, so a seeded CPU generator gives the same pattern everywhere.
    gen_device = generator.device if generator is not None else "cpu"
    positions = torch.randperm(n_rows * n_cols, generator=generator, device=gen_device)[:count]
    mask = torch.zeros(n_rows * n_cols, dtype=torch.bool, device=gen_device)
    mask[positions] = True
    return mask.view(n_rows, n_cols).to(device)


def _mask_from_positions(n_rows: int, n_cols: int, blocks: Iterable[Sequence[int]], device) -> torch.Tensor:
    pos = torch.as_tensor([tuple(b) for b in blocks], dtype=torch.long).view(-1, 2)
    if pos.numel() and ((pos < 0).any() or (pos[:, 0] >= n_rows).any() or (pos[:, 1] >= n_cols).any()):
        raise ValueError(f"BlockSparseMatrix: blocks={pos.tolist()} must lie in the {n_rows}x{n_cols} block grid")
    mask = torch.zeros(n_rows, n_cols, dtype=torch.bool)
    mask[pos[:, 0], pos[:, 1]] = True
    if int(mask.sum()) != pos.shape[0]:
        raise ValueError(f"BlockSparseMatrix: blocks={pos.tolist()} contains the same position twice")
    return mask.to(device)


def indices_from_block_mask(block_mask: torch.Tensor) -> dict:
    """All index tensors of the format for a boolean [R, C] block mask (row-major order of blocks)."""
    n_rows, n_cols = block_mask.shape
    device = block_mask.device
    rows, cols = block_mask.nonzero(as_tuple=True)  # row-major, so columns increase within each row
    row_counts = torch.bincount(rows, minlength=n_rows)
    col_counts = torch.bincount(cols, minlength=n_cols)
    zero = torch.zeros(1, dtype=torch.long, device=device)
    # Column-major order: a stable sort by column keeps rows increasing within each column.
    perm_t = torch.sort(cols, stable=True).indices
    return dict(
        row_offsets=torch.cat([zero, row_counts.cumsum(0)]).to(_INDEX_DTYPE),
        col_indices=cols.to(_INDEX_DTYPE),
        row_indices=rows.to(_INDEX_DTYPE),
        col_offsets_t=torch.cat([zero, col_counts.cumsum(0)]).to(_INDEX_DTYPE),
        row_indices_t=rows[perm_t].to(_INDEX_DTYPE),
        perm_t=perm_t.to(_INDEX_DTYPE),
    )


def _greedy_pairs(overlap: torch.Tensor, sizes: torch.Tensor, n_cols: int) -> list:
    """Each unpaired row, most blocks first, takes the free row of largest overlap (ties to the smaller union);
    with an odd count the last row is alone."""
    # Most shared columns first, then the smallest union (an empty row pairs with an empty row).
    score = overlap * (2 * n_cols + 1) - (sizes[:, None] + sizes[None, :] - overlap)
    free = torch.ones(len(sizes), dtype=torch.bool)
    pairs = []
    for row in torch.sort(sizes, descending=True, stable=True).indices.tolist():
        if not free[row]:
            continue
        free[row] = False
        if free.any():
            partner = int(torch.where(free, score[row], float("-inf")).argmax())
            free[partner] = False
            pairs.append((row, partner))
        else:
            pairs.append((row,))
    return pairs


def _matched_pairs(overlap: torch.Tensor, greedy: list, candidates: int) -> list:
    """The pairs of a maximum-weight matching (networkx, which torch depends on) that shares the most columns in
    all: a pair's tiles are its union, so the total is the blocks minus the shared columns. The graph holds each
    row's `candidates` most-overlapping partners and the greedy pairs, so a matching of every row (but one, when
    the count is odd) exists and none shares fewer columns than the greedy one."""
    import networkx as nx

    n_rows = overlap.shape[0]
    ranked = overlap.clone().fill_diagonal_(-1)  # below every real overlap (>= 0): no row is its own partner
    nearest = ranked.topk(min(candidates, n_rows - 1), dim=1).indices.tolist()
    shared = overlap.to(torch.int64).tolist()
    graph = nx.Graph()
    graph.add_nodes_from(range(n_rows))
    graph.add_weighted_edges_from((a, b, shared[a][b]) for a in range(n_rows) for b in nearest[a])
    graph.add_weighted_edges_from((pair[0], pair[1], shared[pair[0]][pair[1]]) for pair in greedy if len(pair) == 2)
    matching = nx.max_weight_matching(graph, maxcardinality=True)
    paired = {row for pair in matching for row in pair}
    return [tuple(pair) for pair in matching] + [(row,) for row in range(n_rows) if row not in paired]


def pair_order(block_mask: torch.Tensor, max_matched_rows: int = 256, candidates: int = 8) -> torch.Tensor:
    """int32 [R]: the rows of a bool [R, C] mask ordered so that rows 2i and 2i + 1 of the order share many
    columns; the pairs by union size, largest first, a row left alone (odd R) last, and within a pair the row
    with more blocks first.

    A kernel that computes two rows per tile loads a column's activation tile once for both, so the columns a
    pair shares save loads. The pairs are a maximum-weight matching of the rows by shared columns over each row's
    ``candidates`` best partners, for up to ``max_matched_rows`` rows (0.02 s at 64 rows, 0.1 s at 256 on a
    2-core CPU, growing about as R^2); larger masks keep the greedy pairs (each row, most blocks first, takes the
    free row of largest overlap). On random patterns of 64 x 64 to 256 x 128 blocks the greedy pairs load
    10-16 % fewer tiles than rows 2i, 2i + 1 at densities 0.1-0.5, the matching another 0.9-2.3 %, within 0.6 %
    of the matching over all pairs (``benchmarks/profile/pair_tiles.py``)."""
    mask = block_mask.detach().to("cpu", torch.float32)
    n_rows, n_cols = mask.shape
    if n_rows < 3:
        return torch.arange(n_rows, dtype=_INDEX_DTYPE, device=block_mask.device)
    overlap = mask @ mask.T
    sizes = mask.sum(1)
    pairs = _greedy_pairs(overlap, sizes, n_cols)
    if n_rows <= max_matched_rows:
        pairs = _matched_pairs(overlap, pairs, candidates)
    # Within a pair, most blocks first (then the lower row); the pairs by the tiles they load (their union),
    # largest first: the kernels take tiles from a counter, so this is longest-job-first within each token tile
    # (measured 1 % faster on an H100 than pairs in row order); a row left alone stays last.
    pairs = [tuple(sorted(pair, key=lambda row: (-float(sizes[row]), row))) for pair in pairs]

    def union(pair):
        return float(sizes[pair[0]] + sizes[pair[1]] - overlap[pair]) if len(pair) == 2 else float(sizes[pair[0]])

    pairs.sort(key=lambda pair: (len(pair) == 1, -union(pair), min(pair)))
    order = [row for pair in pairs for row in pair]
    return torch.tensor(order, dtype=_INDEX_DTYPE, device=block_mask.device)


def length_order(block_mask: torch.Tensor) -> torch.Tensor:
    """int32 [R]: the rows of a bool [R, C] mask, most blocks first (ties by row). For kernels that compute one
    row per tile and hand the tiles out longest first, so that the SMs end on short tiles together."""
    counts = block_mask.detach().to("cpu").sum(1)
    order = torch.sort(counts, descending=True, stable=True).indices
    return order.to(device=block_mask.device, dtype=_INDEX_DTYPE)


def tile_lines(block_shape: Tuple[int, int]) -> int:
    """Lines (block rows or columns) per tile of the Hopper dsd / dds: 1 for blocks of 128, else 2."""
    return 1 if tuple(block_shape) == (128, 128) else 2


def line_orders(block_mask: torch.Tensor, lines_per_tile: int = 2) -> dict:
    """The ORDER_NAMES schedules of a bool [R, C] block mask: rows for y = x Wᵀ, columns for dx = dy W;
    ``pair_order`` for kernels that take two lines per tile, ``length_order`` for one."""
    order = pair_order if lines_per_tile == 2 else length_order
    return dict(row_order=order(block_mask), col_order=order(block_mask.T))


class BlockSparseMatrix(nn.Module):
    """A (rows, cols) matrix of which only some (BR, BC) blocks are stored; see the module docstring.

    It is an ``nn.Module`` so that it can be the ``weight`` of a layer: ``data`` is an ``nn.Parameter`` (the
    optimizer sees only kept blocks) and the indices are buffers (``state_dict``, ``.to()``, ``.half()``
    and DDP handle them; ``.half()`` leaves int32 indices alone).

    Build one with ``randn`` / ``zeros`` / ``ones`` (random pattern), ``from_dense`` (keep the blocks of
    largest norm), or ``from_block_mask`` (a given pattern).
    """

    def __init__(self, shape, block_mask: torch.Tensor, data: torch.Tensor, block_shape=(32, 32)):
        super().__init__()
        n_rows, n_cols = block_grid(shape, block_shape)
        if not isinstance(block_mask, torch.Tensor) or block_mask.dtype != torch.bool:
            raise TypeError(f"BlockSparseMatrix: block_mask must be a bool tensor, got {type(block_mask).__name__}"
                            f"{'' if not isinstance(block_mask, torch.Tensor) else ' of dtype ' + str(block_mask.dtype)}")
        if tuple(block_mask.shape) != (n_rows, n_cols):
            raise ValueError(f"BlockSparseMatrix: block_mask.shape={tuple(block_mask.shape)} must be the block grid "
                             f"({n_rows}, {n_cols}) of shape={tuple(shape)} with block_shape={tuple(block_shape)}")
        self.shape = torch.Size((int(shape[0]), int(shape[1])))
        self.block_shape = check_block_shape(block_shape)
        nnz = int(block_mask.sum())
        expected = (nnz, *self.block_shape)
        if not isinstance(data, torch.Tensor) or tuple(data.shape) != expected:
            got = tuple(data.shape) if isinstance(data, torch.Tensor) else type(data).__name__
            raise ValueError(f"BlockSparseMatrix: data.shape={got} must be (nnz_blocks, *block_shape) = {expected}")
        if not data.is_floating_point():
            raise TypeError(f"BlockSparseMatrix: data.dtype={data.dtype} must be a floating point dtype")
        if data.device != block_mask.device:
            raise ValueError(f"BlockSparseMatrix: data is on {data.device} but block_mask is on {block_mask.device}")
        self.data = nn.Parameter(data.detach().contiguous())
        for name, index in indices_from_block_mask(block_mask).items():
            self.register_buffer(name, index)
        for name, order in line_orders(block_mask, tile_lines(self.block_shape)).items():
            self.register_buffer(name, order, persistent=False)

    # ------------------------------------------------------------------ constructors
    @classmethod
    def _empty_like_pattern(cls, shape, block_count, blocks, block_shape, density, device, dtype, generator):
        n_rows, n_cols = block_grid(shape, block_shape)
        if blocks is not None:
            if block_count is not None or density is not None:
                raise ValueError("BlockSparseMatrix: give blocks alone, without block_count or density")
            mask = _mask_from_positions(n_rows, n_cols, blocks, device)
        else:
            count = count_blocks(n_rows * n_cols, block_count, density)
            mask = _random_block_mask(n_rows, n_cols, count, device, generator)
        dtype = dtype if dtype is not None else torch.get_default_dtype()
        data = torch.empty((int(mask.sum()), *check_block_shape(block_shape)), device=device, dtype=dtype)
        return mask, data

    @classmethod
    def zeros(cls, shape, block_count=None, blocks=None, block_shape=(32, 32), device=None, *,
              density=None, dtype=None, generator=None) -> "BlockSparseMatrix":
        """Random pattern of ``block_count`` blocks (or ``density``) or the given ``blocks`` [(row, col), ...],
        filled with zeros. The pattern is drawn from ``generator`` (CPU generators give the same pattern on
        every device)."""
        mask, data = cls._empty_like_pattern(shape, block_count, blocks, block_shape, density, device, dtype,
                                             generator)
        return cls(shape, mask, data.zero_(), block_shape)

    @classmethod
    def ones(cls, shape, block_count=None, blocks=None, block_shape=(32, 32), device=None, *,
             density=None, dtype=None, generator=None) -> "BlockSparseMatrix":
        """Like ``zeros`` but the kept blocks are filled with ones."""
        mask, data = cls._empty_like_pattern(shape, block_count, blocks, block_shape, density, device, dtype,
                                             generator)
        return cls(shape, mask, data.fill_(1.0), block_shape)

    @classmethod
    def randn(cls, shape, block_count=None, blocks=None, block_shape=(32, 32), device=None, *,
              density=None, dtype=None, generator=None, std: float = 1.0) -> "BlockSparseMatrix":
        """Like ``zeros`` but the kept blocks hold N(0, std²) values (drawn from ``generator`` too)."""
        mask, data = cls._empty_like_pattern(shape, block_count, blocks, block_shape, density, device, dtype,
                                             generator)
        gen_device = generator.device if generator is not None else data.device
        values = torch.randn(data.shape, generator=generator, device=gen_device, dtype=data.dtype) * std
        return cls(shape, mask, values.to(data.device), block_shape)

    @classmethod
    def from_block_mask(cls, block_mask: torch.Tensor, block_shape=(32, 32), dense: Optional[torch.Tensor] = None,
                        *, dtype=None) -> "BlockSparseMatrix":
        """The pattern of a bool [R, C] ``block_mask``; values taken from ``dense`` (rows, cols) or zeros."""
        br, bc = check_block_shape(block_shape)
        if not isinstance(block_mask, torch.Tensor) or block_mask.dim() != 2:
            raise ValueError(f"BlockSparseMatrix.from_block_mask: block_mask must be a 2-D bool tensor, got "
                             f"{getattr(block_mask, 'shape', type(block_mask).__name__)}")
        shape = (block_mask.shape[0] * br, block_mask.shape[1] * bc)
        if dense is None:
            data = torch.zeros((int(block_mask.sum()), br, bc), device=block_mask.device,
                               dtype=dtype or torch.get_default_dtype())
        else:
            if tuple(dense.shape) != shape:
                raise ValueError(f"BlockSparseMatrix.from_block_mask: dense.shape={tuple(dense.shape)} must be "
                                 f"{shape} (block_mask.shape={tuple(block_mask.shape)} x block_shape={(br, bc)})")
            data = gather_blocks(dense.detach(), block_mask.to(dense.device), (br, bc))
            if dtype is not None:
                data = data.to(dtype)
            block_mask = block_mask.to(dense.device)
        return cls(shape, block_mask.bool(), data, (br, bc))

    @classmethod
    def from_dense(cls, dense: torch.Tensor, block_shape=(32, 32), density=None, block_mask=None, *,
                   block_count=None, norm: str = "l2") -> "BlockSparseMatrix":
        """Keep the ``density`` (or ``block_count``) fraction of blocks of ``dense`` with the largest norm
        (``norm`` = "l2" or "l1"), with their values; or exactly the blocks of ``block_mask``."""
        from .masks import block_mask_by_magnitude  # masks builds on this module's helpers

        if not isinstance(dense, torch.Tensor) or dense.dim() != 2:
            raise ValueError(f"BlockSparseMatrix.from_dense: dense must be a 2-D tensor, got "
                             f"{getattr(dense, 'shape', type(dense).__name__)}")
        if block_mask is not None:
            if density is not None or block_count is not None:
                raise ValueError("BlockSparseMatrix.from_dense: give block_mask alone, without density or block_count")
        else:
            block_mask = block_mask_by_magnitude(dense, block_shape, density=density, block_count=block_count,
                                                 norm=norm)
        block_grid(dense.shape, block_shape, "BlockSparseMatrix.from_dense")
        return cls.from_block_mask(block_mask, block_shape, dense)

    # ------------------------------------------------------------------ views
    @property
    def nnz_blocks(self) -> int:
        return self.data.shape[0]

    @property
    def block_count(self) -> int:
        """Alias of ``nnz_blocks``."""
        return self.data.shape[0]

    @property
    def grid(self) -> Tuple[int, int]:
        """(block rows, block columns)."""
        return self.row_offsets.shape[0] - 1, self.col_offsets_t.shape[0] - 1

    @property
    def density(self) -> float:
        """Fraction of the blocks of the grid that are kept (1.0 for an empty grid)."""
        total = self.grid[0] * self.grid[1]
        return self.nnz_blocks / total if total else 1.0

    @property
    def dtype(self) -> torch.dtype:
        return self.data.dtype

    @property
    def device(self) -> torch.device:
        return self.data.device

    def indices(self) -> Tuple[torch.Tensor, ...]:
        """The index buffers in the order of ``INDEX_NAMES + ORDER_NAMES`` (what the products take)."""
        buffers = self._buffers  # direct dict access: this runs on every forward
        return tuple(buffers[name] for name in _ALL_INDEX_NAMES)

    def block_mask(self) -> torch.Tensor:
        """Bool [R, C]: True where a block is kept."""
        mask = torch.zeros(self.grid, dtype=torch.bool, device=self.device)
        mask[self.row_indices.long(), self.col_indices.long()] = True
        return mask

    def block_norm(self, norm: str = "l2") -> torch.Tensor:
        """Norm of each kept block, [nnz] in the order of ``data`` ("l2" or "l1"), computed in fp32."""
        values = self.data.detach().float().flatten(1)
        if norm == "l2":
            return values.norm(dim=1)
        if norm == "l1":
            return values.abs().sum(dim=1)
        raise ValueError(f"BlockSparseMatrix.block_norm: norm={norm!r} must be 'l2' or 'l1'")

    def to_dense(self, data_replace: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The dense (rows, cols) matrix, zeros outside the kept blocks. Differentiable with respect to
        ``data``; ``data_replace`` ([nnz, BR, BC]) scatters other values (e.g. a gradient) into the pattern."""
        values = self.data if data_replace is None else data_replace
        if tuple(values.shape) != tuple(self.data.shape):
            raise ValueError(f"BlockSparseMatrix.to_dense: data_replace.shape={tuple(values.shape)} must be "
                             f"{tuple(self.data.shape)}")
        return scatter_blocks(values, self.row_indices, self.col_indices, self.shape)

    def element_mask(self) -> torch.Tensor:
        """Bool (rows, cols): True inside kept blocks."""
        br, bc = self.block_shape
        return self.block_mask().repeat_interleave(br, 0).repeat_interleave(bc, 1)

    @torch.no_grad()
    def update_pattern(self, block_mask: torch.Tensor, new_block_values: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Move to another pattern with the same number of blocks, in place (for prune-and-regrow).

        Blocks kept by both patterns keep their values; blocks new in ``block_mask`` get
        ``new_block_values`` ([number of new blocks, BR, BC], in row-major order of the new blocks) or zeros.
        ``data`` and the index buffers are written in place, so optimizers, CUDA graphs and DDP keep pointing
        at the same tensors. Returns ``source`` ([nnz] int64): for each slot of the new ``data``, the slot
        of the old ``data`` it came from, or -1 for a new block -- use it to move per-block optimizer state.
        """
        block_mask = block_mask.to(device=self.device, dtype=torch.bool)
        if tuple(block_mask.shape) != self.grid:
            raise ValueError(f"BlockSparseMatrix.update_pattern: block_mask.shape={tuple(block_mask.shape)} must be "
                             f"the block grid {self.grid}")
        nnz = int(block_mask.sum())
        if nnz != self.nnz_blocks:
            raise ValueError(f"BlockSparseMatrix.update_pattern: block_mask keeps {nnz} blocks, must keep "
                             f"nnz_blocks={self.nnz_blocks} (the parameter's shape cannot change)")
        old_slot = torch.full(self.grid, -1, dtype=torch.long, device=self.device)
        old_slot[self.row_indices.long(), self.col_indices.long()] = torch.arange(nnz, device=self.device)
        source = old_slot[block_mask]  # row-major order of the new pattern
        is_new = source < 0
        values = torch.zeros_like(self.data)
        values[~is_new] = self.data[source[~is_new]]
        n_new = int(is_new.sum())
        if new_block_values is not None:
            if tuple(new_block_values.shape) != (n_new, *self.block_shape):
                raise ValueError(f"BlockSparseMatrix.update_pattern: new_block_values.shape="
                                 f"{tuple(new_block_values.shape)} must be ({n_new}, *block_shape) for the "
                                 f"{n_new} new blocks")
            values[is_new] = new_block_values.to(values)
        self.data.copy_(values)
        for name, index in indices_from_block_mask(block_mask).items():
            getattr(self, name).copy_(index)
        self._update_orders(block_mask)
        return source

    def _update_orders(self, block_mask: torch.Tensor) -> None:
        # In place, like the indices: CUDA graphs keep pointing at the same buffers.
        for name, order in line_orders(block_mask, tile_lines(self.block_shape)).items():
            getattr(self, name).copy_(order)

    def validate(self) -> "BlockSparseMatrix":
        """Check that every index is consistent with the others (costs a host sync). Raises ValueError."""
        if tuple(self.data.shape[1:]) != self.block_shape:
            raise ValueError(f"BlockSparseMatrix: data.shape={tuple(self.data.shape)} must end in "
                             f"block_shape={self.block_shape}")
        check_indices(self.shape, self.block_shape, self.nnz_blocks, {n: getattr(self, n) for n in INDEX_NAMES},
                      self.device)
        for name, n_lines in zip(ORDER_NAMES, self.grid):
            order = getattr(self, name)
            if order.dtype != _INDEX_DTYPE or tuple(order.shape) != (n_lines,) or not torch.equal(
                    torch.sort(order.long()).values.cpu(), torch.arange(n_lines)):
                raise ValueError(f"BlockSparseMatrix: {name} must be an int32 permutation of range({n_lines}), got "
                                 f"{order.dtype} of shape {tuple(order.shape)}")
        return self

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # Indices that do not fit together would compute silently wrong results: refuse them before any
        # tensor of this module is overwritten.
        names = ("data",) + INDEX_NAMES
        if all(prefix + name in state_dict for name in names):
            data = state_dict[prefix + "data"]
            if tuple(data.shape[1:]) == self.block_shape:
                check_indices(self.shape, self.block_shape, data.shape[0],
                              {n: state_dict[prefix + n] for n in INDEX_NAMES}, None)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        if all(prefix + name in state_dict for name in INDEX_NAMES):
            self._update_orders(self.block_mask())  # the schedules follow the loaded pattern

    def extra_repr(self) -> str:
        return (f"shape={tuple(self.shape)}, block_shape={self.block_shape}, nnz_blocks={self.nnz_blocks}, "
                f"density={self.density:.4g}")


def check_indices(shape, block_shape, nnz: int, indices: dict, device) -> None:
    """Raise ValueError unless ``indices`` (name -> tensor, layout.INDEX_NAMES) describe ``nnz`` distinct
    blocks of a ``shape`` matrix of ``block_shape`` blocks, every tensor consistent with the others."""
    n_rows, n_cols = block_grid(shape, block_shape)
    for name in INDEX_NAMES:
        index = indices[name]
        if index.dtype != _INDEX_DTYPE:
            raise ValueError(f"BlockSparseMatrix: {name}.dtype={index.dtype} must be torch.int32")
        if device is not None and index.device != device:
            raise ValueError(f"BlockSparseMatrix: {name} is on {index.device} but data is on {device}")
        expected = (n_rows + 1,) if name == "row_offsets" else (n_cols + 1,) if name == "col_offsets_t" else (nnz,)
        if tuple(index.shape) != expected:
            raise ValueError(f"BlockSparseMatrix: {name}.shape={tuple(index.shape)} must be {expected} for a "
                             f"{n_rows}x{n_cols} block grid with {nnz} blocks")
    mask = torch.zeros(n_rows, n_cols, dtype=torch.bool, device=indices["row_indices"].device)
    if nnz:
        rows, cols = indices["row_indices"].long(), indices["col_indices"].long()
        if rows.min() < 0 or rows.max() >= n_rows or cols.min() < 0 or cols.max() >= n_cols:
            raise ValueError(f"BlockSparseMatrix: block indices must lie in the {n_rows}x{n_cols} grid")
        mask[rows, cols] = True
        if int(mask.sum()) != nnz:
            raise ValueError("BlockSparseMatrix: the index holds the same block position twice")
    expected_indices = indices_from_block_mask(mask)
    for name in INDEX_NAMES:
        if not torch.equal(expected_indices[name], indices[name].to(mask.device)):
            raise ValueError(f"BlockSparseMatrix: {name} is inconsistent with the block positions "
                             f"(rebuild the matrix with from_block_mask)")


def gather_blocks(dense: torch.Tensor, block_mask: torch.Tensor, block_shape) -> torch.Tensor:
    """The blocks of ``dense`` where ``block_mask`` is True, [nnz, BR, BC] in row-major block order."""
    br, bc = block_shape
    n_rows, n_cols = block_mask.shape
    tiles = dense.reshape(n_rows, br, n_cols, bc).transpose(1, 2)  # [R, C, BR, BC]
    return tiles[block_mask].contiguous()


def scatter_blocks(data: torch.Tensor, row_indices: torch.Tensor, col_indices: torch.Tensor, shape) -> torch.Tensor:
    """Dense (rows, cols) tensor with ``data[i]`` at block (row_indices[i], col_indices[i]), zeros elsewhere."""
    _, br, bc = data.shape
    n_rows, n_cols = shape[0] // br, shape[1] // bc
    tiles = data.new_zeros((n_rows * n_cols, br, bc))
    flat = row_indices.long() * n_cols + col_indices.long()
    tiles = tiles.index_put((flat,), data)  # out of place: keeps to_dense differentiable
    return tiles.view(n_rows, n_cols, br, bc).transpose(1, 2).reshape(shape[0], shape[1])
