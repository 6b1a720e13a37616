"""The hardware wizard, offscreen, on the full-size sparse DeepSeek-V4-Flash replica and on
the bundled SmolLM2, for described machines: what it lists, what it plans, what it saves."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QAbstractButton,
    QApplication,
    QComboBox,
    QFileDialog,
    QSlider,
    QSpinBox,
    QTableWidget,
    QWidget,
)
from pytestqt.qtbot import QtBot

from app.engine.choice import mlx_installed
from app.engine.gguf_info import inspect_gguf
from app.hardware.detect import CpuInfo, GpuInfo, Hardware, MemoryInfo, rebuild_hint
from app.hardware.memory import GIB
from app.hardware.planner import DeviceBudget, Plan, plan
from app.hardware.synthetic_gguf import write_deepseek4
from app.models import load_settings
from app.models.default import default_model_path
from app.models.names import model_name
from app.ui import theme
from app.ui.hardware import CONTEXT_STOPS, PLAN_DEBOUNCE_MS, HardwareWizard
from app.units import decimal_bytes, gib

READ_TIMEOUT_MS = 120_000  # the first read of the 150 GB replica's header takes seconds
PLAN_TIMEOUT_MS = 20_000
SCREENSHOT = Path("/tmp/wizard.png")


@pytest.fixture(scope="session")
def flash(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_deepseek4(tmp_path_factory.mktemp("flash") / "flash.gguf", mode="full")


def machine(n_gpus: int, gpu_gib: int, ram_gib: int, *, offload: bool = True) -> Hardware:
    """A described machine: `n_gpus` CUDA GPUs with all their memory free, and RAM."""
    gpus = tuple(
        GpuInfo(
            index=i,
            name=f"CUDA{i}",
            description="NVIDIA GeForce RTX 3060",
            kind="gpu",
            backend="cuda",
            memory_free=gpu_gib * GIB,
            memory_total=gpu_gib * GIB,
        )
        for i in range(n_gpus)
    )
    return Hardware(
        os="Linux",
        machine="x86_64",
        cpu=CpuInfo("AMD Ryzen 9 5950X 16-Core Processor", 32, 16),
        memory=MemoryInfo(ram_gib * GIB, ram_gib * GIB),
        models_dir="/tmp",
        disk_free=1 << 40,
        gpus=gpus,
        gpu_offload=offload and bool(gpus),
        rebuild_hint=None if offload and gpus else rebuild_hint(),
    )


@pytest.fixture
def open_wizard(qtbot: QtBot) -> Callable[..., HardwareWizard]:
    def opener(model: Path, hardware: Hardware | None) -> HardwareWizard:
        wizard = HardwareWizard(str(model), hardware)
        qtbot.addWidget(wizard)
        wizard.show()
        qtbot.waitExposed(wizard)
        settle(qtbot, wizard, READ_TIMEOUT_MS)
        return wizard

    return opener


def settle(qtbot: QtBot, wizard: HardwareWizard, timeout: int = PLAN_TIMEOUT_MS) -> Plan:
    qtbot.waitUntil(lambda: wizard.idle() and wizard.plan is not None, timeout=timeout)
    return wizard.plan


def expected_plan(wizard: HardwareWizard, gpus: list[DeviceBudget], ram: int) -> Plan:
    """The planner's answer for what the controls show, asked independently of the wizard."""
    return plan(
        inspect_gguf(wizard.model_path),
        gpus,
        ram_bytes=ram,
        n_ctx=wizard.context(),
        profile=wizard.profile_combo.currentData(),
        kv_type=wizard.kv_combo.currentData(),
        n_seq_max=wizard.resident_spin.value(),
    )


def kv_total(p: Plan) -> int:
    return sum(d.kv for d in p.devices)


def test_the_device_table_lists_every_gpu_and_the_cpu(
    open_wizard: Callable[..., HardwareWizard], flash: Path
) -> None:
    wizard = open_wizard(flash, machine(4, 12, 128))
    table = wizard.device_table

    assert table.rowCount() == 5
    names = [table.item(row, 0).text() for row in range(5)]
    assert [n.split(" · ")[0] for n in names[:4]] == ["CUDA0", "CUDA1", "CUDA2", "CUDA3"]
    assert names[4] == "AMD Ryzen 9 5950X 16-Core Processor"
    assert table.item(0, 1).text() == "GPU · CUDA"
    assert table.item(4, 1).text() == "CPU · 16 cores"
    assert [table.item(0, col).text() for col in (2, 3)] == ["12.0 GiB", "12.0 GiB"]
    assert [table.item(4, col).text() for col in (2, 3)] == ["128.0 GiB", "128.0 GiB"]
    assert wizard.machine_status.text() == "llama.cpp can use all 4 GPUs (CUDA)."
    assert not wizard.rebuild_hint.isVisible()
    assert "llama.cpp" in wizard.engine_label.text()
    assert wizard.facts["architecture"].text() == "deepseek4"
    assert wizard.facts["layers"].text() == "43"
    assert wizard.facts["quantization"].text() == "MXFP4_MOE"
    assert wizard.facts["size"].text().endswith(" GB")
    assert wizard.context_slider.maximum() == len(CONTEXT_STOPS) - 1  # trained for 1M


def test_the_chart_has_one_bar_per_device_with_the_plans_totals(
    open_wizard: Callable[..., HardwareWizard], flash: Path
) -> None:
    wizard = open_wizard(flash, machine(4, 12, 128))
    gpus = [DeviceBudget(f"CUDA{i}", 12 * GIB) for i in range(4)]
    expected = expected_plan(wizard, gpus, 128 * GIB)

    bars = wizard.chart.bars
    assert [b.name for b in bars] == ["CUDA0", "CUDA1", "CUDA2", "CUDA3", "CPU"]
    assert [b.label for b in bars][-1] == "CPU RAM"
    for bar, device in zip(bars, expected.devices, strict=True):
        assert (bar.weights, bar.kv, bar.compute, bar.budget) == (
            device.weights,
            device.kv,
            device.compute,
            device.budget,
        )
        assert bar.total == device.total <= bar.budget
    assert expected.fits and wizard.plan.fits
    assert wizard.summary_label.text().startswith(
        f"Experts on GPUs: {expected.expert_layers_on_gpu:.1f} of 43 layers"
    )
    assert wizard.fit_chip.text() == "Fits"
    assert wizard.apply_button.isEnabled()
    assert "CUDA0" in wizard.chart.accessibleDescription()


def test_moving_the_context_slider_replans_once_and_the_kv_cache_grows(
    open_wizard: Callable[..., HardwareWizard], flash: Path, qtbot: QtBot
) -> None:
    wizard = open_wizard(flash, machine(4, 12, 128))
    before = wizard.plan
    plans: list[Plan] = []
    wizard.planned.connect(plans.append)

    for stop in (CONTEXT_STOPS.index(131_072), CONTEXT_STOPS.index(262_144)):
        wizard.context_slider.setValue(stop)  # quick moves: one plan, after the pause
    assert wizard.context_value.text() == "262,144 tokens"
    assert not wizard.apply_button.isEnabled()  # the plan on screen is stale
    qtbot.wait(PLAN_DEBOUNCE_MS // 3)
    wizard.context_slider.setValue(wizard.context_slider.maximum())
    after = settle(qtbot, wizard)

    assert len(plans) == 1
    assert after.n_ctx == 1_048_576 == wizard.context()
    assert kv_total(after) > kv_total(before)
    assert sum(b.kv for b in wizard.chart.bars) == kv_total(after)
    assert wizard.apply_button.isEnabled() == after.fits


def test_apply_saves_the_plan_as_the_models_load_settings(
    open_wizard: Callable[..., HardwareWizard], flash: Path, qtbot: QtBot
) -> None:
    wizard = open_wizard(flash, machine(4, 12, 128))
    wizard.set_context(262_144)
    wizard.kv_combo.setCurrentIndex(wizard.kv_combo.findData("q8_0"))
    shown = settle(qtbot, wizard)

    with qtbot.waitSignal(wizard.applied, timeout=PLAN_TIMEOUT_MS) as applied:
        qtbot.mouseClick(wizard.apply_button, Qt.MouseButton.LeftButton)

    saved = load_settings.load(flash)
    assert saved == applied.args[0]
    assert saved["engine"] == "llama.cpp"
    assert saved["overrides"] == shown.overrides and saved["overrides"]
    assert saved["overrides"][-1] == (r"_exps\.", "CPU")
    assert saved["n_ctx"] == 262_144 and saved["kv_type"] == "q8_0"
    assert saved["tensor_split"] == shown.tensor_split and len(saved["tensor_split"]) == 4
    assert wizard.result() == HardwareWizard.DialogCode.Accepted

    again = open_wizard(flash, machine(4, 12, 128))  # opens on what was saved
    assert again.context() == 262_144
    assert again.kv_combo.currentData() == "q8_0"


def test_a_machine_too_small_says_what_would_fit_and_offers_choices(
    open_wizard: Callable[..., HardwareWizard], flash: Path, qtbot: QtBot
) -> None:
    wizard = open_wizard(flash, machine(1, 8, 64))
    shown = wizard.plan

    assert not shown.fits
    assert wizard.fit_chip.text() == "Does not fit"
    assert wizard.status_label.text() == f"This does not fit. {shown.minimum}"
    assert "more RAM" in shown.minimum
    assert any(bar.over for bar in wizard.chart.bars)
    assert not wizard.apply_button.isEnabled()
    assert wizard.alternatives_title.text() == "Choices to try:"
    assert wizard.alternative_buttons
    assert all(b.isVisible() and b.accessibleName() for b in wizard.alternative_buttons)

    q8 = next(b for b in wizard.alternative_buttons if "KV q8_0" in b.text())
    qtbot.mouseClick(q8, Qt.MouseButton.LeftButton)
    replanned = settle(qtbot, wizard)
    assert wizard.kv_combo.currentData() == "q8_0"
    assert replanned.kv_type == "q8_0"
    assert replanned.n_ubatch == wizard.ubatch_combo.currentData()


def test_the_default_model_without_gpus_plans_everything_on_the_cpu(
    open_wizard: Callable[..., HardwareWizard],
) -> None:
    wizard = open_wizard(default_model_path(), machine(0, 0, 64))
    shown = wizard.plan

    assert wizard.device_table.rowCount() == 1
    assert "everything runs on the CPU" in wizard.machine_status.text()
    assert wizard.rebuild_hint.isVisible() and "CMAKE_ARGS" in wizard.rebuild_hint.text()
    assert [b.name for b in wizard.chart.bars] == ["CPU"]
    assert [d.name for d in shown.devices] == ["CPU"]
    assert shown.n_gpu_layers == 0 and not shown.overrides and shown.fits
    assert wizard.summary_label.text().startswith("Everything runs on the CPU")
    assert not wizard.kv_ram_check.isEnabled()
    assert wizard.facts["architecture"].text() == "llama"
    # the file's size, as Copy diagnostics and the library name it (not the weights' bytes)
    assert wizard.facts["size"].text() == decimal_bytes(default_model_path().stat().st_size)
    assert wizard.facts["size"].text().endswith(" MB")
    assert CONTEXT_STOPS[0] <= wizard.context() <= 8192 == wizard._stops[-1]
    assert wizard.apply_button.isEnabled()


def test_conversations_kept_loaded_say_their_kv_memory_multiplies(
    open_wizard: Callable[..., HardwareWizard], qtbot: QtBot
) -> None:
    """Each resident conversation has a KV stream of the whole context (kv_unified off): the
    note beside the spin and the plan's details say how many times one's KV that is."""
    wizard = open_wizard(default_model_path(), machine(0, 0, 64))
    wizard.resident_spin.setValue(1)
    one = settle(qtbot, wizard)
    assert wizard.resident_note.text() == "one KV cache of the whole context"
    assert "1 conversation kept loaded ·" in wizard.details_label.text()
    wizard.resident_spin.setValue(4)
    assert wizard.resident_note.text().endswith("4x the KV memory of one")
    qtbot.waitUntil(lambda: wizard.idle() and wizard.plan.n_seq_max == 4, timeout=PLAN_TIMEOUT_MS)
    four = wizard.plan
    assert kv_total(four) == 4 * kv_total(one)  # what the words claim, from the planner
    assert (
        f"4 conversations kept loaded, each with its own KV cache (4x the KV memory: "
        f"{gib(kv_total(four))}, {gib(kv_total(one))} each)" in wizard.details_label.text()
    )


def test_the_model_card_uses_the_display_name_and_decimal_file_units(
    open_wizard: Callable[..., HardwareWizard],
) -> None:
    """The card says the one name the header and library say, not the GGUF's general.name."""
    wizard = open_wizard(default_model_path(), machine(0, 0, 64))
    general = inspect_gguf(default_model_path()).metadata["general.name"]
    assert wizard.model_name.text() == model_name(default_model_path()) != general
    assert "MiB" not in wizard.facts["size"].text()


def test_the_engine_is_offered_per_model_and_saved_with_the_plan(
    open_wizard: Callable[..., HardwareWizard], qtbot: QtBot
) -> None:
    """Off Apple Silicon llama.cpp is preselected; MLX is offered for a llama GGUF where
    MLX is installed, and the choice is saved with the plan and shown again."""
    wizard = open_wizard(default_model_path(), machine(0, 0, 64))
    combo = wizard.engine_combo
    assert combo.currentData() == "llama.cpp"
    mlx_item = combo.model().item(combo.findData("mlx"))
    assert mlx_item.isEnabled() == mlx_installed()
    if not mlx_installed():
        return
    combo.setCurrentIndex(combo.findData("mlx"))
    with qtbot.waitSignal(wizard.applied, timeout=PLAN_TIMEOUT_MS):
        qtbot.mouseClick(wizard.apply_button, Qt.MouseButton.LeftButton)
    assert load_settings.load(default_model_path())["engine"] == "mlx"
    again = open_wizard(default_model_path(), machine(0, 0, 64))  # opens on what was saved
    assert again.engine_combo.currentData() == "mlx"


def test_a_gpu_build_missing_plans_on_the_cpu_and_says_how_to_rebuild(
    open_wizard: Callable[..., HardwareWizard],
) -> None:
    wizard = open_wizard(default_model_path(), machine(2, 12, 64, offload=False))

    assert wizard.device_table.rowCount() == 3
    assert "built without GPU support" in wizard.machine_status.text()
    assert "CMAKE_ARGS" in wizard.rebuild_hint.text()
    assert [b.name for b in wizard.chart.bars] == ["CPU"]


def test_choose_opens_another_model(
    open_wizard: Callable[..., HardwareWizard],
    flash: Path,
    qtbot: QtBot,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wizard = open_wizard(flash, machine(4, 12, 128))
    smol = str(default_model_path())
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *args, **kw: (smol, ""))

    qtbot.mouseClick(wizard.model_button, Qt.MouseButton.LeftButton)
    shown = settle(qtbot, wizard)

    assert wizard.model_path == smol
    assert shown.architecture == "llama" and wizard.facts["architecture"].text() == "llama"
    assert wizard.context() <= 8192


def test_a_file_that_is_not_a_model_is_explained(tmp_path: Path, qtbot: QtBot) -> None:
    wizard = HardwareWizard(str(tmp_path / "missing.gguf"), machine(1, 12, 64))
    qtbot.addWidget(wizard)

    qtbot.waitUntil(lambda: wizard.idle() and not wizard.model_error.isHidden())
    assert "not found" in wizard.model_error.text()
    assert wizard.plan is None and not wizard.apply_button.isEnabled()
    assert wizard.chart.bars == []


def test_without_hardware_it_detects_in_the_background(
    open_wizard: Callable[..., HardwareWizard], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("app.ui.hardware.wizard.detect", lambda: machine(2, 24, 256))

    wizard = open_wizard(default_model_path(), None)

    assert wizard.device_table.rowCount() == 3
    assert [b.name for b in wizard.chart.bars] == ["CUDA0", "CUDA1", "CPU"]


def test_every_control_has_an_accessible_name_and_a_tooltip(
    open_wizard: Callable[..., HardwareWizard], flash: Path
) -> None:
    wizard = open_wizard(flash, machine(1, 8, 64))  # with alternatives on screen
    controls = [
        w
        for kind in (QAbstractButton, QComboBox, QSlider, QSpinBox, QTableWidget)
        for w in wizard.findChildren(kind)
        if w.isVisibleTo(wizard)
    ]

    assert len(controls) >= 12
    for control in controls:
        assert control.accessibleName(), control
        assert control.toolTip(), control.accessibleName()
    assert wizard.chart.accessibleName() and wizard.chart.toolTip()


def test_screenshot(open_wizard: Callable[..., HardwareWizard], flash: Path, qtbot: QtBot) -> None:
    """Renders the wizard for the seed's box (4x RTX 3060 + 128 GiB) in the light theme."""
    app = QApplication.instance()
    palette, style_sheet, style = app.palette(), app.styleSheet(), app.style().name()
    theme.apply(app, "light")
    try:
        wizard = open_wizard(flash, machine(4, 12, 128))
        wizard.resize(1100, 880)
        qtbot.wait(100)
        assert wizard.grab().save(str(SCREENSHOT))
        assert_not_blank(wizard)
    finally:
        app.setStyle(style)
        app.setPalette(palette)
        app.setStyleSheet(style_sheet)


def assert_not_blank(widget: QWidget) -> None:
    image = widget.grab().toImage()
    colors = {image.pixel(x, y) for x in range(0, image.width(), 37) for y in (100, 200, 300)}
    assert len(colors) > 3
