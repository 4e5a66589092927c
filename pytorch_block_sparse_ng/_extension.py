"""Loads the compiled CUDA kernels (``pytorch_block_sparse_ng._C``) once, if they were built.

A package installed without the extension (CPU-only torch, or the build switched off) uses the reference
path silently. An extension that exists but cannot load (built for another torch, Python or CUDA) gives one
warning that quotes how it was built and how to rebuild, then the reference path is used.
"""

from __future__ import annotations

import glob
import os
import warnings

_UNLOADED = object()
_ops = _UNLOADED

REBUILD_HINT = ("rebuild it with `pip install --no-build-isolation -e .` in the source tree "
                "(see doc/user_guide.md, 'Building the CUDA extension')")


def _extension_file_exists() -> bool:
    here = os.path.dirname(__file__)
    return bool(glob.glob(os.path.join(here, "_C*.so")) or glob.glob(os.path.join(here, "_C*.pyd")))


def get():
    """The kernel ops module (``_ops``) or None when the extension is absent or unusable."""
    global _ops
    if _ops is _UNLOADED:
        _ops = None
        if _extension_file_exists():
            try:
                from . import _ops as ops  # the only importer of _C
                _ops = ops
            except (ImportError, OSError, RuntimeError) as error:
                warnings.warn(f"pytorch_block_sparse_ng: the CUDA extension exists but cannot be loaded ({error}); "
                              f"falling back to the pure-PyTorch reference path; {REBUILD_HINT}", RuntimeWarning,
                              stacklevel=2)
    return _ops
