"""Tool calls through each family's real chat template (tests/fixtures/chat_templates):
tools reach the prompt, a call and its result render, and the family's syntax parses back
into the calls it was written from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.engine.chat_template import ChatTemplate
from app.engine.protocol import ModelInfo
from app.server.prompts import ChatPrompts, with_tools
from app.server.replay import ReplyStore
from app.server.schema import parse_chat
from app.server.tool_replies import ToolStream
from app.server.tool_templates import FAMILIES, ParsedCall, renders_tools, syntax_for
from app.server.tools import ToolCall

TEMPLATES = Path(__file__).parents[1] / "fixtures" / "chat_templates"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city"}},
            "required": ["city"],
        },
    },
}
# (fixture, family, the template renders `tools` itself, a reply the model would write)
CASES = [
    (
        "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
        "hermes",
        True,
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
    ),
    (
        "Qwen-Qwen2.5-7B-Instruct.jinja",
        "hermes",
        True,
        'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
        "</tool_call>",
    ),
    (
        "Qwen-Qwen3-0.6B.jinja",
        "hermes",
        True,
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
    ),
    (
        "meta-llama-Llama-3.3-70B-Instruct.jinja",
        "llama3",
        True,
        '{"name": "get_weather", "parameters": {"city": "Oslo"}}',
    ),
    (
        "mistralai-Mistral-Nemo-Instruct-2407.jinja",
        "mistral",
        True,
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}, "id": "a1b2c3d4e"}]',
    ),
    (
        "deepseek-ai-DeepSeek-V3.1.jinja",
        "deepseek",
        False,
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Oslo"}'
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    ),
]


class CharTokenizer:
    """One id per character: the prompt's text reads straight back from its ids."""

    def tokenize(self, text: str, *, special: bool = False) -> list[int]:
        return [ord(c) for c in text]


def _text(ids: list[int]) -> str:
    return "".join(chr(i) for i in ids)


def _info() -> ModelInfo:
    return ModelInfo(
        path="m.gguf",
        name="m",
        fingerprint="fp",
        architecture="test",
        n_ctx=4096,
        n_ctx_train=4096,
        n_vocab=256,
        chat_template=None,
        bos_token="<s>",
        eos_token="</s>",
        add_bos=False,
        bos_id=None,
        eog_ids=(),
        backend="test",
        size_bytes=0,
    )


def _prompt(source: str, body: dict) -> str:
    chat = parse_chat({"model": "m", **body})
    syntax = syntax_for(source)
    messages, variables = with_tools(chat.messages, chat.tools, source, syntax)
    template = ChatTemplate(source, bos_token="<s>", eos_token="</s>", variables=variables)
    ids = ChatPrompts(ReplyStore()).build(messages, template, _info(), CharTokenizer(), syntax)
    return _text(ids)


@pytest.mark.parametrize(("fixture", "family", "native", "reply"), CASES)
def test_family_renders_tools_calls_and_results(
    fixture: str, family: str, native: bool, reply: str
) -> None:
    source = (TEMPLATES / fixture).read_text()
    assert syntax_for(source).family == family
    assert renders_tools(source) is native
    call_id = "a1b2c3d4e"  # Mistral's templates take 9 letters and digits
    body = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Oslo?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": "Sunny, 21 C"},
        ],
        "tools": [WEATHER],
    }
    prompt = _prompt(source, body)
    assert "get_weather" in prompt.split("Weather in Oslo?")[0] or family == "llama3"
    assert '"city"' in prompt  # the parameters schema reached the model
    assert "Sunny, 21 C" in prompt
    written = FAMILIES[family].render([ToolCall(call_id, "get_weather", '{"city":"Oslo"}')])
    assert written in prompt  # the call, in the model's own syntax, before its result
    assert prompt.index(written) < prompt.index("Sunny, 21 C")
    content, calls = syntax_for(source).parse(reply)
    assert calls == [ParsedCall("get_weather", '{"city": "Oslo"}')]
    assert content in ("", "Let me look.")


def test_fallback_block_for_a_template_without_tools() -> None:
    """The default model's ChatML never mentions tools: the functions go in a system block
    in the hermes syntax, after the client's own system text."""
    from app.engine.chat_template import CHATML

    prompt = _prompt(
        CHATML,
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather?"},
            ],
            "tools": [WEATHER],
        },
    )
    system = prompt.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    listed = system.split("<tools>\n")[1].split("\n</tools>")[0]
    assert json.loads(listed) == {**WEATHER["function"]}
    assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}' in system
    assert not renders_tools(CHATML)


def test_tool_choice_none_keeps_tools_out() -> None:
    from app.engine.chat_template import CHATML

    prompt = _prompt(
        CHATML,
        {
            "messages": [{"role": "user", "content": "Weather?"}],
            "tools": [WEATHER],
            "tool_choice": "none",
        },
    )
    assert "get_weather" not in prompt


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_render_parses_back(family: str) -> None:
    syntax = FAMILIES[family]
    calls = [ToolCall("a1b2c3d4e", "get_weather", '{"city": "Oslo", "days": [1, 2]}')]
    content, parsed = syntax.parse(syntax.render(calls))
    assert content == ""
    assert parsed == [ParsedCall("get_weather", '{"city": "Oslo", "days": [1, 2]}')]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_text_that_is_not_a_call_stays_content(family: str) -> None:
    syntax = FAMILIES[family]
    broken = syntax.start + '{"name": "get_weather", "arguments": {"city": '
    for text in ("The weather is fine.", broken):
        assert syntax.parse(text) == (text, [])


@pytest.mark.parametrize(("fixture", "family", "native", "reply"), CASES)
def test_stream_holds_the_calls(fixture: str, family: str, native: bool, reply: str) -> None:
    """Streamed piece by piece, no part of a call goes out as content."""
    stream = ToolStream(FAMILIES[family])
    sent = "".join(stream.feed(ch) for ch in reply)
    rest, held = stream.finish()
    assert sent + rest in ("", "Let me look.\n")
    assert FAMILIES[family].parse(held)[1] == [ParsedCall("get_weather", '{"city": "Oslo"}')]


def test_stream_passes_plain_text() -> None:
    for family in FAMILIES:
        stream = ToolStream(FAMILIES[family])
        text = "Sunny in Oslo <today>, see [1]."
        sent = "".join(stream.feed(ch) for ch in text)
        rest, held = stream.finish()
        assert (sent + rest, held) == (text, "")
