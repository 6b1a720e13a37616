"""The llama-server a benchmark starts beside Stoke's engine gets the engine's own settings."""

from __future__ import annotations

from app.bench.llama_server import server_flags
from app.engine.protocol import LoadOptions


def _value(flags: list[str], flag: str) -> str:
    return flags[flags.index(flag) + 1]


def test_the_servers_flags_are_the_engines_options() -> None:
    options = LoadOptions(
        "model.gguf",
        n_ctx=70_000,
        n_batch=2048,
        n_ubatch=1024,
        n_threads=16,
        n_gpu_layers=44,
        flash_attn=True,
        kv_type="q8_0",
        overrides=(("blk\\.4[0-3]\\.ffn_.*_exps\\.", "CPU"),),
        tensor_split=(3.0, 4.0),
        cpu_buffers="none",
    )
    flags = server_flags(options)
    expected = {
        "--ctx-size": "70000",
        "--parallel": "1",
        "--batch-size": "2048",
        "--ubatch-size": "1024",
        "--threads": "16",
        "--threads-batch": "16",
        "-fa": "on",
        "-ctk": "q8_0",
        "-ctv": "q8_0",
        "-ngl": "44",
        "-ts": "3.0,4.0",
        "-ot": "blk\\.4[0-3]\\.ffn_.*_exps\\.=CPU",
    }
    assert {flag: _value(flags, flag) for flag in expected} == expected
    assert "--no-repack" in flags  # no extra CPU buffer types, as the engine was told
    assert "-nkvo" not in flags


def test_defaults_leave_threads_to_the_server_and_keep_the_kv_on_the_gpu() -> None:
    flags = server_flags(LoadOptions("model.gguf", cpu_buffers="all", kv_offload=False))
    assert "--threads" not in flags and "-ts" not in flags and "-ot" not in flags
    assert "--no-repack" not in flags and "-nkvo" in flags
    assert _value(flags, "-fa") == "off" and _value(flags, "-ngl") == "0"
