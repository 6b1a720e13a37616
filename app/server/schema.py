"""OpenAI request bodies, checked and turned into typed requests; errors in OpenAI's shape.

Every check answers in words that say which field is wrong and what it should be, so a
client author can fix the call from the message alone. Fields that do not change the reply
(user, metadata, ...) are ignored, as other OpenAI-compatible servers do; sampling fields are
honoured within their ranges (penalties, logit_bias); fields whose meaning Stoke cannot honour
(n > 1, best_of > 1, suffix) are refused rather than silently dropped. Tools, tool calls and
`response_format` are read by the tool-call room (app/toolcalls/tools.py).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.engine.images import digest
from app.engine.protocol import SamplingParams
from app.engine.transcript import IMAGE_MARK, Role
from app.server.constraints import constraint_of
from app.server.errors import ApiError
from app.server.errors import invalid as _invalid
from app.toolcalls.tools import (
    ResponseFormat,
    ToolCall,
    ToolError,
    Tools,
    parse_tool_calls,
    parse_tools,
)

MAX_STOPS = 4
MAX_CHOICES = 8  # `n`: choices per request
MAX_JSON_DEPTH = 64  # a chat request needs about 5 levels
MAX_LOGIT_BIAS = 1024  # entries; each costs a little on every sampled token
# Names the server itself gives the chat template; a client's chat_template_kwargs may not.
RESERVED_TEMPLATE_VARIABLES = frozenset(
    {
        "messages",
        "add_generation_prompt",
        "bos_token",
        "eos_token",
        "raise_exception",
        "strftime_now",
    }
)
_DEFAULTS = SamplingParams()
_SURROGATE = re.compile("[\ud800-\udfff]")
_ROLES: dict[str, Role] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}


@dataclass(frozen=True)
class Message:
    role: Role
    text: str
    reasoning: str | None = None  # an assistant message's reasoning, as the client sent it
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant message's calls
    tool_call_id: str | None = None  # a tool message's: the call it answers
    # a user message's images (files' bytes), each standing at an IMAGE_MARK in `text`
    images: tuple[bytes, ...] = ()

    def key(self) -> str:
        """What the message stands for, ids of tool calls left out (clients rewrite them)."""
        calls = [c.canonical() for c in self.tool_calls]
        seen = [digest(image) for image in self.images]
        return repr((self.role, self.text, self.reasoning, calls, self.tool_call_id, seen))


@dataclass(frozen=True)
class GenerationParams:
    """What both endpoints share: sampling, length, streaming and extras."""

    model: str
    sampling: SamplingParams
    max_tokens: int | None  # None: until the model stops or the context is full
    stream: bool = False
    include_usage: bool = False
    stop: tuple[str, ...] = ()
    return_token_ids: bool = False
    # llama-server's `logit_bias` by text: each of the text's tokens gets the bias (the
    # server tokenizes it once the model is known, requests.py)
    text_bias: tuple[tuple[str, float], ...] = ()
    n: int = 1  # choices, made one after another from the same prompt (its KV reused)
    return_progress: bool = False  # llama-server's: the prompt's prefill progress streamed


@dataclass(frozen=True)
class ChatRequest:
    params: GenerationParams
    messages: tuple[Message, ...]
    template_variables: dict[str, Any] = field(default_factory=dict)
    tools: Tools = field(default_factory=Tools)
    response_format: ResponseFormat = field(default_factory=ResponseFormat)
    shaped_by: str = "response_format"  # the field that set response_format (constraints.py)


@dataclass(frozen=True)
class CompletionRequest:
    params: GenerationParams
    prompt: str | tuple[int, ...]
    response_format: ResponseFormat = field(default_factory=ResponseFormat)
    shaped_by: str = "response_format"


def check_json(body: Any) -> None:
    """Refuse what json.loads takes but nothing downstream can: nesting deeper than any
    request needs, and lone UTF-16 surrogates (`"\\ud800"` escapes without their pair), which
    no text encoding can write, in any key or string. Iterative, so depth costs no stack."""
    stack: list[tuple[Any, str, int]] = [(body, "", 1)]
    while stack:
        node, where, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise ApiError(
                400, f"The request body is nested too deeply (more than {MAX_JSON_DEPTH} levels)."
            )
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:  # paths are made only where needed: token lists are long
            if isinstance(key, str) and _SURROGATE.search(key):
                raise _lone_surrogate(where or "the request body")
            if isinstance(value, str):
                if _SURROGATE.search(value):
                    raise _lone_surrogate(_path(where, key))
            elif isinstance(value, dict | list):
                stack.append((value, _path(where, key), depth + 1))


def _path(where: str, key: str | int) -> str:
    """A field's name as the error messages write it: `messages[0].content`."""
    if isinstance(key, int):
        return f"{where}[{key}]"
    return f"{where}.{key}" if where else key


def parse_chat(body: Mapping[str, Any]) -> ChatRequest:
    """A chat request; what the tool-call room refuses (app/toolcalls/tools.py) is answered as
    the 400 naming its field, like every other field here."""
    try:
        return _chat(body)
    except ToolError as error:
        raise _invalid(error.field, error.message) from None


def _chat(body: Mapping[str, Any]) -> ChatRequest:
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise _invalid("messages", "`messages` must be a non-empty list of messages.")
    messages = tuple(_message(i, m) for i, m in enumerate(raw))
    if messages[-1].role == "assistant" and (messages[-1].tool_calls or len(messages) == 1):
        raise _invalid(
            "messages",
            "The last message is the assistant's with nothing before it to answer, or with "
            "tool calls and no results; a last assistant message of text is continued.",
        )
    for i, message in enumerate(messages):
        before = messages[i - 1] if i else None
        if message.role == "assistant" and (before is None or before.role == "assistant"):
            raise _invalid(
                f"messages[{i}].role",
                f"messages[{i}] is the assistant's with no message of the user's (or a tool "
                "result) before it to answer; the chat template cannot write that.",
            )
        if message.role == "tool" and not (
            before is not None and (before.role == "tool" or before.tool_calls)
        ):
            raise _invalid(
                f"messages[{i}].role",
                f"messages[{i}] is a tool result, but no assistant message with tool_calls "
                "comes right before it.",
            )
    tools = parse_tools(body)
    shaped_by, response_format = constraint_of(body)
    variables = body.get("chat_template_kwargs") or {}
    if not isinstance(variables, Mapping) or not all(
        isinstance(v, str | int | float | bool) for v in variables.values()
    ):
        raise _invalid("chat_template_kwargs", "`chat_template_kwargs` must map names to values.")
    reserved = sorted(RESERVED_TEMPLATE_VARIABLES.intersection(variables))
    if reserved:
        raise _invalid(
            "chat_template_kwargs",
            f"`chat_template_kwargs` may not set {', '.join(reserved)}: the server gives the "
            "chat template those itself.",
        )
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    return ChatRequest(
        _params(body, max_tokens, chat=True),
        messages,
        dict(variables),
        tools,
        response_format,
        shaped_by,
    )


def parse_completion(body: Mapping[str, Any]) -> CompletionRequest:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise _invalid("prompt", "`prompt` is empty.")
        parsed: str | tuple[int, ...] = prompt
    elif isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        parsed = tuple(prompt)
    elif isinstance(prompt, list) and len(prompt) > 1:
        raise _invalid("prompt", "Send one prompt per request (batches are not supported).")
    else:
        raise _invalid("prompt", "`prompt` must be a string or a non-empty list of token ids.")
    if body.get("echo"):
        raise _invalid("echo", "`echo` is not supported.")
    if body.get("suffix"):
        raise _invalid("suffix", "`suffix` (text to insert before) is not supported.")
    shaped_by, response_format = constraint_of(body)
    return CompletionRequest(
        _params(body, body.get("max_tokens"), chat=False), parsed, response_format, shaped_by
    )


def _message(index: int, raw: Any) -> Message:
    where = f"messages[{index}]"
    if not isinstance(raw, Mapping):
        raise _invalid(where, f"{where} must be an object with `role` and `content`.")
    role = _ROLES.get(raw.get("role"))  # type: ignore[arg-type]
    if role is None:
        raise _invalid(
            f"{where}.role",
            f"{where} has role {raw.get('role')!r}; Stoke's server takes system, developer, "
            "user, assistant and tool messages.",
        )
    calls = parse_tool_calls(where, raw.get("tool_calls")) if role == "assistant" else ()
    text, images = _content(where, raw.get("content"), allow_none=role == "assistant")
    if images and role != "user":
        raise _invalid(f"{where}.content", f"{where} has an image; images go in user messages.")
    reasoning = raw.get("reasoning_content", raw.get("reasoning"))
    if reasoning is not None and not isinstance(reasoning, str):
        raise _invalid(f"{where}.reasoning_content", f"{where}'s reasoning must be a string.")
    call_id = raw.get("tool_call_id") if role == "tool" else None
    return Message(
        role,
        text,
        reasoning if role == "assistant" else None,
        calls,
        call_id if isinstance(call_id, str) else None,
        images,
    )


def _content(where: str, content: Any, *, allow_none: bool) -> tuple[str, tuple[bytes, ...]]:
    """A message's text and its images (each standing at an IMAGE_MARK in the text)."""
    if isinstance(content, str):
        return content, ()
    if content is None and allow_none:
        return "", ()
    if isinstance(content, list):
        texts, images = [], []
        for i, part in enumerate(content):
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind == "text":  # a mark in the words would stand for no image: left out
                texts.append(str(part.get("text", "")).replace(IMAGE_MARK, ""))
            elif kind == "image_url":
                images.append(image_bytes(f"{where}.content[{i}]", part.get("image_url")))
                texts.append(IMAGE_MARK)
            else:
                raise _invalid(
                    f"{where}.content",
                    f"{where} has a part of type {kind!r}; this server takes text and "
                    "image_url parts.",
                )
        return "\n".join(texts), tuple(images)
    raise _invalid(f"{where}.content", f"{where}.content must be a string or a list of parts.")


def image_bytes(where: str, image_url: Any) -> bytes:
    """An `image_url` part's image: a data URL (base64), as OpenAI's clients send files."""
    url = image_url.get("url") if isinstance(image_url, Mapping) else image_url
    if not isinstance(url, str) or not url:
        raise _invalid(where, f"{where}.image_url needs a `url`.")
    if not url.startswith("data:"):
        raise _invalid(
            where,
            f"{where} is an image by link; this server takes images as data: URLs "
            "(data:image/png;base64,...) and fetches nothing.",
        )
    header, _, data = url.partition(",")
    if not header.endswith(";base64"):
        raise _invalid(where, f"{where}'s data URL must be base64 (data:image/png;base64,...).")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise _invalid(where, f"{where}'s data URL is not valid base64.") from None


def _params(body: Mapping[str, Any], max_tokens: Any, *, chat: bool) -> GenerationParams:
    model = body.get("model") or ""  # none: the server's default model
    if not isinstance(model, str):
        raise _invalid("model", "`model` must be one of the ids /v1/models lists, as text.")
    n = 1 if body.get("n") is None else body.get("n")
    if not _is_int(n) or not 1 <= n <= MAX_CHOICES:
        raise _invalid("n", f"`n` must be a whole number from 1 to {MAX_CHOICES}.")
    if n > 1 and body.get("stream"):
        raise _invalid("n", "Several choices (`n` > 1) are answered whole: set `stream` false.")
    if body.get("best_of") not in (None, 1):
        raise _invalid("best_of", "Only one candidate per request is made (`best_of` must be 1).")
    logprobs = _logprobs(body, chat=chat)
    if max_tokens is not None and (not _is_int(max_tokens) or max_tokens < 0):
        raise _invalid("max_tokens", "`max_tokens` must be a whole number >= 0.")
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise _invalid("stream", "`stream` must be true or false.")
    options = body.get("stream_options") or {}
    if not isinstance(options, Mapping):
        raise _invalid("stream_options", "`stream_options` must be an object.")
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise _invalid("seed", "`seed` must be a whole number.")
    by_id, by_text = _logit_bias(body.get("logit_bias"))
    sampling = SamplingParams(
        temperature=_number(body, "temperature", _DEFAULTS.temperature, 0.0, 2.0),
        top_p=_number(body, "top_p", _DEFAULTS.top_p, 0.0, 1.0),
        min_p=_number(body, "min_p", _DEFAULTS.min_p, 0.0, 1.0),
        top_k=int(_number(body, "top_k", _DEFAULTS.top_k, 0, 1 << 20)),
        seed=seed,
        presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        repeat_penalty=_number(body, "repeat_penalty", 1.0, 0.1, 2.0),
        logit_bias=by_id,
        logprobs=logprobs,
    )
    return GenerationParams(
        model=model,
        sampling=sampling,
        max_tokens=max_tokens,
        stream=stream,
        include_usage=bool(options.get("include_usage")),
        stop=_stops(body.get("stop")),
        return_token_ids=bool(body.get("return_token_ids")),
        text_bias=by_text,
        n=n,
        return_progress=bool(body.get("return_progress")),
    )


def _logprobs(body: Mapping[str, Any], *, chat: bool) -> int | None:
    """How many alternatives to report per token, or None for no logprobs: chat takes
    `logprobs: true` with `top_logprobs` 0-20, completions `logprobs` 0-5."""
    raw = body.get("logprobs")
    if chat:
        top = body.get("top_logprobs")
        if raw not in (None, True, False):
            raise _invalid("logprobs", "`logprobs` must be true or false.")
        if top is not None and (not _is_int(top) or not 0 <= top <= 20):
            raise _invalid("top_logprobs", "`top_logprobs` must be a whole number from 0 to 20.")
        if top is not None and not raw:
            raise _invalid("top_logprobs", "`top_logprobs` needs `logprobs: true`.")
        return (top or 0) if raw else None
    if raw is None or raw is False:
        return None
    if not _is_int(raw) or not 0 <= raw <= 5:
        raise _invalid("logprobs", "`logprobs` must be a whole number from 0 to 5.")
    return raw


def _stops(raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    stops = [raw] if isinstance(raw, str) else raw
    if (
        not isinstance(stops, list)
        or len(stops) > MAX_STOPS
        or not all(isinstance(s, str) and s for s in stops)
    ):
        raise _invalid("stop", f"`stop` must be a non-empty string or a list of up to {MAX_STOPS}.")
    return tuple(stops)


def _logit_bias(
    raw: Any,
) -> tuple[tuple[tuple[int, float], ...], tuple[tuple[str, float], ...]]:
    """OpenAI's `{"token id": bias}`, or llama-server's `[[id or text, bias], ...]` (and text
    keys in the object), as (by id, by text) sorted pairs; `false` as a bias bans the token
    (-100). Whether each id is in the vocabulary is checked where the model is known."""
    if raw is None:
        return (), ()
    if isinstance(raw, Mapping):
        items = list(raw.items())
    elif isinstance(raw, list) and all(isinstance(p, list) and len(p) == 2 for p in raw):
        items = [(key, bias) for key, bias in raw]
    else:
        raise _invalid(
            "logit_bias",
            "`logit_bias` must be an object of token id -> bias, or a list of [token id or "
            "text, bias] pairs.",
        )
    if len(items) > MAX_LOGIT_BIAS:
        raise _invalid("logit_bias", f"`logit_bias` may hold up to {MAX_LOGIT_BIAS:,} tokens.")
    by_id: dict[int, float] = {}
    by_text: dict[str, float] = {}
    for key, bias in items:
        if bias is False:
            bias = -100.0
        if isinstance(bias, bool) or not isinstance(bias, int | float) or not -100 <= bias <= 100:
            raise _invalid("logit_bias", "`logit_bias` values must be numbers from -100 to 100.")
        digits = isinstance(key, str) and key.isascii() and key.isdigit()
        if (_is_int(key) and key >= 0) or digits:
            by_id[int(key)] = float(bias)
        elif isinstance(key, str) and key:
            by_text[key] = float(bias)
        else:
            raise _invalid(
                "logit_bias", "`logit_bias` keys must be token ids (like 42) or non-empty text."
            )
    return tuple(sorted(by_id.items())), tuple(sorted(by_text.items()))


def _number(body: Mapping[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise _invalid(name, f"`{name}` must be a number from {lo:g} to {hi:g}.")
    return float(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _lone_surrogate(param: str) -> ApiError:
    return _invalid(
        param,
        f"`{param}` holds a lone UTF-16 surrogate (a \\ud800-\\udfff escape without its pair), "
        "which is not text; send valid Unicode.",
    )
