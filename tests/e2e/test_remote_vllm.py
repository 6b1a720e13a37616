"""The remote engine's `tokens` mode against a server that answers as vLLM does.

vLLM and SGLang cannot run on this machine (no CUDA), so this server is scripted: a real HTTP
server on loopback whose every field follows vLLM's OpenAI server as its sources define it
(`vllm/entrypoints/openai/completion/protocol.py` and `serving.py`, read late 2026), started
as docs/remote-engines.md says (`vllm serve ... --enable-prefix-caching
--enable-prompt-tokens-details`):

- `/v1/models` is a ModelList (`object: list`, cards with `owned_by: vllm`, `max_model_len`);
  there is no `/props` or `/tokenize` (FastAPI's 404 `{"detail": "Not Found"}`);
- `/v1/completions` takes `prompt` as a list of token ids; with `return_token_ids` each
  streamed `CompletionResponseStreamChoice` carries `token_ids` (the chunk's new ids, the end
  of turn included) and the first one `prompt_token_ids`; `stop_reason` is None at the end
  of turn; the last chunk has no choices and the usage, whose
  `prompt_tokens_details.cached_tokens` is there only when some were cached, counted in
  whole KV blocks of 16 (prefix caching hashes full blocks), then `data: [DONE]`;
- `max_tokens` below 1 is refused (SamplingParams: "max_tokens must be at least 1") with
  vLLM's ErrorResponse `{"error": {"message", "type", "param", "code"}}` (so a prefill asks
  for one token, which the engine drops).

Behind it the real engine samples the real default model, so the replies are real and the
cached count is what a prefix cache really holds.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from app.conversations import ConversationStore
from app.engine.host import EngineClient
from app.engine.llamacpp.backend import LlamaCppEngine
from app.engine.protocol import (
    FinishReason,
    GenerationStats,
    LoadOptions,
    RemoteOptions,
    SamplingParams,
)
from app.session import ChatSession

pytestmark = pytest.mark.e2e

BLOCK = 16  # vLLM's default KV block size (CacheConfig.DEFAULT_BLOCK_SIZE)
MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
TURNS = ("What is the capital of France?", "And of Italy?", "Name a river in that city.")


class VllmImitation(BaseHTTPRequestHandler):
    """One request at a time into one engine, as vLLM's prefix cache sees one conversation."""

    engine: LlamaCppEngine
    lock: threading.Lock
    requests: list[dict]

    def log_message(self, *args: object) -> None:
        pass

    def _json(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path != "/v1/models":
            self._json(404, {"detail": "Not Found"})
            return
        card = {
            "id": MODEL_ID,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "vllm",
            "root": MODEL_ID,
            "parent": None,
            "max_model_len": 4096,
            "permission": [],
        }
        self._json(200, {"object": "list", "data": [card]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v1/completions":
            self._json(404, {"detail": "Not Found"})
            return
        self.requests.append(body)
        if body.get("max_tokens", 16) < 1:
            message = f"max_tokens must be at least 1, got {body['max_tokens']}."
            error = {"message": message, "type": "BadRequestError", "param": None, "code": 400}
            self._json(400, {"error": error})
            return
        with self.lock:
            if body.get("stream"):
                self._stream(body)
            else:
                self._whole(body)

    def _sampling(self, body: dict) -> SamplingParams:
        """vLLM's completion defaults where the request says nothing (_DEFAULT_SAMPLING_PARAMS)."""
        return SamplingParams(
            temperature=body.get("temperature", 1.0),
            top_p=body.get("top_p", 1.0),
            min_p=body.get("min_p", 0.0),
            top_k=body.get("top_k", 0),
            seed=body.get("seed"),
        )

    def _whole(self, body: dict) -> None:
        """A CompletionResponse (stream false): Stoke's `auto` probe asks one of these."""
        prompt = body["prompt"]
        events = list(self.engine.generate(prompt, self._sampling(body), body["max_tokens"]))
        ids = [e.token_id for e in events if not isinstance(e, GenerationStats)]
        choice = {
            "index": 0,
            "text": "".join(e.text for e in events if not isinstance(e, GenerationStats)),
            "logprobs": None,
            "finish_reason": "length",
            "stop_reason": None,
            "token_ids": ids if body.get("return_token_ids") else None,
            "prompt_logprobs": None,
            "prompt_token_ids": prompt if body.get("return_token_ids") else None,
        }
        usage = {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + len(ids)}
        self._json(
            200,
            {
                "id": "cmpl-0",
                "object": "text_completion",
                "created": 1,
                "model": MODEL_ID,
                "choices": [choice],
                "usage": {**usage, "completion_tokens": len(ids), "prompt_tokens_details": None},
            },
        )

    def _stream(self, body: dict) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        prompt = body["prompt"]
        head = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": MODEL_ID}
        first, stats = True, None
        for event in self.engine.generate(prompt, self._sampling(body), body["max_tokens"]):
            if isinstance(event, GenerationStats):
                stats = event
                break
            choice = {
                "index": 0,
                "text": event.text,
                "logprobs": None,
                "finish_reason": None,
                "stop_reason": None,
                "prompt_token_ids": prompt if first else None,
                "token_ids": [event.token_id],
            }
            first = False
            self._send({**head, "choices": [choice], "usage": None})
        eog = self.engine.info.eog_ids
        ended = stats.finish_reason == FinishReason.STOP
        last = {
            "index": 0,
            "text": "",
            "logprobs": None,
            "finish_reason": "stop" if ended else "length",
            "stop_reason": None,
            "prompt_token_ids": prompt if first else None,
            "token_ids": [eog[0]] if ended else [],  # vLLM hands out the end of turn's id
        }
        self._send({**head, "choices": [last], "usage": None})
        usage = {
            "prompt_tokens": len(prompt),
            "total_tokens": len(prompt) + stats.generated_tokens,
            "completion_tokens": stats.generated_tokens,
        }
        cached = min(stats.reused_tokens, len(prompt) - 1) // BLOCK * BLOCK
        if cached:  # enable_prompt_tokens_details and num_cached_tokens
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        self._send({**head, "choices": [], "usage": usage})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _send(self, chunk: dict) -> None:
        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.flush()


@pytest.fixture
def vllm(model_path: str) -> Iterator[tuple[str, list[dict]]]:
    engine = LlamaCppEngine()
    engine.load(LoadOptions(model_path, n_ctx=4096, n_seq_max=1, snapshots=False))
    requests: list[dict] = []
    handler = type(
        "Handler",
        (VllmImitation,),
        {"engine": engine, "lock": threading.Lock(), "requests": requests},
    )
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", requests
    finally:
        httpd.shutdown()
        httpd.server_close()
        engine.unload()


def _options(model_path: str, url: str) -> LoadOptions:
    return LoadOptions(model_path, n_ctx=4096, remote=RemoteOptions(url, model=MODEL_ID))


def test_tokens_mode_over_vllm_extends_each_prompt_and_reads_its_cache(
    vllm, store: ConversationStore, model_path: str, run
) -> None:
    url, requests = vllm

    async def scenario():
        client = EngineClient(_options(model_path, url))
        await client.start()
        try:
            session = ChatSession(store, client)
            conversation = store.create_conversation(
                system_prompt="Answer briefly.", sampling={"temperature": 0.0, "max_tokens": 24}
            )
            return client.backend, [await session.send(conversation.id, t) for t in TURNS]
        finally:
            await client.close()

    backend, results = run(scenario())
    assert backend == "remote"
    turns = [r for r in requests if r["max_tokens"] > 1]  # auto's one-token probe aside
    assert len(turns) == len(TURNS)
    for body in turns:
        assert body["return_token_ids"] is True and body["stream"] is True
        assert body["stream_options"] == {"include_usage": True}
        assert body["model"] == MODEL_ID and all(isinstance(t, int) for t in body["prompt"])
    previous: list[int] = []
    for body, result in zip(turns, results, strict=True):
        assert result.status == "complete" and result.token_ids
        assert body["prompt"][: len(previous)] == previous  # appended, never rewritten
        stats = result.stats
        assert stats.prompt_tokens == len(body["prompt"])
        if previous:  # the server's own count: every whole block of the last turn
            assert stats.reused_tokens == len(previous) // BLOCK * BLOCK
            assert stats.prefilled_tokens == stats.prompt_tokens - stats.reused_tokens
        previous = body["prompt"] + result.token_ids  # the ids vLLM sent, end of turn kept


def test_a_prewarm_asks_vllm_for_one_token_and_keeps_none(vllm, model_path: str) -> None:
    """vLLM refuses `max_tokens: 0`, so a prefill asks for one token and drops it: the
    prompt's blocks are cached and the next request that extends it reads them."""
    url, requests = vllm
    from app.engine.remote import RemoteEngine

    engine = RemoteEngine()
    engine.load(_options(model_path, url))
    try:
        prompt = engine.tokenize("Hello there, tell me about the sea in one line." * 4)
        stats = engine.prefill(prompt)
        assert requests[-1]["max_tokens"] == 1 and requests[-1]["prompt"] == list(prompt)
        assert stats.finish_reason == FinishReason.PREFILLED and stats.generated_tokens == 0
        events = list(
            engine.generate([*prompt, *engine.tokenize(" Go on.")], SamplingParams.greedy(), 8)
        )
        after = next(e for e in events if isinstance(e, GenerationStats))
        assert after.reused_tokens == len(prompt) // BLOCK * BLOCK > 0
    finally:
        engine.unload()
