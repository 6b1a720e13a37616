"""Typed app settings in one JSON file under the config dir. Secrets never go here.

A missing or damaged file gives the defaults (a damaged one is kept aside, not overwritten).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from app import paths

DEFAULT_N_CTX = 8192


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
    # engine "remote" (app/engine/remote.py): the server, its model id (None: its only one),
    # the wire mode, a local GGUF of the same model for tokens (None: ask the server), and
    # the longest wait for it. The API key is in the keychain (app/models/secrets.py).
    remote_url: str | None = None
    remote_model: str | None = None
    remote_mode: str = "auto"
    remote_tokenizer: str | None = None
    remote_timeout_s: float = 300.0
    # Settings > API Server: serve the OpenAI-compatible API (app/server) when the app starts.
    serve_on_start: bool = False
    serve_port: int = 8484

    @classmethod
    def load(cls, path: Path | None = None) -> Settings:
        path = path or paths.config_dir() / "settings.json"
        try:
            raw = json.loads(path.read_text("utf-8"))
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError):
            path.replace(path.with_suffix(".json.damaged"))
            return cls()
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})

    def save(self, path: Path | None = None) -> None:
        """Written to a temp file and renamed, so a crash never leaves half a file."""
        path = path or paths.config_dir() / "settings.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2), "utf-8")
        os.replace(tmp, path)
