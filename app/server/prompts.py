"""Chat histories to prompt tokens: the app's Transcript, with this server's replies as their
exact ids (replay.py), extended from the last request's transcript where it can be.

A stateless client sends the whole history every turn. Building the transcript afresh
renders the template once per reply in it, so a long agent conversation would cost seconds
of the event loop per request; keeping the transcript as it stood at the last assistant
message of each recent request (keyed by a running hash of the messages) means a follow-up
renders only what it adds.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

from app.engine.chat_template import ChatTemplate
from app.engine.protocol import ModelInfo
from app.engine.transcript import Tokenizer, Transcript
from app.server.replay import ReplyStore
from app.server.schema import Message

MAX_CACHED = 64  # conversations whose transcript is kept


class ChatPrompts:
    def __init__(self, replies: ReplyStore, max_cached: int = MAX_CACHED) -> None:
        self.replies = replies
        self._cached: OrderedDict[bytes, Transcript] = OrderedDict()
        self._max_cached = max_cached

    def build(
        self,
        messages: Sequence[Message],
        template: ChatTemplate,
        info: ModelInfo,
        tokenizer: Tokenizer,
    ) -> list[int]:
        """The prompt tokens for `messages` (the last one not the assistant's)."""
        running = hashlib.sha256(repr((template.key, info.fingerprint)).encode())
        keys = []
        for message in messages:
            running.update(repr((message.role, message.text, message.reasoning)).encode())
            keys.append(running.copy().digest())
        start, transcript = 0, None
        for i in range(len(messages) - 1, -1, -1):
            if messages[i].role == "assistant" and keys[i] in self._cached:
                transcript, start = self._cached[keys[i]].copy(), i + 1
                self._cached.move_to_end(keys[i])
                break
        if transcript is None:
            transcript = Transcript(
                template, tokenizer, info.fingerprint, bos_id=info.bos_id, add_bos=info.add_bos
            )
        last_reply = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=-1)
        for i in range(start, len(messages)):
            message = messages[i]
            if message.role != "assistant":
                transcript.add_message(message.role, message.text)
                continue
            stored = self.replies.find(message.text, message.reasoning)
            if stored is None:
                transcript.add_reply(message.text)
            else:
                transcript.add_reply(message.text, stored.tokens, stored.fingerprint)
            if i == last_reply:  # where the next turn of this conversation picks up
                self._cached[keys[i]] = transcript.copy()
                while len(self._cached) > self._max_cached:
                    self._cached.popitem(last=False)
        return transcript.prompt()
