"""llama.cpp's threads are told to spin briefly at barriers (llamacpp/openmp.py) unless the
user chose how libgomp waits, in processes whose entry points run it before llama.cpp loads."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from app.engine.llamacpp.openmp import SPIN_COUNT, spin_briefly


@pytest.fixture(autouse=True)
def unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)


def test_spin_count_is_set_when_the_user_chose_nothing() -> None:
    spin_briefly()
    assert os.environ["GOMP_SPINCOUNT"] == str(SPIN_COUNT)


@pytest.mark.parametrize("chosen", [("GOMP_SPINCOUNT", "50000"), ("OMP_WAIT_POLICY", "ACTIVE")])
def test_the_users_choice_is_kept(monkeypatch: pytest.MonkeyPatch, chosen: tuple[str, str]) -> None:
    monkeypatch.setenv(*chosen)
    spin_briefly()
    assert os.environ[chosen[0]] == chosen[1]
    assert chosen[0] == "GOMP_SPINCOUNT" or "GOMP_SPINCOUNT" not in os.environ


def test_the_entry_points_load_llama_cpp_only_after_their_main_starts() -> None:
    """libgomp reads its environment once, when llama.cpp loads it: importing the engine
    process's and the peer server's modules must not load llama.cpp yet."""
    probe = (
        "import sys, app.engine.worker, app.engine.llamacpp.peer_server\n"
        "print('llama_cpp' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr
