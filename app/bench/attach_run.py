"""One timed run of the window for `stoke bench attach` (a file) and `--image` (a picture):
attach as a drop does and wait for its prefill, type a 20-word question word by word, press
Enter and time the reply's first token from Enter; `prewarm_off` turns the attachment and
draft prefill off for the runs without it."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

QUESTION = (
    "Which nights in the keeper's log had a calm wind, and what exactly did the keeper do "
    "on those nights?"
)  # 20 words
TYPING_GAP_S = 0.12  # between words: a fast typist


@contextmanager
def prewarm_off(window: Any) -> Iterator[None]:
    """The window with its attachment and draft prefill turned off (history prefill stays)."""
    prewarm = window.prewarm

    def nothing(*_args: Any, **_kwargs: Any) -> asyncio.Task:
        return asyncio.get_running_loop().create_task(asyncio.sleep(0))

    saved = prewarm.attached, prewarm.draft_changed
    prewarm.attached = prewarm.draft_changed = nothing
    try:
        yield
    finally:
        prewarm.attached, prewarm.draft_changed = saved


async def wait_for(condition: Any, timeout_s: float = 600.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the window did not get there in time")
        await asyncio.sleep(0.01)


async def attach(window: Any, path: Path) -> None:
    """Attach `path` as a drop does and wait until it is read and its prefill is done."""
    before = len(window.draft_files.records())
    window.draft_files.drop([path])
    await wait_for(lambda: len(window.draft_files.records()) > before)
    await window.prewarm.idle()


async def timed_run(window: Any, path: Path) -> dict[str, Any]:
    """One run: attach, type the question word by word, Enter; the TTFT from Enter."""
    from PySide6.QtTest import QTest

    window.new_conversation()
    window.store.set_sampling(window.conversation_id, {"temperature": 0, "max_tokens": 4})
    await window.prewarm.idle()
    await attach(window, path)
    editor = window.composer.editor
    for word in QUESTION.split(" "):
        QTest.keyClicks(editor, word + " ")
        await asyncio.sleep(TYPING_GAP_S)
    await asyncio.sleep(TYPING_GAP_S)
    first: list[float] = []
    append = window.chat.append_reply

    def record(message_id: str, text: str) -> None:
        if not first:
            first.append(time.perf_counter())
        append(message_id, text)

    window.chat.append_reply = record
    try:
        enter = time.perf_counter()
        result = await window.send_message(window.composer.text())
    finally:
        window.chat.append_reply = append
    await window.prewarm.idle()
    stats = result.stats if result else None
    return {
        "ttft_s": round(first[0] - enter, 4) if first else None,
        "prompt_tokens": stats.prompt_tokens if stats else None,
        "reused_tokens": stats.reused_tokens if stats else None,
        "prefilled_tokens": stats.prefilled_tokens if stats else None,
    }


def enter_summary(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The runs with and without the attachment read on attach: each side's median TTFT and
    tokens prefilled after Enter, its runs, and how much faster the warm side was."""

    def median(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[mode] if r[key] is not None)

    warm, cold = median("prewarm", "ttft_s"), median("no_prewarm", "ttft_s")
    return {
        "reps": len(runs["prewarm"]),
        **{
            mode: {
                "ttft_s_median": round(median(mode, "ttft_s"), 4),
                "prefilled_after_enter_median": median(mode, "prefilled_tokens"),
                "runs": runs[mode],
            }
            for mode in ("prewarm", "no_prewarm")
        },
        "speedup": round(cold / warm, 1) if warm > 0 else None,
    }
