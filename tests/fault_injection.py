"""Random `kill -9` of the app, the engine and the server, each followed by an integrity check.

`python -m tests.fault_injection --trials 60 --json bench/results/faults-....json` runs the
trials in one data folder on the real default model, a third of each kind, killed at random
moments (seeded, so a run can be repeated):

- app: a one-shot `stoke chat` turn's whole process group (app and engine) is killed.
- engine: only the engine process of a running `stoke chat` turn is killed.
- server: a running `stoke serve`'s process group is killed while it streams a reply.

After each trial: everything the database held just before the kill is still there, no reply
is left `streaming`, every reply's token ids decode to its text, the message tree is well
formed, and a follow-up turn works and reuses the KV (cached prompt tokens above zero).
Prints the table `fault | trials | survived | data lost | KV reused` and writes JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import openai

REPO = Path(__file__).resolve().parents[1]
KEY = "sk-fault-injection"
ASK = "Tell me about the colour number {n}, in a few sentences."
SAMPLING = ["--temperature", "0", "--max-tokens", "48"]


class Trial:
    """The data folder, the conversation and what the database must keep."""

    def __init__(self, home: Path, rng: random.Random) -> None:
        self.home = home
        self.rng = rng
        self.env = {**os.environ, "STOKE_HOME": str(home), "PYTHONUNBUFFERED": "1"}
        self.db = home / "data" / "conversations.db"
        self.turn_s = 3.0  # how long a turn takes here: kills land within about that
        from app.engine.llamacpp.backend import load_vocab
        from app.models.default import default_model_path

        self.vocab = load_vocab(str(default_model_path()))

    def chat(self, *args: str) -> dict[str, Any]:
        done = subprocess.run(
            [sys.executable, "-m", "app", "chat", *args, "--json"],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        lines = done.stdout.strip().splitlines()
        return json.loads(lines[-1]) if lines else {"error": done.stderr[-300:]}

    def rows(self) -> dict[str, tuple]:
        """Every message as the database holds it now (read-only, beside a live writer)."""
        try:
            with contextlib.closing(
                sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=10)
            ) as conn:
                return {
                    row[0]: row[1:]
                    for row in conn.execute(
                        "SELECT id, conversation_id, parent_id, role, content, status FROM messages"
                    )
                }
        except sqlite3.Error:
            return {}

    def check(self, before: dict[str, tuple]) -> list[str]:
        """What is wrong with the database now, in words (empty: nothing)."""
        from app.conversations import ConversationStore

        problems = []
        after = self.rows()
        for mid, (_, _, role, content, _) in before.items():
            if mid not in after:
                problems.append(f"{role} message {mid[:8]} vanished")
            elif role == "user" and after[mid][3] != content:
                problems.append(f"user message {mid[:8]} changed")
            elif role == "assistant" and not after[mid][3].startswith(content):
                problems.append(f"reply {mid[:8]} lost text")
        with ConversationStore.open(self.db) as store:
            for conversation in store.list_conversations():
                problems += self._tree(store, conversation.id)
        return problems

    def _tree(self, store, conversation_id: str) -> list[str]:
        problems = []
        path = store.current_path(conversation_id)
        for i, message in enumerate(path):
            if message.role != ("user" if i % 2 == 0 else "assistant"):
                follows = path[i - 1].role if i else "nothing"
                problems.append(f"a {message.role} message follows {follows} ({message.id[:8]})")
            if message.status == "streaming":
                problems.append(f"{message.id[:8]} still streaming")
            if message.role == "assistant" and message.token_ids is not None:
                text = self.vocab.detokenize(message.token_ids)
                if not (text == message.content or text.startswith(message.content)):
                    problems.append(f"{message.id[:8]}: token ids do not give its text")
        return problems


def _engines(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"app.engine" in command:
            found.append(int(entry.name))
    return found


def _turn_process(trial: Trial, conversation: str, n: int, **popen: Any) -> subprocess.Popen:
    """A one-shot `stoke chat` turn, running."""
    command = [sys.executable, "-m", "app", "chat", "-c", conversation, "-m", ASK.format(n=n)]
    return subprocess.Popen(
        [*command, "--json"], cwd=REPO, env=trial.env, stderr=subprocess.DEVNULL, **popen
    )


def app_fault(trial: Trial, conversation: str, n: int) -> dict[str, Any]:
    process = _turn_process(
        trial, conversation, n, stdout=subprocess.DEVNULL, start_new_session=True
    )
    delay = trial.rng.uniform(0.0, trial.turn_s)
    time.sleep(delay)
    before = trial.rows()
    alive = process.poll() is None
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    return {"delay_s": round(delay, 2), "before": before, "killed": alive}


def engine_fault(trial: Trial, conversation: str, n: int) -> dict[str, Any]:
    process = _turn_process(trial, conversation, n, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not _engines(process.pid) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    delay = trial.rng.uniform(0.0, trial.turn_s)
    time.sleep(delay)
    before = trial.rows()
    engines = _engines(process.pid)
    for pid in engines:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    out, _ = process.communicate(timeout=300)
    lines = out.strip().splitlines()
    said = json.loads(lines[-1]) if lines else {}
    return {
        "delay_s": round(delay, 2),
        "before": before,
        "killed": bool(engines),
        "said": said.get("error", ""),
    }


class Server:
    """`stoke serve` in its own process group, on a free port."""

    def __init__(self, trial: Trial) -> None:
        key_file = trial.home / "api-key"
        key_file.write_text(KEY, "utf-8")
        key_file.chmod(0o600)
        command = [sys.executable, "-m", "app", "serve", "--port", "0", "--ctx", "4096"]
        self.process = subprocess.Popen(
            [*command, "--api-key-file", str(key_file)],
            cwd=REPO,
            env=trial.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        found = re.search(r"Serving (\S+) at (http://\S+/v1)", self.process.stdout.readline())
        if not found:
            raise SystemExit("stoke serve did not start")
        self.model, self.url = found[1], found[2]
        self.client = openai.OpenAI(base_url=self.url, api_key=KEY, max_retries=0, timeout=300)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def server_fault(trial: Trial, history: list[dict[str, str]], n: int) -> dict[str, Any]:
    server = Server(trial)
    messages = [*history, {"role": "user", "content": ASK.format(n=n)}]

    def stream() -> None:
        with contextlib.suppress(Exception):  # the server dies under it: that is the point
            for _ in server.client.chat.completions.create(
                model=server.model, messages=messages, max_tokens=48, stream=True
            ):
                pass

    reader = threading.Thread(target=stream, daemon=True)
    reader.start()
    delay = trial.rng.uniform(0.0, trial.turn_s)
    time.sleep(delay)
    alive = reader.is_alive()  # the reply was still streaming
    server.kill()
    reader.join(30)
    return {"delay_s": round(delay, 2), "killed": alive}


def _server_turn(trial: Trial, history: list[dict[str, str]], text: str) -> tuple[str, int]:
    server = Server(trial)
    try:
        messages = [*history, {"role": "user", "content": text}]
        reply = server.client.chat.completions.create(
            model=server.model, messages=messages, max_tokens=48, temperature=0
        )
        details = reply.usage.prompt_tokens_details
        text = reply.choices[0].message.content
        history += [messages[-1], {"role": "assistant", "content": text}]
        return text, (details.cached_tokens if details else 0) or 0
    finally:
        server.process.send_signal(signal.SIGINT)
        server.process.wait(120)


def run(trials: int, seed: int, home: Path) -> dict[str, Any]:
    rng = random.Random(seed)
    trial = Trial(home, rng)
    first = trial.chat("--new", "-m", ASK.format(n=0), *SAMPLING)  # probes, hashes: slow
    if "conversation_id" not in first:
        raise SystemExit(f"the first turn failed: {first}")
    conversation = first["conversation_id"]
    started = time.monotonic()
    trial.chat("-c", conversation, "-m", "And one more colour?")  # a warm turn's whole life
    trial.turn_s = max(time.monotonic() - started, 1.0)
    history: list[dict[str, str]] = []
    _server_turn(trial, history, ASK.format(n=0))  # the API conversation's first reply
    kinds = ["app", "engine", "server"]
    results = []
    lives = [trial.turn_s]
    for i in range(trials):
        kind = kinds[i % 3]
        n = i + 1
        if kind == "server":
            record = server_fault(trial, history, n)
            reply, reused = _server_turn(trial, history, f"Go on, colour {n}.")
            record.update(problems=trial.check({}), reused=reused, followed=bool(reply))
        else:
            fault = app_fault if kind == "app" else engine_fault
            record = fault(trial, conversation, n)
            before = record.pop("before")
            began = time.monotonic()
            follow = trial.chat("-c", conversation, "-m", f"Go on, colour {n}.")
            lives.append(time.monotonic() - began)  # a whole turn's life, as the machine is now
            trial.turn_s = statistics.median(lives[-6:])
            stats = follow.get("stats") or {}
            record.update(
                problems=trial.check(before),
                reused=stats.get("reused_tokens", 0),
                followed=follow.get("status") == "complete",
            )
        record.update(kind=kind, trial=i)
        results.append(record)
        status = "ok" if record["followed"] and not record["problems"] else record["problems"]
        when = "mid-work" if record["killed"] else "after it ended"
        print(f"{i:3d} {kind:6s} kill at {record['delay_s']:.2f}s ({when}): {status}", flush=True)
    table = []
    for kind in kinds:
        rows = [r for r in results if r["kind"] == kind]
        lost = sum(bool([p for p in r["problems"] if "vanished" in p or "lost" in p]) for r in rows)
        table.append(
            {
                "fault": kind,
                "trials": len(rows),
                "mid_work": sum(r["killed"] for r in rows),
                "survived": sum(r["followed"] and not r["problems"] for r in rows),
                "data_lost": lost,
                "kv_reused": sum(r["reused"] > 0 for r in rows),
            }
        )
    return {"seed": seed, "turn_s": round(trial.turn_s, 2), "table": table, "trials": results}


def render(report: dict[str, Any]) -> str:
    lines = [
        "| fault | trials | killed mid-work | survived | data lost | follow-up reused KV |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in report["table"]:
        lines.append(
            f"| kill -9 of the {row['fault']} | {row['trials']} | {row['mid_work']} | "
            f"{row['survived']} | "
            f"{row['data_lost']} | {row['kv_reused']} |"
        )
    problems = Counter(p for r in report["trials"] for p in r["problems"])
    lines += [f"problem seen: {p} ({n}x)" for p, n in problems.most_common(10)]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fault_injection")
    parser.add_argument("--trials", type=int, default=60)
    parser.add_argument("--seed", type=int, default=20261201)
    parser.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="stoke-faults-") as home:
        report = run(args.trials, args.seed, Path(home))
    print(render(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n", "utf-8")
    return 0 if all(r["data_lost"] == 0 for r in report["table"]) else 1


if __name__ == "__main__":
    sys.exit(main())
