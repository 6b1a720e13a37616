"""LaTeX in replies, drawn: `$...$`, `$$...$$`, `\\(...\\)` and `\\[...\\]` become images.

The layout is ziamath's (LaTeX to MathML through latex2mathml, then typeset with its own
STIX Two Math font into SVG); Qt's SVG renderer turns that into an image the QTextBrowser
shows inline. Nothing here lays out TeX by hand. A formula ziamath cannot parse, or whose
SVG Qt cannot draw, is shown as its source text, delimiters and all.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import ziamath
from PySide6.QtCore import QByteArray, QRectF, Qt
from PySide6.QtGui import QImage, QPainter
from PySide6.QtSvg import QSvgRenderer

ziamath.config.svg2 = False  # SVG 1.1 paths: Qt's renderer draws no SVG 2 <symbol> glyphs
INLINE_PT = 15.0  # about the prose's size, a step above UI text like the bubbles
DISPLAY_PT = 18.0
_SIZE = re.compile(r'<svg[^>]*\bwidth="([\d.]+)"[^>]*\bheight="([\d.]+)"')


@dataclass(frozen=True)
class Formula:
    """One typeset formula: its SVG and its size in pixels at 1x."""

    latex: str
    display: bool
    svg: str
    width: int
    height: int


@functools.lru_cache(maxsize=512)
def typeset(latex: str, display: bool, color: str) -> Formula | None:
    """The formula as SVG in `color`, or None when it is not math ziamath can parse."""
    if not latex.strip():
        return None
    try:
        svg = ziamath.Latex(
            latex.strip(),
            size=DISPLAY_PT if display else INLINE_PT,
            color=color,
            inline=not display,
        ).svg()
    except Exception:  # latex2mathml and ziamath raise many kinds; any means "not math"
        return None
    size = _SIZE.search(svg)
    if size is None or not QSvgRenderer(QByteArray(svg.encode())).isValid():
        return None
    width, height = (max(1, round(float(n))) for n in size.groups())
    return Formula(latex, display, svg, width, height)


@functools.lru_cache(maxsize=512)
def image(formula: Formula, scale: float) -> QImage:
    """The formula drawn at `scale` device pixels per pixel (sharp on HiDPI screens)."""
    out = QImage(
        max(1, round(formula.width * scale)),
        max(1, round(formula.height * scale)),
        QImage.Format.Format_ARGB32_Premultiplied,
    )
    out.fill(Qt.GlobalColor.transparent)
    painter = QPainter(out)
    QSvgRenderer(QByteArray(formula.svg.encode())).render(
        painter, QRectF(0, 0, out.width(), out.height())
    )
    painter.end()
    out.setDevicePixelRatio(scale)
    return out
