"""Running `python -m app` as a real process on a test's STOKE_HOME, optionally with that home
mounted read-only (a private mount namespace: chmod does not stop root, a mount does)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter

REPO = Path(__file__).resolve().parents[2]
_READ_ONLY = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" "$0" && exec "$@"'


def stoke(
    home: Path, *argv: str, read_only: bool = False, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    """`stoke ARGV` with STOKE_HOME=home and no display (so `stoke` is the terminal chat)."""
    hidden = ("QT_QPA_PLATFORM", "DISPLAY", "WAYLAND_DISPLAY")
    env = {k: v for k, v in os.environ.items() if k not in hidden} | {"STOKE_HOME": str(home)}
    command = [sys.executable, "-m", "app", *argv]
    if read_only:
        command = [*_namespace(), "sh", "-c", _READ_ONLY, str(home), *command]
    return subprocess.run(
        command, cwd=REPO, env=env, input=stdin, capture_output=True, text=True, timeout=300
    )


def one_turn(home: Path, model: Path, engine: str, max_tokens: int) -> dict:
    """`stoke chat --new -m hi --json` on `model` with `engine`, greedy; its JSON answer (the
    test fails with the process's stderr when it does not answer)."""
    done = stoke(
        home,
        "chat",
        "--engine",
        engine,
        "--model",
        str(model),
        "--new",
        "-m",
        "hi",
        "--json",
        "--temperature",
        "0",
        "--max-tokens",
        str(max_tokens),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def _namespace() -> list[str]:
    """unshare's arguments for a private mount namespace (a user namespace too when not root),
    or a skip that says why there is none."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) to mount the data folder read-only")
    user = [] if os.geteuid() == 0 else ["-r"]
    probe = subprocess.run(
        ["unshare", *user, "-m", "sh", "-c", _READ_ONLY, "/", "true"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        pytest.skip(f"cannot mount read-only here: {probe.stderr.strip()}")
    return ["unshare", *user, "-m"]


def tiny_gguf(path: Path) -> Path:
    """A small llama GGUF the library can list (it does not need to run)."""
    writer = GGUFWriter(path, "llama")
    writer.add_block_count(1)
    writer.add_context_length(256)
    writer.add_tensor("token_embd.weight", np.ones((8, 32), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
