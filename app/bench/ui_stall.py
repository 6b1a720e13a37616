"""`stoke bench ui`: the longest stall of the window's event loop while a reply streams, and
while an attached file is read and prefilled.

The real window (offscreen) and the real engine stream a long reply; a 1 ms Qt timer records
the gap between its ticks. A gap is time the UI thread could not answer the user. The target
is a longest stall under 50 ms during a 500-token reply, and during the attachment of a
3,000-token file (read off the UI thread, prefilled in the background: app/bench/attach.py).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from app.bench.output import emit
from app.engine.llamacpp import verdict_file

TARGET_MS = 50.0
PROMPT = "Write a long story about a lighthouse keeper, with many details, in ten chapters."


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("ui", help="longest UI stall while a reply streams")
    parser.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    parser.add_argument("--tokens", type=int, default=500, help="reply length in tokens")
    parser.add_argument("--reps", type=int, default=3, help="replies (median of their maxima)")
    parser.add_argument(
        "--attach-tokens", type=int, default=3000, help="size of the attached file in tokens"
    )
    parser.set_defaults(run=main)


async def measure(tokens: int, reps: int, attach_tokens: int = 3000) -> dict[str, Any]:
    from PySide6.QtCore import QTimer

    from app.bench.attach import attachment_stall, write_document
    from app.engine.protocol import LoadOptions
    from app.models.default import default_model_path
    from app.ui.app import open_window, shutdown

    window, session = await open_window(LoadOptions(str(default_model_path())), None, "light")
    await session.engine.ready()
    window.resize(1180, 780)
    gaps: list[float] = []
    last = [time.perf_counter()]

    def tick() -> None:
        now = time.perf_counter()
        gaps.append(now - last[0])
        last[0] = now

    timer = QTimer()
    timer.setInterval(1)
    timer.timeout.connect(tick)
    maxima, generated, replies = [], [], []
    try:
        for rep in range(reps):
            conversation = session.store.create_conversation(
                sampling={"temperature": 0.8, "seed": rep, "max_tokens": tokens}
            )
            window.sidebar.refresh()
            window.open_conversation(conversation.id)
            await window.prewarm.idle()
            gaps.clear()
            last[0] = time.perf_counter()
            timer.start()
            result = await window.send_message(PROMPT)
            timer.stop()
            maxima.append(max(gaps) * 1000)
            replies.append(sorted(gaps)[int(len(gaps) * 0.99)] * 1000)
            generated.append(result.stats.generated_tokens if result and result.stats else 0)
        attach_maxima, attach_held = [], []
        with tempfile.TemporaryDirectory(prefix="stoke-bench-ui-files-") as folder:
            tokenizer = session.engine.local_tokenizer()
            for rep in range(reps):
                document = write_document(Path(folder), tokenizer, attach_tokens, f"ui-{rep}")
                longest_ms, held = await attachment_stall(window, document)
                attach_maxima.append(longest_ms)
                attach_held.append(held)
    finally:
        window.close()
        await shutdown(window, session)
    longest = statistics.median(maxima)
    attached = statistics.median(attach_maxima)
    return {
        "benchmark": "ui_stall",
        "tokens_requested": tokens,
        "tokens_generated": generated,
        "longest_stall_ms": round(longest, 1),
        "longest_stall_ms_each": [round(m, 1) for m in maxima],
        "p99_gap_ms": round(statistics.median(replies), 1),
        "attach_tokens_prefilled": attach_held,
        "attach_longest_stall_ms": round(attached, 1),
        "attach_longest_stall_ms_each": [round(m, 1) for m in attach_maxima],
        "target_ms": TARGET_MS,
        "pass": longest < TARGET_MS and attached < TARGET_MS,
    }


def main(args: argparse.Namespace) -> int:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    import qasync
    from PySide6.QtWidgets import QApplication

    with tempfile.TemporaryDirectory(prefix="stoke-bench-ui-") as home:
        verdict_file.carry(Path(home))
        os.environ["STOKE_HOME"] = home
        app = QApplication.instance() or QApplication([])
        app.setQuitOnLastWindowClosed(False)
        loop = qasync.QEventLoop(app)
        asyncio.set_event_loop(loop)
        with loop:
            report = loop.run_until_complete(measure(args.tokens, args.reps, args.attach_tokens))
    summary = (
        f"ui stall while streaming {args.tokens}-token replies (median of {args.reps}): "
        f"longest {report['longest_stall_ms']} ms (each {report['longest_stall_ms_each']}), "
        f"p99 gap {report['p99_gap_ms']} ms; while a {args.attach_tokens:,}-token file is "
        f"attached and prefilled: longest {report['attach_longest_stall_ms']} ms "
        f"(each {report['attach_longest_stall_ms_each']}); target < {TARGET_MS:.0f} ms: "
        f"{'PASS' if report['pass'] else 'FAIL'}"
    )
    emit(report, summary, args.json)
    return 0 if report["pass"] else 1
