# Sourced by run.sh and test.sh: one virtual environment outside the repo, reused.
# SPECULUM_DEV_CACHE moves it; pip's own cache (~/.cache/pip) keeps the llama.cpp wheel,
# so only the first install on a machine compiles llama.cpp (about 6 minutes on 2 cores).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${SPECULUM_DEV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/speculum-dev}"
VENV="$CACHE/venv"
PY="${PYTHON:-python3}"

if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
    echo "Speculum needs Python 3.10 or newer ($PY is $("$PY" --version 2>&1))." >&2
    exit 1
fi
mkdir -p "$CACHE"
if [ ! -x "$VENV/bin/python" ]; then
    echo "==> creating $VENV"
    "$PY" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
fi

# Qt needs a few system libraries even offscreen; install them where we can (Debian/Ubuntu, root).
need_qt_libs() {
    [ "$(uname)" = Linux ] || return 1
    ldconfig -p 2>/dev/null | grep -q 'libEGL.so.1' && ldconfig -p | grep -q 'libxkbcommon.so.0' \
        && ldconfig -p | grep -q 'libfontconfig.so.1' && ldconfig -p | grep -q 'libdbus-1.so.3' && return 1
    return 0
}
if need_qt_libs && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "==> installing Qt's system libraries"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libegl1 libgl1 libxkbcommon0 libxkbcommon-x11-0 \
        libfontconfig1 libdbus-1-3 libglib2.0-0 fonts-dejavu-core >/dev/null
fi

pip_install() {
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@"
}

# llama.cpp as Speculum needs it: the RPC backend (workers on other machines), and never the
# AMX kernels, which crash on the first batched decode on CPUs that have AMX (llama.cpp issue
# 20824). GGML_NATIVE (the default here) turns on every instruction set of this CPU, AMX
# included, so the AMX instructions are also switched off in the compiler flags.
LLAMA_CMAKE_ARGS="-DGGML_RPC=on -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAVA_BUILD=OFF"
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
if echo 'int main(void){return 0;}' | "${CC:-cc}" $NO_AMX -x c - -o /dev/null 2>/dev/null; then
    LLAMA_CMAKE_ARGS="$LLAMA_CMAKE_ARGS -DCMAKE_C_FLAGS=\"$NO_AMX\" -DCMAKE_CXX_FLAGS=\"$NO_AMX\""
fi
# pip's wheel cache does not know the flags a cached llama-cpp-python wheel was built with
# (an older one may hold AMX kernels), nor Speculum's edit to its ggml (the row-invariance
# switch: packaging/llama_cpp_source.py): compile it here from the edited source, bypassing the
# cache, once per flag set and edit.
install_llama_cpp() {
    local stamp="$VENV/.llama-cmake-args" edits want source
    edits=$("$VENV/bin/python" -c 'import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest()[:16])' \
        "$REPO/packaging/llama_cpp_source.py")
    want="$LLAMA_CMAKE_ARGS edits=$edits"
    if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
        echo "==> compiling llama.cpp (llama-cpp-python, with Speculum's row-invariance switch) without AMX kernels, with RPC: about 6 minutes on 2 cores"
        source=$("$VENV/bin/python" "$REPO/packaging/llama_cpp_source.py" "$CACHE/llama-cpp-source")
        CMAKE_ARGS="$LLAMA_CMAKE_ARGS" pip_install --no-cache-dir --force-reinstall --no-deps "$source"
        echo "$want" > "$stamp"
    fi
}
install_llama_cpp
