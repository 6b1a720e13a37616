"""`stoke bench attach`: time to first token of "attach a file, type a question, Enter",
with the attachment prefilled on drop and without, side by side in one process (`--image`:
a picture on a vision model, and a conversation with two, attach_image.py).

The real window (offscreen) and the real engine: each run opens a new conversation, attaches
a file of about `--tokens` tokens (its first line unique to the run, so no run reuses
another's KV), types a 20-word question word by word, presses Enter and times the first
token of the reply from Enter. "prewarm" runs as the app does; "no prewarm" turns the
attachment and draft prefill off, so Enter reads the whole prompt. The runs alternate, so a
change in the machine's load falls on both; the medians and their ratio are the result.
`attachment_stall` is the longest UI stall while a file is read and prefilled, which
`stoke bench ui` reports beside the streaming stall.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from app.bench.attach_run import QUESTION, attach, enter_summary, prewarm_off, timed_run
from app.bench.output import emit
from app.engine.llamacpp import verdict_file

LINE = "Night {n}: the keeper trimmed the wick, wound the clock, and logged a {wind} wind."
WINDS = ("north", "west", "salt-heavy", "calm", "gusting", "southerly")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "attach", help="TTFT of attach + question + Enter, with and without prewarm"
    )
    parser.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    parser.add_argument("--tokens", type=int, default=3000, help="the file's size in tokens")
    parser.add_argument("--reps", type=int, default=5, help="runs of each mode (median)")
    parser.add_argument(
        "--image",
        action="store_true",
        help="attach a picture instead (a vision model: --model), and time a five-turn "
        "conversation with two pictures against llama-cpp-python's multimodal handler",
    )
    parser.add_argument("--model", metavar="GGUF", help="the vision model (with --image)")
    parser.add_argument("--mmproj", metavar="GGUF", help="its projector, if not beside it")
    parser.set_defaults(run=main)


def write_document(folder: Path, tokenizer: Any, tokens: int, run: str) -> Path:
    """A Markdown log of about `tokens` tokens whose first line names the run."""
    lines = [f"# Lighthouse log {run}", ""]
    while len(tokenizer.tokenize("\n".join(lines))) < tokens:
        n = len(lines) - 2
        lines.append(LINE.format(n=n, wind=WINDS[n % len(WINDS)]))
    path = folder / f"log-{run}.md"
    path.write_text("\n".join(lines) + "\n", "utf-8")
    return path


class Gaps:
    """The gaps between ticks of a 1 ms Qt timer: time the UI thread could not answer."""

    def __init__(self) -> None:
        from PySide6.QtCore import QTimer

        self.gaps: list[float] = []
        self._last = time.perf_counter()
        self._timer = QTimer()
        self._timer.setInterval(1)
        self._timer.timeout.connect(self._tick)

    def _tick(self) -> None:
        now = time.perf_counter()
        self.gaps.append(now - self._last)
        self._last = now

    def start(self) -> None:
        self.gaps.clear()
        self._last = time.perf_counter()
        self._timer.start()

    def stop(self) -> float:
        """The longest gap since start, in ms."""
        self._timer.stop()
        return max(self.gaps, default=0.0) * 1000


async def attachment_stall(window: Any, path: Path) -> tuple[float, int]:
    """The longest UI stall (ms) while `path` is read and prefilled in a new conversation,
    and the tokens that prefill held."""
    window.new_conversation()
    await window.prewarm.idle()
    gaps = Gaps()
    gaps.start()
    await attach(window, path)
    longest = gaps.stop()
    stats = window.prewarm.last.get(window.conversation_id)
    window.draft_files.take()
    return longest, stats.prompt_tokens if stats else 0


async def measure(tokens: int, reps: int, folder: Path) -> dict[str, Any]:
    from app.engine.protocol import LoadOptions
    from app.models.default import default_model_path
    from app.ui.app import open_window, shutdown

    window, session = await open_window(LoadOptions(str(default_model_path())), None, "light")
    await session.engine.ready()
    window.resize(1180, 780)
    tokenizer = session.engine.local_tokenizer()
    runs: dict[str, list[dict[str, Any]]] = {"prewarm": [], "no_prewarm": []}
    stalls: list[float] = []
    try:
        for rep in range(reps):
            for mode in ("prewarm", "no_prewarm") if rep % 2 == 0 else ("no_prewarm", "prewarm"):
                path = write_document(folder, tokenizer, tokens, uuid.uuid4().hex[:8])
                if mode == "prewarm":
                    runs[mode].append(await timed_run(window, path))
                else:
                    with prewarm_off(window):
                        runs[mode].append(await timed_run(window, path))
            stall_file = write_document(folder, tokenizer, tokens, uuid.uuid4().hex[:8])
            stalls.append((await attachment_stall(window, stall_file))[0])
    finally:
        window.close()
        await shutdown(window, session)
    return report(tokens, runs, stalls)


def report(
    tokens: int, runs: dict[str, list[dict[str, Any]]], stalls: list[float]
) -> dict[str, Any]:
    return {
        "benchmark": "attach_ttft",
        "file_tokens": tokens,
        "question_words": len(QUESTION.split()),
        **enter_summary(runs),
        "attach_longest_stall_ms": round(statistics.median(stalls), 1),
        "attach_longest_stall_ms_each": [round(s, 1) for s in stalls],
    }


def render(result: dict[str, Any]) -> str:
    warm, cold = result["prewarm"], result["no_prewarm"]
    rows = [
        "| attach ~{:,}-token file, type {} words, Enter | TTFT (median of {}) | prefilled "
        "after Enter |".format(result["file_tokens"], result["question_words"], result["reps"]),
        "|---|---:|---:|",
        f"| prefilled on drop (Stoke) | {warm['ttft_s_median']:.3f} s | "
        f"{warm['prefilled_after_enter_median']:,.0f} tokens |",
        f"| without prewarm | {cold['ttft_s_median']:.3f} s | "
        f"{cold['prefilled_after_enter_median']:,.0f} tokens |",
        f"| ratio | {result['speedup']}x faster | |",
    ]
    return "\n".join(rows)


def main(args: argparse.Namespace) -> int:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    import qasync
    from PySide6.QtWidgets import QApplication

    if args.image and not args.model:
        print("stoke bench attach --image needs a vision model: --model VISION.gguf")
        return 2
    with tempfile.TemporaryDirectory(prefix="stoke-bench-attach-") as home:
        verdict_file.carry(Path(home))
        os.environ["STOKE_HOME"] = home
        folder = Path(home) / "files"
        folder.mkdir()
        if args.image:
            from app.bench import attach_image

            result = attach_image.measure(args.model, args.mmproj, args.reps, folder)
            return emit(result, attach_image.render(result), args.json)
        app = QApplication.instance() or QApplication([])
        app.setQuitOnLastWindowClosed(False)
        loop = qasync.QEventLoop(app)
        asyncio.set_event_loop(loop)
        with loop:
            result = loop.run_until_complete(measure(args.tokens, args.reps, folder))
    stall = (
        f"longest UI stall while a file is read and prefilled: "
        f"{result['attach_longest_stall_ms']} ms (each {result['attach_longest_stall_ms_each']})"
    )
    return emit(result, f"{render(result)}\n{stall}", args.json)
