"""Pruning and sparse training: one-shot pruning (magnitude / Wanda), gradual pruning with masks on dense
layers, dynamic sparse training (SparseOptimizer: SET-like and RigL), transposable 2:4 masks.
See doc/pruning.md."""

from .gradual import GradualPruner, GradualPruningCallback, cubic_density
from .masked import (MaskParametrization, apply_masks, convert_masked_model, masked_density, masked_layers,
                     remove_masks)
from .oneshot import PruningResult, compute_masks, convert_with_masks, prune_model
from .scores import collect_input_norms, element_scores
from .sparse_optimizer import (DenseGradientRecorder, MagnitudeSparseOptimizerStrategy, RigLSparseOptimizerStrategy,
                               SparseOptimizer, SparseOptimizerCallback, SparseOptimizerStrategy,
                               drop_fraction_schedule, move_optimizer_state)
from .spec import LayerMask, PruneSpec
from .transposable import compare_transposable, kept_magnitude, transposable_nm_mask, transposable_patterns

__all__ = [
    "prune_model", "compute_masks", "convert_with_masks", "PruningResult", "LayerMask", "PruneSpec",
    "collect_input_norms", "element_scores",
    "apply_masks", "convert_masked_model", "remove_masks", "masked_layers", "masked_density", "MaskParametrization",
    "GradualPruner", "GradualPruningCallback", "cubic_density",
    "SparseOptimizer", "SparseOptimizerCallback", "SparseOptimizerStrategy", "MagnitudeSparseOptimizerStrategy",
    "RigLSparseOptimizerStrategy", "DenseGradientRecorder", "drop_fraction_schedule", "move_optimizer_state",
    "transposable_nm_mask", "transposable_patterns", "kept_magnitude", "compare_transposable",
]
