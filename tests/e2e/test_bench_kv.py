"""`stoke bench kv`, small, on the real engine: it runs, prints its table and writes its JSON.
Only token counts are checked; times depend on the machine, so the model is the tests' tiny
one (tests/tiny_model.py); the numbers come from running the bench."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from app.engine.llamacpp.tools import find_tools

REPO = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^(?P<scenario>\S+)\s+(?P<row>\S+)\s+(?P<ttft>\d+\.\d+)\s+\S+", re.MULTILINE)


def test_bench_kv_follow_up_and_typed(tmp_path: Path, tiny_model: str) -> None:
    report_path = tmp_path / "kv.json"
    command = [sys.executable, "-m", "app", "bench", "kv", "--model", tiny_model]
    command += ["--reps", "1", "--history", "300"]
    command += ["--only", "follow_up", "typed", "--json", str(report_path)]
    done = subprocess.run(
        command, cwd=REPO, env=os.environ.copy(), capture_output=True, text=True, timeout=300
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "Traceback" not in output, output

    rows = {(m["scenario"], m["row"]) for m in ROW.finditer(done.stdout)}
    expected = {("follow_up", r) for r in ("naive", "anchor", "stoke")}
    expected |= {("typed", r) for r in ("cold", "prewarm")}
    assert expected <= rows, done.stdout
    assert not {scenario for scenario, _ in rows} - {"follow_up", "typed"}

    report = json.loads(report_path.read_text("utf-8"))
    assert json.loads(done.stdout.strip().splitlines()[-1]) == report  # also printed as JSON
    results = report["results"]
    assert set(results) == {"follow_up", "typed"}

    follow_up = results["follow_up"]
    for key in ("naive_ttft_s", "anchor_ttft_s", "stoke_ttft_s"):
        assert follow_up[key] > 0, follow_up
    assert follow_up["history_tokens"] >= 300
    assert follow_up["new_tokens"] > 0
    assert follow_up["stoke_prefilled_tokens"] <= follow_up["new_tokens"] + 2, follow_up

    typed = results["typed"]
    assert typed["prewarm_ttft_s"] > 0 and typed["cold_ttft_s"] > 0, typed
    assert typed["cold_prefilled_tokens"] >= typed["message_tokens"], typed
    assert typed["prewarm_prefilled_tokens"] < typed["cold_prefilled_tokens"] / 5, typed

    targets = report["targets"]
    assert targets["follow_up: prefilled <= new + 2"] is True
    assert "typed: prewarm <= cold / 5" in targets  # a timing target: shown, not asserted


def test_bench_kv_beside_llama_servers_cache_reuse(tmp_path: Path, tiny_model: str) -> None:
    """The anchor can be llama.cpp's own llama-server (--cache-reuse, a stateless client
    sending the whole chat), loaded after Stoke's engine closed (--one-at-a-time), both placed
    as `stoke plan` places the model here (--plan): it ran,
    reused the conversation it was warmed with (its own count of evaluated tokens is far below
    the history), and Stoke read only the new tokens."""
    tools, reason = find_tools()
    if tools is None:
        pytest.skip(reason)
    report_path = tmp_path / "kv.json"
    command = [sys.executable, "-m", "app", "bench", "kv", "--model", tiny_model]
    command += ["--anchor", "llama-server", "--one-at-a-time", "--plan"]
    command += ["--reps", "1", "--history", "300"]
    command += ["--only", "follow_up", "--json", str(report_path)]
    done = subprocess.run(
        command, cwd=REPO, env=os.environ.copy(), capture_output=True, text=True, timeout=300
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "Traceback" not in output, output
    rows = {(m["scenario"], m["row"]) for m in ROW.finditer(done.stdout)}
    assert rows == {("follow_up", r) for r in ("naive", "anchor", "stoke")}, done.stdout
    report = json.loads(report_path.read_text("utf-8"))
    assert report["anchor"] == "llama-server" and report["one_at_a_time"] is True
    assert report["plan"]["fits"] and report["plan"]["n_ctx"] == 8192  # placed as stoke plan
    follow_up = report["results"]["follow_up"]
    assert 0 < follow_up["anchor_prefilled_tokens"] < follow_up["history_tokens"] / 2, follow_up
    assert follow_up["stoke_prefilled_tokens"] <= follow_up["new_tokens"] + 2, follow_up
