"""Load options without a lost rpc-server: the remaining devices keep their layers, this
machine takes the lost one's (llama.cpp keeps layers below n_layer + 1 - n_gpu_layers on the
CPU), and nothing names the lost devices any more."""

from __future__ import annotations

import socket

from app.engine.protocol import LoadOptions
from app.engine.rpc_devices import lost_servers, unreachable, without

A, B = "127.0.0.1:50052", "127.0.0.1:50053"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_cpu_takes_a_lost_servers_layers() -> None:
    options = LoadOptions(
        model_path="m.gguf",
        n_gpu_layers=22,
        rpc_servers=(A, B),
        devices=(f"RPC0[{A}]", f"RPC0[{B}]"),
        tensor_split=(10.0, 12.0),
    )
    left = without(options, [A])
    assert left.rpc_servers == (B,) and left.devices == (f"RPC0[{B}]",)
    assert left.n_gpu_layers == 12 and left.tensor_split == ()
    alone = without(left, [B])
    assert alone.rpc_servers == () and alone.devices == () and alone.n_gpu_layers == 0


def test_local_gpus_keep_their_layers_and_experts() -> None:
    mac = "mac.local:50052"
    options = LoadOptions(
        model_path="m.gguf",
        n_gpu_layers=44,
        rpc_servers=(mac,),
        devices=(f"RPC0[{mac}]", "CUDA0", "CUDA1"),
        tensor_split=(26.0, 10.0, 8.0),
        overrides=(
            (r"blk\.([0-9]|1[0-9]|2[0-5])\.ffn_(down|gate|up)_exps\.", f"RPC0[{mac}]"),
            (r"blk\.(2[6-9]|30)\.ffn_(down|gate|up)_exps\.", "CUDA0"),
            (r"_exps\.", "CPU"),
        ),
    )
    left = without(options, [mac])
    assert left.devices == ("CUDA0", "CUDA1") and left.tensor_split == (10.0, 8.0)
    assert left.n_gpu_layers == 18  # layers 26-43 stay where they were; 0-25 come here
    assert [o[1] for o in left.overrides] == ["CUDA0", "CPU"]


def test_servers_that_do_not_answer_are_named_in_words() -> None:
    port = closed_port()
    assert "nothing listens at" in unreachable(f"127.0.0.1:{port}")
    assert "is not HOST:PORT" in unreachable("127.0.0.1")
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        up = f"127.0.0.1:{listening.getsockname()[1]}"
        options = LoadOptions(model_path="m.gguf", rpc_servers=(up, f"127.0.0.1:{port}"))
        assert lost_servers(options) == [f"127.0.0.1:{port}"]
