"""Send waits for the files being read: on the real engine, a question sent with Enter
while its attachment is still read is held (Send disabled, saying which file), and once
the file is read the same Enter sends the message with it."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtTest import QTest

from app.ui.composer import SEND_TIP
from tests.gui.harness import Harness
from tests.gui.test_attachments import drop

QUESTION = "What changed in this release?"


def notes(folder: Path) -> Path:
    path = folder / "release-notes.md"
    lines = "\n".join(f"- Fixed issue {i}: the window keeps its size." for i in range(20))
    path.write_text(f"# Release notes\n\n{lines}\n", "utf-8")
    return path


def test_send_waits_until_the_attachment_is_read_and_the_message_goes_with_it(
    harness: Harness, tmp_path: Path
) -> None:
    window = harness.start()
    cid = window.conversation_id
    window.store.set_sampling(cid, {"temperature": 0, "max_tokens": 4})
    composer, editor = window.composer, window.composer.editor
    seen: dict[str, object] = {}

    def attach_type_and_enter() -> None:
        """All before the loop runs again, so the file is surely still being read."""
        turn = window.turn
        assert drop(window, [notes(tmp_path)])
        seen["busy"] = window.draft_files.bar.busy()
        editor.setFocus()
        QTest.keyClicks(editor, QUESTION)
        QTest.keyClick(editor, Qt.Key.Key_Return)
        seen["sent"] = window.turn is not turn
        seen["enabled"] = composer.send_button.isEnabled()
        seen["tip"] = composer.send_button.toolTip()
        seen["status"] = window.draft_files.bar.status.text()

    harness.act(attach_type_and_enter)
    assert seen == {
        "busy": True,
        "sent": False,
        "enabled": False,
        "tip": "Reading release-notes.md…",
        "status": "Reading release-notes.md…",
    }
    assert composer.text() == QUESTION  # the draft waits in the composer

    harness.wait_until(lambda: not window.draft_files.bar.busy())
    assert composer.send_button.isEnabled() and composer.send_button.toolTip() == SEND_TIP
    records = window.draft_files.records()
    assert [r["name"] for r in records] == ["release-notes.md"]
    harness.run(window.prewarm.idle())
    harness.act(lambda: QTest.keyClick(editor, Qt.Key.Key_Return))
    harness.wait_until(lambda: window.turn is not None)
    harness.turn()
    user = window.store.current_path(cid)[0]
    assert user.content == QUESTION and user.attachments == records
    assert "Fixed issue 19" in user.attachments[0]["text"]
