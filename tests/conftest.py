"""Shared test helpers: tolerances, skip markers and small factories."""

import pytest
import torch

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none visible)")


def dtype_tols(dtype: torch.dtype) -> dict:
    """rtol/atol for comparing a same-dtype computation with an exact one (float64)."""
    return {
        torch.float64: dict(rtol=1e-10, atol=1e-10),
        torch.float32: dict(rtol=1e-5, atol=1e-5),
        torch.bfloat16: dict(rtol=2e-2, atol=2e-2),
        torch.float16: dict(rtol=2e-3, atol=2e-3),
    }[dtype]


@pytest.fixture
def generator():
    return torch.Generator().manual_seed(1234)
