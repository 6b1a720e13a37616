"""Issue 36's acceptance: every number the window shows in two places is the same in both.
The real window on a conversation with a reply: the status line and the reply's own line and
tooltip (speed, time to first token, the prompt's reuse), the context meter and the engine's
context, and the model's size and context in the library and the Hardware dialog."""

from __future__ import annotations

import re

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QWidget

from app.models.default import default_model_path
from tests.gui.harness import Harness


def numbers(pattern: str, text: str) -> tuple[str, ...]:
    found = re.search(pattern, text)
    assert found, (pattern, text)
    return found.groups()


def test_each_number_shown_twice_is_the_same_in_both_places(harness: Harness) -> None:
    window = harness.start()
    window.store.set_sampling(window.conversation_id, {"temperature": 0, "max_tokens": 8})
    harness.type_and_send("Hello.")
    harness.turn()
    harness.run(window.prewarm.idle())

    reply = [w for w in window.chat.findChildren(QWidget, "message") if not w.is_user][-1]
    status = window.status.text()
    meta = reply.findChild(QLabel, "messageMeta").text()
    tip = reply.findChild(QWidget, "messageBubble").toolTip()
    speed, ttft = numbers(r"([\d,]+) tok/s · ([\d.]+) s to first token", meta)
    assert numbers(r"TTFT ([\d.]+) s", status) == (ttft,) == numbers(r"TTFT ([\d.]+) s", tip)
    assert numbers(r"decode ([\d,]+) tok/s", status) == (speed,)
    assert numbers(r"decode ([\d,]+) tok/s", tip) == (speed,)
    reuse = numbers(r"reused ([\d,]+) of ([\d,]+)", tip)
    assert numbers(r"reused ([\d,]+) of ([\d,]+) prompt tokens", status) == reuse

    meter = window.draft_files.bar.meter
    (context,) = numbers(r"/ ([\d,]+) tokens", meter.text())
    assert context == f"{window.session.engine.info.n_ctx:,}"

    models = window.open_models()
    harness.wait_until(lambda: not models.busy)
    assert models.select_model(str(default_model_path()))
    size_column = next(
        col
        for col in range(models.proxy.columnCount())
        if models.proxy.headerData(col, Qt.Orientation.Horizontal) == "Size"
    )
    row = models.table.currentIndex().row()
    library_size = models.proxy.index(row, size_column).data()
    assert models.details_facts["Size on disk"].text() == library_size
    wizard = window.open_hardware_wizard()
    harness.wait_until(lambda: wizard.facts["size"].text() not in ("", "—", "…"))
    assert wizard.facts["size"].text() == library_size
    assert wizard.facts["context"].text() == models.details_facts["Context"].text()
