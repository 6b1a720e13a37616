"""`stoke serve` as a real process: it prints where it listens, answers the openai client
with the key from STOKE_API_KEY under the template `--chat-template` gives, stops cleanly on
Ctrl+C, and says so when the port is taken or the template file is not there.
`stoke bench serve`, small: it runs both servers, prints its table and writes its JSON.

The servers run the tests' tiny chat model (SmolLM2's tokenizer and template, random
weights): what is proven is the command, whatever the replies say. What fails before a model
loads runs through `stoke`'s own entry point in this process."""

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

from app.models.default import default_model_path
from tests.e2e.conftest import StokeHere
from tests.tiny_model import SEED, write_tiny_chat_model

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
KEY = "sk-cli-test"
# Qwen3.5's: its generation prompt opens the reply's reasoning (`<think>`)
REASONING_TEMPLATE = REPO / "tests" / "fixtures" / "chat_templates" / "Qwen-Qwen3.5-4B.jinja"


def _env(home: Path) -> dict[str, str]:
    return {**os.environ, "STOKE_HOME": str(home), "STOKE_API_KEY": KEY}


def test_stoke_serve_answers_under_its_template_and_stops_on_ctrl_c(
    stoke_home: Path, tiny_model: str
) -> None:
    """The template's generation prompt opens `<think>`: the reply comes back as reasoning."""
    command = ["serve", "--model", tiny_model, "--port", "0", "--ctx", "2048"]
    process = subprocess.Popen(
        [sys.executable, "-m", "app", *command, "--chat-template", str(REASONING_TEMPLATE)],
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
            model=found[1],
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=8,
            temperature=0,
        )
        assert reply.usage.completion_tokens > 0
        message = reply.choices[0].message.model_dump()
        assert message.get("reasoning_content"), message  # the template opened <think>
    finally:
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert "Stopping" in err and "Traceback" not in out + err


def test_a_taken_port_is_one_line_not_a_traceback(stoke_home: Path, stoke_here: StokeHere) -> None:
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
    code, out, _ = stoke_here("serve", "--show-key", STOKE_API_KEY=KEY)
    assert code == 0 and out.strip() == KEY


def test_a_chat_template_that_is_not_there_is_one_line(
    tmp_path: Path, stoke_here: StokeHere
) -> None:
    missing = tmp_path / "none.jinja"
    code, _, err = stoke_here("serve", "--chat-template", str(missing), STOKE_API_KEY=KEY)
    assert code == 1 and "Traceback" not in err
    assert f"--chat-template: there is no file {missing}" in err


def test_bench_serve_small(tmp_path: Path, tiny_model: str) -> None:
    report_path = tmp_path / "serve.json"
    command = [sys.executable, "-m", "app", "bench", "serve", "--model", tiny_model]
    command += ["--turns", "2", "--facts", "2"]
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


def test_bench_serve_two_models_small(tmp_path: Path, tiny_model: str) -> None:
    """`stoke bench serve --models 2` on two tiny models: each server's resident, restored
    and cold TTFT; Stoke's cold loads unloaded the other model and its restored turns reused
    their KV, which llama_cpp.server's config (one model at a time, its cache lost) cannot."""
    second = write_tiny_chat_model(default_model_path(), tmp_path / "tiny-b.gguf", seed=SEED + 1)
    report_path = tmp_path / "models.json"
    command = [sys.executable, "-m", "app", "bench", "serve", "--models", "2"]
    command += ["--model", tiny_model, "--model2", str(second), "--facts", "4"]
    command += ["--max-tokens", "4", "--reps", "1", "--ctx", "1024", "--json", str(report_path)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert re.findall(r"^(stoke|anchor)\s+\d", done.stdout, re.MULTILINE) == ["stoke", "anchor"]
    report = json.loads(report_path.read_text("utf-8"))
    assert json.loads(done.stdout.strip().splitlines()[-1]) == report and not report["failures"]
    for row in report["results"].values():
        assert all(row[f"{kind}_ttft_s"] > 0 for kind in ("resident", "restored", "cold"))
        assert len(row["cold_all_s"]) == len(row["restored_all_s"]) == 2
    stoke = report["results"]["stoke"]
    assert stoke["cold_loads_unloaded_the_other"] == [True, True]
    assert stoke["restored_cached_ratio"] > 0.5
