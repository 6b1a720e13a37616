"""The remote engine's configuration: settings.json for the server, the keychain for its key.

Kept apart from the engine (which must not read files or keychains: it runs in the engine
process with what it is given) and from settings.py (which never holds secrets). The CLI,
the window and `stoke doctor` all build a server's RemoteOptions here.
"""

from __future__ import annotations

import os

from app.engine.protocol import EngineError, RemoteOptions
from app.models import secrets
from app.settings import Settings

KEY_ENV = "STOKE_REMOTE_API_KEY"  # for scripts: wins over the keychain


def key_name(url: str) -> str:
    """The keychain entry of a server's API key: one per server URL."""
    return f"remote:{url.strip().rstrip('/')}"


def api_key(url: str) -> str | None:
    return os.environ.get(KEY_ENV) or secrets.get_token(key_name(url))


def save_api_key(url: str, key: str) -> str:
    """Store (or, when empty, forget) a server's key; returns where it went, in words."""
    if not key.strip():
        secrets.delete_token(key_name(url))
        return "The key was removed."
    return secrets.set_token(key, key_name(url))


def remote_options(
    settings: Settings,
    *,
    url: str | None = None,
    model: str | None = None,
    mode: str | None = None,
) -> RemoteOptions:
    """The server to use: the flags given, else the saved settings."""
    url = url or settings.remote_url
    if not url:
        raise EngineError(
            "The remote engine needs a server URL: pass --remote-url URL, or set it in "
            "Settings > Remote."
        )
    return RemoteOptions(
        url,
        model=model or settings.remote_model,
        mode=mode or settings.remote_mode,
        api_key=api_key(url),
        timeout_s=settings.remote_timeout_s,
    )
