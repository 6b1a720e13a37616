"""DeepSeek V4 GGUFs as their publishers write them: antirez's headers (one MTP layer named but
not held, no shared-expert clamp, the `joyai-llm` pre-tokenizer, no chat template) and
unsloth's (a compress ratio for the MTP block, the 0731 version) load on both engines, which
agree on them; a model without a template is prompted with DeepSeek V4's own (the 0731
release's when its name says so); and the drafting heads ds4 publishes beside the model are
refused in words, naming what to load instead. Files that several tests read are written once
per module."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGUFWriter

from app.engine.chat_template import ChatTemplate, builtin_template
from app.engine.llamacpp.backend import LlamaCppEngine
from app.engine.mlx.backend import MlxEngine
from app.engine.mlx.gguf_deepseek_v4 import build
from app.engine.model_file import check_gguf
from app.engine.protocol import LoadOptions, ModelLoadError
from app.hardware.synthetic_gguf import write_deepseek4
from tests.e2e.stoke_proc import one_turn, stoke
from tests.e2e.test_deepseek_v4_logits import DIMS, llamacpp_logits

TOKENS = np.random.default_rng(3).integers(2, 512, 96).tolist()


@pytest.mark.parametrize("variant", ["antirez", "unsloth"])
def test_published_headers_load_on_both_engines_alike(tmp_path: Path, variant: str) -> None:
    gguf = write_deepseek4(
        tmp_path / f"{variant}.gguf",
        mode="scaled",
        seed=5,
        weights="f32",
        variant=variant,
        indexer_top_k=512,
        **DIMS,
    )
    weights, metadata = mx.load(str(gguf), return_metadata=True)
    model = build(weights, metadata)
    assert model.args.mtp_layers == 0 and model.args.num_hidden_layers == 6
    ours = np.array(model(mx.array([TOKENS]))[0])
    theirs = llamacpp_logits(gguf, TOKENS)
    assert (ours.argmax(-1) == theirs.argmax(-1)).mean() >= 0.99
    assert np.abs(ours - theirs).max() < 1e-3


@pytest.fixture(scope="module")
def antirez_flash(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An antirez file named as the Flash model: no template of its own."""
    folder = tmp_path_factory.mktemp("antirez")
    return write_deepseek4(
        folder / "DeepSeek-V4-Flash-q2.gguf", mode="scaled", seed=5, variant="antirez"
    )


@pytest.mark.parametrize("engine", ["mlx", "llama.cpp"])
def test_an_antirez_file_chats_with_deepseek_v4s_template(
    antirez_flash: Path, stoke_home: Path, engine: str
) -> None:
    gguf = antirez_flash
    answer = one_turn(stoke_home, gguf, engine, 3)  # its home holds the CPU verdict: no probe
    assert answer["status"] == "complete" and answer["stats"]["generated_tokens"] == 3
    engine = MlxEngine() if engine == "mlx" else LlamaCppEngine()
    info = engine.load(LoadOptions(str(gguf), n_ctx=256, snapshots=False))
    engine.unload()
    assert info.chat_template == builtin_template("deepseek4", "DeepSeek-V4-Flash")


def test_the_0731_release_gets_its_own_template() -> None:
    plain = builtin_template("deepseek4", "DeepSeek-V4-Flash")
    release = builtin_template("deepseek_v4", "DeepSeek-V4-Flash-0731-4bit")
    assert plain and release and plain != release
    assert builtin_template("llama", "DeepSeek-V4-Flash") is None
    messages = [{"role": "user", "content": "hi"}]
    effort = {"thinking": True, "reasoning_effort": "max"}
    rendered = ChatTemplate(release, variables=effort).render(messages, add_generation_prompt=True)
    assert "Beyond maximum" in rendered and rendered.endswith("<｜Assistant｜><think>")
    old = ChatTemplate(plain, variables=effort).render(messages, add_generation_prompt=True)
    assert "Absolute maximum" in old and "Beyond maximum" not in old


def test_a_drafting_head_is_refused_in_words(tmp_path: Path) -> None:
    """Each architecture ds4 publishes a head under is refused by the one check every load
    passes through; the CLI shows that check's words (once: its path is the same for both)."""
    for architecture in ("deepseek4_mtp_support", "deepseek4-dspark"):
        path = tmp_path / architecture / "DeepSeek-V4-Flash-MTP-Q4K-Q8_0-F32.gguf"
        path.parent.mkdir()
        writer = GGUFWriter(path, architecture)
        writer.add_tensor("mtp.0.enorm.weight", np.ones(8, np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        with pytest.raises(ModelLoadError) as refused:
            check_gguf(path)
        assert architecture in str(refused.value) and "not a model" in str(refused.value)
    done = stoke(tmp_path / "home", "chat", "--model", str(path), "--new", "-m", "hi")
    assert done.returncode != 0
    assert "not a model" in done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr


@pytest.fixture(scope="module")
def f32_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The float32 file llama.cpp's quantizer reads."""
    folder = tmp_path_factory.mktemp("f32")
    return write_deepseek4(folder / "f32.gguf", mode="scaled", seed=5, weights="f32")


@pytest.mark.parametrize("weights", ["q4_k_m", "iq4_xs"])
def test_k_quant_and_iq_files_run_on_llamacpp_with_the_reason(
    f32_source: Path, tmp_path: Path, weights: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files made by llama.cpp's own quantizer, as the published Q4_K/IQ ones are: on a Mac
    the engine choice sends them to llama.cpp in one line, an MLX load forced by hand is
    refused with the memory it would take, and llama.cpp answers from them."""
    from app.engine import choice
    from app.engine.llamacpp.quantize import requantize
    from app.engine.mlx.models import load_model
    from app.engine.protocol import SamplingParams, TokenEvent

    path = requantize(f32_source, tmp_path / f"{weights}.gguf", weights)
    kind = {"q4_k_m": "Q4_K", "iq4_xs": "IQ4_XS"}[weights]
    monkeypatch.setattr(choice, "apple_silicon", lambda: True)
    monkeypatch.setattr(choice, "mlx_installed", lambda: True)
    chosen = choice.choose_engine(LoadOptions(str(path)))
    assert chosen.engine == "llama.cpp" and kind in chosen.reason and "\n" not in chosen.reason
    with pytest.raises(ModelLoadError, match=r"float16.*llama\.cpp"):
        load_model(str(path))
    engine = LlamaCppEngine()
    engine.load(LoadOptions(str(path), n_ctx=256, snapshots=False))
    try:
        events = engine.generate(TOKENS[:32], SamplingParams.greedy(), 3)
        assert len([e for e in events if isinstance(e, TokenEvent)]) == 3
    finally:
        engine.unload()
