#!/usr/bin/env bash
# The gates, on the whole tree: ruff lint, ruff format --check, mypy, the import-linter
# contracts (configuration of all four in pyproject.toml) and the generated public face
# (metrale_core/_api_index.py and api.pyi current with metrale_core.api.FACE). Each runs even when an earlier one
# fails; exits non-zero if any fails. .ci/run calls it before the tests; tox runs the same tools
# as `tox -e lint,type`.
# Usage: bash scripts/check.sh            (uses ./.venv, creating it with install.sh --dev if absent)
#        METRALE_CHECK_PYTHON_ENV=active bash scripts/check.sh   (use the tools already on PATH)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ "${METRALE_CHECK_PYTHON_ENV:-venv}" != active ]; then
    [ -x .venv/bin/python ] || bash scripts/install.sh --dev
    . .venv/bin/activate
fi
if ! command -v ruff >/dev/null 2>&1 || ! command -v mypy >/dev/null 2>&1 \
        || ! command -v lint-imports >/dev/null 2>&1; then
    python -m pip install -q --disable-pip-version-check -c constraints.txt -e ".[test,lint]"
fi
status=0
run() {
    echo "== $*" >&2
    "$@" || { echo "!! failed: $*" >&2; status=1; }
}
run ruff check .
run ruff format --check .
run mypy
run bash scripts/lint-imports.sh
run python -m metrale_core.plugin.public_face --check
exit $status
