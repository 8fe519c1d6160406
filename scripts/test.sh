#!/usr/bin/env bash
# Install Metrale and its plugins into ./.venv and run the whole test suite.
# This is the README's test command and what CI (.ci/run) calls.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --dev
bash scripts/fetch-test-data.sh
. .venv/bin/activate
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
python -m pytest "$@"
