#!/usr/bin/env bash
# Build the Linux bundle: dist/speculum/ (run ./speculum) and a .tar.gz of it.
#
#   packaging/build-linux.sh [cpu|cuda]      (default cpu)
#
# cpu:  llama.cpp for any x86-64-v3 CPU (AVX2, FMA, F16C; 2013 on), not just this one.
# cuda: needs the CUDA toolkit (nvcc) here; the bundle then needs an NVIDIA driver there.
# Each variant gets its own build venv (llama-cpp-python compiled once, then reused):
#   $SPECULUM_DEV_CACHE/bundle-<variant>  (default ~/.cache/speculum-dev/bundle-<variant>)
# Environment: PYTHON (default python3), CUDA_ARCHS (e.g. "86;89" to build fewer GPU
# architectures than ggml's default list), SPECULUM_SELFTEST_MODEL (a GGUF: run the
# self-test in the finished bundle).
set -euo pipefail
VARIANT="${1:-cpu}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${SPECULUM_DEV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/speculum-dev}"
VENV="$CACHE/bundle-$VARIANT"
PY="${PYTHON:-python3}"
START=$(date +%s)

# GGML_NATIVE=OFF: a native build uses every instruction this CPU has (AVX-512 here)
# and dies with SIGILL on users' machines. LLAVA_BUILD=OFF: no multimodal library.
# No AMX kernels (they crash on the first batched decode: llama.cpp issue 20824); RPC for
# `speculum rpc-worker` and targets spread over several machines.
CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DGGML_RPC=on"
case "$VARIANT" in
    cpu) ;;
    cuda)
        command -v nvcc >/dev/null || { echo "The cuda variant needs the CUDA toolkit (nvcc on PATH)." >&2; exit 1; }
        CMAKE_ARGS="$CMAKE_ARGS -DGGML_CUDA=on"
        [ -n "${CUDA_ARCHS:-}" ] && CMAKE_ARGS="$CMAKE_ARGS -DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCHS"
        ;;
    *) echo "usage: $0 [cpu|cuda]" >&2; exit 1 ;;
esac

# Qt's X11 and Wayland plugins link against these system libraries; the bundle carries
# them only when the build machine has them (desktops do, minimal build images often not).
missing=()
for pair in libxcb-icccm.so.4:libxcb-icccm4 libxcb-keysyms.so.1:libxcb-keysyms1 \
            libxcb-cursor.so.0:libxcb-cursor0 libwayland-cursor.so.0:libwayland-cursor0; do
    ldconfig -p | grep -q "${pair%%:*}" || missing+=("${pair##*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "==> installing ${missing[*]} (Qt's display plugins need them)"
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    else
        echo "warning: install ${missing[*]} before building, or the bundle's window needs them on the user's machine" >&2
    fi
fi

source "$REPO/packaging/build-env.sh"

echo "==> PyInstaller"
cd "$REPO"
rm -rf dist/speculum
SPECULUM_VARIANT="$VARIANT" "$VENV/bin/python" -m PyInstaller --noconfirm --clean \
    --distpath dist --workpath build/pyinstaller-linux-$VARIANT packaging/speculum.spec
cp packaging/linux/install-desktop-entry.sh dist/speculum/

BUNDLE="$REPO/dist/speculum"
LIBDIR="$BUNDLE/_internal/llama_cpp/lib"
if [ "$VARIANT" = cpu ] && [ "$(uname -m)" = x86_64 ] && command -v objdump >/dev/null; then
    # The portable build must not use AVX-512 registers anywhere.
    if objdump -d "$LIBDIR"/libggml-cpu.so* | grep -q '%zmm'; then
        echo "llama.cpp was built with AVX-512: the bundle would crash on most CPUs." >&2; exit 1
    fi
fi

echo "==> checking the bundle starts (outside the venv)"
env -i PATH=/usr/bin:/bin HOME="$HOME" "$BUNDLE/speculum" --version
env -i PATH=/usr/bin:/bin HOME="$HOME" "$BUNDLE/speculum" doctor | grep -E "Compute backend|llama.cpp \(|Qt|AMX"
env -i PATH=/usr/bin:/bin HOME="$HOME" "$BUNDLE/speculum" doctor | grep -q "AMX kernels *none" \
    || { echo "The bundle's llama.cpp has AMX kernels: it would crash on CPUs with AMX." >&2; exit 1; }
if [ -n "${SPECULUM_SELFTEST_MODEL:-}" ]; then
    env -i PATH=/usr/bin:/bin HOME="$HOME" "$BUNDLE/speculum" --self-test "$SPECULUM_SELFTEST_MODEL"
fi

VERSION=$("$BUNDLE/speculum" --version | awk '{print $2}')
TARBALL="dist/speculum-$VERSION-linux-$(uname -m)-$VARIANT.tar.gz"
tar -C dist -czf "$TARBALL" speculum
echo "==> done in $(( $(date +%s) - START )) s"
echo "    bundle  $BUNDLE  $(du -sh "$BUNDLE" | cut -f1)"
echo "    archive $REPO/$TARBALL  $(du -sh "$TARBALL" | cut -f1)"
