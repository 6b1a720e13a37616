"""A crash loop no longer ends serving for good (issue 14, item 9): the host backs off and tries
again with conservative settings, /health says so, and when every back-off is spent `stoke
serve` exits with status 1 so a supervisor restarts it. The crashes are real SIGKILLs of the
real engine process."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from app.engine import safe_mode
from app.engine.host import EngineClient, EngineState
from tests.e2e.serving import ServerThread

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
WAIT_S = 300.0


def _engines(pid: int) -> list[int]:
    """The engine processes (`python -m app.engine ...`) that `pid` started."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                command = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"app.engine" in command:
                found.append(int(entry.name))
    return found


def _health(url: str) -> dict:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=10) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return json.loads(error.read())


def _kill_until(condition, engine_pids, deadline: float) -> int:
    """SIGKILL each new engine process as it appears, until `condition()`; returns kills."""
    killed: set[int] = set()
    while not condition():
        assert time.monotonic() < deadline, "the crash loop never reached its end"
        for pid in engine_pids():
            if pid not in killed:
                killed.add(pid)
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    return len(killed)


def test_a_crash_loop_backs_off_then_recovers_conservatively(monkeypatch):
    monkeypatch.setattr(EngineClient, "BACKOFF_S", (1.0,))  # the in-process server's engine
    with ServerThread(n_ctx=1024) as served:
        engine = served.engine
        url = served.url.removesuffix("/v1")
        deadline = time.monotonic() + WAIT_S
        seen: list[dict] = []

        def backing_off() -> bool:
            if engine.retry_at is None:
                return False
            seen.append(_health(url))
            return True

        _kill_until(backing_off, lambda: [engine.pid] if engine.pid else [], deadline)
        assert seen[0]["status"] == "restarting" and 0 <= seen[0]["retry_in_s"] <= 1.0
        assert any("trying again in 1 s" in notice for notice in engine.notices)
        served.call(engine.ready(), timeout=WAIT_S)  # it came back by itself
        assert engine.state == EngineState.READY and _health(url) == {"status": "ok"}
        assert safe_mode.is_conservative(engine.launch_options)
        reply = served.client().chat.completions.create(
            model=served.model, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert reply.choices[0].message.content is not None


def test_stoke_serve_exits_non_zero_when_it_gives_up(stoke_home: Path, tmp_path: Path):
    key = tmp_path / "key"
    key.write_text("sk-loop", "utf-8")
    key.chmod(0o600)
    command = [sys.executable, "-m", "app", "serve", "--port", "0", "--ctx", "1024"]
    command += ["--api-key-file", str(key), "--crash-backoff", "0.5,0.5"]
    process = subprocess.Popen(
        command,
        cwd=REPO,
        env={**os.environ, "STOKE_HOME": str(stoke_home)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert re.search(r"Serving \S+ at http://", process.stdout.readline())
        kills = _kill_until(
            lambda: process.poll() is not None,
            lambda: _engines(process.pid),
            time.monotonic() + WAIT_S,
        )
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 1
    assert kills == 3 * (EngineClient.MAX_RESTARTS + 1)  # three loops: two back-offs, then done
    assert "Stoke stopped restarting it" in err and "supervisor" in err
    assert "trying again in 0.5 s with conservative settings" in err
    assert "Traceback" not in err
