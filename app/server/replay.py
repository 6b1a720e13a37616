"""Exact-reply replay: the replies this server produced, so a stateless client's history is
tokenized with the tokens the model actually sampled.

An OpenAI client sends the whole conversation as text every turn. Re-tokenizing a reply's
text rarely gives the sampled ids back (and a client may drop the reasoning or trim the
text), so the prompt would diverge from the KV the engine holds right after the previous
turn's prompt, and everything after it would be prefilled again. The store maps the text a
client saw to the exact ids, reasoning included.

The rules, in the order they are tried, for one assistant message of an incoming history:

1. Exact: its text equals a stored reply's full text (reasoning inline, as generated).
2. Reasoning dropped: its text equals a stored reply's content (what follows the reasoning);
   the reply's full ids are used, reasoning included. If the client sent the reasoning back
   (`reasoning_content` or `reasoning`), it must equal the stored reasoning, up to
   surrounding whitespace; otherwise the message does not match.
3. Trimmed: rules 1 and 2 again with leading and trailing whitespace stripped from both
   sides (clients often `.strip()` replies).
4. Tool calls: a message with `tool_calls` matches a reply that made the same calls, by name
   and canonical arguments (parsed JSON, keys sorted: re-serialized, reordered or re-spaced
   arguments match; call ids are ignored, clients rewrite them), with the same content up to
   surrounding whitespace; reasoning as in rule 2. Only this rule applies to such a message.
5. All reasoning: a reply cut before its reasoning ended has no content to match by. Sent
   back with its reasoning (`reasoning_content`, or inline after `<think>`), it matches by
   the reasoning, up to surrounding whitespace; sent back empty (the reasoning dropped), it
   matches the reply that answered the very prompt the history before it renders to (its
   position: an empty message stands for nothing else).
6. No match: the message's text is tokenized (a tool call written in the model's own syntax);
   from there on the prompt is new to the KV.

When two replies share a key the newer one wins. Entries belong to one model fingerprint:
another model's ids would mean other tokens, so the transcript ignores them.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from app.toolcalls.reasoning import THINK_CLOSE, THINK_OPEN

MAX_REPLIES = 8192  # ~4 keys each; ids of a typical reply are a few KiB


@dataclass(frozen=True)
class StoredReply:
    tokens: tuple[int, ...]
    fingerprint: str
    reasoning: str  # "" when the reply had none


def _key(kind: str, text: str) -> bytes:
    return hashlib.sha256(f"{kind}\0{text}".encode()).digest()


class ReplyStore:
    """Text a client saw -> the exact ids of the reply. In memory; keeps the newest
    `max_replies` or more (each reply is filed under up to four keys)."""

    def __init__(self, max_replies: int = MAX_REPLIES) -> None:
        self._entries: OrderedDict[bytes, StoredReply] = OrderedDict()
        self._max_keys = 4 * max_replies

    def __len__(self) -> int:
        return len(self._entries)

    def put(
        self,
        text: str,
        tokens: Sequence[int],
        fingerprint: str,
        *,
        reasoning: str = "",
        content: str | None = None,
        calls: str | None = None,
        prompt: Sequence[int] = (),
    ) -> None:
        """Remember a reply: its full text, and its content when reasoning was split off; a
        reply that made tool calls only under `calls` (calls_key); one that is all reasoning
        also under its reasoning and the `prompt` it answered (rule 5)."""
        reply = StoredReply(tuple(tokens), fingerprint, reasoning.strip())
        keys = [_key("full", text), _key("full-trim", text.strip())]
        if content is not None and content.strip() and content != text:
            keys += [_key("content", content), _key("content-trim", content.strip())]
        if content is not None and not content.strip() and reasoning.strip():
            keys += [_key("reasoning", reasoning.strip()), answering(prompt)]
        if calls is not None:
            keys = [_key("calls", calls)]
        for key in keys:
            self._entries[key] = reply
            self._entries.move_to_end(key)
        while len(self._entries) > self._max_keys:
            self._entries.popitem(last=False)

    def find(
        self,
        text: str,
        reasoning: str | None = None,
        calls: str | None = None,
        prompt: Callable[[], Sequence[int]] | None = None,
    ) -> StoredReply | None:
        """The stored reply an assistant message stands for (rules in the module doc);
        `prompt` gives the tokens the history before the message renders to (rule 5)."""
        probes = (
            [("calls", calls)]
            if calls is not None
            else [
                ("full", text),
                ("content", text),
                ("full-trim", text.strip()),
                ("content-trim", text.strip()),
            ]
        )
        for kind, probe in probes:
            reply = self._entries.get(_key(kind, probe))
            if reply is None:
                continue
            if (
                kind != "full"
                and kind != "full-trim"
                and reasoning
                and (reasoning.strip() != reply.reasoning)
            ):
                return None
            self._entries.move_to_end(_key(kind, probe))
            return reply
        return None if calls is not None else self._all_reasoning(text, reasoning, prompt)

    def _all_reasoning(
        self, text: str, reasoning: str | None, prompt: Callable[[], Sequence[int]] | None
    ) -> StoredReply | None:
        """Rule 5: a reply that was all reasoning, by its reasoning or by its position."""
        inline = text.strip()
        if inline.startswith(THINK_OPEN):
            inline = inline.removeprefix(THINK_OPEN).removesuffix(THINK_CLOSE).strip()
        elif inline:
            return None  # an answer the client wrote or changed: not a reply of ours
        said = (reasoning or "").strip() or inline
        if said:
            key = _key("reasoning", said)
        elif prompt is not None:
            key = answering(prompt())
        else:
            return None
        reply = self._entries.get(key)
        if reply is not None:
            self._entries.move_to_end(key)
        return reply


def answering(prompt: Sequence[int]) -> bytes:
    """The key of the reply to `prompt` (its tokens, generation prompt included)."""
    return _key("after", ",".join(map(str, prompt)))


def calls_key(content: str, calls: Sequence[str]) -> str:
    """A tool-call reply's key: its content, trimmed, and each call's canonical form."""
    return json.dumps([content.strip(), list(calls)], ensure_ascii=False)
