"""`stoke bench engines`, small, on the tests' tiny model: both sides of each engine run
(Stoke's llama.cpp engine beside llama-cpp-python's Llama and beside llama.cpp's own
llama-server where `make llama-tools` built it, as `make test` does; Stoke's MLX engine beside
mlx-lm's generate_step where MLX is installed, its device named), the table is printed and the
JSON written; with --plan, placed as `stoke plan` places it here.
Speeds depend on the machine: only that each side ran and gave a rate is checked."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from app.engine.llamacpp.tools import find_tools

REPO = Path(__file__).resolve().parents[2]


def test_bench_engines_runs_each_engine_beside_its_runtime(tmp_path: Path, tiny_model: str) -> None:
    report_path = tmp_path / "engines.json"
    command = [sys.executable, "-m", "app", "bench", "engines", "--model", tiny_model]
    command += ["--prompt", "16,32", "--decode", "4", "--rounds", "1", "--plan"]
    command += ["--json", str(report_path)]
    done = subprocess.run(
        command, cwd=REPO, env=os.environ.copy(), capture_output=True, text=True, timeout=600
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "Traceback" not in output, output
    report = json.loads(report_path.read_text("utf-8"))
    expected = {"llama.cpp"} | ({"mlx"} if importlib.util.find_spec("mlx") else set())
    tools, reason = find_tools()
    if tools is not None:
        expected.add("llama-server")
    else:
        assert report["skipped"]["llama-server"] == reason
        assert f"llama-server: not run: {reason}" in done.stdout
    assert sorted((row["engine"], row["prompt_tokens"]) for row in report["rows"]) == sorted(
        (name, length) for name in expected for length in (16, 32)
    )
    plan = report["plan"]  # --plan: placed as `stoke plan` places it here, for the longest prompt
    assert plan["fits"] and plan["n_ctx"] == 512, plan
    for row in report["rows"]:
        name, length = row["engine"], row["prompt_tokens"]
        lines = [line for line in done.stdout.splitlines() if line.startswith(f"| {name}")]
        assert any(f" | {row['beside']} | {length} |" in line for line in lines), done.stdout
        for side in ("stoke", "runtime"):
            assert row[side]["prefill_tok_s"] > 0 and row[side]["decode_tok_s"] > 0
