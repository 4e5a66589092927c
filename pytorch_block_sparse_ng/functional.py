"""The block-sparse linear product with autograd: y = x Wᵀ + bias for a ``BlockSparseMatrix`` W.

One ``torch.autograd.Function`` for the whole layer: forward is ``dsd``, backward is ``linear_grads``: ``dds``
(grad input) and ``sdd`` (grad of the kept blocks only) with the bias sum (fused into the sdd kernel where it
can), the two products on two streams where the kernels compute them. Every
index tensor is an argument and only tensors are saved, so the Function holds no module and is safe for
``torch.compile`` and DDP.

In eager mode, where the CUDA kernels compute the case, the same Function is the extension's C++ autograd node
(``_C.linear``, cuda/linear_autograd.cpp): the engine runs a CUDA backward on its device thread, and a C++
backward does not wait for the GIL there. The Python Function serves the reference path and traced code.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import backend
from .layout import BlockSparseMatrix

__all__ = ["BlockSparseLinearFunction", "block_sparse_linear"]


class BlockSparseLinearFunction(torch.autograd.Function):
    """apply(x (M, K), data [nnz, BR, BC], bias (N,) or None, *index) -> (M, N), with ``index`` the tensors of
    ``BlockSparseMatrix.indices()`` (layout.INDEX_NAMES, then layout.ORDER_NAMES)."""

    @staticmethod
    def forward(ctx, x, data, bias, *index):
        ctx.save_for_backward(x, data, *index)
        return backend.dsd(x, data, bias, *index)

    @staticmethod
    def backward(ctx, grad_output):
        x, data, *index = ctx.saved_tensors
        grad_output = grad_output.contiguous()
        grad_x, grad_data, grad_bias = backend.linear_grads(grad_output, x, data, *index,
                                                            want_x=ctx.needs_input_grad[0],
                                                            want_data=ctx.needs_input_grad[1],
                                                            want_bias=ctx.needs_input_grad[2])
        return (grad_x, grad_data, grad_bias) + (None,) * len(index)


def block_sparse_linear(x: torch.Tensor, weight: BlockSparseMatrix, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """y = x Wᵀ + bias, like ``F.linear`` with a block-sparse weight.

    x: (*, in_features) with in_features = weight.shape[1]; bias: (out_features,) or None.
    Returns (*, out_features). Under ``torch.autocast`` the operands are cast to the autocast dtype, as
    ``F.linear`` does; otherwise x, the blocks and the bias must share one dtype and device.
    """
    if not isinstance(weight, BlockSparseMatrix):
        raise TypeError(f"block_sparse_linear: weight must be a BlockSparseMatrix, got {type(weight).__name__}")
    out_features, in_features = weight.shape
    if x.dim() == 0 or x.shape[-1] != in_features:
        raise ValueError(f"block_sparse_linear: x.shape={tuple(x.shape)} must end in in_features={in_features}")
    if bias is not None and tuple(bias.shape) != (out_features,):
        raise ValueError(f"block_sparse_linear: bias.shape={tuple(bias.shape)} must be ({out_features},)")
    data = weight.data
    if x.device != data.device:
        raise ValueError(f"block_sparse_linear: x is on {x.device} but the weight is on {data.device}")
    index = weight.indices()
    flat = x.dim() == 2  # 2-D inputs skip the reshape and view nodes (engine time per backward)
    if torch.is_autocast_enabled(x.device.type):
        dtype = torch.get_autocast_dtype(x.device.type)
        x2d = (x if flat else x.reshape(-1, in_features)).to(dtype).contiguous()
        bias = bias.to(dtype) if bias is not None else None
        with torch.autocast(x.device.type, enabled=False):  # the products must not be re-cast inside
            y = _linear_with_grad(x2d, data.to(dtype), bias, index)
    else:
        if x.dtype != data.dtype or (bias is not None and bias.dtype != data.dtype):
            raise TypeError(f"block_sparse_linear: x.dtype={x.dtype}, weight dtype={data.dtype} and bias dtype="
                            f"{None if bias is None else bias.dtype} must be equal (or run under torch.autocast)")
        x2d = (x if flat else x.reshape(-1, in_features)).contiguous()
        if torch.is_grad_enabled() and (x.requires_grad or data.requires_grad
                                        or (bias is not None and bias.requires_grad)):
            y = _linear_with_grad(x2d, data, bias, index)
        else:  # inference: skip the autograd.Function (tens of microseconds of host time per call)
            y = backend.dsd(x2d, data, bias, *index)
    return y if flat else y.view(*x.shape[:-1], out_features)


def _linear_with_grad(x2d, data, bias, index):
    """The product with its backward attached: the kernels' C++ autograd node in eager mode where they compute
    the case, else the Python Function (reference backend, CPU, torch.compile tracing)."""
    y = backend.linear_with_grad(x2d, data, bias, *index)
    return y if y is not None else BlockSparseLinearFunction.apply(x2d, data, bias, *index)
