"""Where llama-server and rpc-server are looked for, and the words when they are not there."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from app.engine.llamacpp import tools


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("STOKE_BUILD_CACHE", str(tmp_path))
    monkeypatch.delenv(tools.EXTRA_ARGS_ENV, raising=False)
    monkeypatch.setenv("STOKE_LLAMA_FLAVOR", "cpu")
    return tmp_path


def test_the_key_names_the_version_and_flavor_and_hashes_extra_flags(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert tools.tools_dir("1.2.3") == cache / "llama-tools" / "1.2.3-cpu"
    monkeypatch.setenv(tools.EXTRA_ARGS_ENV, "-DGGML_AVX512=OFF")
    hashed = tools.cache_key("1.2.3")
    assert hashed.startswith("1.2.3-cpu-") and hashed != "1.2.3-cpu"
    monkeypatch.setenv(tools.EXTRA_ARGS_ENV, "-DGGML_AVX512=ON")
    assert tools.cache_key("1.2.3") != hashed


def test_missing_programs_are_named_with_the_command_that_builds_them(cache: Path) -> None:
    version = importlib.metadata.version(tools.DISTRIBUTION)
    found, reason = tools.find_tools()
    assert found is None
    assert "llama-server and rpc-server" in reason and "are not built" in reason
    assert version in reason and "make llama-tools" in reason
    bin_dir = tools.tools_dir(version) / "bin"
    bin_dir.mkdir(parents=True)
    for name in tools.PROGRAMS:
        (bin_dir / name).write_text("#!/bin/sh\n")
    (bin_dir / "llama-server").chmod(0o755)
    found, reason = tools.find_tools()
    assert found is None and "rpc-server for" in reason and "is not built" in reason
    (bin_dir / "rpc-server").chmod(0o755)
    found, reason = tools.find_tools()
    assert found == tools.LlamaTools(bin_dir / "llama-server", bin_dir / "rpc-server")
    assert reason == ""
