"""pytorch_block_sparse_ng: block-sparse and N:M sparse replacements for nn.Linear, and the tools to put
them into real models (regex patcher, pruning masks)."""

from .backend import get_backend, kernels_available, set_backend, use_backend
from .functional import BlockSparseLinearFunction, block_sparse_linear
from .layout import BlockSparseMatrix
from .masks import (block_mask_by_magnitude, block_scores, expand_block_mask, mask_density, nm_mask, parse_nm,
                    top_blocks, vector_mask)
from .modules import BlockSparseLinear, MaskedLinear, PseudoBlockSparseLinear, SemiStructuredLinear
from .patcher import BlockSparseModelPatcher, ModelPatcher, PatchRecord, PatchReport
from .pruning import (GradualPruner, GradualPruningCallback, LayerMask, MagnitudeSparseOptimizerStrategy,
                      PruningResult, RigLSparseOptimizerStrategy, SparseOptimizer, SparseOptimizerCallback,
                      apply_masks, collect_input_norms, compare_transposable, compute_masks, convert_masked_model,
                      cubic_density, drop_fraction_schedule, kept_magnitude, prune_model, remove_masks,
                      transposable_nm_mask)
from .serialization import (from_pretrained, load_sparse_state_dict, record_layout, restore_sparse_layers,
                            save_pretrained, save_sparse_state_dict, sparse_layout)

__version__ = "0.2.0.dev0"

__all__ = [
    "BlockSparseMatrix",
    "BlockSparseLinear",
    "BlockSparseLinearFunction",
    "SemiStructuredLinear",
    "PseudoBlockSparseLinear",
    "MaskedLinear",
    "ModelPatcher",
    "BlockSparseModelPatcher",
    "PatchRecord",
    "PatchReport",
    "block_sparse_linear",
    "nm_mask",
    "parse_nm",
    "block_scores",
    "block_mask_by_magnitude",
    "top_blocks",
    "expand_block_mask",
    "vector_mask",
    "mask_density",
    "set_backend",
    "get_backend",
    "use_backend",
    "kernels_available",
    "sparse_layout",
    "record_layout",
    "restore_sparse_layers",
    "save_sparse_state_dict",
    "load_sparse_state_dict",
    "save_pretrained",
    "from_pretrained",
    "prune_model",
    "compute_masks",
    "PruningResult",
    "LayerMask",
    "collect_input_norms",
    "apply_masks",
    "remove_masks",
    "convert_masked_model",
    "GradualPruner",
    "GradualPruningCallback",
    "cubic_density",
    "SparseOptimizer",
    "SparseOptimizerCallback",
    "MagnitudeSparseOptimizerStrategy",
    "RigLSparseOptimizerStrategy",
    "drop_fraction_schedule",
    "transposable_nm_mask",
    "kept_magnitude",
    "compare_transposable",
    "__version__",
]
