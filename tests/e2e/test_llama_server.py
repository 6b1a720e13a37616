"""The remote engine's `llama-server` mode against llama.cpp's real llama-server (built by
`make llama-tools` from the engine's own llama.cpp sources) serving the default model (whose
few tokens a second on a busy CPU leave a cancel or a kill time to land mid-reply); the key
test's own server serves the tests' tiny chat model.

What each test proves, with the server's own numbers (its `timings.cache_n`):
- a conversation sends token prompts that extend the last turn exactly, so every follow-up is
  served from the server's cache, with the tokenizer of a local GGUF or the server's own;
- a prewarm (`n_predict: 0`) fills the cache, and the reply after it evaluates one token;
- a cancel mid-stream stops the server's slot, keeps the tokens received, and the next
  request reuses the prefix;
- a server killed mid-reply is reported in words, the partial reply is kept, a turn sent
  while it is down says nothing is listening, and once the server is back the conversation
  goes on, prefilling from nothing;
- a prompt over the server's context comes back as the overflow error with its numbers;
- its `--api-key` is sent (on /props too), and a wrong key is refused in words;
- `stoke chat --remote-url` (the real CLI, in a subprocess) chats over it, its follow-up
  read from the cache.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from app.conversations import ConversationStore
from app.engine.chat_template import ChatTemplate
from app.engine.host import EngineClient
from app.engine.protocol import (
    CancelToken,
    ContextOverflowError,
    EngineError,
    FinishReason,
    GenerationStats,
    LoadOptions,
    ModelLoadError,
    RemoteOptions,
    SamplingParams,
    TokenEvent,
)
from app.engine.remote import RemoteEngine, WireMode
from app.engine.transcript import Transcript, Turn
from app.session import ChatSession
from tests.e2e.llama_server import N_CTX, LlamaServer, llama_server_binary
from tests.e2e.stoke_proc import stoke

pytestmark = pytest.mark.e2e

TURNS = ("What is the capital of France?", "And of Italy?", "Name a river in that city.")
GREEDY = {"temperature": 0.0, "max_tokens": 24}


@pytest.fixture(scope="module")
def llama_server(
    tmp_path_factory: pytest.TempPathFactory, shared_home: Callable[[str], Path]
) -> Iterator[LlamaServer]:
    """The module's server; a test may kill it, and starts it again (empty cache, same URL)."""
    server = LlamaServer(
        llama_server_binary(), tmp_path_factory.mktemp("llama-server") / "server.log"
    )
    with pytest.MonkeyPatch.context() as mp:  # its flags read this machine's verdict
        mp.setenv("STOKE_HOME", str(shared_home("llama-server-home")))
        server.start()
    try:
        yield server
    finally:
        server.stop()


def options(url: str, tokenizer: str = "", key: str | None = None) -> LoadOptions:
    return LoadOptions(tokenizer, n_ctx=N_CTX, remote=RemoteOptions(url, api_key=key))


def engine_on(server: LlamaServer, tokenizer: str = "") -> RemoteEngine:
    engine = RemoteEngine()
    engine.load(options(server.url, tokenizer))
    assert engine.mode == WireMode.LLAMA_SERVER  # `auto` recognised it by its /props
    return engine


def collect(events: Iterator) -> tuple[list[int], GenerationStats]:
    tokens, stats = [], None
    for event in events:
        if isinstance(event, GenerationStats):
            stats = event
        elif isinstance(event, TokenEvent):
            tokens.append(event.token_id)
    return tokens, stats


def prompt_of(engine: RemoteEngine, text: str) -> list[int]:
    """A one-message chat prompt in the served model's template, as Stoke builds prompts."""
    info = engine.info
    return Transcript.from_turns(
        [Turn("user", text)],
        template=ChatTemplate(
            info.chat_template, bos_token=info.bos_token, eos_token=info.eos_token
        ),
        tokenizer=engine,
        fingerprint=info.fingerprint,
        bos_id=info.bos_id,
        add_bos=info.add_bos,
    ).prompt()


@pytest.mark.parametrize("tokenizer", ["local GGUF", "server"])
def test_a_conversation_is_served_from_the_servers_cache(
    llama_server: LlamaServer, store: ConversationStore, model_path: str, run, tokenizer: str
) -> None:
    async def scenario() -> None:
        local = model_path if tokenizer == "local GGUF" else ""
        client = EngineClient(options(llama_server.url, local))
        info = await client.start()
        try:
            assert info.backend == "remote" and info.n_ctx == N_CTX
            session = ChatSession(store, client)
            # a system prompt of its own, so no earlier test's cache covers this conversation
            conversation = store.create_conversation(system_prompt=f"Be brief ({tokenizer}).")
            store.set_sampling(conversation.id, GREEDY)
            previous: list[int] = []
            for turn, text in enumerate(TURNS):
                result = await session.send(conversation.id, text)
                assert result.status == "complete", result
                prompt = session.transcript(
                    store.get_conversation(conversation.id),
                    store.path_to(result.user_message_id),
                ).prompt()
                assert prompt[: len(previous)] == previous  # appended, never rewritten
                stats = result.stats
                assert stats.prompt_tokens == len(prompt)
                if turn == 0:
                    assert stats.reused_tokens < len(prompt) // 2  # nothing of it was cached
                else:
                    # the server's own count: the last turn came from its cache, all but
                    # the reply's last token when the reply was cut at the limit (sampled,
                    # never evaluated)
                    assert stats.reused_tokens >= len(previous) - 1, (turn, stats)
                assert stats.prefilled_tokens == stats.prompt_tokens - stats.reused_tokens
                reply = store.get_message(result.reply_message_id)
                assert reply.token_ids == result.token_ids and reply.token_ids
                assert stats.generated_tokens == len(reply.token_ids)
                previous = prompt + result.token_ids
        finally:
            await client.close()

    run(scenario())


def test_prewarm_fills_the_cache_and_the_reply_reads_one_token(
    llama_server: LlamaServer, model_path: str
) -> None:
    engine = engine_on(llama_server, model_path)
    prompt = prompt_of(engine, "Prewarm me: list three colours of the rainbow.")
    warm = engine.prefill(prompt)
    assert warm.finish_reason == FinishReason.PREFILLED
    assert warm.generated_tokens == 0
    assert warm.prompt_tokens == len(prompt) and warm.prefilled_tokens > len(prompt) // 2
    assert engine.resident_tokens("default") == prompt
    tokens, stats = collect(engine.generate(prompt, SamplingParams.greedy(), 8))
    assert tokens and stats.prompt_tokens == len(prompt)
    # the server kept the prewarmed prompt; only the last token is evaluated again for its
    # logits (llama-server always re-reads at least one)
    assert stats.reused_tokens == len(prompt) - 1 and stats.prefilled_tokens == 1, stats


def test_cancel_mid_stream_stops_the_server_and_keeps_the_prefix(
    llama_server: LlamaServer, model_path: str
) -> None:
    engine = engine_on(llama_server, model_path)
    prompt = prompt_of(engine, "Count from one to two hundred in words, one number a line.")
    cancel = CancelToken()
    received: list[int] = []
    stats = None
    for event in engine.generate(prompt, SamplingParams.greedy(), 400, cancel=cancel):
        if isinstance(event, TokenEvent):
            received.append(event.token_id)
            if len(received) == 3:
                cancel.cancel()
        elif isinstance(event, GenerationStats):
            stats = event
    assert stats.finish_reason == FinishReason.CANCELLED
    assert 3 <= len(received) < 400
    assert engine.resident_tokens("default") == prompt + received
    wait_for_idle_slots(llama_server)  # the server stopped generating for the closed stream
    follow = [*prompt, *received]
    tokens, after = collect(engine.generate(follow, SamplingParams.greedy(), 4))
    assert tokens and after.prompt_tokens == len(follow)
    assert after.reused_tokens >= len(prompt), after  # the prompt is still in its cache


def test_a_prompt_over_the_servers_context_keeps_its_numbers(
    llama_server: LlamaServer, model_path: str
) -> None:
    """The server's own refusal (a server restarted with a smaller context than Stoke was
    told, say) becomes the overflow error the app words, with the server's numbers."""
    engine = engine_on(llama_server, model_path)
    prompt = prompt_of(engine, "word " * (N_CTX + 100))
    with pytest.raises(ContextOverflowError) as overflow:
        collect(engine.generate(prompt, SamplingParams.greedy(), 4))
    assert (overflow.value.prompt_tokens, overflow.value.n_ctx) == (len(prompt), N_CTX)


def test_the_servers_api_key_is_sent_and_a_wrong_one_is_refused_in_words(
    tmp_path: Path, tiny_model: str
) -> None:
    server = LlamaServer(
        llama_server_binary(), tmp_path / "server.log", "--api-key", "k-right", model=tiny_model
    )
    server.start()
    try:
        engine = RemoteEngine()
        engine.load(options(server.url, tiny_model, key="k-right"))
        assert engine.mode == WireMode.LLAMA_SERVER  # /props answered with the key
        tokens, stats = collect(
            engine.generate(prompt_of(engine, "Hi"), SamplingParams.greedy(), 2)
        )
        assert tokens and stats.prompt_tokens > 0
        with pytest.raises(ModelLoadError, match="refused the API key"):
            RemoteEngine().load(options(server.url, tiny_model, key="k-wrong"))
    finally:
        server.stop()


def wait_for_idle_slots(server: LlamaServer) -> None:
    """Until no slot of the server is processing (its /slots endpoint)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if not any(slot.get("is_processing") for slot in server.get("/slots")):
            return
        time.sleep(0.1)
    raise AssertionError(f"a slot kept generating after the cancel: {server.get('/slots')}")


def test_a_server_killed_mid_reply_is_said_in_words_and_the_next_turn_prefills_again(
    llama_server: LlamaServer, store: ConversationStore, model_path: str, run
) -> None:
    server = llama_server
    short = {"temperature": 0.0, "max_tokens": 4}  # the turns around the kill only need to end

    async def scenario() -> None:
        client = EngineClient(options(server.url, model_path))
        await client.start()
        try:
            session = ChatSession(store, client)
            conversation = store.create_conversation()
            store.set_sampling(conversation.id, short)
            first = await session.send(conversation.id, TURNS[0])
            assert first.status == "complete"
            seen: list[TokenEvent] = []

            def kill_after_two(event: TokenEvent) -> None:
                seen.append(event)
                if len(seen) == 2:
                    server.stop()

            store.set_sampling(conversation.id, {"temperature": 0.0, "max_tokens": 200})
            with pytest.raises(EngineError) as lost:
                await session.send(
                    conversation.id, "Count from one to fifty in words.", on_token=kill_after_two
                )
            words = str(lost.value)
            assert server.url in words and "Traceback" not in words
            assert "lost" in words or "closed" in words, words
            # the partial reply is kept, marked interrupted
            path = store.path_to(store.get_conversation(conversation.id).current_leaf_id)
            partial = path[-1]
            assert partial.role == "assistant" and partial.status == "interrupted"
            assert len(partial.token_ids) >= 2
            with pytest.raises(EngineError, match="nothing is listening"):
                await session.send(conversation.id, "Still there?")  # while it is down
            server.start()  # back, at the same address, with an empty cache
            store.set_sampling(conversation.id, short)
            again = await session.send(conversation.id, TURNS[1])
            assert again.status == "complete", again
            stats = again.stats
            assert stats.reused_tokens == 0 and stats.prefilled_tokens == stats.prompt_tokens
            prompt = session.transcript(
                store.get_conversation(conversation.id), store.path_to(again.user_message_id)
            ).prompt()
            assert stats.prompt_tokens == len(prompt)
        finally:
            await client.close()

    try:
        run(scenario())
    finally:
        if server.process is None:  # killed and not back: back for the module's next tests
            server.start()


def test_stoke_chat_remote_url_over_llama_server(llama_server: LlamaServer, tmp_path: Path) -> None:
    home = tmp_path / "home"
    argv = ("chat", "--remote-url", llama_server.url, "--json", "--temperature", "0")
    first = stoke(home, *argv, "--max-tokens", "16", "-m", "Name one planet.")
    assert first.returncode == 0, first.stderr
    answer = json.loads(first.stdout)
    assert answer["status"] == "complete" and answer["reply"].strip()
    stats = answer["stats"]
    assert stats["prompt_tokens"] > 0 and stats["generated_tokens"] > 0
    follow = stoke(
        home, *argv, "--max-tokens", "8", "-c", answer["conversation_id"], "-m", "Another?"
    )
    assert follow.returncode == 0, follow.stderr
    again = json.loads(follow.stdout)
    assert again["status"] == "complete"
    # a new process, the same server: the first exchange is read from the server's cache
    assert again["stats"]["reused_tokens"] >= stats["prompt_tokens"], again["stats"]
