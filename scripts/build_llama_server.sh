#!/usr/bin/env bash
# Builds llama.cpp's own llama-server from the llama.cpp that the installed llama-cpp-python
# vendors, with the same flags as setup-env.sh, so bench_peer.py compares Speculum with the very
# same kernels. Idempotent: prints the binary's path and exits when it is already built.
# Usage: scripts/build_llama_server.sh [JOBS]   (JOBS defaults to 2)
set -euo pipefail
JOBS="${1:-2}"
CACHE="${SPECULUM_DEV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/speculum-dev}"
VENV="$CACHE/venv"
PIP="$VENV/bin/pip"
VER="$("$PIP" show llama-cpp-python 2>/dev/null | sed -n 's/^Version: //p')"
if [ -z "$VER" ]; then
    echo "llama-cpp-python is not installed in $VENV: run scripts/setup-env.sh first." >&2
    exit 1
fi
ROOT="$CACHE/llama-server/$VER"
BIN="$ROOT/build/bin/llama-server"
if [ -x "$BIN" ]; then
    echo "$BIN"
    exit 0
fi
mkdir -p "$ROOT"
SRC="$ROOT/src"
if [ ! -d "$SRC/vendor/llama.cpp" ]; then
    echo "==> fetching the llama-cpp-python $VER sources" >&2
    "$PIP" download -q --disable-pip-version-check --no-binary :all: --no-deps \
        "llama-cpp-python==$VER" -d "$ROOT/sdist" >&2
    rm -rf "$SRC.tmp" && mkdir -p "$SRC.tmp"
    tar -xzf "$ROOT"/sdist/llama_cpp_python-"$VER".tar.gz -C "$SRC.tmp" --strip-components=1
    mv "$SRC.tmp" "$SRC"
fi
# The flags of setup-env.sh (RPC on, AMX off), plus the server; no curl (models are local files).
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
FLAGS=(-DGGML_RPC=on -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
       -DLLAMA_BUILD_SERVER=ON -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF)
if echo 'int main(void){return 0;}' | "${CC:-cc}" $NO_AMX -x c - -o /dev/null 2>/dev/null; then
    FLAGS+=("-DCMAKE_C_FLAGS=$NO_AMX" "-DCMAKE_CXX_FLAGS=$NO_AMX")
fi
echo "==> building llama-server $VER (about 6+ minutes on 2 cores)" >&2
cmake -S "$SRC/vendor/llama.cpp" -B "$ROOT/build" "${FLAGS[@]}" >&2
cmake --build "$ROOT/build" --target llama-server -j"$JOBS" >&2
echo "$BIN"
