"""The CPU buffer-type verdict (issue 13): probed in children that may crash, cached by machine
and build, used by every load, shown by `stoke doctor`.

The probe children are real (they load the probe model with llama.cpp and decode); where a
test needs a crash on a CPU that has none, the probe's test hook (STOKE_TEST_PROBE_CRASH)
makes the named policies' child die by SIGSEGV before its first decode, as AMX does.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import llama_cpp
import pytest

from app.engine.llamacpp import cpu_buffers
from app.engine.llamacpp.probe import CRASH_ENV
from tests.conftest import VERDICT_FILE


@pytest.fixture
def unprobed(stoke_home: Path) -> Path:
    """A home whose machine was never probed."""
    (stoke_home / "cache" / VERDICT_FILE).unlink(missing_ok=True)
    return stoke_home


def _doctor(home: Path, **env: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "app", "doctor", "--json"],
        env={**os.environ, "STOKE_HOME": str(home), **env},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["llama_cpp"]["buffer_types"]


def _chat(home: Path, model: str, **env: str) -> dict:
    command = ["chat", "--model", model, "--new", "--message", "hi", "--max-tokens", "4"]
    done = subprocess.run(
        [sys.executable, "-m", "app", *command, "--json"],
        env={**os.environ, "STOKE_HOME": str(home), **env},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_verdict_is_probed_once_then_cached(
    unprobed: Path, tiny_model: str, monkeypatch: pytest.MonkeyPatch
):
    """A verdict cached before the attention probe existed (format 1) is not trusted: the
    first look probes, caches the verdict with its V type, and every later one reads it (the
    later look is the function `stoke doctor` reads it with, here in this process: a second
    `stoke doctor` cost seconds of its other probes)."""
    cache = unprobed / "cache" / VERDICT_FILE
    key = cpu_buffers._key_hash(cpu_buffers.machine_key())
    old = {"policy": "all", "reason": "old", "extra_types": [], "trials": {}, "key": key}
    cache.write_text(json.dumps({"format": 1, "verdicts": {key: old}}))
    first = _doctor(unprobed)
    assert first["source"] == "probe" and first["policy"] in cpu_buffers.POLICIES
    assert first["reason"] and first["trials"]["none"] == "ran"
    # the attention probe timed both V types (which one wins is this CPU's)
    assert first["exact_v"] in cpu_buffers.V_TYPES
    assert "f16 V" in first["exact_v_reason"] and "q8_0 V" in first["exact_v_reason"]
    assert json.loads(cache.read_text())["verdicts"][key]["exact_v"] == first["exact_v"]
    assert cache.stat().st_mode & 0o777 == 0o600
    before = cache.stat()

    # Any probe now would fail on every policy: a start that probed again could not keep the
    # verdict, and would rewrite the cache. The engine starts, chats, and the verdict stands.
    broken_probe = {CRASH_ENV: "all,no-amx,none"}
    assert _chat(unprobed, tiny_model, **broken_probe)["reply"]
    monkeypatch.setenv(CRASH_ENV, broken_probe[CRASH_ENV])
    again = cpu_buffers.machine_verdict(cache=cache)
    assert again.source == "cache" and again.policy == first["policy"]
    after = cache.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_a_crashing_type_is_turned_off_and_the_rest_kept(unprobed, monkeypatch):
    """As on an AMX machine: "all" crashes, "no-amx" runs and agrees, so CPU_REPACK stays.
    The names of the types are the only fake; the probe children are real (the buffer
    probe's: the attention probe, which times V types, is the first test's)."""
    monkeypatch.setattr(cpu_buffers, "extra_type_names", lambda: ("AMX", "CPU_REPACK"))
    monkeypatch.setenv(CRASH_ENV, "all")
    verdict = cpu_buffers._buffers()
    assert verdict.policy == "no-amx"
    assert "SIGSEGV" in verdict.trials["all"] and "agreed" in verdict.trials["no-amx"]
    assert "AMX buffer type failed" in verdict.reason and "CPU_REPACK kept" in verdict.reason

    monkeypatch.setenv(CRASH_ENV, "all,no-amx")
    verdict = cpu_buffers._buffers()
    assert verdict.policy == "none" and "plain CPU buffers" in verdict.reason


def test_a_probe_that_cannot_run_is_not_cached(unprobed, monkeypatch):
    monkeypatch.setenv(CRASH_ENV, "none,attention")  # the timing child's seconds unspent
    cache = unprobed / "cache" / VERDICT_FILE
    verdict = cpu_buffers.machine_verdict(cache=cache)
    if not cpu_buffers.extra_type_names():
        pytest.skip("this llama.cpp build offers no extra CPU buffer types: nothing to probe")
    assert verdict.policy == "none" and verdict.source == "probe failed"
    assert "could not run" in verdict.reason and not cache.exists()


def test_the_exact_attention_keeps_the_faster_v_by_a_margin():
    assert cpu_buffers.faster_v({"f16": 0.93e-3, "q8_0": 0.46e-3}) == "q8_0"  # an Intel Xeon
    assert cpu_buffers.faster_v({"f16": 0.50e-3, "q8_0": 0.58e-3}) == "f16"
    assert cpu_buffers.faster_v({"f16": 0.50e-3, "q8_0": 0.48e-3}) == "f16"  # within the margin


def test_an_attention_probe_that_crashes_keeps_an_f16_v(monkeypatch):
    monkeypatch.setenv(CRASH_ENV, "attention")
    crashed = "the attention probe crashed (killed by SIGSEGV)"
    assert cpu_buffers._exact_v("none") == ("f16", crashed)


def test_policies_set_llama_cpp_params():
    plain = cpu_buffers.model_params("none")
    assert plain.use_extra_bufts is False
    assert cpu_buffers.model_params("all").use_extra_bufts is True
    with pytest.raises(ValueError):
        cpu_buffers.model_params("fast")


def test_llama_server_gets_the_policy_as_its_one_switch():
    """llama-server can only turn every extra buffer type off (tests/e2e/llama_server.py runs
    it with these flags: on an AMX machine whose verdict is "no-amx" it died at warm-up)."""
    assert cpu_buffers.server_flags("all") == []
    assert cpu_buffers.server_flags("no-amx") == cpu_buffers.server_flags("none") == ["--no-repack"]


@pytest.mark.parametrize("policy", cpu_buffers.POLICIES)
def test_the_plans_llama_server_command_carries_this_cpus_flag(
    policy: str, model_path, monkeypatch, capsys
):
    """`stoke plan` for this machine prints a llama-server command that runs here: on an AMX
    machine whose verdict turned AMX off, raw llama-server dies at warm-up."""
    from app.cli import plan as plan_cli

    verdict = replace(cpu_buffers.machine_verdict(), policy=policy)
    monkeypatch.setattr(cpu_buffers, "machine_verdict", lambda **_: verdict)
    parser = argparse.ArgumentParser()
    plan_cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(["plan", model_path, "--ctx", "2048", "--json"])
    assert args.run(args) == 0
    command = json.loads(capsys.readouterr().out)["command"].split()
    assert command[0] == "llama-server"
    assert command.count("--no-repack") == (policy != "all")


def test_llama_helper_loads_with_the_verdict(model_path):
    """The one helper tests and benchmarks use instead of llama_cpp.Llama's raw defaults."""
    seen = []
    original = llama_cpp.llama_cpp.llama_model_default_params
    llm = cpu_buffers.llama(model_path, policy="none", n_ctx=256, verbose=False)
    try:
        seen.append(llm.model_params.use_extra_bufts)
        assert llm.tokenize(b"hi")
    finally:
        llm.close()
    assert seen == [False]
    assert llama_cpp.llama_cpp.llama_model_default_params is original


def test_bench_reports_each_policy_side_by_side(stoke_home: Path, tmp_path: Path):
    report_path = tmp_path / "report.json"
    command = [sys.executable, "-m", "app", "bench", "cpu-buffers", "--rounds", "1"]
    command += ["--prompt", "32", "--decode", "4", "--json", str(report_path)]
    done = subprocess.run(
        command,
        env={**os.environ, "STOKE_HOME": str(stoke_home)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(report_path.read_text())
    rows = {(r["model"], r["policy"]): r for r in report["rows"]}
    policies = {"none", "all"} | ({"no-amx"} if "AMX" in report["extra_types"] else set())
    assert {p for _, p in rows} == policies and {m for m, _ in rows} == {"Q4_1 (default)", "Q4_0"}
    for row in rows.values():
        if "error" not in row:
            assert row["prompt_tok_s"] > 0 and row["decode_tok_s"] > 0
    assert rows[("Q4_0", "none")]["buffers"] and "| Q4_0 | all |" in done.stdout
