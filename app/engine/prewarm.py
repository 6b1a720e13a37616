"""Background prefill: the KV is warm before the user presses Enter.

Everything here runs below a user's send: opening a conversation restores or prefills its
history, attaching a file prefills it at once and typing prefills the stable part of the
draft after it (debounced), and after a reply or when switching away the conversation is
snapshotted. Each prefill's token count is handed to `on_count` as soon as it is known (the
window's context meter), so nothing tokenizes the draft a second time; while a draft with
files is prefilled, `on_files` hears how far each file is read, chunk by chunk (the chips'
"reading" and "ready"). Every request can be cancelled, and the engine host preempts a
running prefill when a send arrives.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.engine.host import EngineClient, Priority
from app.engine.kvstore import common_prefix
from app.engine.protocol import (
    USER_CHUNK,
    EngineError,
    FinishReason,
    GenerationStats,
    PrefillProgress,
    ProgressCallback,
)

log = logging.getLogger("stoke.prewarm")

DEBOUNCE_S = 0.3  # a pause in typing this long prefills the draft
MAX_WAIT_S = 1.5  # and while typing goes on, at least this often
_STABLE = re.compile(r"(.*\S)\s+\S*\Z", re.DOTALL)


def stable_prefix(draft: str) -> str:
    """The draft up to its last complete word: the part typing will not change any more.
    (Tokenizers attach a space to the word after it, so the space is left out too.)"""
    match = _STABLE.match(draft)
    return match.group(1) if match else ""


FilesListener = Callable[[str, Sequence[Mapping], list[PrefillProgress]], None]


@dataclass
class _FilesRead:
    """A draft's files in its prompt: the prompt through them, each one's (start, end), and
    how many of those tokens the last prefill had read."""

    prefix: list[int]
    spans: list[tuple[int, int]]
    done: int = 0

    def starts(self, tokens: list[int]) -> bool:
        """Whether `tokens` hold these files where they were (typing comes after them)."""
        return tokens[: len(self.prefix)] == self.prefix

    def files(self) -> list[PrefillProgress]:
        """How far each file is read, in its own tokens."""
        return [
            PrefillProgress(min(max(self.done - start, 0), end - start), end - start)
            for start, end in self.spans
        ]


class Prewarmer:
    """Schedules background prefills and snapshots for the conversations of one session.

    `session` is anything with `engine: EngineClient`, `images_ready(id, attachments)` (the
    images registered with the projector), `history_tokens(id)`, `draft_tokens(id, text,
    attachments)` and, for `on_files`, `draft_spans(id, attachments)` (the ChatSession).
    """

    def __init__(
        self, session: Any, *, debounce_s: float = DEBOUNCE_S, max_wait_s: float = MAX_WAIT_S
    ) -> None:
        self.session = session
        self.debounce_s = debounce_s
        self.max_wait_s = max_wait_s
        self._due: dict[str, float] = {}  # conversation -> latest time its draft prefill runs
        self._tasks: dict[tuple[str, str, int], asyncio.Task] = {}  # (kind, conversation, n)
        self._ids = itertools.count()
        self.last: dict[str, GenerationStats] = {}  # conversation -> last prefill's stats
        # (conversation, tokens of its history, attachments and draft as last tokenized)
        self.on_count: Callable[[str, int], None] | None = None
        # (conversation, its draft's files, how far each is read: done of its tokens)
        self.on_files: FilesListener | None = None
        self._files_read: dict[str, _FilesRead] = {}  # conversation -> its draft's files

    @property
    def engine(self) -> EngineClient:
        return self.session.engine

    def open(self, conversation_id: str) -> asyncio.Task:
        """Restore the conversation's snapshot, or prefill its history."""
        return self._start("open", conversation_id, self._prefill_history(conversation_id))

    def draft_changed(
        self, conversation_id: str, draft: str, attachments: Sequence[Mapping] = ()
    ) -> asyncio.Task:
        """Prefill the attachments and the draft's stable prefix once typing pauses for
        `debounce_s`, and at least every `max_wait_s` while it goes on (keystrokes come
        faster than any pause)."""
        now = asyncio.get_running_loop().time()
        due = self._due.setdefault(conversation_id, now + self.max_wait_s)
        delay = max(0.0, min(self.debounce_s, due - now))
        work = self._prefill_draft(conversation_id, draft, tuple(attachments), delay)
        return self._start("draft", conversation_id, work)

    def attached(
        self, conversation_id: str, draft: str, attachments: Sequence[Mapping]
    ) -> asyncio.Task:
        """A file was attached or removed: prefill at once, before any question is typed."""
        self._due.pop(conversation_id, None)
        work = self._prefill_draft(conversation_id, draft, tuple(attachments), 0.0)
        return self._start("draft", conversation_id, work)

    def after_reply(self, conversation_id: str) -> asyncio.Task:
        return self._start("snapshot", conversation_id, self._snapshot(conversation_id))

    def switch_away(self, conversation_id: str) -> asyncio.Task:
        self.cancel(conversation_id)
        return self.after_reply(conversation_id)

    async def startup(self, conversation_id: str | None) -> None:
        """At start-up, warm the most recent conversation (restored from disk if saved)."""
        if conversation_id is not None:
            self.open(conversation_id)

    def cancel(self, conversation_id: str | None = None) -> None:
        """Drop pending prefills (of one conversation, or all), e.g. right before a send."""
        for (kind, conv, _), task in list(self._tasks.items()):
            if kind != "snapshot" and conversation_id in (None, conv):
                task.cancel()
                if kind == "draft":
                    self._due.pop(conv, None)  # the next keystroke is debounced afresh

    async def idle(self) -> None:
        """Wait until every scheduled prefill and snapshot has finished. (Waiting is not
        joining: cancelling this wait leaves the work running.)"""
        while self._tasks:
            await asyncio.wait(list(self._tasks.values()))

    # -- the work --

    def _start(self, kind: str, conversation_id: str, work: Coroutine) -> asyncio.Task:
        """Schedule `work`; a new prefill of a kind supersedes the pending one, while every
        snapshot runs to its end."""
        if kind != "snapshot":
            for (other, conv, _), task in list(self._tasks.items()):
                if (other, conv) == (kind, conversation_id):
                    task.cancel()
        key = (kind, conversation_id, next(self._ids))
        task = asyncio.get_running_loop().create_task(self._guard(work))
        self._tasks[key] = task
        task.add_done_callback(lambda _done: self._tasks.pop(key, None))
        task.add_done_callback(lambda _done: work.close())  # cancelled before it started
        return task

    @staticmethod
    async def _guard(work: Coroutine) -> None:
        """Background work never raises into the app: a failure is logged and dropped."""
        try:
            await work
        except EngineError as exc:
            log.info("prewarm skipped: %s", exc)

    async def _prefill_history(self, conversation_id: str) -> None:
        await self.engine.ready()
        await self.session.images_ready(conversation_id)
        tokens = self.session.history_tokens(conversation_id)
        self._count(conversation_id, tokens)
        if tokens:
            self.last[conversation_id] = await self.engine.prefill(
                tokens, slot=conversation_id, priority=Priority.BACKGROUND
            )

    async def _prefill_draft(
        self, conversation_id: str, draft: str, attachments: tuple[Mapping, ...], delay: float
    ) -> None:
        await asyncio.sleep(delay)
        self._due.pop(conversation_id, None)
        stable = stable_prefix(draft)
        if not stable and not attachments:  # the history alone, already prefilled
            if self.on_count is not None:
                self._count(conversation_id, self.session.history_tokens(conversation_id))
            return
        await self.engine.ready()
        await self.session.images_ready(conversation_id, attachments)  # read on attach
        tokens = self.session.draft_tokens(conversation_id, stable, attachments)
        self._count(conversation_id, tokens)
        heard = self._files_heard(conversation_id, tokens, attachments)
        stats = await self.engine.prefill(
            tokens,
            slot=conversation_id,
            priority=Priority.TYPING,
            on_progress=heard,
            prefill_chunk=USER_CHUNK if heard else 0,  # progress the chips can show
        )
        if heard is not None and stats.finish_reason == FinishReason.PREFILLED:
            heard(PrefillProgress(len(tokens), len(tokens)))  # all read (or reused: no chunk)
        self.last[conversation_id] = stats

    def _files_heard(
        self, conversation_id: str, tokens: list[int], attachments: tuple[Mapping, ...]
    ) -> ProgressCallback | None:
        """The draft prefill's progress as each file's: (done, of) of the file's own span,
        for `on_files`, told at once what earlier prefills read of them (a file read stays
        "ready" while the question is typed; a new one says "reading" before the engine's
        first chunk); None when no one listens or there are no files."""
        listener = self.on_files
        if listener is None or not attachments:
            return None
        read = self._files_read.get(conversation_id)
        if read is None or len(read.spans) != len(attachments) or not read.starts(tokens):
            spans = self.session.draft_spans(conversation_id, attachments)  # files changed
            prefix = tokens[: spans[-1][1]]
            held = common_prefix(read.prefix[: read.done], prefix) if read is not None else 0
            read = self._files_read[conversation_id] = _FilesRead(prefix, spans, held)

        def heard(progress: PrefillProgress) -> None:
            read.done = min(progress.done, len(read.prefix))
            listener(conversation_id, attachments, read.files())

        heard(PrefillProgress(read.done, len(tokens)))
        return heard

    def _count(self, conversation_id: str, tokens: list[int]) -> None:
        if self.on_count is not None:
            self.on_count(conversation_id, len(tokens))

    async def _snapshot(self, conversation_id: str) -> None:
        await self.engine.snapshot(conversation_id, priority=Priority.BACKGROUND)
