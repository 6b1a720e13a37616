"""The remote engine's wire formats and error words, against a scripted HTTP server.

A fake server is fine here: these tests pin how responses are parsed and how failures are
worded. That the engine works against real servers is tests/e2e/test_remote*.py.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from app.engine.chat_template import ChatTemplate
from app.engine.protocol import (
    CancelToken,
    ContextOverflowError,
    FinishReason,
    GenerationStats,
    LoadOptions,
    ModelInfo,
    ModelLoadError,
    RemoteOptions,
    SamplingParams,
    TokenEvent,
)
from app.engine.remote import RemoteEngine, WireMode
from app.engine.remote_http import Endpoint, RemoteError, RemoteHTTP
from app.engine.remote_tokenizers import BYTES_FINGERPRINT, ByteTokenizer
from app.engine.remote_wire import WIRE_TEMPLATE, wire_request
from app.engine.transcript import Transcript
from app.server.prompts import ChatPrompts, passthrough_variables
from app.server.replay import ReplyStore, calls_key
from app.server.schema import parse_chat
from app.toolcalls.calls import reply_calls
from app.toolcalls.syntax import syntax_for

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass
class Route:
    status: int = 200
    body: object = None
    events: list[object] | None = None  # streamed as SSE when set
    delay_s: float = 0.0  # before answering


@dataclass
class Script:
    routes: dict[tuple[str, str], Route] = field(default_factory=dict)
    requests: list[tuple[str, str, dict | None, dict]] = field(default_factory=list)


class _Handler(BaseHTTPRequestHandler):
    script: Script

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.script.requests.append((method, self.path, body, dict(self.headers)))
        route = self.script.routes.get((method, self.path), Route(404, {"detail": "Not Found"}))
        time.sleep(route.delay_s)
        if route.events is None:
            data = route.body if isinstance(route.body, bytes) else json.dumps(route.body).encode()
            self.send_response(route.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self.send_response(route.status)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        try:
            for event in route.events:
                if isinstance(event, float):
                    time.sleep(event)
                    continue
                payload = event if isinstance(event, str) else json.dumps(event)
                self.wfile.write(f": ping\n\ndata: {payload}\n\n".encode())
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_GET(self) -> None:
        self._answer("GET")

    def do_POST(self) -> None:
        self._answer("POST")


@pytest.fixture
def server() -> Iterator[tuple[str, Script]]:
    script = Script()
    handler = type("Handler", (_Handler,), {"script": script})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True  # a handler still sleeping must not hold the test up
    httpd.block_on_close = False
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", script
    finally:
        httpd.shutdown()
        httpd.server_close()


MODELS = Route(body={"data": [{"id": "big-model", "max_model_len": 2048}]})


def char_tokens(text: str) -> list[int]:
    """The fake server's tokenizer: one id per character (its code point + 1000)."""
    return [ord(c) + 1000 for c in text]


def llama_server_props() -> Route:
    return Route(
        body={
            "default_generation_settings": {"n_ctx": 1024},
            "chat_template": CHATML,
            "bos_token": "",
            "eos_token": "<|im_end|>",
            "model_path": "/models/big.gguf",
        }
    )


def load(url: str, mode: str = "auto", **remote: object) -> RemoteEngine:
    engine = RemoteEngine()
    engine.load(LoadOptions("", n_ctx=4096, remote=RemoteOptions(url, mode=mode, **remote)))
    return engine


def collect(events: Iterator) -> tuple[list[TokenEvent], GenerationStats]:
    tokens, stats = [], None
    for event in events:
        if isinstance(event, GenerationStats):
            stats = event
        else:
            tokens.append(event)
    return tokens, stats


# -- chat mode: bytes and the wire template ---------------------------------------------------


def test_byte_tokenizer_keeps_markers_apart_from_typed_text() -> None:
    tok = ByteTokenizer()
    assert tok.tokenize("<|stoke:user|>hé", special=True)[0] == 257
    typed = tok.tokenize("<|stoke:user|>", special=False)
    assert all(t < 256 for t in typed)
    assert (
        tok.detokenize(tok.tokenize("a<|stoke:end|>é<|x|>", special=True)) == "a<|stoke:end|>é<|x|>"
    )


def test_wire_transcript_gives_back_the_messages() -> None:
    template = ChatTemplate(WIRE_TEMPLATE)
    transcript = Transcript(template, ByteTokenizer(), BYTES_FINGERPRINT)
    transcript.add_message("system", "Be brief.")
    transcript.add_message("user", "Hi <|stoke:end|> there")
    first = transcript.prompt()
    transcript.add_reply("Hello!", list(b"Hello!"), BYTES_FINGERPRINT)
    transcript.add_message("user", "Again")
    second = transcript.prompt()
    assert second[: len(first) + 6] == [*first, *b"Hello!"]
    assert wire_request(second).messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi <|stoke:end|> there"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Again"},
    ]


def test_chat_mode_sends_messages_and_reports_the_servers_numbers(server) -> None:
    url, script = server
    script.routes[("GET", "/v1/models")] = MODELS
    script.routes[("POST", "/v1/chat/completions")] = Route(
        events=[
            {"choices": [{"delta": {"role": "assistant", "content": ""}}]},
            {"choices": [{"delta": {"content": "Bon"}}]},
            {"choices": [{"delta": {"content": "jour"}, "finish_reason": "stop"}]},
            {
                "choices": [],
                "usage": {"prompt_tokens": 30, "prompt_tokens_details": {"cached_tokens": 20}},
            },
            "[DONE]",
        ]
    )
    engine = load(url)  # no tokenizer anywhere: chat mode
    assert engine.mode == WireMode.CHAT and engine.info.fingerprint == BYTES_FINGERPRINT
    prompt = ByteTokenizer().tokenize(
        "<|stoke:user|>Hi<|stoke:end|><|stoke:assistant|>", special=True
    )
    tokens, stats = collect(engine.generate(prompt, SamplingParams.greedy(), 16))
    assert "".join(t.text for t in tokens) == "Bonjour"
    assert bytes(t.token_id for t in tokens) == b"Bonjour"
    assert (stats.prompt_tokens, stats.reused_tokens, stats.prefilled_tokens) == (30, 20, 10)
    assert stats.generated_tokens == 2  # streamed pieces, not bytes
    assert stats.finish_reason == FinishReason.STOP
    body = script.requests[-1][2]
    assert body["messages"] == [{"role": "user", "content": "Hi"}]
    assert body["model"] == "big-model" and body["stream"] is True
    assert "min_p" not in body  # a chat-only server may not know it


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather <|stoke:end|> now",  # a marker's spelling stays text
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def wire_prompt(body: dict, replies: ReplyStore | None = None) -> list[int]:
    """The chat-mode prompt the API server builds for an OpenAI request body."""
    chat = parse_chat({"model": "m", **body})
    template = ChatTemplate(WIRE_TEMPLATE, variables=passthrough_variables(chat))
    info = ModelInfo(
        *("http://x", "m", BYTES_FINGERPRINT, "remote", 4096, 4096, 263, WIRE_TEMPLATE),
        *("", "", False, None, (), "remote", 0),
    )
    return ChatPrompts(replies or ReplyStore()).build(
        chat.messages, template, info, ByteTokenizer()
    )


def test_wire_request_carries_tools_results_and_earlier_calls() -> None:
    prompt = wire_prompt(
        {
            "messages": [
                {"role": "user", "content": "Paris and Rome?"},
                {
                    "role": "assistant",
                    "content": "Checking.",
                    "tool_calls": [
                        {"id": f"c{i}", "function": {"name": "get_weather", "arguments": a}}
                        for i, a in enumerate(('{"city":"Paris"}', '{ "city": "Rome" }'))
                    ],
                },
                {"role": "tool", "tool_call_id": "c0<|stoke:end|>", "content": "Sunny"},
                {"role": "tool", "content": "Rain"},  # no id: it gets its call's
            ],
            "tools": [WEATHER],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "parallel_tool_calls": False,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": True},
            },
        }
    )
    request = wire_request(prompt)
    assert request.fields == {
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "parallel_tool_calls": False,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "response", "schema": {"type": "object"}, "strict": True},
        },
    }
    user, assistant, sunny, rain = request.messages
    assert user == {"role": "user", "content": "Paris and Rome?"}
    assert assistant["content"] == "Checking."
    assert [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in assistant["tool_calls"]
    ] == [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]
    ids = [c["id"] for c in assistant["tool_calls"]]
    assert sunny == {"role": "tool", "content": "Sunny", "tool_call_id": "c0<|stoke:end|>"}
    assert rain["tool_call_id"] == ids[1] and ids[0] == "c0<|stoke:end|>"
    plain = wire_request(wire_prompt({"messages": [{"role": "user", "content": "Hi"}]}))
    assert plain.fields == {} and plain.messages == [{"role": "user", "content": "Hi"}]


def test_chat_mode_passes_tools_through_and_keeps_the_calls_it_gets(server) -> None:
    url, script = server
    script.routes[("GET", "/v1/models")] = MODELS

    def call(index: int, **function: str) -> dict:
        return {"choices": [{"delta": {"tool_calls": [{"index": index, "function": function}]}}]}

    script.routes[("POST", "/v1/chat/completions")] = Route(
        events=[
            {"choices": [{"delta": {"role": "assistant", "content": "Let me look."}}]},
            {
                "choices": [
                    {
                        "delta": {
                            "tool_calls": [
                                {
                                    "index": 0,
                                    "id": "r0",
                                    "type": "function",
                                    "function": {"name": "get_", "arguments": ""},
                                }
                            ]
                        }
                    }
                ]
            },
            call(0, name="weather", arguments='{"city": '),
            call(1, name="get_weather", arguments='{"city":"Rome"}'),
            call(0, arguments='"Paris"}'),
            {"choices": [{"delta": {}, "finish_reason": "tool_calls"}]},
            "[DONE]",
        ]
    )
    engine = load(url, "chat")
    body = {
        "messages": [{"role": "user", "content": "Weather?"}],
        "tools": [WEATHER],
        "tool_choice": "required",
    }
    tokens, stats = collect(engine.generate(wire_prompt(body), SamplingParams.greedy(), 64))
    sent = script.requests[-1][2]
    assert sent["tools"] == [WEATHER] and sent["tool_choice"] == "required"
    assert sent["parallel_tool_calls"] is True and "response_format" not in sent
    assert sent["messages"] == [{"role": "user", "content": "Weather?"}]
    text = "".join(t.text for t in tokens)
    assert bytes(t.token_id for t in tokens).decode() == text
    assert stats.finish_reason == FinishReason.STOP
    # the API server reads the calls from the reply as from any model's
    chat = parse_chat({"model": "m", **body})
    content, calls = reply_calls(chat.tools, syntax_for(WIRE_TEMPLATE), text)
    assert content == "Let me look."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}),
        ("get_weather", {"city": "Rome"}),
    ]
    # and the next turn sends them back as calls, answered by the results that follow
    replies = ReplyStore()
    replies.put(
        text,
        [t.token_id for t in tokens],
        BYTES_FINGERPRINT,
        content=content,
        calls=calls_key(content, [c.canonical() for c in calls]),
    )
    follow = {
        **body,
        "messages": [
            *body["messages"],
            {"role": "assistant", "content": content, "tool_calls": [c.openai() for c in calls]},
            *({"role": "tool", "tool_call_id": c.id, "content": "Sunny"} for c in calls),
        ],
    }
    prompt = wire_prompt(follow, replies)
    assert text in ByteTokenizer().detokenize(prompt)  # the reply as the remote wrote it
    again = wire_request(prompt).messages
    assert again[1]["content"] == "Let me look."
    assert [c["id"] for c in again[1]["tool_calls"]] == [c.id for c in calls]
    assert [c["function"]["arguments"] for c in again[1]["tool_calls"]] == [
        '{"city": "Paris"}',
        '{"city": "Rome"}',
    ]


# -- token modes ------------------------------------------------------------------------------


def test_llama_server_mode_sends_tokens_and_reads_cache_n(server) -> None:
    url, script = server
    script.routes[("GET", "/v1/models")] = MODELS
    script.routes[("GET", "/props")] = llama_server_props()
    script.routes[("POST", "/tokenize")] = Route(body={"tokens": []})
    script.routes[("POST", "/completion")] = Route(
        events=[
            {"content": "O", "tokens": [79], "stop": False},
            {"content": "k", "tokens": [107], "stop": False},
            {
                "content": "",
                "tokens": [],
                "stop": True,
                "stop_type": "eos",
                "tokens_cached": 41,
                "timings": {"cache_n": 40, "prompt_n": 2, "predicted_n": 2},
            },
        ]
    )
    engine = load(url)
    assert engine.mode == WireMode.LLAMA_SERVER
    assert engine.info.n_ctx == 1024  # the server's slot context, below the asked 4096
    assert engine.info.chat_template == CHATML
    tokens, stats = collect(engine.generate([5] * 42, SamplingParams.greedy(), 8))
    assert [t.token_id for t in tokens] == [79, 107]
    assert (stats.prompt_tokens, stats.reused_tokens, stats.prefilled_tokens) == (42, 40, 2)
    assert stats.finish_reason == FinishReason.STOP
    body = script.requests[-1][2]
    assert body["prompt"] == [5] * 42 and body["n_predict"] == 8
    assert body["return_tokens"] and body["cache_prompt"] and body["repeat_penalty"] == 1.0
    assert body["top_k"] == 0 and body["min_p"] == 0.0
    assert engine.resident_tokens("default") == [5] * 42 + [79, 107]


def test_tokens_mode_keeps_sampled_ids_and_drops_the_stop_token(server) -> None:
    url, script = server
    script.routes[("GET", "/v1/models")] = MODELS
    script.routes[("GET", "/props")] = Route(body={"chat_template": CHATML, "eos_token": "E"})
    script.routes[("POST", "/tokenize")] = Route(body={"tokens": [7]})  # "E" and BOS both 7
    engine = load(url, "tokens")
    assert engine.info.eog_ids == (7,) and engine.info.add_bos
    script.routes[("POST", "/v1/completions")] = Route(
        events=[
            {"choices": [{"text": "", "token_ids": []}], "prompt_token_ids": [1, 2, 3]},
            {"choices": [{"text": "ab", "token_ids": [11, 12]}]},
            {"choices": [{"text": "", "token_ids": [7], "finish_reason": "stop"}]},
            {
                "choices": [],
                "usage": {"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 2}},
            },
            "[DONE]",
        ]
    )
    tokens, stats = collect(engine.generate([1, 2, 3], SamplingParams(temperature=0.5), 8))
    assert [t.token_id for t in tokens] == [11, 12]
    assert "".join(t.text for t in tokens) == "ab"
    assert (stats.reused_tokens, stats.generated_tokens) == (2, 2)
    body = script.requests[-1][2]
    assert body["prompt"] == [1, 2, 3] and body["return_token_ids"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["min_p"] == 0.05 and body["top_k"] == 0  # Stoke's meaning, not the server's


def test_auto_picks_text_mode_where_token_prompts_are_refused(server) -> None:
    url, script = server
    script.routes[("GET", "/v1/models")] = MODELS
    script.routes[("GET", "/props")] = Route(body={"chat_template": CHATML})
    script.routes[("POST", "/tokenize")] = Route(body={"tokens": []})
    script.routes[("POST", "/v1/completions")] = Route(422, {"detail": [{"msg": "not a string"}]})
    assert load(url).mode == WireMode.TEXT


def test_token_modes_without_a_tokenizer_say_how_to_get_one(server) -> None:
    url, script = server
    script.routes[("GET", "/v1/models")] = MODELS
    with pytest.raises(ModelLoadError, match="local GGUF of the same model"):
        load(url, "tokens")


def test_prefill_is_a_zero_token_request(server) -> None:
    url, script = server
    script.routes[("GET", "/v1/models")] = MODELS
    script.routes[("GET", "/props")] = llama_server_props()
    script.routes[("POST", "/tokenize")] = Route(body={"tokens": []})
    script.routes[("POST", "/completion")] = Route(
        events=[  # llama-server samples (and sends) one token even at n_predict 0
            {"content": "Hi", "tokens": [72], "stop": False},
            {"content": "", "stop": True, "timings": {"cache_n": 10, "prompt_n": 5}},
        ]
    )
    engine = load(url)
    stats = engine.prefill([1] * 15)
    assert stats.finish_reason == FinishReason.PREFILLED
    assert (stats.reused_tokens, stats.prefilled_tokens, stats.generated_tokens) == (10, 5, 0)
    assert script.requests[-1][2]["n_predict"] == 0
    assert engine.resident_tokens("default") == [1] * 15  # the sampled token is not cached


def test_a_stream_cut_before_the_reply_ends_is_an_error_in_words(server) -> None:
    url, script = server
    script.routes[("GET", "/v1/models")] = MODELS
    script.routes[("GET", "/props")] = llama_server_props()
    script.routes[("POST", "/tokenize")] = Route(body={"tokens": []})
    script.routes[("POST", "/completion")] = Route(
        events=[{"content": "O", "tokens": [79], "stop": False}]  # then the server is gone
    )
    engine = load(url)
    received = []
    with pytest.raises(RemoteError, match="closed the stream before the reply ended"):
        for event in engine.generate([5] * 4, SamplingParams.greedy(), 8):
            received.append(event)
    assert [e.token_id for e in received] == [79]
    assert engine.resident_tokens("default") == []


# -- errors in words --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "body", "words"),
    [
        (401, {"error": {"message": "Invalid API Key"}}, "refused the API key"),
        (404, {"error": {"message": "The model `x` does not exist."}}, "does not serve that model"),
        (404, {"detail": "Not Found"}, "has no /v1/completions"),
        (500, {"error": {"message": "boom"}}, r"refused /v1/completions \(500: boom\)"),
    ],
)
def test_error_statuses_become_sentences(server, status, body, words) -> None:
    url, script = server
    script.routes[("POST", "/v1/completions")] = Route(status, body)
    http = RemoteHTTP(Endpoint.parse(url))
    with pytest.raises(RemoteError, match=words) as caught:
        http.post("/v1/completions", {})
    assert caught.value.status == status


@pytest.mark.parametrize(
    ("body", "numbers"),
    [
        (
            {"error": {"message": "exceeds", "n_prompt_tokens": 5000, "n_ctx": 4096}},
            (5000, 4096),
        ),
        (
            {"error": {"message": "Requested tokens (3000) exceed context window of 2048"}},
            (3000, 2048),
        ),
        (
            {
                "error": {
                    "message": "This model's maximum context length is 2048 tokens. However, "
                    "you requested 3000 tokens (2990 in the messages, 10 in the completion)."
                }
            },
            (3000, 2048),
        ),
    ],
)
def test_context_overflow_keeps_the_numbers(server, body, numbers) -> None:
    url, script = server
    script.routes[("POST", "/v1/completions")] = Route(400, body)
    with pytest.raises(ContextOverflowError) as caught:
        RemoteHTTP(Endpoint.parse(url)).post("/v1/completions", {})
    assert (caught.value.prompt_tokens, caught.value.n_ctx) == numbers


def test_an_error_inside_a_stream_is_worded_too(server) -> None:
    url, script = server
    script.routes[("POST", "/s")] = Route(
        events=[{"error": {"code": 400, "message": "Requested tokens (9) exceed context of 8"}}]
    )
    with pytest.raises(ContextOverflowError):
        list(RemoteHTTP(Endpoint.parse(url)).stream("/s", {}))


def test_not_json_down_and_silent_servers(server) -> None:
    url, script = server
    script.routes[("GET", "/v1/models")] = Route(body=b"<html>hello</html>")
    with pytest.raises(RemoteError, match="not JSON"):
        RemoteHTTP(Endpoint.parse(url)).get("/v1/models")
    script.routes[("GET", "/slow")] = Route(body={}, delay_s=1.0)
    with pytest.raises(RemoteError, match=r"did not answer within 0.2 s"):
        RemoteHTTP(Endpoint.parse(url, timeout_s=0.2)).get("/slow")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"  # bound, not listening
        with pytest.raises(RemoteError, match="nothing is listening"):
            RemoteHTTP(Endpoint.parse(dead)).get("/v1/models")


def test_bad_urls_and_unknown_models_are_refused_in_words(server) -> None:
    url, script = server
    with pytest.raises(RemoteError, match="not a server address"):
        Endpoint.parse("localhost:8080")
    assert Endpoint.parse(url + "/v1/").url == url
    script.routes[("GET", "/v1/models")] = MODELS
    with pytest.raises(ModelLoadError, match="serves: big-model"):
        load(url, model="small-model")
    with pytest.raises(ModelLoadError, match="Unknown remote mode"):
        load(url, mode="telepathy")


def test_cancel_lands_while_the_server_is_silent(server) -> None:
    url, script = server
    script.routes[("GET", "/v1/models")] = MODELS
    script.routes[("POST", "/v1/chat/completions")] = Route(
        events=[{"choices": [{"delta": {"content": "a"}}]}, 5.0, "[DONE]"]
    )
    engine = load(url, "chat")
    cancel = CancelToken()
    events = engine.generate([257, 104, 259, 258], SamplingParams.greedy(), 8, cancel=cancel)
    first = next(events)
    assert first.text == "a"
    started = time.monotonic()
    threading.Timer(0.2, cancel.cancel).start()
    _, stats = collect(events)
    assert time.monotonic() - started < 2.0
    assert stats.finish_reason == FinishReason.CANCELLED and stats.generated_tokens == 1
