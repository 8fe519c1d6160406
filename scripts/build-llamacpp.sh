#!/usr/bin/env bash
# Build llama.cpp natively for the tests and benchmarks that compare against it (issue 31): the
# sources vendored in the llama-cpp-python sdist, GGML_NATIVE=ON (AVX-512 / VNNI where this CPU has
# them), static, with llama-server, llama-bench, llama-quantize and our met-logits
# (scripts/llamacpp/met_logits.cpp, linked to the same libllama); llama.cpp's own
# convert_hf_to_gguf.py with its conversion/ package and vendored gguf-py are copied next to them.
#
# Usage: build-llamacpp.sh [DEST]
#   DEST defaults to ~/.cache/metrale-anchors/llamacpp-metrale/<version>-<recipe hash>, so a new
#   llama-cpp-python version, a change of met_logits.cpp / CMakeLists.txt or of the build flags
#   builds afresh and an unchanged recipe is reused. Prints the folder holding the binaries
#   (DEST/bin; the converter is DEST/bin/convert/convert_hf_to_gguf.py). The first build took 41
#   minutes at -j2 on 2 cores shared with other jobs (load ~8; less alone); METRALE_LLAMACPP_JOBS
#   sets -j (default: nproc).
#
# Intel AMX: METRALE_LLAMACPP_AMX=auto|off|on (default auto: off where /proc/cpuinfo lists amx_int8).
# With GGML_NATIVE=ON, -march=native on an AMX CPU (Sapphire Rapids and later) defines __AMX_INT8__,
# which compiles ggml-cpu's AMX extra buffer type (ggml/src/ggml-cpu/amx/: weights repacked into an
# "AMX model buffer", multiplied by ggml_backend_amx_mul_mat); the GGML_AMX_* cmake options do not
# apply under GGML_NATIVE. The natively built llama-bench / llama-server of llama-cpp-python 0.3.36
# exit 139 at start on such a machine, and the public record puts that crash in this path:
#   - ggml-org/llama.cpp#20824: segfault in ggml_backend_amx_mul_mat at the first compute after the
#     model loads, Q4_K_M, a from-source build with GCC 11.2, "works fine on another machine";
#   - ollama/ollama#17205, #17006 (Sapphire Rapids: every model segfaults at the first inference in
#     libggml-cpu-sapphirerapids.so, the AMX-enabled variant; dropping that variant avoids it) and
#     ollama/ollama#17244 ("GCC 11 builds broken AMX code which causes the Sapphire Rapids CPU
#     backend to crash", fixed there by building with GCC 13);
#   - stanfordnlp/dspy#10079: the same crash on AMX CI runners ("AMX model buffer" then segfault at
#     warm-up), fixed by removing the AMX backend variant.
# So where the CPU has AMX we compile with -mno-amx-tile -mno-amx-int8 -mno-amx-bf16 (an explicit
# -mno-* wins over -march=native in GCC and Clang whatever the order): __AMX_INT8__ stays undefined,
# the AMX buffer type is not built, and the AVX-512 / VNNI kernels that llama.cpp uses on every
# other AVX-512 CPU do the work. NOT run on an AMX machine (none was at hand when this was written);
# METRALE_LLAMACPP_AMX=on builds the AMX path anyway (e.g. to try it with GCC >= 13).
set -euo pipefail
VERSION=0.3.36
here=$(cd "$(dirname "$0")" && pwd)
recipe=$here/llamacpp

cmake_flags=(-DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_TOOLS_INSTALL=OFF)
amx=${METRALE_LLAMACPP_AMX:-auto}
case $amx in
    auto | off) if grep -qw amx_int8 /proc/cpuinfo 2>/dev/null || [ "$amx" = off ]; then
                    no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
                    cmake_flags+=("-DCMAKE_C_FLAGS=$no_amx" "-DCMAKE_CXX_FLAGS=$no_amx")
                fi ;;
    on) ;;
    *) echo "build-llamacpp.sh: METRALE_LLAMACPP_AMX must be auto, off or on, not '$amx'" >&2; exit 2 ;;
esac
targets=(llama-server llama-bench llama-quantize met-logits)

key=$( { echo "$VERSION ${cmake_flags[*]} ${targets[*]}"; cat "$recipe/CMakeLists.txt" "$recipe/met_logits.cpp"; } \
    | sha256sum | cut -c1-12)
DEST=${1:-$HOME/.cache/metrale-anchors/llamacpp-metrale/$VERSION-$key}
if [ -f "$DEST/complete" ]; then echo "$DEST/bin"; exit 0; fi

# a fresh machine may lack the toolchain: Debian's packages, as scripts/test.sh installs its own
if ! command -v cmake >/dev/null 2>&1 || ! command -v g++ >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        (apt-get update -qq && apt-get install -y -qq cmake g++ make) >&2
    fi
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
start=$(date +%s)
py=python3
[ -x "$here/../.venv/bin/python" ] && py=$here/../.venv/bin/python
"$py" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: -d "$work" "llama-cpp-python==$VERSION" >&2
tar xzf "$work/llama_cpp_python-$VERSION.tar.gz" -C "$work"
ll=$work/llama_cpp_python-$VERSION/vendor/llama.cpp
cmake -S "$recipe" -B "$work/build" -DLLAMA_CPP_DIR="$ll" "${cmake_flags[@]}" >&2
cmake --build "$work/build" -j"${METRALE_LLAMACPP_JOBS:-$(nproc)}" --target "${targets[@]}" >&2

# assemble next to DEST and move into place, so a half-built folder is never taken as done
stage=$DEST.partial.$$
rm -rf "$stage"
mkdir -p "$stage/bin/convert/models"
for t in "${targets[@]}"; do cp "$work/build/bin/$t" "$stage/bin/"; done
cp -a "$ll/convert_hf_to_gguf.py" "$ll/conversion" "$ll/gguf-py" "$stage/bin/convert/"
cp -a "$ll/models/templates" "$stage/bin/convert/models/"
for t in llama-bench llama-quantize; do
    "$stage/bin/$t" --help >/dev/null 2>&1 || [ $? -eq 1 ] || { echo "$t does not run" >&2; exit 1; }
done
echo "llama-cpp-python $VERSION; built in $(( $(date +%s) - start )) s; ${cmake_flags[*]}" >"$stage/complete"
rm -rf "$DEST"
mv "$stage" "$DEST"
cat "$DEST/complete" >&2
echo "$DEST/bin"
