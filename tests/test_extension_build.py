"""What the built CUDA extension holds, checked without a GPU: tensor-core instructions in its SASS.

Runs wherever the extension is built (CI builds it for sm_80 and sm_90a); skips with a reason otherwise.
"""

import glob
import os
import re
import shutil
import subprocess

import pytest

import pytorch_block_sparse_ng

PACKAGE_DIR = os.path.dirname(pytorch_block_sparse_ng.__file__)
EXTENSIONS = glob.glob(os.path.join(PACKAGE_DIR, "_C*.so"))


def _cuobjdump():
    """triton (a torch dependency) ships cuobjdump and nvdisasm; the CUDA toolkit here does not."""
    try:
        import triton
    except ImportError:
        triton = None
    if triton is not None:
        tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        if os.path.exists(tool):
            return tool
    return shutil.which("cuobjdump")


@pytest.fixture(scope="module")
def sass_by_arch():
    if not EXTENSIONS:
        pytest.skip("the CUDA extension is not built here (CPU-only torch, or PYTORCH_BLOCK_SPARSE_NG_BUILD_CUDA=0)")
    tool = _cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump found (it comes with triton)")
    env = dict(os.environ, PATH=os.path.dirname(tool) + os.pathsep + os.environ.get("PATH", ""))
    out = subprocess.run([tool, "--dump-sass", EXTENSIONS[0]], capture_output=True, text=True, env=env, check=True).stdout
    by_arch = {}
    for chunk in re.split(r"\n(?=\s*Fatbin elf code:)", out):
        arch = re.search(r"arch = (sm_\w+)", chunk)
        if arch:
            by_arch[arch.group(1)] = by_arch.get(arch.group(1), "") + chunk
    return by_arch


def _built_archs():
    try:
        from pytorch_block_sparse_ng import _build_info
    except ImportError:
        return None
    return [a.strip() for a in _build_info.ARCHS.split(";")]


def test_every_built_arch_has_tensor_core_kernels(sass_by_arch):
    archs = _built_archs() or ["80", "90a"]
    for arch in archs:
        sass = sass_by_arch.get(f"sm_{arch}")
        assert sass is not None, f"no sm_{arch} code in the extension (built: {sorted(sass_by_arch)})"
        assert len(re.findall(r"\bHMMA\.16816\.F32", sass)) > 0, f"sm_{arch}: no mma.sync (HMMA) instructions"
        for product in ("dsd", "dds", "sdd"):
            assert re.search(rf"Function : \S*{product}_kernel", sass), f"sm_{arch}: no {product} kernel"


def test_hopper_build_has_wgmma(sass_by_arch):
    if "sm_90a" not in sass_by_arch:
        pytest.skip("the extension was built without sm_90a")
    assert re.search(r"\bHGMMA\.64x\d+x16\.F32", sass_by_arch["sm_90a"]), "sm_90a: no wgmma (HGMMA) instructions"
