"""Stoke's secrets (the Hugging Face token, the local API server's key), kept in the OS
keychain through `keyring` and never in a file. Each secret has a name (its keyring user).

Headless Linux (CI, servers) has no keychain: keyring's backend there is `fail.Keyring`, whose
calls raise `NoKeyringError`. Stoke then keeps the token in this process's memory and says so,
rather than writing it anywhere a backup or another user could read it.
"""

from __future__ import annotations

import contextlib
import threading

import keyring
from keyring.backends import fail
from keyring.errors import KeyringError

SERVICE = "stoke"
USER = "huggingface"
NO_KEYCHAIN = "no system keychain: the token is kept until Stoke quits"

_lock = threading.Lock()
_in_memory: dict[str, str] = {}


def keychain_available() -> bool:
    """Whether keyring has a real backend (not the failing placeholder of headless systems)."""
    return not isinstance(keyring.get_keyring(), fail.Keyring)


def set_token(token: str, name: str = USER) -> str:
    """Store the token; return where it went, as a sentence for the user."""
    token = token.strip()
    if not token:
        raise ValueError("The token is empty.")
    with _lock:
        if keychain_available():
            try:
                keyring.set_password(SERVICE, name, token)
            except KeyringError:
                pass
            else:
                _in_memory.pop(name, None)
                return f"The token is saved in the system keychain ({keyring.get_keyring().name})."
        _in_memory[name] = token
        return f"{NO_KEYCHAIN[0].upper()}{NO_KEYCHAIN[1:]}."


def get_token(name: str = USER) -> str | None:
    """The token (default: for hub requests): the keychain's, else the one held for this
    process."""
    with _lock:
        if name in _in_memory:
            return _in_memory[name]
        if not keychain_available():
            return None
        try:
            return keyring.get_password(SERVICE, name)
        except KeyringError:
            return None


def delete_token(name: str = USER) -> None:
    """Forget the token everywhere Stoke keeps it."""
    with _lock:
        _in_memory.pop(name, None)
        if keychain_available():
            with contextlib.suppress(KeyringError):  # nothing stored is fine
                keyring.delete_password(SERVICE, name)
