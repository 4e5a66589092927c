#!/usr/bin/env bash
# Sets up .venv (scripts/setup_env.sh) and runs demo.py; arguments go to the demo (--steps, --device, ...).
#
#   bash scripts/demo.sh                 # CPU: well under 2 minutes; uses the GPU when torch sees one
#   bash scripts/demo.sh --steps 200
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup_env.sh" </dev/null
VENV="${VENV:-$ROOT/.venv}"

cd "$ROOT"
exec "$VENV/bin/python" demo.py "$@" </dev/null
