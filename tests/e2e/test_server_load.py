"""Eight concurrent clients on `stoke serve` for a while (STOKE_LOAD_SECONDS; 6 s here, 60 s
for docs/api.md's numbers): every request answered, none mixed up with another client's, and
latency percentiles printed (and written as JSON to STOKE_LOAD_JSON when set).

Each client holds its own conversation (stateless, full history every turn; a new one every
four turns) and alternates chat and token-id completions, streamed and not. A mix-up would
show as a prompt that is not the client's own: with `return_token_ids` the server sends the
prompt it used back, and the test decodes it.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import openai
import pytest

from app.engine.llamacpp.backend import Vocab, load_vocab
from app.models.default import default_model_path
from tests.e2e.serving import TOPICS, ServerThread, document

pytestmark = pytest.mark.e2e
CLIENTS = 8
IDS = {"return_token_ids": True}


@pytest.fixture(scope="module")
def served(shared_home: Callable[[str], Path]) -> Iterator[ServerThread]:
    """The default model: the latencies printed are docs/api.md's."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STOKE_HOME", str(shared_home("serve-home")))
        with ServerThread(n_ctx=4096) as server:
            yield server


@dataclass
class Client:
    number: int
    served: ServerThread
    vocab: Vocab
    deadline: float
    latencies: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    sent: int = 0

    @property
    def marker(self) -> str:
        return f"[client {self.number}]"

    def run(self) -> None:
        client = self.served.client(timeout=300)
        messages: list[dict] = []
        turn = 0
        while turn < 2 or time.monotonic() < self.deadline:  # a chat and a completion at least
            if turn % 4 == 0:
                topic = TOPICS[self.number % len(TOPICS)]
                messages = [
                    {"role": "system", "content": f"{self.marker} Answer briefly."},
                    {"role": "user", "content": document(topic, 3) + f"\nTurn {turn}?"},
                ]
            try:
                if turn % 2 == 0:
                    reply = self.chat(client, messages, stream=turn % 4 == 0)
                    messages += [
                        {"role": "assistant", "content": reply},
                        {"role": "user", "content": f"{self.marker} And turn {turn + 1}?"},
                    ]
                else:
                    self.complete(client, stream=turn % 4 == 1)
            except openai.OpenAIError as exc:
                self.problems.append(f"{self.marker} turn {turn}: {exc!r}")
            turn += 1

    def chat(self, client: openai.OpenAI, messages: list[dict], *, stream: bool) -> str:
        started = time.perf_counter()
        self.sent += 1
        if stream:
            chunks = []
            first: float | None = None
            for chunk in client.chat.completions.create(
                model=self.served.model,
                messages=messages,
                max_tokens=12,
                temperature=0,
                stream=True,
                extra_body=IDS,
            ):
                if first is None and chunk.choices and chunk.choices[0].token_ids:
                    first = time.perf_counter() - started
                chunks.append(chunk)
            if first is not None:
                self.ttfts.append(first)
            if len({c.id for c in chunks}) != 1:
                self.problems.append(f"{self.marker}: one stream carried several ids")
            prompt = chunks[0].prompt_token_ids
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            ids = [t for c in chunks if c.choices for t in c.choices[0].token_ids]
        else:
            done = client.chat.completions.create(
                model=self.served.model,
                messages=messages,
                max_tokens=12,
                temperature=0,
                extra_body=IDS,
            )
            prompt, text = done.prompt_token_ids, done.choices[0].message.content
            ids = done.choices[0].token_ids
        self.latencies.append(time.perf_counter() - started)
        self.check_prompt(prompt, messages[-1]["content"])
        if not self.vocab.detokenize(ids).startswith(text):
            self.problems.append(f"{self.marker}: reply text is not its own token ids")
        return text

    def complete(self, client: openai.OpenAI, *, stream: bool) -> None:
        prompt = self.vocab.tokenize(f"{self.marker} Count: 1, 2, 3,", special=True)
        started = time.perf_counter()
        self.sent += 1
        if stream:
            chunks = list(
                client.completions.create(
                    model=self.served.model,
                    prompt=prompt,
                    max_tokens=8,
                    temperature=0,
                    stream=True,
                    extra_body=IDS,
                )
            )
            echoed = chunks[0].prompt_token_ids
            ids = [t for c in chunks for t in c.choices[0].token_ids]
            text = "".join(c.choices[0].text for c in chunks)
        else:
            done = client.completions.create(
                model=self.served.model, prompt=prompt, max_tokens=8, temperature=0, extra_body=IDS
            )
            echoed, ids, text = (
                done.prompt_token_ids,
                done.choices[0].token_ids,
                done.choices[0].text,
            )
        self.latencies.append(time.perf_counter() - started)
        if echoed != prompt:
            self.problems.append(f"{self.marker}: a completion answered another prompt")
        if not ids or not self.vocab.detokenize(ids).startswith(text):
            self.problems.append(f"{self.marker}: completion text is not its own token ids")

    def check_prompt(self, prompt: list[int], last_message: str) -> None:
        decoded = self.vocab.detokenize(prompt)
        others = [f"[client {n}]" for n in range(CLIENTS) if n != self.number]
        if last_message not in decoded or any(other in decoded for other in others):
            self.problems.append(f"{self.marker}: a chat reply was made for another prompt")


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    cut = statistics.quantiles(ordered, n=100, method="inclusive") if len(ordered) > 1 else []
    pick = {"p50": 49, "p90": 89, "p99": 98}
    out = {name: round(cut[i], 3) for name, i in pick.items()} if cut else {}
    out["max"] = round(ordered[-1], 3) if ordered else 0.0
    return out


@pytest.mark.timeout(900)  # eight clients' last requests finish after the deadline
def test_eight_clients_at_once_lose_and_mix_nothing(served: ServerThread) -> None:
    seconds = float(os.environ.get("STOKE_LOAD_SECONDS", "6"))
    vocab = load_vocab(str(default_model_path()))
    stats_before = (served.server.stats.completed, served.server.stats.rejected)
    deadline = time.monotonic() + seconds
    clients = [Client(n, served, vocab, deadline) for n in range(CLIENTS)]
    threads = [threading.Thread(target=c.run) for c in clients]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 600)
    elapsed = time.monotonic() - started

    problems = [p for c in clients for p in c.problems]
    assert not problems, problems
    sent = sum(c.sent for c in clients)
    latencies = [t for c in clients for t in c.latencies]
    assert len(latencies) == sent and all(c.sent >= 2 for c in clients)
    # a handler counts itself out after its last byte went out: let the loop get there
    settle_by = time.monotonic() + 5
    while served.server.stats.in_flight and time.monotonic() < settle_by:
        time.sleep(0.05)
    assert served.server.stats.in_flight == 0
    assert served.server.stats.completed - stats_before[0] == sent  # none lost
    assert served.server.stats.rejected == stats_before[1]

    report = {
        "clients": CLIENTS,
        "seconds": round(elapsed, 1),
        "requests": sent,
        "requests_per_s": round(sent / elapsed, 2),
        "latency_s": _percentiles(latencies),
        "stream_ttft_s": _percentiles([t for c in clients for t in c.ttfts]),
    }
    print("\nload:", json.dumps(report))
    if os.environ.get("STOKE_LOAD_JSON"):
        Path(os.environ["STOKE_LOAD_JSON"]).write_text(json.dumps(report, indent=2) + "\n")
