# Sourced by build-linux.sh and build-macos.sh (Windows has its own PowerShell twin):
# the build venv, llama.cpp compiled for the bundle's backend, Speculum and PyInstaller.
# Expects REPO, CACHE, VENV, PY and CMAKE_ARGS to be set.
mkdir -p "$CACHE"
if [ ! -x "$VENV/bin/python" ]; then
    echo "==> creating the build venv $VENV"
    "$PY" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
fi
pip_install() { "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@"; }

# pip's wheel cache does not know which backend a cached llama-cpp-python wheel was
# built for: compile it ourselves, bypassing the cache, and remember the flags.
# It is built from the source packaging/llama_cpp_source.py edits (the row-invariance switch).
STAMP="$VENV/.llama-cmake-args"
EDITS=$("$VENV/bin/python" -c 'import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest()[:16])' \
    "$REPO/packaging/llama_cpp_source.py")
if [ "$(cat "$STAMP" 2>/dev/null)" != "$CMAKE_ARGS edits=$EDITS" ]; then
    echo "==> compiling llama-cpp-python ($CMAKE_ARGS): several minutes, longer for CUDA"
    SOURCE=$("$VENV/bin/python" "$REPO/packaging/llama_cpp_source.py" "$CACHE/llama-cpp-source")
    CMAKE_ARGS="$CMAKE_ARGS" pip_install --no-cache-dir --force-reinstall --no-deps "$SOURCE"
    echo "$CMAKE_ARGS edits=$EDITS" > "$STAMP"
fi
echo "==> installing Speculum's dependencies and PyInstaller"
pip_install -c "$REPO/packaging/constraints.txt" "$REPO" pyinstaller pyinstaller-hooks-contrib
