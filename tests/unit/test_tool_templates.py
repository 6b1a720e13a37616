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
from app.toolcalls.syntax import FAMILIES, ParsedCall, renders_tools, syntax_for
from app.toolcalls.tools import ToolCall

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
    (
        "deepseek-ai-DeepSeek-V3.2.jinja",
        "deepseek-v3.2",
        True,
        '\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n'
        '<｜DSML｜parameter name="city" string="true">Oslo</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n</｜DSML｜function_calls>",
    ),
    (
        "deepseek-ai-DeepSeek-V4.jinja",
        "deepseek-v4",
        True,
        'Let me look.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n'
        '<｜DSML｜parameter name="city" string="true">Oslo</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
    ),
]
V4_GOLD = TEMPLATES / "deepseek-ai-DeepSeek-V4-Flash-encoding-test_output_1.txt"
V4_INPUT = TEMPLATES / "deepseek-ai-DeepSeek-V4-Flash-encoding-test_input_1.json"


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
    assert sent + rest in ("", "Let me look.")
    assert FAMILIES[family].parse(held)[1] == [ParsedCall("get_weather", '{"city": "Oslo"}')]


def test_dsml_families_by_template_and_by_architecture() -> None:
    """The V3.2 and V4 templates build the marker from `dsml_token`; a GGUF without a
    template of its own is told apart by its architecture (DeepSeek V4: `deepseek4`)."""
    from app.engine.chat_template import CHATML

    for fixture, family in (
        ("deepseek-ai-DeepSeek-V3.2.jinja", "deepseek-v3.2"),
        ("deepseek-ai-DeepSeek-V4.jinja", "deepseek-v4"),
    ):
        source = (TEMPLATES / fixture).read_text()
        assert FAMILIES[family].start not in source  # only its parts are
        assert syntax_for(source, "deepseek4").family == family
    assert syntax_for(CHATML, "deepseek4").family == "deepseek-v4"
    assert syntax_for(CHATML, "llama").family == "hermes"


def test_v4_calls_as_deepseeks_encoder_writes_and_reads_them() -> None:
    """DeepSeek's own gold output (encoding/tests of DeepSeek-V4-Flash): the assistant's
    call renders to the very text the encoder wrote, and reading it back gives the
    arguments its decoder gives."""
    gold = V4_GOLD.read_text()
    data = json.loads(V4_INPUT.read_text())
    call = data["messages"][2]["tool_calls"][0]["function"]
    written = FAMILIES["deepseek-v4"].render(
        [ToolCall("call_001", call["name"], call["arguments"])]
    )
    reasoning = data["messages"][2]["reasoning_content"]
    assert f"<think>{reasoning}</think>{written}<｜end▁of▁sentence｜>" in gold
    reply = gold.split("<｜Assistant｜><think>")[1].split("<｜end▁of▁sentence｜>")[0]
    _, _, content = reply.partition("</think>")
    assert FAMILIES["deepseek-v4"].parse(content) == (
        "",
        [ParsedCall("get_weather", '{"location": "Beijing", "unit": "celsius"}')],
    )
    tools_block = gold.split("<｜User｜>")[0]
    assert FAMILIES["deepseek-v4"].start in tools_block


def test_v4_template_renders_the_encoders_tools_and_results() -> None:
    """The V4 template (llama.cpp's, after DeepSeek's encoder) puts the tools in the system
    prompt exactly as the encoder's gold output does, and tool results in a user turn."""
    source = (TEMPLATES / "deepseek-ai-DeepSeek-V4.jinja").read_text()
    data = json.loads(V4_INPUT.read_text())
    template = ChatTemplate(
        source,
        bos_token="<｜begin▁of▁sentence｜>",
        variables={"tools": data["tools"], "thinking": True},
    )
    rendered = template.render(data["messages"][:2], add_generation_prompt=True)
    gold = V4_GOLD.read_text()
    assert rendered == gold[: gold.index("<｜Assistant｜>") + len("<｜Assistant｜><think>")]


@pytest.mark.parametrize(
    ("raw", "string", "value"),
    [
        ("Oslo", "true", "Oslo"),
        ('say "hi"\n', "true", 'say "hi"\n'),
        ("3", "false", 3),
        ("[1, 2]", "false", [1, 2]),
        ('{"a": true}', "false", {"a": True}),
        ("false", "false", False),
        ("not json", "false", "not json"),  # kept as the string it is
    ],
)
def test_dsml_parameter_values(raw: str, string: str, value: object) -> None:
    """string="true" values are taken as written; string="false" ones are JSON-decoded."""
    text = (
        '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n'
        f'<｜DSML｜parameter name="x" string="{string}">{raw}</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
    )
    _, (call,) = FAMILIES["deepseek-v4"].parse(text)
    assert json.loads(call.arguments) == {"x": value}


def test_dsml_fallback_instructions_show_the_syntax() -> None:
    """A V4 GGUF without a template: the system block shows the DSML calls to write."""
    block = FAMILIES["deepseek-v4"].instructions([WEATHER["function"]])
    assert "<｜DSML｜tool_calls>" in block and 'string="true|false"' in block
    assert json.dumps(WEATHER["function"], ensure_ascii=False) in block


def test_stream_passes_plain_text() -> None:
    for family in FAMILIES:
        stream = ToolStream(FAMILIES[family])
        text = "Sunny in Oslo <today>, see [1]."
        sent = "".join(stream.feed(ch) for ch in text)
        rest, held = stream.finish()
        assert (sent + rest, held) == (text, "")
