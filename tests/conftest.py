"""Shared test helpers: tolerances, skip markers and small factories."""

import pytest
import torch
from torch import nn

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


class RegressionData(torch.utils.data.Dataset):
    """32 reproducible (x, labels) pairs for Trainer tests: x (32,), labels (n_out,)."""

    def __init__(self, n_out: int):
        self.n_out = n_out

    def __len__(self):
        return 32

    def __getitem__(self, i):
        gen = torch.Generator().manual_seed(i)
        return dict(x=torch.randn(32, generator=gen), labels=torch.randn(self.n_out, generator=gen))


class MSEModel(nn.Module):
    """Wraps ``net`` into the Trainer's convention: forward(x, labels) -> {"loss": ...}."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, x, labels):
        return dict(loss=nn.functional.mse_loss(self.net(x), labels))


def trainer_args(transformers, tmp_path, **overrides):
    """Small, quiet CPU TrainingArguments."""
    kwargs = dict(output_dir=str(tmp_path), per_device_train_batch_size=4, learning_rate=1e-2, report_to=[],
                  save_strategy="no", logging_strategy="no", use_cpu=True, disable_tqdm=True)
    kwargs.update(overrides)
    return transformers.TrainingArguments(**kwargs)
