"""`stoke bench tools`, small, on the real engine and the real llama_cpp.server: it runs both
sides, prints its table and writes its JSON. Times depend on the machine, so the model is the
tests' tiny one (tests/tiny_model.py) and only token counts are checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_bench_tools_runs_both_sides_and_stoke_prefills_only_the_new(
    tmp_path: Path, tiny_model: str
) -> None:
    report_path = tmp_path / "tools.json"
    command = [sys.executable, "-m", "app", "bench", "tools", "--model", tiny_model]
    command += ["--rounds", "2", "--reps", "1", "--ctx", "4096", "--json", str(report_path)]
    done = subprocess.run(
        command, cwd=REPO, env=os.environ.copy(), capture_output=True, text=True, timeout=600
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "Traceback" not in output, output

    report = json.loads(report_path.read_text("utf-8"))
    assert json.loads(done.stdout.strip().splitlines()[-1]) == report  # also printed as JSON
    assert "stoke   prefilled" in done.stdout and "anchor  prefilled" in done.stdout
    stoke, anchor = report["results"]["stoke"], report["results"]["anchor"]
    assert stoke["rounds_run"] == [2] and anchor["rounds_run"] == [2], report
    (first, second), (their_first, _) = stoke["all"][0], anchor["all"][0]
    assert first[1] == first[2] > 1400  # the system prompt and tools, all new
    assert their_first[2] > 1400
    assert second[1] > first[1] and 0 < second[2] < 100  # the call's result and the glue
