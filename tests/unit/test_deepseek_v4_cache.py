"""The DeepSeek V4 cache: chunked prefill and decode equal one pass; trims, checkpoints, snapshots.

A tiny random model (every layer kind: raw, 4:1 with the indexer picking 4 rows, 128:1) on
300 tokens, so 128:1 blocks complete, checkpoints pass and the indexer really chooses.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models.cache import load_prompt_cache, save_prompt_cache, trim_prompt_cache

from app.engine.mlx.deepseek_v4 import DeepseekV4Cache, Model, ModelArgs

N = 300
TOL = 2e-4


def tiny_args(**overrides: object) -> ModelArgs:
    fields = dict(
        vocab_size=97,
        hidden_size=32,
        num_hidden_layers=6,
        num_attention_heads=4,
        head_dim=32,
        qk_rope_head_dim=8,
        q_lora_rank=16,
        o_groups=2,
        o_lora_rank=8,
        sliding_window=8,
        compress_ratios=[0, 0, 4, 128, 4, 128],
        rope_scaling={
            "type": "yarn",
            "factor": 16.0,
            "original_max_position_embeddings": 64,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
        },
        index_n_heads=8,
        index_head_dim=16,
        index_topk=4,
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        num_hash_layers=2,
        hc_sinkhorn_iters=5,
    )
    fields.update(overrides)
    return ModelArgs(**fields)


def random_model(args: ModelArgs, seed: int = 0) -> Model:
    """Every float parameter random (fan-in scaled), the hash table a random expert pick."""
    model = Model(args)
    rng = np.random.default_rng(seed)
    params = {}
    for name, value in tree_flatten(model.parameters()):
        if name.endswith("tid2eid"):
            table = np.argsort(rng.random((args.vocab_size, args.n_routed_experts)), axis=1)
            params[name] = mx.array(table[:, : args.num_experts_per_tok].astype(np.int32))
        elif value.ndim >= 2:
            params[name] = mx.array(rng.standard_normal(value.shape) / np.sqrt(value.shape[-1]))
        else:
            params[name] = mx.array(1.0 + 0.3 * rng.standard_normal(value.shape))
    model.update(tree_unflatten(list(params.items())))
    model.set_dtype(mx.float32)
    return model


@pytest.fixture(scope="module")
def model() -> Model:
    return random_model(tiny_args())


@pytest.fixture(scope="module")
def tokens() -> list[int]:
    return np.random.default_rng(1).integers(0, 97, N).tolist()


@pytest.fixture(scope="module")
def one_pass(model: Model, tokens: list[int]) -> np.ndarray:
    return np.array(model(mx.array([tokens]))[0])


def run(model: Model, cache: list[DeepseekV4Cache], tokens: list[int], sizes: list[int]):
    """Feed `tokens` in chunks of `sizes` (then one at a time); logits of every position."""
    out, start = [], 0
    for size in [*sizes, *([1] * len(tokens))]:
        if start >= len(tokens):
            break
        chunk = tokens[start : start + size]
        out.append(np.array(model(mx.array([chunk]), cache)[0]))
        start += len(chunk)
    return np.concatenate(out)


def test_chunked_prefill_and_decode_equal_one_pass(model, tokens, one_pass) -> None:
    cache = model.make_cache()
    chunked = run(model, cache, tokens, [5, 64, 3, 57, 127, 2])  # ends mid-block, then decode
    assert chunked.shape == one_pass.shape
    assert np.abs(chunked - one_pass).max() < TOL
    assert {c.offset for c in cache} == {N}


def test_indexer_really_chooses(model, tokens) -> None:
    """With 4 of up to 75 rows picked, the pick matters: attending to all rows differs."""
    everything = Model(tiny_args(index_topk=512))
    everything.update(model.parameters())
    picked = np.array(model(mx.array([tokens]))[0])
    all_rows = np.array(everything(mx.array([tokens]))[0])
    assert np.abs(picked - all_rows)[:19].max() < TOL  # <= 4 rows visible: the same rows
    assert np.abs(picked - all_rows)[-50:].max() > 1e-2


def test_trim_within_history_is_exact(model, tokens, one_pass) -> None:
    cache = model.make_cache(history=64)
    run(model, cache, tokens, [N])
    assert [c.trim(45) for c in cache] == [45] * len(cache)
    again = run(model, cache, tokens[N - 45 :], [40])
    assert np.abs(again - one_pass[N - 45 :]).max() < TOL


def test_trim_beyond_history_falls_back_to_a_checkpoint(model, tokens, one_pass) -> None:
    cache = model.make_cache(history=16)
    run(model, cache, tokens, [200, 100])
    target = 170  # 130 back: before the exact-trim floor (284), after checkpoint 128
    trimmed = {c.trim(N - target) for c in cache}
    assert trimmed == {N - 128}
    assert {c.offset for c in cache} == {128}
    again = run(model, cache, tokens[128:], [42, 5, 120])
    assert np.abs(again - one_pass[128:]).max() < TOL


def test_trim_to_zero_and_nothing(model, tokens, one_pass) -> None:
    cache = model.make_cache(history=8)
    run(model, cache, tokens[:50], [50])
    assert [c.trim(0) for c in cache] == [0] * len(cache)
    assert [c.trim(1000) for c in cache] == [50] * len(cache)
    again = run(model, cache, tokens[:60], [60])
    assert np.abs(again - one_pass[:60]).max() < TOL


def test_snapshot_restore_branches(model, tokens, one_pass) -> None:
    cache = model.make_cache(history=4)
    run(model, cache, tokens[:150], [150])
    saved = [c.snapshot() for c in cache]
    other = np.random.default_rng(9).integers(0, 97, 60).tolist()
    run(model, cache, other, [33])  # a different continuation writes into the same buffers
    for c, s in zip(cache, saved, strict=True):
        c.restore(s)
    again = run(model, cache, tokens[150:], [100, 45])
    assert np.abs(again - one_pass[150:]).max() < TOL


def test_reachable_is_the_same_rule_for_every_layer(model, tokens) -> None:
    cache = model.make_cache(history=10, checkpoint_every=256)
    run(model, cache, tokens, [N])
    for position in (0, 100, 255, 256, 289, 290, 299):
        assert len({c.reachable(position) for c in cache}) == 1
    assert cache[0].reachable(290) == 290
    assert cache[0].reachable(289) == 256
    assert cache[0].reachable(255) == 0


def test_checkpoint_interval_must_cover_every_ratio() -> None:
    with pytest.raises(ValueError, match="multiple of 128"):
        DeepseekV4Cache(4, checkpoint_every=100)


def test_one_sequence_at_a_time(model) -> None:
    with pytest.raises(ValueError, match="one sequence"):
        model(mx.zeros((2, 3), mx.int32))


def test_save_and_load_through_mlx_lm(model, tokens, one_pass, tmp_path) -> None:
    cache = model.make_cache(history=20)
    run(model, cache, tokens[:200], [130, 70])
    path = str(tmp_path / "cache.safetensors")
    save_prompt_cache(path, cache)
    loaded = load_prompt_cache(path)
    assert [type(c) for c in loaded] == [DeepseekV4Cache] * len(cache)
    assert [c.offset for c in loaded] == [200] * len(cache)
    again = run(model, loaded, tokens[200:], [90, 5])
    assert np.abs(again - one_pass[200:]).max() < TOL
    assert trim_prompt_cache(loaded, N - 150) == N - 128  # its checkpoints came along
