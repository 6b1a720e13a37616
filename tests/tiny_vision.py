"""A tiny vision model the tests write: the tiny chat model (tests/tiny_model.py) with a
LLaVA-style projector beside it (`mmproj-*.gguf`: a one-block ViT of width 32 on 56x56
images in 14x14 patches, then a two-layer MLP into the chat model's 64-wide embeddings),
random weights, about 140 kB. libmtmd loads the pair as it loads a published one; an image
becomes 16 tokens. Its answers mean nothing: the mechanics (an image's tokens, its KV
reused, restored and trimmed around) are the point.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import gguf
import numpy as np

from tests.tiny_model import N_EMBD

WIDTH, FF, HEADS, BLOCKS, IMAGE, PATCH = 32, 64, 2, 1, 56, 14
IMAGE_TOKENS = (IMAGE // PATCH) ** 2
SEED = 20261206


def write_projector(path: Path, projection: int = N_EMBD) -> Path:
    """An mmproj GGUF (projector type "mlp") whose output is `projection` wide."""
    rng = np.random.default_rng(SEED)
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_string("general.name", "stoke-tiny-vision-projector")
    writer.add_string("clip.projector_type", "mlp")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_bool("clip.has_audio_encoder", False)
    writer.add_bool("clip.use_gelu", True)
    for key, value in (
        ("image_size", IMAGE),
        ("patch_size", PATCH),
        ("embedding_length", WIDTH),
        ("feed_forward_length", FF),
        ("projection_dim", projection),
        ("block_count", BLOCKS),
        ("attention.head_count", HEADS),
    ):
        writer.add_uint32(f"clip.vision.{key}", value)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])

    def random(name: str, *shape: int) -> None:
        weights = rng.standard_normal(shape) / np.sqrt(shape[-1])
        writer.add_tensor(name, weights.astype(np.float32))

    def constant(name: str, value: float, size: int) -> None:
        writer.add_tensor(name, np.full(size, value, np.float32))

    random("v.patch_embd.weight", WIDTH, 3, PATCH, PATCH)
    constant("v.patch_embd.bias", 0.0, WIDTH)
    random("v.class_embd", WIDTH)
    random("v.position_embd.weight", IMAGE_TOKENS + 1, WIDTH)
    constant("v.pre_ln.weight", 1.0, WIDTH)
    constant("v.pre_ln.bias", 0.0, WIDTH)
    for i in range(BLOCKS):
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            random(f"v.blk.{i}.{name}.weight", WIDTH, WIDTH)
            constant(f"v.blk.{i}.{name}.bias", 0.0, WIDTH)
        for name in ("ln1", "ln2"):
            constant(f"v.blk.{i}.{name}.weight", 1.0, WIDTH)
            constant(f"v.blk.{i}.{name}.bias", 0.0, WIDTH)
        random(f"v.blk.{i}.ffn_up.weight", FF, WIDTH)
        constant(f"v.blk.{i}.ffn_up.bias", 0.0, FF)
        random(f"v.blk.{i}.ffn_down.weight", WIDTH, FF)
        constant(f"v.blk.{i}.ffn_down.bias", 0.0, WIDTH)
    random("mm.0.weight", projection, WIDTH)
    constant("mm.0.bias", 0.0, projection)
    random("mm.2.weight", projection, projection)
    constant("mm.2.bias", 0.0, projection)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_tiny_vision_model(tiny_chat: Path, folder: Path) -> Path:
    """`folder/tiny-vision.gguf` (the tiny chat model) with `mmproj-tiny-vision.gguf` beside
    it, as a hub repository lays a vision model out; returns the model's path."""
    folder.mkdir(parents=True, exist_ok=True)
    model = folder / "tiny-vision.gguf"
    shutil.copyfile(tiny_chat, model)
    write_projector(folder / "mmproj-tiny-vision.gguf")
    return model
