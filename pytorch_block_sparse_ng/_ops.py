"""The CUDA kernels as torch.library custom ops: the only importer of the compiled extension ``_C``.

Ops (namespace ``pytorch_block_sparse_ng``), each with a fake (meta) implementation so that ``torch.compile``
traces them without graph breaks; index tensors (``*index``) are in ``layout.INDEX_NAMES`` order followed by
the ``layout.ORDER_NAMES`` schedules (``row_order``, ``col_order``: the order of the lines the Hopper dsd / dds
pair in a tile; the results do not depend on it):

- ``dsd(x (M, K), data [nnz, B, B], bias (N,) or None, *index) -> y (M, N)``       y = x Wᵀ + bias
- ``dds(dy (M, N), data, *index) -> dx (M, K)``                                     dx = dy W
- ``sdd(dy (M, N), x (M, K), *index, block_shape) -> [nnz, B, B]``                  dW_b = dyᵀ x on kept blocks
- ``sdd_with_bias_grad(dy, x, *index, block_shape) -> ([nnz, B, B], (N,))``        (dW_b, dy.sum(0)): the Hopper
  sdd sums dy while it streams it (no extra pass over dy)

Inputs are fp16 or bf16 CUDA tensors with square blocks of 32, 64 or 128 (``supports``); fp32 accumulation,
outputs in the input dtype. The gradients are wired by ``functional.BlockSparseLinearFunction``.
Importing this module raises ImportError (quoting how the extension was built) when ``_C`` cannot load.
"""

from __future__ import annotations

import contextlib
import os
from typing import List, Optional, Tuple

import torch
from torch import Tensor

try:
    from . import _build_info as build_info
except ImportError:  # extension built by hand, without cuda_build.py
    build_info = None


def describe_build() -> str:
    """One line: how the extension was built (archs, torch, CUDA, CUTLASS), for error messages."""
    if build_info is None:
        return "no build record (_build_info.py is missing)"
    return (f"built for archs {build_info.ARCHS} with torch {build_info.TORCH_VERSION} (CUDA "
            f"{build_info.TORCH_CUDA_VERSION}), nvcc {build_info.NVCC_VERSION}, CUTLASS {build_info.CUTLASS_VERSION}, "
            f"Python {build_info.PYTHON_VERSION}")


try:
    from . import _C
except ImportError as error:
    raise ImportError(f"pytorch_block_sparse_ng._C cannot be loaded ({error}); it was {describe_build()}; running "
                      f"torch {torch.__version__} (CUDA {torch.version.cuda})") from error

__all__ = ["supports", "device_supported", "dsd", "dds", "sdd", "sdd_with_bias_grad", "describe_build", "set_hopper_kernels",
           "set_hopper_min_rows", "set_hopper_sdd_min_blocks_per_row", "set_hopper_tile_schedule",
           "set_hopper_pipeline_stages", "set_hopper_sdd_tail_split", "set_decode_max_rows",
           "set_hopper_few_rows_split", "set_hopper_blocks_of_32", "set_hopper_b32_columns", "set_hopper_b32_dds_copy",
           "set_hopper_b32_pair_boxes", "set_hopper_sdd_b32_mode", "set_hopper_sdd_splits",
           "set_hopper_sdd_one_block_ctas",
           "set_backward_overlap", "set_programmatic_launch", "forced_knobs"]

# dsd / dds with blocks 64 / 128 run on the Hopper kernels (TMA + wgmma; sm_90a builds, sm_90 GPUs, M >= 256 by
# default) unless this is "0".
if os.environ.get("PYTORCH_BLOCK_SPARSE_NG_HOPPER", "1") == "0":
    _C.set_hopper_kernels(False)


def set_hopper_kernels(enabled: bool) -> bool:
    """Use (default) or not the Hopper wgmma kernels where they exist; returns the previous setting."""
    return bool(_C.set_hopper_kernels(bool(enabled)))


_TILE_SCHEDULES = ("auto", "counter", "round_robin")


def set_hopper_tile_schedule(schedule: str) -> str:
    """How the Hopper dsd / dds hand their tiles to the SMs: "counter" (from an atomic counter: SMs that finish
    cheap tiles take more), "round_robin" (CTA i takes tiles i, i + grid, ... of the same order) or "auto"
    (default: the counter, measured faster on an H100 at every density); returns the previous schedule."""
    if schedule not in _TILE_SCHEDULES:
        raise ValueError(f"set_hopper_tile_schedule: schedule={schedule!r} must be one of {_TILE_SCHEDULES}")
    return _TILE_SCHEDULES[_C.set_hopper_tile_schedule(_TILE_SCHEDULES.index(schedule))]


def set_hopper_pipeline_stages(stages: int) -> int:
    """Pipeline stages of the Hopper dsd / dds: 4 (default; the output tile is then staged in two halves) or 3;
    returns the previous value."""
    return int(_C.set_hopper_pipeline_stages(int(stages)))


def set_hopper_sdd_tail_split(enabled: bool) -> bool:
    """Whether the Hopper sdd with blocks of 128 splits the items of its last partial wave of CTAs over M
    (default True: a third wave of a few CTAs made its sdd at density 0.5 take 0.26 instead of 0.20 ms on an
    H100); returns the previous setting."""
    return bool(_C.set_hopper_sdd_tail_split(bool(enabled)))


def set_hopper_sdd_splits(splits: int) -> int:
    """Splits of M (the tokens) for the Hopper sdd with blocks of 64 and 128: -1 (default) by rule (bindings.cpp,
    sdd_sm90_splits: blocks of 128 by a model of the kernel's time fitted on an H100); 1-64: that many pieces of the
    reduction per block (at most one per 64 tokens); 2 with blocks of 128 sums its pieces in the kernel, other splits
    into a zeroed fp32 workspace. Returns the previous value."""
    return int(_C.set_hopper_sdd_splits(int(splits)))


def set_hopper_sdd_one_block_ctas(mode: int) -> int:
    """The Hopper sdd with blocks of 128 as one CTA per kept block, two per SM, loaded by cp.async
    (kernel_sm90_sdd_cpasync.cuh) instead of the TMA sdd's two-block CTAs: -1 (default) for 2048 to 3072 rows M and
    half the SMs' count of kept blocks to twice it, one wave of at most two CTAs per SM (bindings.cpp,
    sdd_b128_one_block_ctas), unless set_hopper_sdd_splits forces a split; 0: never; 1: always (M then unsplit,
    whatever set_hopper_sdd_splits says). Returns the previous mode."""
    return int(_C.set_hopper_sdd_one_block_ctas(int(mode)))


def set_hopper_min_rows(rows: int) -> int:
    """The fewest rows M for which dsd / dds take the Hopper kernels (default 256); returns the previous value."""
    return int(_C.set_hopper_min_rows(int(rows)))


def set_hopper_few_rows_split(split: int) -> int:
    """The Hopper dsd and dds for few rows of M: tiles of 128 tokens whose reduction may be split over the 2, 4 or
    8 CTAs of a thread-block cluster (they add their fp32 sums through distributed shared memory), so that few
    tiles still fill the GPU. -1 (default): the rule in bindings.cpp (few_rows_split_for), fitted to measurements:
    the tiles where they fit on the SMs (the dsd's M <= 64 takes the decode kernel first; blocks of 128 also on up
    to twice the SMs at density <= 0.5 with short lines), a split of 2 where they fill at most half of them and the
    lines are long, a split of 4 where they fill at most 3/16 of them and the lines have >= 24 steps of 64, a split
    of 8 where they fill at most 3/32 of them and the lines have >= 64 steps (blocks of 64) or >= 96 (blocks of
    128); blocks of 64 in the dsd keep the SM80 kernels in some cells (below 256 rows where those fill the SMs
    better, unless the split of 4 applies at density >= 0.75). 0: never (and blocks of 64 keep the 256-token
    kernels from set_hopper_min_rows); 1, 2, 4 or 8: that split wherever the Hopper kernels run. Returns the
    previous value."""
    return int(_C.set_hopper_few_rows_split(int(split)))


def set_hopper_blocks_of_32(mode: int) -> int:
    """The Hopper kernels for blocks of 32: the dsd and dds (128 tokens x 8 lines per tile, a 64 x 32 wgmma per
    line that has the block) and the sdd (a row pair x 16 columns of its union per CTA). -1 (default): where each
    measured faster than the SM80 kernels (the rules in bindings.cpp: b32_hopper_for, tiles filling three quarters
    of the SMs and density >= 0.18 (>= 0.4 where their last wave leaves most SMs idle), or >= 0.05 on four times
    the SMs' tiles; b32_sdd_hopper_for, M >= 64 whatever set_hopper_min_rows says); 0: never; 1: wherever the
    Hopper kernels run (M >= set_hopper_min_rows). Returns the previous mode."""
    return int(_C.set_hopper_blocks_of_32(int(mode)))


def set_hopper_b32_pair_boxes(bits: int) -> int:
    """TMA boxes of two blocks in the block-32 Hopper dsd / dds (two-column stages): bit 1 loads a line's two
    adjacent W blocks in one box, bit 2 two adjacent block columns' activation tiles; 3 both, 0 neither. -1 (default):
    activation pairs, both kinds from density 2/3 (bindings.cpp, b32_pair_boxes_for). Returns the previous value."""
    return int(_C.set_hopper_b32_pair_boxes(int(bits)))


def set_hopper_b32_columns(columns: int) -> int:
    """Block columns per pipeline stage of the block-32 Hopper dsd / dds: -1 (default) two (bindings.cpp,
    b32_columns: with each two-column stage released once its wgmma are done, two measured faster than one on every
    size and density but one cell, within 1 %); 1 or 2: that many. Returns the previous value."""
    return int(_C.set_hopper_b32_columns(int(columns)))


def set_hopper_b32_dds_copy(mode: int) -> int:
    """The block-32 Hopper dds (dx = dy W) on a transposed copy of W's blocks, i.e. as the dsd of dy with Wᵀ, whose
    K-major W tiles load in 128-byte rows (the copy: a pass over the blocks into a workspace of the weight's size,
    freed when the dds returns). -1 (default): from density 0.2, where it measured up to 17 % faster than the
    kernel that reads W's blocks as MN-major tiles (bindings.cpp, b32_dds_copy_for); 0: never; 1: always. Returns
    the previous mode."""
    return int(_C.set_hopper_b32_dds_copy(int(mode)))


def set_hopper_sdd_b32_mode(mode: int) -> int:
    """The block-32 Hopper sdd's tile: -1 (default) by density (bindings.cpp, b32_sdd_mode); 0: a row pair x 16
    single columns of its union (32-feature x boxes: fewer CTAs and no absent columns loaded at low density); 1: a
    row pair x 8 column pairs (64-feature boxes: half the TMA rows per stage); 2: four adjacent rows x 4 column
    pairs of their union (each consumer its row pair, the x tiles shared: a third of the rows of mode 0); 3: mode 0
    with the x tiles from a transposed copy of x (32 rows of 128 bytes per column instead of 64 of 64; the copy, the
    size of x, lives for the call). Returns the previous mode."""
    return int(_C.set_hopper_sdd_b32_mode(int(mode)))


def set_hopper_sdd_min_blocks_per_row(blocks: int) -> int:
    """The Hopper sdd with blocks of 64 runs when nnz >= blocks x block rows (default 3: sparser rows leave its
    8-block tiles mostly empty and the SM80 sdd is faster); returns the previous value."""
    return int(_C.set_hopper_sdd_min_blocks_per_row(int(blocks)))


def set_decode_max_rows(rows: int) -> int:
    """dsd with at most this many rows of M (0 to 64, default 64) takes the decode kernel, which streams the
    kept blocks with N / 16 or N / 32 CTAs and no split workspace (the tiled kernels otherwise); 0 turns it off.
    Returns the previous value."""
    return int(_C.set_decode_max_rows(int(rows)))


def set_backward_overlap(enabled: bool) -> bool:
    """Whether the layer's eager backward runs the input gradient (dds) on a second CUDA stream beside the weight
    gradient (sdd), forked from and joined back to the current stream (default True: the dds fills the SMs the
    sdd's waves leave idle); returns the previous setting. The traced path (torch.compile) runs them on one
    stream."""
    return bool(_C.set_backward_overlap(bool(enabled)))


def set_programmatic_launch(enabled: bool) -> bool:
    """Whether the kernels are launched with programmatic dependent launch on sm_90 GPUs (default True): each may
    be scheduled while the kernel before it in the stream finishes, sets up its shared memory, and waits for that
    kernel's results before it reads or writes global memory (cuda/block_sparse/grid_dependency.cuh), which hides
    the gap between back-to-back kernels. Results are the same either way; returns the previous setting."""
    return bool(_C.set_programmatic_launch(bool(enabled)))


@contextlib.contextmanager
def forced_knobs(*settings):
    """Sets each (setter, value) of ``settings`` (the ``set_*`` knobs above, which return the previous value) for
    the ``with`` block and yields the previous values; restores them on exit, last set first restored, also when
    the block or a later setter raises. The knobs act when a call is made or captured into a CUDA graph, so tests
    and benchmarks can force one path: ``with forced_knobs((set_hopper_few_rows_split, 8)): ...``."""
    previous = []
    try:
        for setter, value in settings:
            previous.append((setter, setter(value)))
        yield tuple(value for _, value in previous)
    finally:
        for setter, value in reversed(previous):
            setter(value)


_SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
_BLOCK_SIZES = tuple(_C.supported_block_sizes())
_device_ok = {}


@torch.compiler.assume_constant_result
def _device_supported_index(index: int) -> bool:
    if index not in _device_ok:
        _device_ok[index] = bool(_C.device_supported(index))
    return _device_ok[index]


def device_supported(device: torch.device) -> bool:
    """Whether this build has kernel images for the GPU ``device`` (asked once per device; a constant for
    torch.compile)."""
    return _device_supported_index(device.index if device.index is not None else torch.cuda.current_device())


def supports(x: Tensor, data: Tensor) -> bool:
    """True when the kernels compute this case: CUDA tensors on one device, fp16/bf16 of one dtype, square
    blocks of 32/64/128, and a kernel image for the GPU's arch."""
    return (x.is_cuda and data.is_cuda and x.device == data.device and x.dtype in _SUPPORTED_DTYPES
            and data.dtype == x.dtype and data.dim() == 3 and data.shape[1] == data.shape[2]
            and data.shape[1] in _BLOCK_SIZES and device_supported(x.device))


def _aligned(t: Tensor) -> Tensor:
    """The kernels load 16 bytes at a time: contiguous, 16-byte aligned storage."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


# ------------------------------------------------------------------------------------------------ dsd
@torch.library.custom_op("pytorch_block_sparse_ng::dsd", mutates_args=())
def _dsd(x: Tensor, data: Tensor, bias: Optional[Tensor], row_offsets: Tensor, col_indices: Tensor,
         row_indices: Tensor, col_offsets_t: Tensor, row_indices_t: Tensor, perm_t: Tensor, row_order: Tensor,
         col_order: Tensor) -> Tensor:
    return _C.dsd(_aligned(x), _aligned(data), bias if bias is None else bias.contiguous(), row_offsets, col_indices,
                  row_indices, col_offsets_t, row_indices_t, perm_t, row_order, col_order)


@_dsd.register_fake
def _dsd_fake(x, data, bias, row_offsets, col_indices, row_indices, col_offsets_t, row_indices_t, perm_t, row_order,
              col_order):
    return x.new_empty((x.shape[0], (row_offsets.shape[0] - 1) * data.shape[1]))


# ------------------------------------------------------------------------------------------------ dds
@torch.library.custom_op("pytorch_block_sparse_ng::dds", mutates_args=())
def _dds(dy: Tensor, data: Tensor, row_offsets: Tensor, col_indices: Tensor, row_indices: Tensor,
         col_offsets_t: Tensor, row_indices_t: Tensor, perm_t: Tensor, row_order: Tensor, col_order: Tensor) -> Tensor:
    return _C.dds(_aligned(dy), _aligned(data), row_offsets, col_indices, row_indices, col_offsets_t, row_indices_t,
                  perm_t, row_order, col_order)


@_dds.register_fake
def _dds_fake(dy, data, row_offsets, col_indices, row_indices, col_offsets_t, row_indices_t, perm_t, row_order,
              col_order):
    return dy.new_empty((dy.shape[0], (col_offsets_t.shape[0] - 1) * data.shape[2]))


# ------------------------------------------------------------------------------------------------ sdd
@torch.library.custom_op("pytorch_block_sparse_ng::sdd", mutates_args=())
def _sdd(dy: Tensor, x: Tensor, row_offsets: Tensor, col_indices: Tensor, row_indices: Tensor,
         col_offsets_t: Tensor, row_indices_t: Tensor, perm_t: Tensor, row_order: Tensor, col_order: Tensor,
         block_shape: List[int]) -> Tensor:
    return _C.sdd(_aligned(dy), _aligned(x), row_offsets, col_indices, row_indices, col_offsets_t, row_indices_t,
                  perm_t, row_order, col_order, list(block_shape), False)[0]


@_sdd.register_fake
def _sdd_fake(dy, x, row_offsets, col_indices, row_indices, col_offsets_t, row_indices_t, perm_t, row_order,
              col_order, block_shape):
    return x.new_empty((col_indices.shape[0], block_shape[0], block_shape[1]))


@torch.library.custom_op("pytorch_block_sparse_ng::sdd_with_bias_grad", mutates_args=())
def _sdd_with_bias_grad(dy: Tensor, x: Tensor, row_offsets: Tensor, col_indices: Tensor, row_indices: Tensor,
                        col_offsets_t: Tensor, row_indices_t: Tensor, perm_t: Tensor, row_order: Tensor,
                        col_order: Tensor, block_shape: List[int]) -> Tuple[Tensor, Tensor]:
    return _C.sdd(_aligned(dy), _aligned(x), row_offsets, col_indices, row_indices, col_offsets_t, row_indices_t,
                  perm_t, row_order, col_order, list(block_shape), True)


@_sdd_with_bias_grad.register_fake
def _sdd_with_bias_grad_fake(dy, x, row_offsets, col_indices, row_indices, col_offsets_t, row_indices_t, perm_t,
                             row_order, col_order, block_shape):
    return (x.new_empty((col_indices.shape[0], block_shape[0], block_shape[1])), dy.new_empty((dy.shape[1],)))


# ------------------------------------------------------------------------------------------------ linear_grads
# The layer's wanted gradients in one op (_C.linear_backward, the eager node's backward body), so that traced code
# (torch.compile) gets the same two streams: the dds beside the sdd when both are wanted. A gradient not wanted
# is an empty tensor (custom ops return no None).
@torch.library.custom_op("pytorch_block_sparse_ng::linear_grads", mutates_args=())
def _linear_grads(dy: Tensor, x: Tensor, data: Tensor, row_offsets: Tensor, col_indices: Tensor,
                  row_indices: Tensor, col_offsets_t: Tensor, row_indices_t: Tensor, perm_t: Tensor,
                  row_order: Tensor, col_order: Tensor, want_x: bool, want_data: bool,
                  want_bias: bool) -> Tuple[Tensor, Tensor, Tensor]:
    index = [row_offsets, col_indices, row_indices, col_offsets_t, row_indices_t, perm_t, row_order, col_order]
    grads = _C.linear_backward(dy, x, data, index, want_x, want_data, want_bias)
    return tuple(g if g is not None else dy.new_empty((0,)) for g in grads)


@_linear_grads.register_fake
def _linear_grads_fake(dy, x, data, row_offsets, col_indices, row_indices, col_offsets_t, row_indices_t, perm_t,
                       row_order, col_order, want_x, want_data, want_bias):
    return (x.new_empty(x.shape if want_x else (0,)), data.new_empty(data.shape if want_data else (0,)),
            dy.new_empty((dy.shape[1] if want_bias else 0,)))


# ------------------------------------------------------------------------------------------------ API for backend.py
# In eager mode on plain tensors the bindings are called directly: going through the dispatcher costs tens of
# microseconds per call, more than the kernels themselves take at small sizes. Under torch.compile / export
# tracing (or for tensor subclasses such as FakeTensor) the custom ops are used, so graphs hold them.
def _eager(t: Tensor) -> bool:
    return type(t) is Tensor and not torch.compiler.is_compiling()


def dsd(x: Tensor, data: Tensor, bias: Optional[Tensor], *index: Tensor) -> Tensor:
    """y (M, N) = x (M, K) Wᵀ + bias."""
    if _eager(x):
        return _C.dsd(_aligned(x), _aligned(data), bias if bias is None else bias.contiguous(), *index)
    return _dsd(x, data, bias, *index)


def dds(dy: Tensor, data: Tensor, *index: Tensor) -> Tensor:
    """dx (M, K) = dy (M, N) W."""
    if _eager(dy):
        return _C.dds(_aligned(dy), _aligned(data), *index)
    return _dds(dy, data, *index)


def sdd(dy: Tensor, x: Tensor, *args) -> Tensor:
    """dW_b [nnz, BR, BC] = dyᵀ x on the kept blocks. ``args`` = the eight index tensors, then block_shape."""
    *index, block_shape = args
    if _eager(x):
        return _C.sdd(_aligned(dy), _aligned(x), *index, [int(b) for b in block_shape], False)[0]
    return _sdd(dy, x, *index, [int(b) for b in block_shape])


def sdd_with_bias_grad(dy: Tensor, x: Tensor, *args) -> Tuple[Tensor, Tensor]:
    """(dW_b [nnz, BR, BC] = dyᵀ x on the kept blocks, dy.sum(0)), in one pass over dy where the kernel can.
    ``args`` as for ``sdd``."""
    *index, block_shape = args
    if _eager(x):
        return _C.sdd(_aligned(dy), _aligned(x), *index, [int(b) for b in block_shape], True)
    return _sdd_with_bias_grad(dy, x, *index, [int(b) for b in block_shape])


def linear_grads(dy: Tensor, x: Tensor, data: Tensor, *index: Tensor, want_x: bool, want_data: bool,
                 want_bias: bool) -> Tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
    """(dx = dy W, dW_b = dyᵀ x on the kept blocks, dy.sum(0)), each None unless wanted; the dds on a second
    stream beside the sdd when both are wanted (set_backward_overlap)."""
    if _eager(dy):
        return _C.linear_backward(dy, x, data, list(index), want_x, want_data, want_bias)
    grads = _linear_grads(dy, x, data, *index, want_x, want_data, want_bias)
    return tuple(g if want else None for g, want in zip(grads, (want_x, want_data, want_bias)))


def linear(x: Tensor, data: Tensor, bias: Optional[Tensor], *index: Tensor) -> Optional[Tensor]:
    """y = x Wᵀ + bias with its backward (dds, sdd, the bias sum) attached as the extension's C++ autograd node,
    whose backward runs on the autograd engine's device thread without the GIL. Eager mode on plain tensors
    only: returns None under tracing, where functional.BlockSparseLinearFunction over the custom ops is used."""
    if not _eager(x):
        return None
    return _C.linear(x, data, bias, index)


ops = (_dsd, _dds, _sdd, _sdd_with_bias_grad, _linear_grads)  # for torch.library.opcheck in the tests
