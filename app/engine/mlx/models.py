"""Loading a model for the MLX engine from a path: a GGUF file or an mlx-lm folder.

The architecture picks the code that builds the model (`registry`); the weights are then
put in the form the device runs fastest, and the tokenizer and chat template come from the
model itself.
"""

from __future__ import annotations

import importlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import mlx.nn as nn

from app.engine.gguf_info import GGUFInfo, inspect_gguf, split_parts
from app.engine.mlx.fit import fit_device
from app.engine.mlx.gguf_vocab import GGUFVocab, read_vocab
from app.engine.mlx.registry import FOLDER_MODULES, GGUF_BUILDERS, mlx_bytes, not_compact
from app.engine.mlx.tokenizer import GGUFTokenizer, HFTokenizer, MlxTokenizer
from app.engine.model_file import check_gguf, fingerprint
from app.engine.protocol import ModelLoadError

if TYPE_CHECKING:
    from app.engine.llamacpp.backend import Vocab

GIB = 1 << 30
GGUFBuilder = Callable[[dict[str, mx.array], dict[str, Any]], nn.Module]


@dataclass
class LoadedModel:
    """A model ready to run, and what ModelInfo needs to know about it."""

    model: nn.Module
    tokenizer: MlxTokenizer
    name: str
    architecture: str
    fingerprint: str
    n_ctx_train: int
    n_vocab: int
    chat_template: str | None
    bos_token: str
    eos_token: str
    add_bos: bool
    bos_id: int | None
    eog_ids: frozenset[int]
    size_bytes: int


def _import(target: str) -> Any:
    module, _, attribute = target.partition(":")
    loaded = importlib.import_module(module)
    return getattr(loaded, attribute) if attribute else loaded


def load_tokenizer(model_path: str) -> MlxTokenizer:
    """The tokenizer alone (no weights), for building prompts in the app's process."""
    path = Path(model_path).expanduser()
    if path.is_dir():
        return HFTokenizer(_check_folder(path))
    return GGUFTokenizer(gguf_vocab(check_gguf(path)))


def gguf_vocab(path: Path) -> GGUFVocab | Vocab:
    """A GGUF's tokenizer, rebuilt without llama.cpp where gguf_vocab knows it (the
    byte-level BPE ones), else through llama.cpp's vocab-only load."""
    vocab = read_vocab(path)
    if vocab is not None:
        return vocab
    from app.engine.llamacpp.backend import load_vocab

    return load_vocab(str(path))


def load_model(model_path: str) -> LoadedModel:
    """An mlx-lm folder or a GGUF file, loaded with its tokenizer and chat template."""
    path = Path(model_path).expanduser()
    if path.is_dir():
        return _load_folder(_check_folder(path))
    return _load_gguf(check_gguf(path))


def _load_gguf(path: Path) -> LoadedModel:
    from app.engine.mlx.gguf_llama import meta_value

    weights, metadata = _read_gguf(path)
    architecture = meta_value(metadata, "general.architecture")
    if not architecture or not weights:
        raise ModelLoadError(
            f"Could not load the model {path.name}: it names no architecture or holds no "
            "tensors. The file may be truncated or damaged; download it again."
        )
    target = GGUF_BUILDERS.get(architecture)
    if target is None:
        raise ModelLoadError(
            f"Could not load the model {path.name} with MLX: it is a {architecture!r} model "
            f"and MLX runs {', '.join(sorted(GGUF_BUILDERS))}. Choose the llama.cpp engine."
        )
    builder: GGUFBuilder = _import(target)
    model = fit_device(builder(weights, metadata), gguf=True)
    vocab = gguf_vocab(path)
    bos, eos = vocab.bos, vocab.eos
    arch_key = f"{architecture}.context_length"
    return LoadedModel(
        model=model,
        tokenizer=GGUFTokenizer(vocab),
        name=meta_value(metadata, "general.name") or path.stem,
        architecture=architecture,
        fingerprint=fingerprint(path),
        n_ctx_train=int(meta_value(metadata, arch_key, 0)),
        n_vocab=vocab.n_tokens,
        chat_template=meta_value(metadata, "tokenizer.chat_template"),
        bos_token=vocab.text(bos),
        eos_token=vocab.text(eos),
        add_bos=vocab.add_bos,
        bos_id=bos if bos >= 0 else None,
        eog_ids=vocab.eog_ids(),
        size_bytes=sum(part.stat().st_size for part in split_parts(path)),
    )


def _read_gguf(path: Path) -> tuple[dict[str, mx.array], dict[str, Any]]:
    """Every tensor the file's table names, kept compact, and its metadata. `mx.load` reads
    what it can; the rest (after an MXFP4 tensor, in later parts of a split model) is read by
    the table (`gguf_tensors`). A file MLX would expand to float16 is refused in words."""
    from app.engine.mlx import gguf_tensors

    try:
        info = inspect_gguf(path)
    except ModelLoadError as exc:
        raise ModelLoadError(f"Could not load the model {path.name}: {exc}") from exc
    heavy = not_compact(info)
    if heavy:
        raise ModelLoadError(expansion_refusal(path.name, info, heavy))
    try:
        weights, metadata = mx.load(str(info.files[0]), return_metadata=True)
    except (RuntimeError, ValueError) as exc:
        raise ModelLoadError(
            f"Could not load the model {path.name}: MLX could not read it ({exc}). The file "
            "may be truncated or damaged; download it again or try the llama.cpp engine."
        ) from exc
    absent = gguf_tensors.missing(info, weights)
    if absent:
        weights.update(gguf_tensors.read(info, absent))
    return weights, metadata


def expansion_refusal(name: str, info: GGUFInfo, heavy: Counter[str]) -> str:
    """Why MLX does not run a file of K-quant/IQ tensors, in one line with the numbers."""
    types = ", ".join(sorted(heavy))
    return (
        f"MLX would expand {name}'s {types} tensors to float16: about "
        f"{mlx_bytes(info) / GIB:,.0f} GiB in memory for a {info.total_bytes / GIB:,.0f} GiB "
        "file. The llama.cpp engine runs it at its own size; choose it for this model."
    )


def _check_folder(folder: Path) -> Path:
    if not (folder / "config.json").is_file() or not any(folder.glob("*.safetensors")):
        raise ModelLoadError(
            f"{folder} is a folder but not an MLX model (config.json plus .safetensors weights)."
        )
    return folder


def _model_classes(config: dict[str, Any]) -> tuple[type, type]:
    from mlx_lm.utils import _get_classes

    target = FOLDER_MODULES.get(config.get("model_type", ""))
    if target is None:
        return _get_classes(config)
    module = _import(target)
    return module.Model, module.ModelArgs


def _load_folder(folder: Path) -> LoadedModel:
    from mlx_lm.utils import load_config
    from mlx_lm.utils import load_model as mlx_lm_load_model

    try:
        own = load_config(folder).get("model_type") in FOLDER_MODULES
        # Stoke's own modules quantize themselves from the tensors in `sanitize` (mixed
        # recipes, every mode); mlx-lm's pass over config.json's `quantization` would then
        # meet layers already quantized.
        overrides = {"quantization": None, "quantization_config": None} if own else None
        model, config = mlx_lm_load_model(
            folder, model_config=overrides, get_model_classes=_model_classes
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"Could not load the model {folder.name}: {exc}") from exc
    model = fit_device(model, gguf=False)
    tokenizer = HFTokenizer(folder)
    hf = tokenizer.hf
    size = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=folder.name,
        architecture=str(config.get("model_type", "unknown")),
        fingerprint=fingerprint(folder),
        n_ctx_train=int(config.get("max_position_embeddings") or 0),
        n_vocab=len(hf),
        chat_template=hf.chat_template if isinstance(hf.chat_template, str) else None,
        bos_token=hf.bos_token or "",
        eos_token=hf.eos_token or "",
        add_bos=hf.bos_token_id is not None and bool(getattr(hf, "add_bos_token", False)),
        bos_id=hf.bos_token_id,
        eog_ids=frozenset(tokenizer.wrapper.eos_token_ids),
        size_bytes=size,
    )
