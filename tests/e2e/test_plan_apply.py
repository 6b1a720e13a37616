"""Plans applied to llama.cpp for real: overrides through ctypes, and the memory model
checked against what llama.cpp says it allocates (dry runs of the full replica)."""

from __future__ import annotations

import re
from collections import deque
from pathlib import Path

import llama_cpp
import pytest

from app.engine.gguf_info import GGUFInfo, inspect_gguf
from app.engine.llamacpp import cpu_buffers
from app.engine.llamacpp.backend import Vocab, _install_log
from app.engine.llamacpp.overrides import apply_overrides
from app.hardware.memory import (
    GIB,
    MIB,
    ContextShape,
    compute_bytes,
    kv_cache,
    measure_dry_run,
    parse_load_log,
    staging_bytes,
)
from app.hardware.placement import GPU_RESERVE
from app.hardware.planner import DeviceBudget, plan
from app.hardware.synthetic_gguf import write_deepseek4


@pytest.fixture(scope="module")
def flash(tmp_path_factory: pytest.TempPathFactory) -> GGUFInfo:
    return inspect_gguf(write_deepseek4(tmp_path_factory.mktemp("flash") / "f.gguf", mode="full"))


def _host_expert_plan(info: GGUFInfo, n_ctx: int):
    """A plan for one device (the CPU stands in for a GPU on CI) sized to hold everything but
    the experts: they must go to host memory through `-ot` rules."""
    shape = ContextShape(n_ctx, 512)
    experts = [t for t in info.tensors if t.kind == "expert"]
    embd = sum(t.n_bytes for t in info.tensors if t.name.startswith("token_embd."))
    non_expert = info.total_bytes - sum(t.n_bytes for t in experts) - embd
    first, _ = compute_bytes(info, shape, "gpu_first", staging=staging_bytes(experts))
    budget = non_expert + kv_cache(info, shape).total + first + GPU_RESERVE
    budget += min(t.n_bytes for t in experts) // 2  # room for no expert tensor at all
    device = DeviceBudget("CPU", budget, backend="cpu")
    return plan(info, [device], ram_bytes=8 * GIB, n_ctx=n_ctx, n_ubatch=512, margin=0.0)


def test_scaled_model_loads_with_a_plan_and_generates(tmp_path: Path) -> None:
    path = write_deepseek4(tmp_path / "scaled.gguf", mode="scaled", seed=1)
    info = inspect_gguf(path)
    p = _host_expert_plan(info, 512)
    assert p.fits
    assert p.overrides == ((r"_exps\.", "CPU"),)
    assert p.expert_bytes_gpu == 0

    log = _install_log()
    kept, log.lines = log.lines, deque()
    try:
        mparams = cpu_buffers.model_params()
        mparams.n_gpu_layers = p.n_gpu_layers
        mparams.use_extra_bufts = False
        keepalive = apply_overrides(mparams, p.overrides, tensor_split=p.tensor_split or None)
        model = llama_cpp.llama_model_load_from_file(str(path).encode(), mparams)
        loaded = parse_load_log("".join(log.lines))
    finally:
        log.lines = kept
    assert model
    del keepalive
    try:
        experts = {t.name for t in info.tensors if t.kind == "expert"}
        # llama.cpp's own log: every expert tensor, and nothing else, matched the CPU rule
        assert set(loaded["overridden"]) == experts
        assert set(loaded["overridden"].values()) == {"CPU"}
        tokens = _generate(model, "the quick brown fox jumps over the lazy dog. " * 4, 8)
    finally:
        llama_cpp.llama_model_free(model)
    assert len(tokens) == 8


def _generate(model: llama_cpp.llama_model_p, text: str, n: int) -> list[int]:
    vocab = Vocab(model)
    prompt = [llama_cpp.llama_vocab_bos(vocab.ptr), *vocab.tokenize(text)]
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = 512
    cparams.n_batch = cparams.n_ubatch = 512
    cparams.swa_full = False
    cparams.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    assert ctx
    sampler = llama_cpp.llama_sampler_init_greedy()
    out: list[int] = []
    try:
        batch = (llama_cpp.llama_token * len(prompt))(*prompt)
        assert llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(batch, len(prompt))) == 0
        for _ in range(n):
            token = llama_cpp.llama_sampler_sample(sampler, ctx, -1)
            out.append(token)
            one = (llama_cpp.llama_token * 1)(token)
            assert llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(one, 1)) == 0
    finally:
        llama_cpp.llama_sampler_free(sampler)
        llama_cpp.llama_free(ctx)
    return out


def test_seed_plan_rules_match_in_llama_cpp(flash: GGUFInfo) -> None:
    """The seed box's -ot patterns, run through llama.cpp's std::regex (buffer types swapped
    for the CPU, the only device here): exactly the expert tensors match."""
    gpus = [DeviceBudget(f"CUDA{i}", 12 * GIB) for i in range(4)]
    p = plan(flash, gpus, ram_bytes=128 * GIB, n_ctx=376_832, n_ubatch=2048)
    assert len(p.overrides) > 1
    rules = [(pattern, "CPU") for pattern, _ in p.overrides]
    measured = measure_dry_run(flash.path, 8192, 512, overrides=rules, swa_full=False)
    assert set(measured["overridden"]) == {t.name for t in flash.tensors if t.kind == "expert"}
    # first match wins: the rule that takes each expert tensor names the device the plan says
    expected = {}
    for d in p.devices:
        partial = dict(d.expert_layers_partial)
        for t in flash.tensors:
            if t.kind != "expert":
                continue
            base = t.name.split(".")[2]
            if t.layer in d.expert_layers_full or base in partial.get(t.layer, ()):
                expected[t.name] = d.name
    for name in measured["overridden"]:
        assert next(dev for pat, dev in p.overrides if re.search(pat, name)) == expected[name]


# (ctx, ubatch, swa_full): FIELD_NOTES' three points, the same with the window-sized raw
# cache the planner uses for deepseek4, and four points in between that the fit never saw.
CALIBRATION = [
    (8192, 512, True),
    (65536, 512, True),
    (376832, 2048, True),
    (8192, 512, False),
    (65536, 512, False),
    (376832, 2048, False),
    (98304, 1024, False),
    (229376, 4096, False),
    (12288, 256, True),
    (700000, 2048, False),
]


def test_memory_model_agrees_with_llama_cpp_dry_runs(flash: GGUFInfo) -> None:
    """KV exactly; the compute buffer as an upper envelope: never below llama.cpp, within 5%
    on average and at most points (llama.cpp's allocator makes its buffer step and dip with
    the context, which no smooth model follows closer everywhere)."""
    errors = []
    for n_ctx, n_ubatch, swa_full in CALIBRATION:
        measured = measure_dry_run(flash.path, n_ctx, n_ubatch, swa_full=swa_full)
        shape = ContextShape(n_ctx, n_ubatch, swa_full=swa_full)
        kv = kv_cache(flash, shape).total
        assert abs(measured["kv"]["CPU"] - kv) < 0.02 * MIB * len(measured["kv_caches"])
        model, source = compute_bytes(flash, shape, "cpu", backend="cpu")
        real = measured["compute"]["CPU"]
        error = model / real - 1
        errors.append(error)
        print(
            f"ctx {n_ctx:>9,} ubatch {n_ubatch:>5} swa_full {swa_full!s:5}: llama.cpp "
            f"{real / MIB:9.2f} MiB, model {model / MIB:9.2f} MiB ({error:+.1%}) [{source}]"
        )
        assert error > -0.001, "the model is below what llama.cpp allocates"
        assert error < 0.15
    assert sum(errors) / len(errors) < 0.05
    assert sum(e < 0.05 for e in errors) >= 3


def test_dry_run_reports_devices_of_each_layer(flash: GGUFInfo) -> None:
    measured = measure_dry_run(flash.path, 4096, 256, swa_full=False)
    assert set(measured["layer_device"].values()) == {"CPU"}
    assert len(measured["layer_device"]) == flash.block_count + 1  # the output layer too
    assert measured["compute"]["CPU"] > 0
