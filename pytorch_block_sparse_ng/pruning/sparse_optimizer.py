"""Dynamic sparse training of BlockSparseLinear layers: the pattern changes while the model trains.

Usage (the shape of pytorch_block_sparse 0.1.2's ``SparseOptimizer``):

    objs = SparseOptimizer.sparse_objects(model)          # every BlockSparseMatrix of the model
    so = SparseOptimizer(objs, lr=cleanup_ratio)          # lr = fraction of blocks replaced per update
    so.attach_optimizer(adam)                             # its state for replaced blocks is reset
    for step ...:
        loss.backward(); adam.step(); adam.zero_grad()
        so.step()                                         # drop the weakest blocks, grow new ones

Each update of a matrix with ``nnz`` blocks and ``f`` free positions drops the ``k = min(floor(fraction x nnz),
f)`` blocks of smallest L2 norm and grows ``k`` blocks at free positions (``BlockSparseMatrix.update_pattern``,
in place: the optimizer keeps pointing at the same Parameter):

- method="magnitude" (``MagnitudeSparseOptimizerStrategy``, SET-like, the predecessor's): new positions drawn
  uniformly among the blocks that were free before the drop; new values drawn as
  ``new_coefficients_distribution``: "uniform" U(-a, a) with a = scale x std(kept values), "gaussian"
  N(scale x mean, (scale x std)²) of the kept values, or "zeros".
- method="rigl" (``RigLSparseOptimizerStrategy``, Evci et al. 2020): new positions are the free blocks (after
  the drop, so a dropped block may come straight back) whose *dense* gradient dL/dW has the largest L2 norm;
  new blocks start at zero ("zeros", as in the paper) so they do not change the function, and grow from
  their first update on. The dense gradient dyᵀx of a layer is not computed by the block-sparse backward, so
  the optimizer records it with hooks on the layers (``model=`` is needed): a forward hook on each
  BlockSparseLinear registers a hook on its output that adds dyᵀx (fp32, summed over micro-batches, so
  gradient accumulation is handled) into a dense (out, in) buffer -- only during the backward passes that
  precede an update (``update_frequency``), and the buffer is freed after the update.

Optimizer state: for every attached optimizer (any torch.optim optimizer, e.g. Adam, AdamW -- transformers'
Trainer uses torch's AdamW -- or SGD with momentum) every per-element state tensor of the blocks' Parameter
(Adam's exp_avg / exp_avg_sq / max_exp_avg_sq, SGD's momentum_buffer) is rearranged with the slot mapping of
``update_pattern``: a surviving block's state moves with it to its new slot, a new block's state is zero.
Scalar state (Adam's ``step``) is left alone. ``param.grad``, if present, is rearranged the same way.

With transformers' Trainer: ``Trainer(..., callbacks=[SparseOptimizerCallback(so)])`` attaches the Trainer's
optimizer when training starts and calls ``so.step()`` after every optimizer step.

Drop fraction: ``lr`` x ``drop_schedule(t)`` where t counts ``step()`` calls: "constant", "cosine"
(RigL's 0.5 (1 + cos(pi t / total_steps)), 0 after), "linear", or a callable t -> multiplier.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable, Dict, List, Optional, Union

import torch
from torch import nn

from ..layout import BlockSparseMatrix
from ..modules import BlockSparseLinear

__all__ = ["SparseOptimizer", "SparseOptimizerStrategy", "MagnitudeSparseOptimizerStrategy",
           "RigLSparseOptimizerStrategy", "DenseGradientRecorder", "drop_fraction_schedule",
           "move_optimizer_state", "SparseOptimizerCallback"]

_DISTRIBUTIONS = ("uniform", "gaussian", "zeros")


class SparseOptimizerStrategy:
    """Decides which blocks of one BlockSparseMatrix to drop and where to grow; ``run`` applies it in place
    and returns the slot mapping of ``update_pattern`` (for each new slot, the old slot or -1 for a new block)."""

    def __init__(self, cleanup_ratio: float, new_coefficients_distribution: str = "uniform",
                 new_coefficients_scale: float = 0.1, generator: Optional[torch.Generator] = None):
        owner = type(self).__name__
        if not 0.0 <= float(cleanup_ratio) <= 1.0:
            raise ValueError(f"{owner}: cleanup_ratio={cleanup_ratio} must be in [0, 1]")
        if new_coefficients_distribution not in _DISTRIBUTIONS:
            raise ValueError(f"{owner}: new_coefficients_distribution={new_coefficients_distribution!r} must be one "
                             f"of {_DISTRIBUTIONS}")
        if not float(new_coefficients_scale) >= 0.0:
            raise ValueError(f"{owner}: new_coefficients_scale={new_coefficients_scale} must be >= 0")
        self.cleanup_ratio = float(cleanup_ratio)
        self.new_coefficients_distribution = new_coefficients_distribution
        self.new_coefficients_scale = float(new_coefficients_scale)
        self.generator = generator

    def initialize_new_blocks(self, old_data: torch.Tensor, new_data: torch.Tensor) -> None:
        """Fill ``new_data`` [n, BR, BC] in place, scaled from the kept values ``old_data``."""
        if self.new_coefficients_distribution == "zeros" or new_data.numel() == 0:
            new_data.zero_()
            return
        old = old_data.detach().float()
        mean = float(old.mean()) if old.numel() else 0.0
        std = float(old.std()) if old.numel() > 1 else 0.0
        gen_device = self.generator.device if self.generator is not None else new_data.device
        if self.new_coefficients_distribution == "gaussian":
            values = torch.randn(new_data.shape, generator=self.generator, device=gen_device)
            values = values * (std * self.new_coefficients_scale) + mean * self.new_coefficients_scale
        else:
            values = (torch.rand(new_data.shape, generator=self.generator, device=gen_device) * 2 - 1)
            values = values * (std * self.new_coefficients_scale)
        new_data.copy_(values.to(new_data))

    def grow_positions(self, matrix: BlockSparseMatrix, kept_after_drop: torch.Tensor, dropped: torch.Tensor,
                       count: int, dense_grad: Optional[torch.Tensor]) -> torch.Tensor:
        """Bool [R, C]: ``count`` positions to grow, outside ``kept_after_drop``."""
        raise NotImplementedError

    @torch.no_grad()
    def run(self, block_sparse_matrix: BlockSparseMatrix, drop_fraction: Optional[float] = None,
            dense_grad: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Drop ``floor(drop_fraction x nnz)`` blocks of smallest L2 norm (default fraction: cleanup_ratio)
        and grow as many; returns update_pattern's slot mapping [nnz] (-1 = new block)."""
        matrix = block_sparse_matrix
        fraction = self.cleanup_ratio if drop_fraction is None else float(drop_fraction)
        nnz = matrix.nnz_blocks
        old_mask = matrix.block_mask()
        free = int((~old_mask).sum())
        count = min(int(math.floor(fraction * nnz + 1e-9)), free)  # never more than there are free positions
        if count == 0:
            return torch.arange(nnz, device=matrix.device)
        weakest = matrix.block_norm().argsort(stable=True)[:count]
        dropped = torch.zeros_like(old_mask)
        dropped[matrix.row_indices[weakest].long(), matrix.col_indices[weakest].long()] = True
        kept_after_drop = old_mask & ~dropped
        grown = self.grow_positions(matrix, kept_after_drop, dropped, count, dense_grad)
        new_mask = kept_after_drop | grown
        regrown = grown & dropped  # RigL may grow a block it just dropped: it restarts as a new block
        kept_values = matrix.data[~dropped[matrix.row_indices.long(), matrix.col_indices.long()]]
        n_new = int((grown & ~old_mask).sum())
        new_values = torch.empty((n_new, *matrix.block_shape), device=matrix.device, dtype=matrix.dtype)
        self.initialize_new_blocks(kept_values, new_values)
        source = matrix.update_pattern(new_mask, new_values)
        if regrown.any():
            slot_of = torch.full(matrix.grid, -1, dtype=torch.long, device=matrix.device)
            slot_of[matrix.row_indices.long(), matrix.col_indices.long()] = torch.arange(nnz, device=matrix.device)
            slots = slot_of[regrown]
            fresh = torch.empty((slots.numel(), *matrix.block_shape), device=matrix.device, dtype=matrix.dtype)
            self.initialize_new_blocks(kept_values, fresh)
            matrix.data[slots] = fresh
            source[slots] = -1
        return source


class MagnitudeSparseOptimizerStrategy(SparseOptimizerStrategy):
    """Drop the blocks of smallest norm, grow at uniformly random free positions (the predecessor's method)."""

    def grow_positions(self, matrix, kept_after_drop, dropped, count, dense_grad):
        candidates = (~(kept_after_drop | dropped)).flatten().nonzero().squeeze(1)
        gen_device = self.generator.device if self.generator is not None else "cpu"
        pick = torch.randperm(candidates.numel(), generator=self.generator, device=gen_device)[:count]
        grown = torch.zeros(kept_after_drop.numel(), dtype=torch.bool, device=kept_after_drop.device)
        grown[candidates[pick.to(candidates.device)]] = True
        return grown.view_as(kept_after_drop)


class RigLSparseOptimizerStrategy(SparseOptimizerStrategy):
    """Drop the blocks of smallest norm, grow where the dense gradient's block L2 norm is largest (RigL).
    New blocks start at zero by default."""

    def __init__(self, cleanup_ratio: float, new_coefficients_distribution: str = "zeros",
                 new_coefficients_scale: float = 0.1, generator: Optional[torch.Generator] = None):
        super().__init__(cleanup_ratio, new_coefficients_distribution, new_coefficients_scale, generator)

    def grow_positions(self, matrix, kept_after_drop, dropped, count, dense_grad):
        if dense_grad is None:
            raise ValueError("RigLSparseOptimizerStrategy.run: dense_grad (the dense (out, in) gradient of the "
                             "weight) is required to choose where to grow")
        if tuple(dense_grad.shape) != tuple(matrix.shape):
            raise ValueError(f"RigLSparseOptimizerStrategy.run: dense_grad.shape={tuple(dense_grad.shape)} must be "
                             f"the matrix shape {tuple(matrix.shape)}")
        (n_rows, n_cols), (br, bc) = matrix.grid, matrix.block_shape
        norms = dense_grad.float().reshape(n_rows, br, n_cols, bc).pow(2).sum(dim=(1, 3)).sqrt()
        norms = norms.masked_fill(kept_after_drop, -1.0).flatten()
        grown = torch.zeros_like(norms, dtype=torch.bool)
        grown[norms.topk(count).indices] = True
        return grown.view_as(kept_after_drop)


def drop_fraction_schedule(kind: Union[str, Callable[[int], float]] = "constant",
                           total_steps: Optional[int] = None) -> Callable[[int], float]:
    """t -> multiplier of the initial drop fraction: "constant" (1), "cosine" (0.5 (1 + cos(pi t / T)) up to
    T = total_steps, then 0), "linear" (1 - t / T, then 0), or a callable returned as is."""
    if callable(kind):
        return kind
    if kind == "constant":
        return lambda t: 1.0
    if kind not in ("cosine", "linear"):
        raise ValueError(f"drop_fraction_schedule: kind={kind!r} must be 'constant', 'cosine', 'linear' or a "
                         f"callable")
    if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps <= 0:
        raise ValueError(f"drop_fraction_schedule: total_steps={total_steps!r} must be a positive int for "
                         f"kind={kind!r}")
    if kind == "cosine":
        return lambda t: 0.5 * (1.0 + math.cos(math.pi * t / total_steps)) if t < total_steps else 0.0
    return lambda t: max(0.0, 1.0 - t / total_steps)


class DenseGradientRecorder:
    """Records the dense weight gradient dL/dW = dyᵀx (out, in), fp32, of BlockSparseLinear layers while
    ``enabled``: a forward hook registers a hook on the layer's output that adds dyᵀx into ``grads[matrix]``
    during backward (summed over backward passes until ``clear``)."""

    def __init__(self, model: nn.Module, matrices: List[BlockSparseMatrix]):
        wanted = {id(m) for m in matrices}
        self.owners: Dict[int, BlockSparseLinear] = {}
        for module in model.modules():
            if isinstance(module, BlockSparseLinear) and id(module.weight) in wanted:
                self.owners.setdefault(id(module.weight), module)
        missing = [m for m in matrices if id(m) not in self.owners]
        if missing:
            raise ValueError(f"DenseGradientRecorder: {len(missing)} of the sparse objects are not the weight of a "
                             f"BlockSparseLinear of {type(model).__name__} (first: {missing[0]!r}); pass the model "
                             f"that uses them")
        self.enabled = False
        self.grads: Dict[int, torch.Tensor] = {}
        self.handles = [module.register_forward_hook(self._forward_hook) for module in self.owners.values()]

    def _forward_hook(self, module, args, output):
        if not (self.enabled and torch.is_grad_enabled() and output.requires_grad):
            return
        x = args[0].detach()
        key = id(module.weight)

        def backward_hook(grad_output):
            dy = grad_output.detach().reshape(-1, grad_output.shape[-1]).float()
            grad = dy.t() @ x.reshape(-1, x.shape[-1]).float()
            self.grads[key] = grad if key not in self.grads else self.grads[key] + grad

        output.register_hook(backward_hook)

    def get(self, matrix: BlockSparseMatrix) -> Optional[torch.Tensor]:
        return self.grads.get(id(matrix))

    def clear(self) -> None:
        self.grads.clear()

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []


@torch.no_grad()
def move_optimizer_state(optimizer: torch.optim.Optimizer, param: torch.Tensor, source: torch.Tensor) -> bool:
    """Rearrange ``optimizer``'s per-element state of ``param`` (and param.grad) after ``update_pattern``:
    new slot i takes old slot source[i], or zeros where source[i] == -1. Returns False if the optimizer
    does not hold ``param``."""
    if not any(p is param for group in optimizer.param_groups for p in group["params"]):
        return False
    keep = source >= 0

    def moved(tensor):
        result = torch.zeros_like(tensor)
        result[keep] = tensor[source[keep]]
        return result

    for key, value in optimizer.state.get(param, {}).items():
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            continue  # scalar state such as Adam's "step"
        if value.shape != param.shape:
            raise ValueError(f"SparseOptimizer: state {key!r} of {type(optimizer).__name__} has shape "
                             f"{tuple(value.shape)}, not the blocks' shape {tuple(param.shape)}; cannot move it "
                             f"with the blocks")
        value.copy_(moved(value))
    if param.grad is not None:
        param.grad.copy_(moved(param.grad))
    return True


class SparseOptimizer:
    """Prune-and-regrow for BlockSparseMatrix objects (see the module docstring).

    Args:
        sparse_objects: BlockSparseMatrix objects (``SparseOptimizer.sparse_objects(model)``).
        lr: the fraction of each matrix's blocks replaced at an update (the predecessor's cleanup ratio).
        method: "magnitude" (random growth) or "rigl" (gradient growth; needs ``model``).
        new_coefficients_scale, new_coefficients_distribution: initialisation of new blocks (default
            distribution: "uniform" for magnitude, "zeros" for rigl).
        model: the model whose BlockSparseLinear layers own the matrices (for "rigl").
        drop_schedule, total_steps: multiplier of ``lr`` over the step() calls (``drop_fraction_schedule``).
        update_frequency: update on every ``update_frequency``-th step() call (1: every call).
        generator: torch.Generator for random growth and new values.
    """

    METHODS = ("magnitude", "rigl")
    COEFFICIENTS_DISTRIBUTION = _DISTRIBUTIONS
    allowed_keys = {"lr", "method", "new_coefficients_scale", "new_coefficients_distribution"}

    def __init__(self, sparse_objects, lr: float = 1e-1, method: str = "magnitude",
                 new_coefficients_scale: float = 0.1, new_coefficients_distribution: Optional[str] = None, *,
                 model: Optional[nn.Module] = None, drop_schedule: Union[str, Callable[[int], float]] = "constant",
                 total_steps: Optional[int] = None, update_frequency: int = 1,
                 generator: Optional[torch.Generator] = None):
        if not 0.0 <= float(lr) <= 1.0:
            raise ValueError(f"SparseOptimizer: lr={lr} (the fraction of blocks replaced) must be in [0, 1]")
        if isinstance(update_frequency, bool) or not isinstance(update_frequency, int) or update_frequency < 1:
            raise ValueError(f"SparseOptimizer: update_frequency={update_frequency!r} must be an int >= 1")
        self.defaults = dict(lr=float(lr), method=method, new_coefficients_scale=new_coefficients_scale,
                             new_coefficients_distribution=new_coefficients_distribution)
        self.param_groups: List[Dict[str, Any]] = []
        self.attached_optimizers: List[torch.optim.Optimizer] = []
        self.schedule = drop_fraction_schedule(drop_schedule, total_steps)
        self.update_frequency = update_frequency
        self.generator = generator
        self.model = model
        self.recorder: Optional[DenseGradientRecorder] = None
        self.step_count = 0
        self.add_param_group(dict(sparse_objects=sparse_objects))
        self._arm()

    @staticmethod
    def sparse_objects(model: nn.Module) -> List[BlockSparseMatrix]:
        """Every BlockSparseMatrix of ``model`` (each once)."""
        return [m for m in model.modules() if isinstance(m, BlockSparseMatrix)]

    def add_param_group(self, sparse_objects_group: Dict[str, Any]) -> None:
        """Add matrices with their own settings: dict(sparse_objects=[...], lr=..., method=..., ...)."""
        if not isinstance(sparse_objects_group, dict) or "sparse_objects" not in sparse_objects_group:
            raise TypeError("SparseOptimizer.add_param_group: the group must be a dict with a 'sparse_objects' key")
        unknown = set(sparse_objects_group) - self.allowed_keys - {"sparse_objects"}
        if unknown:
            raise ValueError(f"SparseOptimizer.add_param_group: unknown keys {sorted(unknown)}; known keys: "
                             f"{sorted(self.allowed_keys | {'sparse_objects'})}")
        group = dict(self.defaults)
        group.update(sparse_objects_group)
        objects = group["sparse_objects"]
        objects = [objects] if isinstance(objects, BlockSparseMatrix) else list(objects)
        for obj in objects:
            if not isinstance(obj, BlockSparseMatrix):
                raise TypeError(f"SparseOptimizer: sparse_objects must be BlockSparseMatrix objects, got "
                                f"{type(obj).__name__}")
        seen = {id(o) for g in self.param_groups for o in g["sparse_objects"]}
        if any(id(o) in seen for o in objects):
            raise ValueError("SparseOptimizer.add_param_group: some sparse objects appear in more than one group")
        if group["method"] not in self.METHODS:
            raise ValueError(f"SparseOptimizer: method={group['method']!r} must be one of {self.METHODS}")
        if not 0.0 <= float(group["lr"]) <= 1.0:
            raise ValueError(f"SparseOptimizer: lr={group['lr']} (the fraction of blocks replaced) must be in [0, 1]")
        if group["new_coefficients_distribution"] is None:
            group["new_coefficients_distribution"] = "zeros" if group["method"] == "rigl" else "uniform"
        strategy_class = RigLSparseOptimizerStrategy if group["method"] == "rigl" else \
            MagnitudeSparseOptimizerStrategy
        group["strategy"] = strategy_class(group["lr"], group["new_coefficients_distribution"],
                                           group["new_coefficients_scale"], self.generator)
        group["sparse_objects"] = objects
        if group["method"] == "rigl":
            if self.model is None:
                raise ValueError("SparseOptimizer: method='rigl' needs model= (the model whose BlockSparseLinear "
                                 "layers own the sparse objects) to record the dense gradient")
            if self.recorder is not None:
                self.recorder.remove()
            rigl = [o for g in self.param_groups + [group] if g["method"] == "rigl" for o in g["sparse_objects"]]
            self.recorder = DenseGradientRecorder(self.model, rigl)
        self.param_groups.append(group)

    def attach_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Keep ``optimizer``'s state in step with the patterns (state of replaced blocks reset to zero)."""
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"SparseOptimizer.attach_optimizer: expected a torch.optim.Optimizer, got "
                            f"{type(optimizer).__name__}")
        if any(optimizer is o for o in self.attached_optimizers):
            warnings.warn("SparseOptimizer.attach_optimizer: optimizer already attached", UserWarning, stacklevel=2)
            return
        self.attached_optimizers.append(optimizer)

    def drop_fraction(self, group: Optional[Dict[str, Any]] = None, step: Optional[int] = None) -> float:
        """The fraction of blocks replaced at ``step`` (default: the next step() call) for ``group``."""
        group = group or self.param_groups[0]
        step = self.step_count + 1 if step is None else step
        return float(group["lr"]) * float(self.schedule(step))

    def _due(self, step: int) -> bool:
        return step % self.update_frequency == 0

    def _arm(self) -> None:
        if self.recorder is not None:
            nxt = self.step_count + 1
            self.recorder.enabled = self._due(nxt) and any(
                g["method"] == "rigl" and self.drop_fraction(g, nxt) > 0 for g in self.param_groups)

    def clean(self, matrix: BlockSparseMatrix, group: Dict[str, Any], fraction: float) -> torch.Tensor:
        """Update one matrix and the attached optimizers' state; returns the slot mapping."""
        dense_grad = None
        if group["method"] == "rigl":
            dense_grad = self.recorder.get(matrix)
            if dense_grad is None:
                raise ValueError("SparseOptimizer.step: no dense gradient was recorded for a 'rigl' matrix: call "
                                 "loss.backward() (through the model given as model=) before step()")
        source = group["strategy"].run(matrix, fraction, dense_grad)
        if not self.attached_optimizers:
            warnings.warn("SparseOptimizer.step: no optimizer attached; optimizer state of replaced blocks is not "
                          "reset (call attach_optimizer)", UserWarning, stacklevel=3)
            return source
        found = [move_optimizer_state(opt, matrix.data, source) for opt in self.attached_optimizers]
        if not any(found):
            raise ValueError(f"SparseOptimizer.step: the blocks of {matrix!r} are in none of the attached optimizers")
        return source

    def step(self) -> bool:
        """Call once per training step, after the optimizer's step. Returns True if the patterns changed."""
        self.step_count += 1
        updated = False
        if self._due(self.step_count):
            for group in self.param_groups:
                fraction = self.drop_fraction(group, self.step_count)
                if fraction <= 0.0:
                    continue
                for matrix in group["sparse_objects"]:
                    self.clean(matrix, group, fraction)
                updated = True
            if self.recorder is not None:
                self.recorder.clear()
        self._arm()
        return updated

    def state_dict(self) -> Dict[str, Any]:
        return dict(step_count=self.step_count)

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.step_count = int(state["step_count"])
        self._arm()


_CALLBACK_CLASS = None


def SparseOptimizerCallback(sparse_optimizer: SparseOptimizer):  # noqa: N802 -- a class, built on first use
    """A ``transformers.TrainerCallback`` for dynamic sparse training under the Trainer: at the start of
    training it attaches the Trainer's optimizer (torch's AdamW by default) to ``sparse_optimizer``, and it
    calls ``sparse_optimizer.step()`` after every optimizer step (``on_step_end``; with gradient accumulation
    RigL's recorded gradient sums the micro-batches of that step). transformers is imported here only."""
    global _CALLBACK_CLASS
    if _CALLBACK_CLASS is None:
        from transformers import TrainerCallback

        class _SparseOptimizerCallback(TrainerCallback):
            def __init__(self, sparse_optimizer):
                self.sparse_optimizer = sparse_optimizer

            def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
                if optimizer is None:
                    raise ValueError("SparseOptimizerCallback: the Trainer passed no optimizer to on_train_begin")
                optimizer = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wrapper
                if not any(optimizer is o for o in self.sparse_optimizer.attached_optimizers):
                    self.sparse_optimizer.attach_optimizer(optimizer)
                return control

            def on_step_end(self, args, state, control, **kwargs):
                self.sparse_optimizer.step()
                return control

        _SparseOptimizerCallback.__name__ = _SparseOptimizerCallback.__qualname__ = "SparseOptimizerCallback"
        _CALLBACK_CLASS = _SparseOptimizerCallback
    if not isinstance(sparse_optimizer, SparseOptimizer):
        raise TypeError(f"SparseOptimizerCallback: sparse_optimizer must be a SparseOptimizer, got "
                        f"{type(sparse_optimizer).__name__}")
    return _CALLBACK_CLASS(sparse_optimizer)
