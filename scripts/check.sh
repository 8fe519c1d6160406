#!/usr/bin/env bash
# The gates: ruff lint, ruff format check and mypy (configuration in pyproject.toml), each run
# even when an earlier one fails; exits non-zero if any fails. Installs ruff/mypy into ./.venv
# (the "lint" extra) when they are missing. Usage: bash scripts/check.sh [paths for ruff...]
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ -x .venv/bin/python ] || bash scripts/install.sh --dev
. .venv/bin/activate
if ! command -v ruff >/dev/null 2>&1 || ! command -v mypy >/dev/null 2>&1; then
    python -m pip install -q --disable-pip-version-check -c constraints.txt -e ".[lint]"
fi
paths=("${@:-.}")
status=0
echo "== ruff check" >&2
ruff check "${paths[@]}" || status=1
echo "== ruff format --check" >&2
ruff format --check "${paths[@]}" || status=1
echo "== mypy" >&2
mypy || status=1
exit $status
