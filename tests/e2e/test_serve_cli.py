"""`stoke serve` as a real process: it prints where it listens, answers the openai client
with the key from STOKE_API_KEY, stops cleanly on Ctrl+C, and says so when the port is taken.
`stoke bench serve`, small: it runs both servers, prints its table and writes its JSON."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import openai
import pytest

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
KEY = "sk-cli-test"


def _env(home: Path) -> dict[str, str]:
    return {**os.environ, "STOKE_HOME": str(home), "STOKE_API_KEY": KEY}


def test_stoke_serve_answers_and_stops_on_ctrl_c(stoke_home: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--port", "0", "--ctx", "2048"],
        cwd=REPO,
        env=_env(stoke_home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = process.stdout.readline()
        found = re.search(r"Serving (\S+) at (http://127\.0\.0\.1:\d+/v1)", line)
        assert found, line + process.stderr.read()
        assert "STOKE_API_KEY" in process.stdout.readline()  # where the key came from
        client = openai.OpenAI(base_url=found[2], api_key=KEY, max_retries=0)
        reply = client.chat.completions.create(
            model=found[1], messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
        assert reply.usage.completion_tokens > 0
    finally:
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert "Stopping" in err and "Traceback" not in out + err


def test_a_taken_port_is_one_line_not_a_traceback(stoke_home: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "app", "serve", "--port", str(port)],
            cwd=REPO,
            env=_env(stoke_home),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "--port" in done.stderr and "Traceback" not in done.stderr
    shown = subprocess.run(
        [sys.executable, "-m", "app", "serve", "--show-key"],
        cwd=REPO,
        env=_env(stoke_home),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.stdout.strip() == KEY


def test_bench_serve_small(tmp_path: Path) -> None:
    report_path = tmp_path / "serve.json"
    command = [sys.executable, "-m", "app", "bench", "serve", "--turns", "2", "--facts", "2"]
    command += ["--max-tokens", "4", "--reps", "1", "--conversations", "1", "2"]
    command += ["--ctx", "2048", "--json", str(report_path), "--logs", str(tmp_path / "logs")]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    rows = re.findall(r"^(stoke|anchor)\s+(\d)\s+", done.stdout, re.MULTILINE)
    assert sorted(rows) == [("anchor", "1"), ("anchor", "2"), ("stoke", "1"), ("stoke", "2")]
    report = json.loads(report_path.read_text("utf-8"))
    assert json.loads(done.stdout.strip().splitlines()[-1]) == report
    for server in ("stoke", "anchor"):
        for n in ("1", "2"):
            row = report["results"][server][n]
            assert len(row["ttft_by_turn_s"]) == 2 and all(t > 0 for t in row["ttft_by_turn_s"])
            assert row["samples_per_turn"] == int(n)
    assert report["results"]["stoke"]["2"]["min_cached_ratio"] > 0.5
    assert "stoke_2_interleaved_within_2x" in report["targets"]
    # --logs: both servers' logs kept, and every timed request traced with the TTFT reported
    logs = tmp_path / "logs"
    assert {"stoke-serve.log", "anchor.log", "requests.jsonl"} <= {p.name for p in logs.iterdir()}
    traced = [json.loads(line) for line in (logs / "requests.jsonl").read_text().splitlines()]
    assert len(traced) == 2 * (1 + 2) * 2  # servers x conversations x turns
    for row in traced:
        timed = report["results"][row["server"]][str(row["conversations"])]["ttft_all_s"]
        assert round(row["ttft_s"], 4) in timed[row["turn"] - 1]


def test_chat_template_flag(stoke_home: Path, tmp_path: Path) -> None:
    """`--chat-template FILE` serves the model under that template: Qwen3.5's opens the
    reply's reasoning, which comes back as reasoning; a file that is not there is one line."""
    missing = subprocess.run(
        [sys.executable, "-m", "app", "serve", "--chat-template", str(tmp_path / "none.jinja")],
        cwd=REPO,
        env=_env(stoke_home),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert f"--chat-template: there is no file {tmp_path / 'none.jinja'}" in missing.stderr
    template = REPO / "tests" / "fixtures" / "chat_templates" / "Qwen-Qwen3.5-4B.jinja"
    process = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--port", "0", "--chat-template", str(template)],
        cwd=REPO,
        env=_env(stoke_home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        found = re.search(r"Serving (\S+) at (http://\S+/v1)", process.stdout.readline())
        assert found, process.stderr.read()
        client = openai.OpenAI(base_url=found[2], api_key=KEY, max_retries=0)
        reply = client.chat.completions.create(
            model=found[1],
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=8,
            temperature=0,
        )
        message = reply.choices[0].message.model_dump()
        assert message.get("reasoning_content"), message  # the template opened <think>
    finally:
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=60)
