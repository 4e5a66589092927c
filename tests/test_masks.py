"""N:M, block and vector-wise masks."""

import pytest
import torch

from pytorch_block_sparse_ng import (block_mask_by_magnitude, block_scores, expand_block_mask, mask_density, nm_mask,
                                     parse_nm, top_blocks, vector_mask)


@pytest.mark.parametrize("n,m", [(1, 2), (2, 4), (1, 4), (4, 8), (3, 10), (8, 16), (5, 32), (31, 32)])
def test_nm_mask_keeps_exactly_the_n_largest_of_each_group(n, m):
    gen = torch.Generator().manual_seed(n * 100 + m)
    weight = torch.randn(6, 4 * m, generator=gen)
    mask = nm_mask(weight, f"{n}:{m}")
    groups = weight.abs().view(6, 4, m)
    kept = mask.view(6, 4, m)
    assert (kept.sum(-1) == n).all()
    # every kept magnitude is at least every dropped one of its group
    smallest_kept = torch.where(kept, groups, torch.inf).amin(-1)
    largest_dropped = torch.where(~kept, groups, -torch.inf).amax(-1)
    assert (smallest_kept >= largest_dropped).all()
    assert mask_density(mask) == pytest.approx(n / m)


def test_nm_mask_along_another_dim_and_in_low_precision():
    weight = torch.randn(8, 3)
    mask = nm_mask(weight, (2, 4), dim=0)
    assert (mask.view(2, 4, 3).sum(1) == 2).all()
    w16 = torch.randn(4, 16).to(torch.bfloat16)
    assert torch.equal(nm_mask(w16), nm_mask(w16.float()))


@pytest.mark.parametrize("sparsity,match", [("4:4", "0 < N < M"), ("0:4", "0 < N < M"), ("2-4", "look like"),
                                             ((2,), "look like"), ("a:b", "look like")])
def test_parse_nm_errors(sparsity, match):
    with pytest.raises(ValueError, match=match):
        parse_nm(sparsity)


def test_nm_mask_size_error():
    with pytest.raises(ValueError, match=r"weight.shape\[-1\]=10 must be a multiple of M=4"):
        nm_mask(torch.randn(2, 10), "2:4")


def test_block_scores_and_mask():
    weight = torch.zeros(4, 4)
    weight[0:2, 2:4] = 1.0  # l2 = 2, l1 = 4
    weight[2, 0] = 3.0  # l2 = 3, l1 = 3
    scores = block_scores(weight, (2, 2))
    assert torch.allclose(scores, torch.tensor([[0.0, 2.0], [3.0, 0.0]]))
    assert torch.allclose(block_scores(weight, (2, 2), "l1"), torch.tensor([[0.0, 4.0], [3.0, 0.0]]))
    assert block_mask_by_magnitude(weight, (2, 2), block_count=1).tolist() == [[False, False], [True, False]]
    assert block_mask_by_magnitude(weight, (2, 2), block_count=1, norm="l1").tolist() == [[False, True],
                                                                                           [False, False]]
    assert not block_mask_by_magnitude(weight, (2, 2), density=0.0).any()
    assert block_mask_by_magnitude(weight, (2, 2), density=1.0).all()
    with pytest.raises(ValueError, match="norm='max'"):
        block_scores(weight, (2, 2), "max")
    with pytest.raises(ValueError, match=r"shape\[1\]=4 must be a multiple of block_shape\[1\]=3"):
        block_scores(weight, (2, 3))


def test_top_blocks_counts_and_expand():
    scores = torch.arange(12.0).view(3, 4)
    mask = top_blocks(scores, density=0.25)
    assert mask.sum() == 3 and mask.view(-1)[-3:].all()
    element = expand_block_mask(mask, (2, 3))
    assert element.shape == (6, 12) and element.sum() == 3 * 6


@pytest.mark.parametrize("dim", [0, 1])
def test_vector_mask_keeps_whole_vectors(dim):
    gen = torch.Generator().manual_seed(dim)
    weight = torch.randn(16, 32, generator=gen)
    mask = vector_mask(weight, 8, density=0.25, dim=dim)
    assert mask_density(mask) == pytest.approx(0.25)
    vectors = mask.view(16, 4, 8) if dim == 1 else mask.view(2, 8, 32).transpose(1, 2)
    assert ((vectors.sum(-1) == 0) | (vectors.sum(-1) == 8)).all()
    with pytest.raises(ValueError, match="dim=2 must be 0 or 1"):
        vector_mask(weight, 8, 0.5, dim=2)
