"""Tokenizers for remote engines: the server's own, and bytes for chat-messages mode.

Stoke builds every prompt as tokens (engine/transcript.py). Against a server that takes
token prompts, those must be the served model's tokens: from a local GGUF of the same model
(vocab only, llama.cpp's own ids) or from the server's tokenize endpoint (ServerTokenizer).

A server that only takes chat messages gets them back out of the transcript: in that mode the
"tokens" are UTF-8 bytes plus the marker ids of the wire template (engine/remote_wire.py),
which delimit messages. The transcript stays append-only and the reply's bytes are exactly
the text the server sent, but what the server's cache sees is its own rendering of the
messages, so prefix reuse there is up to the server, not guaranteed by Stoke.
"""

from __future__ import annotations

from collections.abc import Sequence

from app.engine.remote_http import RemoteError, RemoteHTTP
from app.engine.remote_wire import MARKERS

BYTES_FINGERPRINT = "utf8-bytes-v1"  # stored reply ids that are bytes, valid for any chat server
_MARKER_TEXT = {v: k for k, v in MARKERS.items()}


class ByteTokenizer:
    """UTF-8 bytes as ids 0-255; with `special`, the wire template's markers (256 on)."""

    def tokenize(self, text: str, *, special: bool = False) -> list[int]:
        if not special:
            return list(text.encode("utf-8"))
        ids: list[int] = []
        i = 0
        while i < len(text):
            at = text.find("<|stoke:", i)
            end = text.find("|>", at) + 2 if at >= 0 else -1
            if at < 0 or text[at:end] not in MARKERS:
                stop = len(text) if at < 0 else at + 1
                ids.extend(text[i:stop].encode("utf-8"))
                i = stop
                continue
            ids.extend(text[i:at].encode("utf-8"))
            ids.append(MARKERS[text[at:end]])
            i = end
        return ids

    def detokenize(self, tokens: Sequence[int]) -> str:
        out = bytearray()
        for t in tokens:
            out.extend(_MARKER_TEXT[t].encode() if t in _MARKER_TEXT else bytes((t,)))
        return out.decode("utf-8", "replace")


class ServerTokenizer:
    """The server's tokenizer over HTTP: llama-server's (and Stoke's) /tokenize and
    /detokenize, else llama-cpp-python's /extras/ twins. One round trip per call, so a
    transcript tokenizes each new segment once, not per keystroke."""

    def __init__(self, http: RemoteHTTP, model: str | None = None) -> None:
        self.http = http
        self.model = model
        self._extras: bool | None = None  # which endpoint family answered
        self._lead: list[int] | None = None  # what /extras/tokenize prepends (BOS) to text

    def tokenize(self, text: str, *, special: bool = False, add_special: bool = False) -> list[int]:
        """Tokens of `text`. /extras/tokenize always parses control tokens and adds BOS
        where the model wants it; the BOS is stripped here, the parsing cannot be avoided."""
        if not self._use_extras():
            body = {"content": text, "add_special": add_special, "parse_special": special}
            return _ids(self.http.post("/tokenize", body))
        ids = self._extras_tokenize(text)
        lead = self._extras_lead()
        if not add_special and lead and ids[: len(lead)] == lead:
            ids = ids[len(lead) :]
        return ids

    def detokenize(self, tokens: Sequence[int]) -> str:
        path = "/extras/detokenize" if self._use_extras() else "/detokenize"
        body: dict = {"tokens": list(tokens)}
        if self.model and path.startswith("/extras"):
            body["model"] = self.model
        answer = self.http.post(path, body)
        text = answer.get("content", answer.get("text")) if isinstance(answer, dict) else None
        if not isinstance(text, str):
            raise RemoteError(f"The server at {self.http.url} sent no text from {path}.")
        return text

    def _use_extras(self) -> bool:
        """Whether the server has only llama-cpp-python's /extras/ endpoints (asked once)."""
        if self._extras is None:
            try:
                self.http.post("/tokenize", {"content": ""})
            except RemoteError as exc:
                if exc.status != 404:
                    raise
                self._extras = True
            else:
                self._extras = False
        return self._extras

    def _extras_tokenize(self, text: str) -> list[int]:
        body = {"input": text}
        if self.model:
            body["model"] = self.model
        return _ids(self.http.post("/extras/tokenize", body))

    def _extras_lead(self) -> list[int]:
        if self._lead is None:
            self._lead = self._extras_tokenize("")
        return self._lead


def _ids(answer: object) -> list[int]:
    tokens = answer.get("tokens") if isinstance(answer, dict) else None
    if not isinstance(tokens, list):
        raise RemoteError("The server's tokenize answer has no token list.")
    return [int(t["id"]) if isinstance(t, dict) else int(t) for t in tokens]
