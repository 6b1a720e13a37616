"""The Models page in words and numbers: column titles, verdict tips, download states,
and how parameter counts, context lengths and time left are written. No widgets here."""

from __future__ import annotations

import logging
from typing import Any

from app.hardware.detect import Hardware
from app.models.catalog import (
    DOES_NOT_FIT,
    FITS_CPU_OFFLOAD,
    FITS_EXPERT_OFFLOAD,
    FITS_GPU,
    RUNS_ON_CPU,
    budget,
)
from app.models.library import LibraryError
from app.ui.theme import STATUS
from app.units import decimal_bytes, gib

BUNDLED = "bundled"
BUNDLED_TIP = "Comes with Stoke, ready to chat: read-only (it cannot be deleted or renamed)"
EMPTY_LIBRARY = "No models yet — import a GGUF or download one from the Catalog"
EMPTY_DOWNLOADS = "No downloads — pick a model in the Catalog, or enter a Hugging Face repo above"
COLUMNS = ("Name", "Source", "Format", "Architecture", "Params", "Quant", "Context", "Size")
COLUMN_TIPS = (
    "The model's file or folder name",
    "Bundled: comes with Stoke · linked: the file stays where it is",
    "GGUF (llama.cpp) or MLX (Apple Silicon)",
    "The model architecture from its metadata",
    "Parameter count",
    "Quantization: how many bits the weights take",
    "The longest context the model was trained for",
    "Size on disk (all parts of a split set)",
)

LINKED = "linked ↗"


def library_footer(count: int, folder_bytes: int, n_folders: int, linked: int, bundled: int) -> str:
    """ "2 models · 0 bytes in the library folder · 1 linked, 1 bundled": what the library's
    folders hold on disk, apart from the models that live elsewhere."""
    folders = "the library folder" if n_folders == 1 else "the library folders"
    parts = [
        f"{count} model{'s' if count != 1 else ''}",
        f"{decimal_bytes(folder_bytes)} in {folders}",
    ]
    elsewhere = [f"{n} {what}" for n, what in ((linked, "linked"), (bundled, BUNDLED)) if n]
    if elsewhere:
        parts.append(", ".join(elsewhere))
    return " · ".join(parts)


GREEN, AMBER, RED, GREY = STATUS["ok"], STATUS["warn"], STATUS["error"], STATUS["idle"]
FIT_COLORS = {"good": GREEN, "warn": AMBER, "bad": RED, "unknown": GREY}
FIT_TIPS = {
    FITS_GPU: "The weights and a working KV cache fit in GPU memory: the fastest way to run it.",
    FITS_EXPERT_OFFLOAD: (
        "Attention and shared weights on the GPU, routed experts in RAM: how a large "
        "mixture-of-experts model runs well on one workstation."
    ),
    FITS_CPU_OFFLOAD: "Part of the model on the GPU, the rest in RAM: it works, more slowly.",
    RUNS_ON_CPU: "No GPU Stoke can use: it runs from RAM on the CPU, slowly for large models.",
    DOES_NOT_FIT: "It needs more memory than this machine's GPUs and RAM have together.",
}
STATE_TEXT = {
    "starting": ("Contacting the hub…", GREY),
    "running": ("Downloading", STATUS["busy"]),
    "paused": ("Paused", AMBER),
    "done": ("Done", GREEN),
    "failed": ("Failed", RED),
    "cancelled": ("Cancelled", GREY),
}


def format_parameters(count: int | None) -> str:
    """135M, 1.7B, 284B: how model cards write parameter counts."""
    if not count:
        return "—"
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= scale:
            value = count / scale
            return f"{value:.1f}{unit}" if value < 10 else f"{value:.0f}{unit}"
    return str(count)


def format_context(tokens: int | None) -> str:
    """8K, 128K, 1M for the usual powers of two; the exact count otherwise."""
    if not tokens:
        return "—"
    if tokens % (1 << 20) == 0:
        return f"{tokens >> 20}M"
    if tokens % 1024 == 0:
        return f"{tokens >> 10}K"
    return f"{tokens:,}"


def format_eta(seconds: float | None) -> str:
    if seconds is None:
        return ""
    whole = max(int(seconds + 0.5), 1)
    if whole < 60:
        return f"{whole} s left"
    minutes, secs = divmod(whole, 60)
    if minutes < 10:
        return f"{minutes} min {secs:02d} s left"
    if minutes < 60:
        return f"{minutes} min left"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min left"


def fit_level(text: str) -> str:
    if text == FITS_GPU:
        return "good"
    if text == DOES_NOT_FIT:
        return "bad"
    return "warn"


SETTING_LABELS = {
    "engine": "Engine",
    "n_ctx": "Context (tokens)",
    "n_batch": "Prompt batch (tokens)",
    "n_ubatch": "Compute batch (tokens)",
    "n_seq_max": "Conversations kept loaded",
    "n_threads": "CPU threads",
    "n_gpu_layers": "Layers on the GPU",
    "flash_attn": "Flash attention",
    "overrides": "Tensor placement",
    "tensor_split": "Split across GPUs",
    "kv_type": "KV cache type",
    "swa_full": "Full sliding-window cache",
    "kv_offload": "KV cache on the GPU",
    "cpu_buffers": "Repacked CPU weights",
    "chat_template": "Chat template",
    "snapshots": "KV snapshots",
}


def setting_label(key: str) -> str:
    """A load setting's name as the Hardware dialog says it, never the raw key."""
    return SETTING_LABELS.get(key) or key.removeprefix("n_").replace("_", " ").capitalize()


def describe_settings(settings: dict[str, Any]) -> str:
    """Saved load settings in a few lines (lists of rules are counted, not printed)."""
    lines = []
    for key, value in sorted(settings.items(), key=lambda item: setting_label(item[0])):
        if isinstance(value, list | tuple):
            if not value:
                continue
            shown = f"{len(value)} rules" if key == "overrides" else ", ".join(map(str, value))
        elif isinstance(value, bool):
            shown = "on" if value else "off"
        elif isinstance(value, int) and key in ("n_ctx", "n_batch", "n_ubatch"):
            shown = f"{value:,}"
        else:
            shown = str(value)
        lines.append(f"{setting_label(key)}: {shown}")
    return "\n".join(lines)


def machine_summary(hardware: Hardware) -> str:
    room = budget(hardware)
    ram = gib(hardware.memory.total)
    if hardware.apple is not None:
        return f"{hardware.apple.chip}: {gib(room.gpu_bytes)} for the GPU, {ram} in all"
    if room.gpu_bytes:
        count = len(hardware.gpus)
        gpus = f"{count} GPU{'s' if count > 1 else ''}"
        return f"{gpus} with {gib(room.gpu_bytes)} for models · {ram} RAM"
    return f"No GPU Stoke can use · {ram} RAM"


def library_error_words(exc: Exception) -> str:
    """A library or download error is written for the user; anything else is a bug: said
    without its text, with its traceback in the log."""
    if isinstance(exc, LibraryError):  # DownloadError too
        return str(exc)
    logging.getLogger("stoke.ui.models").error("a library task failed", exc_info=exc)
    return "Something went wrong reading the library; the details are in Stoke's log."
