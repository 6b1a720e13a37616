"""A tool turn run as the window runs one, in a child process for a test to kill -9:
`python -m tests.gui.killed_tools_turn MODEL CONVERSATION MARKER ROUNDS`.

It is the window's turn without Qt: the session on its own engine, the tool loop with an
McpRunner over a pool of STOKE_HOME's mcp.json, rounds before ROUNDS forced to call `pid`.
The first call is allowed; at the second, where the window would show the approval prompt,
it writes MARKER and waits forever: whoever kills it on seeing MARKER kills a turn that has
stored its first result and its second reply's call, as a person's kill -9 of the app would.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from app.conversations import ConversationStore
from app.engine.host import EngineClient
from app.engine.protocol import LoadOptions
from app.mcp import config
from app.mcp.pool import Pool
from app.session import ChatSession
from app.tool_loop import CallRequest, Decision, McpRunner, ToolLoop

QUESTION = "Find the server's process id, five times."


async def _turn(model: str, conversation_id: str, marker: Path, rounds: int) -> None:
    asked: list[CallRequest] = []

    async def ask(request: CallRequest) -> Decision:
        asked.append(request)
        if len(asked) > 1:  # the second prompt: the app is killed while it is open
            marker.write_text(request.call.id)
            await asyncio.Event().wait()
        return Decision(allow=True)

    with ConversationStore.open() as store:
        engine = EngineClient(LoadOptions(model, n_ctx=4096))
        await engine.start()
        async with Pool(config.load().servers) as pool:
            loop = ToolLoop(
                ChatSession(store, engine),
                McpRunner(pool, ask),
                choice=lambda number: "pid" if number < rounds else "none",
            )
            await loop.send(conversation_id, QUESTION)


if __name__ == "__main__":
    asyncio.run(_turn(sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])))
