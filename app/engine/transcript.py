"""Token-exact prompts: every follow-up turn is the previous prompt with tokens appended.

A conversation's prompt is a list of segments. A reply segment is the exact token ids the
model sampled (reasoning included), never a re-tokenization of its text. Every other segment
is a delta of the model's own chat template: the template is rendered with each message's
content replaced by a unique sentinel, and the text after the previous reply's sentinel is
the next segment (end-of-turn, the new user turn, the generation prompt). A segment depends
only on the messages before it, so rendering the history once or turn by turn gives the same
tokens: turn N+1's prompt extends turn N's by construction, and the KV prefix always matches.

Content is tokenized without parsing control tokens, so a user who types "<|im_end|>" gets
text, not a turn boundary. Template text is tokenized with them.
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from app.engine.chat_template import ChatTemplate, TemplateError

Role = Literal["system", "user", "assistant", "tool"]
IMAGE_MARK = "\ufffc"  # where an image stands in a message's text (Unicode's object mark)


class Tokenizer(Protocol):
    def tokenize(self, text: str, *, special: bool = False) -> list[int]: ...


@dataclass(frozen=True)
class Turn:
    """One message of the history; `tokens` are a reply's sampled ids under `fingerprint`."""

    role: Role
    text: str
    tokens: tuple[int, ...] | None = None
    fingerprint: str | None = None
    fields: tuple[tuple[str, str], ...] = ()  # more for the template: a tool result's call id
    # A message's images, in order: each one's ids (the engine's `image_run`), standing where
    # IMAGE_MARK stands in `text`.
    images: tuple[tuple[int, ...], ...] = ()

    def content_tokens(self, tokenizer: Tokenizer) -> tuple[int, ...]:
        """The message's content as the prompt holds it: its text, with each image's run
        where its mark stands."""
        if not self.images:
            return tuple(tokenizer.tokenize(self.text))
        pieces = self.text.split(IMAGE_MARK)
        if len(pieces) != len(self.images) + 1:
            raise ValueError("a message's image marks and its images must agree")
        ids: list[int] = []
        for piece, run in zip(pieces, (*self.images, ()), strict=True):
            ids += tokenizer.tokenize(piece) if piece else []
            ids += run
        return tuple(ids)


@dataclass(frozen=True)
class Segment:
    role: Role | Literal["template"]
    tokens: tuple[int, ...]


@dataclass
class Transcript:
    """The token-exact prompt of one conversation branch under one model and template."""

    template: ChatTemplate
    tokenizer: Tokenizer
    fingerprint: str
    bos_id: int | None = None
    add_bos: bool = False
    turns: list[Turn] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)  # up to and including the last reply
    rebuilt_replies: int = 0  # replies re-tokenized from text: made under another model
    _open: list[Segment] = field(default_factory=list)  # messages since the last reply
    _open_turns: int = 0  # len(turns) when _open was computed

    @classmethod
    def from_turns(
        cls,
        turns: Sequence[Turn],
        *,
        template: ChatTemplate,
        tokenizer: Tokenizer,
        fingerprint: str,
        bos_id: int | None = None,
        add_bos: bool = False,
    ) -> Transcript:
        """Build the prompt of a stored history, reusing exact reply tokens of this model."""
        transcript = cls(template, tokenizer, fingerprint, bos_id, add_bos)
        for turn in turns:
            if turn.role == "assistant":
                transcript.add_reply(turn.text, turn.tokens, turn.fingerprint)
            else:
                transcript.add_message(turn.role, turn.text, turn.fields, turn.images)
        return transcript

    @property
    def tokens(self) -> list[int]:
        """The history's tokens: through the last reply, then any messages since."""
        return [t for segment in (*self.segments, *self._open) for t in segment.tokens]

    def add_message(
        self,
        role: Role,
        text: str,
        fields: tuple[tuple[str, str], ...] = (),
        images: tuple[tuple[int, ...], ...] = (),
    ) -> None:
        """Record a system, user or tool message (with its images' runs, `Turn.images`); its
        tokens come with the next prompt()."""
        if role == "assistant":
            raise ValueError("use add_reply for assistant turns")
        self.turns.append(Turn(role, text, fields=fields, images=images))

    def prompt(self) -> list[int]:
        """The tokens to send for the next reply: history plus the generation prompt."""
        if not self.turns or self.turns[-1].role == "assistant":
            raise ValueError("the next reply needs a user message first")
        if self._open_turns != len(self.turns):
            self._open = self._delta()
            self._open_turns = len(self.turns)
        return self.tokens

    def rewind(self, n_turns: int) -> None:
        """Keep only the first `n_turns` turns (a branch point): the segments through the
        last kept reply stay as they were, so the shared prefix keeps its exact tokens."""
        del self.turns[n_turns:]
        replies = sum(1 for turn in self.turns if turn.role == "assistant")
        seen = 0
        for i, segment in enumerate(self.segments):
            if segment.role == "assistant":
                seen += 1
                if seen == replies:
                    del self.segments[i + 1 :]
                    break
        else:
            self.segments.clear()
        self._open = []
        self._open_turns = -1

    def copy(self) -> Transcript:
        """An independent transcript in the same state (segments are immutable, so shared):
        what a caller extends without touching the original."""
        return dataclasses.replace(
            self, turns=list(self.turns), segments=list(self.segments), _open=list(self._open)
        )

    def preview(self, text: str, images: tuple[tuple[int, ...], ...] = ()) -> list[int]:
        """The tokens a prompt would start with if `text` (with `images`, `Turn.images`) were
        sent now as a user message, through the end of its content: what prefilling a draft
        can do ahead of the send."""
        probe = Transcript(
            self.template,
            self.tokenizer,
            self.fingerprint,
            self.bos_id,
            self.add_bos,
            list(self.turns),
            list(self.segments),
        )
        probe.add_message("user", text, images=images)
        probe.prompt()
        last_user = max(i for i, s in enumerate(probe._open) if s.role == "user")
        return [t for s in (*probe.segments, *probe._open[: last_user + 1]) for t in s.tokens]

    def add_reply(
        self,
        text: str,
        tokens: Sequence[int] | None = None,
        fingerprint: str | None = None,
    ) -> None:
        """Append a reply: its exact sampled ids when made by this model, else its text."""
        self.prompt()
        if tokens is not None and fingerprint == self.fingerprint:
            reply = tuple(tokens)
        else:
            reply = tuple(self.tokenizer.tokenize(text, special=False))
            self.rebuilt_replies += 1
        self.turns.append(Turn("assistant", text, reply, self.fingerprint))
        self.segments.extend(self._open)
        self.segments.append(Segment("assistant", reply))
        self._open = []
        self._open_turns = len(self.turns)

    def _delta(self) -> list[Segment]:
        """Segments for the turns after the last reply, from one render with sentinels."""
        tag = uuid.uuid4().hex  # private-use delimiters: a template's `| trim` keeps them
        sentinels = [f"\ue000{tag}{i}\ue001" for i in range(len(self.turns))]
        messages = [
            {**dict(t.fields), "role": t.role, "content": s}
            for t, s in zip(self.turns, sentinels, strict=False)
        ]
        text = self.template.render(messages, add_generation_prompt=True)
        start = 0
        last_reply = max((i for i, t in enumerate(self.turns) if t.role == "assistant"), default=-1)
        if last_reply >= 0:
            at = text.find(sentinels[last_reply])
            if at < 0:
                raise TemplateError("the chat template dropped an earlier reply")
            start = at + len(sentinels[last_reply])
        segments: list[Segment] = []
        bos_text = self.template.bos_token
        bos_rendered = bool(bos_text) and text.startswith(bos_text)
        if last_reply < 0 and self.add_bos and self.bos_id is not None and not bos_rendered:
            segments.append(Segment("template", (self.bos_id,)))
        for i, part in enumerate(re.split(f"\ue000{tag}(\\d+)\ue001", text[start:])):
            if i % 2 == 0:
                if part:
                    ids = self.tokenizer.tokenize(part, special=True)
                    segments.append(Segment("template", tuple(ids)))
                continue
            turn = self.turns[int(part)]
            if turn.role == "assistant":
                raise TemplateError("the chat template moved an earlier reply")
            segments.append(Segment(turn.role, turn.content_tokens(self.tokenizer)))
        return segments
