"""The memory plan as a chart: per device, stacked bars of weights, KV cache and compute
buffers against the budget, the part over it hatched, a tooltip per bar."""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QEvent, QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QBrush, QColor, QFont, QHelpEvent, QPainter, QPainterPath, QPalette, QPen
from PySide6.QtWidgets import QSizePolicy, QToolTip, QWidget

from app.hardware.planner import DevicePlan, Plan
from app.ui.hardware.words import capitalized, gib, gib_pair, layers_text
from app.ui.theme import CHART, STATUS


def is_dark(palette: QPalette) -> bool:
    return palette.color(QPalette.ColorRole.Window).lightness() < 128


def track_color(palette: QPalette) -> QColor:
    """The empty part of a bar: the opposite of the card's background (see `_restyle`)."""
    role = QPalette.ColorRole.Base if is_dark(palette) else QPalette.ColorRole.AlternateBase
    return palette.color(role)


@dataclass(frozen=True)
class Bar:
    """One device's predicted bytes against its budget (after the plan's margin)."""

    name: str  # as the plan names it: "CUDA0", "CPU"
    label: str  # as the chart shows it: "CUDA0", "CPU RAM"
    weights: int
    kv: int
    compute: int
    budget: int
    detail: str

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute

    @property
    def over(self) -> int:
        return max(self.total - self.budget, 0)


class PlanChart(QWidget):
    """Stacked bars per device: weights, KV cache and compute buffers against the budget.

    Each bar is scaled to its own device (a 12 GiB GPU and 128 GiB of RAM are both full
    width), so each reads as "how full is this one"; the numbers say the sizes."""

    BAR_H = 20
    ROW_GAP = 14
    LEGEND_H = 26

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._bars: list[Bar] = []
        self._message = "Planning…"
        self._rows: list[tuple[QRectF, Bar]] = []
        self.setAccessibleName("Memory plan per device")
        self.setToolTip("Predicted memory per device; hover a bar for its breakdown")
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    @property
    def bars(self) -> list[Bar]:
        return list(self._bars)

    def set_plan(self, p: Plan | None, message: str = "") -> None:
        self._bars = [] if p is None else [self._bar(d, p.n_layer) for d in p.devices]
        self._message = message
        self.setAccessibleDescription(
            "; ".join(
                f"{b.label}: weights {gib(b.weights)}, KV {gib(b.kv)}, compute "
                f"{gib(b.compute)}, {gib(b.total)} of {gib(b.budget)}"
                for b in self._bars
            )
            or message
        )
        self.updateGeometry()
        self.update()

    @staticmethod
    def _bar(d: DevicePlan, n_layer: int) -> Bar:
        return Bar(
            d.name,
            "CPU RAM" if d.name == "CPU" else d.name,
            d.weights,
            d.kv,
            d.compute,
            d.budget,
            layers_text(d, n_layer),
        )

    def _row_height(self) -> int:
        return self.fontMetrics().height() + 6 + self.BAR_H + self.ROW_GAP

    def sizeHint(self) -> QSize:
        rows = max(len(self._bars), 1)
        return QSize(480, self.LEGEND_H + rows * self._row_height())

    def minimumSizeHint(self) -> QSize:
        return QSize(280, self.sizeHint().height())

    def paintEvent(self, event: QEvent) -> None:
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        palette = self.palette()
        text = palette.color(QPalette.ColorRole.Text)
        muted = palette.color(QPalette.ColorRole.PlaceholderText)
        width = self.width() - 1
        self._rows = []
        if not self._bars:
            painter.setPen(muted)
            painter.drawText(self.rect(), Qt.AlignmentFlag.AlignCenter, self._message)
            return
        self._paint_legend(painter, text, palette)
        metrics = self.fontMetrics()
        bold = QFont(self.font())
        bold.setWeight(QFont.Weight.DemiBold)
        y = float(self.LEGEND_H)
        line = metrics.height()
        for bar in self._bars:
            painter.setFont(bold)
            painter.setPen(text)
            painter.drawText(QRectF(0, y, width, line), Qt.AlignmentFlag.AlignLeft, bar.label)
            label_w = painter.fontMetrics().horizontalAdvance(bar.label)
            painter.setFont(self.font())
            painter.setPen(muted)
            painter.drawText(
                QRectF(label_w + 10, y, width / 2, line), Qt.AlignmentFlag.AlignLeft, bar.detail
            )
            used = gib_pair(bar.total, bar.budget)
            note = f"  ·  {gib(bar.over)} over" if bar.over else ""
            note_w = metrics.horizontalAdvance(note)
            painter.setPen(QColor(STATUS["error"]) if bar.over else text)
            painter.drawText(QRectF(0, y, width - note_w, line), Qt.AlignmentFlag.AlignRight, used)
            if note:
                painter.drawText(QRectF(0, y, width, line), Qt.AlignmentFlag.AlignRight, note)
            track = QRectF(0.5, y + line + 6, width - 1, self.BAR_H)
            self._paint_bar(painter, track, bar, palette)
            self._rows.append((QRectF(0, y, width, self._row_height()), bar))
            y += self._row_height()

    def _paint_legend(self, painter: QPainter, text: QColor, palette: QPalette) -> None:
        x = 0.0
        metrics = self.fontMetrics()
        entries = [
            ("Weights", QColor(CHART["weights"])),
            ("KV cache", QColor(CHART["kv"])),
            ("Compute buffers", QColor(CHART["compute"])),
            ("Free", track_color(palette)),
        ]
        top = (self.LEGEND_H - 6 - 12) / 2
        for label, color in entries:
            painter.setPen(QPen(palette.color(QPalette.ColorRole.Mid), 1))
            painter.setBrush(color)
            painter.drawRoundedRect(QRectF(x + 0.5, top + 0.5, 12, 12), 3, 3)
            painter.setPen(text)
            painter.drawText(
                QRectF(x + 18, top - 2, 200, 16),
                Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
                label,
            )
            x += 18 + metrics.horizontalAdvance(label) + 18

    def _paint_bar(self, painter: QPainter, track: QRectF, bar: Bar, palette: QPalette) -> None:
        scale = max(bar.budget, bar.total, 1)
        limit = track.left() + track.width() * bar.budget / scale
        path = QPainterPath()
        path.addRoundedRect(track, 5, 5)
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(track_color(palette))
        painter.drawPath(path)
        painter.save()
        painter.setClipPath(path)
        segments: list[tuple[QRectF, QColor, str]] = []
        x = track.left()
        for key, value in (("weights", bar.weights), ("kv", bar.kv), ("compute", bar.compute)):
            w = track.width() * value / scale
            if w > 0:
                segment = QRectF(x, track.top(), w, track.height())
                segments.append((segment, QColor(CHART[key]), gib(value).removesuffix(" GiB")))
                painter.fillRect(segment, segments[-1][1])
                x += w
        if bar.over:  # the part past the budget, hatched
            over = QRectF(limit, track.top(), x - limit, track.height())
            painter.fillRect(over, QBrush(QColor(STATUS["error"]), Qt.BrushStyle.BDiagPattern))
        small = QFont(self.font())
        small.setPointSizeF(max(self.font().pointSizeF() - 1, 7))
        painter.setFont(small)
        for segment, color, label in segments:
            width = painter.fontMetrics().horizontalAdvance(label) + 8
            if width + 2 < segment.width():
                backing = QRectF(0, 0, width, track.height() - 4)
                backing.moveCenter(segment.center())
                painter.fillRect(backing, color)
                painter.setPen(QColor("white"))
                painter.drawText(segment, Qt.AlignmentFlag.AlignCenter, label)
        painter.restore()
        painter.setPen(QPen(palette.color(QPalette.ColorRole.Mid), 1))
        painter.setBrush(Qt.BrushStyle.NoBrush)
        painter.drawPath(path)
        if bar.over:
            painter.setPen(QPen(QColor(STATUS["error"]), 2))
            painter.drawLine(QPointF(limit, track.top() - 3), QPointF(limit, track.bottom() + 3))

    def event(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.ToolTip and isinstance(event, QHelpEvent):
            for rect, bar in self._rows:
                if rect.contains(QPointF(event.pos())):
                    QToolTip.showText(event.globalPos(), self._tooltip(bar), self)
                    return True
        return super().event(event)

    @staticmethod
    def _tooltip(bar: Bar) -> str:
        state = (
            f"{gib(bar.over)} over its budget"
            if bar.over
            else f"{gib(bar.budget - bar.total)} free"
        )
        lines = [
            f"<b>{bar.label}</b> — {gib(bar.total)} of {gib(bar.budget)} ({state})",
            f"Weights: {gib(bar.weights)}",
            f"KV cache: {gib(bar.kv)}",
            f"Compute buffers: {gib(bar.compute)}",
        ]
        if bar.detail:
            lines.append(capitalized(bar.detail))
        lines.append("The budget is the free memory less the safety margin.")
        return "<br>".join(lines)
