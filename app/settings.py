"""Typed app settings in one JSON file under the config dir. Secrets never go here.

People edit this file by hand, so every field is checked on load: a field with a wrong type or
value falls back to its default alone (the rest are kept), and a file that is not a JSON
object gives all defaults. Either way the file as found is kept aside under a new numbered
name (`settings.json.damaged`, `-2`, ...: an earlier copy is never overwritten), a corrected
file replaces it, and one line on stderr names the file and each field, so the warning comes
once rather than at every start.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from app import paths
from app.engine.choice import CHOICES
from app.engine.drafting import SPECULATION_MODES
from app.engine.protocol import MIN_CONTEXT
from app.engine.remote import MODES
from app.engine.rpc_devices import DROP_CHOICES

DEFAULT_N_CTX = 8192
MAX_RESIDENT = 256  # llama.cpp's limit on sequences in one context (LLAMA_MAX_SEQ)


@dataclass
class Settings:
    model_path: str | None = None  # None: the bundled default model
    engine: str = "auto"  # "auto" (MLX on Apple Silicon, else llama.cpp), a local engine, "remote"
    n_ctx: int = DEFAULT_N_CTX
    n_threads: int | None = None
    n_gpu_layers: int = 0
    resident_conversations: int = 4  # KV sequences kept live at once (n_seq_max)
    snapshot_disk_gib: float = 20.0  # disk budget of KV snapshots; oldest evicted first
    snapshot_ram_gib: float = 2.0
    # Speculative decoding (app/engine/speculate.py): auto, lookup, draft or off; and the draft
    # model (a smaller one with the model's tokenizer: app/models/drafts.py), None for none.
    speculation: str = "auto"
    draft_model: str | None = None
    # engine "remote" (app/engine/remote.py): the server, its model id (None: its only one),
    # the wire mode, a local GGUF of the same model for tokens (None: ask the server), and
    # the longest wait for it. The API key is in the keychain (app/models/secrets.py).
    remote_url: str | None = None
    remote_model: str | None = None
    remote_mode: str = "auto"
    remote_tokenizer: str | None = None
    remote_timeout_s: float = 300.0
    # Settings > Hardware: llama.cpp rpc-servers on other machines the planner may split a
    # model over (HOST:PORT[=SIZE][@LINK], comma-separated: app/hardware/rpc.py), and what the
    # engine does when one goes away mid-reply: "reload" without it, or "wait" for it.
    rpc_servers: str = ""
    rpc_on_drop: str = "reload"
    # Settings > API Server: serve the OpenAI-compatible API (app/server) when the app starts.
    serve_on_start: bool = False
    serve_port: int = 8484
    # Keep the conversations that server serves in the window's store (conversations/served.py)
    keep_api_conversations: bool = True

    @classmethod
    def load(cls, path: Path | None = None) -> Settings:
        """The settings in `path`; what is wrong in it is repaired, kept aside and reported."""
        settings, problem = cls.load_checked(path)
        if problem:
            print(f"stoke: {problem}", file=sys.stderr)
        return settings

    @classmethod
    def load_checked(cls, path: Path | None = None) -> tuple[Settings, str | None]:
        """The settings in `path` and a sentence on what had to be repaired (None: nothing)."""
        path = path or paths.config_dir() / "settings.json"
        try:
            raw: Any = json.loads(path.read_text("utf-8"))
        except FileNotFoundError:
            return cls(), None
        except ValueError:
            return cls(), _repair(path, None, f"{path} is not valid JSON: using the defaults")
        except OSError as exc:
            return cls(), f"{path} could not be read ({exc.strerror}): using the defaults."
        if not isinstance(raw, dict):
            found = type(raw).__name__ if raw is not None else "null"
            problem = f"{path} holds a JSON {found}, not an object: using the defaults"
            return cls(), _repair(path, None, problem)
        known = {f.name for f in fields(cls)}
        good = {k: v for k, v in raw.items() if k in known and _CHECKS[k](v)}
        bad = [k for k in raw if k in known and k not in good]
        settings = cls(**good)
        if not bad:
            return settings, None
        defaults = cls()
        detail = "; ".join(
            f"{k} = {json.dumps(raw[k])} is not {_EXPECTED[k]} "
            f"(using {json.dumps(getattr(defaults, k))})"
            for k in bad
        )
        fixed = {k: v for k, v in raw.items() if k not in bad}
        return settings, _repair(path, fixed, f"{path}: {detail}")

    def save(self, path: Path | None = None) -> None:
        """Written to a temp file and renamed, so a crash never leaves half a file."""
        path = path or paths.config_dir() / "settings.json"
        paths.write_private(path, json.dumps(asdict(self), indent=2))


def _repair(path: Path, fixed: dict[str, Any] | None, problem: str) -> str:
    """Keep the file as found aside, write `fixed` (None: no file, all defaults) in its place,
    and return the sentence for the user."""
    try:
        kept = paths.keep_aside(path)
        if fixed is not None:
            paths.write_private(path, json.dumps(fixed, indent=2))
    except OSError as exc:
        return f"{problem}. The file could not be repaired ({exc.strerror})."
    return f"{problem}. The file as found is kept as {kept.name}."


def _integer(low: int, high: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and low <= v <= high


def _number(low: float, *, above: bool = False) -> Callable[[Any], bool]:
    def check(v: Any) -> bool:
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            return False
        return v > low if above else v >= low

    return check


def _text_or_none(v: Any) -> bool:
    return v is None or (isinstance(v, str) and bool(v.strip()))


def _one_of(choices: tuple[str, ...]) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, str) and v in choices


ENGINES = (*CHOICES, "remote")
_CHECKS: dict[str, Callable[[Any], bool]] = {
    "model_path": _text_or_none,
    "engine": _one_of(ENGINES),
    "n_ctx": _integer(MIN_CONTEXT, 1 << 24),
    "n_threads": lambda v: v is None or _integer(1, 4096)(v),
    "n_gpu_layers": _integer(-1, 1 << 16),
    "resident_conversations": _integer(1, MAX_RESIDENT),
    "snapshot_disk_gib": _number(0),
    "snapshot_ram_gib": _number(0),
    "speculation": _one_of(SPECULATION_MODES),
    "draft_model": _text_or_none,
    "remote_url": _text_or_none,
    "remote_model": _text_or_none,
    "remote_mode": _one_of(MODES),
    "remote_tokenizer": _text_or_none,
    "remote_timeout_s": _number(0, above=True),
    "rpc_servers": lambda v: isinstance(v, str),
    "rpc_on_drop": _one_of(DROP_CHOICES),
    "serve_on_start": lambda v: isinstance(v, bool),
    "serve_port": _integer(1, 65535),
    "keep_api_conversations": lambda v: isinstance(v, bool),
}
_EXPECTED = {
    "model_path": "a path or null",
    "engine": "one of " + ", ".join(ENGINES),
    "n_ctx": f"a whole number of tokens from {MIN_CONTEXT} (the smallest that works) to 16777216",
    "n_threads": "a whole number from 1, or null",
    "n_gpu_layers": "a whole number from -1 (all layers)",
    "resident_conversations": f"a whole number from 1 to {MAX_RESIDENT}",
    "snapshot_disk_gib": "a number of GiB, 0 or more",
    "snapshot_ram_gib": "a number of GiB, 0 or more",
    "speculation": "one of " + ", ".join(SPECULATION_MODES),
    "draft_model": "a path or null",
    "remote_url": "a URL or null",
    "remote_model": "a model id or null",
    "remote_mode": "one of " + ", ".join(MODES),
    "remote_tokenizer": "a path or null",
    "remote_timeout_s": "a number of seconds above 0",
    "rpc_servers": "HOST:PORT[=SIZE][@LINK] items, comma-separated",
    "rpc_on_drop": "one of " + ", ".join(DROP_CHOICES),
    "serve_on_start": "true or false",
    "serve_port": "a port from 1 to 65535",
    "keep_api_conversations": "true or false",
}
