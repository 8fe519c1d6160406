#!/usr/bin/env bash
# Install Metrale and its plugins into ./.venv and run the whole test suite.
# This is the README's test command and what CI (.ci/run) calls.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --disable-pip-version-check -c constraints.txt \
    -e ".[test]" $(ls -d plugins/*/ contrib/*/ 2>/dev/null | sed 's/^/-e /')
bash scripts/fetch-test-data.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
python -m pytest "$@"
