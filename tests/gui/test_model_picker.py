"""The model in the chat: the header's picker lists the library with fit badges, switching
keeps the conversation open, each conversation remembers its model, and switching back
restores the conversation's KV snapshot instead of prefilling it again (read from the
engine's own counters)."""

from __future__ import annotations

import shutil
from pathlib import Path

from app.engine.protocol import FinishReason
from app.models.catalog import FITS_GPU, RUNS_ON_CPU, size_verdict
from app.models.default import default_model_path
from app.models.library import Library
from app.ui.model_picker import NAME_ROLE, PATH_ROLE, ModelSwitcher
from tests.gui.harness import Harness

SMOL = "SmolLM2-135M-Instruct.Q4_1"


def _other_model(folder: Path) -> str:
    """A second real model in the library: the default GGUF under another name, with a
    fingerprint (another mtime, so a KV folder) of its own."""
    copy = folder / "Other-135M.gguf"
    shutil.copyfile(default_model_path(), copy)
    return str(Library().import_model(copy, "move").path)


def _scanned(harness: Harness, switcher: ModelSwitcher, count: int) -> None:
    before = switcher.scans
    harness.act(switcher.refresh)
    harness.wait_until(lambda: switcher.scans > before and switcher.picker.count() == count)
    harness.wait_until(lambda: switcher.hardware is not None)


def _prewarmed(harness: Harness, conversation_id: str):
    window = harness.window
    harness.run(window.prewarm.idle())
    stats = window.prewarm.last.get(conversation_id)
    assert stats is not None and stats.finish_reason == FinishReason.PREFILLED
    return stats


def _choose(harness: Harness, path: str) -> None:
    picker = harness.window.model_switcher.picker
    index = picker.findData(path, PATH_ROLE)
    harness.act(lambda: picker.activated.emit(index))  # as a click on the row does
    harness.turn()
    assert harness.window.session.engine.info.path == path


def test_picker_lists_the_library_with_fit_badges(harness: Harness, tmp_path: Path) -> None:
    window = harness.start()
    other = _other_model(tmp_path)
    switcher = window.model_switcher
    picker = switcher.picker
    assert window.header.model_slot is picker and picker.isVisible()
    _scanned(harness, switcher, 2)
    assert picker.paths() == [other, str(default_model_path())]  # by name
    assert picker.currentText().startswith(f"{SMOL}  ·  ")  # the loaded one, by its name
    assert picker.currentData(NAME_ROLE) == SMOL  # what the closed picker draws, elided
    expected = size_verdict(Path(other).stat().st_size, False, switcher.hardware)
    assert expected in (FITS_GPU, RUNS_ON_CPU)
    for path in picker.paths():
        assert picker.verdict_of(path) == expected
        assert not picker.itemIcon(picker.findData(path, PATH_ROLE)).isNull()  # the badge
    assert picker.width() < 400  # a long name elides; the header does not widen


def test_switching_keeps_the_conversation_and_switching_back_restores_its_kv(
    harness: Harness, tmp_path: Path
) -> None:
    window = harness.start()
    other = _other_model(tmp_path)
    _scanned(harness, window.model_switcher, 2)
    conversation = window.conversation_id
    window.store.set_sampling(conversation, {"temperature": 0, "max_tokens": 8})
    harness.type_and_send("Name three colours of the rainbow.")
    harness.turn()
    shown = [m.id for m in window.store.current_path(conversation)]
    assert window.store.get_conversation(conversation).model == str(default_model_path())

    _choose(harness, other)
    assert window.conversation_id == conversation  # still open, on the other model
    assert window.store.get_conversation(conversation).model == other
    on_other = _prewarmed(harness, conversation)
    assert on_other.restored_tokens == 0  # a model of its own: its KV is new
    assert on_other.prefilled_tokens == on_other.prompt_tokens
    assert window.model_switcher.picker.current_path() == other
    assert [m.id for m in window.store.current_path(conversation)] == shown

    _choose(harness, str(default_model_path()))
    back = _prewarmed(harness, conversation)
    assert back.restored_tokens > 0  # the snapshot taken before the switch
    assert back.prefilled_tokens < back.prompt_tokens
    assert back.restored_tokens + back.prefilled_tokens >= back.prompt_tokens
    assert window.store.get_conversation(conversation).model == str(default_model_path())
    harness.type_and_send("And one more?")
    harness.turn()
    assert window.store.current_path(conversation)[-1].status == "complete"


def test_opening_a_conversation_switches_to_its_model(harness: Harness, tmp_path: Path) -> None:
    window = harness.start()
    other = _other_model(tmp_path)
    first = window.conversation_id
    assert window.store.get_conversation(first).model == str(default_model_path())
    second = window.store.create_conversation().id
    window.store.set_model(second, other)
    harness.act(window.sidebar.refresh)
    harness.act(lambda: window.sidebar.conversation_selected.emit(second))
    harness.turn()
    assert window.session.engine.info.path == other
    assert window.conversation_id == second
    harness.act(lambda: window.sidebar.conversation_selected.emit(first))
    harness.turn()
    assert window.session.engine.info.path == str(default_model_path())
