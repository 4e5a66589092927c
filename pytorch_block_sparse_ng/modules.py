"""Drop-in replacements for ``nn.Linear`` with sparse weights.

- ``BlockSparseLinear``: block-sparse weight (``BlockSparseMatrix``), computed by the block-sparse kernels
  (or the reference path on CPU).
- ``SemiStructuredLinear``: N:M sparse weight (2:4 by default), masked dense for training; on CUDA, inference
  can use PyTorch's semi-structured sparse tensors.
- ``PseudoBlockSparseLinear``: a dense layer with a fixed block mask, for debugging (the patcher's
  ``pseudo_linear``).
"""

from __future__ import annotations

import math
import warnings
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .functional import block_sparse_linear
from .layout import BlockSparseMatrix, block_grid, check_block_shape, count_blocks
from .masks import block_mask_by_magnitude, expand_block_mask, nm_mask, parse_nm

__all__ = ["BlockSparseLinear", "SemiStructuredLinear", "PseudoBlockSparseLinear", "MaskedLinear",
           "dense_weight_of"]


def _is_hf_conv1d(module: nn.Module) -> bool:
    """transformers' Conv1D (GPT-2): a Linear whose weight is stored (in_features, out_features)."""
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf") and getattr(module, "weight", None) is not None \
        and module.weight.dim() == 2 and module.weight.shape[1] == module.nf


def dense_weight_of(module: nn.Module) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(weight (out_features, in_features), bias or None) of an ``nn.Linear`` or transformers ``Conv1D``."""
    if isinstance(module, nn.Linear):
        return module.weight, module.bias
    if _is_hf_conv1d(module):
        return module.weight.t(), module.bias
    raise TypeError(f"expected an nn.Linear or transformers Conv1D, got {type(module).__name__}")


class BlockSparseLinear(nn.Module):
    """``nn.Linear`` with a block-sparse weight: y = x Wᵀ + b where W keeps ``density`` of its blocks.

    Args (the signature of pytorch_block_sparse 0.1.2, plus nn.Linear's factory keywords):
        in_features, out_features: sizes; multiples of ``block_shape[1]`` and ``block_shape[0]``.
        bias: learn an additive bias.
        density: fraction of the (out/BR) x (in/BC) blocks kept, in [0, 1], rounded to a whole block count.
        torch_nn_linear: an ``nn.Linear`` to convert; then its sizes, bias, device and dtype are used, and
            the ``density`` fraction of blocks with the largest L2 norm are kept with their trained values
            (same as ``from_dense``).
        verbose: print one line describing the layer when it is built.
        block_shape: (BR, BC) = (rows along out_features, columns along in_features).
        device, dtype: as for ``nn.Linear``.
        generator: ``torch.Generator`` for the random pattern and initial values (reproducible layers).

    Initialisation (fresh pattern): blocks at uniformly random positions, values U(-b, b) with
    b = 1 / sqrt(fan_in) where fan_in = density x in_features is the average number of inputs an output
    sees; nn.Linear uses the same rule with fan_in = in_features, so the output scale matches nn.Linear's at
    any density. The bias uses the same bound.

    Shapes: x (*, in_features) -> (*, out_features).
    Parameters: ``weight.data`` [nnz_blocks, BR, BC] and ``bias``; buffers: the pattern's int32 indices.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, density: float = 0.5,
                 torch_nn_linear: Optional[nn.Module] = None, verbose: bool = False, block_shape=(32, 32), *,
                 device=None, dtype=None, generator: Optional[torch.Generator] = None):
        super().__init__()
        block_shape = check_block_shape(block_shape, "BlockSparseLinear")
        if torch_nn_linear is not None:
            dense, dense_bias = dense_weight_of(torch_nn_linear)
            out_features, in_features = dense.shape
            bias = dense_bias is not None
            device = dense.device if device is None else device
            dtype = dense.dtype if dtype is None else dtype
        for name, value, axis in (("out_features", out_features, 0), ("in_features", in_features, 1)):
            if isinstance(value, bool) or int(value) != value or value <= 0:
                raise ValueError(f"BlockSparseLinear: {name}={value!r} must be a positive integer")
            if value % block_shape[axis]:
                raise ValueError(f"BlockSparseLinear: {name}={value} must be a multiple of "
                                 f"block_shape[{axis}]={block_shape[axis]}")
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.block_shape = block_shape
        n_blocks = (out_features // block_shape[0]) * (in_features // block_shape[1])
        count_blocks(n_blocks, density=density, owner="BlockSparseLinear")  # validates density

        if torch_nn_linear is not None:
            with torch.no_grad():
                weight = BlockSparseMatrix.from_dense(dense.detach().to(device=device, dtype=dtype), block_shape,
                                                      density=density)
        else:
            weight = BlockSparseMatrix.zeros((out_features, in_features), block_shape=block_shape, device=device,
                                             density=density, dtype=dtype, generator=generator)
        self.weight = weight
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, device=weight.device, dtype=weight.dtype))
        else:
            self.register_parameter("bias", None)

        if torch_nn_linear is not None:
            if self.bias is not None:
                with torch.no_grad():
                    self.bias.copy_(dense_bias)
        else:
            self.reset_parameters(generator)
        if verbose:
            print(f"BlockSparseLinear({self.extra_repr()})")

    @classmethod
    def from_dense(cls, linear: nn.Module, density: Optional[float] = None, block_shape=(32, 32), *,
                   block_mask: Optional[torch.Tensor] = None, norm: str = "l2") -> "BlockSparseLinear":
        """Convert a trained ``nn.Linear`` (or transformers ``Conv1D``): keep the ``density`` fraction
        (default 0.5) of blocks with the largest ``norm`` ("l2" or "l1"), or exactly ``block_mask``
        ([out/BR, in/BC] bool), with their trained values; the bias is copied. Device and dtype follow the
        layer."""
        dense, dense_bias = dense_weight_of(linear)
        block_shape = check_block_shape(block_shape, "BlockSparseLinear.from_dense")
        block_grid(dense.shape, block_shape, "BlockSparseLinear.from_dense")
        if block_mask is None:
            density = 0.5 if density is None else density
            block_mask = block_mask_by_magnitude(dense, block_shape, density=density, norm=norm)
        elif density is not None:
            raise ValueError(f"BlockSparseLinear.from_dense: give block_mask or density={density}, not both")
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.out_features, layer.in_features = dense.shape
        layer.block_shape = block_shape
        with torch.no_grad():
            layer.weight = BlockSparseMatrix.from_dense(dense.detach(), block_shape, block_mask=block_mask)
            layer.bias = None if dense_bias is None else nn.Parameter(dense_bias.detach().clone())
        return layer

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        """Draw fresh values (the pattern stays): U(-b, b), b = 1/sqrt(density * in_features)."""
        fan_in = self.weight.nnz_blocks * self.block_shape[1] / max(1, self.weight.grid[0])
        bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
        with torch.no_grad():
            for tensor in (self.weight.data, self.bias):
                if tensor is None or tensor.numel() == 0:
                    continue
                gen_device = generator.device if generator is not None else tensor.device
                values = torch.rand(tensor.shape, generator=generator, device=gen_device, dtype=torch.float32)
                tensor.copy_((values * 2 - 1) * bound)

    @property
    def density(self) -> float:
        return self.weight.density

    @property
    def block_count(self) -> int:
        return self.weight.nnz_blocks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return block_sparse_linear(x, self.weight, self.bias)

    def to_dense(self) -> nn.Linear:
        """An ``nn.Linear`` computing the same function (zeros outside the kept blocks)."""
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                           device=self.weight.device, dtype=self.weight.dtype)
        with torch.no_grad():
            linear.weight.copy_(self.weight.to_dense())
            if self.bias is not None:
                linear.bias.copy_(self.bias)
        return linear

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"density={self.density:.4g}, block_shape={self.block_shape}")


class MaskedLinear(nn.Module):
    """A dense ``nn.Linear`` whose weight is multiplied by a fixed bool ``mask`` (out_features, in_features).

    Pruned weights are zero in ``weight`` and receive zero gradient, so they stay zero under any optimizer
    without weight decay; the forward applies the mask anyway, so the output is always the masked product.
    """

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor], mask: torch.Tensor):
        super().__init__()
        if mask.shape != weight.shape or mask.dtype != torch.bool:
            raise ValueError(f"{type(self).__name__}: mask must be bool of shape {tuple(weight.shape)}, got "
                             f"{mask.dtype} {tuple(mask.shape)}")
        self.out_features, self.in_features = weight.shape
        mask = mask.to(weight.device)
        self.weight = nn.Parameter((weight.detach() * mask).contiguous())
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone())
        self.register_buffer("mask", mask)

    @property
    def density(self) -> float:
        return float(self.mask.float().mean()) if self.mask.numel() else 1.0

    def masked_weight(self) -> torch.Tensor:
        return self.weight * self.mask

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.masked_weight(), self.bias)

    def to_dense(self) -> nn.Linear:
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                           device=self.weight.device, dtype=self.weight.dtype)
        with torch.no_grad():
            linear.weight.copy_(self.masked_weight())
            if self.bias is not None:
                linear.bias.copy_(self.bias)
        return linear

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"density={self.density:.4g}")


class PseudoBlockSparseLinear(MaskedLinear):
    """For debugging: the same function as a ``BlockSparseLinear``, computed densely with a block mask."""

    def __init__(self, block_sparse_linear: BlockSparseLinear):
        matrix = block_sparse_linear.weight
        super().__init__(matrix.to_dense().detach(), block_sparse_linear.bias, matrix.element_mask())
        self.block_shape = matrix.block_shape

    def extra_repr(self) -> str:
        return super().extra_repr() + f", block_shape={self.block_shape}"


class SemiStructuredLinear(MaskedLinear):
    """``nn.Linear`` whose weight keeps N of every M consecutive weights along the input dimension (2:4).

    Training: masked dense compute (the mask is fixed; pruned weights get zero gradient). Inference on
    CUDA (no grad needed): 2:4 with fp16/bf16 uses ``torch.sparse.to_sparse_semi_structured`` when PyTorch
    supports the GPU and shape; otherwise, and on CPU, masked dense. ``use_sparse_kernels=False`` turns that
    off. A fresh layer is initialised like ``nn.Linear`` with fan_in = in_features x N / M, then pruned to
    N:M by magnitude.

    Shapes: x (*, in_features) -> (*, out_features); in_features must be a multiple of M.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, sparsity="2:4", device=None,
                 dtype=None, use_sparse_kernels: bool = True):
        n, m = parse_nm(sparsity, "SemiStructuredLinear")
        for name, value in (("in_features", in_features), ("out_features", out_features)):
            if isinstance(value, bool) or int(value) != value or value <= 0:
                raise ValueError(f"SemiStructuredLinear: {name}={value!r} must be a positive integer")
        if in_features % m:
            raise ValueError(f"SemiStructuredLinear: in_features={in_features} must be a multiple of M={m} "
                             f"for sparsity {n}:{m}")
        bound = 1.0 / math.sqrt(in_features * n / m)
        weight = torch.empty(out_features, in_features, device=device, dtype=dtype).uniform_(-bound, bound)
        bias_t = torch.empty(out_features, device=device, dtype=dtype).uniform_(-bound, bound) if bias else None
        super().__init__(weight, bias_t, nm_mask(weight, (n, m), dim=1))
        self._init_semi_structured((n, m), use_sparse_kernels)

    def _init_semi_structured(self, nm: Tuple[int, int], use_sparse_kernels: bool) -> None:
        self.sparsity = nm
        self.use_sparse_kernels = use_sparse_kernels
        self._compressed = None  # (key, compressed weight) cache for inference
        self._compress_error: Optional[str] = None

    @classmethod
    def from_dense(cls, linear: nn.Module, sparsity="2:4", *, use_sparse_kernels: bool = True,
                   mask: Optional[torch.Tensor] = None) -> "SemiStructuredLinear":
        """Prune a trained ``nn.Linear`` (or transformers ``Conv1D``) to N:M by magnitude along the inputs,
        or with a precomputed bool ``mask`` (out_features, in_features) that keeps at most N of every M
        consecutive weights along the inputs (e.g. from a Wanda score or a transposable 2:4 mask)."""
        n, m = parse_nm(sparsity, "SemiStructuredLinear.from_dense")
        dense, dense_bias = dense_weight_of(linear)
        if dense.shape[1] % m:
            raise ValueError(f"SemiStructuredLinear.from_dense: in_features={dense.shape[1]} must be a multiple of "
                             f"M={m} for sparsity {n}:{m}")
        if mask is None:
            mask = nm_mask(dense, (n, m), dim=1)
        else:
            if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.shape != dense.shape:
                got = f"{mask.dtype} {tuple(mask.shape)}" if isinstance(mask, torch.Tensor) else type(mask).__name__
                raise ValueError(f"SemiStructuredLinear.from_dense: mask must be bool of shape {tuple(dense.shape)} "
                                 f"(out_features, in_features), got {got}")
            most = int(mask.reshape(-1, m).sum(1).max()) if mask.numel() else 0
            if most > n:
                raise ValueError(f"SemiStructuredLinear.from_dense: mask keeps {most} weights in a group of M={m} "
                                 f"consecutive inputs; sparsity {n}:{m} allows at most N={n}")
        layer = cls.__new__(cls)
        MaskedLinear.__init__(layer, dense.detach(), dense_bias, mask.to(dense.device))
        layer._init_semi_structured((n, m), use_sparse_kernels)
        return layer

    def _semi_structured_weight(self, x: torch.Tensor):
        """The compressed 2:4 weight if PyTorch's sparse kernels can run this call, else None."""
        if not (self.use_sparse_kernels and x.is_cuda and self.sparsity == (2, 4) and self._compress_error is None
                and x.dtype in (torch.float16, torch.bfloat16) and x.dtype == self.weight.dtype
                and not (torch.is_grad_enabled() and (self.weight.requires_grad or x.requires_grad))):
            return None
        key = (self.weight._version, self.mask._version, self.weight.data_ptr(), self.weight.dtype)
        if self._compressed is None or self._compressed[0] != key:
            try:
                from torch.sparse import to_sparse_semi_structured
                compressed = to_sparse_semi_structured(self.masked_weight().detach())
            except (RuntimeError, ValueError, NotImplementedError) as error:
                self._compress_error = str(error)
                warnings.warn(f"SemiStructuredLinear: PyTorch's semi-structured sparse path is not available here "
                              f"({error}); using masked dense compute", RuntimeWarning, stacklevel=3)
                return None
            self._compressed = (key, compressed)
        return self._compressed[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        compressed = self._semi_structured_weight(x)
        if compressed is not None:
            try:
                lead = x.shape[:-1]
                y = F.linear(x.reshape(-1, self.in_features), compressed, self.bias)
                return y.view(*lead, self.out_features)
            except (RuntimeError, ValueError, NotImplementedError) as error:
                self._compress_error = str(error)
                warnings.warn(f"SemiStructuredLinear: PyTorch's semi-structured sparse product failed ({error}); "
                              f"using masked dense compute", RuntimeWarning, stacklevel=2)
        return super().forward(x)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", sparsity={self.sparsity[0]}:{self.sparsity[1]}"
