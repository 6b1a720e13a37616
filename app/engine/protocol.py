"""The one engine contract every backend (llama.cpp, MLX, remote) implements.

Everything here is plain data so it crosses the engine-host process boundary by pickle,
and nothing here knows about Qt, SQLite or any particular runtime.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable


class EngineError(Exception):
    """An error whose message is meant for the user: it says what happened and what to do."""


class ModelLoadError(EngineError):
    """The model file is missing, unreadable, truncated or not a model the engine can load."""


class ContextOverflowError(EngineError):
    """The prompt (plus room to reply) does not fit in the context window."""

    def __init__(self, prompt_tokens: int, n_ctx: int, message: str | None = None) -> None:
        self.prompt_tokens = prompt_tokens
        self.n_ctx = n_ctx
        super().__init__(
            message
            or (
                f"The conversation is {prompt_tokens:,} tokens but the context holds {n_ctx:,}. "
                "Drop the oldest turns or start a new conversation."
            )
        )

    def __reduce__(self):  # keep the numbers when the error crosses the process boundary
        return (type(self), (self.prompt_tokens, self.n_ctx, str(self)))


class FinishReason(StrEnum):
    STOP = "stop"  # the model ended its turn (end-of-generation token or a stop sequence)
    LENGTH = "length"  # max_tokens reached
    CANCELLED = "cancelled"  # the caller cancelled
    PREFILLED = "prefilled"  # prefill-only request (max_tokens 0) finished


@dataclass(frozen=True)
class RemoteOptions:
    """An OpenAI-compatible server that runs the model (engine "remote", engine/remote.py)."""

    url: str
    model: str | None = None  # the server's model id; None: the only (or first) one it serves
    mode: str = "auto"  # auto | tokens | llama-server | text | chat (see engine/remote.py)
    api_key: str | None = field(default=None, repr=False)
    timeout_s: float = 300.0  # longest silence while waiting for the server


@dataclass(frozen=True)
class LoadOptions:
    """How to load a model. Backends ignore what does not apply to them."""

    model_path: str
    n_ctx: int = 8192
    n_batch: int = 512
    n_ubatch: int = 512
    n_threads: int | None = None
    n_gpu_layers: int = 0
    n_seq_max: int = 4  # conversations resident at once
    # How the resident conversations hold their KV. False: each has room for n_ctx of its own
    # (llama.cpp: a KV stream each, n_seq_max x n_ctx cells in all, as deepseek4's caches
    # always are; MLX: a cache each within that), so a prefill attends over its own
    # conversation only. True: they share one pool of n_ctx cells (less memory, but on
    # llama.cpp every prefill attends over every resident's cells); an n_ctx past the model's
    # training context then sizes the pool, each conversation still within its window.
    kv_unified: bool = False
    flash_attn: bool = False
    chat_template: str | None = None  # overrides the model's own template
    # A placement plan (app/hardware/planner.py): llama.cpp -ot rules (regex, buffer type),
    # first match wins; layers per GPU; KV element type; the full-size raw KV window (None:
    # off for hybrid models such as deepseek4, whose window cannot be trimmed anyway).
    overrides: tuple[tuple[str, str], ...] = ()
    tensor_split: tuple[float, ...] = ()
    kv_type: str = "f16"
    swa_full: bool | None = None
    kv_offload: bool = True
    # Remote devices (llama.cpp rpc-servers, engine/llamacpp/rpc.py): the servers to connect,
    # the devices to offload to in order (empty: llama.cpp's default list), and what the host
    # does when a server goes away: "reload" the model without it, or "wait" until it is back.
    rpc_servers: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    rpc_on_drop: str = "reload"
    # llama.cpp's extra CPU buffer types (weights repacked for faster matmuls): "auto" (this
    # machine's probed verdict, engine/llamacpp/cpu_buffers.py), "all", "no-amx" or "none".
    cpu_buffers: str = "auto"
    snapshots: bool = True  # keep KV snapshots in RAM and on disk (kvstore)
    kv_ram_budget: int = 2 << 30
    kv_disk_budget: int = 20 << 30
    # The remote engine's server; model_path is then a local GGUF of the same model for its
    # tokenizer and template, or "" to ask the server for them.
    remote: RemoteOptions | None = None
    # The local engine: "llama.cpp", "mlx", or "auto" (the platform's; engine/choice.py).
    engine: str = "auto"
    # Speculative decoding (engine/speculate.py): "auto" (prompt lookup, and the draft model
    # when one is set), "lookup", "draft" (the draft model alone) or "off"; the draft model is
    # a smaller model of the same tokenizer (its path), or None.
    speculation: str = "auto"
    draft_model: str | None = None
    # llama.cpp: the attention a speculative context gets (batches equal one-token decodes,
    # engine/llamacpp/backend.py exact_attention) with speculation off: its plain twin.
    exact_batches: bool = False
    # llama.cpp: a vision model's projector (mmproj GGUF); None: the one beside the model, if
    # any (engine/images.py find_projector).
    mmproj: str | None = None


# The smallest context a local load accepts. llama.cpp gives each conversation its context in
# steps of 256 tokens (a smaller n_ctx still costs 256 cells) while it caps a batch at the
# context asked for: n_ctx 1 in four streams took batches of 4 tokens, and the chat template
# alone is dozens of tokens. Below this, a load stops in words (`check_context`).
MIN_CONTEXT = 256


def check_context(options: LoadOptions) -> None:
    """ModelLoadError, in words, for a context too small to hold a conversation; the engines
    cut one larger than the model was trained on to the trained length themselves."""
    if options.n_ctx < MIN_CONTEXT:
        tokens = "token" if options.n_ctx == 1 else "tokens"
        raise ModelLoadError(
            f"A context of {options.n_ctx:,} {tokens} cannot hold a conversation: the smallest "
            f"that works is {MIN_CONTEXT} tokens. Set the context size to {MIN_CONTEXT} or more."
        )


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings. temperature <= 0 means greedy (argmax), deterministic."""

    temperature: float = 0.7
    top_p: float = 0.95
    min_p: float = 0.05
    top_k: int = 0
    seed: int | None = None
    # Penalties over the last `penalty_last_n` tokens (prompt and reply), as llama-server
    # applies them: OpenAI's additive presence/frequency (0 = off), llama.cpp's multiplicative
    # repeat penalty (1 = off).
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_penalty: float = 1.0
    penalty_last_n: int = 64
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit)
    # A grammar every reply must follow (llguidance Lark; engine/constraint.py), or None.
    grammar: str | None = None
    logprobs: int | None = None  # report each token's logprob and this many alternatives

    @property
    def penalized(self) -> bool:
        """Whether any penalty is on (the engines skip the work otherwise)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repeat_penalty != 1.0)

    @classmethod
    def greedy(cls) -> SamplingParams:
        return cls(temperature=0.0, top_p=1.0, min_p=0.0, top_k=0, seed=0)


@dataclass(frozen=True)
class ModelInfo:
    """What the rest of the app needs to know about the loaded model."""

    path: str
    name: str
    fingerprint: str  # stable id of weights + tokenizer; keys KV snapshots and stored tokens
    architecture: str
    n_ctx: int  # the context actually allocated
    n_ctx_train: int
    n_vocab: int
    chat_template: str | None
    bos_token: str
    eos_token: str
    add_bos: bool
    bos_id: int | None
    eog_ids: tuple[int, ...]  # end-of-generation tokens (end of turn, eos)
    backend: str
    size_bytes: int
    projector: str | None = None  # the vision projector loaded with it: it reads images


@dataclass(frozen=True)
class TokenEvent:
    """One sampled token and the text it completes (may be "" mid UTF-8 sequence)."""

    token_id: int
    text: str
    logprob: float | None = None  # when the sampling asked for logprobs
    top: tuple[tuple[int, float], ...] = ()  # the likeliest (id, logprob), best first


@dataclass(frozen=True)
class PrefillProgress:
    """How far a reply's prompt has been read: `done` of its `total` tokens are in the KV
    (reused ones included). Sent after each prefill chunk, so a long prompt shows progress."""

    done: int
    total: int


ProgressCallback = Callable[[PrefillProgress], None]

# The prefill chunk of a reply someone watches (the window, the terminal chat): progress is
# shown and Stop lands within one. API requests read their prompt in whole n_batch steps.
USER_CHUNK = 256


@dataclass(frozen=True)
class GenerationStats:
    """Final numbers of one request; prefill-only requests have generated_tokens == 0."""

    prompt_tokens: int
    reused_tokens: int  # prompt tokens whose KV was already in the context (or restored)
    prefilled_tokens: int  # prompt tokens evaluated by this request
    generated_tokens: int
    ttft_s: float  # request start to first token (prefill time for prefill-only)
    prefill_tok_s: float
    decode_tok_s: float
    finish_reason: FinishReason
    restored_tokens: int = 0  # of reused_tokens, how many came from a snapshot, not live KV
    # Speculative decoding (engine/speculate.py): draft tokens verified, and of those kept.
    drafted_tokens: int = 0
    accepted_tokens: int = 0

    @classmethod
    def timed(
        cls,
        *,
        prompt_tokens: int,
        reused_tokens: int,
        prefilled_tokens: int,
        generated_tokens: int,
        ttft_s: float,
        prefill_s: float,
        decode_s: float,
        finish_reason: FinishReason,
        restored_tokens: int = 0,
        drafted_tokens: int = 0,
        accepted_tokens: int = 0,
    ) -> GenerationStats:
        """Stats from counts and the seconds spent, so every backend derives its rates alike."""
        generated = generated_tokens  # the decode rate counts those after the first
        return cls(
            prompt_tokens=prompt_tokens,
            reused_tokens=reused_tokens,
            prefilled_tokens=prefilled_tokens,
            generated_tokens=generated,
            ttft_s=ttft_s,
            prefill_tok_s=prefilled_tokens / prefill_s if prefill_s > 0 else 0.0,
            decode_tok_s=(generated - 1) / decode_s if generated > 1 and decode_s > 0 else 0.0,
            finish_reason=finish_reason,
            restored_tokens=restored_tokens,
            drafted_tokens=drafted_tokens,
            accepted_tokens=accepted_tokens,
        )

    @property
    def acceptance(self) -> float | None:
        """The share of drafted tokens kept (None: nothing was drafted)."""
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else None

    def as_dict(self) -> dict[str, object]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "reused_tokens": self.reused_tokens,
            "restored_tokens": self.restored_tokens,
            "prefilled_tokens": self.prefilled_tokens,
            "generated_tokens": self.generated_tokens,
            "ttft_s": round(self.ttft_s, 4),
            "prefill_tok_s": round(self.prefill_tok_s, 1),
            "decode_tok_s": round(self.decode_tok_s, 1),
            "finish_reason": str(self.finish_reason),
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
        }


GenerationEvent = TokenEvent | GenerationStats


@dataclass
class CancelToken:
    """Set by another thread; backends check it between tokens and between prefill batches."""

    _event: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()


@runtime_checkable
class Engine(Protocol):
    """An inference runtime holding one model.

    `slot` names a conversation's KV sequence: requests for the same slot reuse that
    sequence's longest common prefix; different slots may be resident at once where the
    backend supports it.
    """

    def load(self, options: LoadOptions) -> ModelInfo: ...

    def unload(self) -> None: ...

    def tokenize(self, text: str, *, special: bool = False) -> list[int]:
        """Tokens of `text` without BOS; `special` parses control tokens like <|im_end|>."""
        ...

    def detokenize(self, tokens: Sequence[int]) -> str: ...

    def resident_tokens(self, slot: str) -> list[int]:
        """The tokens whose KV the slot holds now (empty when not resident)."""
        ...

    def snapshot(self, slot: str, *, wait: bool = False) -> int:
        """Save the slot's KV to the snapshot tiers; returns the tokens saved (0: nothing new).
        With `wait`, return once the disk tier has it."""
        ...

    def prefill(
        self,
        tokens: Sequence[int],
        *,
        slot: str = "default",
        cancel: CancelToken | None = None,
        progress: ProgressCallback | None = None,
        prefill_chunk: int = 0,
    ) -> GenerationStats:
        """Bring the slot's KV to exactly `tokens` without sampling (the max_tokens 0 prewarm);
        `progress` and `prefill_chunk` as for `generate` (a draft's files show how far they
        are read)."""
        ...

    def generate(
        self,
        tokens: Sequence[int],
        sampling: SamplingParams,
        max_tokens: int,
        *,
        slot: str = "default",
        cancel: CancelToken | None = None,
        progress: ProgressCallback | None = None,
        prefill_chunk: int = 0,
    ) -> Iterator[GenerationEvent]:
        """Stream TokenEvents for the reply to `tokens`, then one GenerationStats; `progress`
        hears how far the prompt's prefill has come (engines that prefill locally), after
        each chunk of `prefill_chunk` tokens (0: the engine's n_batch; USER_CHUNK where a
        user waits and may press Stop, since a cancel lands between chunks).

        End-of-generation tokens stop the reply and are not yielded.
        """
        ...
