"""The block-sparse format: indices, constructors, conversions, validation and serialisation."""

import io

import pytest
import torch

from pytorch_block_sparse_ng import BlockSparseMatrix
from pytorch_block_sparse_ng.layout import (INDEX_NAMES, ORDER_NAMES, indices_from_block_mask, length_order,
                                            line_orders, pair_order)

MASK = torch.tensor([[0, 1, 0, 1],
                     [0, 0, 0, 0],  # an empty block row
                     [1, 1, 0, 0]], dtype=torch.bool)  # block column 2 is empty too


def test_indices_of_a_known_mask():
    idx = indices_from_block_mask(MASK)
    expected = dict(
        row_offsets=[0, 2, 2, 4],
        col_indices=[1, 3, 0, 1],
        row_indices=[0, 0, 2, 2],
        col_offsets_t=[0, 1, 3, 3, 4],
        row_indices_t=[2, 0, 2, 0],  # column 0: (2,0); column 1: (0,1), (2,1); column 3: (0,3)
        perm_t=[2, 0, 3, 1],
    )
    for name in INDEX_NAMES:
        assert idx[name].dtype == torch.int32, name
        assert idx[name].tolist() == expected[name], name


def _union_tiles(mask, order):
    """Activation tiles loaded by a kernel that takes the rows two at a time in ``order``."""
    pairs = order.long().view(-1, 2) if order.numel() % 2 == 0 else order[:-1].long().view(-1, 2)
    tiles = (mask[pairs[:, 0]] | mask[pairs[:, 1]]).sum()
    return int(tiles) + (int(mask[order[-1].long()].sum()) if order.numel() % 2 else 0)


def test_pair_order_puts_overlapping_rows_side_by_side():
    mask = torch.tensor([[1, 0, 1, 0],
                         [0, 1, 0, 1],
                         [0, 0, 0, 0],
                         [1, 0, 1, 1],
                         [0, 1, 0, 0]], dtype=torch.bool)
    order = pair_order(mask)
    assert order.dtype == torch.int32
    # Most blocks first: row 3 pairs with row 0 (2 shared columns, union 3), row 1 with row 4 (union 2), the
    # empty row 2 last.
    assert order.tolist() == [3, 0, 1, 4, 2]
    # Odd count: the row left alone (here the empty row 0) comes last, after the pairs, largest union first.
    assert pair_order(torch.cat([torch.zeros(1, 4, dtype=torch.bool), mask[[0, 1, 3, 4]]])).tolist() == [3, 1, 2, 4, 0]
    assert pair_order(torch.zeros(0, 3, dtype=torch.bool)).tolist() == []
    assert pair_order(torch.ones(2, 3, dtype=torch.bool)).tolist() == [0, 1]


def test_length_order_puts_the_longest_lines_first():
    mask = torch.tensor([[1, 0, 1, 0],
                         [0, 1, 1, 1],
                         [0, 0, 0, 0],
                         [1, 0, 1, 1],
                         [0, 1, 0, 0]], dtype=torch.bool)
    order = length_order(mask)
    assert order.dtype == torch.int32
    assert order.tolist() == [1, 3, 0, 4, 2]  # 3, 3, 2, 1, 0 blocks; ties by row
    assert length_order(torch.zeros(0, 3, dtype=torch.bool)).tolist() == []
    orders = line_orders(mask, lines_per_tile=1)
    assert orders["row_order"].tolist() == [1, 3, 0, 4, 2] and orders["col_order"].tolist() == [2, 0, 1, 3]


def test_the_orders_follow_the_kernels_tile():
    """Blocks of 128: one line per Hopper tile, longest first; other blocks: pairs of lines."""
    gen = torch.Generator().manual_seed(11)
    big = BlockSparseMatrix.randn((1024, 768), density=0.4, block_shape=(128, 128), generator=gen)
    counts = big.row_offsets.diff()
    assert torch.equal(big.row_order, length_order(big.block_mask()))
    assert counts[big.row_order.long()].tolist() == sorted(counts.tolist(), reverse=True)
    col_counts = big.col_offsets_t.diff()
    assert col_counts[big.col_order.long()].tolist() == sorted(col_counts.tolist(), reverse=True)
    small = BlockSparseMatrix.randn((1024, 768), density=0.4, block_shape=(64, 64), generator=gen)
    mask = small.block_mask()
    assert torch.equal(small.row_order, pair_order(mask)) and torch.equal(small.col_order, pair_order(mask.T))
    new_mask = torch.rand(big.grid, generator=gen).flatten().argsort().argsort().view(big.grid) < big.nnz_blocks
    big.update_pattern(new_mask)
    assert torch.equal(big.row_order, length_order(new_mask)) and torch.equal(big.col_order, length_order(new_mask.T))


@pytest.mark.parametrize("density", [0.1, 0.25, 0.5, 0.9])
@pytest.mark.parametrize("grid", [(64, 64), (65, 40), (16, 128)])
def test_pair_order_is_a_permutation_that_shares_more_tiles(grid, density):
    mask = torch.rand(grid, generator=torch.Generator().manual_seed(grid[0] + int(100 * density))) < density
    order = pair_order(mask)
    assert torch.equal(torch.sort(order.long()).values, torch.arange(grid[0]))
    identity = torch.arange(grid[0], dtype=torch.int32)
    assert _union_tiles(mask, order) <= _union_tiles(mask, identity)
    if density <= 0.5 and grid[0] >= 64:  # measured 6-15 % fewer tiles on such patterns
        assert _union_tiles(mask, order) < 0.97 * _union_tiles(mask, identity)
    orders = line_orders(mask)
    assert torch.equal(orders["col_order"], pair_order(mask.T)) and torch.equal(orders["row_order"], order)


def _fewest_union_tiles(mask):
    """The fewest tiles over all ways to pair the rows (one row alone when their count is odd), by brute force."""
    def best(rows):
        if len(rows) < 2:
            return int(mask[rows].sum()) if rows else 0
        first, rest = rows[0], rows[1:]
        options = [int((mask[first] | mask[partner]).sum()) + best(rest[:i] + rest[i + 1:])
                   for i, partner in enumerate(rest)]
        if len(rows) % 2:  # the first row may be the one alone
            options.append(int(mask[first].sum()) + best(rest))
        return min(options)
    return best(list(range(mask.shape[0])))


@pytest.mark.parametrize("rows", [6, 9, 10])
@pytest.mark.parametrize("seed", range(4))
def test_pair_order_with_every_partner_a_candidate_is_the_best_pairing(rows, seed):
    mask = torch.rand(rows, 8, generator=torch.Generator().manual_seed(100 * rows + seed)) < 0.4
    order = pair_order(mask, candidates=rows - 1)
    assert sorted(order.tolist()) == list(range(rows))
    assert _union_tiles(mask, order) == _fewest_union_tiles(mask)


@pytest.mark.parametrize("density", [0.1, 0.25, 0.5])
def test_matched_pairs_load_fewer_tiles_than_the_greedy_ones(density):
    gen = torch.Generator().manual_seed(int(100 * density))
    for grid in [(64, 64), (65, 40), (128, 64)]:
        mask = torch.rand(grid, generator=gen) < density
        greedy = pair_order(mask, max_matched_rows=0)
        matched = pair_order(mask)
        assert sorted(matched.tolist()) == list(range(grid[0]))
        # measured 0.9-2.3 % fewer on such patterns (benchmarks/results/pair_tiles_cpu.txt)
        assert _union_tiles(mask, matched) < 0.995 * _union_tiles(mask, greedy), grid
        # past max_matched_rows the greedy pairs are kept
        assert torch.equal(pair_order(mask, max_matched_rows=grid[0] - 1), greedy)


def test_orders_follow_the_pattern_but_are_not_saved():
    gen = torch.Generator().manual_seed(3)
    a = BlockSparseMatrix.randn((256, 128), density=0.3, block_shape=(16, 16), generator=gen)
    b = BlockSparseMatrix.randn((256, 128), density=0.3, block_shape=(16, 16), generator=gen)
    assert not set(a.state_dict()) & set(ORDER_NAMES)
    assert not torch.equal(a.row_order, b.row_order)
    b.load_state_dict(a.state_dict())
    assert torch.equal(a.row_order, b.row_order) and torch.equal(a.col_order, b.col_order)
    row_order = b.row_order
    new_mask = torch.rand(b.grid, generator=gen).flatten().argsort().argsort().view(b.grid) < b.nnz_blocks
    b.update_pattern(new_mask)
    assert b.row_order is row_order  # updated in place
    assert torch.equal(b.row_order, pair_order(new_mask)) and torch.equal(b.col_order, pair_order(new_mask.T))
    b.validate()
    b.row_order.fill_(0)
    with pytest.raises(ValueError, match="row_order must be an int32 permutation of range"):
        b.validate()


def _random_mask(n_rows, n_cols, p, seed):
    return torch.rand(n_rows, n_cols, generator=torch.Generator().manual_seed(seed)) < p


@pytest.mark.parametrize("grid,p", [((1, 1), 1.0), ((1, 1), 0.0), ((5, 3), 0.0), ((5, 3), 1.0), ((6, 7), 0.3),
                                    ((8, 2), 0.6), ((2, 9), 0.5)])
@pytest.mark.parametrize("block_shape", [(4, 4), (2, 8), (8, 2)])
def test_dense_round_trip_and_transposed_index(grid, p, block_shape):
    mask = _random_mask(*grid, p, seed=grid[0] * 31 + grid[1])
    shape = (grid[0] * block_shape[0], grid[1] * block_shape[1])
    dense = torch.randn(shape, dtype=torch.float64) * mask.repeat_interleave(block_shape[0], 0).repeat_interleave(
        block_shape[1], 1)
    matrix = BlockSparseMatrix.from_block_mask(mask, block_shape, dense)
    matrix.validate()
    assert torch.equal(matrix.block_mask(), mask)
    assert torch.equal(matrix.to_dense(), dense)
    assert matrix.nnz_blocks == int(mask.sum())
    # Each column-major entry points at the block it claims to be.
    br, bc = block_shape
    for c in range(grid[1]):
        for k in range(int(matrix.col_offsets_t[c]), int(matrix.col_offsets_t[c + 1])):
            r = int(matrix.row_indices_t[k])
            block = dense[r * br:(r + 1) * br, c * bc:(c + 1) * bc]
            assert torch.equal(matrix.data[int(matrix.perm_t[k])], block)


def test_rectangular_blocks_to_dense_places_values():
    mask = torch.tensor([[1, 0], [0, 1]], dtype=torch.bool)
    data = torch.arange(2 * 32 * 64, dtype=torch.float32).view(2, 32, 64)
    matrix = BlockSparseMatrix((64, 128), mask, data, block_shape=(32, 64))
    dense = matrix.to_dense()
    assert torch.equal(dense[:32, :64], data[0])
    assert torch.equal(dense[32:, 64:], data[1])
    assert dense[:32, 64:].abs().sum() == 0 and dense[32:, :64].abs().sum() == 0


def test_constructors_count_density_and_blocks(generator):
    a = BlockSparseMatrix.randn((64, 128), density=0.5, block_shape=(16, 32), generator=generator)
    assert a.nnz_blocks == 8 and a.density == 0.5 and a.data.dtype == torch.float32
    b = BlockSparseMatrix.zeros((64, 128), 3, block_shape=(16, 32))
    assert b.nnz_blocks == 3 and b.data.abs().sum() == 0
    c = BlockSparseMatrix.ones((64, 128), blocks=[(0, 1), (3, 3)], block_shape=(16, 32), dtype=torch.float64)
    assert c.block_mask().nonzero().tolist() == [[0, 1], [3, 3]]
    assert c.data.dtype == torch.float64 and torch.all(c.data == 1)
    assert BlockSparseMatrix.zeros((64, 128), density=0.0, block_shape=(16, 32)).nnz_blocks == 0
    assert BlockSparseMatrix.zeros((64, 128), density=1.0, block_shape=(16, 32)).nnz_blocks == 16
    # density rounds to the nearest whole block count
    assert BlockSparseMatrix.zeros((32, 224), density=0.5, block_shape=(32, 32)).nnz_blocks == 4


def test_generator_makes_patterns_reproducible():
    a = BlockSparseMatrix.randn((128, 128), density=0.3, generator=torch.Generator().manual_seed(7))
    b = BlockSparseMatrix.randn((128, 128), density=0.3, generator=torch.Generator().manual_seed(7))
    c = BlockSparseMatrix.randn((128, 128), density=0.3, generator=torch.Generator().manual_seed(8))
    assert torch.equal(a.block_mask(), b.block_mask()) and torch.equal(a.data, b.data)
    assert not torch.equal(a.to_dense(), c.to_dense())


def test_from_dense_keeps_blocks_of_largest_norm():
    dense = torch.zeros(4, 6)
    # block norms (blocks 2x2): (0,0)=4, (0,1)=1, (0,2)=3, (1,0)=0, (1,1)=2, (1,2)=5
    for (r, c), v in {(0, 0): 2.0, (0, 1): 0.5, (0, 2): 1.5, (1, 1): 1.0, (1, 2): 2.5}.items():
        dense[2 * r:2 * r + 2, 2 * c:2 * c + 2] = v
    m = BlockSparseMatrix.from_dense(dense, (2, 2), density=0.5)
    assert m.block_mask().tolist() == [[True, False, True], [False, False, True]]
    assert torch.equal(m.to_dense(), dense * m.element_mask())
    assert BlockSparseMatrix.from_dense(dense, (2, 2), block_count=1).block_mask().nonzero().tolist() == [[1, 2]]


def test_from_dense_l1_and_l2_can_disagree():
    dense = torch.zeros(2, 4)
    dense[0, 0] = 3.0  # block 0: one large value -> l2 3, l1 3
    dense[:, 2:] = 1.0  # block 1: four ones       -> l2 2, l1 4
    assert BlockSparseMatrix.from_dense(dense, (2, 2), block_count=1, norm="l2").block_mask().tolist() == [[True, False]]
    assert BlockSparseMatrix.from_dense(dense, (2, 2), block_count=1, norm="l1").block_mask().tolist() == [[False, True]]


def test_block_norm_and_density():
    m = BlockSparseMatrix.ones((8, 8), blocks=[(0, 0), (1, 1)], block_shape=(4, 4))
    assert torch.allclose(m.block_norm(), torch.full((2,), 4.0))
    assert torch.allclose(m.block_norm("l1"), torch.full((2,), 16.0))
    assert m.density == 0.5 and m.grid == (2, 2)
    with pytest.raises(ValueError, match="norm='l3'"):
        m.block_norm("l3")


def test_to_dense_is_differentiable_and_takes_replacement_data():
    m = BlockSparseMatrix.randn((8, 8), blocks=[(0, 1), (1, 0)], block_shape=(4, 4))
    m.to_dense().sum().backward()
    assert torch.equal(m.data.grad, torch.ones_like(m.data))
    replaced = m.to_dense(torch.full_like(m.data, 2.0))
    assert torch.equal(replaced, 2.0 * m.element_mask().float())


def test_module_conversions_keep_int32_indices():
    m = BlockSparseMatrix.randn((64, 64), density=0.5, block_shape=(16, 16))
    for converted in (m.half(), m.double(), m.to(torch.bfloat16)):
        assert converted.data.dtype != torch.float32
        assert all(converted.get_buffer(name).dtype == torch.int32 for name in INDEX_NAMES)
    assert [n for n, _ in m.named_parameters()] == ["data"]
    assert sorted(n for n, _ in m.named_buffers()) == sorted(INDEX_NAMES + ORDER_NAMES)


def test_state_dict_round_trip_restores_pattern_and_values():
    a = BlockSparseMatrix.randn((64, 64), block_count=5, block_shape=(16, 16), generator=torch.Generator().manual_seed(1))
    b = BlockSparseMatrix.randn((64, 64), block_count=5, block_shape=(16, 16), generator=torch.Generator().manual_seed(2))
    assert not torch.equal(a.to_dense(), b.to_dense())
    buffer = io.BytesIO()
    torch.save(a.state_dict(), buffer)
    buffer.seek(0)
    b.load_state_dict(torch.load(buffer))
    assert torch.equal(a.to_dense(), b.to_dense())
    b.validate()


def test_corrupted_state_dict_is_refused():
    a = BlockSparseMatrix.randn((64, 64), block_count=5, block_shape=(16, 16), generator=torch.Generator().manual_seed(5))
    before = a.to_dense().clone()
    corruptions = {
        "col_indices": (lambda t: (t + 1) % 4, "inconsistent|twice"),
        "row_indices": (lambda t: torch.full_like(t, 9), "must lie in the 4x4 grid"),
        "perm_t": (lambda t: t.flip(0), "perm_t is inconsistent"),
        "row_offsets": (lambda t: t[:-1], r"row_offsets.shape=\(4,\) must be \(5,\)"),
        "col_offsets_t": (lambda t: t.long(), "must be torch.int32"),
    }
    for name, (corrupt, match) in corruptions.items():
        state = {k: v.clone() for k, v in a.state_dict().items()}
        state[name] = corrupt(state[name])
        with pytest.raises(ValueError, match=match):
            a.load_state_dict(state)
        assert torch.equal(a.to_dense(), before), f"a refused {name} must leave the matrix as it was"
        a.validate()


@pytest.mark.parametrize("kwargs,match", [
    (dict(shape=(60, 64), density=0.5), r"shape\[0\]=60 must be a multiple of block_shape\[0\]=16"),
    (dict(shape=(64, 70), density=0.5), r"shape\[1\]=70 must be a multiple of block_shape\[1\]=16"),
    (dict(shape=(64, 64), density=1.5), r"density=1.5 must be in \[0, 1\]"),
    (dict(shape=(64, 64), density=-0.1), r"density=-0.1 must be in \[0, 1\]"),
    (dict(shape=(64, 64)), r"exactly one of block_count=None and density=None"),
    (dict(shape=(64, 64), block_count=2, density=0.5), "exactly one"),
    (dict(shape=(64, 64), block_count=17), r"block_count=17 must be an integer in \[0, 16\]"),
    (dict(shape=(64, 64), blocks=[(0, 4)]), "must lie in the 4x4 block grid"),
    (dict(shape=(64, 64), blocks=[(1, 1), (1, 1)]), "same position twice"),
    (dict(shape=(64,), density=0.5), "must have two dimensions"),
])
def test_constructor_errors_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BlockSparseMatrix.zeros(block_shape=(16, 16), **kwargs)


@pytest.mark.parametrize("block_shape", [(0, 16), (16,), (16.5, 16), "32", (-16, 16)])
def test_bad_block_shape_is_refused(block_shape):
    with pytest.raises(ValueError, match="block_shape"):
        BlockSparseMatrix.zeros((64, 64), density=0.5, block_shape=block_shape)


def test_direct_constructor_checks_mask_and_data():
    mask = torch.tensor([[True, False]])
    with pytest.raises(ValueError, match=r"data.shape=\(2, 4, 4\) must be \(nnz_blocks, \*block_shape\) = \(1, 4, 4\)"):
        BlockSparseMatrix((4, 8), mask, torch.zeros(2, 4, 4), (4, 4))
    with pytest.raises(ValueError, match=r"block_mask.shape=\(1, 2\) must be the block grid \(2, 2\)"):
        BlockSparseMatrix((8, 8), mask, torch.zeros(1, 4, 4), (4, 4))
    with pytest.raises(TypeError, match="bool tensor"):
        BlockSparseMatrix((4, 8), mask.int(), torch.zeros(1, 4, 4), (4, 4))
    with pytest.raises(TypeError, match="floating point"):
        BlockSparseMatrix((4, 8), mask, torch.zeros(1, 4, 4, dtype=torch.int64), (4, 4))
    with pytest.raises(ValueError, match=r"dense.shape=\(4, 4\) must be \(4, 8\)"):
        BlockSparseMatrix.from_block_mask(mask, (4, 4), torch.zeros(4, 4))
    with pytest.raises(ValueError, match="block_mask alone"):
        BlockSparseMatrix.from_dense(torch.zeros(4, 8), (4, 4), density=0.5, block_mask=mask)


def test_update_pattern_keeps_surviving_blocks_in_place():
    m = BlockSparseMatrix.randn((12, 12), blocks=[(0, 0), (1, 2), (2, 1)], block_shape=(4, 4))
    data_ptr, before = m.data.data_ptr(), m.to_dense().clone()
    new_mask = torch.tensor([[False, True, False], [False, False, True], [True, False, False]])
    new_values = torch.full((2, 4, 4), 7.0)
    source = m.update_pattern(new_mask, new_values)
    m.validate()
    assert m.data.data_ptr() == data_ptr, "data must be updated in place"
    assert torch.equal(m.block_mask(), new_mask)
    assert source.tolist() == [-1, 1, -1]  # new pattern in row-major order: (0,1) new, (1,2) was slot 1, (2,0) new
    dense = m.to_dense()
    assert torch.equal(dense[4:8, 8:12], before[4:8, 8:12])
    assert torch.all(dense[0:4, 4:8] == 7.0) and torch.all(dense[8:12, 0:4] == 7.0)
    with pytest.raises(ValueError, match="must keep nnz_blocks=3"):
        m.update_pattern(torch.ones(3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"new_block_values.shape=\(1, 4, 4\) must be \(3, \*block_shape\)"):
        m.update_pattern(torch.eye(3, dtype=torch.bool), torch.zeros(1, 4, 4))
