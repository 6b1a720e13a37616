"""The wizard in words: sizes in GiB, token counts, where a plan puts the model, and the
names of engines, profiles and KV types. No widgets here."""

from __future__ import annotations

from app.hardware.planner import DevicePlan, Plan, describe_choice
from app.units import GIB, gib

ENGINE_TEXT = {"llama.cpp": "llama.cpp", "mlx": "MLX"}  # a plan places tensors for llama.cpp

PROFILE_TEXT = {
    "balanced": (
        "Balanced",
        "Good prefill and decode: a larger micro-batch only while it keeps about as many "
        "experts on the GPUs",
    ),
    "prefill-heavy": (
        "Prefill-heavy",
        "Long prompts and documents: the largest micro-batch that fits, even if some experts "
        "move to RAM",
    ),
    "decode-heavy": (
        "Decode-heavy",
        "Long replies: the smallest micro-batch, so the most experts stay on the GPUs",
    ),
}
KV_TEXT = {
    "f16": "f16 — full precision",
    "bf16": "bf16 — full precision",
    "q8_0": "q8_0 — half the memory, nearly lossless",
    "q5_1": "q5_1 — about a third",
    "q5_0": "q5_0 — about a third",
    "q4_1": "q4_1 — about a quarter",
    "q4_0": "q4_0 — a quarter of the memory",
    "f32": "f32 — twice f16's memory",
}


def gib_pair(used: int, budget: int) -> str:
    """ "10.3 / 11.1 GiB": both numbers with the same decimals."""
    digits = 2 if max(abs(used), abs(budget)) < 10 * GIB else 1
    return f"{gib(used, digits, unit=False)} / {gib(budget, digits)}"


def short_tokens(n: int) -> str:
    """4096 -> "4K", 1048576 -> "1M"."""
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20}M"
    if n % 1024 == 0:
        return f"{n >> 10}K"
    return f"{n:,}"


def capitalized(text: str) -> str:
    return text[:1].upper() + text[1:]


def layers_text(d: DevicePlan, n_layer: int) -> str:
    parts = []
    if d.layers is not None:
        first, last = d.layers
        if last >= n_layer:  # the output layer is unit n_layer
            parts.append(f"layers {first}–{last - 1} + output" if last > first else "output layer")
        else:
            parts.append(f"layers {first}–{last}" if last > first else f"layer {first}")
    full, partial = len(d.expert_layers_full), len(d.expert_layers_partial)
    if full or partial:
        experts = f"{full} expert layer{'s' if full != 1 else ''}"
        if partial:
            experts += f" + {partial} partial"
        parts.append(experts)
    return " · ".join(parts)


def summary(p: Plan) -> str:
    """Where the model's weights go, in one line."""
    has_gpus = len(p.devices) > 1
    if not has_gpus:
        return "Everything runs on the CPU, in system RAM: no GPU is used."
    if p.expert_bytes_total and not p.expert_bytes_gpu:
        return (
            f"No experts fit on the GPUs: all {gib(p.expert_bytes_total)} of them stay in RAM; "
            "attention and shared weights on the GPUs."
        )
    if p.expert_bytes_total:
        return (
            f"Experts on GPUs: {p.expert_layers_on_gpu:.1f} of {p.n_layer} layers "
            f"({gib(p.expert_bytes_gpu)} of {gib(p.expert_bytes_total)}); attention and shared "
            "weights on the GPUs."
        )
    return f"All {p.n_layer} layers on the GPUs."


def resident_words(n: int) -> str:
    """What keeping `n` conversations loaded costs: each has a KV cache of the whole context
    (a stream of its own, llama.cpp's kv_unified off), so the KV memory is n times one's."""
    if n == 1:
        return "one KV cache of the whole context"
    return f"each its own KV cache of the whole context: {n}x the KV memory of one"


def details(p: Plan) -> str:
    has_gpus = len(p.devices) > 1
    where = "on the GPUs" if has_gpus and p.kv_offload else "in RAM"
    seqs = f"{p.n_seq_max} conversation{'s' if p.n_seq_max != 1 else ''} kept loaded"
    if p.n_seq_max > 1:  # the planner counts a KV stream each: say what that comes to
        kv = sum(d.kv for d in p.devices)
        seqs += (
            f", each with its own KV cache ({p.n_seq_max}x the KV memory: {gib(kv)}, "
            f"{gib(kv // p.n_seq_max)} each)"
        )
    return (
        f"Micro-batch {p.n_ubatch} · KV cache {p.kv_type} {where} · {seqs} · "
        f"{p.margin:.0%} of each budget kept free"
    )


def choice_text(p: Plan) -> str:
    if len(p.devices) > 1:
        return capitalized(describe_choice(p))
    ram = p.devices[-1]
    return f"Micro-batch {p.n_ubatch}, KV {p.kv_type}: {gib(ram.total)} of RAM, " + (
        "fits" if p.fits else "does not fit"
    )


def html_text(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
