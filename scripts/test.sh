#!/usr/bin/env bash
# Sets up .venv (scripts/setup_env.sh) and runs the test suite; arguments go to pytest.
#
#   bash scripts/test.sh                       # all tests (GPU tests skip with a reason on a CPU machine)
#   bash scripts/test.sh tests/test_patcher.py -x
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup_env.sh" </dev/null
VENV="${VENV:-$ROOT/.venv}"

cd "$ROOT"
status=0
"$VENV/bin/python" -m pytest -q "$@" </dev/null || status=$?
if [ "$status" -eq 5 ]; then
    echo "scripts/test.sh: pytest collected no tests (exit code 5); treating that as a failure" >&2
    exit 1
fi
exit "$status"
