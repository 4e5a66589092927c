"""reference.py against the masked dense products (float64), and its low-precision error against PyTorch's."""

import itertools

import pytest
import torch

from pytorch_block_sparse_ng import BlockSparseMatrix, reference

from conftest import dtype_tols


@pytest.fixture(autouse=True, params=["gather", "dense"])
def strategy(request, monkeypatch):
    """Every test runs with both strategies of reference.py forced."""
    monkeypatch.setattr(reference, "DENSE_STRATEGY_MIN_DENSITY", 2.0 if request.param == "gather" else 0.0)
    return request.param


def _matrix(shape, block_shape, density, seed, dtype=torch.float64, empty_row=False):
    gen = torch.Generator().manual_seed(seed)
    n_rows, n_cols = shape[0] // block_shape[0], shape[1] // block_shape[1]
    mask = torch.rand(n_rows, n_cols, generator=gen) < density
    if density == 1.0:
        mask[:] = True
    if empty_row:
        mask[n_rows // 2] = False
    dense = torch.randn(shape, generator=gen, dtype=torch.float64)
    return BlockSparseMatrix.from_block_mask(mask, block_shape, dense.to(dtype))


GRID = list(itertools.product(
    [1, 7, 33],  # M
    [((64, 96), (16, 32)), ((32, 32), (32, 32)), ((96, 64), (32, 16)), ((128, 64), (8, 8))],  # shape, block
    [0.0, 0.1, 0.5, 1.0],  # density
))


@pytest.mark.parametrize("m,shapes,density", GRID)
def test_products_equal_masked_dense_float64(m, shapes, density):
    shape, block_shape = shapes
    w = _matrix(shape, block_shape, density, seed=m + int(density * 10), empty_row=density == 0.5)
    dense = w.to_dense()
    gen = torch.Generator().manual_seed(m)
    x = torch.randn(m, shape[1], generator=gen, dtype=torch.float64)
    dy = torch.randn(m, shape[0], generator=gen, dtype=torch.float64)
    bias = torch.randn(shape[0], generator=gen, dtype=torch.float64)
    index = w.indices()

    torch.testing.assert_close(reference.dsd(x, w.data, bias, *index), x @ dense.T + bias, **dtype_tols(torch.float64))
    torch.testing.assert_close(reference.dsd(x, w.data, None, *index), x @ dense.T, **dtype_tols(torch.float64))
    torch.testing.assert_close(reference.dds(dy, w.data, *index), dy @ dense, **dtype_tols(torch.float64))
    grad_dense = (dy.T @ x) * w.element_mask()
    grad_blocks = reference.sdd(dy, x, *index, w.block_shape)
    assert grad_blocks.shape == w.data.shape
    torch.testing.assert_close(w.to_dense(grad_blocks), grad_dense, **dtype_tols(torch.float64))


def test_empty_block_row_outputs_only_the_bias():
    w = _matrix((64, 64), (16, 16), 1.0, seed=3)
    mask = w.block_mask()
    mask[1] = False
    w = BlockSparseMatrix.from_block_mask(mask, (16, 16), w.to_dense())
    x = torch.randn(5, 64, dtype=torch.float64)
    bias = torch.arange(64, dtype=torch.float64)
    y = reference.dsd(x, w.data, bias, *w.indices())
    assert torch.equal(y[:, 16:32], bias[16:32].expand(5, 16))


def test_zero_rows_of_input():
    w = _matrix((64, 64), (16, 16), 0.5, seed=4)
    x = torch.zeros(0, 64, dtype=torch.float64)
    assert reference.dsd(x, w.data, None, *w.indices()).shape == (0, 64)
    assert reference.dds(x, w.data, *w.indices()).shape == (0, 64)
    assert torch.equal(reference.sdd(x, x, *w.indices(), (16, 16)), torch.zeros_like(w.data))


def test_chunking_over_rows_gives_the_same_result(monkeypatch, strategy):
    w = _matrix((64, 96), (16, 32), 0.5, seed=5)
    x = torch.randn(50, 96, dtype=torch.float64)
    dy = torch.randn(50, 64, dtype=torch.float64)
    whole = (reference.dsd(x, w.data, None, *w.indices()), reference.dds(dy, w.data, *w.indices()),
             reference.sdd(dy, x, *w.indices(), (16, 32)))
    monkeypatch.setattr(reference, "_CHUNK_ELEMENTS", 1000)  # forces chunks of a few rows
    chunked = (reference.dsd(x, w.data, None, *w.indices()), reference.dds(dy, w.data, *w.indices()),
               reference.sdd(dy, x, *w.indices(), (16, 32)))
    for a, b in zip(whole, chunked):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_error_is_within_twice_pytorchs_own(dtype):
    """err(reference in dtype) <= 2 * err(PyTorch's dense matmul in dtype) + atol, both against float64."""
    w64 = _matrix((128, 256), (32, 32), 0.5, seed=6)
    w = BlockSparseMatrix.from_block_mask(w64.block_mask(), (32, 32), w64.to_dense().to(dtype))
    x = torch.randn(64, 256, dtype=torch.float64).to(dtype)
    dy = torch.randn(64, 128, dtype=torch.float64).to(dtype)
    dense = w.to_dense()
    exact = dict(dsd=x.double() @ dense.double().T, dds=dy.double() @ dense.double(),
                 sdd=(dy.double().T @ x.double()) * w.element_mask())
    torch_same_dtype = dict(dsd=x @ dense.T, dds=dy @ dense, sdd=(dy.T @ x) * w.element_mask())
    ours = dict(dsd=reference.dsd(x, w.data, None, *w.indices()), dds=reference.dds(dy, w.data, *w.indices()),
                sdd=w.to_dense(reference.sdd(dy, x, *w.indices(), (32, 32))))
    for name in exact:
        assert ours[name].dtype == dtype, name
        err_ours = (ours[name].double() - exact[name]).abs().max().item()
        err_torch = (torch_same_dtype[name].double() - exact[name]).abs().max().item()
        assert err_ours <= 2 * err_torch + 1e-3, (name, err_ours, err_torch)
