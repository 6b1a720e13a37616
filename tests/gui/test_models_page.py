"""The Models page offscreen: a real library under the test's STOKE_HOME, and downloads with
the real huggingface_hub client from the fake hub on loopback (tests/fakehub.py)."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import (
    QAbstractButton,
    QApplication,
    QComboBox,
    QFileDialog,
    QLineEdit,
    QMessageBox,
    QProgressBar,
    QTableView,
    QWidget,
)
from pytestqt.qtbot import QtBot

from app import paths
from app.hardware.detect import CpuInfo, GpuInfo, Hardware, MemoryInfo
from app.models.catalog import DOES_NOT_FIT, FITS_EXPERT_OFFLOAD, FITS_GPU, load_catalog, verdict
from app.models.default import default_model_path
from app.models.downloads import Downloads
from app.models.library import Library, ModelEntry
from app.ui import theme
from app.ui.models import (
    EMPTY_DOWNLOADS,
    EMPTY_LIBRARY,
    FIT_COLORS,
    DownloadRow,
    ImportDialog,
    ModelsDialog,
)
from app.ui.models.words import BUNDLED, BUNDLED_TIP, COLUMNS, LINKED
from tests.e2e.test_downloads import hub, keychain, manager  # noqa: F401 (fixtures)
from tests.fakehub import FakeHub
from tests.gui.harness import Harness

GIB = 1 << 30
WAIT_MS = 30_000
SMOL = "SmolLM2-135M-Instruct.Q4_1"
CATALOG_REPO = "mradermacher/SmolLM2-135M-Instruct-GGUF"
CATALOG_FILE = "SmolLM2-135M-Instruct.Q4_K_M.gguf"
SHOTS = Path("/tmp")


def workstation() -> Hardware:
    """One 24 GB GPU and 128 GB of RAM: every color of badge in the catalog."""
    gpu = GpuInfo(0, "CUDA0", "NVIDIA GeForce RTX 4090", "gpu", "cuda", 24 * GIB, 24 * GIB)
    return Hardware(
        os="Linux",
        machine="x86_64",
        cpu=CpuInfo("AMD Ryzen 9 7950X 16-Core Processor", 32, 16),
        memory=MemoryInfo(128 * GIB, 120 * GIB),
        models_dir="/tmp",
        disk_free=1 << 40,
        gpus=(gpu,),
        gpu_offload=True,
        rebuild_hint=None,
    )


@pytest.fixture
def open_dialog(qtbot: QtBot) -> Iterator[Callable[..., ModelsDialog]]:
    theme.apply(QApplication.instance(), "light")  # as the app draws it, for the screenshots
    opened: list[ModelsDialog] = []

    def opener(downloads: Downloads | None = None) -> ModelsDialog:
        dialog = ModelsDialog(Library(), downloads, workstation())
        qtbot.addWidget(dialog)
        dialog.show()
        qtbot.waitExposed(dialog)
        qtbot.waitUntil(lambda: not dialog.busy, timeout=WAIT_MS)
        opened.append(dialog)
        return dialog

    yield opener
    for dialog in opened:
        dialog.close()


def imported() -> ModelEntry:
    return Library().import_model(default_model_path(), "copy")


def cells(dialog: ModelsDialog, row: int = 0) -> list[str]:
    proxy = dialog.proxy
    return [proxy.index(row, col).data() for col in range(proxy.columnCount())]


def shoot(dialog: ModelsDialog, name: str, qtbot: QtBot) -> None:
    qtbot.wait(100)  # let layouts settle
    dialog.grab().save(str(SHOTS / f"models_{name}.png"))


def confirm_with(monkeypatch: pytest.MonkeyPatch, answer: QMessageBox.StandardButton) -> list[str]:
    """Answer every confirmation without showing it; returns the questions asked."""
    asked: list[str] = []

    def exec_(box: QMessageBox) -> int:
        asked.append(box.text())
        return answer

    monkeypatch.setattr(QMessageBox, "exec", exec_)
    return asked


# -- library -----------------------------------------------------------------------------------


def test_a_new_library_lists_the_bundled_model_read_only(
    open_dialog: Callable[..., ModelsDialog], qtbot: QtBot
) -> None:
    dialog = open_dialog()
    assert dialog.windowTitle() == "Models"
    assert [dialog.tabs.tabText(i) for i in range(3)] == ["Library", "Downloads", "Catalog"]
    assert dialog.library_stack.currentWidget() is not dialog.library_empty
    assert dialog.proxy.rowCount() == 1
    assert cells(dialog)[:2] == [SMOL, BUNDLED]
    # it lives in Stoke's install, not in the library folder
    assert dialog.total_label.text() == "1 model · 0 bytes in the library folder · 1 bundled"
    assert dialog.select_model(SMOL)
    assert dialog.selected_model().bundled
    assert BUNDLED_TIP in dialog.details_summary.text()
    # which engine runs it here (not Apple Silicon: llama.cpp), and its memory there
    assert "Runs here on llama.cpp, about 9" in dialog.details_summary.text()
    assert dialog.load_button.isEnabled() and not dialog.delete_button.isEnabled()
    shoot(dialog, "library_bundled", qtbot)
    assert dialog.downloads_stack.currentWidget() is dialog.downloads_empty
    assert dialog.downloads_empty.title.text() == EMPTY_DOWNLOADS


def test_the_badge_has_its_own_column_and_the_footer_says_where_models_live(
    open_dialog: Callable[..., ModelsDialog], tmp_path: Path
) -> None:
    """At 960 px the bundled model's name shows whole (no badge eating it), and the footer
    tells the library folder's bytes apart from the linked and bundled models."""
    other = tmp_path / "Aardvark-135M.gguf"
    shutil.copyfile(default_model_path(), other)
    Library().import_model(other, "link")
    dialog = open_dialog()
    dialog.resize(960, 600)
    QApplication.processEvents()
    assert [cells(dialog, r)[:2] for r in range(2)] == [["Aardvark-135M", LINKED], [SMOL, BUNDLED]]
    assert dialog.total_label.text() == (
        "2 models · 0 bytes in the library folder · 1 linked, 1 bundled"
    )
    table = dialog.table
    needed = table.fontMetrics().horizontalAdvance(SMOL)
    assert table.columnWidth(0) > needed  # the whole name, not "SmolLM2-135M-…_1"
    assert dialog.proxy.index(1, 1).data(Qt.ItemDataRole.ToolTipRole).startswith(BUNDLED_TIP)


def test_the_empty_library_says_what_to_do_without_the_bundled_model(
    open_dialog: Callable[..., ModelsDialog], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Library, "bundled", lambda self: None)  # its package uninstalled
    dialog = open_dialog()
    assert dialog.library_stack.currentWidget() is dialog.library_empty
    assert dialog.library_empty.title.text() == EMPTY_LIBRARY
    assert dialog.total_label.text() == "0 models · 0 bytes in the library folder"
    assert not dialog.load_button.isEnabled() and not dialog.delete_button.isEnabled()


def test_library_table_shows_the_default_model_with_its_metadata(
    open_dialog: Callable[..., ModelsDialog], qtbot: QtBot
) -> None:
    model = imported()
    dialog = open_dialog()
    assert dialog.proxy.rowCount() == 1
    assert cells(dialog) == [SMOL, "", "GGUF", "llama", "135M", "Q4_1", "8K", "98.4 MB"]
    assert dialog.total_label.text() == "1 model · 98.4 MB in the library folder"
    assert dialog.details_stack.currentIndex() == 0  # nothing selected yet

    assert dialog.select_model(model.id)
    assert dialog.details_name.text() == SMOL
    assert dialog.details_path.full_text() == str(model.path)
    assert dialog.details_fingerprint.text() == model.id
    assert dialog.details_template.text() == "Present in the model"
    assert dialog.details_files.text() == "One file"
    qtbot.waitUntil(lambda: dialog.details_settings.text() != "Reading…", timeout=WAIT_MS)
    assert dialog.details_settings.text() == "None saved: Plan… chooses them"
    assert dialog.load_button.isEnabled() and dialog.plan_button.isEnabled()
    shoot(dialog, "library", qtbot)


def test_table_sorts_and_filters(open_dialog: Callable[..., ModelsDialog], tmp_path: Path) -> None:
    imported()
    other = tmp_path / "Aardvark-135M.gguf"
    shutil.copyfile(default_model_path(), other)
    Library().import_model(other, "copy")
    dialog = open_dialog()
    assert [cells(dialog, r)[0] for r in range(2)] == ["Aardvark-135M", SMOL]
    dialog.table.sortByColumn(0, Qt.SortOrder.DescendingOrder)
    assert [cells(dialog, r)[0] for r in range(2)] == [SMOL, "Aardvark-135M"]
    dialog.filter_edit.setText("aard")
    assert dialog.proxy.rowCount() == 1 and cells(dialog)[0] == "Aardvark-135M"
    dialog.filter_edit.clear()
    assert dialog.total_label.text() == "2 models · 196.7 MB in the library folder"


def test_saved_load_settings_are_shown(open_dialog: Callable[..., ModelsDialog], qtbot: QtBot):
    model = imported()
    Library().set_load_settings(model.id, {"n_ctx": 65536, "n_gpu_layers": 99, "flash_attn": True})
    dialog = open_dialog()
    dialog.select_model(model.id)
    qtbot.waitUntil(lambda: "Context" in dialog.details_settings.text(), timeout=WAIT_MS)
    assert dialog.details_settings.text() == (
        "Context (tokens): 65,536\nFlash attention: on\nLayers on the GPU: 99"
    )


def test_load_and_plan_emit_the_model_path(
    open_dialog: Callable[..., ModelsDialog], qtbot: QtBot
) -> None:
    model = imported()
    dialog = open_dialog()
    dialog.select_model(model.id)
    with qtbot.waitSignal(dialog.load_requested, timeout=1000) as loaded:
        dialog.load_button.click()
    assert loaded.args == [str(model.path)]
    with qtbot.waitSignal(dialog.plan_requested, timeout=1000) as planned:
        dialog.plan_button.click()
    assert planned.args == [str(model.path)]
    with qtbot.waitSignal(dialog.load_requested, timeout=1000) as again:
        dialog.table.doubleClicked.emit(dialog.proxy.index(0, 0))
    assert again.args == [str(model.path)]


def test_delete_asks_shows_what_goes_and_removes_model_and_snapshots(
    open_dialog: Callable[..., ModelsDialog], qtbot: QtBot, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = imported()
    snapshot = paths.kv_dir(model.id) / "0001.kv"
    snapshot.write_bytes(b"\0" * 4096)
    dialog = open_dialog()
    dialog.select_model(model.id)

    asked = confirm_with(monkeypatch, QMessageBox.StandardButton.Cancel)
    dialog.delete_button.click()
    assert model.path.exists() and dialog.proxy.rowCount() == 1  # kept when not confirmed

    asked = confirm_with(monkeypatch, QMessageBox.StandardButton.Yes)
    with qtbot.waitSignal(dialog.library_refreshed, timeout=WAIT_MS):
        dialog.delete_button.click()
    assert asked and asked[0].startswith(f"Delete {SMOL}?")
    assert str(model.path) in asked[0] and "98.4 MB" in asked[0]
    assert "1 KV snapshot file (4.1 kB)" in asked[0]
    assert not model.path.exists()
    assert not snapshot.parent.exists()
    assert cells(dialog)[:2] == [SMOL, BUNDLED]  # no longer shadowed by the copy
    assert dialog.banner.text.text() == f"Deleted {SMOL}."


def test_import_dialog_chooses_a_file_and_a_mode(
    qtbot: QtBot, monkeypatch: pytest.MonkeyPatch
) -> None:
    chooser = ImportDialog()
    qtbot.addWidget(chooser)
    assert chooser.mode() == "copy" and not chooser.import_button.isEnabled()
    source = str(default_model_path())
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (source, ""))
    chooser.file_button.click()
    assert chooser.path() == Path(source) and chooser.import_button.isEnabled()
    assert chooser.size_label.text() == f"{Path(source).name} · 98.4 MB"
    chooser.mode_buttons["link"].click()
    assert chooser.mode() == "link"
    assert_named(chooser)


def test_import_links_a_model_and_refuses_a_truncated_one_in_words(
    open_dialog: Callable[..., ModelsDialog], qtbot: QtBot, tmp_path: Path
) -> None:
    dialog = open_dialog()
    with qtbot.waitSignal(dialog.library_refreshed, timeout=WAIT_MS):
        dialog.import_model(default_model_path(), "link")
    assert cells(dialog)[:2] == [SMOL, LINKED]
    assert dialog.selected_model() is not None and dialog.selected_model().linked
    assert dialog.details_files.text() == "One file (linked: the file stays where it is)"
    assert dialog.total_label.text() == "1 model · 0 bytes in the library folder · 1 linked"

    truncated = tmp_path / "broken.gguf"
    truncated.write_bytes(default_model_path().read_bytes()[:5000])
    dialog.import_model(truncated, "copy")
    qtbot.waitUntil(lambda: not dialog.busy, timeout=WAIT_MS)
    message = dialog.banner.text.text()
    assert dialog.banner.isVisible() and "broken.gguf" in message
    assert "Traceback" not in message and "Error:" not in message
    assert dialog.proxy.rowCount() == 1


# -- catalog -----------------------------------------------------------------------------------


def test_catalog_shows_fit_badges_in_color(
    open_dialog: Callable[..., ModelsDialog], qtbot: QtBot
) -> None:
    dialog = open_dialog()
    dialog.tabs.setCurrentWidget(dialog.catalog_tab)
    hardware = workstation()
    assert [c.entry.id for c in dialog.cards.values()] == [e.id for e in load_catalog()]
    # planned off the UI thread: the first plan reads DeepSeek's layout
    qtbot.waitUntil(
        lambda: all(c.badge.level != "unknown" for c in dialog.cards.values()), timeout=WAIT_MS
    )
    for card in dialog.cards.values():
        text = verdict(card.entry, hardware)
        assert card.badge.text() == text
        assert FIT_COLORS[card.badge.level] in card.badge.styleSheet()
        assert (card.note is not None) == (not card.entry.checked)
    cards = dialog.cards
    assert (cards["smollm2-135m"].badge.text(), cards["smollm2-135m"].badge.level) == (
        FITS_GPU,
        "good",
    )
    assert cards["deepseek-v4-flash-q2"].badge.text() == FITS_EXPERT_OFFLOAD
    assert cards["deepseek-v4-flash-q2"].badge.level == "warn"
    assert "Offload planner: " in cards["deepseek-v4-flash-q2"].badge.toolTip()
    assert "expert layers on the GPUs" in cards["deepseek-v4-flash-q2"].badge.toolTip()
    assert cards["deepseek-v4-flash-q4"].badge.text() == DOES_NOT_FIT
    assert cards["deepseek-v4-flash-q4"].badge.level == "bad"
    q2_engine = cards["deepseek-v4-flash-q2"].engine_label
    assert q2_engine.isVisible() and q2_engine.text().startswith("Runs on llama.cpp")
    assert "Apple Silicon" in cards["deepseek-v4-flash-mlx-4bit"].engine_label.text()
    assert "1 GPU" in dialog.machine_label.text()
    shoot(dialog, "catalog", qtbot)


# -- downloads ---------------------------------------------------------------------------------


def wait_state(qtbot: QtBot, row: DownloadRow, *states: str) -> None:
    qtbot.waitUntil(lambda: row.state in states, timeout=WAIT_MS)


def test_catalog_download_pauses_resumes_reaches_100_and_lands_in_the_library(
    open_dialog: Callable[..., ModelsDialog],
    qtbot: QtBot,
    hub: FakeHub,  # noqa: F811
    manager: Downloads,  # noqa: F811
) -> None:
    data = default_model_path().read_bytes()
    hub.add_repo(CATALOG_REPO, {CATALOG_FILE: data, "README.md": b"# SmolLM2\n"})
    hub.stall_after[CATALOG_FILE] = len(data) * 2 // 5
    dialog = open_dialog(manager)
    assert manager.on_progress == dialog._forward_progress  # progress goes through Qt

    dialog.cards["smollm2-135m"].download_button.click()
    assert dialog.tabs.currentWidget() is dialog.downloads_tab
    [row] = dialog.download_rows()
    qtbot.waitUntil(lambda: row.bar.value() > 0, timeout=WAIT_MS)
    assert re.match(r"\d+\.\d MB of 98\.4 MB · ", row.detail.text()), row.detail.text()
    assert row.state == "running" and row.title.text() == dialog.cards["smollm2-135m"].entry.name
    assert dialog.tabs.tabText(1) == "Downloads (1)"
    assert dialog.cards["smollm2-135m"].download_button.text() == "Downloading…"

    failed = dialog.start_download("acme/no-such-model", ["model.gguf"])  # a failure next to it
    wait_state(qtbot, failed, "failed")
    assert dialog.download_rows() == [failed, row]
    assert dialog.tabs.tabText(1) == "Downloads (1)"
    assert re.search(r" · [\d.]+ [kMG]B/s · .* left$", row.detail.text()), row.detail.text()
    shoot(dialog, "downloads", qtbot)

    row.pause_button.click()
    assert row.state == "paused" and row.resume_button.isEnabled()
    assert not row.pause_button.isEnabled()
    assert dialog.tabs.tabText(1) == "Downloads"

    hub.release()
    manager.wait(row.job_id, timeout=30)
    row.resume_button.click()
    wait_state(qtbot, row, "done")
    assert row.bar.value() == row.bar.maximum() and row.bar.text() == "100%"
    assert row.detail.text() == "98.4 MB · every file verified"
    assert row.cancel_button.text() == "Clear"
    assert any(start > 0 for file, start in hub.gets if file == CATALOG_FILE)  # resumed

    name = CATALOG_FILE.removesuffix(".gguf")
    qtbot.waitUntil(lambda: any(m.name == name for m in dialog.models), timeout=WAIT_MS)
    assert dialog.banner.text.text().endswith("is downloaded and verified: it is in your Library.")
    dialog.banner.trigger("Show in Library")
    assert dialog.tabs.currentWidget() is dialog.library_tab
    assert dialog.selected_model().name == name
    assert dialog.cards["smollm2-135m"].download_button.text() == "In library"
    dialog.close()
    assert manager.on_progress is None  # whoever listened before has it back


def test_a_missing_repo_is_explained_on_its_row(
    open_dialog: Callable[..., ModelsDialog],
    qtbot: QtBot,
    hub: FakeHub,  # noqa: F811
    manager: Downloads,  # noqa: F811
) -> None:
    dialog = open_dialog(manager)
    row = dialog.start_download("acme/no-such-model", ["model.gguf"])
    wait_state(qtbot, row, "failed")
    assert row.error.isVisible()
    assert "Repository acme/no-such-model was not found" in row.error.text()
    assert "(404)" in row.error.text()
    assert row.resume_button.text() == "Retry" and row.resume_button.isEnabled()
    assert row.cancel_button.text() == "Dismiss"

    hub.add_repo("acme/no-such-model", {"other.gguf": b"GGUF"})
    row.resume_button.click()
    wait_state(qtbot, row, "failed")
    assert "model.gguf is not in acme/no-such-model (404)" in row.error.text()
    row.cancel_button.click()
    qtbot.waitUntil(lambda: not dialog.download_rows(), timeout=WAIT_MS)
    assert dialog.downloads_stack.currentWidget() is dialog.downloads_empty


def test_cancel_asks_then_deletes_the_partial_download(
    open_dialog: Callable[..., ModelsDialog],
    qtbot: QtBot,
    monkeypatch: pytest.MonkeyPatch,
    hub: FakeHub,  # noqa: F811
    manager: Downloads,  # noqa: F811
) -> None:
    data = default_model_path().read_bytes()
    hub.add_repo("acme/smol", {"smol-Q4_1.gguf": data})
    hub.stall_after["smol-Q4_1.gguf"] = len(data) * 2 // 5  # past whole 10 MB reads
    dialog = open_dialog(manager)
    row = dialog.start_download("acme/smol", quant="Q4_1")
    qtbot.waitUntil(lambda: row.bar.value() > 0, timeout=WAIT_MS)
    asked = confirm_with(monkeypatch, QMessageBox.StandardButton.Yes)
    row.cancel_button.click()
    assert asked and asked[0].startswith("Cancel the download of acme/smol · Q4_1?")
    hub.release()
    qtbot.waitUntil(lambda: not dialog.download_rows(), timeout=WAIT_MS)
    # the transfer lets go at its next write; then the job and its partial file are gone
    qtbot.waitUntil(lambda: manager.downloads() == [], timeout=WAIT_MS)
    assert not any((paths.data_dir() / "downloads").rglob("*.incomplete"))


def test_every_control_has_a_name_and_a_tooltip(
    open_dialog: Callable[..., ModelsDialog],
    qtbot: QtBot,
    hub: FakeHub,  # noqa: F811
    manager: Downloads,  # noqa: F811
) -> None:
    model = imported()
    dialog = open_dialog(manager)
    dialog.select_model(model.id)
    row = dialog.start_download("acme/no-such-model", ["model.gguf"])
    wait_state(qtbot, row, "failed")
    for index in range(dialog.tabs.count()):
        dialog.tabs.setCurrentIndex(index)
        assert dialog.tabs.tabToolTip(index)
        assert_named(dialog)


def assert_named(root: QWidget) -> None:
    kinds = (QAbstractButton, QLineEdit, QComboBox, QProgressBar, QTableView)
    controls = [w for w in root.findChildren(QWidget) if isinstance(w, kinds)]
    visible = [w for w in controls if w.isVisibleTo(root) and w.objectName() != "qt_tabwidget"]
    assert visible
    unnamed = [
        f"{type(w).__name__} {w.property('text') or ''!r}"
        for w in visible
        if not w.accessibleName() or not w.toolTip()
    ]
    assert unnamed == []


def test_the_library_shows_its_context_column_whole_at_the_dialogs_size(harness: Harness) -> None:
    window = harness.start()
    dialog = window.open_models()
    harness.wait_until(lambda: not dialog.busy)
    harness.act(lambda: dialog.resize(1120, 700))  # its own size; offscreen's screen is smaller
    harness.wait_until(lambda: dialog.table.viewport().width() > 700)
    header, context = dialog.table.horizontalHeader(), COLUMNS.index("Context")
    values = [dialog.proxy.index(row, context).data() for row in range(dialog.proxy.rowCount())]
    assert values
    widest = max(dialog.table.fontMetrics().horizontalAdvance(v) for v in values)
    assert header.sectionSize(context) > widest
    end = header.sectionViewportPosition(context) + header.sectionSize(context)
    assert header.sectionViewportPosition(context) >= 0 and end <= header.viewport().width()


def test_a_download_that_does_not_fit_asks_first(harness: Harness) -> None:
    """The catalog's Download of a model badged "does not fit" asks; Cancel starts nothing."""
    window = harness.start()
    dialog = window.open_models()
    harness.act(lambda: dialog.tabs.setCurrentWidget(dialog.catalog_tab))
    harness.wait_until(lambda: all(c.badge.level != "unknown" for c in dialog.cards.values()))
    card = next(c for c in dialog.cards.values() if c.badge.text() == DOES_NOT_FIT)
    asked: list[str] = []

    def answer() -> None:  # the question is modal: answered from inside its own loop
        box = QApplication.activeModalWidget()
        if not isinstance(box, QMessageBox):
            QTimer.singleShot(20, answer)
            return
        asked.append(box.text())
        box.button(QMessageBox.StandardButton.Cancel).click()

    def click() -> None:
        QTimer.singleShot(0, answer)
        card.download_button.click()

    harness.act(click)
    assert len(asked) == 1 and asked[0].startswith(f"{card.entry.name} does not fit this machine")
    assert "anyway" in asked[0] and dialog.download_rows() == []
