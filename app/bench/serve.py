"""`stoke bench serve`: time to first token of stateless API clients, one conversation alone
and two or four interleaved, against `stoke serve` and against llama-cpp-python's own
OpenAI server with its prompt cache (`python -m llama_cpp.server --cache True`, the anchor;
its cache bounded so that it fits the machine: ANCHOR_CACHE_BYTES).

Both servers run as real processes on loopback with the same model, context, batch and
threads; both are driven by the official openai client, streaming, greedy. A client sends
the whole history every turn, with the server's own earlier replies, as agents do.
*Interleaved* means round-robin: turn 1 of every conversation, then turn 2 of every
conversation, and so on, so each request follows one from another conversation. Times are
client-side: the request sent to the first streamed content. Each scenario uses
conversations no earlier scenario has seen (distinct documents, one shared system prompt).
Prints a table and writes JSON.

With `--models 2`, models on demand instead: two models behind one server, whose budget
holds one (Stoke's `--budget`; llama_cpp.server's `--config_file` listing both keeps one
loaded by design), each conversation's turns sent as cold (its model not loaded, the
conversation new), resident (the follow-up at once) and restored (the follow-up after the
other model's turns unloaded its model): TTFT of each, beside each other.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from app.bench import agent
from app.bench.kv import machine, median
from app.bench.output import emit
from app.engine.llamacpp import verdict_file

if TYPE_CHECKING:
    import openai

API_KEY = "sk-bench"
Trace = Callable[[int, int, float, float], None]  # conversation, turn, sent (unix s), TTFT
SYSTEM = (
    "You are a terse assistant. Answer from the notes the user gives; when unsure, say so "
    "in one sentence."
)
FOLLOW_UPS = (
    "Which town has the most?",
    "Say that again in five words.",
    "Name one more town from the notes.",
    "Is that a lot?",
    "Which town has the fewest?",
    "Thanks. One last word?",
    "And the second one?",
)
TOPICS = (
    "harbour",
    "glacier",
    "orchard",
    "lighthouse",
    "violin",
    "comet",
    "market",
    "forest",
    "bridge",
    "desert",
    "library",
    "river",
    "volcano",
    "train",
)
STARTUP_S = 300
# llama-cpp-python's RAM cache counts a state by its llama.cpp bytes (the KV, ~20 MB here) but
# also keeps the logits of every prompt token with it (n_batch x n_vocab floats, ~100 MB on
# SmolLM2), so its default 2 GiB grew the anchor past 20 GB over a run and the kernel killed
# it. 512 MiB counted (~3 GB held) keeps ~25 states: every conversation of a scenario hits.
ANCHOR_CACHE_BYTES = 512 << 20
SERVERS = ("stoke", "anchor")
MODEL_KINDS = ("resident", "restored", "cold")  # --models 2: the turns timed
LOGS = {"stoke": "stoke-serve.log", "anchor": "anchor.log"}


def document(topic: str, facts: int, tag: str) -> str:
    """A first message no other conversation starts with (the tag comes first)."""
    lines = [
        f"Notes on the {topic} of town {i}: it has {i * 3 + 1} {topic}s." for i in range(facts)
    ]
    head = f"[{tag}] Read these notes about {topic}s.\n"
    return head + "\n".join(lines) + "\nWhich town is first?"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(url: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + STARTUP_S
    request = urllib.request.Request(
        f"{url}/models", headers={"Authorization": f"Bearer {API_KEY}"}
    )
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited: {log.read_text('utf-8', 'replace')[-2000:]}")
        with contextlib.suppress(OSError), urllib.request.urlopen(request, timeout=2):
            return
        time.sleep(0.2)
    raise RuntimeError(f"the server at {url} did not start within {STARTUP_S} s")


@contextlib.contextmanager
def _process(command: list[str], log: Path, env: dict[str, str]) -> Iterator[subprocess.Popen]:
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def stoke_server(model: str, n_ctx: int, home: Path, logs: Path | None = None) -> Iterator[str]:
    """`stoke serve` as a child process (its log in `logs`, else `home`); yields its URL."""
    port = _free_port()
    stoke_home = verdict_file.carry(home / "stoke")  # its own, with this machine's CPU verdict
    env = {**os.environ, "STOKE_HOME": str(stoke_home), "STOKE_API_KEY": API_KEY}
    command = [sys.executable, "-m", "app", "serve", "--model", model, "--ctx", str(n_ctx)]
    command += ["--port", str(port)]
    log = (logs or home) / LOGS["stoke"]
    with _process(command, log, env) as process:
        url = f"http://127.0.0.1:{port}/v1"
        _wait_ready(url, process, log)
        yield url


@contextlib.contextmanager
def anchor_server(
    model: str, n_ctx: int, home: Path, logs: Path | None = None, *, verbose: bool = False
) -> Iterator[str]:
    """llama_cpp.server with its RAM prompt cache, threads and CPU buffer types as Stoke's
    engine uses; `verbose`: its log tells how many prompt tokens each request evaluated."""
    port = _free_port()
    threads = str(os.cpu_count() or 1)
    command = [sys.executable, "-m", "app.engine.llamacpp.peer_server", "--model", model]
    command += ["--n_ctx", str(n_ctx), "--n_batch", "512", "--cache", "True"]
    command += ["--cache_size", str(ANCHOR_CACHE_BYTES)]
    command += ["--n_threads", threads, "--n_threads_batch", threads, "--verbose", str(verbose)]
    command += ["--host", "127.0.0.1", "--port", str(port), "--api_key", API_KEY]
    log = (logs or home) / LOGS["anchor"]
    with _process(command, log, dict(os.environ)) as process:
        url = f"http://127.0.0.1:{port}/v1"
        _wait_ready(url, process, log)
        yield url


def _turn(
    client: openai.OpenAI, model: str, messages: list[dict[str, str]], max_tokens: int
) -> tuple[str, float, int | None, int | None]:
    """One streamed turn: (reply, ttft, prompt tokens, cached tokens) — the counts where the
    server reports them."""
    started = time.perf_counter()
    first: float | None = None
    pieces: list[str] = []
    usage = None
    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.perf_counter()
            pieces.append(chunk.choices[0].delta.content)
    ttft = (first or time.perf_counter()) - started
    details = getattr(usage, "prompt_tokens_details", None) if usage else None
    cached = getattr(details, "cached_tokens", None) if details else None
    return "".join(pieces), ttft, usage.prompt_tokens if usage else None, cached


def replay(
    url: str, documents: list[str], turns: int, max_tokens: int, trace: Trace | None = None
) -> dict[str, list]:
    """Round-robin turns of fresh conversations, one per document: TTFT per turn (a list
    over conversations) and the cached share of each follow-up's prompt; each request also
    to `trace` (conversation, turn, the time it was sent, its TTFT), where one is given."""
    import openai  # a dev dependency: only the benchmark needs the client

    client = openai.OpenAI(base_url=url, api_key=API_KEY, max_retries=0, timeout=600)
    model = client.models.list().data[0].id
    chats = [
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": doc}]
        for doc in documents
    ]
    ttfts: list[list[float]] = [[] for _ in range(turns)]
    ratios: list[float] = []
    for turn in range(turns):
        for i, messages in enumerate(chats):
            sent = time.time()
            reply, ttft, prompt, cached = _turn(client, model, messages, max_tokens)
            ttfts[turn].append(ttft)
            if trace is not None:
                trace(i, turn, sent, ttft)
            if turn and prompt and cached is not None:
                ratios.append(cached / prompt)
            messages.append({"role": "assistant", "content": reply})
            messages.append({"role": "user", "content": FOLLOW_UPS[turn % len(FOLLOW_UPS)]})
    return {"ttfts": ttfts, "ratios": ratios}


def warm_up(url: str) -> None:
    """One short request: the model is loaded and first-call costs are paid before timing."""
    import openai

    client = openai.OpenAI(base_url=url, api_key=API_KEY, max_retries=0, timeout=STARTUP_S)
    model = client.models.list().data[0].id
    client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=1, temperature=0
    )


def summarise(runs: list[dict[str, list]], n: int) -> dict[str, Any]:
    turns = len(runs[0]["ttfts"])
    by_turn = [[t for run in runs for t in run["ttfts"][i]] for i in range(turns)]
    ratios = [r for run in runs for r in run["ratios"]]
    return {
        "conversations": n,
        "samples_per_turn": len(by_turn[0]),
        "ttft_by_turn_s": [round(median(t), 4) for t in by_turn],
        "turn1_by_rep_s": [round(median(run["ttfts"][0]), 4) for run in runs],
        "ttft_all_s": [[round(t, 4) for t in turn] for turn in by_turn],
        "follow_up_ttft_s": round(median([t for turn in by_turn[1:] for t in turn]), 4),
        "min_cached_ratio": round(min(ratios), 4) if ratios else None,
        **_totals(runs),
    }


def _totals(runs: list[dict[str, list]]) -> dict[str, float]:
    """The agent scenario's median whole-reply time of the follow-ups (a call streams whole
    from Stoke, so its TTFT is its reply's end)."""
    follow_ups = [t for run in runs for t in run.get("totals", [])[1:]]
    return {"follow_up_reply_s": round(median(follow_ups), 4)} if follow_ups else {}


def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    import openai

    from app.models.default import default_model_path

    model = args.model or str(default_model_path())
    servers = [s for s in SERVERS if s != "anchor" or not args.no_anchor]
    runs: dict[str, dict[int, list]] = {s: {n: [] for n in args.conversations} for s in servers}
    failures: dict[str, str] = {}  # a server that broke off: why, and its log's last lines
    with (
        tempfile.TemporaryDirectory(prefix="stoke-bench-serve-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        home = Path(tmp)
        logs = Path(args.logs) if args.logs else None
        requests: TextIO | None = None
        if logs is not None:
            logs.mkdir(parents=True, exist_ok=True)
            requests = stack.enter_context((logs / "requests.jsonl").open("w", encoding="utf-8"))
        urls = {"stoke": stack.enter_context(stoke_server(model, args.ctx, home, logs))}
        if "anchor" in servers:
            urls["anchor"] = stack.enter_context(anchor_server(model, args.ctx, home, logs))
        for url in urls.values():
            warm_up(url)
        for rep in range(args.reps):
            for n in args.conversations:
                documents = [
                    document(TOPICS[(rep + i) % len(TOPICS)], args.facts, f"{rep}.{n}.{i}")
                    for i in range(n)
                ]
                order = servers if rep % 2 == 0 else servers[::-1]  # who goes first alternates
                for server in (s for s in order if s not in failures):
                    print(f"rep {rep + 1}: {server}, {n} conversation(s)", file=sys.stderr)
                    try:
                        if args.agent:  # one tool loop; its task is new to both servers
                            task = f"[{rep}] Fix the failing test in m{rep}."
                            run = agent.replay(urls[server], API_KEY, task, args.turns, 64)
                        else:
                            trace = requests and _tracer(requests, server, rep, n)
                            run = replay(
                                urls[server], documents, args.turns, args.max_tokens, trace
                            )
                        runs[server][n].append(run)
                    except openai.OpenAIError as exc:
                        log = (logs or home) / LOGS[server]
                        tail = log.read_text("utf-8", "replace")[-1500:] if log.exists() else ""
                        failures[server] = f"{type(exc).__name__}: {exc}\n{tail}"
                        print(f"{server} failed: {failures[server]}", file=sys.stderr)
    results = {
        server: {str(n): summarise(r, n) for n, r in by_n.items() if r}
        for server, by_n in runs.items()
    }
    return {
        "benchmark": "serve-agent" if args.agent else "serve",
        "model": Path(model).name,
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
        "params": {
            "turns": args.turns,
            "facts": args.facts,
            "max_tokens": args.max_tokens,
            "n_ctx": args.ctx,
            "reps": args.reps,
            "conversations": args.conversations,
            "anchor_cache_bytes": ANCHOR_CACHE_BYTES,
        },
        "results": results,
        "failures": failures,
        "targets": targets(results),
    }


def _tracer(out: TextIO, server: str, rep: int, n: int) -> Trace:
    """A trace that writes each request as one JSON line, to line up with the servers' logs
    (an outlier's time: in the engine's prefill, or waiting before it)."""

    def write(conversation: int, turn: int, sent: float, ttft: float) -> None:
        row = {"server": server, "rep": rep + 1, "conversations": n}
        row.update(conversation=conversation, turn=turn + 1, sent=round(sent, 3))
        out.write(json.dumps({**row, "ttft_s": round(ttft, 4)}) + "\n")
        out.flush()

    return write


def targets(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Stoke's interleaved follow-up TTFT within 2x of its single-conversation TTFT, and its
    turn 1 (a new conversation's prefill) within 1.1x of the anchor's in every rep (each
    rep's median over its conversations, the two servers' same documents)."""
    stoke, anchor = results.get("stoke", {}), results.get("anchor", {})
    single = stoke.get("1", {}).get("follow_up_ttft_s")
    out: dict[str, Any] = {}
    for n, row in stoke.items():
        if n != "1" and single:
            ratio = row["follow_up_ttft_s"] / single
            out[f"stoke_{n}_interleaved_vs_single"] = round(ratio, 2)
            out[f"stoke_{n}_interleaved_within_2x"] = ratio <= 2.0
    turn1 = [
        round(ours / theirs, 2)
        for n, row in stoke.items()
        if "turn1_by_rep_s" in anchor.get(n, {})
        for ours, theirs in zip(row["turn1_by_rep_s"], anchor[n]["turn1_by_rep_s"], strict=False)
    ]
    if turn1:
        out["stoke_turn1_vs_anchor_by_rep"] = turn1
        out["stoke_turn1_within_1.1x_every_rep"] = max(turn1) <= 1.1
    return out


@contextlib.contextmanager
def stoke_pool_server(
    models: tuple[str, str], n_ctx: int, home: Path, logs: Path | None = None
) -> Iterator[tuple[str, tuple[str, str]]]:
    """`stoke serve` with both models in its library and a budget that holds one (the pool's
    own estimate of each); yields its URL and the two models' ids."""
    from app.engine.protocol import LoadOptions
    from app.models.names import model_name
    from app.pool.need import memory_need
    from app.settings import Settings
    from app.units import GIB

    library = home / "stoke" / "data" / "models"
    library.mkdir(parents=True, exist_ok=True)
    ids = tuple(model_name(m) for m in models)
    for model in models:
        (library / Path(model).name).symlink_to(Path(model).resolve())
    resident = Settings().resident_conversations
    needs = sorted(memory_need(LoadOptions(m, n_ctx=n_ctx, n_seq_max=resident)) for m in models)
    budget = needs[1] + needs[0] // 2
    port = _free_port()
    stoke_home = verdict_file.carry(home / "stoke")  # its own, with this machine's CPU verdict
    env = {**os.environ, "STOKE_HOME": str(stoke_home), "STOKE_API_KEY": API_KEY}
    command = [sys.executable, "-m", "app", "serve", "--model", models[0], "--ctx", str(n_ctx)]
    command += ["--port", str(port), "--budget", f"{budget / GIB:.6f}"]
    log = (logs or home) / LOGS["stoke"]
    with _process(command, log, env) as process:
        url = f"http://127.0.0.1:{port}/v1"
        _wait_ready(url, process, log)
        yield url, ids


@contextlib.contextmanager
def anchor_pool_server(
    models: tuple[str, str], n_ctx: int, home: Path, logs: Path | None = None
) -> Iterator[tuple[str, tuple[str, str]]]:
    """llama_cpp.server's multi-model config on the same two files (each with its RAM prompt
    cache, as the single-model anchor); yields its URL and the two aliases."""
    port = _free_port()
    threads = os.cpu_count() or 1
    ids = ("model-a", "model-b")
    config = {
        "host": "127.0.0.1",
        "port": port,
        "api_key": API_KEY,
        "models": [
            {
                "model": model,
                "model_alias": alias,
                "n_ctx": n_ctx,
                "n_batch": 512,
                "n_threads": threads,
                "n_threads_batch": threads,
                "cache": True,
                "cache_size": ANCHOR_CACHE_BYTES,
                "verbose": False,
            }
            for model, alias in zip(models, ids, strict=True)
        ],
    }
    path = home / "anchor-models.json"
    path.write_text(json.dumps(config), "utf-8")
    command = [sys.executable, "-m", "app.engine.llamacpp.peer_server", "--config_file", str(path)]
    log = (logs or home) / LOGS["anchor"]
    with _process(command, log, dict(os.environ)) as process:
        url = f"http://127.0.0.1:{port}/v1"
        _wait_ready(url, process, log)
        yield url, ids


def _states(url: str) -> dict[str, str]:
    """Stoke's /v1/models: each model's state."""
    request = urllib.request.Request(
        f"{url}/models", headers={"Authorization": f"Bearer {API_KEY}"}
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return {m["id"]: m.get("state", "") for m in json.load(answer)["data"]}


def swap_replay(
    url: str, ids: tuple[str, str], reps: int, facts: int, max_tokens: int, *, stoke: bool
) -> dict[str, list]:
    """Per rep, a new conversation on each model in turn: cold (its model unloaded), resident
    (the follow-up at once), and, after the other model's two turns, restored. TTFTs by kind,
    the cached share of each restored prompt, and (Stoke) whether each cold load had
    unloaded the other model."""
    import openai

    client = openai.OpenAI(base_url=url, api_key=API_KEY, max_retries=0, timeout=600)
    for model in ids:  # both loaded once (first-call costs paid); the second unloads the first
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=1, temperature=0
        )
    out: dict[str, list] = {"cold": [], "resident": [], "restored": [], "cached": [], "swapped": []}

    def turn(model: str, messages: list[dict[str, str]], kind: str, n: int) -> None:
        reply, ttft, prompt, cached = _turn(client, model, messages, max_tokens)
        out[kind].append(ttft)
        if kind == "restored" and prompt and cached is not None:
            out["cached"].append(cached / prompt)
        if kind == "cold" and stoke:
            other = ids[1 - ids.index(model)]
            out["swapped"].append(_states(url).get(other) == "unloaded")
        messages += [
            {"role": "assistant", "content": reply},
            {"role": "user", "content": FOLLOW_UPS[n % len(FOLLOW_UPS)]},
        ]

    for rep in range(reps):
        chats = {
            model: [
                {"role": "system", "content": SYSTEM},
                {
                    "role": "user",
                    "content": document(TOPICS[(2 * rep + i) % len(TOPICS)], facts, f"m{rep}.{i}"),
                },
            ]
            for i, model in enumerate(ids)
        }
        for model in ids:
            turn(model, chats[model], "cold", 0)
            turn(model, chats[model], "resident", 1)
        for model in ids:
            turn(model, chats[model], "restored", 2)
    return out


def run_models_bench(args: argparse.Namespace) -> dict[str, Any]:
    """`--models 2`: models on demand, Stoke's pool beside llama_cpp.server's config."""
    import openai

    from app.engine.llamacpp.quantize import requantize
    from app.models.default import default_model_path

    servers = [s for s in SERVERS if s != "anchor" or not args.no_anchor]
    results: dict[str, dict[str, Any]] = {}
    failures: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="stoke-bench-models-") as tmp:
        home = Path(tmp)
        logs = Path(args.logs) if args.logs else None
        if logs is not None:
            logs.mkdir(parents=True, exist_ok=True)
        first = args.model or str(default_model_path())
        second = args.model2
        if second is None:  # the default pair: the model and its Q8_0 copy
            second = str(requantize(Path(first), home / f"{Path(first).stem}-q8_0.gguf", "q8_0"))
        models = (first, second)
        starts = {"stoke": stoke_pool_server, "anchor": anchor_pool_server}
        for server in servers:
            print(f"{server}: two models, {args.reps} reps", file=sys.stderr)
            try:
                with starts[server](models, args.ctx, home, logs) as (url, ids):
                    run = swap_replay(
                        url, ids, args.reps, args.facts, args.max_tokens, stoke=server == "stoke"
                    )
            except (openai.OpenAIError, RuntimeError) as exc:
                failures[server] = f"{type(exc).__name__}: {exc}"
                print(f"{server} failed: {failures[server]}", file=sys.stderr)
                continue
            results[server] = {
                **{f"{kind}_ttft_s": round(median(run[kind]), 4) for kind in MODEL_KINDS},
                **{f"{kind}_all_s": [round(t, 4) for t in run[kind]] for kind in MODEL_KINDS},
                "restored_cached_ratio": round(min(run["cached"]), 4) if run["cached"] else None,
                "cold_loads_unloaded_the_other": run["swapped"] or None,
            }
    return {
        "benchmark": "serve-models",
        "models": [Path(m).name for m in models],
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
        "params": {
            "models": 2,
            "facts": args.facts,
            "max_tokens": args.max_tokens,
            "n_ctx": args.ctx,
            "reps": args.reps,
            "anchor_cache_bytes": ANCHOR_CACHE_BYTES,
        },
        "results": results,
        "failures": failures,
    }


def render_models(report: dict[str, Any]) -> str:
    params = report["params"]
    lines = [
        f"stoke bench serve --models 2 — {' and '.join(report['models'])} on "
        f"{report['machine']['cpu']} ({report['machine']['cores']} cores); greedy, "
        f"{params['max_tokens']} tokens a reply; TTFT in seconds, median over {params['reps']} "
        "reps x both models",
        "",
    ]
    header = f"{'server':<8} {'resident':>9} {'restored':>9} {'cold':>9}"
    header += f" {'restored/cold':>14} {'cached':>7}"
    lines += [header, "-" * len(header)]
    for server, row in report["results"].items():
        cached = row["restored_cached_ratio"]
        lines.append(
            f"{server:<8} {row['resident_ttft_s']:>9.3f} {row['restored_ttft_s']:>9.3f} "
            f"{row['cold_ttft_s']:>9.3f} {row['restored_ttft_s'] / row['cold_ttft_s']:>13.2f}x "
            + (f"{cached:>7.3f}" if cached is not None else f"{'-':>7}")
        )
    lines += [
        "",
        "resident: the follow-up with its model loaded; restored: the follow-up after the other "
        "model's turns unloaded its model; cold: a new conversation on a model not loaded; "
        "cached: lowest cached_tokens / prompt_tokens of a restored turn (as reported)",
    ]
    for server, why in report["failures"].items():
        lines.append(f"{server} broke off: {why.splitlines()[0]}")
    return "\n".join(lines)


def render(report: dict[str, Any]) -> str:
    params = report["params"]
    lines = [
        f"stoke bench serve — {report['model']} on {report['machine']['cpu']} "
        f"({report['machine']['cores']} cores); {params['turns']} turns, greedy, "
        f"{params['max_tokens']} tokens a reply; TTFT in seconds, median over "
        f"{params['reps']} reps x the conversations",
        "",
    ]
    turns = params["turns"]
    header = f"{'server':<8} {'convs':>5} " + " ".join(f"{f't{i + 1}':>7}" for i in range(turns))
    header += f" {'follow-up':>9} {'vs single':>9} {'cached':>7}"
    lines += [header, "-" * len(header)]
    for server, rows in report["results"].items():
        single = rows.get("1", {}).get("follow_up_ttft_s")
        for n, row in rows.items():
            ratio = f"{row['follow_up_ttft_s'] / single:.2f}x" if single else "-"
            cached = row["min_cached_ratio"]
            lines.append(
                f"{server:<8} {n:>5} "
                + " ".join(f"{t:>7.3f}" for t in row["ttft_by_turn_s"])
                + f" {row['follow_up_ttft_s']:>9.3f} {ratio:>9} "
                + (f"{cached:>7.3f}" if cached is not None else f"{'-':>7}")
            )
    lines.append("")
    lines.append(
        "follow-up: median TTFT of turns 2+; vs single: against the same server's one "
        "conversation; cached: lowest cached_tokens / prompt_tokens from turn 2 (as reported)"
    )
    for name, value in report["targets"].items():
        lines.append(f"target {name}: {value}")
    for server, why in report["failures"].items():
        lines.append(f"{server} broke off: {why.splitlines()[0]}")
    return "\n".join(lines)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("serve", help="TTFT of API clients, alone and interleaved")
    parser.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    parser.add_argument("--model", metavar="PATH", help="a GGUF model (default: SmolLM2)")
    parser.add_argument("--turns", type=int, default=6, help="turns per conversation")
    parser.add_argument("--facts", type=int, default=40, help="lines in each first message")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per reply")
    parser.add_argument("--ctx", type=int, default=8192, help="context of both servers")
    parser.add_argument("--reps", type=int, default=3, help="repetitions, fresh conversations")
    parser.add_argument(
        "--conversations", type=int, nargs="+", default=[1, 2, 4], help="scenarios to run"
    )
    parser.add_argument("--no-anchor", action="store_true", help="skip llama_cpp.server")
    parser.add_argument(
        "--models",
        type=int,
        choices=(1, 2),
        default=1,
        help="2: models on demand, two models in a budget of one (TTFT resident, restored, "
        "cold), beside llama_cpp.server's multi-model config",
    )
    parser.add_argument(
        "--model2",
        metavar="PATH",
        help="--models 2's second model (default: a Q8_0 copy of --model)",
    )
    parser.add_argument(
        "--logs",
        metavar="DIR",
        help="keep both servers' logs there, with requests.jsonl: each request's send time "
        "and TTFT (to explain an outlier)",
    )
    parser.add_argument(
        "--agent",
        action="store_true",
        help="an agent's tool loop instead (app/bench/agent.py): --turns rounds, 1 conversation",
    )
    parser.set_defaults(run=main)


def main(args: argparse.Namespace) -> int:
    if args.agent:
        args.conversations = [1]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop both servers on the way out
    if args.models == 2:
        report = run_models_bench(args)
        emit(report, render_models(report), args.json)
    else:
        report = run_bench(args)
        emit(report, render(report), args.json)
    return 0
