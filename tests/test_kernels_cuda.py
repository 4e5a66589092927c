"""The CUDA kernels (pytorch_block_sparse_ng._C through _ops) against reference.py.

GPU tests (marked ``cuda``) compare each kernel with an fp32 computation of the same product and require
``err(kernel) <= 2 * err(PyTorch's dense matmul in the same dtype) + one ulp of the output's largest value``,
the errors being the largest absolute difference to the fp32 result. They skip with a reason when no GPU or no
extension is there. The argument-check tests need only the built extension (they run on CPU-only machines).
"""

import itertools
import os
import subprocess
import sys
import zlib
from collections import namedtuple

import pytest
import torch
import torch.nn.functional as F

from pytorch_block_sparse_ng import BlockSparseLinear, BlockSparseMatrix, _extension, backend, reference

OPS = _extension.get()
HAS_GPU = torch.cuda.is_available()

requires_extension = pytest.mark.skipif(
    OPS is None, reason="the CUDA extension pytorch_block_sparse_ng._C is not built "
                        "(build it with a CUDA torch: pip install --no-build-isolation -e .)")
requires_kernels = pytest.mark.skipif(
    OPS is None or not HAS_GPU or not OPS.device_supported(torch.device("cuda")),
    reason="needs a CUDA GPU and the extension built for its arch")

Case = namedtuple("Case", "m in_features out_features density block dtype")
M_VALUES = (1, 7, 128, 1000)
FEATURES = ((256, 768), (768, 1024), (1024, 256))  # (in, out): every size in {256, 768, 1024} on both sides
DENSITIES = (0.0, 0.1, 0.5, 1.0)
BLOCKS = (32, 64, 128)
DTYPES = (torch.float16, torch.bfloat16)
GRID = [Case(m, i, o, d, b, t) for m in M_VALUES for (i, o) in FEATURES for d in DENSITIES for b in BLOCKS
        for t in DTYPES]
# The large sizes (M = 8192, features 3072 / 4096) on a thinner grid, to keep the suite short.
GRID += [Case(8192, i, o, d, b, t) for (i, o) in ((3072, 4096), (4096, 3072)) for d in (0.1, 1.0) for b in BLOCKS
         for t in DTYPES]


def case_id(case):
    return f"m{case.m}-{case.in_features}x{case.out_features}-d{case.density}-b{case.block}-{str(case.dtype)[6:]}"


def max_err(out, ref):
    return (out.float() - ref.float()).abs().max().item() if out.numel() else 0.0


def assert_like_torch(name, out, ref32, torch_out):
    """err(out) <= 2 err(torch same dtype) + 1 ulp of max |ref|, errors measured against the fp32 result."""
    assert out.dtype == torch_out.dtype and out.shape == ref32.shape, (name, out.dtype, out.shape, ref32.shape)
    assert torch.isfinite(out).all(), f"{name}: non-finite values"
    atol = torch.finfo(out.dtype).eps * (ref32.abs().max().item() if ref32.numel() else 0.0) + 1e-6
    err, torch_err = max_err(out, ref32), max_err(torch_out, ref32)
    assert err <= 2 * torch_err + atol, f"{name}: max error {err:.3g} > 2 x torch's {torch_err:.3g} + {atol:.3g}"


def make_weight(case, generator):
    w = BlockSparseMatrix.randn((case.out_features, case.in_features), density=case.density,
                                block_shape=(case.block, case.block), dtype=torch.float32, generator=generator)
    return w.to("cuda")


def _product_case(case, seed_offset):
    """The weight, its index, x, dy, bias and the blocks of a case, in the case's dtype."""
    generator = torch.Generator().manual_seed(zlib.crc32(case_id(case).encode()) + seed_offset)
    w = make_weight(case, generator)
    index = w.indices()
    x = torch.randn(case.m, case.in_features, generator=generator).cuda().to(case.dtype)
    dy = torch.randn(case.m, case.out_features, generator=generator).cuda().to(case.dtype)
    bias = torch.randn(case.out_features, generator=generator).cuda().to(case.dtype)
    data = w.data.detach().to(case.dtype)
    return w, index, x, dy, bias, data


def _check_products(label, case, w, index, x, dy, bias, data):
    """dsd (with and without bias), dds and sdd against fp32 results from the rounded inputs, with PyTorch's
    own dense products in the same dtype as the error yardstick."""
    dense_t = w.to_dense(data.float()).detach().to(case.dtype)
    y = OPS.dsd(x, data, bias, *index)
    assert_like_torch(f"dsd ({label})", y, reference.dsd(x.float(), data.float(), bias.float(), *index),
                      F.linear(x, dense_t, bias))
    y_nobias = OPS.dsd(x, data, None, *index)
    assert_like_torch(f"dsd, no bias ({label})", y_nobias, reference.dsd(x.float(), data.float(), None, *index),
                      F.linear(x, dense_t))
    dx = OPS.dds(dy, data, *index)
    assert_like_torch(f"dds ({label})", dx, reference.dds(dy.float(), data.float(), *index), dy @ dense_t)
    block = (case.block, case.block)
    dw = OPS.sdd(dy, x, *index, block)
    torch_dw = (dy.t() @ x).reshape(w.grid[0], case.block, w.grid[1], case.block).transpose(1, 2)[
        w.row_indices.long(), w.col_indices.long()]
    assert_like_torch(f"sdd ({label})", dw, reference.sdd(dy.float(), x.float(), *index, block), torch_dw)
    # The bias gradient fused into the (Hopper) sdd, or summed beside it.
    dw_fused, db = OPS.sdd_with_bias_grad(dy, x, *index, block)
    assert_like_torch(f"sdd with bias ({label})", dw_fused, reference.sdd(dy.float(), x.float(), *index, block),
                      torch_dw)
    assert_like_torch(f"bias gradient ({label})", db, dy.float().sum(0), dy.sum(0))


def forced_knobs(*settings):
    """_ops.forced_knobs (knobs set for a with block, restored after it), imported when a test runs: _ops needs the
    built extension, and this module must import without it."""
    from pytorch_block_sparse_ng import _ops

    return _ops.forced_knobs(*settings)


@pytest.mark.cuda
@requires_kernels
@pytest.mark.parametrize("case", GRID, ids=case_id)
def test_products_match_reference(case):
    tensors = _product_case(case, 0)
    _, _, x, _, _, data = tensors
    assert OPS.supports(x, data)
    _check_products("default path", case, *tensors)


@pytest.mark.cuda
@requires_kernels
@pytest.mark.parametrize("case", [c for c in GRID if c.block in (64, 128) and c.m in (7, 1000) and c.density > 0],
                         ids=case_id)
def test_sm80_path_on_every_gpu(case):
    """With the Hopper kernels switched off, dsd / dds / sdd take the SM80 path on Hopper too: keep it tested there."""
    from pytorch_block_sparse_ng import _ops

    tensors = _product_case(case, 1)
    with forced_knobs((_ops.set_hopper_kernels, False)):
        _check_products("SM80 path", case, *tensors)


# The decode kernel (dsd with M <= 64): each of its token tiles (8, 16, 32, 64) and their edges, every block size,
# rows without blocks (density 0 and 0.1), many short block rows (256 -> 4096) and few long ones (1024 -> 768).
DECODE_GRID = [Case(m, i, o, d, b, t) for m in (1, 8, 9, 16, 17, 32, 33, 64) for (i, o) in ((1024, 768), (256, 4096))
               for d in DENSITIES for b in BLOCKS for t in DTYPES]
# Rows of >= 32 blocks of 64 (the 16-warp variant at M > 32).
DECODE_GRID += [Case(m, 4096, 256, d, 64, t) for m in (33, 64) for d in (0.5, 1.0) for t in DTYPES]


def _check_dsd(label, case, seed_offset):
    """dsd of a case, with and without bias, against the fp32 reference (PyTorch's same-dtype error as the
    yardstick)."""
    w, index, x, _, bias, data = _product_case(case, seed_offset)
    dense_t = w.to_dense(data.float()).detach().to(case.dtype)
    assert_like_torch(label, OPS.dsd(x, data, bias, *index),
                      reference.dsd(x.float(), data.float(), bias.float(), *index), F.linear(x, dense_t, bias))
    assert_like_torch(f"{label}, no bias", OPS.dsd(x, data, None, *index),
                      reference.dsd(x.float(), data.float(), None, *index), F.linear(x, dense_t))


@pytest.mark.cuda
@requires_kernels
@pytest.mark.parametrize("case", DECODE_GRID, ids=case_id)
def test_decode_dsd_matches_reference(case):
    from pytorch_block_sparse_ng import _ops

    assert _ops.set_decode_max_rows(64) == 64  # the default: M <= 64 takes the decode kernel
    _check_dsd("decode dsd", case, 3)


@pytest.mark.cuda
@requires_kernels
@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("m", (1, 7, 64))
def test_decode_kernel_and_the_tiled_path_agree(m, block):
    """The tiled kernels (split over the row's blocks at few rows) stay reachable with the decode kernel off, and
    BlockSparseLinear takes the decode kernel for a 3-D, non-contiguous input of few tokens."""
    from pytorch_block_sparse_ng import _ops

    case = Case(m, 512, 1024, 0.3, block, torch.bfloat16)
    w, index, x, _, bias, data = _product_case(case, 4)
    ref = reference.dsd(x.float(), data.float(), bias.float(), *index)
    torch_out = F.linear(x, w.to_dense(data.float()).detach().to(case.dtype), bias)
    with forced_knobs((_ops.set_decode_max_rows, 0),
                      (_ops.set_hopper_few_rows_split, 0)):  # the SM80 kernels, not the Hopper few-rows dsd
        assert_like_torch("tiled dsd", OPS.dsd(x, data, bias, *index), ref, torch_out)
    layer = BlockSparseLinear(512, 1024, density=0.3, block_shape=(block, block), device="cuda",
                              dtype=torch.bfloat16, generator=torch.Generator().manual_seed(5))
    _check_layer_on_strided_3d_input("BlockSparseLinear, decode", layer, m)


def _check_layer_on_strided_3d_input(label, layer, m):
    """The layer's forward on a (2, m, in_features) non-contiguous input against fp32 F.linear."""
    x3 = torch.randn(layer.in_features, m, 2, device="cuda", dtype=torch.bfloat16).permute(2, 1, 0)
    with torch.no_grad():
        y = layer(x3)
        dense = layer.weight.to_dense().detach()
        ref = F.linear(x3.float(), dense.float(), layer.bias.float())
        assert_like_torch(label, y, ref, F.linear(x3, dense, layer.bias))


# 128-255 rows with few block rows: the SM80 dsd takes 64-row tiles (bindings.cpp), full and partial.
ROW_TILE_GRID = [Case(m, 1024, 768, d, b, t) for m in (128, 129, 200, 255) for d in (0.0, 0.3, 1.0) for b in BLOCKS
                 for t in DTYPES]


@pytest.mark.cuda
@requires_kernels
@pytest.mark.parametrize("case", ROW_TILE_GRID, ids=case_id)
def test_sm80_dsd_64_row_tiles(case):
    from pytorch_block_sparse_ng import _ops

    with forced_knobs((_ops.set_hopper_few_rows_split, 0)):  # on Hopper GPUs these M take the few-rows dsd by default
        _check_dsd("dsd, 64-row tiles", case, 5)


# The SM80 dsd with each block row's blocks split over CTAs (few rows of M, long rows: R x M-tiles < SMs and >= 1024
# of K per row): (m, in, out, density, block, dtype, empty block rows). Splits of 2 to 8; M tiles of 64 and 128 rows
# with a partial last one; rows without blocks (their output is the bias).
SM80_SPLIT_CASES = [(65, 4096, 256, 0.5, 64, torch.bfloat16, 0), (100, 4096, 512, 1.0, 32, torch.float16, 0),
                    (150, 4096, 1024, 0.5, 128, torch.bfloat16, 2), (200, 3072, 1024, 0.6, 64, torch.float16, 3)]


@pytest.mark.cuda
@requires_kernels
@pytest.mark.parametrize("m, in_features, out_features, density, block, dtype, empty_rows", SM80_SPLIT_CASES)
def test_sm80_dsd_split_over_ctas(m, in_features, out_features, density, block, dtype, empty_rows):
    """The split SM80 dsd: each CTA stores its fp32 partial sums, and the last of a tile's CTAs to finish adds
    them in split order with the bias (a self-resetting counter per tile; no zeroed workspace, no extra kernels).
    Against the reference with and without the bias; three calls in a row, one on another stream, and a CUDA graph
    replayed twice (the graph's own counters), each output landing in a freed NaN-filled block of its size (a tile
    left unstored, or a counter left non-zero, cannot pass); bitwise equal from call to call."""
    from pytorch_block_sparse_ng import _ops

    generator = torch.Generator().manual_seed(m + block)
    rows, cols = out_features // block, in_features // block
    mask = torch.rand(rows, cols, generator=generator) < density
    mask[rows - empty_rows:] = False
    w = BlockSparseMatrix.from_block_mask(mask, (block, block)).to("cuda")
    k_per_row = w.data.shape[0] // rows * block
    assert k_per_row >= 1024, "the split rule takes >= 512 of K per split"
    index = w.indices()
    data = w.data.detach().to(dtype)
    x = torch.randn(m, in_features, generator=generator).cuda().to(dtype)
    bias = torch.randn(out_features, generator=generator).cuda().to(dtype)
    dense_t = w.to_dense(data.float()).detach().to(dtype)

    def poisoned(with_bias):
        junk = torch.full((m, out_features), float("nan"), device="cuda", dtype=dtype)
        del junk
        return OPS.dsd(x, data, bias if with_bias else None, *index)

    with forced_knobs((_ops.set_hopper_kernels, False)):  # the SM80 kernels (on Hopper GPUs too)
        for with_bias in (True, False):
            b = bias if with_bias else None
            first = poisoned(with_bias)
            assert_like_torch(f"split dsd, bias {with_bias}", first,
                              reference.dsd(x.float(), data.float(), None if b is None else b.float(), *index),
                              F.linear(x, dense_t, b))
            side = torch.cuda.Stream()
            for call in range(3):
                stream = side if call == 2 else torch.cuda.current_stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    again = poisoned(with_bias)
                torch.cuda.current_stream().wait_stream(stream)
                assert torch.equal(again, first), f"call {call} differs (bias {with_bias})"
            side.wait_stream(torch.cuda.current_stream())
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=side):
                captured = OPS.dsd(x, data, b, *index)
            for _ in range(2):
                captured.fill_(float("nan"))
                graph.replay()
                assert torch.equal(captured, first), f"graph replay differs (bias {with_bias})"
            del graph


# The Hopper few-rows dsd (128-token tiles, the reduction split over 1, 2, 4 or 8 CTAs of a cluster): M from 1 (decode
# off) to 511, partial token tiles, K of 3 block columns (uneven key ranges; at density 0.1 CTAs whose range holds
# no block of their lines), odd line counts (448 = 7 lines of 64), rows without blocks.
def _few_rows_cases():
    cases, i = [], 0
    for m in (1, 65, 128, 300, 511):
        for block in (64, 128):
            for (in_features, out_features) in ((1024, 768), (4096, 1024), (3 * block, 7 * 64 if block == 64 else 5 * 128)):
                for density in (0.1, 0.5, 1.0):
                    cases.append(Case(m, in_features, out_features, density, block, DTYPES[i % 2]))
                    i += 1
    # Lines of more than 64 blocks (132 block columns of 64, 66 of 128): the producer's scan for its key range
    # takes more than one step of 64 entries.
    for m in (65, 300):
        for block in (64, 128):
            for density in (0.7, 1.0):
                cases.append(Case(m, 8448, 384, density, block, DTYPES[i % 2]))
                i += 1
    return cases


@pytest.mark.cuda
@requires_kernels
@pytest.mark.skipif(not (OPS is not None and HAS_GPU and torch.cuda.get_device_capability() == (9, 0)),
                    reason="the Hopper kernels run on sm_90 GPUs only")
@pytest.mark.parametrize("case", _few_rows_cases(), ids=case_id)
def test_hopper_few_rows_dsd_and_dds(case):
    from pytorch_block_sparse_ng import _C, _ops

    if not _C.uses_hopper_kernels(torch.cuda.current_device(), case.block):
        pytest.skip("this build has no sm_90a kernels")
    w, index, x, dy, bias, data = _product_case(case, 6)
    dense_t = w.to_dense(data.float()).detach().to(case.dtype)
    ref = reference.dsd(x.float(), data.float(), bias.float(), *index)
    torch_out = F.linear(x, dense_t, bias)
    ref_dx = reference.dds(dy.float(), data.float(), *index)
    with forced_knobs((_ops.set_decode_max_rows, 0)):
        for split in (1, 2, 4, 8):
            with forced_knobs((_ops.set_hopper_few_rows_split, split)):
                y = OPS.dsd(x, data, bias, *index)
                assert_like_torch(f"few-rows dsd, split {split}", y, ref, torch_out)
                assert torch.equal(OPS.dsd(x, data, bias, *index), y), "the split's sums are added in a fixed order"
                assert_like_torch(f"few-rows dsd, split {split}, no bias", OPS.dsd(x, data, None, *index),
                                  reference.dsd(x.float(), data.float(), None, *index), F.linear(x, dense_t))
                dx = OPS.dds(dy, data, *index)
                assert_like_torch(f"few-rows dds, split {split}", dx, ref_dx, dy @ dense_t)
                assert torch.equal(OPS.dds(dy, data, *index), dx), "the split's sums are added in a fixed order"


# From 2048 rows the default path takes the few-rows tiles only where they fit on the SMs: narrow outputs (dsd)
# or narrow inputs (dds, whose lines are the input features), partial token tiles (2100), up to M = 8192.
PAST_2047_GRID = [Case(m, i, o, d, b, DTYPES[j % 2])
                  for j, (m, i, o, d, b) in enumerate((m, i, o, d, b)
                                                      for (m, i, o) in ((2100, 4096, 256), (2048, 256, 2048),
                                                                        (8192, 1024, 256), (2100, 1024, 1024))
                                                      for d in (0.1, 1.0) for b in (64, 128))]


@pytest.mark.cuda
@requires_kernels
@pytest.mark.parametrize("case", PAST_2047_GRID, ids=case_id)
def test_default_path_past_2047_rows_on_narrow_products(case):
    _check_products("default path", case, *_product_case(case, 7))


@pytest.mark.cuda
@requires_kernels
@pytest.mark.skipif(not (OPS is not None and HAS_GPU and torch.cuda.get_device_capability() == (9, 0)),
                    reason="the Hopper kernels run on sm_90 GPUs only")
def test_hopper_few_rows_with_many_empty_key_ranges():
    """Split CTAs whose key range holds no block of the tile's lines make an empty stage, without W tiles; the
    W-issuing producer warp must not wait for those stages' slots (a regression: when the consumers had passed
    such a stage before that warp reached it, it waited for the slot's next use, which needed its own loads, and
    the kernel hung on about a third of these patterns). Many random sparse patterns, each called a few times,
    in a fresh process with a time limit, so that a hang fails the test instead of stopping the suite."""
    code = """if True:
        import sys
        import torch
        import torch.nn.functional as F
        sys.path.insert(0, "tests")
        from test_kernels_cuda import OPS, assert_like_torch
        from pytorch_block_sparse_ng import BlockSparseMatrix, _ops, reference
        _ops.set_decode_max_rows(0)
        for seed in range(12):
            for block, out_features in ((128, 768), (64, 1536)):
                for m, density in ((1, 0.1), (100, 0.05)):
                    g = torch.Generator().manual_seed(seed)
                    w = BlockSparseMatrix.randn((out_features, 1024), density=density, block_shape=(block, block),
                                                dtype=torch.float32, generator=g).to("cuda")
                    index = w.indices()
                    data = w.data.detach().bfloat16()
                    dense_t = w.to_dense(data.float()).detach().bfloat16()
                    x = torch.randn(m, 1024, generator=g).cuda().bfloat16()
                    dy = torch.randn(m, out_features, generator=g).cuda().bfloat16()
                    bias = torch.randn(out_features, generator=g).cuda().bfloat16()
                    ref = reference.dsd(x.float(), data.float(), bias.float(), *index)
                    ref_dx = reference.dds(dy.float(), data.float(), *index)
                    for split in (8, 4, 2, 1):
                        _ops.set_hopper_few_rows_split(split)
                        for _ in range(3):
                            case = f"seed {seed}, block {block}, m {m}, split {split}"
                            assert_like_torch(f"dsd, {case}", OPS.dsd(x, data, bias, *index), ref,
                                              F.linear(x, dense_t, bias))
                            assert_like_torch(f"dds, {case}", OPS.dds(dy, data, *index), ref_dx, dy @ dense_t)
        torch.cuda.synchronize()
        print("ok")
    """
    try:
        _run_in_a_fresh_process(code, timeout=300)
    except subprocess.TimeoutExpired:
        pytest.fail("the few-rows dsd / dds did not finish within 300 s: a kernel hung")


@pytest.mark.cuda
@requires_kernels
@pytest.mark.parametrize("m, block, density, out_features, in_features", [
    (65, 128, 0.4, 1024, 4096), (200, 128, 0.4, 1024, 4096),  # few-rows dsd, split 2 / 2 ...
    (384, 128, 0.3, 1024, 4096),  # ... / 1
    (200, 64, 1.0, 4096, 4096), (256, 64, 0.4, 4096, 4096), (400, 64, 0.8, 4096, 4096),  # blocks of 64: 2 / 2 / 1
    (256, 64, 0.15, 4096, 4096), (700, 64, 0.2, 4096, 4096),  # ... the SM80 kernels, the 256-token kernel
    (96, 64, 0.5, 4096, 4096), (160, 64, 0.5, 4096, 4096), (200, 64, 0.3, 8192, 4096),  # below 256 rows: 2 / 2 / 1
    (384, 64, 0.5, 1024, 4096),  # tiles on an eighth to a quarter of the SMs (session 42): split 2
    (256, 64, 1.0, 1024, 4096), (128, 128, 0.5, 1024, 4096),  # few tiles, long lines (session 42): split 4
    (128, 64, 0.8, 1024, 4096),  # ... and below 256 rows at density >= 0.75 (session 43): split 4
    (128, 64, 1.0, 1024, 4096), (100, 128, 1.0, 512, 8192),  # fewer tiles, longer lines (session 44): split 8 ...
    (100, 64, 0.5, 8192, 512),  # ... in the dds of the backward
])
def test_few_rows_default_path_in_the_layer(m, block, density, out_features, in_features):
    """BlockSparseLinear at a few hundred tokens (the default path: on Hopper GPUs the few-rows dsd or, for blocks
    of 64, one of the others; the dds of the backward by its own rule), with a 3-D, non-contiguous input."""
    layer = BlockSparseLinear(in_features, out_features, density=density, block_shape=(block, block), device="cuda",
                              dtype=torch.bfloat16, generator=torch.Generator().manual_seed(8))
    _check_layer_on_strided_3d_input("BlockSparseLinear, few rows", layer, m)


HOPPER_GRID = list(GRID)  # blocks of 32 too (kernel_sm90_b32.cuh, kernel_sm90_sdd_b32.cuh)
HOPPER_GRID += [Case(m, 1024, 768, d, b, t) for m in (255, 256, 257, 513) for d in (0.05, 0.3) for b in (64, 128)
                for t in DTYPES]
# Lines (block rows / columns) of 64 come two per tile: odd counts leave one line in the last tile.
HOPPER_GRID += [Case(300, 4096, 3072 + 64, 0.5, 64, torch.bfloat16), Case(513, 320, 448, 0.5, 64, torch.bfloat16),
                Case(700, 448, 320, 1.0, 64, torch.float16)]
# Blocks of 128, 32 lines, 256 < M < 512: fewer CTAs than SMs, but enough tiles for the Hopper dsd (no split).
HOPPER_GRID += [Case(m, 1024, 4096, d, 128, t) for m in (300, 511) for d in (0.1, 1.0) for t in DTYPES]
# sdd: few chunks -> the reduction over M split across CTAs (uneven last split), and rows of 1..8+ blocks.
HOPPER_GRID += [Case(m, 768, 1024, d, b, torch.float16) for m in (4097, 20000) for d in (0.05, 0.2) for b in (64, 128)]


# Blocks of 32 (kernel_sm90_b32.cuh): 8 lines per tile, so line counts that leave 1-7 lines in the last tile, M
# from 1 (decode kernel off) over the 128-token tile's edges, a single block, and a wide one.
B32_CASES = [Case(m, i, o, d, 32, t) for m in (1, 65, 128, 129, 300) for (i, o) in ((160, 416), (416, 160))
             for d in (0.0, 0.1, 0.5, 1.0) for t in DTYPES]
B32_CASES += [Case(m, 32, 32, 1.0, 32, t) for m in (1, 200) for t in DTYPES]
B32_CASES += [Case(2048, 4096, 4096, d, 32, torch.bfloat16) for d in (0.1, 0.5)]
# The planned stages (session 27): 33 block columns (a second bitmap word holding one), lists longer than a batch
# of 32 stages, for the dsd and (swapped) the dds.
B32_CASES += [Case(300, i, o, d, 32, torch.bfloat16) for (i, o) in ((1056, 416), (416, 1056)) for d in (0.3, 1.0)]
# Two columns per stage (session 28): 65 block columns, i.e. a full batch of 32 two-column stages and a last stage
# of one column; at density 0.5 words of odd union counts.
B32_CASES += [Case(300, i, o, d, 32, torch.bfloat16) for (i, o) in ((2080, 416), (416, 2080)) for d in (0.5, 1.0)]
# Pair boxes (session 33): one block column of W, so that the dds read from W's blocks also finds a line's blocks
# adjacent in `data` (one box for two); and its swap, lines of one block each.
B32_CASES += [Case(300, i, o, 1.0, 32, torch.bfloat16) for (i, o) in ((32, 416), (416, 32))]


@pytest.mark.cuda
@requires_kernels
@pytest.mark.skipif(not (OPS is not None and HAS_GPU and torch.cuda.get_device_capability() == (9, 0)),
                    reason="the Hopper kernels run on sm_90 GPUs only")
# (block columns per stage, the dds on a transposed copy of W's blocks, pair boxes): every kernel variant the knobs
# reach. Two-column stages load one block per TMA box (pair boxes 0), or two where they can (3: both kinds of pairs,
# line-major W slots; 2: activation pairs only, column-major W slots; 1: W pairs only; the default takes 2 or 3 by
# density).
@pytest.mark.parametrize("columns, dds_copy, pair_boxes", ((1, 1, 0), (2, 1, 0), (2, 1, 3), (2, 1, 2), (2, 1, 1),
                                                           (1, 0, 0), (2, 0, 0), (2, 0, 3), (2, 0, 2), (2, 0, 1)),
                         ids=("cols1", "cols2", "cols2-pairs", "cols2-act_pairs", "cols2-w_pairs", "cols1-mn_dds",
                              "cols2-mn_dds", "cols2-pairs-mn_dds", "cols2-act_pairs-mn_dds", "cols2-w_pairs-mn_dds"))
@pytest.mark.parametrize("case", B32_CASES, ids=case_id)
def test_hopper_blocks_of_32(case, columns, dds_copy, pair_boxes):
    from pytorch_block_sparse_ng import _C, _ops

    if not _C.uses_hopper_kernels(torch.cuda.current_device(), case.block):
        pytest.skip("this build has no sm_90a kernels")
    tensors = _product_case(case, 3)
    with forced_knobs((_ops.set_hopper_min_rows, 1),
                      (_ops.set_decode_max_rows, 0),
                      (_ops.set_hopper_blocks_of_32, 1),  # at every size and density, not only where the rule takes it
                      (_ops.set_hopper_b32_columns, columns),  # one or two block columns per pipeline stage
                      (_ops.set_hopper_b32_dds_copy, dds_copy),  # the dds on W's blocks transposed, or on W's blocks
                      (_ops.set_hopper_b32_pair_boxes, pair_boxes)):
        _check_products("Hopper blocks of 32", case, *tensors)
        w, index, x, dy, bias, data = tensors
        y = OPS.dsd(x, data, bias, *index)
        assert torch.equal(OPS.dsd(x, data, bias, *index), y), "the same result on every call"


@pytest.mark.cuda
@requires_kernels
@pytest.mark.skipif(not (OPS is not None and HAS_GPU and torch.cuda.get_device_capability() == (9, 0)),
                    reason="the Hopper kernels run on sm_90 GPUs only")
@pytest.mark.parametrize("case", HOPPER_GRID, ids=case_id)
def test_hopper_path_at_every_m(case):
    """The Hopper kernels (256-token tiles, TMA zero-fill past M) with the M threshold lowered to 1."""
    from pytorch_block_sparse_ng import _C, _ops

    if not _C.uses_hopper_kernels(torch.cuda.current_device(), case.block):
        pytest.skip("this build has no sm_90a kernels")
    tensors = _product_case(case, 2)
    with forced_knobs((_ops.set_hopper_min_rows, 1),
                      (_ops.set_hopper_sdd_min_blocks_per_row, 0),  # sparse rows too (partial chunks)
                      (_ops.set_hopper_few_rows_split, 0),  # the 256-token dsd at every M too
                      (_ops.set_hopper_blocks_of_32, 1)):
        _check_products("Hopper path", case, *tensors)


def _b32_pair_mask():
    """11 block rows x 41 block columns whose rows, taken in order as pairs, cover the cases of the block-32
    Hopper sdd (kernel_sm90_sdd_b32.cuh): a full row beside an empty one (a union of 41 columns: chunks of 16, 16
    and 9; by column pairs the last is half past K), two disjoint rows (40), two equal rows (9: the second
    consumer gets one column), a row of 16 beside an empty one (one full chunk), two empty rows (with the bias: a
    CTA that only sums dy), and a row left alone."""
    mask = torch.zeros(11, 41, dtype=torch.bool)
    mask[0] = True
    mask[2, 0::2] = True
    mask[3, 1::2] = True
    mask[4, 3:12] = True
    mask[5, 3:12] = True
    mask[6, 5:21] = True
    mask[10, 7:30:3] = True
    return mask


@pytest.mark.cuda
@requires_kernels
@pytest.mark.skipif(not (OPS is not None and HAS_GPU and torch.cuda.get_device_capability() == (9, 0)),
                    reason="the Hopper kernels run on sm_90 GPUs only")
@pytest.mark.parametrize("m", [1, 100, 1000], ids=lambda m: f"m{m}")
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: str(t)[6:])
def test_hopper_sdd_blocks_of_32_pairs(m, dtype):
    """The block-32 Hopper sdd takes the rows in pairs of row_order (modes 0, 1 and 3) or in adjacent quads (mode 2:
    row order does not matter) and the union of their columns (single columns or column pairs; mode 3 reads them
    from a copy of x^T whose rows are padded to 8 tokens, so M = 1 and 100 test the padding) in chunks: every
    pairing of a pattern with full, empty, disjoint, equal and lone rows (the pairs in
    order, reversed, and two random permutations), with and without the bias sum, against the reference; four
    calls in a row, the last on another stream, each output landing in a freed NaN-filled block of its size
    (an unstored block cannot pass), bitwise equal from call to call."""
    from pytorch_block_sparse_ng import _C, _ops

    if not _C.uses_hopper_kernels(torch.cuda.current_device(), 32):
        pytest.skip("this build has no sm_90a kernels")
    block = 32
    mask = _b32_pair_mask()
    rows, cols = mask.shape
    w = BlockSparseMatrix.from_block_mask(mask, (block, block)).to("cuda")
    generator = torch.Generator().manual_seed(m)
    x = torch.randn(m, cols * block, generator=generator).cuda().to(dtype)
    dy = torch.randn(m, rows * block, generator=generator).cuda().to(dtype)
    bshape = (block, block)
    torch_dw = (dy.t() @ x).reshape(rows, block, cols, block).transpose(1, 2)[w.row_indices.long(),
                                                                              w.col_indices.long()]
    orders = [torch.arange(rows), torch.arange(rows - 1, -1, -1)]
    orders += [torch.randperm(rows, generator=generator) for _ in range(2)]
    with forced_knobs((_ops.set_hopper_min_rows, 1),
                      (_ops.set_hopper_blocks_of_32, 1),
                      (_ops.set_hopper_sdd_b32_mode, 0)):
        for mode, order in itertools.product((0, 1, 2, 3), orders):
            _ops.set_hopper_sdd_b32_mode(mode)
            index = list(w.indices())
            index[6] = order.to(device="cuda", dtype=torch.int32)  # row_order
            ref = reference.sdd(dy.float(), x.float(), *index, bshape)
            _check_sdd_calls(f"sdd, blocks of 32, mode {mode}, row order {order.tolist()}", dy, x, index, bshape,
                             w.data.shape, ref, torch_dw)


def _sdd_calls_on_two_streams(dy, x, index, block_shape, blocks_shape):
    """Four calls of the sdd and of the sdd with the bias sum, the last on another stream, each output landing
    in a freed NaN-filled block of its size (an item left unstored cannot pass as an old result); yields
    (dw, dw with the bias sum, bias gradient) per call."""
    def poisoned(fn):
        junk = [torch.full(blocks_shape, float("nan"), device="cuda", dtype=dy.dtype),
                torch.full((dy.shape[1],), float("nan"), device="cuda", dtype=dy.dtype)]
        del junk
        return fn()

    side = torch.cuda.Stream()
    for call in range(4):
        stream = side if call == 3 else torch.cuda.current_stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            dw = poisoned(lambda: OPS.sdd(dy, x, *index, block_shape))
            dw_fused, db = poisoned(lambda: OPS.sdd_with_bias_grad(dy, x, *index, block_shape))
        torch.cuda.current_stream().wait_stream(stream)
        yield dw, dw_fused, db


def _check_sdd_calls(case, dy, x, index, block_shape, blocks_shape, ref, torch_dw, bitwise=True):
    """_sdd_calls_on_two_streams' four calls against the reference (dW_b with and without the bias sum, the bias
    gradient), and with `bitwise` equal from call to call."""
    first = None
    for dw, dw_fused, db in _sdd_calls_on_two_streams(dy, x, index, block_shape, blocks_shape):
        assert_like_torch(case, dw, ref, torch_dw)
        assert_like_torch(f"{case}, with bias", dw_fused, ref, torch_dw)
        assert_like_torch(f"bias gradient, {case}", db, dy.float().sum(0), dy.sum(0))
        if first is None:
            first = (dw, dw_fused, db)
        if bitwise:
            for name, got, want in zip(("dw", "dw with bias", "bias gradient"), (dw, dw_fused, db), first):
                assert torch.equal(got, want), f"{name} differs between calls ({case})"


def _b128_sdd_case(density, empty_rows, m, n, k, dtype, seed):
    """A random block-128 pattern of an (n, k) weight with block (0, 0) kept and its last `empty_rows` block rows
    empty, x (m, k) and dy (m, n); returns (w, index, x, dy, block_shape, torch's dW_b in dtype, the reference)."""
    block = 128
    generator = torch.Generator().manual_seed(seed)
    rows, cols = n // block, k // block
    mask = torch.rand(rows, cols, generator=generator) < density
    mask[0, 0] = True
    mask[rows - empty_rows:] = False
    w = BlockSparseMatrix.from_block_mask(mask, (block, block)).to("cuda")
    index = w.indices()
    x = torch.randn(m, k, generator=generator).cuda().to(dtype)
    dy = torch.randn(m, n, generator=generator).cuda().to(dtype)
    bshape = (block, block)
    torch_dw = (dy.t() @ x).reshape(rows, block, cols, block).transpose(1, 2)[w.row_indices.long(),
                                                                              w.col_indices.long()]
    return w, index, x, dy, bshape, torch_dw, reference.sdd(dy.float(), x.float(), *index, bshape)


def _sdd_working_ctas(row_counts, chunk, with_bias):
    """The Hopper sdd's working CTAs for a pattern (kernel_sm90_sdd.cuh): a CTA per chunk of up to `chunk` of a
    row's blocks, and per row without blocks when it sums the bias."""
    return sum((c + chunk - 1) // chunk + (with_bias and c == 0) for c in row_counts)


@pytest.mark.cuda
@requires_kernels
@pytest.mark.skipif(not (OPS is not None and HAS_GPU and torch.cuda.get_device_capability() == (9, 0)),
                    reason="the Hopper kernels run on sm_90 GPUs only")
@pytest.mark.parametrize("density, empty_rows, m, n, k, dtype, pieces",
                         [(0.1, 0, 8192, 4096, 4096, torch.bfloat16, 2), (0.3, 2, 2100, 2048, 1024, torch.float16, 2),
                          (0.05, 5, 3000, 2048, 1024, torch.bfloat16, 2), (1.0, 0, 2100, 1024, 1024, torch.float16, 2),
                          (0.12, 1, 3100, 4096, 1024, torch.bfloat16, 3), (0.12, 0, 5200, 4096, 1024, torch.float16, 5),
                          (0.1, 0, 16384, 4096, 1024, torch.bfloat16, 6), (0.2, 0, 8192, 4096, 1024, torch.float16, 7)])
def test_hopper_sdd_split_pieces(density, empty_rows, m, n, k, dtype, pieces):
    """Blocks of 128 with fewer working CTAs than SMs and a split of M (forced by set_hopper_sdd_splits): in 2, the
    sdd sums the two pieces in the kernel (the piece that finishes an item last adds the other's fp32 partials; no
    zeroed workspace, no cast kernel); in 3 or more, into a zeroed fp32 workspace by TMA reduce-adds, then cast.
    Against the reference, with and without the bias sum, for rows without blocks (bias-only items) and pieces of
    uneven length; four calls in a row, the last on another stream, each output landing in a freed NaN-filled block
    of its size (a counter left non-zero would leave an item unstored); with 2 pieces bitwise equal from call to
    call, whichever piece finishes last (the reduce-adds of more pieces add in any order)."""
    from pytorch_block_sparse_ng import _ops

    w, index, x, dy, bshape, torch_dw, ref = _b128_sdd_case(density, empty_rows, m, n, k, dtype,
                                                            seed=int(density * 100) + empty_rows)
    with forced_knobs((_ops.set_hopper_sdd_splits, pieces)):
        _check_sdd_calls(f"sdd, split in {pieces} pieces", dy, x, index, bshape, w.data.shape, ref, torch_dw,
                         bitwise=pieces == 2)


@pytest.mark.cuda
@requires_kernels
@pytest.mark.skipif(not (OPS is not None and HAS_GPU and torch.cuda.get_device_capability() == (9, 0)),
                    reason="the Hopper kernels run on sm_90 GPUs only")
@pytest.mark.parametrize("density, empty_rows, m, n, k, dtype",
                         [(1.0, 0, 1, 1024, 1024, torch.bfloat16), (0.5, 2, 7, 2048, 1024, torch.float16),
                          (0.3, 3, 33, 2048, 2048, torch.bfloat16), (0.5, 1, 128, 1024, 3072, torch.float16),
                          (0.25, 0, 1000, 4096, 4096, torch.float16), (1.0, 0, 8200, 1024, 1024, torch.bfloat16),
                          (0.02, 0, 2100, 4096, 4096, torch.bfloat16), (0.0, 7, 300, 1024, 1024, torch.float16)],
                         ids=["m1-d1", "m7-empty2", "m33-empty3", "m128-empty1", "m1000-d0.25", "m8200-d1", "m2100-d0.02",
                              "m300-one-block"])
def test_hopper_sdd_one_block_ctas(density, empty_rows, m, n, k, dtype):
    """Blocks of 128, one CTA per block loaded by cp.async (forced by set_hopper_sdd_one_block_ctas): M = 1, 7, 33
    (only a last partial tile of 32 tokens), 128, 1000 and 8200 (a partial last tile after whole ones); rows
    without blocks (the bias-only CTAs), a single block (density 0 plus block (0, 0)), density 1. Against the
    reference, with and without the bias sum (a row's CTAs sum their parts of the tokens, fewer tiles than blocks
    at M = 1 and 7, and the last to finish adds the parts: a row counter left non-zero would leave a later call's
    sum unstored), four calls in a row, the last on another stream, each output landing in a freed NaN-filled block
    of its size (an unstored block cannot pass), bitwise equal from call to call."""
    from pytorch_block_sparse_ng import _ops

    w, index, x, dy, bshape, torch_dw, ref = _b128_sdd_case(density, empty_rows, m, n, k, dtype, seed=m + empty_rows)
    with forced_knobs((_ops.set_hopper_min_rows, 1), (_ops.set_hopper_sdd_one_block_ctas, 1)):
        _check_sdd_calls("sdd, one block per CTA", dy, x, index, bshape, w.data.shape, ref, torch_dw)


# The fewest 64-token steps of a Hopper sdd tail piece (kTailMinSteps in cuda/block_sparse/kernel_sm90_sdd.cuh).
SDD_TAIL_MIN_STEPS = 16


@pytest.mark.cuda
@requires_kernels
@pytest.mark.skipif(not (OPS is not None and HAS_GPU and torch.cuda.get_device_capability() == (9, 0)),
                    reason="the Hopper kernels run on sm_90 GPUs only")
@pytest.mark.parametrize("density, empty_rows, m, dtype", [(0.6, 0, 4097, torch.float16), (0.55, 0, 4097, torch.bfloat16),
                                                           (0.6, 3, 4097, torch.bfloat16), (0.4, 5, 4097, torch.float16),
                                                           (0.55, 0, 7169, torch.bfloat16), (0.55, 1, 5121, torch.float16),
                                                           (0.65, 5, 7169, torch.float16), (0.55, 3, 9217, torch.bfloat16)])
def test_hopper_sdd_tail_split(density, empty_rows, m, dtype):
    """Blocks of 128, more working CTAs than SMs, not a multiple of them: the sdd gives the last partial wave's
    items to tail pieces over M (fp32 partials summed by the piece that finishes last; on 132 SMs these cases
    make 2 to 9 pieces per item, with M = 4097 / 5121 / 7169 / 9217). Against the reference
    and against the sdd without the tail split, with and without the bias sum, also for rows without blocks
    (bias-only items, which come last), three times in a row and on two streams: the counters are kept per
    stream and left zeroed by the kernel, and a counter left non-zero would leave an item unstored; each output
    lands in a freed NaN-filled block of its size, so an unstored item cannot pass as an old result."""
    from pytorch_block_sparse_ng import _C

    block = 128
    generator = torch.Generator().manual_seed(block + empty_rows)
    rows, cols = 4096 // block, 4096 // block
    mask = torch.rand(rows, cols, generator=generator) < density
    mask[rows - empty_rows:] = False
    w = BlockSparseMatrix.from_block_mask(mask, (block, block)).to("cuda")
    counts = (w.row_offsets[1:] - w.row_offsets[:-1]).tolist()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for with_bias in (False, True):  # the kernel's rule: pieces <= sms / e, of >= SDD_TAIL_MIN_STEPS steps each
        q, e = divmod(_sdd_working_ctas(counts, 2, with_bias), sms)
        assert q >= 1 and e > 0 and min(sms // e, (m + 63) // 64 // SDD_TAIL_MIN_STEPS) >= 2, (q, e, sms)
    index = w.indices()
    x = torch.randn(m, 4096, generator=generator).cuda().to(dtype)
    dy = torch.randn(m, 4096, generator=generator).cuda().to(dtype)
    bshape = (block, block)
    torch_dw = (dy.t() @ x).reshape(rows, block, cols, block).transpose(1, 2)[w.row_indices.long(),
                                                                              w.col_indices.long()]
    ref = reference.sdd(dy.float(), x.float(), *index, bshape)
    with forced_knobs((_C.set_hopper_sdd_splits, 1),  # M unsplit, whatever the split rule would take
                      (_C.set_hopper_sdd_one_block_ctas, 0)):  # the TMA sdd, whose tail is split
        with forced_knobs((_C.set_hopper_sdd_tail_split, False)) as (previous,):
            untailed = OPS.sdd_with_bias_grad(dy, x, *index, bshape)
        assert previous  # on by default
        for dw, dw_fused, db in _sdd_calls_on_two_streams(dy, x, index, bshape, w.data.shape):
            assert_like_torch("sdd, tail split", dw, ref, torch_dw)
            assert_like_torch("sdd with bias, tail split", dw_fused, ref, torch_dw)
            assert_like_torch("bias gradient, tail split", db, dy.float().sum(0), dy.sum(0))
            # the same sums in another order: within a rounding of the untailed results
            for got, want in zip((dw_fused, db), untailed):
                torch.testing.assert_close(got.float(), want.float(), rtol=0,
                                           atol=2 * torch.finfo(dtype).eps * want.float().abs().max().item())


@pytest.mark.cuda
@requires_kernels
@pytest.mark.skipif(not (OPS is not None and HAS_GPU and torch.cuda.get_device_capability() == (9, 0)),
                    reason="the Hopper kernels run on sm_90 GPUs only")
@pytest.mark.parametrize("case", [Case(513, 448, 320, 0.3, 64, torch.bfloat16), Case(300, 1024, 768, 0.5, 64,
                                  torch.float16), Case(257, 640, 384, 0.5, 128, torch.bfloat16),
                                  # K = 4096: the tiles of the last 8 of 11 token tiles are handed out group-major
                                  # (the band: tile_of in kernel_sm90_ws.cuh), the first 3 token-tile major
                                  Case(2600, 4096, 1024, 0.3, 64, torch.bfloat16),
                                  Case(2600, 1024, 4096, 0.3, 128, torch.float16)], ids=case_id)
def test_hopper_results_do_not_depend_on_the_line_order_or_the_tile_schedule(case):
    """row_order / col_order only decide which lines share a tile (blocks of 64) or the tiles' order, the tile
    counter only which SM computes a tile, the pipeline depth only when tiles arrive: every permutation, both
    schedules and 3 or 4 stages give the same bits (each line's blocks are accumulated in the same order),
    including odd line counts."""
    from pytorch_block_sparse_ng import _ops

    w, index, x, dy, bias, data = _product_case(case, 3)
    with forced_knobs((_ops.set_hopper_min_rows, 1)):
        expected = (OPS.dsd(x, data, bias, *index), OPS.dds(dy, data, *index))
        assert_like_torch("dsd (pair order)", expected[0], reference.dsd(x.float(), data.float(), bias.float(), *index),
                          F.linear(x, w.to_dense(data.float()).detach().to(case.dtype), bias))
        generator = torch.Generator().manual_seed(5)
        for schedule, stages in (("counter", 4), ("round_robin", 4), ("counter", 3)):
            with forced_knobs((_ops.set_hopper_tile_schedule, schedule), (_ops.set_hopper_pipeline_stages, stages)):
                for row_order, col_order in ((torch.arange(w.grid[0]), torch.arange(w.grid[1])),
                                             (torch.randperm(w.grid[0], generator=generator),
                                              torch.randperm(w.grid[1], generator=generator)),
                                             (w.row_order.cpu(), w.col_order.cpu())):
                    permuted = (*index[:6], row_order.int().cuda(), col_order.int().cuda())
                    assert torch.equal(OPS.dsd(x, data, bias, *permuted), expected[0])
                    assert torch.equal(OPS.dds(dy, data, *permuted), expected[1])


@pytest.mark.cuda
@requires_kernels
@pytest.mark.skipif(not (HAS_GPU and torch.cuda.get_device_capability() == (9, 0)),
                    reason="the Hopper kernels run on sm_90 GPUs only")
@pytest.mark.parametrize("block", (64, 128))
def test_hopper_tile_counter_is_left_zeroed_for_the_next_launch(block):
    """In eager mode each stream keeps one tile counter that the kernel's last CTA zeroes again (no memset per
    call): back-to-back calls on one stream, calls alternating between two streams, and a captured graph (its
    own counter) replayed on a side stream while eager calls run on the other all give the first call's bits.
    A counter left non-zero would skip tiles; the outputs land in freed NaN-filled blocks of their size (the
    caching allocator hands those out next), so a skipped tile cannot pass as an old result."""
    from pytorch_block_sparse_ng import _ops

    case = Case(1000, 1024, 768, 0.5, block, torch.bfloat16)
    w, index, x, dy, bias, data = _product_case(case, 7)
    with forced_knobs((_ops.set_hopper_min_rows, 1)):
        expected = (OPS.dsd(x, data, bias, *index), OPS.dds(dy, data, *index))

        def poisoned_calls():
            junk = [torch.full_like(e, float("nan")) for e in expected]
            del junk
            return OPS.dsd(x, data, bias, *index), OPS.dds(dy, data, *index)

        def same_bits(outputs):
            torch.cuda.synchronize()
            return all(torch.equal(got, want) for got, want in zip(outputs, expected + expected))

        for _ in range(3):
            assert same_bits(poisoned_calls())
        side = torch.cuda.Stream()
        for _ in range(3):
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                on_side = poisoned_calls()
            on_main = poisoned_calls()
            torch.cuda.current_stream().wait_stream(side)
            assert same_bits(on_side + on_main)
        side.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            captured = (OPS.dsd(x, data, bias, *index), OPS.dds(dy, data, *index))
        for _ in range(3):
            for got in captured:
                got.fill_(float("nan"))
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                graph.replay()
            eager = poisoned_calls()
            torch.cuda.current_stream().wait_stream(side)
            assert same_bits(captured + eager)


@pytest.mark.cuda
@requires_kernels
@pytest.mark.parametrize("block", BLOCKS)
def test_training_step_replays_from_a_cuda_graph(block):
    """Forward and backward captured in one CUDA graph (no host sync, no index allocation; the Hopper kernels'
    tile counters are the graph's own) give the eager results on new inputs."""
    from pytorch_block_sparse_ng import _ops

    layer = BlockSparseLinear(512, 384, density=0.4, block_shape=(block, block), device="cuda", dtype=torch.bfloat16,
                              generator=torch.Generator().manual_seed(3))
    x = torch.randn(300, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(300, 384, device="cuda", dtype=torch.bfloat16)
    params = (x, layer.weight.data, layer.bias)

    def step():
        y = layer(x)
        return (y,) + torch.autograd.grad(y, params, dy)

    with forced_knobs((_ops.set_hopper_min_rows, 1)):  # the Hopper kernels at M = 300 where the GPU has them
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            step()  # warm-up outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            captured = step()
        generator = torch.Generator(device="cuda").manual_seed(11)
        for _ in range(2):
            with torch.no_grad():
                x.copy_(torch.randn(x.shape, device="cuda", generator=generator))
                dy.copy_(torch.randn(dy.shape, device="cuda", generator=generator))
            graph.replay()
            for name, got, want in zip(("y", "grad x", "grad blocks", "grad bias"), captured, step()):
                # sdd may split its reduction over CUDA atomics: not bitwise reproducible, one bf16 ulp apart
                scale = want.float().abs().max().item()
                torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=2 ** -7 * scale, msg=name)


# Each kind of self-resetting kernel counter (cuda/counters.h), the knobs that make a case take it, and the case
# (_b128_sdd_case's arguments).
GRAPH_COUNTER_PATHS = {
    "tile counter": ({"set_hopper_min_rows": 1, "set_hopper_few_rows_split": 0},
                     (0.5, 0, 1000, 1024, 768, torch.bfloat16)),
    "sdd split in 2 pieces": ({"set_hopper_sdd_splits": 2}, (0.3, 2, 2100, 2048, 1024, torch.float16)),
    "sdd one block per CTA": ({"set_hopper_min_rows": 1, "set_hopper_sdd_one_block_ctas": 1},
                              (0.5, 1, 128, 1024, 3072, torch.float16)),
    "sdd tail split": ({"set_hopper_sdd_splits": 1, "set_hopper_sdd_one_block_ctas": 0},
                       (0.6, 1, 4097, 4096, 4096, torch.bfloat16)),
}


@pytest.mark.cuda
@requires_kernels
@pytest.mark.skipif(not (OPS is not None and HAS_GPU and torch.cuda.get_device_capability() == (9, 0)),
                    reason="the Hopper kernels run on sm_90 GPUs only")
@pytest.mark.parametrize("path", list(GRAPH_COUNTER_PATHS))
def test_cuda_graphs_own_their_kernel_counters(path):
    """Under capture the kernels' self-resetting counters are the graph's own: zeroed once, not by a memset node at
    every replay, and given back to a pool when the graph is destroyed, for later graphs to take. dsd, dds and the
    sdd with the bias sum, captured: one graph replayed three times, two graphs replayed at once on two streams
    (counters shared between live graphs would race), then graphs captured after those were destroyed (taking
    their counters: one left non-zero would skip tiles or items). Every replay writes outputs first filled with NaN
    and matches the eager results."""
    import gc

    from pytorch_block_sparse_ng import _C

    knobs, (density, empty_rows, m, n, k, dtype) = GRAPH_COUNTER_PATHS[path]
    w, index, x, dy, bshape, _, _ = _b128_sdd_case(density, empty_rows, m, n, k, dtype, seed=m)
    if path == "sdd tail split":  # the kernel's rule (test_hopper_sdd_tail_split): a partial last wave to split
        counts = (w.row_offsets[1:] - w.row_offsets[:-1]).tolist()
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        q, e = divmod(_sdd_working_ctas(counts, 2, True), sms)
        assert q >= 1 and e > 0 and min(sms // e, (m + 63) // 64 // SDD_TAIL_MIN_STEPS) >= 2, (q, e, sms)
    data = w.data.detach().to(dtype)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(m)).cuda().to(dtype)
    names = ("dsd", "dds", "sdd", "bias gradient")

    def products():
        return (OPS.dsd(x, data, bias, *index), OPS.dds(dy, data, *index)) + OPS.sdd_with_bias_grad(
            dy, x, *index, bshape)

    with forced_knobs(*[(getattr(_C, name), value) for name, value in knobs.items()]):
        eager = products()
        streams = (torch.cuda.Stream(), torch.cuda.Stream())

        def capture():
            streams[0].wait_stream(torch.cuda.current_stream())
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=streams[0]):
                outputs = products()
            torch.cuda.current_stream().wait_stream(streams[0])
            return graph, outputs

        def replay_and_check(captured):
            for _, outputs in captured:
                for t in outputs:
                    t.fill_(float("nan"))
            for (graph, _), stream in zip(captured, streams):
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    graph.replay()
            for stream in streams[:len(captured)]:
                torch.cuda.current_stream().wait_stream(stream)
            for _, outputs in captured:
                for name, got, want in zip(names, outputs, eager):
                    torch.testing.assert_close(got.float(), want.float(), rtol=0, msg=f"{name} ({path})",
                                               atol=2 * torch.finfo(dtype).eps * want.float().abs().max().item())

        first = capture()
        for _ in range(3):
            replay_and_check([first])
        second = capture()
        for _ in range(3):
            replay_and_check([first, second])
        del first, second
        gc.collect()
        torch.cuda.synchronize()
        for _ in range(3):
            later = capture()
            replay_and_check([later])
            replay_and_check([later])
            del later
            gc.collect()
            torch.cuda.synchronize()


@pytest.mark.cuda
@requires_kernels
@pytest.mark.parametrize("m", (1, 129, 300))
def test_every_output_element_is_written(m):
    """Outputs are allocated uninitialised: fill a freed block of the output's size with NaN first (the
    caching allocator hands it to the next allocation of that size) and check that every element is written."""
    generator = torch.Generator().manual_seed(7)
    w = BlockSparseMatrix.randn((512, 384), density=0.3, block_shape=(64, 64), generator=generator).to("cuda")
    data = w.data.detach().half()
    index = w.indices()
    x = torch.randn(m, 384, generator=generator).cuda().half()
    dy = torch.randn(m, 512, generator=generator).cuda().half()

    def poisoned(shape, fn):
        junk = torch.full(shape, float("nan"), device="cuda", dtype=torch.float16)
        del junk
        return fn()

    y = poisoned((m, 512), lambda: OPS.dsd(x, data, None, *index))
    assert max_err(y, reference.dsd(x.float(), data.float(), None, *index)) < 0.05
    dx = poisoned((m, 384), lambda: OPS.dds(dy, data, *index))
    assert max_err(dx, reference.dds(dy.float(), data.float(), *index)) < 0.05
    dw = poisoned(tuple(data.shape), lambda: OPS.sdd(dy, x, *index, (64, 64)))
    assert max_err(dw, reference.sdd(dy.float(), x.float(), *index, (64, 64))) < 0.05 * max(1, m) ** 0.5
    from pytorch_block_sparse_ng import _ops

    with forced_knobs((_ops.set_hopper_sdd_min_blocks_per_row, 0)):  # the Hopper sdd (M >= 256), which writes the bias
        _, db = poisoned((512,), lambda: OPS.sdd_with_bias_grad(dy, x, *index, (64, 64)))
    assert max_err(db, dy.float().sum(0)) < 0.05 * max(1, m) ** 0.5


@pytest.mark.cuda
@requires_kernels
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: str(t)[6:])
@pytest.mark.parametrize("block", BLOCKS)
def test_block_sparse_linear_3d_noncontiguous_forward_backward(dtype, block):
    """Through BlockSparseLinear: a 3-D, non-contiguous input, forward and backward against PyTorch."""
    generator = torch.Generator().manual_seed(block)
    layer = BlockSparseLinear(512, 768, density=0.4, block_shape=(block, block), generator=generator).cuda()
    layer = layer.to(dtype)
    base = torch.randn(5, 768, 37, generator=generator).cuda().to(dtype)
    x = base.transpose(1, 2)[:, 3:, :512]  # (5, 34, 512), non-contiguous
    assert not x.is_contiguous()
    x.requires_grad_(True)
    assert backend.kernels_available()
    y = layer(x)
    grad = torch.randn(y.shape, generator=generator).cuda().to(dtype)
    y.backward(grad)

    dense = layer.weight.to_dense().detach()
    x32 = x.detach().float().requires_grad_(True)
    w32 = dense.float().requires_grad_(True)
    b32 = layer.bias.detach().float().requires_grad_(True)
    y32 = F.linear(x32, w32, b32)
    y32.backward(grad.float())
    xt = x.detach().clone().requires_grad_(True)
    wt = dense.clone().requires_grad_(True)
    bt = layer.bias.detach().clone().requires_grad_(True)
    yt = F.linear(xt, wt, bt)
    yt.backward(grad)

    assert y.shape == (5, 34, 768)
    assert_like_torch("forward", y, y32, yt)
    assert_like_torch("grad x", x.grad, x32.grad, xt.grad)
    w = layer.weight
    kept = (w.row_indices.long(), w.col_indices.long())

    def blocks_of(dense_grad):
        return dense_grad.reshape(w.grid[0], block, w.grid[1], block).transpose(1, 2)[kept]

    assert_like_torch("grad blocks", w.data.grad, blocks_of(w32.grad), blocks_of(wt.grad))
    assert_like_torch("grad bias", layer.bias.grad, b32.grad, bt.grad)


@pytest.mark.cuda
@requires_kernels
@pytest.mark.parametrize("shape", ((300, 512), (3, 100, 512)), ids=("2d", "3d"))
@pytest.mark.parametrize("wants, with_bias", [("all", True), ("x", True), ("weight", True), ("bias", True),
                                              ("all", False), ("x", False), ("weight", False)])
@pytest.mark.parametrize("block", BLOCKS)
def test_eager_autograd_node_matches_the_python_function(block, wants, with_bias, shape):
    """In eager mode the layer's backward is the extension's C++ autograd node (_C.linear); it gives the
    gradients the Python Function gives over the same kernels, for every subset of inputs that want one, and
    none to the others."""
    from pytorch_block_sparse_ng import _ops
    from pytorch_block_sparse_ng.functional import BlockSparseLinearFunction

    generator = torch.Generator().manual_seed(block + len(shape))
    layer = BlockSparseLinear(512, 384, bias=with_bias, density=0.3, block_shape=(block, block),
                              generator=generator).cuda().to(torch.bfloat16)
    x = torch.randn(shape, generator=generator).cuda().to(torch.bfloat16)
    dy = torch.randn(*shape[:-1], 384, generator=generator).cuda().to(torch.bfloat16)
    data, bias = layer.weight.data, layer.bias
    x.requires_grad_(wants in ("all", "x"))
    data.requires_grad_(wants in ("all", "weight"))
    if bias is not None:
        bias.requires_grad_(wants in ("all", "bias"))
    inputs = [t for t in (x, data, bias) if t is not None and t.requires_grad]
    with forced_knobs((_ops.set_hopper_min_rows, 1)):  # the Hopper kernels at these M where the GPU has them
        y = layer(x)
        assert "LinearFunction" in y.grad_fn.name() or "LinearFunction" in y.grad_fn.next_functions[0][0].name()
        got = torch.autograd.grad(y, inputs, dy)
        y_python = BlockSparseLinearFunction.apply(x.reshape(-1, 512), data, bias, *layer.weight.indices())
        want = torch.autograd.grad(y_python, inputs, dy.reshape(-1, 384))
    torch.testing.assert_close(y.reshape(-1, 384), y_python, rtol=0, atol=0)
    for g, w in zip(got, want):
        # the sdd may split its reduction over atomics: not bitwise reproducible
        torch.testing.assert_close(g.reshape(w.shape).float(), w.float(), rtol=0,
                                   atol=2 ** -7 * w.float().abs().max().item())
    for t in (x, data, bias):
        if t is not None:
            t.requires_grad_(False)
    assert data.grad is None and x.grad is None


@pytest.mark.cuda
@requires_kernels
@pytest.mark.parametrize("block", BLOCKS)
def test_backward_on_two_streams_matches_one_stream(block):
    """The eager backward runs the dds on a second stream beside the sdd (_ops.set_backward_overlap): on a user
    stream, over repeated steps whose gradients are freed and reallocated, it gives the one-stream gradients."""
    from pytorch_block_sparse_ng import _ops

    generator = torch.Generator().manual_seed(block)
    layer = BlockSparseLinear(512, 384, density=0.4, block_shape=(block, block),
                              generator=generator).cuda().to(torch.bfloat16)
    x = torch.randn(300, 512, generator=generator).cuda().to(torch.bfloat16).requires_grad_(True)
    dy = torch.randn(300, 384, generator=generator).cuda().to(torch.bfloat16)
    params = (x, layer.weight.data, layer.bias)

    def grads(overlap):
        with forced_knobs((_ops.set_backward_overlap, overlap)):
            out = []
            for _ in range(3):
                got = torch.autograd.grad(layer(x), params, dy)
                out = [g.float() for g in got]  # the previous step's gradients are freed here
                junk = torch.full((300, 512), float("nan"), device="cuda", dtype=torch.bfloat16)  # reuses memory
                del junk
            return out

    with forced_knobs((_ops.set_hopper_min_rows, 1)):  # the Hopper kernels at M = 300 where the GPU has them
        user = torch.cuda.Stream()
        user.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(user):
            one, two = grads(False), grads(True)
        torch.cuda.current_stream().wait_stream(user)
    for name, g1, g2 in zip(("grad x", "grad blocks", "grad bias"), one, two):
        # the sdd may split its reduction over atomics: not bitwise reproducible
        torch.testing.assert_close(g2, g1, rtol=0, atol=2 ** -7 * g1.abs().max().item(), msg=name)
    assert _ops.set_backward_overlap(True) is True  # the default, restored


# Paths of the chain test below: (rows M, knobs), each making every product of the chain take one kind of kernel.
PROGRAMMATIC_CHAIN_PATHS = {
    "decode": (16, {}),
    "sm80 kernels": (200, {"set_hopper_few_rows_split": 0}),
    "few rows split 2": (200, {"set_hopper_few_rows_split": 2}),
    "few rows split 4": (200, {"set_hopper_few_rows_split": 4}),
    "few rows split 8": (200, {"set_hopper_few_rows_split": 8}),
    "256-token tiles": (700, {"set_hopper_min_rows": 1, "set_hopper_few_rows_split": 0}),
}


@pytest.mark.cuda
@requires_kernels
@pytest.mark.parametrize("path", list(PROGRAMMATIC_CHAIN_PATHS))
@pytest.mark.parametrize("block", BLOCKS)
def test_programmatic_launch_chain_matches_serial_launches(block, path):
    """Programmatic dependent launch (_ops.set_programmatic_launch, grid_dependency.cuh) lets each kernel start
    while the one before it finishes; each must wait for it before touching global memory. A chain of six
    layers, each reading the output the kernel before it has just written (and the backward writing buffers that
    earlier kernels read), eagerly and replayed from a CUDA graph, gives the results of serial launches: the
    forward bit for bit, the gradients within the sdd's atomics (one bf16 ulp). A kernel that read early would
    see its input half written."""
    from pytorch_block_sparse_ng import _ops

    m, knobs = PROGRAMMATIC_CHAIN_PATHS[path]
    generator = torch.Generator().manual_seed(block + m)
    layers = torch.nn.Sequential(*[BlockSparseLinear(512, 512, density=0.5, block_shape=(block, block),
                                                     generator=generator) for _ in range(6)]).cuda().to(torch.bfloat16)
    x = torch.randn(m, 512, generator=generator).cuda().to(torch.bfloat16).requires_grad_(True)
    dy = torch.randn(m, 512, generator=generator).cuda().to(torch.bfloat16)
    params = [x] + [p for layer in layers for p in (layer.weight.data, layer.bias)]

    def step():
        y = layers(x)
        return [y] + list(torch.autograd.grad(y, params, dy))

    with forced_knobs(*[(getattr(_ops, name), value) for name, value in knobs.items()],
                      (_ops.set_programmatic_launch, False)):
        # Everything on one side stream: the capture's stream, where the leaves' gradient accumulation must run too.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            serial = [t.float() for t in step()]
            _ops.set_programmatic_launch(True)
            eager = [[t.float() for t in step()] for _ in range(3)]
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            captured = step()
        with torch.cuda.stream(stream):
            graph.replay()
            graph.replay()
            replayed = [t.float() for t in captured]
        torch.cuda.current_stream().wait_stream(stream)
    for run in eager + [replayed]:
        assert torch.equal(run[0], serial[0]), "forward output differs from serial launches"
        for i, (got, want) in enumerate(zip(run[1:], serial[1:])):
            torch.testing.assert_close(got, want, rtol=0, atol=2 ** -7 * want.abs().max().item(), msg=f"grad {i}")


@pytest.mark.cuda
@requires_kernels
def test_eager_autograd_node_refuses_double_backward():
    layer = BlockSparseLinear(256, 128, density=0.5, block_shape=(64, 64)).cuda().half()
    x = torch.randn(300, 256, device="cuda", dtype=torch.float16, requires_grad=True)
    y = layer(x)
    with pytest.raises((ValueError, RuntimeError), match="double backward"):
        torch.autograd.grad(y.sum(), x, create_graph=True)


@pytest.mark.cuda
@requires_kernels
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: str(t)[6:])
def test_opcheck(dtype):
    from pytorch_block_sparse_ng import _ops

    generator = torch.Generator().manual_seed(3)
    w = BlockSparseMatrix.randn((256, 192), density=0.5, block_shape=(64, 64), generator=generator).to("cuda")
    data = w.data.detach().to(dtype)
    x = torch.randn(70, 192, generator=generator).cuda().to(dtype)
    dy = torch.randn(70, 256, generator=generator).cuda().to(dtype)
    bias = torch.randn(256, generator=generator).cuda().to(dtype)
    index = w.indices()
    torch.library.opcheck(_ops._dsd, (x, data, bias, *index))
    torch.library.opcheck(_ops._dsd, (x, data, None, *index))
    torch.library.opcheck(_ops._dds, (dy, data, *index))
    torch.library.opcheck(_ops._sdd, (dy, x, *index, [64, 64]))
    torch.library.opcheck(_ops._sdd_with_bias_grad, (dy, x, *index, [64, 64]))
    for wants in ((True, True, True), (True, True, False), (False, True, True), (True, False, False),
                  (False, False, True)):
        torch.library.opcheck(_ops._linear_grads, (dy, x, data, *index, *wants))
    with forced_knobs((_ops.set_hopper_min_rows, 1)):  # the Hopper sdd where the GPU has it: the bias sum is fused
        torch.library.opcheck(_ops._sdd_with_bias_grad, (dy, x, *index, [64, 64]))


@pytest.mark.cuda
@requires_kernels
def test_torch_compile_fullgraph_forward_and_backward():
    """torch.compile(fullgraph=True) traces BlockSparseLinear through the custom ops, forward and backward."""
    torch._dynamo.reset()
    generator = torch.Generator().manual_seed(5)
    layer = BlockSparseLinear(256, 384, density=0.5, block_shape=(64, 64), generator=generator).cuda().half()
    x = torch.randn(2, 33, 256, generator=generator).cuda().half()
    expected = layer(x)
    expected.float().square().sum().backward()
    grads = [p.grad.clone() for p in (layer.weight.data, layer.bias)]
    layer.zero_grad(set_to_none=True)
    compiled = torch.compile(layer, fullgraph=True)
    y = compiled(x)
    y.float().square().sum().backward()
    torch.testing.assert_close(y, expected, rtol=1e-2, atol=1e-2)
    for got, want in zip((layer.weight.data.grad, layer.bias.grad), grads):
        torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)


def _run_in_a_fresh_process(code, timeout=600):
    """Runs `code` (which prints "ok" last) in a new Python process from the repository root."""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


@pytest.mark.cuda
@requires_kernels
@pytest.mark.skipif(not (OPS is not None and HAS_GPU and torch.cuda.get_device_capability() == (9, 0)),
                    reason="the Hopper kernels run on sm_90 GPUs only")
def test_few_rows_clusters_first_launched_inside_graph_capture():
    """The few-rows kernels with a split ask once per process how many of their clusters are resident at once
    (cudaOccupancyMaxActiveClusters) before their first launch: that first launch may be inside a CUDA graph
    capture, which the query must not break. Fresh process, so that nothing is cached."""
    code = """if True:
        import sys
        import torch
        sys.path.insert(0, "tests")
        from test_kernels_cuda import OPS, assert_like_torch
        from pytorch_block_sparse_ng import BlockSparseMatrix, _ops, reference
        w = BlockSparseMatrix.randn((1024, 4096), density=1.0, block_shape=(64, 64), dtype=torch.float32,
                                    generator=torch.Generator().manual_seed(3)).to("cuda")
        index, data = w.indices(), w.data.detach().bfloat16()
        dense_t = w.to_dense(data.float()).detach().bfloat16()
        x = torch.randn(256, 4096, device="cuda").bfloat16()
        for split in (4, 2):
            _ops.set_hopper_few_rows_split(split)
            graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.graph(graph, stream=stream):
                y = OPS.dsd(x, data, None, *index)
            graph.replay()
            torch.cuda.synchronize()
            assert_like_torch(f"split {split}, first launched in a capture", y,
                              reference.dsd(x.float(), data.float(), None, *index), x @ dense_t.t())
        print("ok")
    """
    _run_in_a_fresh_process(code, timeout=300)


@pytest.mark.cuda
@requires_kernels
def test_torch_compile_fullgraph_as_the_first_call_in_a_process():
    """A model compiled before any eager call: the extension is loaded at import, not traced (a regression: its
    lazy loading under torch.compile broke the graph)."""
    code = """if True:
        import torch
        from pytorch_block_sparse_ng import BlockSparseLinear
        layer = BlockSparseLinear(512, 256, density=0.5, block_shape=(64, 64)).cuda().half()
        x = torch.randn(300, 512, device="cuda", dtype=torch.float16, requires_grad=True)
        torch.compile(layer, fullgraph=True)(x).float().square().sum().backward()
        assert x.grad is not None and layer.weight.data.grad is not None
        print("ok")
    """
    _run_in_a_fresh_process(code)


@pytest.mark.cuda
@requires_kernels
def test_products_on_threads_that_made_no_cuda_call_yet():
    """The Hopper kernels' tensor maps are encoded by the driver API, which binds no context: a thread that had
    made no CUDA runtime call (a fresh thread; the autograd engine's device thread at the first backward of a
    process) failed with "kernel launch failed: invalid argument" (a regression). In a fresh process: the sdd
    (blocks of 64, no runtime call before its encode) in a new thread against the main thread's, then a first
    backward on one stream against the reference."""
    code = """if True:
        import threading
        import torch
        from pytorch_block_sparse_ng import BlockSparseLinear, BlockSparseMatrix, _C, _ops, reference
        torch.manual_seed(0)
        w = BlockSparseMatrix.randn((1024, 1024), density=0.5, block_shape=(64, 64), dtype=torch.bfloat16,
                                    device="cuda")
        x = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
        index = list(w.indices())
        expected = _C.sdd(dy, x, *index, [64, 64], True)  # main thread; its output sizes stay cached
        got = {}
        thread = threading.Thread(target=lambda: got.update(sdd=_C.sdd(dy, x, *index, [64, 64], True)))
        thread.start()
        thread.join()
        torch.testing.assert_close(got["sdd"][0], expected[0], rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(got["sdd"][1], expected[1], rtol=1e-2, atol=1e-2)
        _ops.set_backward_overlap(False)
        layer = BlockSparseLinear(4096, 4096, density=0.1, block_shape=(64, 64)).cuda().to(torch.bfloat16)
        xs = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        grads = torch.autograd.grad(layer(xs).float().sum(), [xs, layer.weight.data])
        data = layer.weight.data.detach()
        ones = torch.ones(8192, 4096, device="cuda")
        want_x = reference.dds(ones, data.float(), *layer.weight.indices())
        torch.testing.assert_close(grads[0].float(), want_x, rtol=2e-2, atol=2e-2)
        print("ok")
    """
    _run_in_a_fresh_process(code)


@pytest.mark.cuda
@requires_kernels
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_torch_compile_backward_takes_both_products_in_one_op(bias):
    """With grads for x and the blocks, the traced backward calls linear_grads (dds and sdd on two streams, as the
    eager node) and matches the eager gradients; with the overlap off, too."""
    from pytorch_block_sparse_ng import _ops

    torch._dynamo.reset()
    generator = torch.Generator().manual_seed(6)
    layer = BlockSparseLinear(512, 768, bias=bias, density=0.5, block_shape=(64, 64),
                              generator=generator).cuda().to(torch.bfloat16)
    x = torch.randn(2, 300, 512, generator=generator).cuda().to(torch.bfloat16).requires_grad_(True)
    dy = torch.randn(2, 300, 768, generator=generator).cuda().to(torch.bfloat16)
    params = [p for p in (layer.weight.data, layer.bias) if p is not None]
    expected = torch.autograd.grad(layer(x), [x, *params], dy)
    compiled = torch.compile(layer, fullgraph=True)
    for overlap in (True, False):
        with forced_knobs((_ops.set_backward_overlap, overlap)):
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                got = torch.autograd.grad(compiled(x), [x, *params], dy)
        assert any(e.key == "pytorch_block_sparse_ng::linear_grads" for e in prof.key_averages())
        for name, g, e in zip(("x", "blocks", "bias"), got, expected):
            torch.testing.assert_close(g, e, rtol=2e-2, atol=2e-2, msg=lambda m: f"grad of {name}: {m}")


@pytest.mark.cuda
@requires_kernels
def test_empty_and_zero_row_cases():
    generator = torch.Generator().manual_seed(11)
    w = BlockSparseMatrix.randn((256, 256), density=0.0, block_shape=(32, 32), generator=generator).to("cuda")
    data = w.data.detach().half()
    bias = torch.randn(256, generator=generator).cuda().half()
    x = torch.randn(9, 256, generator=generator).cuda().half()
    assert torch.equal(OPS.dsd(x, data, bias, *w.indices()), bias.expand(9, 256))
    assert torch.equal(OPS.dds(torch.randn(9, 256).cuda().half(), data, *w.indices()), torch.zeros(9, 256).cuda().half())
    assert OPS.sdd(x, x, *w.indices(), (32, 32)).shape == (0, 32, 32)
    w = BlockSparseMatrix.randn((256, 256), density=0.5, block_shape=(32, 32), generator=generator).to("cuda")
    empty = torch.zeros(0, 256, device="cuda", dtype=torch.float16)
    assert OPS.dsd(empty, w.data.detach().half(), None, *w.indices()).shape == (0, 256)
    dw = OPS.sdd(empty, empty, *w.indices(), (32, 32))
    assert dw.shape == w.data.shape and torch.equal(dw, torch.zeros_like(dw, dtype=torch.float16))


# ------------------------------------------------------------------------------------------------ argument checks
# These need the built extension but no GPU: the checks run before any CUDA call.

def _cpu_problem(dtype=torch.float16, block=32):
    w = BlockSparseMatrix.randn((128, 96), density=0.5, block_shape=(block, block), dtype=dtype,
                                generator=torch.Generator().manual_seed(0))
    x = torch.randn(5, 96, dtype=dtype)
    return w, x


@requires_extension
def test_cpu_tensor_is_refused_with_its_name():
    from pytorch_block_sparse_ng import _C

    w, x = _cpu_problem()
    with pytest.raises(ValueError, match=r"_C\.dsd: x must be a CUDA tensor, got a tensor on cpu"):
        _C.dsd(x, w.data.detach(), None, *w.indices())
    with pytest.raises(ValueError, match=r"_C\.dds: dy must be a CUDA tensor"):
        _C.dds(torch.randn(5, 128, dtype=torch.float16), w.data.detach(), *w.indices())
    with pytest.raises(ValueError, match=r"_C\.sdd: dy must be a CUDA tensor"):
        _C.sdd(torch.randn(5, 128, dtype=torch.float16), x, *w.indices(), [32, 32])
    dy = torch.randn(5, 128, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"_C\.linear_backward: dy must be a CUDA tensor, got a tensor on cpu"):
        _C.linear_backward(dy, x, w.data.detach(), list(w.indices()), True, True, False)
    with pytest.raises(ValueError, match=r"_C\.linear_backward: index must hold the 8 index tensors .* got 7"):
        _C.linear_backward(dy, x, w.data.detach(), list(w.indices())[:7], True, True, False)


@requires_extension
def test_float32_and_mixed_dtypes_are_refused():
    from pytorch_block_sparse_ng import _C

    if not HAS_GPU:
        pytest.skip("dtype checks come after the device check; needs tensors on a GPU")
    w, x = _cpu_problem()
    w = w.to("cuda")
    with pytest.raises(TypeError, match=r"x\.dtype=Float must be float16 or bfloat16"):
        _C.dsd(x.float().cuda(), w.data.detach().float(), None, *w.indices())
    with pytest.raises(TypeError, match=r"data\.dtype=BFloat16 must equal x\.dtype=Half"):
        _C.dsd(x.cuda(), w.data.detach().bfloat16(), None, *w.indices())


@requires_extension
@pytest.mark.skipif(not HAS_GPU, reason="shape checks come after the device check; needs a GPU")
def test_shape_and_index_errors_name_the_argument():
    from pytorch_block_sparse_ng import _C

    w, x = _cpu_problem()
    w, x = w.to("cuda"), x.cuda()
    data, index = w.data.detach(), list(w.indices())
    with pytest.raises(ValueError, match=r"x\.shape=\(5, 64\) must be \(M, in_features=96\)"):
        _C.dsd(x[:, :64].contiguous(), data, None, *index)
    with pytest.raises(ValueError, match=r"x must be contiguous"):
        _C.dsd(torch.randn(96, 5, device="cuda", dtype=torch.float16).t(), data, None, *index)
    with pytest.raises(ValueError, match=r"bias\.shape=\(96,\) must be \(out_features=128,\)"):
        _C.dsd(x, data, torch.zeros(96, device="cuda", dtype=torch.float16), *index)
    bad = list(index)
    bad[1] = bad[1].long()
    with pytest.raises(TypeError, match=r"col_indices\.dtype=Long must be int32"):
        _C.dsd(x, data, None, *bad)
    bad = list(index)
    bad[5] = bad[5][:-1]
    with pytest.raises(ValueError, match=r"perm_t has \d+ entries but must have \d+"):
        _C.dds(torch.randn(5, 128, device="cuda", dtype=torch.float16), data, *bad)
    bad = list(index)
    bad[6] = bad[6][1:]
    with pytest.raises(ValueError, match=r"row_order has 3 entries but must have 4 \(one per block row\)"):
        _C.dsd(x, data, None, *bad)
    with pytest.raises(ValueError, match=r"block_shape=\(32, 16\) is not supported"):
        _C.sdd(torch.randn(5, 128, device="cuda", dtype=torch.float16), x, *index, [32, 16])
    with pytest.raises(ValueError, match=r"must have the same number of rows"):
        _C.sdd(torch.randn(6, 128, device="cuda", dtype=torch.float16), x, *index, [32, 32])


@requires_extension
def test_unsupported_cases_fall_back_to_the_reference():
    w, x = _cpu_problem(dtype=torch.float32)
    assert not OPS.supports(x, w.data)  # CPU tensors
    if HAS_GPU:
        w16, x16 = _cpu_problem(block=16)
        assert not OPS.supports(x16.cuda(), w16.data.cuda())  # block 16 has no kernel
        assert not OPS.supports(x.cuda(), w.data.cuda())  # fp32


@requires_extension
def test_build_record_is_quoted():
    from pytorch_block_sparse_ng import _C, _ops

    text = _ops.describe_build()
    assert "archs" in text and "torch" in text, text
    assert _C.BUILD_ARCHS != "unknown"


@requires_extension
def test_forced_knobs_restores_every_knob_even_when_the_block_or_a_setter_raises():
    from pytorch_block_sparse_ng import _ops

    rows, split = _ops.set_hopper_min_rows(300), _ops.set_hopper_few_rows_split(2)
    try:
        with forced_knobs((_ops.set_hopper_min_rows, 7), (_ops.set_hopper_few_rows_split, 8)) as previous:
            assert previous == (300, 2)
            assert _ops.set_hopper_min_rows(7) == 7 and _ops.set_hopper_few_rows_split(8) == 8
            _ops.set_hopper_few_rows_split(4)  # changed inside the block: still restored
        assert _ops.set_hopper_min_rows(300) == 300 and _ops.set_hopper_few_rows_split(2) == 2
        with pytest.raises(KeyError):
            with forced_knobs((_ops.set_hopper_min_rows, 9)):
                raise KeyError("the block fails")
        assert _ops.set_hopper_min_rows(300) == 300
        with pytest.raises(ValueError, match="split=3"):
            with forced_knobs((_ops.set_hopper_min_rows, 11), (_ops.set_hopper_few_rows_split, 3)):
                pass
        assert _ops.set_hopper_min_rows(300) == 300 and _ops.set_hopper_few_rows_split(2) == 2
    finally:
        _ops.set_hopper_min_rows(rows)
        _ops.set_hopper_few_rows_split(split)


@requires_extension
def test_hopper_knobs_check_their_argument_and_return_the_previous_value():
    from pytorch_block_sparse_ng import _ops

    previous = _ops.set_hopper_min_rows(512)
    assert _ops.set_hopper_min_rows(previous) == 512
    previous = _ops.set_hopper_sdd_min_blocks_per_row(5)
    assert _ops.set_hopper_sdd_min_blocks_per_row(previous) == 5
    previous = _ops.set_hopper_tile_schedule("round_robin")
    assert previous == "auto"
    assert _ops.set_hopper_tile_schedule(previous) == "round_robin"
    with pytest.raises(ValueError, match="schedule='lifo' must be one of"):
        _ops.set_hopper_tile_schedule("lifo")
    with pytest.raises(ValueError, match="rows=0 must be >= 1"):
        _ops.set_hopper_min_rows(0)
    with pytest.raises(ValueError, match="blocks=-1 must be >= 0"):
        _ops.set_hopper_sdd_min_blocks_per_row(-1)
    previous = _ops.set_hopper_pipeline_stages(3)
    assert _ops.set_hopper_pipeline_stages(previous) == 3
    with pytest.raises(ValueError, match="stages=5 must be 3 or 4"):
        _ops.set_hopper_pipeline_stages(5)
    assert _ops.set_hopper_sdd_tail_split(False) is True
    assert _ops.set_hopper_sdd_tail_split(True) is False
    assert _ops.set_decode_max_rows(0) == 64
    assert _ops.set_decode_max_rows(64) == 0
    with pytest.raises(ValueError, match=r"rows=65 must be in \[0, 64\]"):
        _ops.set_decode_max_rows(65)
    assert _ops.set_backward_overlap(False) is True
    assert _ops.set_backward_overlap(True) is False
    assert _ops.set_programmatic_launch(False) is True
    assert _ops.set_programmatic_launch(True) is False
    assert _ops.set_hopper_few_rows_split(2) == -1
    assert _ops.set_hopper_few_rows_split(-1) == 2
    for split in (3, 5):
        with pytest.raises(ValueError, match=rf"split={split} must be -1 \(auto\), 0 \(off\), 1, 2, 4 or 8"):
            _ops.set_hopper_few_rows_split(split)
    assert _ops.set_hopper_blocks_of_32(1) == -1
    assert _ops.set_hopper_blocks_of_32(-1) == 1
    with pytest.raises(ValueError, match=r"mode=2 must be -1 \(auto\), 0 \(off\) or 1"):
        _ops.set_hopper_blocks_of_32(2)
    assert _ops.set_hopper_b32_columns(2) == -1
    assert _ops.set_hopper_b32_columns(-1) == 2
    with pytest.raises(ValueError, match=r"columns=3 must be -1 \(auto\), 1 or 2"):
        _ops.set_hopper_b32_columns(3)
    assert _ops.set_hopper_b32_dds_copy(0) == -1
    assert _ops.set_hopper_b32_dds_copy(-1) == 0
    assert _ops.set_hopper_b32_pair_boxes(3) == -1
    assert _ops.set_hopper_b32_pair_boxes(-1) == 3
    with pytest.raises(ValueError, match=r"bits=4 must be -1 \(auto\) or 0-3 \(1: a line's two W blocks in one"):
        _ops.set_hopper_b32_pair_boxes(4)
    with pytest.raises(ValueError, match=r"mode=2 must be -1 \(auto\), 0 \(off\) or 1 \(always\)"):
        _ops.set_hopper_b32_dds_copy(2)
    assert _ops.set_hopper_sdd_b32_mode(2) == -1
    assert _ops.set_hopper_sdd_b32_mode(-1) == 2
    with pytest.raises(ValueError, match=r"mode=4 must be -1 \(auto\), 0 \(row pairs x columns\)"):
        _ops.set_hopper_sdd_b32_mode(4)
    assert _ops.set_hopper_sdd_splits(3) == -1
    assert _ops.set_hopper_sdd_splits(-1) == 3
    with pytest.raises(ValueError, match=r"splits=0 must be -1 \(auto\) or 1-64"):
        _ops.set_hopper_sdd_splits(0)
    assert _ops.set_hopper_sdd_one_block_ctas(0) == -1
    assert _ops.set_hopper_sdd_one_block_ctas(-1) == 0
    with pytest.raises(ValueError, match=r"mode=2 must be -1 \(auto\), 0 \(off\) or 1 \(always\)"):
        _ops.set_hopper_sdd_one_block_ctas(2)
