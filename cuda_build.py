"""How setup.py builds the CUDA extension ``pytorch_block_sparse_ng._C`` (only imported for CUDA builds of torch).

``extension_config(here, sources) -> (ext_modules, cmdclass, reason)``: a CUDAExtension with explicit
``-gencode`` flags, the CUTLASS/CuTe headers of the ``nvidia-cutlass`` wheel, and a generated
``pytorch_block_sparse_ng/_build_info.py`` that records the archs, torch, CUDA and CUTLASS versions (quoted by
load errors). When something is missing, ``([], {}, reason)``.

Knobs: PYTORCH_BLOCK_SPARSE_NG_CUDA_ARCHS (default "80;90a"; entries like 80, 86, 90a, 8.0, 9.0a; a "+PTX"
suffix also embeds PTX for that arch), CUDA_HOME, CUTLASS_DIR (a CUTLASS source tree), MAX_JOBS (ninja).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys

DEFAULT_ARCHS = "80;90a"
ARCHS_ENV = "PYTORCH_BLOCK_SPARSE_NG_CUDA_ARCHS"


def find_cuda_home():
    """CUDA_HOME, else /usr/local/cuda, else the folder above ``which nvcc`` (which may be a wrapper)."""
    for candidate in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if candidate and os.path.exists(os.path.join(candidate, "bin", "nvcc")):
            return candidate
    nvcc = shutil.which("nvcc")
    if nvcc:
        root = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
        if os.path.exists(os.path.join(root, "include", "cuda_runtime.h")):
            return root
    return None


def find_cutlass():
    """The CUTLASS source folder (with include/ and tools/util/include/), found without importing anything."""
    roots = []
    if os.environ.get("CUTLASS_DIR"):
        roots.append(os.environ["CUTLASS_DIR"])
    try:
        spec = importlib.util.find_spec("cutlass_library")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin:
        roots.append(os.path.join(os.path.dirname(spec.origin), "source"))
    for root in roots:
        if os.path.exists(os.path.join(root, "include", "cute", "tensor.hpp")):
            return root
    return None


def parse_archs(text):
    """"80;90a" -> [("80", False), ("90a", False)]; "8.0+PTX" -> [("80", True)]. Raises ValueError."""
    archs = []
    for item in re.split(r"[;, ]+", text.strip()):
        if not item:
            continue
        match = re.fullmatch(r"(\d)\.?(\d)([a-z]?)(\+PTX)?", item)
        if not match:
            raise ValueError(f"{ARCHS_ENV}={text!r}: {item!r} is not an arch like 80, 90a or 8.0")
        archs.append((match.group(1) + match.group(2) + match.group(3), bool(match.group(4))))
    if not archs:
        raise ValueError(f"{ARCHS_ENV}={text!r} names no arch")
    for arch, _ in archs:
        if int(arch[:2]) < 80:
            raise ValueError(f"{ARCHS_ENV}={text!r}: sm_{arch} is too old (the kernels need sm_80 or newer)")
    return archs


def gencode_flags(archs):
    flags = []
    for arch, ptx in archs:
        flags.append(f"-gencode=arch=compute_{arch},code=sm_{arch}")
        if ptx:
            flags.append(f"-gencode=arch=compute_{arch},code=compute_{arch}")
    return flags


def nvcc_version(cuda_home):
    try:
        out = subprocess.run([os.path.join(cuda_home, "bin", "nvcc"), "--version"], capture_output=True,
                             text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    match = re.search(r"release ([\d.]+), V([\d.]+)", out)
    return match.group(2) if match else "unknown"


def cutlass_version(cutlass_root):
    try:
        text = open(os.path.join(cutlass_root, "include", "cutlass", "version.h"), encoding="utf-8").read()
    except OSError:
        return "unknown"
    parts = [re.search(rf"#define CUTLASS_{p}\s+(\d+)", text) for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(m.group(1) for m in parts) if all(parts) else "unknown"


def write_build_info(here, info):
    path = os.path.join(here, "pytorch_block_sparse_ng", "_build_info.py")
    lines = ['"""Written by cuda_build.py when the CUDA extension was built (not in git)."""', ""]
    lines += [f"{key} = {value!r}" for key, value in info.items()]
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")


def extension_config(here, sources):
    """-> (ext_modules, cmdclass, reason). ``reason`` is None when the extension is configured."""
    cuda_home = find_cuda_home()
    if cuda_home is None:
        return [], {}, "nvcc not found (set CUDA_HOME, or install the CUDA toolkit at /usr/local/cuda)"
    cutlass = find_cutlass()
    if cutlass is None:
        return [], {}, ("CUTLASS/CuTe headers not found: `pip install --no-deps nvidia-cutlass==4.2.0.0` "
                        "or set CUTLASS_DIR to a CUTLASS source tree")
    try:
        archs = parse_archs(os.environ.get(ARCHS_ENV, DEFAULT_ARCHS))
    except ValueError as error:
        return [], {}, str(error)

    # torch.utils.cpp_extension reads CUDA_HOME when it is imported: set it first.
    os.environ["CUDA_HOME"] = cuda_home
    import torch
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    arch_names = ";".join(a + ("+PTX" if p else "") for a, p in archs)
    info = dict(ARCHS=arch_names, TORCH_VERSION=torch.__version__, TORCH_CUDA_VERSION=torch.version.cuda,
                NVCC_VERSION=nvcc_version(cuda_home), CUTLASS_VERSION=cutlass_version(cutlass),
                PYTHON_VERSION=".".join(map(str, sys.version_info[:3])))
    write_build_info(here, info)

    include_dirs = [os.path.join(here, "cuda"), os.path.join(cutlass, "include"),
                    os.path.join(cutlass, "tools", "util", "include")]
    archs_token = "_".join(a + ("ptx" if p else "") for a, p in archs)  # a pp-number, stringized in C++
    common = ["-O3", "-DNDEBUG", f"-DPBSNG_ARCHS_TOKEN={archs_token}"]
    if any(arch == "90a" for arch, _ in archs):
        common.append("-DPBSNG_WITH_SM90A")  # the host dispatches dsd to the wgmma kernels on sm_90
    nvcc = common + ["--expt-relaxed-constexpr", "--expt-extended-lambda",
                     "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
                     "-U__CUDA_NO_BFLOAT16_OPERATORS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
                     "-U__CUDA_NO_HALF2_OPERATORS__", "-U__CUDA_NO_BFLOAT162_OPERATORS__",
                     "-diag-suppress", "2908", "-lineinfo"] + gencode_flags(archs)
    if os.environ.get("PYTORCH_BLOCK_SPARSE_NG_NVCC_THREADS"):
        nvcc += ["--threads", os.environ["PYTORCH_BLOCK_SPARSE_NG_NVCC_THREADS"]]
    ext = CUDAExtension(
        name="pytorch_block_sparse_ng._C",
        sources=[os.path.relpath(os.path.join(here, s), here) if not os.path.isabs(s) else s for s in sources],
        include_dirs=include_dirs,
        extra_compile_args={"cxx": common + ["-g0"], "nvcc": nvcc},
    )
    return [ext], {"build_ext": BuildExtension.with_options(use_ninja=True)}, None
