"""`stoke bench tools`: a tool loop in Stoke's own session against the same loop sent
statelessly to llama-cpp-python's OpenAI server (the anchor of `stoke bench serve`).

Both sides run the agent of app/bench/agent.py: a system prompt of about 1,500 tokens
(SYSTEM_LINES of its rules), three
tool schemas, a task, then rounds of call -> result (every round but the last must call a
tool; the last may answer), greedy, the same results word for word.

- **stoke**: the window's path. A ToolLoop (app/tool_loop) over a ChatSession on a real
  engine host and a real store, its tools Python functions: each round appends the call the
  model sampled (its exact ids) and the result, so the engine prefills only what is new.
- **anchor**: `python -m llama_cpp.server --cache True` as a real process, sent the whole
  message list each round as an agent does (its calls re-serialized, ids rewritten: agent.py),
  its prompt cache on. Its prefilled tokens are its own count, read from its verbose log
  (llama-cpp-python's prefix match: "remaining N prompt tokens to eval").

Per round: TTFT (client side: the round's prompt handed over, i.e. the previous result in,
to the first token or streamed delta) and prefilled tokens. Medians are over the follow-up
rounds (2 on) of every rep; the ratio is anchor / stoke. Prints a table and the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app.bench import agent
from app.bench.kv import machine, median
from app.bench.output import emit
from app.bench.serve import API_KEY, LOGS, anchor_server, warm_up
from app.engine.llamacpp import verdict_file
from app.tool_loop import CallProgress, RoundDone, ToolEvent, ToolLoop, ToolOutcome
from app.toolcalls.tools import ToolCall, ToolSpec

SIDES = ("stoke", "anchor")
SYSTEM_LINES = 35  # 1,476 tokens on the default model
PREFIX_HIT = re.compile(r"(\d+) prefix-match hit, remaining (\d+) prompt tokens to eval")
EVALUATED = re.compile(r"prompt eval time\s*=\s*[\d.]+ ms /\s*(\d+) tokens")
FULLY_CACHED = "full prompt already cached"


class AgentTools:
    """The agent's three tools as Python functions: each answers agent.result's text for the
    round it is called in (set by the loop's RoundDone, counted from 0 as agent.py does)."""

    def __init__(self) -> None:
        self.turn = 0

    async def specs(self) -> Sequence[ToolSpec]:
        return [
            ToolSpec(
                t["function"]["name"], t["function"]["description"], t["function"]["parameters"]
            )
            for t in agent.TOOLS
        ]

    async def run(self, call: ToolCall) -> ToolOutcome:
        return ToolOutcome("done", agent.result(call.name, self.turn))


async def stoke_loop(
    model: str, n_ctx: int, task: str, rounds: int, max_tokens: int, speculation: str = "auto"
) -> list:
    """One tool loop in Stoke's session: per round (ttft, prompt tokens, prefilled tokens).
    Every round but the last must call; a reply that made no call (cut at `max_tokens`) is
    followed by agent.CONTINUE as the agent does, so both sides send `rounds` prompts."""
    from app.conversations import ConversationStore
    from app.engine.host import EngineClient
    from app.engine.protocol import LoadOptions
    from app.session import ChatSession

    runner = AgentTools()
    rows: list[tuple[float, int, int]] = []
    asked = time.perf_counter()  # the round's prompt handed over
    first: float | None = None

    def on_token(_event: object) -> None:
        nonlocal first
        first = first or time.perf_counter()

    def on_event(event: ToolEvent) -> None:
        nonlocal asked, first
        if isinstance(event, RoundDone):
            prompt, filled = (s.prompt_tokens, s.prefilled_tokens) if (s := event.stats) else (0, 0)
            rows.append(((first or time.perf_counter()) - asked, prompt, filled))
            runner.turn, first = len(rows) - 1, None  # agent.py counts from 0
        elif isinstance(event, CallProgress) and event.outcome is not None:
            asked = time.perf_counter()

    with ConversationStore.open() as store:
        engine = EngineClient(LoadOptions(model, n_ctx=n_ctx, speculation=speculation))
        await engine.start()
        try:
            session = ChatSession(store, engine)
            conversation = store.create_conversation(
                system_prompt=agent.system_prompt(SYSTEM_LINES),
                sampling={"temperature": 0.0, "max_tokens": max_tokens},
            )
            loop = ToolLoop(
                session,
                runner,
                choice=lambda _n: "required" if len(rows) < rounds - 1 else "auto",
                on_event=on_event,
            )
            text = task
            while len(rows) < rounds:  # a reply without a call (cut short) is told to go on
                loop.max_rounds = rounds - len(rows)
                asked = time.perf_counter()
                await loop.send(conversation.id, text, on_token=on_token)
                text = agent.CONTINUE
        finally:
            await engine.close()
    return rows


def anchor_loop(url: str, log: Path, task: str, rounds: int, max_tokens: int) -> list:
    """The same loop sent statelessly to the anchor: per round (ttft, prompt, prefilled)."""
    prefilled: list[tuple[int, int]] = []
    seen = log.stat().st_size

    def on_round(prompt: int | None) -> None:
        nonlocal seen
        with log.open("rb") as f:
            f.seek(seen)
            new = f.read()
        seen += len(new)
        prefilled.append(_evaluated(new.decode("utf-8", "replace"), prompt or 0))

    system = agent.system_prompt(SYSTEM_LINES)
    run = agent.replay(url, API_KEY, task, rounds, max_tokens, on_round, system)
    return [(t[0], p, n) for t, (p, n) in zip(run["ttfts"], prefilled, strict=True)]


def _evaluated(log: str, reported: int) -> tuple[int, int]:
    """(prompt tokens, those evaluated) of the request whose log lines are `log`: after a
    prefix match, the rest; none when the whole prompt was cached; else all it evaluated.
    `reported`: the prompt tokens the server's usage gave (0: none)."""
    hits = PREFIX_HIT.findall(log)
    if hits:
        kept, rest = (int(n) for n in hits[-1])
        return kept + rest, rest
    if FULLY_CACHED in log:
        return reported, 0
    evaluated = [int(n) for n in EVALUATED.findall(log)]
    return (reported or evaluated[-1], evaluated[-1]) if evaluated else (reported, reported)


def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    from app.models.default import default_model_path

    model = args.model or str(default_model_path())
    runs: dict[str, list[list]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory(prefix="stoke-bench-tools-") as tmp:
        home = Path(tmp)
        verdict_file.carry(home / "stoke")
        os.environ["STOKE_HOME"] = str(home / "stoke")  # the session's store and settings
        with anchor_server(model, args.ctx, home, verbose=True) as url:
            warm_up(url)
            for rep in range(args.reps):
                task = f"[{rep}] Fix the failing test in m{rep}."  # new to both sides
                order = SIDES if rep % 2 == 0 else SIDES[::-1]  # who goes first alternates
                for side in order:
                    print(f"rep {rep + 1}: {side}", file=sys.stderr)
                    if side == "stoke":
                        loop = stoke_loop(
                            model, args.ctx, task, args.rounds, args.max_tokens, args.speculation
                        )
                        rows = asyncio.run(loop)
                    else:
                        log = home / LOGS["anchor"]
                        rows = anchor_loop(url, log, task, args.rounds, args.max_tokens)
                    runs[side].append(rows)
    results = {side: summarise(r) for side, r in runs.items()}
    stoke, anchor = results["stoke"], results["anchor"]
    return {
        "benchmark": "tools",
        "model": Path(model).name,
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
        "params": {
            "rounds": args.rounds,
            "reps": args.reps,
            "max_tokens": args.max_tokens,
            "n_ctx": args.ctx,
            "speculation": args.speculation,
            "system_prompt_chars": len(agent.system_prompt()),
        },
        "results": results,
        "ratios": {
            "follow_up_ttft_anchor_over_stoke": _ratio(
                anchor["follow_up_ttft_s"], stoke["follow_up_ttft_s"]
            ),
            "follow_up_prefilled_anchor_over_stoke": _ratio(
                anchor["follow_up_prefilled"], stoke["follow_up_prefilled"]
            ),
        },
    }


def summarise(runs: list[list]) -> dict[str, Any]:
    """Per round, the median over reps of TTFT, prompt and prefilled tokens; the follow-ups'
    (round 2 on) medians over every rep."""
    rounds = min(len(rows) for rows in runs)
    column = [[rows[i] for rows in runs] for i in range(rounds)]
    follow_ups = [row for rows in runs for row in rows[1:]]
    return {
        "rounds_run": [len(rows) for rows in runs],
        "ttft_by_round_s": [round(median([r[0] for r in c]), 4) for c in column],
        "prompt_by_round": [median([r[1] for r in c]) for c in column],
        "prefilled_by_round": [median([r[2] for r in c]) for c in column],
        "first_ttft_s": round(median([rows[0][0] for rows in runs]), 4),
        "follow_up_ttft_s": round(median([r[0] for r in follow_ups]), 4),
        "follow_up_prefilled": median([r[2] for r in follow_ups]),
        "all": [[[round(r[0], 4), r[1], r[2]] for r in rows] for rows in runs],
    }


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 2) if b else None


def render(report: dict[str, Any]) -> str:
    params, results = report["params"], report["results"]
    rounds = len(results["stoke"]["ttft_by_round_s"])
    lines = [
        f"stoke bench tools — {report['model']} on {report['machine']['cpu']} "
        f"({report['machine']['cores']} cores); {params['rounds']} rounds, greedy, "
        f"{params['max_tokens']} tokens a reply; median over {params['reps']} reps",
        "",
    ]
    header = f"{'side':<7} {'what':<10} " + " ".join(f"{f'r{i + 1}':>7}" for i in range(rounds))
    header += f" {'follow-up':>9}"
    lines += [header, "-" * len(header)]
    for side, row in results.items():
        ttfts = " ".join(f"{t:>7.3f}" for t in row["ttft_by_round_s"])
        lines.append(f"{side:<7} {'ttft s':<10} {ttfts} {row['follow_up_ttft_s']:>9.3f}")
        filled = " ".join(f"{n:>7g}" for n in row["prefilled_by_round"])
        lines.append(f"{side:<7} {'prefilled':<10} {filled} {row['follow_up_prefilled']:>9g}")
    lines.append("")
    lines.append("follow-up: median of rounds 2 on; prefilled: prompt tokens evaluated this round")
    for name, value in report["ratios"].items():
        lines.append(f"{name}: {value}")
    return "\n".join(lines)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "tools", help="a 10-round tool loop: Stoke's session vs llama_cpp.server, stateless"
    )
    parser.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    parser.add_argument("--model", metavar="PATH", help="a GGUF model (default: SmolLM2)")
    parser.add_argument("--rounds", type=int, default=10, help="rounds of the tool loop")
    parser.add_argument("--reps", type=int, default=2, help="repetitions, a new task each")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per reply")
    parser.add_argument("--ctx", type=int, default=8192, help="context of both sides")
    parser.add_argument(
        "--speculation",
        choices=("auto", "lookup", "off"),
        default="auto",
        help="Stoke's speculative decoding (default: auto, as the window runs)",
    )
    parser.set_defaults(run=main)


def main(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the anchor on the way out
    report = run_bench(args)
    return emit(report, render(report), args.json)
