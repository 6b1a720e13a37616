"""The tool-loop tests' runner: real tools that are Python functions, and a tool loop run in a
child process (`python -m tests.e2e.python_tools CONVERSATION MARKER`) for a test to kill.

The child runs the loop of FORCED rounds on the default model in the STOKE_HOME it is given;
its second call writes MARKER and then waits forever, so whoever kills it on seeing MARKER
kills a loop that has stored its first result and its second reply's calls, mid-way.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from app.conversations import ConversationStore
from app.engine.host import EngineClient
from app.engine.protocol import LoadOptions
from app.models.default import default_model_path
from app.session import ChatSession
from app.tool_loop import ToolLoop, ToolOutcome
from app.toolcalls.tools import ToolCall, ToolSpec

ROUNDS = 5  # the model answers in the fifth round: calls are forced before it
N_CTX = 4096
QUESTION = "What is the weather in Paris, Oslo and Rome today?"
SAMPLING = {"temperature": 0.0, "max_tokens": 64}
WEATHER = ToolSpec(
    "weather",
    "Today's weather in a city.",
    {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo", "Rome"]}},
        "required": ["city"],
    },
)
CLOCK = ToolSpec("clock", "The time now.", {"type": "object", "properties": {}})
FORECASTS = {"Paris": "18 C and sunny", "Oslo": "3 C and snowing", "Rome": "24 C and clear"}


def forced(number: int) -> str:
    """Each round before the last must call a tool (the small model would not by itself);
    the last answers in words."""
    return "required" if number < ROUNDS else "none"


def weather(city: str) -> str:
    return f"{city}: {FORECASTS[city]}"


@dataclass(frozen=True)
class PythonTool:
    spec: ToolSpec
    function: Callable[..., str | Awaitable[str]]


class PythonTools:
    """A ToolRunner of Python functions: a call's JSON arguments are the function's keyword
    arguments, and what it returns is the result the model reads. A tool named in `denied` is
    not run, and the model reads the reason (a person who said no)."""

    def __init__(self, *tools: PythonTool, denied: Mapping[str, str] | None = None) -> None:
        self.tools = {tool.spec.name: tool for tool in tools}
        self.denied = dict(denied or {})
        self.calls: list[ToolCall] = []

    async def specs(self) -> Sequence[ToolSpec]:
        return [tool.spec for tool in self.tools.values()]

    async def run(self, call: ToolCall) -> ToolOutcome:
        self.calls.append(call)
        if call.name in self.denied:
            return ToolOutcome("denied", self.denied[call.name])
        result = self.tools[call.name].function(**json.loads(call.arguments))
        if inspect.isawaitable(result):
            result = await result
        return ToolOutcome("done", result)


async def _killable_loop(conversation_id: str, marker: Path) -> None:
    async def weather_then_wait(city: str) -> str:
        if runner.calls[1:]:  # the second call: say so, and never answer
            marker.write_text(city)
            await asyncio.Event().wait()
        return weather(city)

    runner = PythonTools(PythonTool(WEATHER, weather_then_wait))
    with ConversationStore.open() as store:
        engine = EngineClient(LoadOptions(str(default_model_path()), n_ctx=N_CTX))
        await engine.start()
        try:
            loop = ToolLoop(ChatSession(store, engine), runner, choice=forced)
            await loop.send(conversation_id, QUESTION)
        finally:
            await engine.close()


if __name__ == "__main__":
    asyncio.run(_killable_loop(sys.argv[1], Path(sys.argv[2])))
