"""`stoke bench decode`, small, on the real engine: a copy of a model with other weight types
is written and benched with a draft cut from it, every method's row is printed and kept in
the JSON, and each speculative reply equals plain decoding's. Times are not checked (they are
the machine's), so the model is the tests' tiny one (tests/tiny_model.py) with a third block,
for the bench's two-block draft to be cut from; the numbers come from running the bench."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tests.tiny_model
from app.engine.llamacpp.quantize import requantize
from app.engine.protocol import EngineError
from app.models.default import default_model_path

REPO = Path(__file__).resolve().parents[2]


def test_bench_decode_chat_on_a_q4_0_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tests.tiny_model, "N_LAYER", 3)
    model = tests.tiny_model.write_tiny_chat_model(default_model_path(), tmp_path / "tiny.gguf")
    report_path = tmp_path / "decode.json"
    command = [sys.executable, "-m", "app", "bench", "decode", "--model", str(model)]
    command += ["--reps", "1", "--only", "chat", "--weights", "q4_0", "--json", str(report_path)]
    done = subprocess.run(
        command, cwd=REPO, env=os.environ.copy(), capture_output=True, text=True, timeout=600
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "Traceback" not in output, output
    report = json.loads(report_path.read_text("utf-8"))
    assert report["model"] == "tiny.q4_0.gguf"
    assert report["draft"] == "first 2 blocks of the model"
    assert set(report["results"]) == {"chat"}
    chat = report["results"]["chat"]
    assert set(chat["methods"]) == {"off", "lookup", "draft", "exact"}
    assert chat["same_tokens"] is True
    for method, row in chat["methods"].items():
        assert row["generated_tokens"] > 0
        assert f"chat       {method}" in done.stdout
    assert "PASS  chat: each speculative reply is plain decoding's" in done.stdout


def test_requantize_writes_a_copy_or_says_why(tmp_path: Path, tiny_model: str) -> None:
    source = Path(tiny_model)
    copy = requantize(source, tmp_path / "copy.gguf", "bf16")
    assert copy.stat().st_size > source.stat().st_size  # 16-bit weights against 8-bit ones
    with pytest.raises(EngineError, match="Unknown weight type 'q2'"):
        requantize(source, tmp_path / "other.gguf", "q2")
    with pytest.raises(EngineError, match="could not write"):
        requantize(tmp_path / "missing.gguf", tmp_path / "third.gguf", "bf16")
