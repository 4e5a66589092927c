"""Which implementation computes the block-sparse products: the CUDA extension or ``reference.py``.

The rule: the CUDA kernels when the extension is built and loaded and supports the case (CUDA tensors,
dtype, block shape, GPU arch); else the pure-PyTorch reference. Force the reference with
``set_backend("reference")``, the ``use_backend("reference")`` context manager, or the environment variable
``PYTORCH_BLOCK_SPARSE_NG_BACKEND=reference`` (read at import).
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator, Optional, Tuple

import torch

from . import _extension, reference

__all__ = ["set_backend", "get_backend", "use_backend", "kernels_available", "dsd", "dds", "sdd", "sdd_with_bias_grad",
           "linear_grads", "linear_with_grad"]

_BACKENDS = ("auto", "reference")
_ENV_VAR = "PYTORCH_BLOCK_SPARSE_NG_BACKEND"


def _check_backend(name: str, where: str) -> str:
    if name not in _BACKENDS:
        raise ValueError(f"{where}: backend={name!r} must be one of {_BACKENDS}")
    return name


_backend = _check_backend(os.environ.get(_ENV_VAR, "auto"), f"environment variable {_ENV_VAR}")
# The extension is loaded here, at import, not at the first product: torch.compile cannot trace the loading (a
# file search and an import), so a model compiled before any eager call broke its graph there (fullgraph=True
# raised).
_extension.get()


def set_backend(name: str) -> None:
    """"auto" (kernels where supported, else the reference) or "reference" (always pure PyTorch)."""
    global _backend
    _backend = _check_backend(name, "set_backend")


def get_backend() -> str:
    return _backend


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Context manager: ``with use_backend("reference"): ...``."""
    global _backend
    previous, _backend = _backend, _check_backend(name, "use_backend")
    try:
        yield
    finally:
        _backend = previous


def kernels_available() -> bool:
    """True when the CUDA extension is built and loads in this process."""
    return _extension.get() is not None


def _kernels_for(x: torch.Tensor, data: torch.Tensor):
    """The kernel ops if they should compute this case, else None."""
    if _backend == "reference" or not x.is_cuda:
        return None
    ops = _extension.get()
    if ops is None or not ops.supports(x, data):
        return None
    return ops


def dsd(x: torch.Tensor, data: torch.Tensor, bias: Optional[torch.Tensor], *index: torch.Tensor) -> torch.Tensor:
    ops = _kernels_for(x, data)
    return (ops.dsd if ops is not None else reference.dsd)(x, data, bias, *index)


def dds(dy: torch.Tensor, data: torch.Tensor, *index: torch.Tensor) -> torch.Tensor:
    ops = _kernels_for(dy, data)
    return (ops.dds if ops is not None else reference.dds)(dy, data, *index)


def sdd(dy: torch.Tensor, x: torch.Tensor, data: torch.Tensor, *index: torch.Tensor) -> torch.Tensor:
    ops = _kernels_for(x, data)
    if ops is not None:
        return ops.sdd(dy, x, *index, data.shape[1:])
    return reference.sdd(dy, x, *index, tuple(data.shape[1:]))


def sdd_with_bias_grad(dy: torch.Tensor, x: torch.Tensor, data: torch.Tensor,
                       *index: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(sdd, dy.sum(0)): the weight and bias gradients of the layer, fused where the kernels can."""
    ops = _kernels_for(x, data)
    if ops is not None:
        return ops.sdd_with_bias_grad(dy, x, *index, data.shape[1:])
    return reference.sdd(dy, x, *index, tuple(data.shape[1:])), dy.sum(0)


def linear_grads(dy: torch.Tensor, x: torch.Tensor, data: torch.Tensor, *index: torch.Tensor, want_x: bool,
                 want_data: bool, want_bias: bool) -> Tuple[Optional[torch.Tensor], ...]:
    """(dx, dW_b, dy.sum(0)), each None unless wanted: the layer's backward. The kernels run the two products on
    two streams and fuse the bias sum into the sdd where they can."""
    ops = _kernels_for(x, data)
    if ops is not None:
        return ops.linear_grads(dy, x, data, *index, want_x=want_x, want_data=want_data, want_bias=want_bias)
    return (reference.dds(dy, data, *index) if want_x else None,
            reference.sdd(dy, x, *index, tuple(data.shape[1:])) if want_data else None,
            dy.sum(0) if want_bias else None)


def linear_with_grad(x: torch.Tensor, data: torch.Tensor, bias: Optional[torch.Tensor],
                     *index: torch.Tensor) -> Optional[torch.Tensor]:
    """y = x Wᵀ + bias with its backward attached, by the kernels' C++ autograd node where they compute this case
    in eager mode (its backward needs no GIL); None elsewhere: the caller then uses
    functional.BlockSparseLinearFunction, whose backward calls dsd / dds / sdd above."""
    ops = _kernels_for(x, data)
    return None if ops is None else ops.linear(x, data, bias, *index)
