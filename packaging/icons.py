"""The packages' icons, drawn at build time from the app icon Stoke itself shows.

One source: resources/icons/stoke.svg (the window icon). Linux gets the hicolor theme's
PNG sizes and the SVG as `scalable`; macOS gets an .icns, written here (PNG payloads under
their type codes) rather than by `iconutil`, so the Linux build can make and check it too.
Run as a script: `python packaging/icons.py OUT` writes both under OUT.
"""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
APP_ICON = ROOT / "resources" / "icons" / "stoke.svg"
ICON_NAME = "stoke"
HICOLOR_SIZES = (16, 22, 24, 32, 48, 64, 96, 128, 256, 512)
# .icns type code -> pixel size (the @2x codes hold the doubled size of their point size).
ICNS_TYPES = (
    ("icp4", 16),
    ("ic11", 32),
    ("icp5", 32),
    ("ic12", 64),
    ("ic07", 128),
    ("ic13", 256),
    ("ic08", 256),
    ("ic14", 512),
    ("ic09", 512),
    ("ic10", 1024),
)


def render_png(svg: Path, size: int) -> bytes:
    """`svg` drawn as a `size` x `size` PNG with a transparent background."""
    from PySide6.QtCore import QBuffer, QByteArray, QIODevice
    from PySide6.QtGui import QGuiApplication, QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    _app = QGuiApplication.instance() or QGuiApplication([sys.argv[0]])
    renderer = QSvgRenderer(str(svg))
    if not renderer.isValid():
        raise ValueError(f"{svg} is not an SVG Qt can draw")
    image = QImage(size, size, QImage.Format.Format_ARGB32)
    image.fill(0)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    renderer.render(painter)
    painter.end()
    data = QByteArray()
    buffer = QBuffer(data)
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(buffer, "PNG")
    return bytes(data.data())


def hicolor(svg: Path, share: Path) -> list[Path]:
    """The icon theme's files under `share` (…/share): every PNG size and the SVG."""
    written = []
    for size in HICOLOR_SIZES:
        path = share / "icons" / "hicolor" / f"{size}x{size}" / "apps" / f"{ICON_NAME}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(render_png(svg, size))
        written.append(path)
    scalable = share / "icons" / "hicolor" / "scalable" / "apps" / f"{ICON_NAME}.svg"
    scalable.parent.mkdir(parents=True, exist_ok=True)
    scalable.write_bytes(svg.read_bytes())
    return [*written, scalable]


def icns_bytes(pngs: dict[int, bytes]) -> bytes:
    """An .icns file of PNG images keyed by pixel size (every size ICNS_TYPES names)."""
    entries = b"".join(
        code.encode("ascii") + struct.pack(">I", 8 + len(pngs[size])) + pngs[size]
        for code, size in ICNS_TYPES
    )
    return b"icns" + struct.pack(">I", 8 + len(entries)) + entries


def icns(svg: Path, path: Path) -> Path:
    """The macOS app icon at `path`."""
    sizes = {size for _, size in ICNS_TYPES}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(icns_bytes({size: render_png(svg, size) for size in sizes}))
    return path


if __name__ == "__main__":
    out = Path(sys.argv[1])
    hicolor(APP_ICON, out / "share")
    print(icns(APP_ICON, out / f"{ICON_NAME}.icns"))
