"""The GUI harness steps background tasks only with asyncio's running loop set (qasync does
not, in the events it processes after its loop stops)."""

from __future__ import annotations

import asyncio
import contextlib

from tests.gui.harness import Harness


def test_a_background_task_never_steps_without_a_running_loop(harness: Harness) -> None:
    # A turn started by one `act` keeps stepping between the harness's runs; qasync's own
    # run_until_complete steps it once more after the loop stops, with no running loop
    # (every run, on any machine), which failed GUI tests at random.
    seen: list[asyncio.AbstractEventLoop | None] = []

    async def background() -> None:
        while True:
            seen.append(asyncio._get_running_loop())
            await asyncio.sleep(0)

    task = harness.loop.create_task(background())
    for _ in range(10):
        harness.run(asyncio.sleep(0.01))
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        harness.run(task)
    assert seen and all(loop is harness.loop for loop in seen)
