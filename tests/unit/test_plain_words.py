"""Errors and settings in words: no Python bytes, no numpy internals, no raw exception
names or setting keys reach a person (issue 16)."""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest

from app.engine.gguf_info import inspect_gguf
from app.engine.model_file import check_gguf
from app.engine.protocol import ModelLoadError
from app.models.default import default_model_path
from app.models.hub import explain
from app.ui.models.words import describe_settings, setting_label

HUB = "https://huggingface.co"


def test_a_fake_gguf_is_described_without_python_bytes(tmp_path: Path) -> None:
    fake = tmp_path / "fake.gguf"
    fake.write_text("not a model, just my notes")
    with pytest.raises(ModelLoadError) as caught:
        check_gguf(fake)
    words = str(caught.value)
    assert "b'" not in words and "not a GGUF model file: it looks like a text file" in words
    page = tmp_path / "page.gguf"
    page.write_text("<!DOCTYPE html><html>Sign in</html>")
    with pytest.raises(ModelLoadError, match="a web page"):
        check_gguf(page)


def test_a_truncated_header_does_not_leak_the_readers_message(tmp_path: Path) -> None:
    cut = tmp_path / "head.gguf"
    cut.write_bytes(default_model_path().read_bytes()[: 64 << 10])
    with pytest.raises(ModelLoadError) as caught:
        inspect_gguf(cut)
    words = str(caught.value)
    assert words == "head.gguf is truncated or damaged: its GGUF header cannot be read. " + (
        "Download it again."
    )


def test_an_unreachable_hub_is_said_in_words() -> None:
    down = httpx2.ConnectError("[Errno -2] Name or service not known")
    browsing = explain(down, "acme/smol", HUB)
    assert browsing == f"Cannot reach the hub at {HUB}: check the network connection."
    downloading = explain(down, "acme/smol", HUB, "smol.gguf")
    assert "Errno" not in downloading and "ConnectError" not in downloading
    assert downloading.endswith("The download resumes where it stopped.")
    odd = explain(RuntimeError("boom: <internal state>"), "acme/smol", HUB)
    assert "boom" not in odd and "RuntimeError" not in odd


def test_load_settings_have_human_labels() -> None:
    shown = describe_settings({"n_seq_max": 1, "swa_full": False, "n_ctx": 65_536})
    assert shown.splitlines() == [
        "Context (tokens): 65,536",
        "Conversations kept loaded: 1",
        "Full sliding-window cache: off",
    ]
    assert "_" not in setting_label("some_new_key") and setting_label("n_widgets") == "Widgets"
