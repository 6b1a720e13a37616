"""The hardware wizard: what this machine has, and where a model's tensors go on it.

Opened from Settings > Hardware, the first start's welcome and the Models page. It lists the
devices llama.cpp can use, recommends an engine, and plans the chosen model live: every
change of context, profile, KV type or micro-batch re-plans (after a short pause) and
redraws the per-device memory bars.
Apply stores the plan as the model's load settings (`app.models.load_settings`); the window
then reloads the model with it at once when it is the loaded one.

The slow parts never run on the UI thread: detecting GPUs starts a subprocess, reading the
header of a 150 GB GGUF takes seconds, and a plan with its alternatives takes 20-100 ms on
DeepSeek-V4-Flash (one `plan()` alone 2-15 ms). They run in a QThreadPool; each kind of job
carries a generation number, so the answer to an input that has since changed is dropped.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QEvent, QSignalBlocker, Qt, QThreadPool, QTimer, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QDialog, QFileDialog, QPushButton, QTableWidgetItem, QWidget

from app.engine.choice import mlx_installed, platform_choice
from app.engine.gguf_info import GGUFInfo
from app.engine.mlx.registry import GGUF_BUILDERS
from app.hardware.detect import Hardware, detect
from app.hardware.planner import DeviceBudget, Plan, load_options
from app.models import load_settings
from app.models.names import model_name
from app.settings import Settings
from app.ui import theme
from app.ui.a11y import described
from app.ui.background import Background
from app.ui.fit import fit_to_screen
from app.ui.hardware.cards import WizardCards
from app.ui.hardware.chart import is_dark
from app.ui.hardware.planning import (
    CONTEXT_STOPS,
    DEFAULT_CONTEXT,
    MAX_CHOICES,
    PlanResult,
    budgets,
    compute_plan,
    context_stops,
    read_model,
    recommended_engine,
    useful_alternatives,
)
from app.ui.hardware.words import (
    ENGINE_TEXT,
    choice_text,
    details,
    gib,
    html_text,
    short_tokens,
    summary,
)
from app.ui.theme import STATUS
from app.units import decimal_bytes

PLAN_DEBOUNCE_MS = 150


class HardwareWizard(WizardCards, QDialog):
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
        fit_to_screen(self)  # the cards scroll (WizardCards) on a smaller screen
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
        self._tasks = Background(self)
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

    # -- jobs --

    def _submit(self, kind: str, work: Callable[[], object]) -> None:
        self._generation[kind] += 1
        generation = self._generation[kind]
        self._running.add(kind)
        self._tasks.run(
            self._pool,
            work,
            lambda result: self._job_done(kind, generation, result),
            lambda message: self._job_failed(kind, generation, message),
        )
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
            self.machine_status.setStyleSheet(f"color: {STATUS['ok']};")
        elif hw.gpus:
            self.machine_status.setText(
                "This llama.cpp was built without GPU support, so the GPUs sit idle: "
                "everything is planned on the CPU."
            )
            self.machine_status.setStyleSheet(f"color: {STATUS['error']};")
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
        self.engine_label.setText(f"Recommended engine: <b>{engine}</b>. {html_text(reason)}")
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
        self.model_name.setText(model_name(path))
        self.model_path_label.set_path(str(Path(path).expanduser().parent))
        self.model_error.hide()
        for value in self.facts.values():
            value.setText("…")
        self._show_no_plan("Reading the model…")
        self._submit("model", lambda p=self.model_path: read_model(p))

    def _show_model(self, info: GGUFInfo, saved: dict[str, Any] | None) -> None:
        self.info = info
        self.model_name.setText(model_name(info.path))
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
            "size": decimal_bytes(info.file_bytes),  # the file's, as the library and doctor say
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
        """This machine's GPUs, then the rpc-servers' devices the remote card found."""
        local = budgets(self.hardware)[0] if self.hardware else []
        return [*local, *self.remote.devices]

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
        self.fit_chip.setStyleSheet(f"background: {STATUS['idle']};")
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
        self.fit_chip.setStyleSheet(f"background: {STATUS['ok' if p.fits else 'error']};")
        self.summary_label.setText(summary(p))
        self.details_label.setText(details(p))
        if p.fits:
            self.status_label.setText("Every device stays within its budget.")
            self.status_label.setStyleSheet(f"color: {STATUS['ok']};")
        else:
            self.status_label.setText(f"This does not fit. {p.minimum or ''}".strip())
            self.status_label.setStyleSheet(f"color: {STATUS['error']}; font-weight: 600;")
        notes = list(p.warnings)
        if self.hardware is not None and self.hardware.apple is not None and self.devices():
            notes.append(
                "On Apple Silicon the GPU and the CPU share one memory: the GPU bar and the "
                "RAM bar draw on the same gigabytes."
            )
        self.warnings_label.setText(
            "".join(f"<p style='margin:0 0 4px 0'>⚠ {html_text(n)}</p>" for n in notes)
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
            settings = Settings.load()
            if settings.rpc_servers != self.remote.text():
                settings.rpc_servers = self.remote.text()  # what `stoke doctor` checks
                settings.save()
        except OSError as exc:
            self.apply_error.setText(f"Stoke could not save the settings: {exc.strerror or exc}.")
            self.apply_error.show()
            return
        self.applied.emit(options)
        self.accept()

    def _restyle(self) -> None:
        """Cards are white in the light theme; in the dark one they are raised a shade, so
        inputs (which draw on the base color) still stand out from them."""
        card = "alternate-base" if is_dark(self.palette()) else "base"
        sheet = theme.stylesheet("hardware.qss", card=card)
        if sheet != self.styleSheet():
            self.setStyleSheet(sheet)

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:
            self._restyle()

    def done(self, result: int) -> None:
        self._debounce.stop()
        super().done(result)
