"""`stoke bench attach --image --model VISION.gguf`: images in a conversation, timed.

Two measurements on a vision model (a GGUF with its `mmproj` beside it, or `--mmproj`):

- TTFT from Enter of "attach a picture, type a question, Enter" in the real window
  (offscreen), with the picture read by the projector and prefilled on attach, and without
  (attachment and draft prefill off, so Enter reads the picture and the question). Each run
  draws a new picture, so no run reuses another's KV; the runs alternate.
- A five-turn conversation holding two pictures (turns 1 and 3), through the session: each
  turn's prefilled tokens and TTFT, against llama-cpp-python's own multimodal chat handler
  (`Llava15ChatHandler`, mtmd-based in 0.3.x, the same projector) sent the whole history
  each turn, as an OpenAI client does: that handler clears the KV every request, so every
  turn reads every picture again. Its TTFT is the time of a one-token completion.
"""

from __future__ import annotations

import asyncio
import base64
import os
import time
import uuid
from pathlib import Path
from typing import Any

from app.bench.attach_run import QUESTION, enter_summary, prewarm_off, timed_run

SIDE_PX = 640  # the pictures' size: a projector scales each to its own input size
TURNS = (
    ("What is in this picture?", True),
    ("Describe its colours in one sentence.", False),
    ("And in this one?", True),
    ("Which of the two pictures is brighter?", False),
    ("Name one thing they share.", False),
)
MAX_TOKENS = 16


def picture(folder: Path) -> Path:
    """A PNG of noise, new each call (its hash is new, so its KV is too)."""
    from PIL import Image

    path = folder / f"picture-{uuid.uuid4().hex[:8]}.png"
    Image.frombytes("RGB", (SIDE_PX, SIDE_PX), os.urandom(SIDE_PX * SIDE_PX * 3)).save(path)
    return path


async def _window_runs(options: Any, reps: int, folder: Path) -> dict[str, list[dict[str, Any]]]:
    from app.ui.app import open_window, shutdown

    window, session = await open_window(options, None, "light")
    await session.engine.ready()
    if session.engine.info is None or session.engine.info.projector is None:
        window.close()
        await shutdown(window, session)
        raise SystemExit(f"{options.model_path} has no vision projector beside it (--mmproj).")
    window.resize(1180, 780)
    runs: dict[str, list[dict[str, Any]]] = {"prewarm": [], "no_prewarm": []}
    try:
        for rep in range(reps):
            for mode in ("prewarm", "no_prewarm") if rep % 2 == 0 else ("no_prewarm", "prewarm"):
                if mode == "prewarm":
                    runs[mode].append(await timed_run(window, picture(folder)))
                else:
                    with prewarm_off(window):
                        runs[mode].append(await timed_run(window, picture(folder)))
    finally:
        window.close()
        await shutdown(window, session)
    return runs


async def _stoke_turns(options: Any, images: list[Path]) -> list[dict[str, Any]]:
    """The five turns through the session, as the window sends them (each picture read on
    attach, before its question)."""
    from app.conversations import ConversationStore
    from app.conversations.attachments import read_attachment
    from app.engine.host import EngineClient
    from app.engine.prewarm import Prewarmer
    from app.session import ChatSession

    store = ConversationStore.open()
    session = ChatSession(store, EngineClient(options))
    await session.engine.start()
    prewarm = Prewarmer(session)
    turns: list[dict[str, Any]] = []
    try:
        cid = store.create_conversation(sampling={"temperature": 0, "max_tokens": MAX_TOKENS}).id
        pictures = iter(images)
        for question, with_image in TURNS:
            files = [read_attachment(next(pictures)).record()] if with_image else []
            if files:
                await prewarm.attached(cid, "", files)
            result = await session.send(cid, question, attachments=files)
            stats = result.stats
            turns.append(
                {
                    "question": question,
                    "image": with_image,
                    "reply": result.text,
                    "prompt_tokens": stats.prompt_tokens,
                    "prefilled_after_enter": stats.prefilled_tokens,
                    "ttft_s": round(stats.ttft_s, 4),
                }
            )
    finally:
        await session.engine.close()
        store.close()
    return turns


def _peer_turns(model: str, projector: str, images: list[Path], turns: list[dict[str, Any]]):
    """The same conversation resent whole each turn to llama-cpp-python's multimodal chat
    handler (Stoke's replies as the history), each timed as a one-token completion."""
    from app.engine.llamacpp.openmp import spin_briefly

    spin_briefly()
    import llama_cpp
    from llama_cpp.llama_chat_format import Llava15ChatHandler

    from app.engine.llamacpp.cpu_buffers import safe_defaults

    with safe_defaults():
        handler = Llava15ChatHandler(clip_model_path=projector, verbose=False)
        llm = llama_cpp.Llama(
            model, chat_handler=handler, n_ctx=4096, n_batch=512, verbose=False, seed=0
        )
    pictures = iter(images)
    messages: list[dict[str, Any]] = []
    peer: list[dict[str, Any]] = []
    try:
        for turn in turns:
            content: list[dict[str, Any]] = []
            if turn["image"]:
                data = base64.b64encode(next(pictures).read_bytes()).decode()
                url = f"data:image/png;base64,{data}"
                content.append({"type": "image_url", "image_url": {"url": url}})
            content.append({"type": "text", "text": turn["question"]})
            messages.append({"role": "user", "content": content})
            start = time.perf_counter()
            answer = llm.create_chat_completion(messages=messages, max_tokens=1, temperature=0)
            elapsed = time.perf_counter() - start
            peer.append(
                {"prefilled": answer["usage"]["prompt_tokens"], "ttft_s": round(elapsed, 4)}
            )
            messages.append({"role": "assistant", "content": turn["reply"]})
    finally:
        llm.close()
    return peer


def measure(model: str, projector: str | None, reps: int, folder: Path) -> dict[str, Any]:
    """Both measurements; the window's on a qasync loop, the conversation's on its own."""
    import qasync
    from PySide6.QtWidgets import QApplication

    from app.engine.images import find_projector
    from app.engine.protocol import LoadOptions

    projector = projector or str(find_projector(Path(model)) or "")
    if not projector:
        raise SystemExit(f"{model} has no vision projector beside it: pass --mmproj.")
    options = LoadOptions(model, n_ctx=4096, mmproj=projector)
    app = QApplication.instance() or QApplication([])
    app.setQuitOnLastWindowClosed(False)
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    with loop:
        runs = loop.run_until_complete(_window_runs(options, reps, folder))
    images = [picture(folder), picture(folder)]
    stoke = asyncio.run(_stoke_turns(options, images))
    peer = _peer_turns(model, projector, images, stoke)
    return report(model, projector, runs, stoke, peer)


def report(
    model: str,
    projector: str,
    runs: dict[str, list[dict[str, Any]]],
    stoke: list[dict[str, Any]],
    peer: list[dict[str, Any]],
) -> dict[str, Any]:
    return {
        "benchmark": "attach_image",
        "model": Path(model).name,
        "projector": Path(projector).name,
        "question_words": len(QUESTION.split()),
        **enter_summary(runs),
        "conversation": [
            {**turn, "peer_prefilled": other["prefilled"], "peer_ttft_s": other["ttft_s"]}
            for turn, other in zip(stoke, peer, strict=True)
        ],
    }


def render(result: dict[str, Any]) -> str:
    warm, cold = result["prewarm"], result["no_prewarm"]
    rows = [
        f"{result['model']} + {result['projector']}",
        "",
        "| attach a picture, type {} words, Enter | TTFT (median of {}) | prefilled after "
        "Enter |".format(result["question_words"], result["reps"]),
        "|---|---:|---:|",
        f"| read on attach (Stoke) | {warm['ttft_s_median']:.3f} s | "
        f"{warm['prefilled_after_enter_median']:,.0f} tokens |",
        f"| without prewarm | {cold['ttft_s_median']:.3f} s | "
        f"{cold['prefilled_after_enter_median']:,.0f} tokens |",
        f"| ratio | {result['speedup']}x faster | |",
        "",
        "| turn | picture | Stoke prefilled | Stoke TTFT | llama_cpp Llava15ChatHandler "
        "prefilled | its TTFT |",
        "|---:|:---:|---:|---:|---:|---:|",
    ]
    for n, turn in enumerate(result["conversation"], start=1):
        rows.append(
            f"| {n} | {'yes' if turn['image'] else ''} | {turn['prefilled_after_enter']:,} | "
            f"{turn['ttft_s']:.3f} s | {turn['peer_prefilled']:,} | {turn['peer_ttft_s']:.3f} s |"
        )
    return "\n".join(rows)
