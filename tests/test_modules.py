"""BlockSparseLinear, PseudoBlockSparseLinear and SemiStructuredLinear on the CPU (reference path)."""

import io

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import pytorch_block_sparse_ng as bs
from pytorch_block_sparse_ng import (BlockSparseLinear, BlockSparseMatrix, PseudoBlockSparseLinear,
                                     SemiStructuredLinear)

from conftest import dtype_tols, requires_cuda


def _masked_dense_reference(layer: BlockSparseLinear) -> nn.Linear:
    """An nn.Linear holding exactly the layer's dense weight: the oracle of the forward and backward."""
    return layer.to_dense()


@pytest.mark.parametrize("density", [0.0, 0.25, 1.0])
@pytest.mark.parametrize("block_shape", [(32, 32), (16, 32), (32, 16)])
@pytest.mark.parametrize("input_kind", ["2d", "3d", "non_contiguous", "m1"])
def test_forward_backward_match_masked_dense(density, block_shape, input_kind, generator):
    layer = BlockSparseLinear(128, 96, density=density, block_shape=block_shape, generator=generator,
                              dtype=torch.float64)
    dense = _masked_dense_reference(layer)
    if input_kind == "2d":
        x = torch.randn(10, 128, dtype=torch.float64)
    elif input_kind == "3d":
        x = torch.randn(3, 5, 128, dtype=torch.float64)
    elif input_kind == "non_contiguous":
        x = torch.randn(128, 6, dtype=torch.float64).T  # (6, 128), stride (1, 6)
        assert not x.is_contiguous()
    else:
        x = torch.randn(1, 128, dtype=torch.float64)
    x_ours, x_dense = x.clone().requires_grad_(), x.clone().requires_grad_()
    y, y_dense = layer(x_ours), dense(x_dense)
    assert y.shape == (*x.shape[:-1], 96)
    torch.testing.assert_close(y, y_dense, **dtype_tols(torch.float64))

    grad_y = torch.randn_like(y)
    y.backward(grad_y)
    y_dense.backward(grad_y)
    torch.testing.assert_close(x_ours.grad, x_dense.grad, **dtype_tols(torch.float64))
    torch.testing.assert_close(layer.bias.grad, dense.bias.grad, **dtype_tols(torch.float64))
    # The weight gradient exists on the kept blocks only and equals the dense gradient there.
    torch.testing.assert_close(layer.weight.to_dense(layer.weight.data.grad),
                               dense.weight.grad * layer.weight.element_mask(), **dtype_tols(torch.float64))


def test_gradcheck_float64():
    layer = BlockSparseLinear(64, 32, density=0.5, block_shape=(16, 16), dtype=torch.float64,
                              generator=torch.Generator().manual_seed(0))
    x = torch.randn(2, 3, 64, dtype=torch.float64, requires_grad=True)
    index = layer.weight.indices()
    assert torch.autograd.gradcheck(
        lambda x, d, b: bs.BlockSparseLinearFunction.apply(x.reshape(-1, 64), d, b, *index),
        (x, layer.weight.data, layer.bias))
    assert torch.autograd.gradcheck(lambda x: layer(x), (x,))


@pytest.mark.parametrize("trainable", ["weight", "bias", "both"])
def test_frozen_weight_or_bias_gets_no_gradient(trainable, generator):
    """The backward computes the weight and bias gradients together (one fused pass where the kernels can) or
    alone: each one only when asked for."""
    layer = BlockSparseLinear(64, 48, density=0.5, block_shape=(16, 16), generator=generator, dtype=torch.float64)
    dense = _masked_dense_reference(layer)
    layer.weight.data.requires_grad_(trainable in ("weight", "both"))
    layer.bias.requires_grad_(trainable in ("bias", "both"))
    x = torch.randn(5, 64, dtype=torch.float64)
    grad_y = torch.randn(5, 48, dtype=torch.float64)
    layer(x).backward(grad_y)
    dense(x).backward(grad_y)
    if trainable == "bias":
        assert layer.weight.data.grad is None
    else:
        torch.testing.assert_close(layer.weight.to_dense(layer.weight.data.grad),
                                   dense.weight.grad * layer.weight.element_mask())
    if trainable == "weight":
        assert layer.bias.grad is None
    else:
        torch.testing.assert_close(layer.bias.grad, dense.bias.grad)


def test_density_zero_outputs_the_bias_and_zero_input_gradient():
    layer = BlockSparseLinear(64, 32, density=0.0, block_shape=(16, 16))
    x = torch.randn(4, 64, requires_grad=True)
    y = layer(x)
    assert torch.equal(y, layer.bias.expand(4, 32))
    y.sum().backward()
    assert torch.equal(x.grad, torch.zeros_like(x))
    assert layer.weight.data.shape == (0, 16, 16)


def test_predecessor_signature_and_torch_nn_linear_conversion():
    linear = nn.Linear(128, 64)
    # pytorch_block_sparse 0.1.2's patcher called it like this: sizes come from the linear.
    layer = BlockSparseLinear(0, 0, False, torch_nn_linear=linear, density=0.5)
    assert (layer.in_features, layer.out_features, layer.bias is not None) == (128, 64, True)
    expected_mask = bs.block_mask_by_magnitude(linear.weight, (32, 32), density=0.5)
    assert torch.equal(layer.weight.block_mask(), expected_mask)
    assert torch.equal(layer.weight.to_dense(), linear.weight.detach() * bs.expand_block_mask(expected_mask, (32, 32)))
    assert torch.equal(layer.bias, linear.bias)
    # predecessor code reads these
    assert layer.weight.to_dense().shape == (64, 128) and layer.block_count == 4


def test_from_dense_and_to_dense():
    linear = nn.Linear(96, 64, bias=False, dtype=torch.float64)
    layer = BlockSparseLinear.from_dense(linear, 0.5, (16, 32))
    assert layer.bias is None and layer.weight.data.dtype == torch.float64 and layer.block_shape == (16, 32)
    kept = layer.weight.element_mask()
    assert torch.equal(layer.to_dense().weight, linear.weight.detach() * kept)
    # every dropped block has a norm no larger than every kept one
    scores = bs.block_scores(linear.weight, (16, 32))
    mask = layer.weight.block_mask()
    assert scores[mask].min() >= scores[~mask].max()
    x = torch.randn(7, 96, dtype=torch.float64)
    torch.testing.assert_close(layer(x), layer.to_dense()(x), **dtype_tols(torch.float64))
    explicit = BlockSparseLinear.from_dense(linear, block_shape=(16, 32), block_mask=~mask)
    assert torch.equal(explicit.weight.block_mask(), ~mask)
    with pytest.raises(ValueError, match="not both"):
        BlockSparseLinear.from_dense(linear, 0.5, (16, 32), block_mask=mask)


def test_initialisation_matches_nn_linear_output_scale():
    torch.manual_seed(0)
    x = torch.randn(512, 1024)
    dense_std = nn.Linear(1024, 1024)(x).std().item()
    for density in (0.1, 0.5):
        sparse_std = BlockSparseLinear(1024, 1024, density=density)(x).std().item()
        assert abs(sparse_std / dense_std - 1) < 0.1, (density, sparse_std, dense_std)


def test_generator_reproducibility_and_factory_kwargs():
    a = BlockSparseLinear(64, 64, density=0.5, block_shape=(16, 16), generator=torch.Generator().manual_seed(3))
    b = BlockSparseLinear(64, 64, density=0.5, block_shape=(16, 16), generator=torch.Generator().manual_seed(3))
    assert torch.equal(a.weight.to_dense(), b.weight.to_dense()) and torch.equal(a.bias, b.bias)
    c = BlockSparseLinear(64, 64, density=0.5, block_shape=(16, 16), dtype=torch.float64, device="cpu")
    assert c.weight.data.dtype == torch.float64 and c.bias.dtype == torch.float64


def test_state_dict_round_trip_and_whole_module_save(tmp_path):
    a = BlockSparseLinear(64, 64, density=0.5, block_shape=(16, 16), generator=torch.Generator().manual_seed(1))
    b = BlockSparseLinear(64, 64, density=0.5, block_shape=(16, 16), generator=torch.Generator().manual_seed(2))
    x = torch.randn(5, 64)
    assert not torch.equal(a(x), b(x))
    torch.save(a.state_dict(), tmp_path / "a.pt")
    b.load_state_dict(torch.load(tmp_path / "a.pt"))
    assert torch.equal(a(x), b(x))
    assert sorted(a.state_dict()) == sorted(["bias", "weight.data"] + [f"weight.{n}" for n in bs.layout.INDEX_NAMES])
    buffer = io.BytesIO()
    torch.save(a, buffer)
    buffer.seek(0)
    c = torch.load(buffer, weights_only=False)
    assert torch.equal(c(x), a(x))


def test_state_dict_with_another_block_count_is_refused_and_weights_kept():
    a = BlockSparseLinear(64, 64, density=0.5, block_shape=(16, 16))
    b = BlockSparseLinear(64, 64, density=0.25, block_shape=(16, 16))
    before = b.weight.to_dense().clone()
    with pytest.raises(RuntimeError, match="size mismatch"):
        b.load_state_dict(a.state_dict())
    assert torch.equal(b.weight.to_dense(), before)


def test_optimizer_sees_only_kept_blocks_and_bias():
    layer = BlockSparseLinear(64, 32, density=0.25, block_shape=(16, 16))
    names = [n for n, _ in layer.named_parameters()]
    assert sorted(names) == ["bias", "weight.data"]
    assert sum(p.numel() for p in layer.parameters()) == 2 * 16 * 16 + 32
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    before = layer.weight.to_dense().clone()
    layer(torch.randn(8, 64)).pow(2).sum().backward()
    opt.step()
    after = layer.weight.to_dense()
    changed = (after != before)
    assert changed.any()
    assert not (changed & ~layer.weight.element_mask()).any(), "weights outside the kept blocks must stay zero"


def test_dtype_conversions_and_autocast():
    layer = BlockSparseLinear(64, 32, density=0.5, block_shape=(16, 16))
    assert layer.double().weight.data.dtype == torch.float64
    assert layer.weight.col_indices.dtype == torch.int32
    layer.float()
    x = torch.randn(4, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert layer.weight.data.grad.dtype == torch.float32 and layer.bias.grad.dtype == torch.float32
    torch.testing.assert_close(y.float(), layer.to_dense()(x), **dtype_tols(torch.bfloat16))


def test_extra_repr_names_density_and_block_shape():
    text = repr(BlockSparseLinear(64, 64, density=0.25, block_shape=(16, 32)))
    assert "density=0.25" in text and "block_shape=(16, 32)" in text


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(in_features=100, out_features=64), ValueError, r"in_features=100 must be a multiple of block_shape\[1\]=32"),
    (dict(in_features=64, out_features=48), ValueError, r"out_features=48 must be a multiple of block_shape\[0\]=32"),
    (dict(in_features=64, out_features=64, density=2.0), ValueError, r"density=2.0 must be in \[0, 1\]"),
    (dict(in_features=64, out_features=64, block_shape=(32,)), ValueError, "block_shape"),
    (dict(in_features=-32, out_features=64), ValueError, "in_features=-32 must be a positive integer"),
])
def test_constructor_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        BlockSparseLinear(**kwargs)


def test_call_errors_name_the_argument():
    layer = BlockSparseLinear(64, 32, density=0.5, block_shape=(16, 16))
    with pytest.raises(ValueError, match=r"x.shape=\(4, 60\) must end in in_features=64"):
        layer(torch.randn(4, 60))
    with pytest.raises(TypeError, match="x.dtype=torch.float64.*must be equal"):
        layer(torch.randn(4, 64, dtype=torch.float64))
    with pytest.raises(TypeError, match="BlockSparseMatrix"):
        bs.block_sparse_linear(torch.randn(4, 64), torch.randn(32, 64))
    with pytest.raises(ValueError, match=r"bias.shape=\(3,\) must be \(32,\)"):
        bs.block_sparse_linear(torch.randn(4, 64), layer.weight, torch.zeros(3))


def test_backend_switch():
    assert bs.get_backend() == "auto"
    with bs.use_backend("reference"):
        assert bs.get_backend() == "reference"
    assert bs.get_backend() == "auto"
    with pytest.raises(ValueError, match="backend='fast' must be one of"):
        bs.set_backend("fast")
    assert bs.kernels_available() in (True, False)


def test_pseudo_block_sparse_linear_computes_the_same_function():
    layer = BlockSparseLinear(64, 32, density=0.5, block_shape=(16, 16))
    pseudo = PseudoBlockSparseLinear(layer)
    x = torch.randn(6, 64)
    torch.testing.assert_close(pseudo(x), layer(x), **dtype_tols(torch.float32))
    assert pseudo.density == layer.density and "block_shape=(16, 16)" in repr(pseudo)


# ---------------------------------------------------------------------------- SemiStructuredLinear

def _is_nm(mask, n, m):
    return bool((mask.view(mask.shape[0], -1, m).sum(-1) == n).all())


def test_semi_structured_fresh_layer_is_2_4_and_trains_with_fixed_mask():
    layer = SemiStructuredLinear(64, 32)
    assert layer.sparsity == (2, 4) and _is_nm(layer.mask, 2, 4)
    assert not layer.weight[~layer.mask].any()
    x = torch.randn(8, 64)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight * layer.mask, layer.bias))
    opt = torch.optim.Adam(layer.parameters(), lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        layer(x).pow(2).mean().backward()
        assert not layer.weight.grad[~layer.mask].any(), "pruned weights must get zero gradient"
        opt.step()
    assert not layer.weight[~layer.mask].any(), "pruned weights must stay zero"


def test_semi_structured_from_dense_keeps_largest_of_each_group():
    linear = nn.Linear(16, 4)
    with torch.no_grad():
        linear.weight.copy_(torch.arange(64, dtype=torch.float32).view(4, 16) * torch.tensor([1.0, -1.0]).repeat(32).view(4, 16))
    layer = SemiStructuredLinear.from_dense(linear)
    expected = torch.tensor([False, False, True, True]).repeat(4 * 4).view(4, 16)
    assert torch.equal(layer.mask, expected)
    assert torch.equal(layer.to_dense().weight, linear.weight.detach() * expected)
    assert torch.equal(layer.bias, linear.bias)


@pytest.mark.parametrize("sparsity", ["1:4", "4:8", "3:16", "5:32"])
def test_semi_structured_other_n_m(sparsity):
    n, m = (int(v) for v in sparsity.split(":"))
    layer = SemiStructuredLinear.from_dense(nn.Linear(64, 8), sparsity)
    assert _is_nm(layer.mask, n, m) and f"sparsity={n}:{m}" in repr(layer)


def test_semi_structured_errors():
    with pytest.raises(ValueError, match="in_features=66 must be a multiple of M=4"):
        SemiStructuredLinear(66, 32)
    with pytest.raises(ValueError, match="sparsity='4:4' must have 0 < N < M"):
        SemiStructuredLinear(64, 32, sparsity="4:4")
    with pytest.raises(ValueError, match="must look like '2:4'"):
        SemiStructuredLinear.from_dense(nn.Linear(64, 32), "half")


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_semi_structured_cuda_inference_matches_masked_dense(dtype):
    layer = SemiStructuredLinear.from_dense(nn.Linear(256, 128, device="cuda", dtype=dtype))
    x = torch.randn(64, 256, device="cuda", dtype=dtype)
    with torch.no_grad():
        y = layer(x)
        y_dense = F.linear(x, layer.weight * layer.mask, layer.bias)
    # float32 reference: both must be as close to it as PyTorch's own same-dtype product (x2)
    exact = F.linear(x.float(), (layer.weight * layer.mask).float(), layer.bias.float())
    err_ours = (y.float() - exact).abs().max().item()
    err_torch = (y_dense.float() - exact).abs().max().item()
    assert err_ours <= 2 * err_torch + 1e-2, (err_ours, err_torch, layer._compress_error)
