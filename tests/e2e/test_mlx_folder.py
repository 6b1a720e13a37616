"""The MLX engine on an mlx-lm folder (config.json + safetensors + a Hugging Face tokenizer),
made from the default GGUF: the same weights give the same greedy reply, and the folder's
tokenizer gives the GGUF's token ids."""

from __future__ import annotations

from pathlib import Path

from app.engine.host import EngineClient
from app.engine.mlx.backend import MlxEngine
from app.engine.protocol import LoadOptions, SamplingParams, TokenEvent
from tests.e2e.conftest import needs_mlx

PROMPT = "<|im_start|>user\nName three colours of the rainbow.<|im_end|>\n<|im_start|>assistant\n"


def _greedy(model: str) -> tuple[list[int], list[int], str]:
    engine = MlxEngine()
    info = engine.load(LoadOptions(model, n_ctx=1024, snapshots=False))
    try:
        prompt = engine.tokenize(PROMPT, special=True)
        events = list(engine.generate(prompt, SamplingParams.greedy(), 12))
        reply = [e.token_id for e in events if isinstance(e, TokenEvent)]
        text = "".join(e.text for e in events if isinstance(e, TokenEvent))
        assert info.chat_template and "<|im_start|>" in info.chat_template
        return prompt, reply, text
    finally:
        engine.unload()


@needs_mlx
def test_a_folder_runs_like_its_gguf(model_path, tmp_path: Path):
    from tests.e2e.mlx_folder import write_mlx_folder

    folder = write_mlx_folder(Path(model_path), tmp_path / "smollm2-mlx")
    assert EngineClient(LoadOptions(str(folder))).backend == "mlx"  # only MLX reads a folder
    from_folder = _greedy(str(folder))
    from_gguf = _greedy(model_path)
    assert from_folder == from_gguf
    assert from_folder[1] and from_folder[2].strip()
