"""One chat turn, end to end: store the message, build the exact prompt, stream and save.

The order is what keeps promises: a turn first holds its conversation (another process's
turn on it is waited for, so turns never interleave); the user's message is committed
before the engine is waited for or even started; the reply is saved while it streams (every
`SAVE_INTERVAL_S`), so a crash leaves it marked interrupted, never lost, and a full disk
leaves it in memory until there is room; and the prompt comes from the conversation's
Transcript, so each turn appends to the tokens the engine already holds. A message's pictures
(image attachments, kept by content hash) are registered with the model's projector before
its prompt is built (`read_images`, once per load), so each is the same run of ids every
turn and a follow-up reuses the KV through it. The CLI and the window both drive turns
through ChatSession; it knows nothing of terminals or Qt.

Tool calls and results (imported, or recorded from the API) go to the template as the server
sends them: a result is a `tool` message naming its call, and a reply's calls are its exact
tokens when this model made them, else written in the model family's syntax (app/toolcalls/,
the mechanism the server uses too). The tool loop (app/tool_loop.py) runs its rounds through
`hold_turn` and `reply`: the tools told in the system prompt or the template's variables (part
of the cached transcript's key, so each round extends the last), a grammar when a round must
call, and `finish`, which stores a reply's calls in its last write; `cancel` also stops the
call the loop waits on (`cancels`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass
from typing import Any

from app.conversations import (
    Conversation,
    ConversationBusyError,
    ConversationStore,
    Message,
    StoreError,
    StoreFullError,
)
from app.conversations.attachments import is_image
from app.conversations.images import ImageFileError, image_bytes
from app.conversations.served import Kept, ServedTurn, keep
from app.engine.chat_template import ChatTemplate
from app.engine.host import EngineClient, EngineCrashedError, EngineState, Generation
from app.engine.images import ImageGoneError
from app.engine.protocol import (
    USER_CHUNK,
    ContextOverflowError,
    EngineError,
    FinishReason,
    GenerationStats,
    ModelInfo,
    PrefillProgress,
    SamplingParams,
    TokenEvent,
)
from app.engine.transcript import IMAGE_MARK, Transcript, Turn
from app.toolcalls.prompt import ToolPrompt
from app.toolcalls.syntax import syntax_for
from app.toolcalls.tools import ToolCall

SAVE_INTERVAL_S = 0.1
TURN_POLL_S = 0.1  # how often a turn waiting on another process's turn looks again
DEFAULT_MAX_TOKENS = 1024
REPLY_ROOM = 0.25  # share of the context kept free for the reply when dropping old turns


class MessageTooLongError(ContextOverflowError):
    """The last message alone, with room for a reply, is too long for the context: only a
    shorter message or a larger context can help, never leaving older turns out."""

    def __init__(self, prompt_tokens: int, n_ctx: int, message: str | None = None) -> None:
        super().__init__(
            prompt_tokens,
            n_ctx,
            message
            or (
                f"Your message alone is {prompt_tokens:,} tokens, too long for the context of "
                f"{n_ctx:,} tokens with room for a reply. Shorten it, or load the model with "
                "a larger context."
            ),
        )


class EmptyMessageError(EngineError):
    def __init__(self) -> None:
        super().__init__("The message is empty. Type something to send.")


class ReplyNotSavedError(StoreError):
    """The disk filled up under a reply. The session keeps the reply and writes it before its
    next turn; `reply` carries the text so it can also be shown to copy."""

    def __init__(self, full: StoreFullError, reply: str) -> None:
        super().__init__(f"{full} The reply could not be saved yet.")
        self.reply = reply


@dataclass(frozen=True)
class TurnResult:
    conversation_id: str
    user_message_id: str
    reply_message_id: str
    text: str
    token_ids: list[int]
    stats: GenerationStats | None
    status: str  # complete | interrupted
    dropped_turns: int = 0

    def as_dict(self) -> dict[str, object]:
        return {
            "conversation_id": self.conversation_id,
            "user_message_id": self.user_message_id,
            "reply_message_id": self.reply_message_id,
            "reply": self.text,
            "status": self.status,
            "dropped_turns": self.dropped_turns,
            "stats": self.stats.as_dict() if self.stats else None,
        }


OnToken = Callable[[TokenEvent], None]
OnStart = Callable[[Message, Message], None]  # (user message, reply being written)
# A reply's whole text -> the fields its last write adds (a tool round: the content shown and
# the calls), so a reply and what it means are stored in one write.
Finish = Callable[[str], Mapping[str, Any]]


@dataclass(frozen=True)
class _Partial:
    """What a reply already holds before generation carries on (empty for a new reply)."""

    text: str
    tokens: list[int]


@dataclass
class _Cached:
    """A conversation's last transcript and the message ids (root first) it covers."""

    ids: list[str]
    system_prompt: str | None
    transcript: Transcript


def user_content(text: str, attachments: Sequence[Mapping] = ()) -> str:
    """A user message as the model reads it: each attached file's text in a tagged block, or
    an image's mark (its run of ids goes there, `Turn.images`), then what the user typed. The
    one rendering rule for sending, prefilling and rebuilding, so a file prefilled the moment
    it is attached is the prefix the turn sends (blocks end in one newline, which the
    tokenizers keep apart from the words typed after it)."""
    images = any(is_image(a) for a in attachments)

    def plain(words: str) -> str:
        """Beside images, a mark in the words (typed, or in a PDF's text) stands for none."""
        return words.replace(IMAGE_MARK, "") if images else words

    blocks = [
        IMAGE_MARK + "\n"
        if is_image(a)
        else f'<file name="{a["name"]}">\n{plain(a["text"])}\n</file>\n'
        for a in attachments
    ]
    return "".join(blocks) + plain(text)


def _system(conversation: Conversation, tools: ToolPrompt | None) -> str | None:
    """The system prompt the model reads: the conversation's, with the tools' block."""
    return conversation.system_prompt if tools is None else tools.system(conversation.system_prompt)


def sampling_of(conversation: Conversation) -> tuple[SamplingParams, int]:
    """The conversation's sampling settings over the defaults, and its max tokens."""
    settings = dict(conversation.sampling)
    max_tokens = int(settings.pop("max_tokens", DEFAULT_MAX_TOKENS))
    known = {
        k: settings[k] for k in ("temperature", "top_p", "min_p", "top_k", "seed") if k in settings
    }
    return SamplingParams(**known), max_tokens


def can_continue(reply: Message) -> bool:
    """An interrupted reply, or one cut at the length limit, can be carried on."""
    return reply.status == "interrupted" or (
        reply.status == "complete" and reply.finish_reason == str(FinishReason.LENGTH)
    )


def _budget(max_tokens: int, continuing: Message | None, held: int) -> int:
    """Tokens a reply may still draw: an interrupted one finishes its budget, one cut at the
    length limit gets a new one (the user asked for more)."""
    if continuing is not None and continuing.status == "complete":
        return max_tokens
    return max(1, max_tokens - held)


class ChatSession:
    """Turns for any conversation of one store, on one engine."""

    def __init__(self, store: ConversationStore, engine: EngineClient) -> None:
        self.store = store
        self.engine = engine
        self._transcripts: dict[str, _Cached] = {}  # by conversation id
        self._active: Generation | None = None
        self._unsaved: dict[str, dict[str, Any]] = {}  # reply id -> the write a full disk refused
        self._cancelled = False  # cancel() was called since the turn began
        self._waited_on: asyncio.Future | None = None  # work a turn awaits that cancel() stops
        # (reply id, progress) while a reply's prompt is read: the window shows it
        self.on_progress: Callable[[str, PrefillProgress], None] | None = None
        # each image's run of ids (by digest), registered with the projector of the load
        # `_runs_of` (a new load or a restarted engine has registered none)
        self._runs: dict[str, tuple[int, ...]] = {}
        self._runs_of: ModelInfo | None = None

    @property
    def info(self) -> ModelInfo:
        if self.engine.info is None:
            raise EngineError("The engine has no model loaded yet.")
        return self.engine.info

    def cancel(self) -> None:
        """Stop the reply being generated, if any (it is kept and marked interrupted), the
        work the turn waits on (a tool call), or the wait for another process's turn."""
        self._cancelled = True
        if self._active is not None:
            self._active.cancel()
        if self._waited_on is not None:
            self._waited_on.cancel()

    @property
    def cancelled(self) -> bool:
        """Whether cancel() was called since the turn being run began."""
        return self._cancelled

    @contextmanager
    def cancels(self, work: asyncio.Future) -> Iterator[None]:
        """While inside, cancel() cancels `work` too: a tool call the turn waits on (at once,
        when the turn was cancelled before it began)."""
        self._waited_on = work
        if self._cancelled:
            work.cancel()
        try:
            yield
        finally:
            self._waited_on = None

    # -- turns --

    async def send(
        self,
        conversation_id: str,
        text: str,
        *,
        parent_id: str | None = None,
        drop_oldest: bool = False,
        on_token: OnToken | None = None,
        on_start: OnStart | None = None,
        attachments: list[dict] | None = None,
    ) -> TurnResult:
        """Add a user message (after `parent_id`, default the current leaf, read as it is
        written), with the records of its attached files, and reply to it. The message is
        on disk before the engine is waited for."""
        kwargs: dict[str, Any] = {
            "drop_oldest": drop_oldest,
            "on_token": on_token,
            "on_start": on_start,
        }
        if not text.strip():
            raise EmptyMessageError()
        async with self.hold_turn(conversation_id) as conversation:
            if parent_id is not None:
                return await self._post(conversation, parent_id, text, attachments, **kwargs)
            user = self.store.append_user_message(conversation.id, text, attachments)
            return await self.reply(conversation, user, **kwargs)

    async def _post(
        self,
        conversation: Conversation,
        parent_id: str | None,
        text: str,
        attachments: list[dict] | None = None,
        **kwargs: Any,
    ) -> TurnResult:
        """A user message after `parent_id` (None: a first message), then its reply."""
        if not text.strip():
            raise EmptyMessageError()
        user = self._unanswered(parent_id, text, attachments) or self.store.add_message(
            conversation.id, parent_id, "user", text, attachments=attachments
        )
        return await self.reply(conversation, user, **kwargs)

    def _unanswered(
        self, leaf_id: str | None, text: str, attachments: list[dict] | None
    ) -> Message | None:
        """The same message sent again after a turn that never started (context full):
        answer the stored one instead of adding a twin."""
        if leaf_id is None:
            return None
        leaf = self.store.get_message(leaf_id)
        same = leaf.content == text and leaf.attachments == (attachments or None)
        if leaf.role == "user" and same:
            return leaf
        return None

    async def edit(self, user_message_id: str, text: str, **kwargs: Any) -> TurnResult:
        """Edit-and-resend: a new user message beside the old one, then its reply."""
        old = self.store.get_message(user_message_id)
        if old.role != "user":
            raise EngineError("Only your own messages can be edited.")
        async with self.hold_turn(old.conversation_id) as conversation:
            return await self._post(conversation, old.parent_id, text, old.attachments, **kwargs)

    async def regenerate(self, reply_message_id: str, **kwargs: Any) -> TurnResult:
        """A new reply beside an old one, to the same user message."""
        old = self.store.get_message(reply_message_id)
        if old.role != "assistant" or old.parent_id is None:
            raise EngineError("Only a reply can be regenerated.")
        async with self.hold_turn(old.conversation_id) as conversation:
            user = self.store.get_message(old.parent_id)
            return await self.reply(conversation, user, **kwargs)

    async def continue_reply(self, reply_message_id: str, **kwargs: Any) -> TurnResult:
        """Carry on an interrupted reply, or one cut at the length limit, where it stopped:
        same message, more tokens."""
        old = self.store.get_message(reply_message_id)
        if old.role != "assistant" or not can_continue(old) or old.parent_id is None:
            raise EngineError("Only an interrupted reply can be continued.")
        async with self.hold_turn(old.conversation_id) as conversation:
            user = self.store.get_message(old.parent_id)
            return await self.reply(conversation, user, continuing=old, **kwargs)

    @asynccontextmanager
    async def hold_turn(self, conversation_id: str) -> AsyncIterator[Conversation]:
        """Hold the conversation for one turn, so turns of several processes (window, CLI,
        scripts) take their turns instead of interleaving; yields the conversation as it is
        once held. `cancel` stops the wait."""
        self._save_unsaved()
        self._cancelled = False
        while (holder := self.store.claim_turn(conversation_id)) is not None:
            if self._cancelled:
                raise ConversationBusyError(holder or None)
            await asyncio.sleep(TURN_POLL_S)
        try:
            yield self.store.get_conversation(conversation_id)
        finally:
            with suppress(StoreError):  # a full disk: closing the store gives it back too
                self.store.release_turn(conversation_id)

    def _save_unsaved(self) -> None:
        """Write the replies a full disk refused; while there is still no room this raises
        the full-disk error, so no turn starts on top of a reply not yet written."""
        for reply_id, update in list(self._unsaved.items()):
            self.store.update_message(reply_id, **update)
            del self._unsaved[reply_id]

    async def engine_ready(self) -> ModelInfo:
        """The loaded engine; one not started yet is started now, after the message is saved."""
        if self.engine.state == EngineState.STOPPED:
            return await self.engine.start()
        return await self.engine.ready()

    async def reply(
        self,
        conversation: Conversation,
        user: Message,
        *,
        drop_oldest: bool = False,
        continuing: Message | None = None,
        on_token: OnToken | None = None,
        on_start: OnStart | None = None,
        tools: ToolPrompt | None = None,
        grammar: str | None = None,
        finish: Finish | None = None,
    ) -> TurnResult:
        """A reply after `user` (the user's message, or a tool result in a tool loop), inside
        a turn held with hold_turn. `tools` are told to the model in its prompt, `grammar`
        constrains the reply, and `finish` adds fields to its last write when it completes."""
        info = await self.engine_ready()
        history = self.store.path_to(user.id)
        await self.read_images(a for m in history for a in m.attachments or ())
        transcript, dropped = self._fit(
            conversation, history, info, drop_oldest=drop_oldest, tools=tools
        )
        prompt = transcript.prompt()
        # through the last reply: what the conversation's KV held before this turn
        held = sum(len(segment.tokens) for segment in transcript.segments)
        sampling, max_tokens = sampling_of(conversation)
        if grammar is not None:
            sampling = dataclasses.replace(sampling, grammar=grammar)
        if continuing is None:
            reply = self.store.add_message(
                conversation.id,
                user.id,
                "assistant",
                "",
                status="streaming",
                tokens_fingerprint=info.fingerprint,
            )
            before = _Partial("", [])
        else:
            reply = continuing
            before = _Partial(reply.content, self._exact_tokens(reply, info))
            self.store.update_message(
                reply.id,
                token_ids=before.tokens,
                tokens_fingerprint=info.fingerprint,
                status="streaming",
            )
            self.store.set_current_leaf(conversation.id, reply.id)
        if on_start is not None:
            on_start(user, reply)
        stream = functools.partial(
            self._stream,
            reply,
            prompt + before.tokens,
            sampling,
            _budget(max_tokens, continuing, len(before.tokens)),
            slot=conversation.id,
            on_token=on_token,
            before=before,
            finish=finish,
            held=held,
        )
        try:
            text, tokens, stats, status = await stream()
        except ImageGoneError:  # others' pictures took its place: register them again, once
            self._runs_of = None
            await self.read_images(a for m in history for a in m.attachments or ())
            text, tokens, stats, status = await stream()
        cached = self._transcripts.get(conversation.id)
        if cached is not None and cached.transcript is transcript and cached.ids[-1] == user.id:
            transcript.add_reply(text, tokens, info.fingerprint)
            cached.ids.append(reply.id)
        return TurnResult(conversation.id, user.id, reply.id, text, tokens, stats, status, dropped)

    def _exact_tokens(self, reply: Message, info: ModelInfo) -> list[int]:
        if reply.token_ids is not None and reply.tokens_fingerprint == info.fingerprint:
            return list(reply.token_ids)
        return self.engine.local_tokenizer().tokenize(reply.content)

    def _progress_of(self, reply_id: str) -> Callable[[PrefillProgress], None] | None:
        listener = self.on_progress
        if listener is None:
            return None
        return lambda progress: listener(reply_id, progress)

    async def _stream(
        self,
        reply: Message,
        prompt: list[int],
        sampling: SamplingParams,
        max_tokens: int,
        *,
        slot: str,
        on_token: OnToken | None,
        before: _Partial,
        finish: Finish | None = None,
        held: int = 0,
    ) -> tuple[str, list[int], GenerationStats | None, str]:
        """Generate into `reply` (after what it already holds), saving as it streams;
        a crash or an error leaves it interrupted, never lost. A complete reply's last write
        carries what `finish` adds. `held`: the conversation's tokens through its last reply,
        the prompt's progress shown from the start (before the engine's first chunk)."""
        pieces: list[str] = [before.text]
        tokens: list[int] = list(before.tokens)
        saved_at = time.monotonic()

        def save(**fields: Any) -> StoreFullError | None:
            """Write the reply so far; on a full disk keep the write for later and say so."""
            update = {"content": "".join(pieces), "token_ids": list(tokens), **fields}
            try:
                self.store.update_message(reply.id, **update)
            except StoreFullError as full:
                self._unsaved[reply.id] = update
                return full
            self._unsaved.pop(reply.id, None)
            return None

        progress = self._progress_of(reply.id)
        if progress is not None:  # from Enter: the engine may first finish a draft's prefill
            progress(PrefillProgress(min(held, len(prompt)), len(prompt)))
        try:
            self._active = await self.engine.generate(
                prompt,
                sampling,
                max_tokens,
                slot=slot,
                on_progress=progress,
                prefill_chunk=USER_CHUNK,  # someone watches this reply and may press Stop
            )
            async for event in self._active:
                pieces.append(event.text)
                tokens.append(event.token_id)
                if on_token is not None:
                    on_token(event)
                if time.monotonic() - saved_at >= SAVE_INTERVAL_S:
                    save()
                    saved_at = time.monotonic()
        except EngineCrashedError:
            save(status="interrupted", finish_reason="crashed")
            self._transcripts.pop(reply.conversation_id, None)
            raise
        except BaseException:
            save(status="interrupted", finish_reason="error")
            raise
        finally:
            generation, self._active = self._active, None
        stats = generation.stats
        cancelled = stats is not None and stats.finish_reason == FinishReason.CANCELLED
        status = "interrupted" if cancelled else "complete"
        last: dict[str, Any] = {
            "status": status,
            "finish_reason": str(stats.finish_reason) if stats else None,
            "stats": stats.as_dict() if stats else None,
        }
        if finish is not None and not cancelled:
            last.update(finish("".join(pieces)))
        full = save(**last)
        if full is not None:
            raise ReplyNotSavedError(full, "".join(pieces))
        return "".join(pieces), tokens, stats, status

    # -- prompts --

    def transcript(
        self,
        conversation: Conversation,
        history: list[Message],
        tools: ToolPrompt | None = None,
    ) -> Transcript:
        """The token-exact prompt of `history` (with `tools` told to the model), extended from
        the cached one when it can be. A reply still streaming is not history yet: the path
        stops before it."""
        info = self.info
        streaming = [i for i, m in enumerate(history) if m.status == "streaming"]
        history = history[: streaming[0]] if streaming else history
        ids = [m.id for m in history]
        system = _system(conversation, tools)
        cached = self._transcripts.get(conversation.id)
        if (
            cached is not None
            and cached.transcript.fingerprint == info.fingerprint
            and cached.transcript.template.key == self.template(conversation, tools).key
            and cached.system_prompt == system
        ):
            shared = 0
            while shared < min(len(ids), len(cached.ids)) and ids[shared] == cached.ids[shared]:
                shared += 1
            if shared < len(cached.ids):  # another branch: keep what the two share
                cached.transcript.rewind(shared + (1 if system else 0))
            for message in history[shared:]:
                self._add(cached.transcript, message)
            cached.ids = ids
            return cached.transcript
        transcript = self._build(conversation, history, tools)
        self._transcripts[conversation.id] = _Cached(ids, system, transcript)
        return transcript

    def template(
        self, conversation: Conversation | None = None, tools: ToolPrompt | None = None
    ) -> ChatTemplate:
        """The model's chat template, with the conversation's reasoning switch when the
        template reads one (`enable_thinking`), and the tools when it renders them."""
        info = self.info
        template = ChatTemplate(
            info.chat_template,
            bos_token=info.bos_token,
            eos_token=info.eos_token,
            variables=tools.variables if tools is not None else None,
        )
        reasoning = (conversation.sampling if conversation else {}).get("reasoning")
        if reasoning is not None and template.supports_reasoning_switch:
            template.variables["enable_thinking"] = bool(reasoning)
        return template

    def keep_served(self, turn: ServedTurn) -> Kept:
        """A turn the API server beside the window served, kept in this store as an API
        conversation (the one whose branch it continues, or a new one). Raises StoreError."""
        return keep(self.store, turn)

    async def read_images(self, attachments: Iterable[Mapping]) -> None:
        """Register the images among `attachments` with the model's projector (once per
        load), so a prompt can hold their runs: every turn the same run for the same image.
        EngineError in words for a text model or an image whose file is gone."""
        info = self.info
        if self._runs_of is not info:
            self._runs, self._runs_of = {}, info
        for record in attachments:
            digest = record.get("digest")
            if not is_image(record) or digest in self._runs:
                continue
            try:
                data = image_bytes(digest, record.get("name", "The image"))
            except ImageFileError as exc:
                raise EngineError(str(exc)) from exc
            self._runs[digest] = tuple(await self.engine.image_run(data))

    async def images_ready(self, conversation_id: str, attachments: Sequence[Mapping] = ()) -> None:
        """`read_images` for the conversation's branch on screen and a draft's files: what
        `history_tokens` and `draft_tokens` need first."""
        history = self.store.current_path(conversation_id)
        await self.read_images([*(a for m in history for a in m.attachments or ()), *attachments])

    def image_tokens(self, digest: str) -> int | None:
        """How many tokens an image registered under the loaded model costs (its chip)."""
        run = self._runs.get(digest) if self._runs_of is self.engine.info else None
        return len(run) if run is not None else None

    def history_tokens(self, conversation_id: str) -> list[int]:
        """The tokens the next turn's prompt starts with: what opening it can prefill."""
        conversation = self.store.get_conversation(conversation_id)
        history = self.store.current_path(conversation.id)
        transcript = self.transcript(conversation, history)
        if history and history[-1].role == "user":
            return transcript.prompt()
        return transcript.tokens

    def draft_tokens(
        self, conversation_id: str, draft: str, attachments: Sequence[Mapping] = ()
    ) -> list[int]:
        """The prompt's tokens through a draft not sent yet, with the files attached to it:
        what attaching and typing can prefill."""
        conversation = self.store.get_conversation(conversation_id)
        history = self.store.current_path(conversation.id)
        transcript = self.transcript(conversation, history)
        return transcript.preview(user_content(draft, attachments), self._images(attachments))

    def draft_spans(
        self, conversation_id: str, attachments: Sequence[Mapping]
    ) -> list[tuple[int, int]]:
        """Where each of a draft's files lies in its prompt, (start, end) in tokens: how far
        a prefill of the draft has read each file (its chip says so). The previews of the
        files one by one, since a file's tokens in the prompt are not its own count."""
        conversation = self.store.get_conversation(conversation_id)
        transcript = self.transcript(conversation, self.store.current_path(conversation.id))
        ends = [
            len(transcript.preview(user_content("", files), self._images(files)))
            for files in (attachments[:n] for n in range(len(attachments) + 1))
        ]
        return list(itertools.pairwise(ends))

    def _build(
        self, conversation: Conversation, history: list[Message], tools: ToolPrompt | None
    ) -> Transcript:
        info = self.info
        system = _system(conversation, tools)
        turns = [Turn("system", system)] if system else []
        turns += [self._as_turn(m) for m in history]
        return Transcript.from_turns(
            turns,
            template=self.template(conversation, tools),
            tokenizer=self.engine.local_tokenizer(),
            fingerprint=info.fingerprint,
            bos_id=info.bos_id,
            add_bos=info.add_bos,
        )

    def _add(self, transcript: Transcript, message: Message) -> None:
        turn = self._as_turn(message)
        if turn.role == "assistant":
            transcript.add_reply(turn.text, turn.tokens, turn.fingerprint)
        else:
            transcript.add_message(turn.role, turn.text, turn.fields, turn.images)

    def _images(self, attachments: Sequence[Mapping]) -> tuple[tuple[int, ...], ...]:
        """The runs of the images among a message's files, in order (`read_images` first)."""
        try:
            return tuple(self._runs[a["digest"]] for a in attachments if is_image(a))
        except KeyError:
            raise EngineError("The message's images were not read by the model yet.") from None

    def _as_turn(self, message: Message) -> Turn:
        """A stored message as the transcript reads it: a user's with its files, a tool
        result with the call it answers, a reply as its exact tokens or, for calls this model
        did not make, their text in its family's syntax (as the server writes them)."""
        if message.role == "user":
            files = message.attachments or ()
            return Turn("user", user_content(message.content, files), images=self._images(files))
        if message.role == "tool":
            fields = (("tool_call_id", message.tool_call_id), ("name", message.tool_name))
            return Turn("tool", message.content, fields=tuple((k, v) for k, v in fields if v))
        tokens = tuple(message.token_ids) if message.token_ids is not None else None
        exact = tokens is not None and message.tokens_fingerprint == self.info.fingerprint
        if not message.tool_calls or exact:
            return Turn("assistant", message.content, tokens, message.tokens_fingerprint)
        syntax = syntax_for(self.template().source, self.info.architecture)
        written = syntax.render([ToolCall(c.id, c.name, c.arguments) for c in message.tool_calls])
        content = message.content + "\n" if message.content else ""
        tokenizer = self.engine.local_tokenizer()
        ids = tokenizer.tokenize(content) + tokenizer.tokenize(written, special=True)
        return Turn("assistant", content + written, tuple(ids), self.info.fingerprint)

    def _fit(
        self,
        conversation: Conversation,
        history: list[Message],
        info: ModelInfo,
        *,
        drop_oldest: bool,
        tools: ToolPrompt | None = None,
    ) -> tuple[Transcript, int]:
        """The transcript for `history`, or raise ContextOverflowError; with `drop_oldest`,
        leave out the oldest turns (never the system prompt) until it fits with room."""
        transcript = self.transcript(conversation, history, tools)
        prompt_len = len(transcript.prompt())
        if prompt_len < info.n_ctx:
            return transcript, 0
        budget = int(info.n_ctx * (1 - REPLY_ROOM))
        alone = len(self._build(conversation, history[-1:], tools).prompt()) if history else 0
        if alone > budget:  # leaving turns out cannot help: do not offer it
            raise MessageTooLongError(alone, info.n_ctx)
        if not drop_oldest:
            raise ContextOverflowError(prompt_len, info.n_ctx)
        for start in range(1, len(history)):
            if history[start].role != "user":
                continue
            window = self._build(conversation, history[start:], tools)
            if len(window.prompt()) <= budget:
                return window, start
        raise MessageTooLongError(alone, info.n_ctx)
