"""The remote engine: Stoke's exact transcripts, run by an OpenAI-compatible server.

Users who outgrow one machine serve the model with vLLM, SGLang, llama.cpp's llama-server or
another Stoke, and chat through it. What keeps follow-ups cheap there is the same as here: the
server's prefix cache hits only when turn N+1's prompt starts with turn N's tokens. So the
remote engine sends the transcript as token ids wherever the server takes them, and keeps the
token ids the server sampled, so the next prompt extends this one exactly.

Wire modes, from most to least exact (`auto` picks the first the server supports):
- `llama-server`: llama.cpp's native /completion with a token prompt, `return_tokens` and
  `cache_prompt`; the cached count is its `timings.cache_n`. Its stream ends with a `stop`
  event; one that ends without it is a server gone mid-reply. Checked against the real
  llama-server of the engine's own llama.cpp (`make llama-tools`, tests/e2e/test_llama_server.py).
- `tokens`: /v1/completions with a token-id prompt and `return_token_ids` (vLLM, another
  Stoke); the cached count is `usage.prompt_tokens_details.cached_tokens`. A server that takes
  token prompts but sends no ids back (SGLang) gets its reply text re-tokenized locally.
- `text`: /v1/completions with the prompt as text (llama-cpp-python's server, whose prompt is
  text only). The server re-tokenizes it; control tokens are parsed back, replies are
  re-tokenized piece by piece, so a reply the model spelled in non-canonical tokens differs
  from what the server cached from there on. Such servers report no cached count: 0.
- `chat`: /v1/chat/completions with messages, for servers that take nothing else. The
  transcript is bytes (engine/remote_wire.py); exactness of the server's cache is not
  Stoke's to guarantee, and a prefill-only request does nothing. Tools pass through: the
  request's `tools`, `tool_choice`, `parallel_tool_calls` and `response_format`, tool results
  and earlier calls go to the server as OpenAI fields, so its own template, tool parser and
  grammar apply; the `tool_calls` it streams back become the reply's `<tool_call>` blocks,
  which the API server parses as it parses any reply.

In the token modes Stoke renders tools into the prompt and parses the reply itself, as for a
local model; the grammar of a forced call or `response_format` is not sent (these servers
take no llguidance grammar), so there the server samples freely.

Token modes need the model's tokenizer and chat template: a local GGUF of the same model
(LoadOptions.model_path, vocab only) or the server's /props and /tokenize (llama-server).
"""

from __future__ import annotations

import codecs
import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from app.engine.protocol import (
    CancelToken,
    EngineError,
    FinishReason,
    GenerationEvent,
    GenerationStats,
    LoadOptions,
    ModelInfo,
    ModelLoadError,
    ProgressCallback,
    RemoteOptions,
    SamplingParams,
    TokenEvent,
)
from app.engine.remote_http import Endpoint, RemoteCancelled, RemoteError, RemoteHTTP
from app.engine.remote_tokenizers import BYTES_FINGERPRINT, ByteTokenizer, ServerTokenizer
from app.engine.remote_wire import N_BYTE_VOCAB, WIRE_TEMPLATE, calls_text, wire_request

BYTES_PER_TOKEN = 4  # chat mode counts bytes; its context is the token context times this
PROBE_TIMEOUT_S = 30.0


class WireMode(StrEnum):
    AUTO = "auto"
    LLAMA_SERVER = "llama-server"
    TOKENS = "tokens"
    TEXT = "text"
    CHAT = "chat"


MODES = tuple(m.value for m in WireMode)


class RemoteTokenizer(Protocol):
    def tokenize(self, text: str, *, special: bool = False) -> list[int]: ...

    def detokenize(self, tokens: Sequence[int]) -> str: ...


def endpoint_of(remote: RemoteOptions) -> Endpoint:
    return Endpoint.parse(remote.url, remote.api_key, remote.timeout_s)


def probe(remote: RemoteOptions) -> list[str]:
    """The model ids the server lists; raises RemoteError in words when it cannot answer
    (down, wrong key, not OpenAI-compatible). For `stoke doctor` and the settings' test."""
    http = RemoteHTTP(Endpoint.parse(remote.url, remote.api_key, PROBE_TIMEOUT_S))
    return list(RemoteEngine.served_models(http))


def tokenizer_for(options: LoadOptions, info: ModelInfo | None) -> RemoteTokenizer:
    """The tokenizer that built `info`'s prompts, for the app process's transcripts."""
    if info is not None and info.fingerprint == BYTES_FINGERPRINT:
        return ByteTokenizer()
    if options.model_path:
        from app.engine.llamacpp.backend import load_vocab

        return load_vocab(options.model_path)
    if options.remote is None:
        raise EngineError("No remote server is configured: set its URL in Settings > Remote.")
    return ServerTokenizer(RemoteHTTP(endpoint_of(options.remote)), info.name if info else None)


@dataclass
class _Reply:
    """What one streamed request has produced so far."""

    tokens: list[int]
    prompt_tokens: int | None = None  # as the server counts them, where it says
    cached_tokens: int | None = None
    generated_tokens: int | None = None
    pieces: int = 0  # streamed text pieces: about one token each
    finish: FinishReason = FinishReason.LENGTH
    ended: bool = False  # the server said the reply is over (a finish reason, usage, `stop`)
    calls: dict[int, list[str]] = field(default_factory=dict)  # chat: index -> [name, args]


class RemoteEngine:
    """Engine contract over an OpenAI-compatible server. The engine host serialises calls;
    tokenize/detokenize may run beside a generation (each request has its own connection)."""

    backend_name = "remote"

    def __init__(self) -> None:
        self.http: RemoteHTTP | None = None
        self.mode = WireMode.AUTO
        self.model: str | None = None
        self.info: ModelInfo | None = None
        self._tokenizer: RemoteTokenizer | None = None
        self._sent: dict[str, list[int]] = {}  # per slot: what the server last saw

    # -- loading --------------------------------------------------------------------------

    def load(self, options: LoadOptions) -> ModelInfo:
        self.unload()
        if options.remote is None:
            raise ModelLoadError(
                "The remote engine needs a server: set its URL in Settings > Remote "
                "(or `stoke chat --engine remote --remote-url URL`)."
            )
        try:
            mode = WireMode(options.remote.mode)
        except ValueError:
            raise ModelLoadError(
                f"Unknown remote mode {options.remote.mode!r}: use one of {', '.join(MODES)}."
            ) from None
        try:
            self.http = RemoteHTTP(endpoint_of(options.remote))
            served = self.served_models(self.http)
            self.model = _pick_model(options.remote.model, served, self.http.url)
            props = self._props()
            self.mode, self._tokenizer, self.info = self._configure(mode, options, props, served)
        except RemoteError as exc:
            raise ModelLoadError(str(exc)) from exc
        return self.info

    @staticmethod
    def served_models(http: RemoteHTTP) -> dict[str, dict]:
        """The server's /v1/models entries by id."""
        answer = http.get("/v1/models", timeout_s=PROBE_TIMEOUT_S)
        data = answer.get("data") if isinstance(answer, dict) else None
        if not isinstance(data, list):
            raise RemoteError(
                f"The server at {http.url} answered /v1/models without a model list: "
                "is it an OpenAI-compatible server?"
            )
        return {str(m["id"]): m for m in data if isinstance(m, dict) and "id" in m}

    def _props(self) -> dict:
        """llama-server's (and Stoke's) /props: template, special tokens, context. {} when
        the server has none."""
        try:
            answer = self.http.get("/props", timeout_s=PROBE_TIMEOUT_S)
        except RemoteError as exc:
            if exc.status is None or exc.status in (401, 403):
                raise
            return {}
        return answer if isinstance(answer, dict) else {}

    def _configure(
        self, mode: WireMode, options: LoadOptions, props: dict, served: dict[str, dict]
    ) -> tuple[WireMode, RemoteTokenizer, ModelInfo]:
        vocab = None
        if options.model_path:
            from app.engine.llamacpp.backend import load_vocab

            vocab = load_vocab(options.model_path)
        template = _gguf_template(options.model_path) if vocab else props.get("chat_template")
        has_tokens = vocab is not None or "chat_template" in props
        if mode == WireMode.AUTO:
            mode = self._detect(has_tokens and bool(template), props, vocab)
        if mode != WireMode.CHAT and not (has_tokens and template):
            raise ModelLoadError(
                f"Mode {mode} builds token prompts, which needs the model's tokenizer and "
                f"chat template: the server at {self.http.url} does not share them. Give a "
                "local GGUF of the same model (--remote-tokenizer), or use mode chat."
            )
        n_ctx = _server_context(props, served.get(self.model, {})) or options.n_ctx
        n_ctx = min(n_ctx, options.n_ctx) if options.n_ctx else n_ctx
        if mode == WireMode.CHAT:
            return mode, ByteTokenizer(), self._chat_info(n_ctx)
        tokenizer = vocab or ServerTokenizer(self.http, self.model)
        info = (
            _vocab_info(vocab, options.model_path, template, n_ctx, self.http.url, self.model)
            if vocab
            else _server_info(tokenizer, props, n_ctx, self.http.url, self.model)
        )
        return mode, tokenizer, info

    def _detect(self, has_tokens: bool, props: dict, vocab: object | None) -> WireMode:
        if not has_tokens:
            return WireMode.CHAT
        # Stoke's own server answers /props as llama-server does, but has no native
        # /completion: it takes token prompts on /v1/completions (the probe below)
        stoke = str(props.get("build_info", "")).startswith("stoke")
        if "default_generation_settings" in props and not stoke:
            return WireMode.LLAMA_SERVER
        probe = vocab.tokenize("Hi") if vocab is not None else [0]
        try:
            self.http.post(
                "/v1/completions",
                {"model": self.model, "prompt": probe, "max_tokens": 1, "temperature": 0},
                timeout_s=PROBE_TIMEOUT_S,
            )
        except RemoteError as exc:
            # a prompt must be text there (llama-cpp-python answers its validation error 500)
            if exc.status in (400, 422, 500):
                return WireMode.TEXT
            raise
        return WireMode.TOKENS

    def _chat_info(self, n_ctx: int) -> ModelInfo:
        return ModelInfo(
            path=self.http.url,
            name=self.model,
            fingerprint=BYTES_FINGERPRINT,
            architecture="remote",
            n_ctx=n_ctx * BYTES_PER_TOKEN,
            n_ctx_train=n_ctx * BYTES_PER_TOKEN,
            n_vocab=N_BYTE_VOCAB,
            chat_template=WIRE_TEMPLATE,
            bos_token="",
            eos_token="",
            add_bos=False,
            bos_id=None,
            eog_ids=(),
            backend=self.backend_name,
            size_bytes=0,
        )

    def unload(self) -> None:
        self.http = self.info = self._tokenizer = None
        self._sent.clear()

    # -- tokens ---------------------------------------------------------------------------

    def tokenize(self, text: str, *, special: bool = False) -> list[int]:
        return self._require_tokenizer().tokenize(text, special=special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self._require_tokenizer().detokenize(tokens)

    def _require_tokenizer(self) -> RemoteTokenizer:
        if self._tokenizer is None:
            raise EngineError("No remote server is connected.")
        return self._tokenizer

    def resident_tokens(self, slot: str) -> list[int]:
        """What the server was last sent for this slot, with its reply: the prefix its cache
        most likely holds (the server does not say)."""
        return list(self._sent.get(slot, ()))

    def snapshot(self, slot: str, *, wait: bool = False) -> int:
        return 0  # the server owns its KV; nothing to save here

    # -- requests -------------------------------------------------------------------------

    def prefill(
        self,
        tokens: Sequence[int],
        *,
        slot: str = "default",
        cancel: CancelToken | None = None,
        progress: ProgressCallback | None = None,  # the server reads the prompt: no progress
        prefill_chunk: int = 0,  # nor chunks of it
    ) -> GenerationStats:
        """Prewarm the server's cache: `n_predict: 0` to llama-server, one token (dropped) in
        the tokens mode. Text and chat servers treat 0 as "no limit", so there it does
        nothing."""
        if self.mode in (WireMode.TEXT, WireMode.CHAT):
            return GenerationStats(len(tokens), 0, 0, 0, 0.0, 0.0, 0.0, FinishReason.PREFILLED)
        stats = None
        for event in self._run(tokens, SamplingParams.greedy(), 0, slot, cancel):
            if isinstance(event, GenerationStats):
                stats = event
        finish = FinishReason.CANCELLED if cancel and cancel.cancelled else FinishReason.PREFILLED
        return GenerationStats(
            stats.prompt_tokens,
            stats.reused_tokens,
            stats.prefilled_tokens,
            0,
            stats.ttft_s,
            stats.prefill_tok_s,
            0.0,
            finish,
        )

    def generate(
        self,
        tokens: Sequence[int],
        sampling: SamplingParams,
        max_tokens: int,
        *,
        slot: str = "default",
        cancel: CancelToken | None = None,
        progress: ProgressCallback | None = None,  # the server reads the prompt: no progress
        prefill_chunk: int = 0,  # nor chunks of it
    ) -> Iterator[GenerationEvent]:
        if not tokens:
            raise EngineError("Nothing to reply to: the prompt is empty.")
        yield from self._run(tokens, sampling, max_tokens, slot, cancel)

    def _run(
        self,
        tokens: Sequence[int],
        sampling: SamplingParams,
        max_tokens: int,
        slot: str,
        cancel: CancelToken | None,
    ) -> Iterator[GenerationEvent]:
        if self.http is None or self.info is None:
            raise EngineError("No remote server is connected.")
        path, body = self._request(tokens, sampling, max_tokens)
        reply = _Reply([])
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        eog = frozenset(self.info.eog_ids)
        start = time.perf_counter()
        first_at = last_at = None

        def pieces() -> Iterator[list[tuple[int, str]]]:
            for event in self.http.stream(path, body, cancel=cancel):
                yield self._parse(event, reply, decoder)
            yield self._calls(reply)

        try:
            for pairs in pieces():
                for token, text in pairs:
                    # servers may send the stop token back; replies end before it. A prefill
                    # keeps nothing: llama-server samples one token even at `n_predict: 0`,
                    # and never evaluates it into its cache.
                    if token in eog or max_tokens == 0:
                        continue
                    last_at = time.perf_counter()
                    first_at = first_at or last_at
                    reply.tokens.append(token)
                    yield TokenEvent(token, text)
        except RemoteCancelled:
            reply.finish = FinishReason.CANCELLED
        if not reply.ended and reply.finish != FinishReason.CANCELLED:
            self._sent.pop(slot, None)  # what the server holds now is anyone's guess
            raise RemoteError(
                f"The server at {self.http.url} closed the stream before the reply ended "
                f"({len(reply.tokens)} tokens in): it may have stopped or crashed. What "
                "arrived is kept; send again once the server is back."
            )
        if max_tokens == 0 and reply.finish != FinishReason.CANCELLED:
            reply.finish = FinishReason.PREFILLED
        self._sent[slot] = [*tokens, *reply.tokens]
        end = last_at or time.perf_counter()
        ttft = (first_at or end) - start
        # a chat-mode transcript counts bytes: without the server's numbers, say 0 prompt
        # tokens and count streamed pieces rather than pass bytes off as tokens
        chat = self.mode == WireMode.CHAT
        prompt = reply.prompt_tokens or (0 if chat else len(tokens))
        cached = min(reply.cached_tokens or 0, prompt)
        generated = reply.generated_tokens or (reply.pieces if chat else len(reply.tokens))
        decode_s = end - (first_at or end)
        yield GenerationStats.timed(
            prompt_tokens=prompt,
            reused_tokens=cached,
            prefilled_tokens=prompt - cached,
            generated_tokens=generated,
            ttft_s=ttft,
            prefill_s=ttft,
            decode_s=decode_s,
            finish_reason=reply.finish,
        )

    def _request(
        self, tokens: Sequence[int], sampling: SamplingParams, max_tokens: int
    ) -> tuple[str, dict[str, Any]]:
        """The endpoint and body of one streamed request in this server's wire mode."""
        temperature = max(sampling.temperature, 0.0)
        common: dict[str, Any] = {"temperature": temperature, "top_p": sampling.top_p}
        if sampling.seed is not None:
            common["seed"] = sampling.seed
        # servers' own defaults differ (min-p 0.05, top-k 40): say what Stoke means, except
        # to chat-only servers, which may not know these names
        if self.mode != WireMode.CHAT or sampling.min_p:
            common["min_p"] = sampling.min_p
        if self.mode != WireMode.CHAT or sampling.top_k:
            common["top_k"] = sampling.top_k
        if self.mode == WireMode.LLAMA_SERVER:
            return "/completion", {
                "prompt": list(tokens),
                "n_predict": max_tokens,
                "stream": True,
                "return_tokens": True,
                "cache_prompt": True,
                "repeat_penalty": 1.0,  # not llama-server's default
                **common,
            }
        base: dict[str, Any] = {"model": self.model, "stream": True, "max_tokens": max_tokens}
        if self.mode == WireMode.TOKENS:
            # a prefill asks for one token, which `_run` drops: vLLM refuses `max_tokens: 0`
            # ("must be at least 1") and caches the prompt's blocks all the same
            return "/v1/completions", {
                **base,
                **common,
                "max_tokens": max_tokens or 1,
                "prompt": list(tokens),
                "return_token_ids": True,
                "stream_options": {"include_usage": True},
            }
        if self.mode == WireMode.TEXT:
            if self.info.add_bos and tokens and tokens[0] == self.info.bos_id:
                tokens = tokens[1:]  # the server adds its own
            prompt = self._tokenizer.detokenize(tokens)
            # llama-cpp-python's server applies a repeat penalty of 1.1 unless told otherwise
            return "/v1/completions", {**base, **common, "prompt": prompt, "repeat_penalty": 1.0}
        try:
            request = wire_request(tokens)
        except ValueError as exc:
            raise EngineError(f"The chat prompt is malformed ({exc}).") from exc
        return "/v1/chat/completions", {
            **request.fields,
            **base,
            **common,
            "messages": request.messages,
            "stream_options": {"include_usage": True},
        }

    def _parse(
        self, event: dict, reply: _Reply, decoder: codecs.IncrementalDecoder
    ) -> list[tuple[int, str]]:
        """The (token, text) pairs one streamed event carries; records usage and finish."""
        if self.mode == WireMode.LLAMA_SERVER:
            return self._parse_llama_server(event, reply, decoder)
        usage = event.get("usage")
        if isinstance(usage, dict):
            reply.ended = True  # sent last (`include_usage`), whatever came before
            reply.prompt_tokens = usage.get("prompt_tokens") or reply.prompt_tokens
            reply.generated_tokens = usage.get("completion_tokens") or reply.generated_tokens
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict) and details.get("cached_tokens") is not None:
                reply.cached_tokens = int(details["cached_tokens"])
        choices = event.get("choices") or []
        if not choices:
            return []
        choice = choices[0]
        if choice.get("finish_reason"):
            reply.finish = _finish(choice["finish_reason"])
            reply.ended = True
        if self.mode == WireMode.CHAT:
            delta = choice.get("delta") or {}
            text = delta.get("content") or ""
            _add_calls(reply.calls, delta.get("tool_calls"))
        else:
            text = choice.get("text") or ""
        reply.pieces += bool(text)
        ids = choice.get("token_ids")
        if isinstance(ids, list):
            return _pair(ids, text, self._tokenizer, decoder)
        if not text:
            return []
        ids = self._tokenizer.tokenize(text, special=self.mode != WireMode.CHAT)
        return [(t, text if i == 0 else "") for i, t in enumerate(ids)]

    def _calls(self, reply: _Reply) -> list[tuple[int, str]]:
        """A chat reply's streamed tool calls as the reply's last bytes (`<tool_call>`
        blocks after any content, engine/remote_wire.py); none in the token modes."""
        calls = [(name, args) for name, args in reply.calls.values() if name]
        if not calls:
            return []
        text = calls_text(calls, after_content=bool(reply.tokens))
        return [(t, text if i == 0 else "") for i, t in enumerate(self._tokenizer.tokenize(text))]

    def _parse_llama_server(
        self, event: dict, reply: _Reply, decoder: codecs.IncrementalDecoder
    ) -> list[tuple[int, str]]:
        if event.get("stop"):
            reply.ended = True
            stop_type = event.get("stop_type")
            reply.finish = FinishReason.LENGTH if stop_type == "limit" else FinishReason.STOP
            timings = event.get("timings") or {}
            cached = timings.get("cache_n", event.get("tokens_cached"))
            if cached is not None:
                reply.cached_tokens = int(cached)
            if "prompt_n" in timings and cached is not None:
                reply.prompt_tokens = int(timings["prompt_n"]) + int(cached)
        ids = event.get("tokens")
        if isinstance(ids, list) and ids:
            return _pair(ids, event.get("content") or "", self._tokenizer, decoder)
        return []


def _pair(
    ids: list, text: str, tokenizer: RemoteTokenizer, decoder: codecs.IncrementalDecoder
) -> list[tuple[int, str]]:
    """Token events for ids that came back with their text: the text rides on the first.
    With a local vocab each token's own bytes are used, so a split character joins right."""
    token_bytes = getattr(tokenizer, "token_bytes", None)
    if token_bytes is not None:
        return [(int(t), decoder.decode(token_bytes(int(t)))) for t in ids]
    return [(int(t), text if i == 0 else "") for i, t in enumerate(ids)]


def _add_calls(calls: dict[int, list[str]], deltas: object) -> None:
    """Fold streamed `delta.tool_calls` into whole calls: each index's name and arguments
    arrive in pieces, joined as OpenAI's own client joins them."""
    for delta in deltas if isinstance(deltas, list) else ():
        function = delta.get("function") if isinstance(delta, dict) else None
        if not isinstance(function, dict):
            continue
        index = delta.get("index", len(calls))
        call = calls.setdefault(index if isinstance(index, int) else len(calls), ["", ""])
        name, arguments = function.get("name"), function.get("arguments")
        if isinstance(arguments, dict):  # some servers send the object itself
            arguments = json.dumps(arguments, ensure_ascii=False)
        call[0] += name if isinstance(name, str) else ""
        call[1] += arguments if isinstance(arguments, str) else ""


def _finish(reason: str) -> FinishReason:
    return FinishReason.LENGTH if reason == "length" else FinishReason.STOP


def _pick_model(wanted: str | None, served: dict[str, dict], url: str) -> str | None:
    if wanted:
        if wanted not in served:
            names = ", ".join(served) or "none"
            raise RemoteError(
                f"The server at {url} does not serve a model named {wanted!r}; it serves: "
                f"{names}. Pick one in Settings > Remote."
            )
        return wanted
    return next(iter(served), None)


def _server_context(props: dict, model: dict) -> int | None:
    """The server's context per request, where it says: llama-server's slot n_ctx, vLLM's
    max_model_len, Stoke's context_length, llama-server's model meta."""
    settings = props.get("default_generation_settings")
    meta = model.get("meta")
    for value in (
        settings.get("n_ctx") if isinstance(settings, dict) else None,
        model.get("max_model_len"),
        model.get("context_length"),
        meta.get("n_ctx_train") if isinstance(meta, dict) else None,
    ):
        if isinstance(value, int) and value > 0:
            return value
    return None


def _gguf_template(model_path: str) -> str | None:
    from app.engine.gguf_info import inspect_gguf

    template = inspect_gguf(model_path).metadata.get("tokenizer.chat_template")
    return template if isinstance(template, str) else None


def _vocab_info(
    vocab: Any, path: str, template: str | None, n_ctx: int, url: str, model: str | None
) -> ModelInfo:
    """ModelInfo from a local GGUF of the served model: its fingerprint, so replies made
    here and by the local engine share exact tokens."""
    import llama_cpp

    from app.engine.model_file import fingerprint

    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab.ptr)
    bos = llama_cpp.llama_vocab_bos(vocab.ptr)
    eos = llama_cpp.llama_vocab_eos(vocab.ptr)
    return ModelInfo(
        path=url,
        name=model or path,
        fingerprint=fingerprint(path),
        architecture="remote",
        n_ctx=n_ctx,
        n_ctx_train=n_ctx,
        n_vocab=n_vocab,
        chat_template=template,
        bos_token=vocab.text(bos),
        eos_token=vocab.text(eos),
        add_bos=bool(llama_cpp.llama_vocab_get_add_bos(vocab.ptr)),
        bos_id=bos if bos >= 0 else None,
        eog_ids=tuple(t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab.ptr, t)),
        backend=RemoteEngine.backend_name,
        size_bytes=0,
    )


def _server_info(
    tokenizer: ServerTokenizer, props: dict, n_ctx: int, url: str, model: str | None
) -> ModelInfo:
    """ModelInfo from the server's /props and /tokenize (no local file)."""
    import hashlib

    bos_token = str(props.get("bos_token") or "")
    eos_token = str(props.get("eos_token") or "")
    lead = tokenizer.tokenize("", add_special=True)  # [BOS] when the model adds one
    eos = tokenizer.tokenize(eos_token, special=True) if eos_token else []
    key = f"{url}\n{model}\n{props.get('model_path', '')}\n{props.get('chat_template', '')}"
    return ModelInfo(
        path=url,
        name=model or url,
        fingerprint="remote-" + hashlib.sha256(key.encode()).hexdigest()[:16],
        architecture="remote",
        n_ctx=n_ctx,
        n_ctx_train=n_ctx,
        n_vocab=0,
        chat_template=props.get("chat_template"),
        bos_token=bos_token,
        eos_token=eos_token,
        add_bos=bool(lead),
        bos_id=lead[0] if lead else None,
        eog_ids=tuple(eos[:1]) if len(eos) == 1 else (),
        backend=RemoteEngine.backend_name,
        size_bytes=0,
    )
