"""Draw Speculum's app icon and write resources/icons/speculum.{png,ico,icns}.

    QT_QPA_PLATFORM=offscreen python packaging/make_icons.py

The mark is what the window shows: a line of drafted tokens, the first ones accepted
(green), the last one rejected (struck through, red). Drawn with Qt so no image library
is needed; ICO and ICNS are written by hand as containers of PNG images (both formats
take PNG entries: ICO since Windows Vista, ICNS since macOS 10.7).
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QGuiApplication, QImage, QLinearGradient, QPainter, QPen

ICONS = Path(__file__).resolve().parents[1] / "resources" / "icons"

ICO_SIZES = (16, 24, 32, 48, 64, 128, 256)
# ICNS entry type for each PNG size (the @2x types reuse the larger pixel size).
ICNS_TYPES = (("icp4", 16), ("icp5", 32), ("icp6", 64), ("ic07", 128), ("ic08", 256),
              ("ic09", 512), ("ic10", 1024), ("ic11", 32), ("ic12", 64), ("ic13", 256), ("ic14", 512))


def draw(size: int) -> QImage:
    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    p = QPainter(image)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    s = size / 64.0  # design grid: 64 x 64
    # Rounded square, deep blue-violet, lighter at the top.
    margin = 2 * s if size >= 32 else 0.5 * s
    rect = QRectF(margin, margin, size - 2 * margin, size - 2 * margin)
    grad = QLinearGradient(QPointF(0, rect.top()), QPointF(0, rect.bottom()))
    grad.setColorAt(0.0, QColor("#3b3f7a"))
    grad.setColorAt(1.0, QColor("#1b1d3a"))
    p.setPen(Qt.PenStyle.NoPen)
    p.setBrush(grad)
    p.drawRoundedRect(rect, 13 * s, 13 * s)
    # Three token rows: accepted, accepted, rejected. Fewer, bolder shapes when small.
    green, red = QColor("#4fd39a"), QColor("#ff6b6b")
    rows = ((16, 40, green), (28, 32, green), (40, 24, red))
    h = 8 * s
    for y, w, color in rows:
        p.setBrush(color)
        bar = QRectF(14 * s, y * s, w * s, h)
        p.drawRoundedRect(bar, h / 2, h / 2)
    # The strike-through on the rejected token.
    pen = QPen(QColor("#f4f4fb"), max(1.0, 2.2 * s), Qt.PenStyle.SolidLine, Qt.PenCapStyle.RoundCap)
    p.setPen(pen)
    p.drawLine(QPointF(11 * s, 44 * s), QPointF(41 * s, 44 * s))
    p.end()
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
    app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])  # noqa: F841  (QPainter needs it)
    sizes = sorted(set(ICO_SIZES) | {n for _, n in ICNS_TYPES})
    pngs = {n: png_bytes(draw(n)) for n in sizes}
    ICONS.mkdir(parents=True, exist_ok=True)
    (ICONS / "speculum.png").write_bytes(pngs[512])
    (ICONS / "speculum.ico").write_bytes(ico({n: pngs[n] for n in ICO_SIZES}))
    (ICONS / "speculum.icns").write_bytes(icns(pngs))
    for name in ("speculum.png", "speculum.ico", "speculum.icns"):
        print(f"{ICONS / name}  {(ICONS / name).stat().st_size:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
