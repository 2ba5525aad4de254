#!/usr/bin/env sh
# Add Speculum to this user's application menu, pointing at this unpacked bundle.
# Run it from the bundle folder after moving the folder where it will stay.
set -eu
HERE="$(cd "$(dirname "$0")" && pwd)"
DATA="${XDG_DATA_HOME:-$HOME/.local/share}"
mkdir -p "$DATA/applications" "$DATA/icons/hicolor/512x512/apps"
cp "$HERE/_internal/resources/icons/speculum.png" "$DATA/icons/hicolor/512x512/apps/speculum.png"
sed "s|^Exec=.*|Exec=\"$HERE/speculum\"|" "$HERE/_internal/resources/speculum.desktop" \
    > "$DATA/applications/speculum.desktop"
command -v update-desktop-database >/dev/null && update-desktop-database -q "$DATA/applications" || true
echo "Speculum is in the application menu (entry: $DATA/applications/speculum.desktop)."
