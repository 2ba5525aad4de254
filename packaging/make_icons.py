"""Render Speculum's app icon from resources/icons/speculum.svg into png, ico and icns.

    QT_QPA_PLATFORM=offscreen python packaging/make_icons.py

The SVG is the window's own icon (ui/app.py sets it), so the bundles' icons match it:
rerun this after changing the SVG. ICO and ICNS are written by hand as containers of
PNG images (both formats take PNG entries: ICO since Windows Vista, ICNS since macOS
10.7), so no image library is needed beyond Qt.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, Qt
from PySide6.QtGui import QGuiApplication, QImage, QPainter
from PySide6.QtSvg import QSvgRenderer

ICONS = Path(__file__).resolve().parents[1] / "resources" / "icons"
SOURCE = ICONS / "speculum.svg"

ICO_SIZES = (16, 24, 32, 48, 64, 128, 256)
# ICNS entry type for each PNG size (the @2x types reuse the larger pixel size).
ICNS_TYPES = (("icp4", 16), ("icp5", 32), ("icp6", 64), ("ic07", 128), ("ic08", 256),
              ("ic09", 512), ("ic10", 1024), ("ic11", 32), ("ic12", 64), ("ic13", 256), ("ic14", 512))


def draw(size: int, renderer: QSvgRenderer) -> QImage:
    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    renderer.render(painter)
    painter.end()
    return image


def png_bytes(image: QImage) -> bytes:
    data = QByteArray()
    buf = QBuffer(data)
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    if not image.save(buf, "PNG"):
        raise RuntimeError("Qt could not encode a PNG")
    buf.close()
    return bytes(data.data())


def ico(pngs: dict[int, bytes]) -> bytes:
    sizes = sorted(pngs)
    header = struct.pack("<HHH", 0, 1, len(sizes))
    offset = 6 + 16 * len(sizes)
    entries, blobs = b"", b""
    for n in sizes:
        blob = pngs[n]
        # Width/height 0 means 256.
        entries += struct.pack("<BBBBHHII", n % 256, n % 256, 0, 0, 1, 32, len(blob), offset)
        blobs += blob
        offset += len(blob)
    return header + entries + blobs


def icns(pngs: dict[int, bytes]) -> bytes:
    body = b"".join(kind.encode() + struct.pack(">I", 8 + len(pngs[n])) + pngs[n] for kind, n in ICNS_TYPES)
    return b"icns" + struct.pack(">I", 8 + len(body)) + body


def main() -> int:
    app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])  # noqa: F841  (fonts, painting)
    renderer = QSvgRenderer(str(SOURCE))
    if not renderer.isValid():
        raise SystemExit(f"{SOURCE} is missing or not an SVG Qt can render")
    sizes = sorted(set(ICO_SIZES) | {n for _, n in ICNS_TYPES})
    pngs = {n: png_bytes(draw(n, renderer)) for n in sizes}
    ICONS.mkdir(parents=True, exist_ok=True)
    (ICONS / "speculum.png").write_bytes(pngs[512])
    (ICONS / "speculum.ico").write_bytes(ico({n: pngs[n] for n in ICO_SIZES}))
    (ICONS / "speculum.icns").write_bytes(icns(pngs))
    for name in ("speculum.png", "speculum.ico", "speculum.icns"):
        print(f"{ICONS / name}  {(ICONS / name).stat().st_size:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
