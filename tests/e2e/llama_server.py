"""llama.cpp's real `llama-server`, built by `make llama-tools` from the engine's own llama.cpp
sources, serving a model (the default one unless told another) on loopback; a test can stop it
and start it again on the same port (a server restarted mid-conversation)."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from app.engine.llamacpp import cpu_buffers
from app.engine.llamacpp.tools import find_tools
from app.models.default import default_model_path
from tests.e2e.test_remote import free_port

N_CTX = 4096


def llama_server_binary() -> Path:
    """The built llama-server, or a skip that says how to build it."""
    found, reason = find_tools()
    if found is None:
        pytest.skip(reason)
    return found.llama_server


class LlamaServer:
    """One llama-server process at a fixed port; `start` again after `stop` comes back at the
    same URL with an empty cache."""

    def __init__(self, binary: Path, log: Path, *extra: str, model: str | None = None) -> None:
        self.binary = binary
        self.log = log
        self.model = model or str(default_model_path())
        self.extra = extra  # more llama-server flags
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        """One compute thread: the server shares the machine with the test and its engine, and
        llama.cpp's threads spin at each barrier while one of them waits for a core (two
        threads on a busy 2-core machine decoded 1-3 tokens a second, burning both cores)."""
        command = [
            *(str(self.binary), "--model", self.model),
            *("--host", "127.0.0.1", "--port", str(self.port), "--ctx-size", str(N_CTX)),
            *("--threads", "1", "--no-webui", *cpu_buffers.server_flags(), *self.extra),
        ]
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        self._wait_healthy()

    def stop(self) -> None:
        """Kill it outright, as a crash or a reboot would."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=30)
            self.process = None

    def get(self, path: str) -> object:
        with urllib.request.urlopen(self.url + path, timeout=10) as response:
            return json.loads(response.read())

    def _wait_healthy(self) -> None:
        """Until /health answers 200 (503 while the model loads)."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"llama-server exited: {self.log.read_text()[-2000:]}")
            try:
                if self.get("/health").get("status") == "ok":
                    return
            except (OSError, urllib.error.HTTPError, ValueError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"llama-server did not come up: {self.log.read_text()[-2000:]}")
