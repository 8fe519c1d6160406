#!/usr/bin/env bash
# Create ./.venv (if needed) and install metrale-core plus every plugin under plugins/ (and, with
# --dev, the test and lint extras and contrib/ plugins) in editable mode, with the CPU build of torch
# pinned through constraints.txt. Sourced by serve.sh and test.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
# the dashboard and the HTTP clients are extras of metrale-core (a headless server needs neither);
# the README's commands get both
core=".[tui,client]"
dirs="plugins/*/"
# metrale-ray pulls in Ray (hundreds of MB) for multi-machine tensor parallelism: opt-in for
# users (pip install -e plugins/metrale-ray), installed with --dev so its tests run.
skip="plugins/metrale-ray/"
if [ "${1:-}" = "--dev" ]; then
    core=".[tui,client,test,lint]"
    dirs="plugins/*/ contrib/*/"
    skip="^$"
fi
# shellcheck disable=SC2086
python -m pip install -q --disable-pip-version-check -c constraints.txt \
    -e "$core" $(ls -d $dirs 2>/dev/null | grep -v "$skip" | sed 's/^/-e /')
