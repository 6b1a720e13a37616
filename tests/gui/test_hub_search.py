"""Finding models: the Models page searches the hub (the real huggingface_hub client against
the fake hub on loopback, which answers /api/models as the real one does) for GGUF and MLX
repositories, most downloaded first; a result expands to its files with quantization, size
and fit, and Download brings one into the library through the page's own downloads."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable

import pytest
from PySide6.QtCore import QCoreApplication, QThreadPool
from pytestqt.qtbot import QtBot

from app.models.catalog import FITS_GPU, size_verdict
from app.models.default import default_model_path
from app.models.downloads import Downloads
from app.models.hub import search_models
from app.models.library import Library
from app.ui.models import ModelsDialog
from app.ui.models.search_tab import READING
from tests.e2e.test_downloads import hub, keychain, manager  # noqa: F401 (fixtures)
from tests.fakehub import FakeHub
from tests.gui.harness import Harness
from tests.gui.test_models_page import open_dialog, workstation  # noqa: F401 (fixtures)

MiB = 1 << 20
WAIT_MS = 30_000
Q8 = ("Tiny.Q8_0-00001-of-00002.gguf", "Tiny.Q8_0-00002-of-00002.gguf")
PROJECTOR = "mmproj-Tiny-F16.gguf"


def add_repos(hub: FakeHub) -> None:  # noqa: F811
    hub.add_repo(
        "acme/Tiny-GGUF",
        {
            "Tiny.Q4_1.gguf": default_model_path().read_bytes(),
            Q8[0]: os.urandom(MiB),
            Q8[1]: os.urandom(MiB // 2),
            PROJECTOR: os.urandom(64),  # a vision model's: shown and fetched with each quant
            "README.md": b"# Tiny\n",
        },
        downloads=500,
    )
    hub.add_repo(
        "acme/Tiny-MLX",
        {"config.json": b"{}", "model.safetensors": os.urandom(4096), "tokenizer.json": b"{}"},
        downloads=900,
        library="mlx",
    )
    hub.add_repo(  # popular, but nothing Stoke runs
        "acme/tiny-pytorch",
        {"config.json": b"{}", "pytorch_model.bin": b"\0" * 64},
        downloads=90_000,
    )
    hub.add_repo("other/Large-GGUF", {"Large.Q4_0.gguf": b"\0" * 64}, downloads=10**6)


def test_search_asks_the_hub_for_gguf_and_mlx_most_downloaded_first(
    hub: FakeHub,  # noqa: F811
    keychain: object,  # noqa: F811
) -> None:
    add_repos(hub)
    found = search_models("tiny")
    assert [(m.repo, m.format, m.downloads) for m in found] == [
        ("acme/Tiny-MLX", "mlx", 900),
        ("acme/Tiny-GGUF", "gguf", 500),
    ]
    assert sorted(q["filter"][0] for q in hub.searches) == ["gguf", "mlx"]
    assert all(q["search"] == ["tiny"] and q["sort"] == ["downloads"] for q in hub.searches)


def test_search_tab_lists_files_with_fit_and_downloads_into_the_library(
    open_dialog: Callable[..., ModelsDialog],  # noqa: F811
    qtbot: QtBot,
    hub: FakeHub,  # noqa: F811
    manager: Downloads,  # noqa: F811
) -> None:
    add_repos(hub)
    dialog = open_dialog(manager)
    assert dialog.tabs.tabText(3) == "Search"
    page = dialog.search_tab
    dialog.tabs.setCurrentWidget(page)
    page.query.setText("tiny")
    page.search_button.click()
    qtbot.waitUntil(lambda: page.tree.topLevelItemCount() == 2, timeout=WAIT_MS)
    rows = [page.tree.topLevelItem(i) for i in range(2)]
    assert [(r.text(0), r.text(1), r.text(2)) for r in rows] == [
        ("acme/Tiny-MLX", "MLX", "900 downloads"),
        ("acme/Tiny-GGUF", "GGUF", "500 downloads"),
    ]
    assert page.status.text().startswith("2 models for “tiny”")

    gguf = page.item_of("acme/Tiny-GGUF")
    gguf.setExpanded(True)
    assert gguf.child(0).text(0) == READING
    qtbot.waitUntil(lambda: gguf.child(0).text(0) != READING, timeout=WAIT_MS)
    files = {gguf.child(i).text(0): gguf.child(i) for i in range(gguf.childCount())}
    assert set(files) == {"Q4_1", "Q8_0"}
    assert (files["Q8_0"].text(1), files["Q8_0"].text(2)) == (
        "GGUF · 2 parts · reads images",
        "1.6 MB",
    )
    assert (files["Q4_1"].text(1), files["Q4_1"].text(2)) == ("GGUF · reads images", "98.4 MB")
    assert PROJECTOR in files["Q4_1"].toolTip(0)
    size = default_model_path().stat().st_size
    assert files["Q4_1"].text(3) == size_verdict(size + 64, False, workstation()) == FITS_GPU
    mlx = page.item_of("acme/Tiny-MLX")
    mlx.setExpanded(True)
    qtbot.waitUntil(lambda: mlx.child(0).text(0) == "mlx", timeout=WAIT_MS)
    assert mlx.child(0).text(1) == "MLX · 3 files"
    dialog.grab().save("/tmp/models_search.png")

    page.tree.itemWidget(files["Q4_1"], 4).click()
    assert dialog.tabs.currentWidget() is dialog.downloads_tab
    [row] = dialog.download_rows()
    assert row.title.text() == "acme/Tiny-GGUF · Q4_1"
    qtbot.waitUntil(lambda: row.state == "done", timeout=WAIT_MS)
    tiny = {m.name: m for m in Library().models()}["Tiny.Q4_1"]
    assert hub.served["Tiny.Q4_1.gguf"] == size and not hub.served[Q8[0]]  # that one only
    assert tiny.projector is not None and tiny.projector.name == PROJECTOR
    qtbot.waitUntil(lambda: dialog.select_model("Tiny.Q4_1"), timeout=WAIT_MS)
    assert dialog.details_facts["Reads images"].text() == f"yes, with {PROJECTOR}"


def test_a_hub_that_does_not_answer_is_said_in_words_once_without_retries(
    open_dialog: Callable[..., ModelsDialog],  # noqa: F811
    qtbot: QtBot,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Offline, the real client fails at its first try: huggingface_hub's backoff retried five
    times (25-30 s) and logged a warning for each (issue 36 item 4)."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed.getsockname()[1]}")
        dialog = open_dialog()
        page = dialog.search_tab
        page.query.setText("tiny")
        with caplog.at_level(logging.WARNING, logger="huggingface_hub"):
            page.search_button.click()
            assert page.search_button.text() == "Cancel" and page.search_button.isEnabled()
            qtbot.waitUntil(lambda: page.search_button.text() == "Search", timeout=WAIT_MS)
    text = page.status.text()
    assert text.startswith("Cannot search the hub at http://127.0.0.1:")
    assert "Error" not in text and "Traceback" not in text and "[Errno" not in text
    assert page.tree.topLevelItemCount() == 0
    retries = [r.getMessage() for r in caplog.records if r.name.startswith("huggingface_hub")]
    assert not retries, retries


def test_a_search_the_hub_keeps_waiting_on_can_be_cancelled(
    open_dialog: Callable[..., ModelsDialog],  # noqa: F811
    qtbot: QtBot,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A hub that takes the connection and never answers: Cancel gives Search back at once,
    and the answer that comes later (here: the hub going away) changes nothing."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}")
        dialog = open_dialog()
        page = dialog.search_tab
        page.query.setText("tiny")
        page.search_button.click()
        assert page.search_button.text() == "Cancel"
        page.search_button.click()
        assert page.search_button.text() == "Search"
        assert page.status.text() == "Search for “tiny” cancelled."
    QThreadPool.globalInstance().waitForDone()  # the hub went away: its failure arrives
    QCoreApplication.processEvents()
    assert page.status.text() == "Search for “tiny” cancelled."
    assert page.search_button.text() == "Search"


def test_the_windows_hub_search_offline_fails_at_once_in_words_and_cancels(
    harness: Harness, tiny_model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 4 in the real window's File > Models: a hub that refuses the connection is said in
    words at its first try; one that takes it and never answers is cancelled at once."""
    with socket.socket() as closed, socket.socket() as silent:
        closed.bind(("127.0.0.1", 0))
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        window = harness.start(tiny_model)
        page = window.open_models().search_tab
        page.query.setText("tiny")
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed.getsockname()[1]}")
        page.search_button.click()  # its answer comes through the loop, after this look
        assert page.search_button.text() == "Cancel" and page.search_button.isEnabled()
        harness.wait_until(lambda: page.search_button.text() == "Search", timeout=WAIT_MS / 1000)
        assert page.status.text().startswith("Cannot search the hub at http://127.0.0.1:")

        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}")
        page.search_button.click()
        assert page.search_button.text() == "Cancel"
        page.search_button.click()
        assert page.search_button.text() == "Search"
        assert page.status.text() == "Search for “tiny” cancelled."
    QThreadPool.globalInstance().waitForDone()  # the hub went away: its failure changes nothing
    harness.run(asyncio.sleep(0))
    assert page.status.text() == "Search for “tiny” cancelled."
