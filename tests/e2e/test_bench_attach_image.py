"""`stoke bench attach --image`, small, on the tests' tiny vision model (tests/tiny_vision.py):
the window's timed runs with the picture read on attach and without, and the five turns with
two pictures beside llama-cpp-python's multimodal handler resent statelessly. Times depend on
the machine; the token counts are the point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.tiny_vision import IMAGE_TOKENS, write_tiny_vision_model

REPO = Path(__file__).resolve().parents[2]


def test_bench_attach_image_reads_the_picture_once_and_the_peer_every_turn(
    tmp_path: Path, tiny_model: str
) -> None:
    model = write_tiny_vision_model(Path(tiny_model), tmp_path / "vision")
    report_path = tmp_path / "attach-image.json"
    command = [sys.executable, "-m", "app", "bench", "attach", "--image", "--model", str(model)]
    command += ["--reps", "1", "--json", str(report_path)]
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    report = json.loads(report_path.read_text("utf-8"))
    warm, cold = report["prewarm"], report["no_prewarm"]
    # read on attach: after Enter only the question; without: the picture and the question
    assert (
        cold["prefilled_after_enter_median"] >= warm["prefilled_after_enter_median"] + IMAGE_TOKENS
    )
    turns = report["conversation"]
    assert len(turns) == 5
    for turn in turns[1:]:  # Stoke reads each turn's new tokens, the peer the whole history
        assert turn["prefilled_after_enter"] < turn["peer_prefilled"]
    assert turns[-1]["peer_prefilled"] > 2 * IMAGE_TOKENS
