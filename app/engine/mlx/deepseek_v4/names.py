"""DeepSeek V4's tensor names in every published format, mapped onto this model's.

One map, four dialects. This model's parameters follow DeepSeek's own release (the
"official" names of its inference code); the others are read into them here:

| this model (official)          | mlx-lm (mlx-community)                 | GGUF              |
|--------------------------------|----------------------------------------|-------------------|
| embed                          | model.embed_tokens                     | token_embd        |
| norm / head                    | model.norm / lm_head                   | output_norm/output|
| hc_head_fn, _base, _scale      | model.hc_head.fn, .base, .scale        | output_hc_fn, ... |
| layers.N.hc_attn.fn            | model.layers.N.attn_hc.fn              | blk.N.hc_attn_fn  |
|   (the release: hc_attn_fn)    |   (ffn_hc likewise)                    |                   |
| layers.N.attn.wq_a ... wo_b    | model.layers.N.attn.wq_a ... wo_b      | blk.N.attn_q_a ...|
| layers.N.ffn.gate.bias         | ...ffn.gate.e_score_correction_bias    | blk.N.exp_probs_b |
| ...ffn.shared_experts.w1/w2/w3 | ...shared_experts.gate/down/up_proj    | blk.N.ffn_*_shexp |
| ...ffn.switch_mlp.gate_proj ...| the same (stacked)                     | blk.N.ffn_*_exps  |
|   (the release: per expert,    |                                        |                   |
|   ffn.experts.E.w1/w2/w3)      |                                        |                   |

mlx-vlm writes mlx-lm's names under `language_model.` (and its vision tower beside them,
which a text model does not load); Hugging Face Transformers' namespace (`model.layers.N.
self_attn.`, `.mlp.`, `.weight_scale_inv`) is read too. `canonical` takes any of these;
`gguf_to_model` takes a GGUF tensor name. Quantized modules keep their suffixes
(`.weight`, `.scales`, `.biases`) through either.
"""

from __future__ import annotations

# mlx-lm / Transformers top-level modules -> this model's
_TOP = {
    "embed_tokens": "embed",
    "lm_head": "head",
    "hc_head.fn": "hc_head_fn",
    "hc_head.base": "hc_head_base",
    "hc_head.scale": "hc_head_scale",
}
# inside a layer: mlx-lm / Transformers part -> this model's
_LAYER = (
    (".self_attn.", ".attn."),
    (".mlp.", ".ffn."),
    (".attn_hc.", ".hc_attn."),
    (".ffn_hc.", ".hc_ffn."),
    (".gate.e_score_correction_bias", ".gate.bias"),
    (".shared_experts.gate_proj.", ".shared_experts.w1."),
    (".shared_experts.down_proj.", ".shared_experts.w2."),
    (".shared_experts.up_proj.", ".shared_experts.w3."),
)
_OFFICIAL_EXPERT = {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}
# mlx-vlm's non-language parts (the vision tower, its aligner, the image markers)
_VISION = ("vision.", "vision_model.", "aligner.", "image_start", "image_end", "image_newline",
           "image_pad")  # fmt: skip


def canonical(name: str) -> str | None:
    """This model's name (official) for a tensor named in any published MLX or Hugging Face
    dialect; None for a tensor a text model does not hold (mlx-vlm's vision tower)."""
    if name.startswith("language_model."):
        name = name.removeprefix("language_model.")
    elif name.startswith(_VISION):
        return None
    name = name.removeprefix("model.")
    name = name.replace(".weight_scale_inv", ".scale")
    for prefix, ours in _TOP.items():
        if name == prefix or name.startswith(prefix + "."):
            return ours + name[len(prefix) :]
    if not name.startswith("layers."):
        return name
    for theirs, ours in _LAYER:
        name = name.replace(theirs, ours)
    layer, _, rest = name.removeprefix("layers.").partition(".")
    for stage in ("hc_attn_", "hc_ffn_"):  # the official release's flat names
        if rest.startswith(stage):
            rest = f"{stage[:-1]}.{rest[len(stage) :]}"
    if rest.startswith("ffn.experts."):  # Transformers' per-expert names
        expert, proj, suffix = rest.removeprefix("ffn.experts.").split(".", 2)
        rest = f"ffn.experts.{expert}.{_OFFICIAL_EXPERT.get(proj, proj)}.{suffix}"
    return f"layers.{layer}.{rest}"


# GGUF tensor -> module whose parameters it fills (".weight", ".scales", ... appended)
_GGUF_GLOBAL_MODULES = {"token_embd": "embed", "output_norm": "norm", "output": "head"}
_GGUF_LAYER_MODULES = {
    "attn_norm": "attn_norm",
    "attn_q_a": "attn.wq_a",
    "attn_q_a_norm": "attn.q_norm",
    "attn_q_b": "attn.wq_b",
    "attn_kv": "attn.wkv",
    "attn_kv_a_norm": "attn.kv_norm",
    "attn_output_a": "attn.wo_a",
    "attn_output_b": "attn.wo_b",
    "attn_compressor_kv": "attn.compressor.wkv",
    "attn_compressor_gate": "attn.compressor.wgate",
    "attn_compressor_norm": "attn.compressor.norm",
    "indexer.proj": "attn.indexer.weights_proj",
    "indexer.attn_q_b": "attn.indexer.wq_b",
    "indexer_compressor_kv": "attn.indexer.compressor.wkv",
    "indexer_compressor_gate": "attn.indexer.compressor.wgate",
    "indexer_compressor_norm": "attn.indexer.compressor.norm",
    "ffn_norm": "ffn_norm",
    "ffn_gate_exps": "ffn.switch_mlp.gate_proj",
    "ffn_up_exps": "ffn.switch_mlp.up_proj",
    "ffn_down_exps": "ffn.switch_mlp.down_proj",
    "ffn_gate_shexp": "ffn.shared_experts.w1",
    "ffn_down_shexp": "ffn.shared_experts.w2",
    "ffn_up_shexp": "ffn.shared_experts.w3",
}
# The MTP block's own tensors (the rest of block n_layer maps as a layer's, under mtp.0.block)
_GGUF_NEXTN_MODULES = {
    "nextn.eh_proj": "eh_proj",
    "nextn.enorm": "enorm",
    "nextn.hnorm": "hnorm",
    "nextn.shared_head_norm": "norm",
}
# GGUF tensor -> the one parameter it is
_GGUF_GLOBAL_ARRAYS = {
    "output_hc_fn": "hc_head_fn",
    "output_hc_base": "hc_head_base",
    "output_hc_scale": "hc_head_scale",
}
_GGUF_LAYER_ARRAYS = {
    "attn_sinks": "attn.attn_sink",
    "attn_compressor_ape": "attn.compressor.ape",
    "indexer_compressor_ape": "attn.indexer.compressor.ape",
    "hc_attn_fn": "hc_attn.fn",
    "hc_attn_base": "hc_attn.base",
    "hc_attn_scale": "hc_attn.scale",
    "hc_ffn_fn": "hc_ffn.fn",
    "hc_ffn_base": "hc_ffn.base",
    "hc_ffn_scale": "hc_ffn.scale",
    "ffn_gate_inp": "ffn.gate.weight",
    "ffn_gate_tid2eid": "ffn.gate.tid2eid",
    "exp_probs_b": "ffn.gate.bias",
}


def gguf_to_model(gguf_name: str, mtp_block: int = -1) -> str | None:
    """The parameter a GGUF tensor fills (None: not one of this model's tensors); block
    `mtp_block` is the MTP block."""
    base, _, suffix = gguf_name.rpartition(".")
    modules, arrays, prefix = _GGUF_GLOBAL_MODULES, _GGUF_GLOBAL_ARRAYS, ""
    if base.startswith("blk."):
        _, layer, base = base.split(".", 2)
        modules, arrays, prefix = _GGUF_LAYER_MODULES, _GGUF_LAYER_ARRAYS, f"layers.{layer}."
        if int(layer) == mtp_block:
            if base in _GGUF_NEXTN_MODULES:
                return f"mtp.0.{_GGUF_NEXTN_MODULES[base]}.{suffix}"
            prefix = "mtp.0.block."
    if base in arrays:
        return prefix + arrays[base]
    return f"{prefix}{modules[base]}.{suffix}" if base in modules else None
