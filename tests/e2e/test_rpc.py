"""Beyond one machine: the default model split over this CPU and two real llama.cpp rpc-servers
on loopback (built from the engine's own llama.cpp by `make llama-tools`), through Stoke's
planner and engine.

Each server is a CPU device; the memory limit is the plan's (`HOST:PORT=400MiB`: this
version's rpc-server has no flag for one), and the plan puts layers on all three devices. The
split must chat exactly as one machine does at temperature 0, reuse its KV on follow-ups,
restore its snapshots, and survive a server killed mid-reply: the words, the kept partial
reply, and the engine loaded again without that server (or, asked to, waiting for it).
"""

from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from app.conversations import ConversationStore
from app.engine.gguf_info import inspect_gguf
from app.engine.host import EngineClient, EngineCrashedError, EngineState
from app.engine.llamacpp import ggml
from app.engine.llamacpp.tools import find_tools
from app.engine.protocol import FinishReason, LoadOptions
from app.engine.rpc_devices import unreachable
from app.hardware.memory import MIB
from app.hardware.planner import Plan, load_options, plan
from app.hardware.rpc import budgets, parse_specs
from app.session import ChatSession

GREEDY = {"temperature": 0.0, "max_tokens": 24}
QUESTIONS = ("What is the capital of France?", "And of Italy?", "Which one is larger?")
LONG_REPLY = "Count from 1 to 300, separated by commas."
READY_S = 30.0


def _tools_or_skip():
    tools, reason = find_tools()
    if tools is None:
        pytest.skip(reason)
    if not ggml.rpc_supported():
        pytest.skip(
            "The venv's llama-cpp-python has no RPC backend: `python packaging/llama_build.py "
            "install` rebuilds it with GGML_RPC=ON."
        )
    return tools


@dataclass
class RpcServer:
    """One rpc-server process on a loopback port."""

    binary: Path
    port: int
    log: Path
    process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [str(self.binary), "-H", "127.0.0.1", "-p", str(self.port), "-t", "1"],
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
            )
        ready = threading.Event()
        for _ in range(int(READY_S / 0.05)):  # until it listens (it prints only when flushed)
            if unreachable(self.endpoint, timeout=1.0) is None:
                return
            if self.process.poll() is not None:
                break
            ready.wait(0.05)
        raise RuntimeError(f"rpc-server on {self.endpoint} did not start: {self.log.read_text()}")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[RpcServer]]:
    tools = _tools_or_skip()
    started = [RpcServer(tools.rpc_server, _free_port(), tmp_path / f"rpc-{i}.log") for i in (0, 1)]
    try:
        for server in started:
            server.start()
        yield started
    finally:
        for server in started:
            server.kill()


def _split_plan(model_path: str, servers: list[RpcServer]) -> Plan:
    """The planner's split: each server asked for its devices, capped at 400 MiB, and as much
    RAM here, so each of the three devices gets about a third of the layers."""
    specs = parse_specs([f"{s.endpoint}=400MiB@10GbE" for s in servers])
    devices, _, probes = budgets(specs)
    assert [p.problem for p in probes] == [None, None]
    assert all(p.rtt_s is not None and p.rtt_s > 0 for p in probes)
    return plan(inspect_gguf(model_path), devices, ram_bytes=400 * MIB, n_ctx=4096)


def _options(model_path: str, p: Plan | None = None, **extra) -> LoadOptions:
    planned = load_options(p) if p is not None else {}
    keep = ("n_gpu_layers", "tensor_split", "overrides", "rpc_servers", "devices")
    # plain CPU buffers here as on the servers (which never repack): repacked Q4 kernels round
    # differently, and on some CPUs that alone changed a greedy token of the split's replies
    return LoadOptions(
        model_path,
        n_ctx=4096,
        n_seq_max=2,
        cpu_buffers="none",
        **{k: planned[k] for k in keep if k in planned},
        **extra,
    )


async def _chat(store: ConversationStore, options: LoadOptions, questions=QUESTIONS):
    client = EngineClient(options, backend="llama.cpp")
    await client.start()
    session = ChatSession(store, client)
    try:
        conversation = store.create_conversation(system_prompt="Answer briefly.", sampling=GREEDY)
        return conversation.id, [await session.send(conversation.id, q) for q in questions]
    finally:
        await client.close()


def _held(result) -> int:
    """Tokens the KV holds after a turn: its prompt and reply (one fewer when cut by length)."""
    cut = result.stats.finish_reason == FinishReason.LENGTH and result.token_ids
    return result.stats.prompt_tokens + len(result.token_ids) - (1 if cut else 0)


def test_split_over_two_servers_chats_like_one_machine(
    store: ConversationStore, model_path, run, servers
):
    p = _split_plan(model_path, servers)
    assert p.fits
    cpu, first, second = p.device("CPU"), *(p.device(n) for n in p.device_order)
    assert cpu.layers[0] == 0 and first.layers[0] == cpu.layers[1] + 1
    assert second.layers == (first.layers[1] + 1, p.n_layer)  # three contiguous ranges
    assert p.rpc_servers == tuple(s.endpoint for s in servers)

    _, alone = run(_chat(store, _options(model_path)))
    split_id, split = run(_chat(store, _options(model_path, p)))
    assert [r.token_ids for r in split] == [r.token_ids for r in alone]
    assert all(r.status == "complete" and r.text for r in split)
    for before, result in itertools.pairwise(split):
        assert result.stats.reused_tokens == _held(before)  # follow-ups prefill new tokens only
        assert result.stats.prefilled_tokens == result.stats.prompt_tokens - _held(before)

    async def after_restart():
        """A new engine over the same servers: the conversation's snapshot (written when the
        last engine closed) comes back instead of a prefill."""
        client = EngineClient(_options(model_path, p), backend="llama.cpp")
        await client.start()
        try:
            return await ChatSession(store, client).send(split_id, "Thank you.")
        finally:
            await client.close()

    again = run(after_restart())
    assert again.stats.restored_tokens == _held(split[-1])
    assert again.stats.prefilled_tokens == again.stats.prompt_tokens - _held(split[-1])


async def _kill_mid_reply(store: ConversationStore, options: LoadOptions, victim: RpcServer):
    client = EngineClient(options, backend="llama.cpp")
    await client.start()
    session = ChatSession(store, client)
    notices: list[str] = []
    states: list[EngineState] = []
    client.add_notice_listener(notices.append)
    client.add_state_listener(lambda state, _detail: states.append(state))
    conversation = store.create_conversation(sampling={"temperature": 0, "max_tokens": 300})
    seen: list[int] = []

    def kill_after_some(event) -> None:
        seen.append(event.token_id)
        if len(seen) == 8:
            victim.kill()

    try:
        with pytest.raises(EngineCrashedError) as crash:
            await session.send(conversation.id, LONG_REPLY, on_token=kill_after_some)
        return session, conversation.id, str(crash.value), seen, notices, states
    except BaseException:
        await client.close()
        raise


def test_a_server_killed_mid_reply_is_words_and_the_engine_reloads_without_it(
    store: ConversationStore, model_path, run, servers
):
    p = _split_plan(model_path, servers)
    victim, survivor = servers[1], servers[0]

    async def scenario():
        session, conv, crash, seen, notices, states = await _kill_mid_reply(
            store, _options(model_path, p), victim
        )
        try:
            after = await session.send(conv, "Thanks!")
            return conv, crash, seen, notices, states, after, session.engine.options
        finally:
            await session.engine.close()

    conv, crash, seen, notices, states, after, options = run(scenario())
    assert f"The rpc-server at {victim.endpoint} stopped answering" in crash
    assert "The reply so far is kept" in crash and "without it" in crash
    assert "Traceback" not in crash and notices == [crash]
    assert EngineState.CRASHED in states
    path = store.current_path(conv)
    partial = path[1]
    assert partial.status == "interrupted" and partial.finish_reason == "crashed"
    assert len(partial.token_ids) >= 8 and partial.token_ids == seen[: len(partial.token_ids)]
    assert options.rpc_servers == (survivor.endpoint,)
    assert options.devices == (f"RPC0[{survivor.endpoint}]",)
    assert options.n_gpu_layers == p.n_gpu_layers - (
        p.device(f"RPC0[{victim.endpoint}]").layers[1]
        - p.device(f"RPC0[{victim.endpoint}]").layers[0]
        + 1
    )
    assert after.status == "complete" and after.text
    assert [m.role for m in path] == ["user", "assistant", "user", "assistant"]


def test_waiting_for_a_lost_server_loads_as_planned_when_it_is_back(
    store: ConversationStore, model_path, run, servers
):
    p = _split_plan(model_path, servers)
    victim = servers[1]

    async def scenario():
        options = replace(_options(model_path, p), rpc_on_drop="wait")
        session, conv, crash, _, _, _ = await _kill_mid_reply(store, options, victim)
        try:
            victim.start()  # the same server comes back on its port
            await session.engine.ready()
            after = await session.send(conv, "Thanks!")
            return crash, after, session.engine.options
        finally:
            await session.engine.close()

    crash, after, options = run(scenario())
    assert f"The rpc-server at {victim.endpoint} stopped answering" in crash
    assert "waits for it to come back" in crash
    assert options.rpc_servers == p.rpc_servers and options.devices == p.device_order
    assert after.status == "complete" and after.text


def test_doctor_shows_each_server_or_why_not(servers):
    """`stoke doctor --rpc`: each device's memory and round trip, or the reason in words."""
    from app import doctor

    closed = f"127.0.0.1:{_free_port()}"
    up = servers[0].endpoint
    report = doctor.check_rpc([f"{up},{closed}"])
    by_endpoint = {s["endpoint"]: s for s in report["servers"]}
    assert by_endpoint[up]["ok"] and by_endpoint[up]["rtt_ms"] > 0
    (device,) = by_endpoint[up]["devices"]
    assert device["name"] == f"RPC0[{up}]" and 0 < device["memory_free"] <= device["memory_total"]
    rows = dict(doctor._rpc_rows(report, True))
    assert rows["RPC backend"] == "yes"
    assert rows[up].startswith(f"RPC0[{up}]: ") and "ms round trip" in rows[up]
    words = f"unreachable: nothing listens at {closed} (is rpc-server running there?)"
    assert rows[closed] == words
