#!/usr/bin/env bash
# Creates .venv in the repository root (if missing) and installs the package with its test extra into it.
#
#   bash scripts/setup_env.sh          # idempotent: a second run with nothing changed takes about a second
#
# Environment:
#   TORCH_SPEC   what pip installs for torch. Default: with nvcc on the PATH, "torch==2.14.1" (a CUDA build, so
#                that the CUDA extension is compiled: about 15 minutes on 2 cores the first time); without nvcc,
#                "torch==2.13.0" (the small CPU build). Both lie on this project's machines' disks.
#   PYTORCH_BLOCK_SPARSE_NG_BUILD_CUDA   auto (default) / 0 / 1, see setup.py; CI sets 1 so that kernel code
#                that does not compile fails the run.
#   PYTHON       the interpreter that creates the venv (default python3).
#   VENV         where the venv lives (default <repo>/.venv).
# Any other pip environment (PIP_INDEX_URL, PIP_FIND_LINKS, ...) is passed through to pip.
# The package is installed with --no-build-isolation so that setup.py sees the torch installed here (see
# setup.py for the PYTORCH_BLOCK_SPARSE_NG_BUILD_CUDA knobs); with a CPU torch no extension is built.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
if [ -z "${TORCH_SPEC:-}" ]; then
    if command -v nvcc >/dev/null 2>&1 && [ "${PYTORCH_BLOCK_SPARSE_NG_BUILD_CUDA:-auto}" != "0" ]; then
        TORCH_SPEC="torch==2.14.1"
    else
        TORCH_SPEC="torch==2.13.0"
    fi
fi
export MAX_JOBS="${MAX_JOBS:-$(nproc)}"
STAMP="$VENV/.pytorch_block_sparse_ng-setup"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

# What the install depends on: a change to any of these reinstalls the package.
fingerprint() {
    {
        echo "torch: $TORCH_SPEC"
        cd "$ROOT"
        cat setup.py pyproject.toml
        [ -f cuda_build.py ] && cat cuda_build.py
        if [ -d cuda ]; then find cuda -type f | LC_ALL=C sort | xargs -r cat; fi
        env | grep -E '^(PYTORCH_BLOCK_SPARSE_NG_BUILD_CUDA|PYTORCH_BLOCK_SPARSE_NG_CUDA_ARCHS|CUTLASS_DIR|CUDA_HOME)=' \
            | LC_ALL=C sort || true
    } | sha256sum | cut -d' ' -f1
}

want="$(fingerprint)"
if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] \
        && "$VENV/bin/python" -c "import torch, transformers, pytest, pytorch_block_sparse_ng" 2>/dev/null; then
    echo "[setup_env] $VENV is up to date"
    exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
    echo "[setup_env] creating $VENV with $("$PYTHON" --version 2>&1)"
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install --quiet)

echo "[setup_env] installing build tools and $TORCH_SPEC"
"${PIP[@]}" "setuptools>=64" wheel ninja
"${PIP[@]}" "$TORCH_SPEC"
# CUTLASS/CuTe headers for the CUDA extension; --no-deps: its Python dependencies are not needed for headers.
"${PIP[@]}" --no-deps "nvidia-cutlass==4.2.0.0"

echo "[setup_env] installing pytorch_block_sparse_ng (editable) with the test extra"
(cd "$ROOT" && "${PIP[@]}" --no-build-isolation -e '.[test]')

"$VENV/bin/python" -c "import torch, pytorch_block_sparse_ng as p; \
print(f'[setup_env] ready: torch {torch.__version__}, pytorch_block_sparse_ng {p.__version__}, ' \
      f'CUDA kernels built: {p.kernels_available()}')"
echo "$want" > "$STAMP"
