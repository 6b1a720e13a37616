"""The remote engine drives real servers on loopback, through the whole app path: ChatSession
over an EngineClient whose child runs app/engine/remote.py against the server.

(a) A second `stoke serve` process: token-id prompts and sampled ids both ways (`tokens`
mode), so each turn's prompt extends the last exactly and the server reports it cached. It
serves the tests' tiny chat model (SmolLM2's tokenizer and template, random weights): the
wire's mechanism, whatever the replies say.
(b) `python -m llama_cpp.server` with the default model: its /v1/completions takes text only,
so the engine runs in `text` mode; the test checks that what the server tokenizes from each
turn is Stoke's transcript: the same text and control tokens, the same tokens but where a reply
was sampled in non-canonical tokens (which text cannot carry).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from app.conversations import ConversationStore
from app.engine.host import EngineClient
from app.engine.protocol import FinishReason, LoadOptions, ModelLoadError, RemoteOptions
from app.remote_config import KEY_ENV
from app.session import ChatSession

pytestmark = pytest.mark.e2e

API_KEY = "test-remote-key"
TURNS = ("What is the capital of France?", "And of Italy?", "Name a river in that city.")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_up(url: str, process: subprocess.Popen, log: Path, key: str | None) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited: {log.read_text()[-2000:]}")
        request = urllib.request.Request(f"{url}/v1/models")
        if key:
            request.add_header("Authorization", f"Bearer {key}")
        try:
            with urllib.request.urlopen(request, timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"the server did not come up: {log.read_text()[-2000:]}")


def post(url: str, path: str, body: dict, key: str) -> dict:
    request = urllib.request.Request(
        url + path,
        json.dumps(body).encode(),
        {"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def llama_cpp_server(
    tmp_path_factory: pytest.TempPathFactory, shared_home: Callable[[str], Path]
) -> Iterator[str]:
    from app.models.default import default_model_path

    port = free_port()
    log = tmp_path_factory.mktemp("llama-cpp-server") / "server.log"
    env = {**os.environ, "STOKE_HOME": str(shared_home("peer-home"))}  # its buffer verdict
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "app.engine.llamacpp.peer_server",  # llama_cpp.server, safe buffer types
                "--model",
                str(default_model_path()),
                "--port",
                str(port),
                "--n_ctx",
                "4096",
                "--api_key",
                API_KEY,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url, process, log, API_KEY)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def stoke_server(
    tmp_path_factory: pytest.TempPathFactory, shared_home: Callable[[str], Path], tiny_model: str
) -> Iterator[str]:
    """`stoke serve` on the tiny model in its own process and its own STOKE_HOME."""
    port = free_port()
    log = tmp_path_factory.mktemp("stoke-serve") / "serve.log"
    env = {**os.environ, "STOKE_HOME": str(shared_home("stoke-serve-home"))}
    env.pop(KEY_ENV, None)
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "app", "serve", "--model", tiny_model),
                *("--ctx", "4096", "--port", str(port), "--api-key", API_KEY),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url, process, log, API_KEY)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=60)


def remote_options(model_path: str, url: str, **remote: object) -> LoadOptions:
    return LoadOptions(
        model_path, n_ctx=4096, remote=RemoteOptions(url, **{"api_key": API_KEY, **remote})
    )


def test_session_over_llama_cpp_python_server_sends_the_transcript_as_text(
    llama_cpp_server: str, store: ConversationStore, model_path: str, run
) -> None:
    async def scenario() -> None:
        client = EngineClient(remote_options(model_path, llama_cpp_server))
        info = await client.start()
        try:
            assert client.backend == "remote" and info.backend == "remote"
            session = ChatSession(store, client)
            conversation = store.create_conversation()
            store.set_sampling(conversation.id, {"temperature": 0.0, "max_tokens": 24})
            tokenizer = client.local_tokenizer()
            control = set(tokenizer.tokenize("<|im_start|><|im_end|>", special=True))
            assert len(control) == 2
            previous: list[int] = []
            first: list[int] = []
            for turn, text in enumerate(TURNS):
                before = session.history_tokens(conversation.id)
                result = await session.send(conversation.id, text)
                assert result.status == "complete", result
                prompt = session.transcript(
                    store.get_conversation(conversation.id),
                    store.path_to(result.user_message_id),
                ).prompt()
                first = first or prompt
                # each prompt extends the last one's prompt and reply, token for token
                assert prompt[: len(previous)] == previous
                assert prompt[: len(before)] == before
                # what the server tokenizes from the text it got is Stoke's prompt: the same
                # text, the same control tokens in the same places, the same tokens up to the
                # first reply; a reply the model spelled in non-canonical tokens is the one
                # place the server's tokens may differ (app/engine/remote.py, `text` mode)
                sent = tokenizer.detokenize(prompt)
                served = post(llama_cpp_server, "/extras/tokenize", {"input": sent}, API_KEY)
                ids = served["tokens"]
                assert tokenizer.detokenize(ids) == sent, f"turn {turn + 1}"
                assert [t for t in ids if t in control] == [t for t in prompt if t in control]
                assert ids[: len(first)] == first
                assert result.stats.prompt_tokens == len(prompt)
                assert result.stats.generated_tokens == len(result.token_ids) > 0
                reply = store.get_message(result.reply_message_id)
                assert reply.token_ids == result.token_ids
                assert tokenizer.detokenize(reply.token_ids) == reply.content
                previous = prompt + result.token_ids
        finally:
            await client.close()

    run(scenario())


def test_session_over_stoke_serve_reuses_the_servers_cache(
    stoke_server: str, store: ConversationStore, tiny_model: str, run
) -> None:
    async def scenario() -> None:
        client = EngineClient(remote_options(tiny_model, stoke_server))
        await client.start()
        try:
            session = ChatSession(store, client)
            # an agent-sized history: follow-ups are then a few percent of each prompt
            notes = "\n".join(
                f"Town {i} has {i * 3 + 1} bridges and {i + 7} bakeries." for i in range(60)
            )
            conversation = store.create_conversation(system_prompt=f"Answer briefly.\n{notes}")
            store.set_sampling(conversation.id, {"temperature": 0.0, "max_tokens": 24})
            previous: list[int] = []
            held = 0  # of `previous`, what the server's KV holds
            for turn, text in enumerate((*TURNS, "Thank you. One more fact about it?")):
                result = await session.send(conversation.id, text)
                assert result.status == "complete", result
                prompt = session.transcript(
                    store.get_conversation(conversation.id),
                    store.path_to(result.user_message_id),
                ).prompt()
                assert prompt[: len(previous)] == previous  # appended, never rewritten
                stats = result.stats
                assert stats.prompt_tokens == len(prompt)
                if turn > 0:  # the server's own count of what its cache already held
                    assert stats.reused_tokens / stats.prompt_tokens >= 0.95, (turn, stats)
                    assert stats.reused_tokens >= held  # all the last turn left
                reply = store.get_message(result.reply_message_id)
                assert reply.token_ids == result.token_ids and reply.token_ids
                previous = prompt + result.token_ids
                # a reply cut at the limit ends in a token sampled but never evaluated
                held = len(previous) - (1 if stats.finish_reason == FinishReason.LENGTH else 0)
        finally:
            await client.close()

    run(scenario())


def test_wrong_key_is_refused_in_words(llama_cpp_server: str, model_path: str, run) -> None:
    async def scenario() -> None:
        client = EngineClient(remote_options(model_path, llama_cpp_server, api_key="wrong"))
        with pytest.raises(ModelLoadError, match="refused the API key"):
            await client.start()
        await client.close()

    run(scenario())


def test_unknown_model_names_what_the_server_has(
    llama_cpp_server: str, model_path: str, run
) -> None:
    async def scenario() -> None:
        client = EngineClient(remote_options(model_path, llama_cpp_server, model="no-such"))
        with pytest.raises(ModelLoadError, match="does not serve a model named 'no-such'"):
            await client.start()
        await client.close()

    run(scenario())


def test_server_down_is_said_in_words(model_path: str, run) -> None:
    async def scenario() -> None:
        client = EngineClient(remote_options(model_path, f"http://127.0.0.1:{free_port()}"))
        with pytest.raises(ModelLoadError, match="nothing is listening"):
            await client.start()
        await client.close()

    run(scenario())
