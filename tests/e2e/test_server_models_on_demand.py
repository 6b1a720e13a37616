"""Models on demand (app/pool) through the real server on loopback, with the official openai
client and `requests`: two library models (the tiny model and a twin of other weights), each
request answered by the model it names; within a budget that holds one, the second load
unloads the first, and coming back to the first's conversation restores its KV from the
snapshot its engine wrote on the way out (`cached_tokens` > 0, in a new engine process); an
idle model is unloaded after the TTL, the pinned one never; a model that cannot fit is a 503
in words; `model` left out is the default model; embeddings through the openai client (and
LiteLLM, where installed) load the model they name."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

import openai
import pytest
import requests

from app.engine.host import EngineClient
from app.engine.protocol import LoadOptions
from app.models.default import default_model_path
from app.models.library import Library
from app.pool.engines import EnginePool
from app.pool.need import memory_need
from tests.e2e.serving import API_KEY, ServerThread, document
from tests.tiny_model import SEED, write_tiny_chat_model

AUTH = {"Authorization": f"Bearer {API_KEY}"}
ASK = {"temperature": 0.0, "max_tokens": 6}
WAIT_S = 60.0  # the longest a TTL unload may take on a loaded box


@pytest.fixture
def library(tmp_path: Path, tiny_model: str) -> dict[str, LoadOptions]:
    """Two tiny models in a library folder of this test's home: name -> load options."""
    folder = tmp_path / "library"
    folder.mkdir()
    shutil.copy(tiny_model, folder / "tiny-a.gguf")
    write_tiny_chat_model(default_model_path(), folder / "tiny-b.gguf", seed=SEED + 1)
    Library().add_folder(folder)
    return {e.name: LoadOptions(str(e.path), n_ctx=1024, n_seq_max=2) for e in Library().models()}


def _pool(
    library: dict[str, LoadOptions], *, fits: int | None, ttl_s: float | None = None, **kw: str
) -> Callable[[], EnginePool]:
    """A pool of the library with tiny-a the default, in a budget that holds `fits` models
    (None: no limit)."""
    budget = None
    if fits is not None:
        needs = sorted(memory_need(o) for o in library.values())
        budget = sum(needs[:fits]) + needs[0] // 2
    entries = Library().models()
    return lambda: EnginePool.of_library(
        entries,
        library["tiny-a"],
        lambda entry: library[entry.name],
        lambda options: EngineClient(options, backend="llama.cpp"),
        budget=budget,
        ttl_s=ttl_s,
        **kw,
    )


def _states(server: ServerThread) -> dict[str, str]:
    listed = requests.get(f"{server.url}/models", headers=AUTH, timeout=30).json()["data"]
    return {m["id"]: m["state"] for m in listed}


def _wait_for(server: ServerThread, model: str, state: str) -> dict[str, str]:
    deadline = time.monotonic() + WAIT_S
    while (states := _states(server))[model] != state and time.monotonic() < deadline:
        time.sleep(0.2)
    return states


def test_two_models_alternate_within_a_budget_of_one(library: dict[str, LoadOptions]) -> None:
    with ServerThread(pool=_pool(library, fits=1)) as server:
        listed = requests.get(f"{server.url}/models", headers=AUTH, timeout=30).json()["data"]
        assert listed[0]["id"] == "tiny-a"  # the default first, for clients that take it
        a = listed[0]
        assert a["state"] == "loaded" and a["default"] and a["engine"] == "llama.cpp"
        assert a["capabilities"]["embeddings"] and a["context_length"] == 1024
        assert a["size_bytes"] > 0 and a["memory_bytes"] > a["size_bytes"]
        assert _states(server)["tiny-b"] == "unloaded"

        client = server.client()
        question = [{"role": "user", "content": document("harbour", 12) + "\nWhich town?"}]
        first = client.chat.completions.create(model="tiny-a", messages=question, **ASK)
        other = client.chat.completions.create(model="tiny-b", messages=question, **ASK)
        assert (first.model, other.model) == ("tiny-a", "tiny-b")
        assert other.choices[0].message.content != first.choices[0].message.content
        assert _states(server) == {"tiny-a": "unloaded", "tiny-b": "loaded"}
        ps = requests.get(f"{server.url.removesuffix('/v1')}/api/ps", headers=AUTH, timeout=30)
        assert [m["name"] for m in ps.json()["models"]] == ["tiny-b"]  # Ollama's view agrees

        follow_up = [
            *question,
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "And the next one?"},
        ]
        back = client.chat.completions.create(model="tiny-a", messages=follow_up, **ASK)
        assert back.model == "tiny-a"
        assert back.usage.prompt_tokens_details.cached_tokens > 0  # restored, not prefilled
        assert _states(server) == {"tiny-a": "loaded", "tiny-b": "unloaded"}

        vectors = client.embeddings.create(
            model="tiny-b", input="a glacier", encoding_format="float"
        )
        assert vectors.model == "tiny-b" and len(vectors.data[0].embedding) == 64
        assert _states(server) == {"tiny-a": "unloaded", "tiny-b": "loaded"}

        unnamed = requests.post(
            f"{server.url}/chat/completions",
            json={"messages": question, **ASK},
            headers=AUTH,
            timeout=120,
        ).json()
        assert unnamed["model"] == "tiny-a"  # the default model
        assert unnamed["choices"][0]["message"]["content"] == first.choices[0].message.content


def test_the_pinned_model_stays_and_one_that_cannot_fit_is_refused_in_words(
    library: dict[str, LoadOptions],
) -> None:
    with ServerThread(pool=_pool(library, fits=1, pin="tiny-a")) as server:
        with pytest.raises(openai.InternalServerError) as refused:
            server.client().chat.completions.create(
                model="tiny-b", messages=[{"role": "user", "content": "Hi"}], **ASK
            )
        assert refused.value.status_code == 503
        words = refused.value.body["message"]
        assert "'tiny-b' needs about" in words and "pinned model 'tiny-a'" in words
        assert "--budget" in words and "Traceback" not in words
        assert _states(server) == {"tiny-a": "loaded", "tiny-b": "unloaded"}


def test_ttl_unloads_an_idle_model_but_never_the_pinned_one(
    library: dict[str, LoadOptions],
) -> None:
    with ServerThread(pool=_pool(library, fits=None, ttl_s=0.5, pin="tiny-a")) as server:
        server.client().chat.completions.create(
            model="tiny-b", messages=[{"role": "user", "content": "Hi"}], **ASK
        )
        states = _wait_for(server, "tiny-b", "unloaded")
        assert states == {"tiny-a": "loaded", "tiny-b": "unloaded"}  # tiny-a idle longer


def test_serve_names_a_pin_it_does_not_have_in_one_line(stoke_here) -> None:
    code, _out, err = stoke_here("serve", "--port", "0", "--pin", "no-such-model")
    assert code == 1 and "--pin: no model 'no-such-model' here" in err
    assert "Traceback" not in err


def test_litellm_embeddings_load_the_model_they_name(library: dict[str, LoadOptions]) -> None:
    """LiteLLM's OpenAI provider against the pool."""
    import litellm  # a dev dependency; imported here, as it takes seconds to import

    with ServerThread(pool=_pool(library, fits=1)) as server:
        answer = litellm.embedding(
            model="openai/tiny-b", input=["a glacier"], api_base=server.url, api_key=API_KEY
        )
        assert len(answer.data[0]["embedding"]) == 64
        assert _states(server) == {"tiny-a": "unloaded", "tiny-b": "loaded"}
