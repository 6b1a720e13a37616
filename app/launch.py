"""How a model loads here: the one answer the terminal chat, the window, the API server and
`stoke doctor` all use, so that none of them can load a model differently from the others.

Precedence, lowest first:

1. `LoadOptions`' defaults;
2. the app's Settings (engine when it is a local choice, context, threads, GPU layers,
   resident conversations, snapshot budgets, speculative decoding and its draft model, what
   to do when an rpc-server goes away);
3. the model's saved load settings (the hardware wizard's plan, its engine, rpc-servers and
   device order included);
4. the command's flags (--ctx, --engine).

A server runs the chat instead when the flags ask for one (--engine remote, --remote-url), or
when Settings' engine is "remote" and no --engine flag says otherwise: the model path is then
the local GGUF that gives exact tokens (--remote-tokenizer, else Settings'), or "" to ask the
server. Nothing carries over from a previously loaded model.
"""

from __future__ import annotations

import argparse
import contextlib
from dataclasses import dataclass, fields

from app.engine.choice import AUTO, CHOICES
from app.engine.protocol import LoadOptions, ModelLoadError
from app.models import load_settings
from app.models.default import default_model_path
from app.remote_config import remote_options
from app.settings import Settings

PLANNED_FIELDS = frozenset(f.name for f in fields(LoadOptions)) - {"model_path"}


@dataclass(frozen=True)
class LoadFlags:
    """What a command line says about loading (None: it says nothing)."""

    ctx: int | None = None
    engine: str | None = None
    remote_url: str | None = None
    remote_model: str | None = None
    remote_mode: str | None = None
    remote_tokenizer: str | None = None

    @classmethod
    def of(cls, args: argparse.Namespace) -> LoadFlags:
        """The flags in `args`; callers that build a Namespace by hand may omit any."""
        return cls(**{f.name: getattr(args, f.name, None) for f in fields(cls)})


def resolve_load_options(
    model: str | None, settings: Settings, flags: LoadFlags | None = None
) -> LoadOptions:
    """The options `model` (None: Settings' model, else the bundled one) loads with, by the
    precedence above."""
    flags = flags or LoadFlags()
    engine = flags.engine or settings.engine
    if engine == "remote" or flags.remote_url:
        return _remote(settings, flags)
    model = model or settings.model_path or str(default_model_path())
    options: dict[str, object] = {
        "engine": settings.engine if settings.engine in CHOICES else AUTO,
        "n_ctx": settings.n_ctx,
        "n_threads": settings.n_threads,
        "n_gpu_layers": settings.n_gpu_layers,
        "n_seq_max": settings.resident_conversations,
        "kv_disk_budget": int(settings.snapshot_disk_gib * (1 << 30)),
        "kv_ram_budget": int(settings.snapshot_ram_gib * (1 << 30)),
        "speculation": settings.speculation,
        "draft_model": settings.draft_model,
        "rpc_on_drop": settings.rpc_on_drop,
    }
    with contextlib.suppress(OSError, ModelLoadError):  # no plan for a missing file
        planned = load_settings.load(model) or {}
        options.update({k: v for k, v in planned.items() if k in PLANNED_FIELDS})
    if flags.ctx:
        options["n_ctx"] = flags.ctx
    if flags.engine in CHOICES:
        options["engine"] = flags.engine
    return LoadOptions(model_path=model, **options)


def _remote(settings: Settings, flags: LoadFlags) -> LoadOptions:
    """A server runs the model; a local GGUF of it (if any) gives exact tokens."""
    remote = remote_options(
        settings, url=flags.remote_url, model=flags.remote_model, mode=flags.remote_mode
    )
    tokenizer = flags.remote_tokenizer or settings.remote_tokenizer or ""
    return LoadOptions(model_path=tokenizer, n_ctx=flags.ctx or settings.n_ctx, remote=remote)


def load_options_of(args: argparse.Namespace) -> LoadOptions:
    """What a command line loads: its --model (if any) with Settings and its flags."""
    return resolve_load_options(getattr(args, "model", None), Settings.load(), LoadFlags.of(args))
