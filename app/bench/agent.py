"""`stoke bench serve --agent`: an agent's tool loop replayed statelessly, as coding agents
send it: a system prompt of about 3,200 tokens and three tool schemas, then rounds of
assistant tool call -> tool result, the whole history every request, each call sent back
re-serialized (other spacing, a rewritten id) the way agent frameworks do.

Time to first token is the request sent to the first streamed delta that carries content or
a tool call. Stoke streams a call whole once it is complete (tool_replies.py), so for it this
is the time to the finished call: the comparison is pessimistic for Stoke.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {arg: {"type": "string"}},
                "required": [arg],
            },
        },
    }
    for name, description, arg in (
        ("read_file", "Read a file of the repository.", "path"),
        ("search", "Search the repository for text.", "query"),
        ("run_tests", "Run the tests of one module.", "target"),
    )
]


CONTINUE = "Continue with the next step."  # after a reply without a call


def system_prompt(lines: int = 75) -> str:
    """Standing instructions of about 43 tokens a line on the default model: 3,196 tokens at
    the 75 lines `serve --agent` sends, 1,476 at the 35 of `stoke bench tools`."""
    rules = [
        f"Rule {i}: before changing module m{i}, read m{i}.py and its tests, keep the change "
        f"small, and run the tests of m{i} before you say it is done."
        for i in range(lines)
    ]
    return "You are a careful coding agent. Use the tools.\n" + "\n".join(rules)


def _turn(client: Any, model: str, messages: list, choice: str, max_tokens: int):
    """One streamed request: (assistant message, (ttft, whole reply), prompt tokens, cached
    tokens)."""
    started = time.perf_counter()
    first = None
    content, calls, usage = "", {}, None
    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        tools=TOOLS,
        tool_choice=choice,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        usage = chunk.usage or usage
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        if delta.content or delta.tool_calls:
            first = first or time.perf_counter()
        content += delta.content or ""
        for call in delta.tool_calls or []:
            entry = calls.setdefault(call.index, {"name": "", "arguments": ""})
            entry["name"] += (call.function.name or "") if call.function else ""
            entry["arguments"] += (call.function.arguments or "") if call.function else ""
    done = time.perf_counter()
    ttft = (first or done) - started
    details = getattr(usage, "prompt_tokens_details", None) if usage else None
    cached = getattr(details, "cached_tokens", None) if details else None
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = [
            {"id": f"agent_{i}", "type": "function", "function": dict(call)}
            for i, call in sorted(calls.items())
        ]
    return message, (ttft, done - started), usage.prompt_tokens if usage else None, cached


def result(name: str, turn: int) -> str:
    """What tool `name` answers in round `turn` (from 0): the same short text every run."""
    return f"{name} done (round {turn}): 3 matches, tests pass."


def replay(
    url: str,
    key: str,
    task: str,
    rounds: int,
    max_tokens: int,
    on_round: Callable[[int | None], None] | None = None,
    system: str | None = None,
) -> dict[str, list]:
    """One tool loop: TTFT per round (lists of one, as serve.summarise reads them), each
    round's whole reply time, and the cached share of each follow-up's prompt. `on_round`
    hears each round's prompt tokens as the server reported them, once its reply is in;
    `system` replaces the default system prompt."""
    import openai

    client = openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=600)
    model = client.models.list().data[0].id
    messages: list = [
        {"role": "system", "content": system or system_prompt()},
        {"role": "user", "content": task},
    ]
    ttfts: list[list[float]] = []
    totals: list[float] = []
    ratios: list[float] = []
    for turn in range(rounds):
        choice = "required" if turn < rounds - 1 else "auto"
        message, (ttft, total), prompt, cached = _turn(client, model, messages, choice, max_tokens)
        ttfts.append([ttft])
        totals.append(total)
        if on_round is not None:
            on_round(prompt)
        if turn and prompt and cached is not None:
            ratios.append(cached / prompt)
        for i, call in enumerate(message.get("tool_calls", [])):  # as frameworks resend them
            call["id"] = f"call_{turn}_{i}"
            args = call["function"]["arguments"]
            with contextlib.suppress(json.JSONDecodeError):
                call["function"]["arguments"] = json.dumps(json.loads(args), indent=1)
        messages.append(message)
        for call in message.get("tool_calls", []):
            answer = result(call["function"]["name"], turn)
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": answer})
        if not message.get("tool_calls"):
            messages.append({"role": "user", "content": CONTINUE})
    return {"ttfts": ttfts, "ratios": ratios, "totals": totals}
