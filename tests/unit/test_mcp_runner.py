"""McpRunner: a real stdio MCP server's tools offered to a chat, each call approved (or denied,
or remembered as always allowed in mcp.json) before it runs, results cut for the model."""

from __future__ import annotations

import json

from app.mcp import config
from app.mcp.pool import Pool
from app.tool_loop import CallRequest, Decision, McpRunner
from app.toolcalls.tools import ToolCall
from tests.unit.test_mcp_pool import run, tiny


def _call(name: str, **arguments: object) -> ToolCall:
    return ToolCall(f"call_{name}", name, json.dumps(arguments))


def test_calls_are_asked_about_denied_in_words_and_always_allowed_once_said() -> None:
    config.add_server(tiny("one"))
    config.add_server(tiny("two"))
    asked: list[CallRequest] = []
    answers = [Decision(False, reason="not now"), Decision(True, always=True)]

    async def ask(request: CallRequest) -> Decision:
        asked.append(request)
        return answers.pop(0)

    async def scenario() -> None:
        async with Pool(config.load().servers) as pool:
            runner = McpRunner(pool, ask, servers=["one"], limit=50)
            names = {spec.name for spec in await runner.specs()}
            assert {"echo", "long", "wait"} <= names  # only server "one": names stay plain
            denied = await runner.run(_call("echo", text="hi"))
            assert (denied.state, denied.text) == (
                "denied",
                "The person did not allow this call: not now",
            )
            done = await runner.run(_call("echo", text="hi"))
            assert (done.state, done.text) == ("done", "hi")
            assert config.load().server("one").always_allow == ("echo",)
            again = await runner.run(_call("echo", text="again"))  # not asked a third time
            assert again.text == "again"
            cut = await runner.run(_call("long", n=500))  # asked: another tool
            assert cut.state == "done" and len(cut.shown or "") == 500
            assert cut.text.startswith("0123456789") and "450" in cut.text
            bad = await runner.run(ToolCall("call_x", "echo", "[1, 2]"))
            assert (bad.state, bad.text) == (
                "failed",
                "The arguments for “echo” were not a JSON object.",
            )
            assert (await runner.run(_call("rm", path="/"))).state == "failed"

            both = McpRunner(pool, ask)
            named = {spec.name for spec in await both.specs()}
            assert {"one__echo", "two__echo"} <= named and "echo" not in named
            assert both.route("two__echo") == ("two", "echo")

    answers.append(Decision(True))  # for `long`
    run(scenario())
    assert [(r.server, r.tool, r.arguments) for r in asked] == [
        ("one", "echo", {"text": "hi"}),
        ("one", "echo", {"text": "hi"}),
        ("one", "long", {"n": 500}),
    ]


def test_a_trusted_server_runs_without_asking() -> None:
    config.add_server(tiny("trusted"))
    config.update("trusted", trusted=True)

    async def ask(request: CallRequest) -> Decision:
        raise AssertionError(f"asked about {request.tool} of a trusted server")

    async def scenario() -> str:
        async with Pool(config.load().servers) as pool:
            runner = McpRunner(pool, ask)
            await runner.specs()
            return (await runner.run(_call("echo", text="quiet"))).text

    assert run(scenario()) == "quiet"
