"""The local API server's key: required on every request, made on first use, kept in the
system keychain (or, where there is none, in memory until Stoke quits; never in a file).

Scripts set the key with `--api-key-file PATH`, `STOKE_API_KEY` or `--api-key KEY` (which
`ps` shows to every local user); a key given that way is used as is and not stored.
"""

from __future__ import annotations

import hmac
import os
import secrets as token_source
from dataclasses import dataclass

from app.models import secrets

KEY_NAME = "api-server"  # the keyring user name of the key
ENV_VAR = "STOKE_API_KEY"


@dataclass(frozen=True)
class ApiKey:
    value: str
    where: str  # a sentence for the user: where the key lives
    source: str  # "given" (flag or environment), "keychain" or "memory"


def resolve(explicit: str | None = None, *, given_by: str = "--api-key") -> ApiKey:
    """The key to require: the one given (`explicit`, from the flag `given_by`, then the
    environment), else the stored one, else a new one, stored."""
    given = (explicit or os.environ.get(ENV_VAR) or "").strip()
    if given:
        source = given_by if explicit and explicit.strip() else ENV_VAR
        return ApiKey(given, f"The API key was given with {source}.", "given")
    existing = secrets.get_token(KEY_NAME)
    if existing:
        return _describe(existing)
    return renew()


def renew() -> ApiKey:
    """Make and store a new key (the old one stops working)."""
    value = "sk-stoke-" + token_source.token_urlsafe(24)
    secrets.set_token(value, KEY_NAME)
    return _describe(value)


def _describe(value: str) -> ApiKey:
    if secrets.keychain_available():
        return ApiKey(value, "The API key is kept in the system keychain.", "keychain")
    return ApiKey(value, "No system keychain: the API key is kept until Stoke quits.", "memory")


def authorized(header: str | None, key: str) -> bool:
    """Whether an Authorization header carries the key (constant-time comparison). Header
    bytes that are not UTF-8 reach here as surrogate escapes: they never match, never raise."""
    scheme, _, token = (header or "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(token.strip().encode("utf-8", "surrogatepass"), key.encode())


def authorized_key(value: str | None, key: str) -> bool:
    """Whether an `x-api-key` header (Anthropic's clients send the key so) is the key."""
    if not value:
        return False
    return hmac.compare_digest(value.strip().encode("utf-8", "surrogatepass"), key.encode())
