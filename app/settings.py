"""Typed app settings in one JSON file under the config dir. Secrets never go here.

People edit this file by hand, so every field is checked on load (`SETTINGS_FILE`, through
app/stored.py like every file Stoke reads back): a field with a wrong type or value, or a key
Stoke does not know, is dropped alone and the field falls back to its default (the rest are
kept), and a file that is not a JSON object gives all defaults. Either way the file as found is
kept aside under a new numbered name (`settings.json.damaged`, `-2`, ...: an earlier copy is
never overwritten), a corrected file replaces it, and one warning (on stderr) names the file
and each field, so it comes once rather than at every start.
"""

from __future__ import annotations

import json
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
from app.stored import Fields, Stored, Value, boolean, number, one_of, text, whole

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
    # Settings > Tools: the most rounds of tool calls one chat turn may take (the default is
    # app/tool_loop's DEFAULT_MAX_ROUNDS, which this layer may not import).
    tool_rounds: int = 10

    @classmethod
    def load(cls, path: Path | None = None) -> Settings:
        """The settings in `path`; what is wrong in it is repaired, kept aside and logged."""
        return cls.load_checked(path)[0]

    @classmethod
    def load_checked(cls, path: Path | None = None) -> tuple[Settings, str | None]:
        """The settings in `path` and a sentence on what had to be repaired (None: nothing)."""
        found = SETTINGS_FILE.read(path or paths.config_dir() / "settings.json")
        return cls(**found.value), found.problem

    def save(self, path: Path | None = None) -> None:
        """Written to a temp file and renamed, so a crash never leaves half a file."""
        path = path or paths.config_dir() / "settings.json"
        paths.write_private(path, json.dumps(asdict(self), indent=2))


def _text_or_none(v: Any) -> bool:
    return v is None or (isinstance(v, str) and bool(v.strip()))


ENGINES = (*CHOICES, "remote")
# Each field's check, and what it must be in words.
_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "model_path": (_text_or_none, "a path or null"),
    "engine": (one_of(*ENGINES), "one of " + ", ".join(ENGINES)),
    "n_ctx": (
        whole(MIN_CONTEXT, 1 << 24),
        f"a whole number of tokens from {MIN_CONTEXT} (the smallest that works) to 16777216",
    ),
    "n_threads": (lambda v: v is None or whole(1, 4096)(v), "a whole number from 1, or null"),
    "n_gpu_layers": (whole(-1, 1 << 16), "a whole number from -1 (all layers)"),
    "resident_conversations": (whole(1, MAX_RESIDENT), f"a whole number from 1 to {MAX_RESIDENT}"),
    "snapshot_disk_gib": (number(0), "a number of GiB, 0 or more"),
    "snapshot_ram_gib": (number(0), "a number of GiB, 0 or more"),
    "speculation": (one_of(*SPECULATION_MODES), "one of " + ", ".join(SPECULATION_MODES)),
    "draft_model": (_text_or_none, "a path or null"),
    "remote_url": (_text_or_none, "a URL or null"),
    "remote_model": (_text_or_none, "a model id or null"),
    "remote_mode": (one_of(*MODES), "one of " + ", ".join(MODES)),
    "remote_tokenizer": (_text_or_none, "a path or null"),
    "remote_timeout_s": (number(0, above=True), "a number of seconds above 0"),
    "rpc_servers": (text, "HOST:PORT[=SIZE][@LINK] items, comma-separated"),
    "rpc_on_drop": (one_of(*DROP_CHOICES), "one of " + ", ".join(DROP_CHOICES)),
    "serve_on_start": (boolean, "true or false"),
    "serve_port": (whole(1, 65535), "a port from 1 to 65535"),
    "keep_api_conversations": (boolean, "true or false"),
    "tool_rounds": (whole(1, 1000), "a whole number of rounds from 1 to 1000"),
}
# A wrong field falls back to its default alone, and the sentence says which default.
SETTINGS_FILE = Stored(
    Fields(
        {
            f.name: Value(
                _FIELDS[f.name][0], f"{_FIELDS[f.name][1]} (using {json.dumps(f.default)})"
            )
            for f in fields(Settings)
        }
    ),
    keep=True,
)
