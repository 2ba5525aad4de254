#!/usr/bin/env bash
# Build the macOS app: dist/Speculum.app (Apple silicon, Metal) and a .dmg of it.
#
#   packaging/build-macos.sh
#
# Needs: an Apple silicon Mac, Xcode command line tools (clang, metal compiler not
# needed: the shaders are embedded as source), an arm64 Python 3.10+ (python.org or
# Homebrew). The build venv is $SPECULUM_DEV_CACHE/bundle-metal (default
# ~/.cache/speculum-dev/bundle-metal); llama-cpp-python is compiled there once.
# Environment: PYTHON, SPECULUM_SELFTEST_MODEL (a GGUF: run the self-test in the app),
# SPECULUM_CODESIGN_IDENTITY ("Developer ID Application: ..."; default ad-hoc signing),
# SPECULUM_NOTARY_PROFILE (a `xcrun notarytool store-credentials` profile: notarize the dmg).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${SPECULUM_DEV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/speculum-dev}"
VENV="$CACHE/bundle-metal"
PY="${PYTHON:-python3}"
START=$(date +%s)

[ "$(uname -s)" = Darwin ] || { echo "build-macos.sh runs on macOS." >&2; exit 1; }
[ "$(uname -m)" = arm64 ] || { echo "The Metal bundle is built on Apple silicon (arm64)." >&2; exit 1; }
[ "$("$PY" -c 'import platform; print(platform.machine())')" = arm64 ] \
    || { echo "$PY is not an arm64 Python (Rosetta?); set PYTHON to a native one." >&2; exit 1; }

# Metal with the shader library embedded in libggml-metal (no .metal file to find at
# run time inside the .app); GGML_NATIVE=OFF so an M3 build runs on an M1.
export MACOSX_DEPLOYMENT_TARGET=13.0
CMAKE_ARGS="-DGGML_METAL=on -DGGML_METAL_EMBED_LIBRARY=on -DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF -DGGML_RPC=on"
CMAKE_ARGS="$CMAKE_ARGS -DCMAKE_OSX_ARCHITECTURES=arm64 -DCMAKE_OSX_DEPLOYMENT_TARGET=$MACOSX_DEPLOYMENT_TARGET"

source "$REPO/packaging/build-env.sh"

echo "==> PyInstaller"
cd "$REPO"
rm -rf dist/speculum dist/Speculum.app
SPECULUM_VARIANT=metal "$VENV/bin/python" -m PyInstaller --noconfirm --clean \
    --distpath dist --workpath build/pyinstaller-macos-metal packaging/speculum.spec

APP="$REPO/dist/Speculum.app"
EXE="$APP/Contents/MacOS/speculum"
METAL_LIB=$(find "$APP" -name 'libggml-metal*.dylib' -type f | head -1)
[ -n "$METAL_LIB" ] || { echo "libggml-metal is missing from the app: llama.cpp was built without Metal." >&2; exit 1; }
nm "$METAL_LIB" | grep -Eq '_ggml_metallib_[A-Za-z0-9_]*start' \
    || { echo "$METAL_LIB does not embed the Metal shaders (GGML_METAL_EMBED_LIBRARY)." >&2; exit 1; }

echo "==> checking the app starts (outside the venv)"
env -i PATH=/usr/bin:/bin HOME="$HOME" "$EXE" --version
env -i PATH=/usr/bin:/bin HOME="$HOME" "$EXE" doctor | grep -E "Compute backend|llama.cpp \(|Qt"
env -i PATH=/usr/bin:/bin HOME="$HOME" "$EXE" doctor | grep -q "Compute backend *Metal" \
    || { echo "The app's llama.cpp does not report Metal." >&2; exit 1; }
if [ -n "${SPECULUM_SELFTEST_MODEL:-}" ]; then
    env -i PATH=/usr/bin:/bin HOME="$HOME" "$EXE" --self-test "$SPECULUM_SELFTEST_MODEL"
fi

VERSION=$("$EXE" --version | awk '{print $2}')
DMG="dist/Speculum-$VERSION-macos-arm64.dmg"
if [ -n "${SPECULUM_CODESIGN_IDENTITY:-}" ]; then
    # PyInstaller signed each binary; sign the whole app with the hardened runtime for notarization.
    codesign --force --deep --options runtime --timestamp \
        --entitlements packaging/macos/entitlements.plist --sign "$SPECULUM_CODESIGN_IDENTITY" "$APP"
    codesign --verify --deep --strict "$APP"
fi
rm -f "$DMG"
hdiutil create -quiet -volname Speculum -srcfolder "$APP" -ov -format UDZO "$DMG"
if [ -n "${SPECULUM_NOTARY_PROFILE:-}" ]; then
    xcrun notarytool submit "$DMG" --keychain-profile "$SPECULUM_NOTARY_PROFILE" --wait
    xcrun stapler staple "$DMG"
fi
echo "==> done in $(( $(date +%s) - START )) s"
echo "    app $APP  $(du -sh "$APP" | cut -f1)"
echo "    dmg $REPO/$DMG  $(du -sh "$DMG" | cut -f1)"
