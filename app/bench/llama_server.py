"""llama.cpp's own `llama-server` (built by `make llama-tools` from the engine's llama.cpp),
started on loopback with the flags that match an engine's `LoadOptions`, for the benchmarks
that put Stoke's llama.cpp engine beside it (`stoke bench engines`).

Its figures are llama.cpp's own: each /completion answers with `timings` measured inside the
server (`prompt_per_second`, `predicted_per_second`), so neither HTTP nor Python is in them.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from app.engine.llamacpp import cpu_buffers
from app.engine.protocol import EngineError, LoadOptions


def server_flags(options: LoadOptions) -> list[str]:
    """llama-server's flags for what `options` set in Stoke's engine: context, batches,
    threads, one sequence, flash attention, KV type, layers and tensors placed as planned,
    and this machine's CPU buffer policy."""
    flags = [
        *("--ctx-size", str(options.n_ctx), "--parallel", "1"),
        *("--batch-size", str(options.n_batch), "--ubatch-size", str(options.n_ubatch)),
        *("-fa", "on" if options.flash_attn else "off"),
        *("-ctk", options.kv_type, "-ctv", options.kv_type),
        *("-ngl", str(options.n_gpu_layers)),
        *cpu_buffers.server_flags(options.cpu_buffers),
    ]
    if options.n_threads:
        flags += ["--threads", str(options.n_threads), "--threads-batch", str(options.n_threads)]
    if options.tensor_split:
        flags += ["-ts", ",".join(str(share) for share in options.tensor_split)]
    if options.overrides:
        flags += ["-ot", ",".join(f"{pattern}={buffer}" for pattern, buffer in options.overrides)]
    if not options.kv_offload:
        flags.append("-nkvo")
    return flags


class LlamaServer:
    """One running llama-server: token prompts to /completion, chats to its OpenAI endpoint."""

    def __init__(self, url: str) -> None:
        self.url = url

    def complete(
        self, prompt: list[int], n_predict: int, *, cached: bool = False
    ) -> dict[str, float]:
        """`prompt` and `n_predict` greedy tokens, the end token ignored; a fresh prompt
        unless `cached` (then the server keeps what of its cache matches). Its `timings`."""
        body = {
            "prompt": prompt,
            "n_predict": n_predict,
            "cache_prompt": cached,
            "ignore_eos": True,
            "temperature": 0.0,
            "top_k": 1,
        }
        return self._post("/completion", body)["timings"]

    def chat(self, messages: list[dict[str, str]], *, cached: bool) -> dict[str, float]:
        """One greedy token of a reply to `messages`, sent whole as a stateless client does;
        the server renders them with its template and, if `cached`, reuses what its cache
        still matches (--cache-reuse: chunks after a difference too). Its `timings`
        (`prompt_n`: the tokens it evaluated)."""
        body = {"messages": messages, "max_tokens": 1, "temperature": 0.0, "cache_prompt": cached}
        return self._post("/v1/chat/completions", body)["timings"]

    def _post(self, path: str, body: dict) -> dict:
        request = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=3600) as response:
            return json.loads(response.read())


@contextmanager
def running(
    binary: Path, options: LoadOptions, log: Path, extra: Sequence[str] = ()
) -> Iterator[LlamaServer]:
    """llama-server on a free loopback port with `options`' flags and `extra`, until the
    block ends."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [
        *(str(binary), "--model", options.model_path, "--host", "127.0.0.1"),
        *("--port", str(port), "--no-webui", *server_flags(options), *extra),
    ]
    with log.open("ab") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, process, log)
        yield LlamaServer(url)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_healthy(url: str, process: subprocess.Popen, log: Path) -> None:
    """Until /health says ok (503 while the model loads); a server that exits is an
    EngineError (`stoke` says it in words) with the end of its log."""
    deadline = time.monotonic() + 1800  # a full-size model reads for minutes
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise EngineError(
                f"llama.cpp's llama-server stopped while loading; its log ends:\n{tail}"
            )
        try:
            with urllib.request.urlopen(url + "/health", timeout=10) as response:
                if json.loads(response.read()).get("status") == "ok":
                    return
        except (OSError, urllib.error.HTTPError, ValueError):
            pass
        time.sleep(0.2)
    raise EngineError("llama.cpp's llama-server did not become ready in 30 minutes")
