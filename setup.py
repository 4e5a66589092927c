"""Build of pytorch_block_sparse_ng: the Python package, plus the CUDA extension ``_C`` when it can be built.

Knobs (environment variables):
  PYTORCH_BLOCK_SPARSE_NG_BUILD_CUDA  auto (default): build the extension if torch is a CUDA build and nvcc
                                      and the CUTLASS headers are found; 0: never; 1: always (fail loudly).
  PYTORCH_BLOCK_SPARSE_NG_CUDA_ARCHS  arch list, default "80;90a".
  MAX_JOBS                            parallel compile jobs (ninja).
  CUDA_HOME, CUTLASS_DIR              where nvcc and the CUTLASS source tree are (found automatically).
Whether to build never depends on a GPU being present (torch.cuda.is_available() is not consulted).
"""

import glob
import os

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))
CUDA_SOURCES = sorted(glob.glob(os.path.join("cuda", "**", "*.cu"), recursive=True)
                      + glob.glob(os.path.join("cuda", "**", "*.cpp"), recursive=True))


def cuda_extension_plan():
    """-> (ext_modules, cmdclass, reason): reason says why no extension is built."""
    mode = os.environ.get("PYTORCH_BLOCK_SPARSE_NG_BUILD_CUDA", "auto")
    if mode == "0":
        return [], {}, "PYTORCH_BLOCK_SPARSE_NG_BUILD_CUDA=0"
    if not CUDA_SOURCES:
        return [], {}, "no CUDA sources in cuda/"
    try:
        import torch
    except ImportError:
        return [], {}, "torch is not importable in the build environment (use pip install --no-build-isolation)"
    if torch.version.cuda is None:
        return [], {}, f"torch {torch.__version__} is a CPU-only build"
    import sys

    sys.path.insert(0, HERE)  # PEP 517 builds (pip install) do not put setup.py's folder on sys.path
    from cuda_build import extension_config  # noqa: E402  (kept apart: only needed for CUDA builds)

    return extension_config(HERE, CUDA_SOURCES)


ext_modules, cmdclass, reason = cuda_extension_plan()
if not ext_modules:
    if os.environ.get("PYTORCH_BLOCK_SPARSE_NG_BUILD_CUDA") == "1":
        raise RuntimeError(f"PYTORCH_BLOCK_SPARSE_NG_BUILD_CUDA=1 but the CUDA extension cannot be built: {reason}")
    print(f"[pytorch_block_sparse_ng] not building the CUDA extension ({reason}); "
          "installing the pure-PyTorch package")

setup(
    name="pytorch_block_sparse_ng",
    version="0.2.0.dev0",
    description="Block-sparse and 2:4 sparse nn.Linear replacements for PyTorch, with a regex model patcher",
    long_description=open(os.path.join(HERE, "README.md"), encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="BSD-3-Clause",
    packages=find_packages(include=["pytorch_block_sparse_ng", "pytorch_block_sparse_ng.*"]),
    python_requires=">=3.10",
    install_requires=["torch>=2.4", "networkx", "regex", "tqdm"],
    extras_require={
        "transformers": ["transformers>=4.40"],
        "test": ["pytest", "transformers>=4.40", "accelerate", "safetensors", "nbclient", "nbformat", "ipykernel",
                 "matplotlib", "jupytext"],
        "benchmarks": ["matplotlib"],
    },
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    zip_safe=False,
)
