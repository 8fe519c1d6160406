#!/usr/bin/env bash
# Install Metrale and its plugins into ./.venv and run the whole test suite.
# This is the README's test command and what CI (.ci/run) calls.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --dev
bash scripts/fetch-test-data.sh
# tmux drives the dashboard test of `met serve` (Debian package; skipped when it can't be had).
if ! command -v tmux >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && apt-get install -y -qq tmux) >/dev/null 2>&1 || echo "test.sh: tmux not installed" >&2
fi
. .venv/bin/activate
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
python -m pytest "$@"
