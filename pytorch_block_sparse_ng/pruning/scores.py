"""Importance scores for pruning: weight magnitude, and Wanda (|W| times the input activation norm).

Wanda (Sun et al. 2023, "A Simple and Effective Pruning Approach for Large Language Models") scores weight
W[i, j] of a linear layer by |W[i, j]| * ||X[:, j]||_2, where X stacks every input row the layer saw over a
few calibration batches. ``collect_input_norms`` gathers ||X[:, j]||_2 with forward hooks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Dict, Iterable, Optional

import torch
from torch import nn

from ..modules import _is_hf_conv1d, dense_weight_of

__all__ = ["SCORES", "collect_input_norms", "element_scores", "linear_layers"]

SCORES = ("l2", "l1", "wanda")


def linear_layers(model: nn.Module) -> Dict[str, nn.Module]:
    """Qualified name -> module of every ``nn.Linear`` and transformers ``Conv1D`` of ``model`` (each module once,
    under its first name)."""
    return {name: module for name, module in model.named_modules()
            if name and (isinstance(module, nn.Linear) or _is_hf_conv1d(module))}


def _default_forward(model: nn.Module, batch: Any) -> Any:
    if isinstance(batch, Mapping):  # a dict, or transformers' BatchEncoding (a UserDict)
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


@torch.no_grad()
def collect_input_norms(model: nn.Module, batches: Iterable[Any], names: Optional[Iterable[str]] = None,
                        forward: Optional[Callable[[nn.Module, Any], Any]] = None) -> Dict[str, torch.Tensor]:
    """Run ``model`` over calibration ``batches`` and return, for each linear layer, the L2 norm of every input
    feature over all rows it saw: name -> fp32 (in_features,).

    names: the layers to watch (default: every nn.Linear / Conv1D). forward(model, batch) runs one batch
    (default: ``model(**batch)`` for a dict or other Mapping such as a tokenizer's output, ``model(*batch)``
    for a tuple/list, else ``model(batch)``).
    The model is run under ``torch.no_grad`` in its current train/eval mode; hooks are removed afterwards.
    """
    layers = linear_layers(model)
    if names is not None:
        names = list(names)
        missing = [n for n in names if n not in layers]
        if missing:
            raise ValueError(f"collect_input_norms: names={missing} are not nn.Linear/Conv1D layers of "
                             f"{type(model).__name__}")
        layers = {n: layers[n] for n in names}
    forward = forward or _default_forward
    sums: Dict[str, torch.Tensor] = {}

    def make_hook(name):
        def hook(module, args):
            x = args[0].detach()
            sq = x.reshape(-1, x.shape[-1]).float().pow(2).sum(0)
            sums[name] = sq if name not in sums else sums[name] + sq
        return hook

    handles = [module.register_forward_pre_hook(make_hook(name)) for name, module in layers.items()]
    try:
        n_batches = 0
        for batch in batches:
            forward(model, batch)
            n_batches += 1
    finally:
        for handle in handles:
            handle.remove()
    if n_batches == 0:
        raise ValueError("collect_input_norms: batches is empty; give at least one calibration batch")
    unused = [n for n in layers if n not in sums]
    if unused:
        raise ValueError(f"collect_input_norms: layers {unused} never ran on the calibration batches")
    return {name: value.sqrt() for name, value in sums.items()}


def element_scores(module: nn.Module, score: str = "l2", input_norm: Optional[torch.Tensor] = None,
                   weight: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Non-negative fp32 importance of every weight of a linear layer, shape (out_features, in_features).

    score: "l2" -> W², "l1" -> |W| (so a block's sum is its squared L2 / its L1 norm), "wanda" -> |W| *
    input_norm[None, :] (``input_norm`` from ``collect_input_norms``). ``weight`` overrides the layer's own
    weight (out_features, in_features), e.g. the masked weight of a parametrized layer.
    """
    if weight is None:
        weight, _ = dense_weight_of(module)
    w = weight.detach().float()
    if score == "l2":
        return w.pow(2)
    if score == "l1":
        return w.abs()
    if score == "wanda":
        if input_norm is None:
            raise ValueError("element_scores: score='wanda' needs input_norm (run collect_input_norms on calibration "
                             "batches, or pass calibration= to prune_model)")
        if tuple(input_norm.shape) != (w.shape[1],):
            raise ValueError(f"element_scores: input_norm.shape={tuple(input_norm.shape)} must be "
                             f"(in_features,)=({w.shape[1]},)")
        return w.abs() * input_norm.to(w.device, torch.float32)[None, :]
    raise ValueError(f"element_scores: score={score!r} must be one of {SCORES}")
