"""The tool-call room's own words and shapes: tools from specs checked by the rules every
request's tools are (a ToolError naming the field, which the API server answers as its 400),
and the system prompt a tool block joins."""

from __future__ import annotations

import pytest

from app.engine.chat_template import CHATML
from app.server.errors import ApiError
from app.server.schema import parse_chat
from app.toolcalls.prompt import tool_prompt
from app.toolcalls.syntax import syntax_for
from app.toolcalls.tools import ToolError, ToolSpec, tools_of

CLOCK = ToolSpec("clock", "The time now.")


def test_specs_become_the_tools_a_request_would_send() -> None:
    tools = tools_of([CLOCK, ToolSpec("add", parameters={"type": "object"})], "clock")

    assert (tools.names, tools.choice, tools.name, tools.forced) == (
        ["clock", "add"],
        "function",
        "clock",
        True,
    )
    assert tools.functions[0]["function"]["description"] == "The time now."
    assert "description" not in tools.functions[1]["function"]


@pytest.mark.parametrize(
    ("specs", "choice", "field"),
    [
        ([CLOCK, ToolSpec("x" * 65)], "auto", "tools[1].function.name"),
        ([CLOCK, CLOCK], "auto", "tools"),
        ([CLOCK], "weather", "tool_choice"),
        ([], "required", "tool_choice"),
    ],
)
def test_tools_that_cannot_be_offered_name_their_field(
    specs: list[ToolSpec], choice: str, field: str
) -> None:
    with pytest.raises(ToolError) as refused:
        tools_of(specs, choice)

    assert refused.value.field == field and refused.value.message


def test_the_server_answers_the_rooms_refusal_as_its_own_400() -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": "clock"}

    with pytest.raises(ApiError) as refused:
        parse_chat(body)

    assert (refused.value.status, refused.value.param) == (400, "tools")
    assert "`tools` must be a list" in refused.value.message


def test_the_tool_block_ends_the_system_prompt_or_is_it() -> None:
    told = tool_prompt(tools_of([CLOCK]), CHATML, syntax_for(CHATML))

    assert told.variables == {} and '"name": "clock"' in told.block
    assert told.system("Be brief.") == f"Be brief.\n\n{told.block}"
    assert told.system(None) == told.system("") == told.block
    assert tool_prompt(tools_of([CLOCK], "none"), CHATML, syntax_for(CHATML)).system("Hi") == "Hi"
