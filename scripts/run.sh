#!/usr/bin/env bash
# Install Speculum with the offline demo pair, and open the window.
source "$(dirname "$0")/setup-env.sh"
echo "==> installing Speculum (the first time compiles llama.cpp: a few minutes)"
pip_install -e "$REPO[demo]"
"$VENV/bin/speculum" models install-demo
exec "$VENV/bin/speculum" "$@"
