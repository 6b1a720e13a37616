"""Turns through the real engine host: append-only prefill, branches, trimming.

What the KV holds and what a turn prefills are the engine's and the session's, whatever the
weights, so the turns run on the tests' tiny model (tests/tiny_model.py: SmolLM2's tokenizer
and template, random weights); a Stop, which must land while the reply is still going, stays
on the default model."""

from __future__ import annotations

import pytest

from app.conversations import ConversationStore
from app.engine.chat_template import ChatTemplate
from app.engine.protocol import FinishReason
from app.engine.transcript import Transcript, Turn
from app.models.default import default_model_path
from app.session import ChatSession
from tests.e2e.conftest import GREEDY, both_engines, start_session

QUESTIONS = [
    "Name a primary color.",
    "Name a fruit that is yellow.",
    "What is the capital of Italy?",
    "How many legs does a spider have?",
    "Say goodbye in French.",
]


@pytest.fixture
def model_path(tiny_model: str) -> str:
    return tiny_model


def _prompt_of(session: ChatSession, conversation_id: str, user_message_id: str) -> list[int]:
    """The prompt a fresh session (no cache) builds from the database alone."""
    fresh = ChatSession(session.store, session.engine)
    conversation = session.store.get_conversation(conversation_id)
    return fresh.transcript(conversation, session.store.path_to(user_message_id)).prompt()


def _kv_after(prompt: list[int], reply: list[int], reason: FinishReason) -> list[int]:
    """What the engine holds after a reply: the last sampled token is only evaluated when
    the model went on to sample another (so not when max_tokens cut it)."""
    held = prompt + reply
    return held[:-1] if reason == FinishReason.LENGTH and reply else held


@both_engines
def test_five_turns_prefill_only_their_new_tokens(
    store: ConversationStore, model_path, run, engine
):
    async def scenario():
        session = await start_session(store, model_path, engine=engine)
        try:
            conversation = store.create_conversation(
                system_prompt="You answer in a few words.", sampling=GREEDY
            )
            results = [await session.send(conversation.id, q) for q in QUESTIONS]
            resident = await session.engine.resident_tokens(conversation.id)
            return session, conversation, results, resident
        finally:
            await session.engine.close()

    session, conversation, results, resident = run(scenario())
    prompts = [_prompt_of(session, conversation.id, r.user_message_id) for r in results]
    for i, result in enumerate(results):
        assert result.status == "complete"
        assert result.stats.prompt_tokens == len(prompts[i])
        if i == 0:
            assert result.stats.reused_tokens == 0
            continue
        before = results[i - 1]
        held = _kv_after(prompts[i - 1], before.token_ids, before.stats.finish_reason)
        assert prompts[i][: len(held)] == held, "turn prompt must extend the previous one"
        new_tokens = len(prompts[i]) - len(prompts[i - 1]) - len(before.token_ids)
        assert result.stats.reused_tokens == len(held)
        assert result.stats.prefilled_tokens == len(prompts[i]) - len(held)
        assert result.stats.prefilled_tokens <= new_tokens + 1
    last = results[-1]
    assert resident == _kv_after(prompts[-1], last.token_ids, last.stats.finish_reason)


def test_transcript_equals_fresh_tokenization(store: ConversationStore, model_path, run):
    async def scenario():
        session = await start_session(store, model_path)
        try:
            conversation = store.create_conversation(sampling=GREEDY)
            for q in QUESTIONS[:3]:
                await session.send(conversation.id, q)
            return session, store.get_conversation(conversation.id)
        finally:
            await session.engine.close()

    session, conversation = run(scenario())
    history = store.current_path(conversation.id)
    info = session.engine.info
    tokenizer = session.engine.local_tokenizer()
    template = ChatTemplate(info.chat_template, bos_token=info.bos_token, eos_token=info.eos_token)
    rendered = template.render(
        [{"role": m.role, "content": m.content} for m in history], add_generation_prompt=False
    )
    fresh = tokenizer.tokenize(rendered, special=True)
    # Replies re-tokenized from their text: must equal the fresh tokenization exactly.
    canonical = Transcript.from_turns(
        [Turn(m.role, m.content) for m in history],
        template=template,
        tokenizer=tokenizer,
        fingerprint=info.fingerprint,
    )
    assert canonical.tokens == fresh[: len(canonical.tokens)]
    assert tokenizer.tokenize("<|im_end|>\n", special=True) == fresh[len(canonical.tokens) :]
    # With the exact sampled ids: equal wherever the sampler chose the canonical tokens.
    exact = session.transcript(conversation, history)
    replies = [m for m in history if m.role == "assistant"]
    if all(tokenizer.tokenize(m.content) == m.token_ids for m in replies):
        assert exact.tokens == canonical.tokens
    assert [s.tokens for s in exact.segments if s.role == "assistant"] == [
        tuple(m.token_ids) for m in replies
    ]


@both_engines
def test_edit_and_regenerate_branch_and_trim_kv(store: ConversationStore, model_path, run, engine):
    async def scenario():
        session = await start_session(store, model_path, engine=engine)
        try:
            conversation = store.create_conversation(sampling=GREEDY)
            first = await session.send(conversation.id, QUESTIONS[0])
            second = await session.send(conversation.id, QUESTIONS[1])
            prompt = _prompt_of(session, conversation.id, second.user_message_id)

            store.set_sampling(conversation.id, {"temperature": 0.9, "seed": 7, "max_tokens": 24})
            again = await session.regenerate(second.reply_message_id)
            after_regen = await session.engine.resident_tokens(conversation.id)

            edited = await session.edit(second.user_message_id, "Name a fruit that is red.")
            edited_prompt = _prompt_of(session, conversation.id, edited.user_message_id)
            after_edit = await session.engine.resident_tokens(conversation.id)
            return (
                first,
                second,
                again,
                edited,
                prompt,
                edited_prompt,
                after_regen,
                after_edit,
                conversation,
            )
        finally:
            await session.engine.close()

    (first, second, again, edited, prompt, edited_prompt, after_regen, after_edit, conversation) = (
        run(scenario())
    )
    # Regenerate: a sibling reply to the same user message, from the same prompt; the old
    # reply's KV is trimmed away (only the prompt's last token is evaluated again).
    siblings, index = store.siblings(again.reply_message_id)
    assert [m.id for m in siblings] == [second.reply_message_id, again.reply_message_id]
    assert index == 1
    assert again.user_message_id == second.user_message_id
    assert again.stats.prompt_tokens == len(prompt)
    assert again.stats.reused_tokens == len(prompt) - 1
    assert again.stats.prefilled_tokens == 1
    assert after_regen[: len(prompt)] == prompt
    assert after_regen[len(prompt) :] == again.token_ids[: len(after_regen) - len(prompt)]

    # Edit: a sibling user message; KV trimmed to the branch point, the rest prefilled.
    user_siblings, _ = store.siblings(edited.user_message_id)
    assert [m.id for m in user_siblings] == [second.user_message_id, edited.user_message_id]
    branch = 0
    while after_regen[branch] == edited_prompt[branch]:
        branch += 1
    assert branch < len(prompt)
    assert edited.stats.reused_tokens == branch
    assert edited.stats.prefilled_tokens == len(edited_prompt) - branch
    assert after_edit[: len(edited_prompt)] == edited_prompt
    path = store.current_path(conversation.id)
    assert [m.id for m in path] == [
        first.user_message_id,
        first.reply_message_id,
        edited.user_message_id,
        edited.reply_message_id,
    ]


def test_stop_then_continue_the_interrupted_reply(store: ConversationStore, run):
    async def scenario():
        session = await start_session(store, str(default_model_path()))
        try:
            conversation = store.create_conversation(sampling={"temperature": 0, "max_tokens": 60})
            count = 0

            def stop_after_some(_event) -> None:
                nonlocal count
                count += 1
                if count == 6:
                    session.cancel()

            stopped = await session.send(
                conversation.id, "Count from 1 to 50.", on_token=stop_after_some
            )
            partial = store.get_message(stopped.reply_message_id)
            continued = await session.continue_reply(stopped.reply_message_id)
            return stopped, partial, continued
        finally:
            await session.engine.close()

    stopped, partial, continued = run(scenario())
    assert stopped.status == "interrupted" and partial.status == "interrupted"
    assert continued.reply_message_id == stopped.reply_message_id  # the same message grows
    assert continued.token_ids[: len(stopped.token_ids)] == stopped.token_ids
    assert continued.text.startswith(stopped.text) and len(continued.text) > len(stopped.text)
    assert continued.stats.prefilled_tokens <= 2  # the partial reply was still in the KV
    final = store.get_message(continued.reply_message_id)
    assert final.status == "complete" and final.content == continued.text
