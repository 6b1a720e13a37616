"""The hardware wizard: what this machine has, and where a model's tensors go on it.

Shown at first run and from Settings > Hardware. It lists the devices llama.cpp can use,
recommends an engine, and plans the chosen model live: every change of context, profile, KV
type or micro-batch re-plans (after a short pause) and redraws the per-device memory bars.
Apply stores the plan as the model's load settings (`app.models.load_settings`).

The slow parts never run on the UI thread: detecting GPUs starts a subprocess, reading the
header of a 150 GB GGUF takes seconds, and a plan with its alternatives takes 20-100 ms on
DeepSeek-V4-Flash (one `plan()` alone 2-15 ms). They run in a QThreadPool; each kind of job
carries a generation number, so the answer to an input that has since changed is dropped.
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PySide6.QtCore import (
    QEvent,
    QObject,
    QPointF,
    QRectF,
    QRunnable,
    QSignalBlocker,
    QSize,
    Qt,
    QThreadPool,
    QTimer,
    Signal,
)
from PySide6.QtGui import (
    QBrush,
    QColor,
    QFont,
    QGuiApplication,
    QHelpEvent,
    QPainter,
    QPainterPath,
    QPalette,
    QPen,
)
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QSlider,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QToolTip,
    QVBoxLayout,
    QWidget,
)

from app.engine.choice import mlx_installed, platform_choice
from app.engine.mlx.registry import GGUF_BUILDERS
from app.engine.model_file import check_gguf
from app.hardware.detect import Hardware, detect
from app.hardware.memory import GIB, KV_TYPES
from app.hardware.planner import (
    PROFILES,
    DeviceBudget,
    DevicePlan,
    Plan,
    alternatives,
    describe_choice,
    load_options,
    plan,
)
from app.models import load_settings
from app.models.gguf_info import GGUFInfo, inspect_gguf
from app.settings import Settings
from app.ui.a11y import described

PLAN_DEBOUNCE_MS = 150
DEFAULT_CONTEXT = 65_536
# Half-octave stops from 4K to 1M: each step is 1.5x or 1.33x the last.
CONTEXT_STOPS: tuple[int, ...] = tuple(
    sorted({base << shift for shift in range(9) for base in (4096, 6144)} - {6144 << 8})
)
MAX_RESIDENT = 16
MAX_CHOICES = 4
COLORS = {"weights": "#3d7be0", "kv": "#2e9d5b", "compute": "#d08c1a"}
OVER_COLOR = "#c0392b"
FIT_COLOR = "#2e9d5b"
ENGINE_TEXT = {"llama.cpp": "llama.cpp", "mlx": "MLX"}  # a plan places tensors for llama.cpp

PROFILE_TEXT = {
    "balanced": (
        "Balanced",
        "Good prefill and decode: a larger micro-batch only while it keeps about as many "
        "experts on the GPUs",
    ),
    "prefill-heavy": (
        "Prefill-heavy",
        "Long prompts and documents: the largest micro-batch that fits, even if some experts "
        "move to RAM",
    ),
    "decode-heavy": (
        "Decode-heavy",
        "Long replies: the smallest micro-batch, so the most experts stay on the GPUs",
    ),
}
KV_TEXT = {
    "f16": "f16 — full precision",
    "bf16": "bf16 — full precision",
    "q8_0": "q8_0 — half the memory, nearly lossless",
    "q5_1": "q5_1 — about a third",
    "q5_0": "q5_0 — about a third",
    "q4_1": "q4_1 — about a quarter",
    "q4_0": "q4_0 — a quarter of the memory",
    "f32": "f32 — twice f16's memory",
}
UBATCHES: tuple[int | None, ...] = (None, 4096, 2048, 1024, 512)

STYLE = """
QFrame#card { background: palette(%(card)s); border: 1px solid palette(mid);
    border-radius: 10px; }
QLabel#card-title { font-weight: 600; font-size: 14px; }
QLabel#muted { color: palette(placeholder-text); }
QLabel#lead { font-size: 13px; }
QLabel#fit-chip { border-radius: 9px; padding: 2px 10px; font-size: 12px; font-weight: 600;
    color: white; }
QTableWidget#devices { border: 1px solid palette(mid); border-radius: 6px;
    gridline-color: transparent; }
QHeaderView::section { background: palette(alternate-base); border: none;
    border-bottom: 1px solid palette(mid); padding: 4px 6px; font-weight: 600; }
QPushButton#alternative { text-align: left; padding: 6px 10px; background: palette(base); }
QPushButton#alternative:hover { background: palette(alternate-base); }
QScrollArea#wizard-body { background: transparent; border: none; }
QWidget#wizard-contents { background: transparent; }
"""


# -- words and numbers ----------------------------------------------------------------------


def gib(n: float) -> str:
    """Bytes as GiB, readable at a glance: 2 decimals below 10 GiB, 1 above."""
    value = n / GIB
    return f"{value:,.2f} GiB" if abs(value) < 10 else f"{value:,.1f} GiB"


def gib_pair(used: int, budget: int) -> str:
    """ "10.3 / 11.1 GiB": both numbers with the same decimals."""
    digits = 2 if max(abs(used), abs(budget)) < 10 * GIB else 1
    return f"{used / GIB:,.{digits}f} / {budget / GIB:,.{digits}f} GiB"


def file_size(n: int) -> str:
    return gib(n) if n >= GIB else f"{n / (1 << 20):,.0f} MiB"


def short_tokens(n: int) -> str:
    """4096 -> "4K", 1048576 -> "1M"."""
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20}M"
    if n % 1024 == 0:
        return f"{n >> 10}K"
    return f"{n:,}"


def context_stops(model_max: int | None, extra: int | None = None) -> list[int]:
    """The slider's stops, up to what the model was trained for (its own length is the last
    stop), plus `extra` (a saved context that is not a stop) when it is in range."""
    limit = model_max or CONTEXT_STOPS[-1]
    stops = {s for s in CONTEXT_STOPS if s <= limit}
    stops.add(min(limit, CONTEXT_STOPS[-1]))
    if extra and extra <= limit:
        stops.add(extra)
    return sorted(stops)


def recommended_engine(hw: Hardware) -> tuple[str, str]:
    """("mlx" or "llama.cpp", why), from the machine alone."""
    if hw.apple is not None:
        return (
            "MLX",
            f"{hw.apple.chip}: MLX runs models on the GPU in unified memory, GGUF files of "
            "the architectures it knows included. The plan below is for llama.cpp (Metal), "
            "the alternative: choose the engine per model.",
        )
    return (
        "llama.cpp",
        "It runs GGUF models on CPUs and on NVIDIA or AMD GPUs, and splits a model too big "
        "for the GPUs between them and system RAM.",
    )


def budgets(hw: Hardware) -> tuple[list[DeviceBudget], int]:
    """GPUs llama.cpp can use, with their free memory as budgets, and the RAM budget."""
    if not hw.gpu_offload:
        return [], hw.memory.available
    gpus = [DeviceBudget.of(g) for g in hw.gpus]
    return gpus, hw.memory.available


def is_dark(palette: QPalette) -> bool:
    return palette.color(QPalette.ColorRole.Window).lightness() < 128


def _track_color(palette: QPalette) -> QColor:
    """The empty part of a bar: the opposite of the card's background (see `_restyle`)."""
    role = QPalette.ColorRole.Base if is_dark(palette) else QPalette.ColorRole.AlternateBase
    return palette.color(role)


def _capitalized(text: str) -> str:
    return text[:1].upper() + text[1:]


def _layers_text(d: DevicePlan, n_layer: int) -> str:
    parts = []
    if d.layers is not None:
        first, last = d.layers
        if last >= n_layer:  # the output layer is unit n_layer
            parts.append(f"layers {first}–{last - 1} + output" if last > first else "output layer")
        else:
            parts.append(f"layers {first}–{last}" if last > first else f"layer {first}")
    full, partial = len(d.expert_layers_full), len(d.expert_layers_partial)
    if full or partial:
        experts = f"{full} expert layer{'s' if full != 1 else ''}"
        if partial:
            experts += f" + {partial} partial"
        parts.append(experts)
    return " · ".join(parts)


def summary(p: Plan) -> str:
    """Where the model's weights go, in one line."""
    has_gpus = len(p.devices) > 1
    if not has_gpus:
        return "Everything runs on the CPU, in system RAM: no GPU is used."
    if p.expert_bytes_total and not p.expert_bytes_gpu:
        return (
            f"No experts fit on the GPUs: all {gib(p.expert_bytes_total)} of them stay in RAM; "
            "attention and shared weights on the GPUs."
        )
    if p.expert_bytes_total:
        return (
            f"Experts on GPUs: {p.expert_layers_on_gpu:.1f} of {p.n_layer} layers "
            f"({gib(p.expert_bytes_gpu)} of {gib(p.expert_bytes_total)}); attention and shared "
            "weights on the GPUs."
        )
    return f"All {p.n_layer} layers on the GPUs."


def details(p: Plan) -> str:
    has_gpus = len(p.devices) > 1
    where = "on the GPUs" if has_gpus and p.kv_offload else "in RAM"
    seqs = f"{p.n_seq_max} conversation{'s' if p.n_seq_max != 1 else ''} kept loaded"
    return (
        f"Micro-batch {p.n_ubatch} · KV cache {p.kv_type} {where} · {seqs} · "
        f"{p.margin:.0%} of each budget kept free"
    )


def useful_alternatives(current: Plan, alts: Sequence[Plan]) -> list[Plan]:
    """The alternatives worth a click: when the plan fits, those that fit with more experts on
    the GPUs; when it does not, every other choice, those that fit first."""
    has_gpus = len(current.devices) > 1
    mine = (current.n_ubatch, current.kv_type, current.kv_offload)
    out: dict[tuple[int, str, bool], Plan] = {}
    for a in alts:
        key = (a.n_ubatch, a.kv_type, a.kv_offload)
        if key == mine or key in out or (not a.kv_offload and not has_gpus):
            continue
        if current.fits and not (a.fits and a.expert_bytes_gpu > current.expert_bytes_gpu):
            continue
        out[key] = a
    return sorted(out.values(), key=lambda a: (not a.fits, -a.expert_bytes_gpu))


def choice_text(p: Plan) -> str:
    if len(p.devices) > 1:
        return _capitalized(describe_choice(p))
    ram = p.devices[-1]
    return f"Micro-batch {p.n_ubatch}, KV {p.kv_type}: {gib(ram.total)} of RAM, " + (
        "fits" if p.fits else "does not fit"
    )


@functools.lru_cache(maxsize=4)
def _inspect(path: str, size: int, mtime_ns: int) -> GGUFInfo:
    return inspect_gguf(path)


def read_model(path: str) -> tuple[GGUFInfo, dict[str, Any] | None]:
    """The model's header (cached while the file is unchanged) and its saved load settings."""
    file = check_gguf(path)  # a missing or foreign file, said in words
    stat = file.stat()
    return _inspect(str(file), stat.st_size, stat.st_mtime_ns), load_settings.load(file)


# -- background jobs ------------------------------------------------------------------------


class _Relay(QObject):
    """Carries a job's answer from the pool's thread to the dialog's."""

    done = Signal(str, int, object)
    failed = Signal(str, int, str)


class _Job(QRunnable):
    def __init__(self, relay: _Relay, kind: str, generation: int, work: Callable[[], object]):
        super().__init__()
        self._relay, self._kind, self._generation, self._work = relay, kind, generation, work

    def run(self) -> None:
        try:
            result = self._work()
        except Exception as exc:  # shown in the dialog, in words
            with contextlib.suppress(RuntimeError):  # the dialog closed meanwhile
                self._relay.failed.emit(self._kind, self._generation, str(exc) or repr(exc))
            return
        with contextlib.suppress(RuntimeError):
            self._relay.done.emit(self._kind, self._generation, result)


@dataclass(frozen=True)
class PlanResult:
    plan: Plan
    alternatives: tuple[Plan, ...]
    plan_ms: float
    alternatives_ms: float


def compute_plan(info: GGUFInfo, devices: Sequence[DeviceBudget], **kwargs: Any) -> PlanResult:
    started = time.perf_counter()
    chosen = plan(info, devices, **kwargs)
    planned = time.perf_counter()
    alts = alternatives(info, devices, **kwargs)
    return PlanResult(
        chosen,
        tuple(alts),
        (planned - started) * 1000,
        (time.perf_counter() - planned) * 1000,
    )


# -- the chart ------------------------------------------------------------------------------


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
            _layers_text(d, n_layer),
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
            painter.setPen(QColor(OVER_COLOR) if bar.over else text)
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
            ("Weights", QColor(COLORS["weights"])),
            ("KV cache", QColor(COLORS["kv"])),
            ("Compute buffers", QColor(COLORS["compute"])),
            ("Free", _track_color(palette)),
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
        painter.setBrush(_track_color(palette))
        painter.drawPath(path)
        painter.save()
        painter.setClipPath(path)
        segments: list[tuple[QRectF, QColor, str]] = []
        x = track.left()
        for key, value in (("weights", bar.weights), ("kv", bar.kv), ("compute", bar.compute)):
            w = track.width() * value / scale
            if w > 0:
                segment = QRectF(x, track.top(), w, track.height())
                segments.append((segment, QColor(COLORS[key]), gib(value).removesuffix(" GiB")))
                painter.fillRect(segment, segments[-1][1])
                x += w
        if bar.over:  # the part past the budget, hatched
            over = QRectF(limit, track.top(), x - limit, track.height())
            painter.fillRect(over, QBrush(QColor(OVER_COLOR), Qt.BrushStyle.BDiagPattern))
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
            painter.setPen(QPen(QColor(OVER_COLOR), 2))
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
            lines.append(_capitalized(bar.detail))
        lines.append("The budget is the free memory less the safety margin.")
        return "<br>".join(lines)


# -- small widgets --------------------------------------------------------------------------


class _PathLabel(QLabel):
    """A path elided in the middle to fit; the whole path in the tooltip."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._full = ""
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)

    def set_path(self, path: str) -> None:
        self._full = path
        self.setToolTip(path)
        self._elide()

    def resizeEvent(self, event: QEvent) -> None:
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        metrics = self.fontMetrics()
        self.setText(metrics.elidedText(self._full, Qt.TextElideMode.ElideMiddle, self.width()))


def _label(text: str = "", parent: QWidget | None = None, *, role: str = "") -> QLabel:
    label = QLabel(text, parent)
    label.setWordWrap(True)
    label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    if role:
        label.setObjectName(role)
    return label


def _card(title: str, parent: QWidget) -> tuple[QFrame, QVBoxLayout]:
    card = QFrame(parent)
    card.setObjectName("card")
    column = QVBoxLayout(card)
    column.setContentsMargins(16, 14, 16, 16)
    column.setSpacing(10)
    heading = QLabel(title, card)
    heading.setObjectName("card-title")
    column.addWidget(heading)
    return card, column


# -- the dialog -----------------------------------------------------------------------------


class HardwareWizard(QDialog):
    """Devices, engine, a model and its live plan; Apply saves the plan for that model."""

    applied = Signal(dict)  # the saved load settings: planner.load_options(plan) + "engine"
    planned = Signal(object)  # a new Plan is on screen

    def __init__(
        self, model_path: str, hardware: Hardware | None = None, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Hardware")
        self.setAccessibleName("Hardware")
        self.setObjectName("hardware-wizard")
        self._restyle()
        self.resize(1100, 880)
        self.setMinimumSize(860, 560)
        self.model_path = str(model_path)
        self.hardware: Hardware | None = None
        self.info: GGUFInfo | None = None
        self.plan: Plan | None = None
        self.plan_result: PlanResult | None = None
        self.alternative_buttons: list[QPushButton] = []
        self._stops: list[int] = list(CONTEXT_STOPS)
        self._generation: dict[str, int] = {"hardware": 0, "model": 0, "plan": 0}
        self._running: set[str] = set()
        self._pool = QThreadPool(self)
        self._pool.setMaxThreadCount(2)
        self._relay = _Relay(self)
        self._relay.done.connect(self._job_done)
        self._relay.failed.connect(self._job_failed)
        self._debounce = QTimer(self)
        self._debounce.setSingleShot(True)
        self._debounce.setInterval(PLAN_DEBOUNCE_MS)
        self._debounce.timeout.connect(self._start_plan)

        self._build()
        self._connect()
        if hardware is None:
            self.machine_status.setText("Looking for GPUs…")
            self._submit("hardware", detect)
        else:
            self._show_hardware(hardware)
        self.set_model(self.model_path)

    # -- layout --

    def _build(self) -> None:
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.setSpacing(0)
        body = QScrollArea(self)
        body.setObjectName("wizard-body")
        body.setWidgetResizable(True)
        body.setFrameShape(QFrame.Shape.NoFrame)
        contents = QWidget(body)
        contents.setObjectName("wizard-contents")
        body.setWidget(contents)
        page = QVBoxLayout(contents)
        page.setContentsMargins(20, 18, 20, 12)
        page.setSpacing(14)
        intro = _label(
            "Where each part of the model lives on this machine: which layers and experts go "
            "to each GPU, and which stay in system RAM.",
            contents,
            role="lead",
        )
        page.addWidget(intro)
        columns = QHBoxLayout()
        columns.setSpacing(14)
        left = QVBoxLayout()
        left.setSpacing(14)
        left.addWidget(self._build_machine(contents))
        left.addWidget(self._build_model(contents))
        left.addWidget(self._build_settings(contents))
        left.addStretch(1)
        right = QVBoxLayout()
        right.addWidget(self._build_plan(contents))
        right.addStretch(1)
        columns.addLayout(left, 11)
        columns.addLayout(right, 12)
        page.addLayout(columns, 1)
        outer.addWidget(body, 1)

        buttons = QDialogButtonBox(self)
        self.apply_button = buttons.addButton("Apply", QDialogButtonBox.ButtonRole.AcceptRole)
        described(
            self.apply_button,
            "Apply",
            "Save this plan as the model's load settings; Stoke loads the model with it",
        )
        self.apply_button.setDefault(True)
        self.cancel_button = buttons.addButton(QDialogButtonBox.StandardButton.Cancel)
        described(self.cancel_button, "Cancel", "Close without saving anything")
        self.apply_button.clicked.connect(self.apply)
        self.cancel_button.clicked.connect(self.reject)
        self.apply_error = _label("", self)
        self.apply_error.setStyleSheet(f"color: {OVER_COLOR};")
        self.apply_error.hide()
        footer = QHBoxLayout()
        footer.setContentsMargins(20, 10, 20, 16)
        footer.addWidget(self.apply_error, 1)
        footer.addWidget(buttons)
        line = QFrame(self)
        line.setFrameShape(QFrame.Shape.HLine)
        line.setStyleSheet("color: palette(mid);")
        outer.addWidget(line)
        outer.addLayout(footer)

    def _build_machine(self, parent: QWidget) -> QFrame:
        card, column = _card("This machine", parent)
        self.device_table = QTableWidget(0, 4, card)
        self.device_table.setObjectName("devices")
        described(
            self.device_table,
            "Detected devices",
            "The GPUs llama.cpp can use and the CPU with system RAM; free memory is what a "
            "plan may fill",
        )
        self.device_table.setHorizontalHeaderLabels(["Device", "Kind", "Free", "Total"])
        header = self.device_table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for col in (1, 2, 3):
            header.setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
        header.setHighlightSections(False)
        self.device_table.verticalHeader().hide()
        self.device_table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.device_table.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.device_table.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.device_table.setShowGrid(False)
        self.device_table.setAlternatingRowColors(True)
        self.device_table.setWordWrap(False)
        self.device_table.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.device_table.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.device_table.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        column.addWidget(self.device_table)
        self.machine_status = _label("", card)
        self.machine_status.setAccessibleName("GPU support")
        column.addWidget(self.machine_status)
        self.rebuild_hint = _label("", card, role="muted")
        self.rebuild_hint.setAccessibleName("How to enable GPU support")
        self.rebuild_hint.hide()
        column.addWidget(self.rebuild_hint)
        self.engine_label = _label("", card)
        self.engine_label.setAccessibleName("Recommended engine")
        column.addWidget(self.engine_label)
        return card

    def _build_model(self, parent: QWidget) -> QFrame:
        card, column = _card("Model", parent)
        row = QHBoxLayout()
        row.setSpacing(10)
        names = QVBoxLayout()
        names.setSpacing(2)
        self.model_name = _label("", card)
        self.model_name.setAccessibleName("Model name")
        bold = QFont(self.model_name.font())
        bold.setWeight(QFont.Weight.DemiBold)
        self.model_name.setFont(bold)
        self.model_path_label = _PathLabel(card)
        self.model_path_label.setObjectName("muted")
        self.model_path_label.setAccessibleName("Model file")
        names.addWidget(self.model_name)
        names.addWidget(self.model_path_label)
        row.addLayout(names, 1)
        self.model_button = QPushButton("Choose…", card)
        described(self.model_button, "Choose model", "Pick another GGUF model file to plan for")
        row.addWidget(self.model_button, 0, Qt.AlignmentFlag.AlignTop)
        column.addLayout(row)
        facts = QGridLayout()
        facts.setHorizontalSpacing(16)
        facts.setVerticalSpacing(6)
        self.facts: dict[str, QLabel] = {}
        for i, (key, title) in enumerate(
            (
                ("architecture", "Architecture"),
                ("size", "Size"),
                ("quantization", "Quantization"),
                ("layers", "Layers"),
                ("experts", "Experts"),
                ("context", "Trained context"),
            )
        ):
            name = _label(title, card, role="muted")
            value = _label("—", card)
            value.setAccessibleName(title)
            self.facts[key] = value
            facts.addWidget(name, i // 2, (i % 2) * 2)
            facts.addWidget(value, i // 2, (i % 2) * 2 + 1)
        facts.setColumnStretch(1, 1)
        facts.setColumnStretch(3, 1)
        column.addLayout(facts)
        self.model_error = _label("", card)
        self.model_error.setStyleSheet(f"color: {OVER_COLOR};")
        self.model_error.setAccessibleName("Model problem")
        self.model_error.hide()
        column.addWidget(self.model_error)
        return card

    def _build_settings(self, parent: QWidget) -> QFrame:
        card, column = _card("How it runs", parent)
        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        form.setLabelAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)
        form.setHorizontalSpacing(14)
        form.setVerticalSpacing(10)

        self.engine_combo = QComboBox(card)
        described(
            self.engine_combo,
            "Engine",
            "What runs this model: llama.cpp (the plan below places its tensors) or MLX "
            "(Apple Silicon's GPU in unified memory)",
        )
        for name, text in ENGINE_TEXT.items():
            self.engine_combo.addItem(text, name)
        form.addRow("Engine", self.engine_combo)

        self.context_slider = QSlider(Qt.Orientation.Horizontal, card)
        described(
            self.context_slider,
            "Context length",
            "The longest conversation the model holds at once, in tokens; its KV cache grows "
            "with it",
        )
        self.context_slider.setTickPosition(QSlider.TickPosition.TicksBelow)
        self.context_slider.setTickInterval(1)
        self.context_slider.setPageStep(2)
        self.context_value = QLabel("", card)
        self.context_value.setAccessibleName("Context length in tokens")
        self.context_value.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self.context_value.setMinimumWidth(
            self.context_value.fontMetrics().horizontalAdvance("1,048,576 tokens") + 4
        )
        self.context_min = _label("", card, role="muted")
        self.context_max = _label("", card, role="muted")
        self.context_max.setAlignment(Qt.AlignmentFlag.AlignRight)
        slider_box = QGridLayout()
        slider_box.setHorizontalSpacing(10)
        slider_box.setVerticalSpacing(0)
        slider_box.addWidget(self.context_slider, 0, 0, 1, 2)
        slider_box.addWidget(self.context_value, 0, 2)
        slider_box.addWidget(self.context_min, 1, 0)
        slider_box.addWidget(self.context_max, 1, 1)
        slider_box.setColumnStretch(0, 1)
        slider_box.setColumnStretch(1, 1)
        form.addRow("Context", slider_box)

        self.profile_combo = QComboBox(card)
        described(
            self.profile_combo,
            "Profile",
            "What the model spends its time on, which sets the micro-batch",
        )
        for profile in PROFILES:
            text, tip = PROFILE_TEXT[profile]
            self.profile_combo.addItem(text, profile)
            self.profile_combo.setItemData(
                self.profile_combo.count() - 1, tip, Qt.ItemDataRole.ToolTipRole
            )
        form.addRow("Profile", self.profile_combo)

        self.kv_combo = QComboBox(card)
        described(
            self.kv_combo,
            "KV cache type",
            "How the conversation's KV cache is stored: smaller types leave room for more "
            "experts on the GPUs",
        )
        for kv in KV_TYPES:
            self.kv_combo.addItem(KV_TEXT.get(kv, kv), kv)
        form.addRow("KV cache", self.kv_combo)

        self.ubatch_combo = QComboBox(card)
        described(
            self.ubatch_combo,
            "Micro-batch",
            "Tokens read per step of prefill: larger is faster for long prompts but needs "
            "larger compute buffers. Automatic picks it for the profile.",
        )
        for ub in UBATCHES:
            self.ubatch_combo.addItem("Automatic (by profile)" if ub is None else f"{ub:,}", ub)
        form.addRow("Micro-batch", self.ubatch_combo)

        self.resident_spin = QSpinBox(card)
        described(
            self.resident_spin,
            "Conversations kept loaded",
            "How many conversations stay in memory at once, so switching between them costs "
            "nothing; each may add its own KV cache",
        )
        self.resident_spin.setRange(1, MAX_RESIDENT)
        self.resident_spin.setValue(
            max(1, min(Settings.load().resident_conversations, MAX_RESIDENT))
        )
        self.resident_spin.setFixedWidth(80)
        self.resident_spin.setAlignment(Qt.AlignmentFlag.AlignRight)
        form.addRow("Conversations", self.resident_spin)

        self.kv_ram_check = QCheckBox("Keep the KV cache in system RAM", card)
        described(
            self.kv_ram_check,
            "KV cache in RAM",
            "Frees GPU memory for experts at the cost of slower attention (llama.cpp -nkvo)",
        )
        form.addRow("", self.kv_ram_check)
        column.addLayout(form)
        self._set_stops(list(CONTEXT_STOPS), DEFAULT_CONTEXT)
        return card

    def _build_plan(self, parent: QWidget) -> QFrame:
        card, column = _card("Memory plan", parent)
        title = column.itemAt(0).widget()
        column.removeWidget(title)
        heading = QHBoxLayout()
        heading.addWidget(title)
        heading.addStretch(1)
        self.fit_chip = QLabel("", card)
        self.fit_chip.setObjectName("fit-chip")
        self.fit_chip.setAccessibleName("Whether the plan fits")
        heading.addWidget(self.fit_chip)
        column.insertLayout(0, heading)

        self.chart = PlanChart(card)
        column.addWidget(self.chart)
        self.summary_label = _label("", card)
        self.summary_label.setAccessibleName("Plan summary")
        bold = QFont(self.summary_label.font())
        bold.setWeight(QFont.Weight.DemiBold)
        self.summary_label.setFont(bold)
        column.addWidget(self.summary_label)
        self.details_label = _label("", card, role="muted")
        self.details_label.setAccessibleName("Plan details")
        column.addWidget(self.details_label)
        self.status_label = _label("", card)
        self.status_label.setAccessibleName("Plan status")
        column.addWidget(self.status_label)
        self.warnings_label = _label("", card, role="muted")
        self.warnings_label.setAccessibleName("Warnings")
        self.warnings_label.setTextFormat(Qt.TextFormat.RichText)
        column.addWidget(self.warnings_label)
        self.alternatives_title = _label("", card)
        self.alternatives_title.setAccessibleName("Other choices")
        column.addWidget(self.alternatives_title)
        self.alternatives_box = QVBoxLayout()
        self.alternatives_box.setSpacing(6)
        column.addLayout(self.alternatives_box)
        self.alternatives_note = _label("", card, role="muted")
        column.addWidget(self.alternatives_note)
        actions = QHBoxLayout()
        actions.addStretch(1)
        self.copy_button = QPushButton("Copy llama-server command", card)
        described(
            self.copy_button,
            "Copy llama-server command",
            "Copy the llama-server command line that loads the model with this plan",
        )
        self.copy_button.clicked.connect(self._copy_command)
        actions.addWidget(self.copy_button)
        column.addLayout(actions)
        for widget in (self.alternatives_title, self.alternatives_note):
            widget.hide()
        return card

    def _connect(self) -> None:
        self.model_button.clicked.connect(self._choose_model)
        self.context_slider.valueChanged.connect(self._context_moved)
        self.profile_combo.currentIndexChanged.connect(self._request_plan)
        self.kv_combo.currentIndexChanged.connect(self._request_plan)
        self.ubatch_combo.currentIndexChanged.connect(self._request_plan)
        self.resident_spin.valueChanged.connect(self._request_plan)
        self.kv_ram_check.toggled.connect(self._request_plan)

    # -- jobs --

    def _submit(self, kind: str, work: Callable[[], object]) -> None:
        self._generation[kind] += 1
        self._running.add(kind)
        self._pool.start(_Job(self._relay, kind, self._generation[kind], work))
        self._update_apply()

    def _job_done(self, kind: str, generation: int, result: object) -> None:
        if generation != self._generation[kind]:
            return
        self._running.discard(kind)
        if kind == "hardware":
            self._show_hardware(result)  # type: ignore[arg-type]
        elif kind == "model":
            info, saved = result  # type: ignore[misc]
            self._show_model(info, saved)
        else:
            self._show_plan(result)  # type: ignore[arg-type]
        self._update_apply()

    def _job_failed(self, kind: str, generation: int, message: str) -> None:
        if generation != self._generation[kind]:
            return
        self._running.discard(kind)
        if kind == "hardware":
            self.machine_status.setText(f"Stoke could not look at this machine's GPUs: {message}")
        elif kind == "model":
            self.info = None
            self.model_error.setText(message)
            self.model_error.show()
            self._show_no_plan("Choose a GGUF model to plan for.")
        else:
            self._show_no_plan(f"Stoke could not plan this model: {message}")
        self._update_apply()

    def idle(self) -> bool:
        """Nothing to detect, read or plan is pending: what is shown is current."""
        return not self._running and not self._debounce.isActive()

    # -- the machine --

    def _show_hardware(self, hw: Hardware) -> None:
        self.hardware = hw
        table = self.device_table
        table.setRowCount(0)
        rows: list[tuple[str, str, int, int, str]] = []
        kinds = {"gpu": "GPU", "igpu": "Integrated GPU", "accel": "Accelerator"}
        for g in hw.gpus:
            rows.append(
                (
                    f"{g.name} · {g.description}" if g.description else g.name,
                    f"{kinds.get(g.kind, g.kind)} · {g.backend.upper()}",
                    g.memory_free,
                    g.memory_total,
                    f"{g.description or g.name}: {gib(g.memory_free)} free of "
                    f"{gib(g.memory_total)}",
                )
            )
        cores = hw.cpu.physical_cores or hw.cpu.logical_cores
        rows.append(
            (
                hw.cpu.name,
                f"CPU · {cores} cores",
                hw.memory.available,
                hw.memory.total,
                f"{hw.cpu.name}: {hw.cpu.physical_cores or '?'} cores, "
                f"{hw.cpu.logical_cores} threads; system RAM {gib(hw.memory.available)} "
                f"available of {gib(hw.memory.total)}",
            )
        )
        right = Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter
        for row, (name, kind, free, total, tip) in enumerate(rows):
            table.insertRow(row)
            for col, (text, align) in enumerate(
                ((name, None), (kind, None), (gib(free), right), (gib(total), right))
            ):
                item = QTableWidgetItem(text)
                item.setToolTip(tip)
                if align is not None:
                    item.setTextAlignment(align)
                table.setItem(row, col, item)
        table.resizeRowsToContents()
        height = table.horizontalHeader().height() + 2
        height += sum(table.rowHeight(r) for r in range(table.rowCount()))
        table.setFixedHeight(height)

        if hw.gpus and hw.gpu_offload:
            backends = ", ".join(sorted({g.backend.upper() for g in hw.gpus}))
            which = "the GPU" if len(hw.gpus) == 1 else f"all {len(hw.gpus)} GPUs"
            self.machine_status.setText(f"llama.cpp can use {which} ({backends}).")
            self.machine_status.setStyleSheet(f"color: {FIT_COLOR};")
        elif hw.gpus:
            self.machine_status.setText(
                "This llama.cpp was built without GPU support, so the GPUs sit idle: "
                "everything is planned on the CPU."
            )
            self.machine_status.setStyleSheet(f"color: {OVER_COLOR};")
        else:
            self.machine_status.setText(
                "No GPU that llama.cpp can use was found: everything runs on the CPU."
            )
            self.machine_status.setStyleSheet("")
        hints = [hw.rebuild_hint] if hw.rebuild_hint else []
        hints += list(hw.notes)
        self.rebuild_hint.setText("\n".join(h for h in hints if h))
        self.rebuild_hint.setVisible(bool(hints))
        engine, reason = recommended_engine(hw)
        self.engine_label.setText(f"Recommended engine: <b>{engine}</b>. {_html(reason)}")
        self.kv_ram_check.setEnabled(bool(budgets(hw)[0]))
        self._request_plan()

    # -- the model --

    def _choose_model(self) -> None:
        start = str(Path(self.model_path).parent) if self.model_path else ""
        if not start and self.hardware is not None:
            start = self.hardware.models_dir
        path, _ = QFileDialog.getOpenFileName(
            self, "Choose a model", start, "GGUF models (*.gguf);;All files (*)"
        )
        if path:
            self.set_model(path)

    def set_model(self, path: str) -> None:
        """Plan for the model at `path` (read in the background)."""
        self.model_path = str(path)
        self.info = None
        self._debounce.stop()
        self._generation["plan"] += 1  # a plan of the previous model, still running, is moot
        self._running.discard("plan")
        self.model_name.setText(Path(path).name)
        self.model_path_label.set_path(str(Path(path).expanduser().parent))
        self.model_error.hide()
        for value in self.facts.values():
            value.setText("…")
        self._show_no_plan("Reading the model…")
        self._submit("model", lambda p=self.model_path: read_model(p))

    def _show_model(self, info: GGUFInfo, saved: dict[str, Any] | None) -> None:
        self.info = info
        self.model_name.setText(info.name or info.path.name)
        quant = info.file_type or max(
            {t.ggml_type for t in info.tensors},
            key=lambda q: sum(t.n_bytes for t in info.tensors if t.ggml_type == q),
            default="—",
        )
        experts = "none (dense)"
        if info.expert_count:
            experts = f"{info.expert_count}"
            if info.expert_used_count:
                experts += f", {info.expert_used_count} per token"
        values = {
            "architecture": info.architecture,
            "size": file_size(info.total_bytes),
            "quantization": quant,
            "layers": str(info.block_count or "—"),
            "experts": experts,
            "context": f"{info.context_length:,} tokens" if info.context_length else "—",
        }
        for key, text in values.items():
            self.facts[key].setText(text)
        saved = saved or {}
        n_ctx = int(saved.get("n_ctx") or min(DEFAULT_CONTEXT, info.context_length or 1 << 30))
        self._set_stops(context_stops(info.context_length, n_ctx), n_ctx)
        with QSignalBlocker(self.kv_combo):
            index = self.kv_combo.findData(saved.get("kv_type", "f16"))
            self.kv_combo.setCurrentIndex(max(index, 0))
        with QSignalBlocker(self.kv_ram_check):
            self.kv_ram_check.setChecked(saved.get("kv_offload") is False)
        if saved.get("n_seq_max"):
            with QSignalBlocker(self.resident_spin):
                self.resident_spin.setValue(int(saved["n_seq_max"]))
        self._show_engines(info, saved.get("engine"))
        self._request_plan()

    def _show_engines(self, info: GGUFInfo, saved: str | None) -> None:
        """Offer MLX where it can run this model; select the saved engine, else the one
        this machine runs the model best with."""
        runs = mlx_installed() and info.architecture in GGUF_BUILDERS
        item = self.engine_combo.model().item(self.engine_combo.findData("mlx"))
        item.setEnabled(runs)
        item.setToolTip(
            "" if runs else f"MLX is not installed here or does not run {info.architecture}"
        )
        engine = saved if saved in ENGINE_TEXT else platform_choice(info.path).engine
        if engine == "mlx" and not runs:
            engine = "llama.cpp"
        self.engine_combo.setCurrentIndex(self.engine_combo.findData(engine))

    # -- inputs --

    def _set_stops(self, stops: list[int], n_ctx: int) -> None:
        self._stops = stops
        nearest = min(range(len(stops)), key=lambda i: abs(math.log(stops[i] / max(n_ctx, 1))))
        with QSignalBlocker(self.context_slider):
            self.context_slider.setRange(0, len(stops) - 1)
            self.context_slider.setValue(nearest)
        self.context_min.setText(short_tokens(stops[0]))
        self.context_max.setText(short_tokens(stops[-1]))
        self._show_context()

    def _show_context(self) -> None:
        self.context_value.setText(f"{self.context():,} tokens")

    def _context_moved(self, _index: int) -> None:
        self._show_context()
        self._request_plan()

    def context(self) -> int:
        return self._stops[self.context_slider.value()]

    def set_context(self, n_ctx: int) -> None:
        """Move the slider to the stop nearest `n_ctx`."""
        nearest = min(range(len(self._stops)), key=lambda i: abs(math.log(self._stops[i] / n_ctx)))
        self.context_slider.setValue(nearest)

    def devices(self) -> list[DeviceBudget]:
        return budgets(self.hardware)[0] if self.hardware else []

    def plan_kwargs(self) -> dict[str, Any]:
        """The planner's inputs, as the controls show them."""
        ram = budgets(self.hardware)[1] if self.hardware else 0
        return {
            "ram_bytes": ram,
            "n_ctx": self.context(),
            "n_ubatch": self.ubatch_combo.currentData(),
            "kv_type": self.kv_combo.currentData(),
            "profile": self.profile_combo.currentData(),
            "n_seq_max": self.resident_spin.value(),
            "kv_offload": not (self.kv_ram_check.isChecked() and self.devices()),
        }

    # -- planning --

    def _request_plan(self) -> None:
        if self.info is None or self.hardware is None:
            return
        self.fit_chip.setText("Planning…")
        self.fit_chip.setStyleSheet("background: #8a8f98;")
        self._debounce.start()
        self._update_apply()

    def _start_plan(self) -> None:
        if self.info is None or self.hardware is None:
            return
        info, devices, kwargs = self.info, self.devices(), self.plan_kwargs()
        self._submit("plan", lambda: compute_plan(info, devices, **kwargs))

    def _show_no_plan(self, message: str) -> None:
        self.plan = None
        self.plan_result = None
        self.chart.set_plan(None, message)
        self.fit_chip.setText("")
        self.fit_chip.setStyleSheet("background: transparent;")
        for label in (self.summary_label, self.details_label, self.status_label):
            label.setText("")
        self.warnings_label.setText("")
        self._set_alternatives(None, [])
        self.copy_button.setEnabled(False)

    def _show_plan(self, result: PlanResult) -> None:
        p = result.plan
        self.plan = p
        self.plan_result = result
        self.chart.set_plan(p)
        self.fit_chip.setText("Fits" if p.fits else "Does not fit")
        self.fit_chip.setStyleSheet(f"background: {FIT_COLOR if p.fits else OVER_COLOR};")
        self.summary_label.setText(summary(p))
        self.details_label.setText(details(p))
        if p.fits:
            self.status_label.setText("Every device stays within its budget.")
            self.status_label.setStyleSheet(f"color: {FIT_COLOR};")
        else:
            self.status_label.setText(f"This does not fit. {p.minimum or ''}".strip())
            self.status_label.setStyleSheet(f"color: {OVER_COLOR}; font-weight: 600;")
        notes = list(p.warnings)
        if self.hardware is not None and self.hardware.apple is not None and self.devices():
            notes.append(
                "On Apple Silicon the GPU and the CPU share one memory: the GPU bar and the "
                "RAM bar draw on the same gigabytes."
            )
        self.warnings_label.setText(
            "".join(f"<p style='margin:0 0 4px 0'>⚠ {_html(n)}</p>" for n in notes)
        )
        self.warnings_label.setVisible(bool(notes))
        self._set_alternatives(p, useful_alternatives(p, result.alternatives)[:MAX_CHOICES])
        self.copy_button.setEnabled(True)
        self.copy_button.setToolTip(p.command)
        self.planned.emit(p)

    def _set_alternatives(self, p: Plan | None, alts: list[Plan]) -> None:
        for button in self.alternative_buttons:
            self.alternatives_box.removeWidget(button)
            button.deleteLater()
        self.alternative_buttons = []
        self.alternatives_title.setVisible(bool(alts))
        self.alternatives_note.hide()
        if p is None or not alts:
            return
        self.alternatives_title.setText(
            "More experts on the GPUs with:" if p.fits else "Choices to try:"
        )
        for a in alts:
            button = QPushButton(("✓  " if a.fits else "✗  ") + choice_text(a), self)
            button.setObjectName("alternative")
            described(
                button,
                choice_text(a),
                "Use these settings"
                + ("" if a.fits else " (this alone does not fit either, but gets closer)"),
            )
            button.setCursor(Qt.CursorShape.PointingHandCursor)
            button.clicked.connect(lambda _=False, choice=a: self.use_alternative(choice))
            self.alternatives_box.addWidget(button)
            button.show()  # at once: a layout only queues the show of a widget added late
            self.alternative_buttons.append(button)
        if not p.fits and not any(a.fits for a in alts):
            self.alternatives_note.setText(
                "None of these changes fits on its own; the message above says what would."
            )
            self.alternatives_note.show()

    def use_alternative(self, choice: Plan) -> None:
        """Set the controls to an alternative's choices (and plan them)."""
        for combo, value in ((self.ubatch_combo, choice.n_ubatch), (self.kv_combo, choice.kv_type)):
            with QSignalBlocker(combo):
                combo.setCurrentIndex(max(combo.findData(value), 0))
        with QSignalBlocker(self.kv_ram_check):
            self.kv_ram_check.setChecked(not choice.kv_offload)
        self._request_plan()

    def _copy_command(self) -> None:
        if self.plan is not None:
            QGuiApplication.clipboard().setText(self.plan.command)

    # -- apply --

    def _update_apply(self) -> None:
        ready = self.plan is not None and self.plan.fits and self.idle()
        self.apply_button.setEnabled(ready)

    def apply(self) -> None:
        """Save the plan as the model's load settings, emit `applied`, and close."""
        if self.plan is None or not self.plan.fits or not self.idle():
            return
        options = {**load_options(self.plan), "engine": self.engine_combo.currentData()}
        try:
            load_settings.save(self.model_path, options)
        except OSError as exc:
            self.apply_error.setText(f"Stoke could not save the settings: {exc.strerror or exc}.")
            self.apply_error.show()
            return
        self.applied.emit(options)
        self.accept()

    def _restyle(self) -> None:
        """Cards are white in the light theme; in the dark one they are raised a shade, so
        inputs (which draw on the base color) still stand out from them."""
        sheet = STYLE % {"card": "alternate-base" if is_dark(self.palette()) else "base"}
        if sheet != self.styleSheet():
            self.setStyleSheet(sheet)

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:
            self._restyle()

    def done(self, result: int) -> None:
        self._debounce.stop()
        super().done(result)


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
