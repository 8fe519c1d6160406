#!/usr/bin/env bash
# The import-linter contracts of pyproject.toml over the whole tree. import-linter reads sources,
# so every in-tree distribution folder (core, plugins/*, contrib/*) goes on PYTHONPATH, installed
# or not (tests/test_import_contracts.py does the same). Used by scripts/check.sh and `tox -e type`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
src="$PWD"
for d in plugins/*/ contrib/*/; do [ -f "$d/pyproject.toml" ] && src="$src:$PWD/${d%/}"; done
PYTHONPATH="$src" exec lint-imports --no-cache "$@"
