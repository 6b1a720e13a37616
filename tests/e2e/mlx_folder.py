"""An mlx-lm model folder made from a GGUF, for testing the MLX engine's folder path offline.

The weights are the GGUF's own, as MLX loads them (quantized layers stay quantized, saved
with mlx-lm's per-layer quantization config); the tokenizer is a Hugging Face
`tokenizer.json` built from the GGUF's byte-level BPE vocabulary and merges. Nothing is
downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_mlx_folder(gguf: Path, folder: Path) -> Path:
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from app.engine.mlx.gguf_llama import build, model_args

    weights, metadata = mx.load(str(gguf), return_metadata=True)
    args = model_args(metadata, weights)
    model = build(weights, metadata)
    folder.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(
        str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())), {"format": "mlx"}
    )
    embed = model.model.embed_tokens
    config = {
        "model_type": "llama",
        "hidden_size": args.hidden_size,
        "num_hidden_layers": args.num_hidden_layers,
        "intermediate_size": args.intermediate_size,
        "num_attention_heads": args.num_attention_heads,
        "num_key_value_heads": args.num_key_value_heads,
        "rms_norm_eps": args.rms_norm_eps,
        "vocab_size": args.vocab_size,
        "max_position_embeddings": args.max_position_embeddings,
        "rope_theta": args.rope_theta,
        "rope_traditional": True,  # the GGUF's q/k rows are in llama.cpp's RoPE order
        "tie_word_embeddings": args.tie_word_embeddings,
        "quantization": {
            "group_size": 32,
            "bits": 4,
            "model.embed_tokens": {"group_size": embed.group_size, "bits": embed.bits},
        },
    }
    (folder / "config.json").write_text(json.dumps(config), "utf-8")

    write_tokenizer(metadata, folder)
    return folder


def write_tokenizer(
    metadata: dict[str, Any], folder: Path, chat_template: str | None = None
) -> None:
    """A GGUF's byte-level BPE vocabulary as a Hugging Face tokenizer (`tokenizer.json`) and
    its `tokenizer_config.json`, with the GGUF's chat template unless another is given."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    from app.engine.mlx.gguf_llama import meta_value

    tokens = list(metadata["tokenizer.ggml.tokens"])
    kinds = metadata["tokenizer.ggml.token_type"].tolist()
    merges = [tuple(m.split(" ", 1)) for m in metadata["tokenizer.ggml.merges"]]
    tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    control = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True) for t, k in zip(tokens, kinds, strict=True) if k == control]
    )
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tokens[int(meta_value(metadata, "tokenizer.ggml.bos_token_id"))],
        "eos_token": tokens[int(meta_value(metadata, "tokenizer.ggml.eos_token_id"))],
        "add_bos_token": False,
        "chat_template": chat_template or metadata["tokenizer.chat_template"],
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config), "utf-8")
