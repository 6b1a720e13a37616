"""KV snapshots and prewarming on the real engine: exact continuation, bad files, typing.

What a snapshot holds, how a bad one is caught and what prewarming saves are the engine's and
the store's, whatever the weights, so every test runs on the tests' tiny model
(tests/tiny_model.py: SmolLM2's tokenizer and template, random Q8_0 weights)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from app import paths
from app.conversations import ConversationStore
from app.engine.host import EngineClient
from app.engine.prewarm import Prewarmer
from app.engine.protocol import FinishReason, LoadOptions, SamplingParams, TokenEvent
from app.session import ChatSession
from tests.e2e.conftest import both_engines, needs_mlx, start_session

STORY = (
    "The lighthouse keeper climbed the spiral stairs every evening, counting the steps "
    "and listening to the waves break against the rocks below. "
) * 8


@pytest.fixture
def model_path(tiny_model: str) -> str:
    return tiny_model


async def _client(model_path: str, engine: str, **options) -> EngineClient:
    client = EngineClient(LoadOptions(model_path, n_ctx=4096, **options), backend=engine)
    await client.start()
    return client


async def _prompt(client: EngineClient) -> list[int]:
    text = f"<|im_start|>user\n{STORY}\nWhat happens next?<|im_end|>\n<|im_start|>assistant\n"
    return await client.tokenize(text, special=True)


async def _greedy(client: EngineClient, prompt: list[int], slot: str) -> tuple[list[int], object]:
    generation = await client.generate(prompt, SamplingParams.greedy(), 32, slot=slot)
    tokens = [event.token_id async for event in generation if isinstance(event, TokenEvent)]
    return tokens, generation.stats


def _live_run(model_path: str, run, engine: str) -> tuple[list[int], list[int]]:
    """Prefill and reply in one engine; closing it writes the conversation's snapshot."""

    async def scenario():
        client = await _client(model_path, engine)
        try:
            prompt = await _prompt(client)
            tokens, _ = await _greedy(client, prompt, "talk")
            return prompt, tokens
        finally:
            await client.close()

    return run(scenario())


def _snapshot_file() -> Path:
    """The one snapshot file (each engine, and each llama.cpp KV layout, keeps its own folder
    under the model's)."""
    (file,) = (paths.cache_dir() / "kv").rglob("*.kv")
    return file


@both_engines
def test_disk_snapshot_continues_exactly_like_live_context(model_path, run, engine):
    prompt, live = _live_run(model_path, run, engine)
    assert len(live) == 32

    async def restart():
        client = await _client(model_path, engine)
        try:
            return await _greedy(client, prompt, "talk")
        finally:
            await client.close()

    restored, stats = run(restart())
    assert restored == live
    assert stats.restored_tokens == len(prompt) - 1  # the last is evaluated for its logits
    assert stats.prefilled_tokens == 1


def test_each_kv_layout_keeps_its_own_snapshots(model_path, run):
    """A state installs only into a context of its KV layout, and snapshots are matched by
    tokens: a plain f16 context must not take the speculative context's snapshot of the same
    prompt (it prefills), and must leave it for when that layout comes back. A snapshot file
    from before layouts had folders is removed."""
    prompt, _ = _live_run(model_path, run, "llama.cpp")
    model_dir = _snapshot_file().parent.parent
    legacy = model_dir / "0123456789abcdef.kv"
    legacy.write_bytes(b"STKV")

    async def turn(**options):
        client = await _client(model_path, "llama.cpp", **options)
        try:
            return await _greedy(client, prompt, "talk")
        finally:
            await client.close()

    _, plain = run(turn(speculation="off"))
    assert plain.restored_tokens == 0 and plain.prefilled_tokens == len(prompt)
    assert not legacy.exists()
    layouts = sorted(p.name for p in model_dir.iterdir() if p.name.startswith("llama.cpp-"))
    assert len(layouts) == 2 and "llama.cpp-f16-f16-nofa" in layouts
    _, back = run(turn())
    assert back.restored_tokens == len(prompt) - 1


def _truncate(data: bytes) -> bytes:
    return data[: len(data) // 2]


def _flip_payload_byte(data: bytes) -> bytes:
    return data[:-10] + bytes([data[-10] ^ 0xFF]) + data[-9:]


def _other_fingerprint(data: bytes) -> bytes:
    fingerprint = _snapshot_file().relative_to(paths.cache_dir() / "kv").parts[0].encode()
    return data.replace(fingerprint, fingerprint[::-1], 1)


def _future_version(data: bytes) -> bytes:
    return data[:4] + (99).to_bytes(2, "little") + data[6:]


@pytest.mark.parametrize(
    ("engine", "damage"),
    [
        *(("llama.cpp", d) for d in (_truncate, _other_fingerprint, _future_version)),
        *(
            ("llama.cpp", _flip_payload_byte),
            pytest.param("mlx", _flip_payload_byte, marks=needs_mlx),
        ),
    ],
)
def test_damaged_snapshot_is_rejected_deleted_and_prefilled(model_path, run, engine, damage):
    """The checks are the store's, the same for every engine; MLX takes the payload case."""
    prompt, live = _live_run(model_path, run, engine)
    file = _snapshot_file()
    file.write_bytes(damage(file.read_bytes()))

    async def restart():
        client = await _client(model_path, engine)
        try:
            tokens, stats = await _greedy(client, prompt, "talk")
            return tokens, stats, file.exists()
        finally:
            await client.close()  # writes a good snapshot again

    tokens, stats, kept = run(restart())
    assert tokens == live  # correct output from a plain prefill
    assert stats.restored_tokens == 0 and stats.prefilled_tokens == len(prompt)
    assert not kept  # the damaged file was deleted, never loaded


@both_engines
def test_resident_switch_restores_nothing_and_eviction_goes_to_ram(model_path, run, engine):
    async def scenario():
        client = await _client(model_path, engine, n_seq_max=2)
        try:
            others = [await client.tokenize(f"Chapter {i}. {STORY}") for i in range(3)]
            for slot, tokens in zip("AB", others, strict=False):
                await client.prefill(tokens, slot=slot)
            switch = await client.prefill(others[0] + [198], slot="A")  # A, B resident
            evicting = await client.prefill(others[2], slot="C")  # evicts B (least recent)
            back = await client.prefill(others[1] + [198], slot="B")  # B from RAM
            return others, switch, evicting, back
        finally:
            await client.close()

    others, switch, evicting, back = run(scenario())
    assert switch.restored_tokens == 0 and switch.reused_tokens == len(others[0])
    assert back.restored_tokens == len(others[1]) and back.prefilled_tokens == 1
    assert evicting.finish_reason == FinishReason.PREFILLED


def test_prewarm_while_typing_then_edit_then_send(store: ConversationStore, model_path, run):
    draft = (
        "Please write a short poem about the old lighthouse keeper who counts the stairs "
        "every evening and listens to the waves"
    )
    draft_words = draft.split(" ")
    edited = draft.replace("old lighthouse keeper", "young ferry pilot") + "."
    sampling = {"temperature": 0, "max_tokens": 24}

    async def typed_turn():
        session = await start_session(store, model_path)
        prewarm = Prewarmer(session, debounce_s=0)
        try:
            conversation = store.create_conversation(sampling=sampling)
            await session.send(conversation.id, "Hello!")
            for n in range(1, len(draft_words) + 1):
                prewarm.draft_changed(conversation.id, " ".join(draft_words[:n]) + " ")
                await prewarm.idle()
            prewarm.draft_changed(conversation.id, edited)  # an edit in the middle of the draft
            await prewarm.idle()
            warm = await session.engine.resident_tokens(conversation.id)
            prewarm.cancel(conversation.id)
            result = await session.send(conversation.id, edited)
            prompt = session.transcript(
                store.get_conversation(conversation.id), store.path_to(result.user_message_id)
            ).prompt()
            return warm, prompt, result
        finally:
            await session.engine.close()

    async def direct_turn():
        """The same two turns on a fresh engine, without prewarm (nor snapshots)."""
        client = EngineClient(LoadOptions(model_path, n_ctx=4096, snapshots=False))
        await client.start()
        session = ChatSession(store, client)
        try:
            conversation = store.create_conversation(sampling=sampling)
            await session.send(conversation.id, "Hello!")
            return await session.send(conversation.id, edited)
        finally:
            await client.close()

    warm, prompt, result = run(typed_turn())
    baseline = run(direct_turn())
    common = 0
    while common < len(warm) and warm[common] == prompt[common]:
        common += 1
    assert common > len(prompt) * 0.8  # the edited draft was prefilled again, up to its end
    assert result.stats.reused_tokens == common
    assert result.stats.prefilled_tokens == len(prompt) - common  # only the diverged tail
    assert baseline.stats.prefilled_tokens > result.stats.prefilled_tokens + 20
    assert result.token_ids == baseline.token_ids and result.text == baseline.text


@needs_mlx
def test_mlx_snapshot_that_is_no_prompt_cache_is_prefilled_instead(model_path):
    """Bytes that pass the store's checks but are not a prompt cache of this model (written
    by a bug, or another build) are never loaded: MLX checks what it reads."""
    from app.engine.kvstore import KVStore
    from app.engine.mlx.backend import SNAPSHOT_FOLDER, MlxEngine
    from app.engine.mlx.models import load_tokenizer
    from app.engine.model_file import fingerprint, weights_id

    key = fingerprint(model_path)
    tokens = load_tokenizer(model_path).tokenize(STORY[:400])
    store = KVStore(
        weights_id(model_path, key), "mlx", directory=paths.kv_dir(key) / SNAPSHOT_FOLDER
    )
    store.put("talk", tokens, b"not a prompt cache")
    store.close()
    engine = MlxEngine()
    engine.load(LoadOptions(model_path, n_ctx=1024))
    try:
        stats = engine.prefill(tokens, slot="talk")
    finally:
        engine.unload()
    assert stats.restored_tokens == 0 and stats.prefilled_tokens == len(tokens) > 32
    assert stats.finish_reason == FinishReason.PREFILLED


@pytest.mark.parametrize("hashed", [True, False], ids=["hash-made", "no-hash"])
def test_other_weights_behind_the_same_name_size_mtime_and_header_never_restore_old_kv(
    store: ConversationStore,
    tiny_model: str,
    tmp_path: Path,
    run,
    hashed: bool,
):
    """Weights rewritten in place, `touch -r` putting the mtime back: the fingerprint is the
    same and the old KV was restored (`reused_tokens: 120`), whether or not a content hash had
    been made in this home (issue 33). Now the store's id samples the weights: the turn
    prefills afresh and answers."""
    import tests.tiny_model
    from app.engine.model_file import content_hash
    from app.models.default import default_model_path

    model = Path(shutil.copy2(tiny_model, tmp_path / "model.gguf"))
    conversation = store.create_conversation(sampling={"temperature": 0, "max_tokens": 8})

    async def turn(text: str):
        session = await start_session(store, str(model))
        try:
            return await session.send(conversation.id, text)
        finally:
            await session.engine.close()  # snapshots the conversation

    run(turn(STORY))
    same = run(turn("And then?"))  # the same weights: the snapshot is restored
    assert same.stats.restored_tokens > 100 > same.stats.prefilled_tokens
    if hashed:
        content_hash(model)  # the old weights' hash made and kept in this home
    else:
        (paths.cache_dir() / "model-hashes.json").unlink(missing_ok=True)

    stamp = model.stat()
    other = tests.tiny_model.write_tiny_chat_model(
        default_model_path(), tmp_path / "other.gguf", seed=tests.tiny_model.SEED + 1
    )
    with model.open("r+b") as weights:  # in place, the header byte for byte the same
        weights.write(other.read_bytes())
    os.utime(model, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert (
        model.stat().st_size == stamp.st_size
        and model.read_bytes() != Path(tiny_model).read_bytes()
    )

    fresh = run(turn("What next?"))
    assert fresh.status == "complete" and fresh.stats.generated_tokens >= 1
    assert fresh.stats.reused_tokens == 0 and fresh.stats.restored_tokens == 0
    assert fresh.stats.prefilled_tokens == fresh.stats.prompt_tokens
