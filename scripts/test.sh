#!/usr/bin/env bash
# Install Metrale and its plugins into ./.venv and run the whole test suite.
# This is the README's test command and what CI (.ci/run) calls.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --dev
bash scripts/fetch-test-data.sh
# Debian packages some tests drive (skipped locally when they can't be had, failed under CI=true):
# tmux for the dashboard test of `met serve`, chromium for the browser test of the chat page.
need=""
command -v tmux >/dev/null 2>&1 || need="$need tmux"
[ -x /usr/bin/chromium ] || need="$need chromium"
if [ -n "$need" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    # shellcheck disable=SC2086
    (apt-get update -qq && apt-get install -y -qq $need) >/dev/null 2>&1 || echo "test.sh: could not install$need" >&2
fi
. .venv/bin/activate
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
python -m pytest "$@"
