"""llama-server's utility endpoints on Stoke's server, with the tiny model: tokenize and
detokenize round-trip, the template's text, props, slots, and Prometheus metrics that count
what the replies did (prompt tokens reused by a follow-up among them)."""

from __future__ import annotations

import re

import requests

from tests.e2e.serving import API_KEY, ServerThread

SERVE_TINY = True  # conftest's `served` runs the tiny chat model
KEY = {"Authorization": f"Bearer {API_KEY}"}


def _post(served: ServerThread, path: str, body: dict) -> requests.Response:
    return requests.post(served.url.removesuffix("/v1") + path, json=body, headers=KEY, timeout=60)


def _get(served: ServerThread, path: str) -> requests.Response:
    return requests.get(served.url.removesuffix("/v1") + path, headers=KEY, timeout=60)


def test_tokenize_detokenize_and_the_template(served: ServerThread) -> None:
    tokens = _post(served, "/tokenize", {"content": "Hello there"}).json()["tokens"]
    assert tokens and all(isinstance(t, int) for t in tokens)
    assert _post(served, "/detokenize", {"tokens": tokens}).json() == {"content": "Hello there"}
    pieces = _post(served, "/tokenize", {"content": "Hello there", "with_pieces": True}).json()
    assert "".join(p["piece"] for p in pieces["tokens"]) == "Hello there"
    bad = _post(served, "/detokenize", {"tokens": [-1]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    prompt = _post(served, "/apply-template", {"messages": [{"role": "user", "content": "Hi"}]})
    assert "Hi" in prompt.json()["prompt"]


def test_props_slots_and_metrics_follow_the_replies(served: ServerThread) -> None:
    props = _get(served, "/props").json()
    assert props["default_generation_settings"]["n_ctx"] > 0 and props["chat_template"]
    client = served.client()
    history = [{"role": "user", "content": "Count with me: one, two"}]
    first = client.chat.completions.create(
        model=served.model, messages=history, max_tokens=6, temperature=0
    )
    history += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "Go on."},
    ]
    client.chat.completions.create(
        model=served.model, messages=history, max_tokens=6, temperature=0
    )
    slots = _get(served, "/slots").json()
    assert any(s["n_tokens"] > 0 and not s["is_processing"] for s in slots)
    text = _get(served, "/metrics").text

    def value(name: str) -> float:
        return float(re.search(rf"^stoke:{name} (\S+)$", text, re.M)[1])

    assert value("replies_total") >= 2
    assert value("prompt_tokens_reused_total") > 0  # the follow-up reused the first turn
    assert value("ttft_seconds_count") >= 2
    assert re.search(r'^stoke:model_loaded\{model=".+"\} 1$', text, re.M)
    assert requests.get(served.url.removesuffix("/v1") + "/metrics", timeout=60).status_code == 401


def test_return_progress_streams_the_prompts_prefill(served: ServerThread) -> None:
    """llama-server's `return_progress`: before the reply's first words, chunks with
    `prompt_progress` (total, processed, time_ms) as each prefill step ends."""
    long_prompt = " ".join(f"item {i}," for i in range(250))  # a few prefill chunks
    chunks = list(
        served.client().chat.completions.create(
            model=served.model,
            messages=[{"role": "user", "content": long_prompt}],
            max_tokens=2,
            temperature=0,
            stream=True,
            extra_body={"return_progress": True},
        )
    )
    steps = [c.model_extra["prompt_progress"] for c in chunks if "prompt_progress" in c.model_extra]
    assert len(steps) >= 2, steps
    processed = [s["processed"] for s in steps]
    assert processed == sorted(processed) and processed[-1] == steps[-1]["total"]
    first_words = next(i for i, c in enumerate(chunks) if c.choices and c.choices[0].delta.content)
    last_step = max(i for i, c in enumerate(chunks) if "prompt_progress" in c.model_extra)
    assert last_step < first_words


def test_a_slot_is_saved_erased_and_restored(served: ServerThread) -> None:
    """llama-server's slot actions over Stoke's snapshot store: save writes the slot's KV,
    erase makes the slot forget its tokens, restore brings them back into the KV from the
    snapshot (read, not prefilled)."""
    client = served.client()
    history = [{"role": "user", "content": "A slot to keep: " + "words " * 80}]
    client.chat.completions.create(
        model=served.model, messages=history, max_tokens=4, temperature=0
    )
    slots = _get(served, "/slots").json()
    index = max(range(len(slots)), key=lambda i: slots[i]["n_tokens"])
    held = slots[index]["n_tokens"]
    saved = _post(served, f"/slots/{index}?action=save", {"filename": "keep.bin"}).json()
    # the KV holds all but the reply's last token (sampled, not yet read back)
    assert held - 1 <= saved["n_saved"] <= held and saved["filename"] == "keep.bin"
    restored = _post(served, f"/slots/{index}?action=restore", {}).json()
    assert restored["n_restored"] >= held - 1
    erased = _post(served, f"/slots/{index}?action=erase", {}).json()
    assert erased["n_erased"] == held
    assert _get(served, "/slots").json()[index]["n_tokens"] == 0
    nothing = _post(served, f"/slots/{index}?action=restore", {})
    assert nothing.status_code == 400 and "no conversation" in nothing.json()["error"]["message"]
    assert _post(served, "/slots/999?action=save", {}).status_code == 400
    assert _post(served, f"/slots/{index}?action=fly", {}).json()["error"]["param"] == "action"
