"""Plans over several machines: llama.cpp rpc-servers as devices of the offload planner.

The layer split is checked against llama.cpp's own rule (layers below n_layer + 1 -
n_gpu_layers stay on the CPU, the rest follow tensor_split over the `devices` list in order),
and the traffic against the residual stream's real width (DeepSeek V4 carries 4
hyper-connection streams of 4,096 floats).
"""

from __future__ import annotations

import itertools
import socket

import pytest

from app.cli import plan as plan_cli
from app.engine.gguf_info import GGUFInfo, inspect_gguf
from app.hardware.memory import GIB, MIB
from app.hardware.placement import DeviceBudget
from app.hardware.planner import load_options, plan
from app.hardware.rpc import budgets, parse_link, parse_specs
from app.hardware.synthetic_gguf import write_deepseek4
from app.models.default import default_model_path


@pytest.fixture(scope="module")
def flash(tmp_path_factory: pytest.TempPathFactory) -> GGUFInfo:
    path = write_deepseek4(tmp_path_factory.mktemp("flash") / "flash.gguf", mode="full")
    return inspect_gguf(path)


def described(*items: str) -> list[DeviceBudget]:
    devices, _, probes = budgets(parse_specs(items), connect=False)
    assert probes == []  # described devices are never asked
    return devices


def test_specs_and_links_parse() -> None:
    spec = parse_specs(["mac.local:50052=128GiB@10GbE/0.3ms, 10.0.0.2:50052"])
    assert [s.endpoint for s in spec] == ["mac.local:50052", "10.0.0.2:50052"]
    assert spec[0].size == 128 * GIB and spec[1].size is None
    assert spec[0].link.bandwidth == 1_250_000_000 and spec[0].link.rtt_s == pytest.approx(3e-4)
    assert parse_link("2.5Gbps").bandwidth == 312_500_000
    assert parse_link("400MB/s").bandwidth == 400_000_000
    for bad in ("mac.local", "mac:notaport", "mac:1=lots", "mac:1@fast"):
        with pytest.raises(ValueError, match=r"not (HOST:PORT|a size|a link)"):
            parse_specs([bad])


def test_two_gpus_and_a_mac(flash: GGUFInfo) -> None:
    """docs/planner.md's two machines: the Mac takes the first layers whole (experts included),
    the GPU box the rest and the output; one crossing each way per token."""
    gpus = [DeviceBudget("CUDA0", 24 * GIB), DeviceBudget("CUDA1", 24 * GIB)]
    mac = described("mac.local:50052=96GiB@10GbE")
    p = plan(flash, [*gpus, *mac], ram_bytes=64 * GIB, n_ctx=65_536)
    assert p.fits
    assert p.device_order == ("RPC0[mac.local:50052]", "CUDA0", "CUDA1")
    assert p.rpc_servers == ("mac.local:50052",)
    rows = {d.name: d for d in p.devices}
    remote = rows["RPC0[mac.local:50052]"]
    assert remote.layers[0] == 0 and remote.machine == "mac.local:50052"
    starts = [rows[n].layers for n in p.device_order]
    assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(starts))
    assert starts[-1][1] == p.n_layer  # the output on this machine's last GPU
    assert remote.expert_layers_full == tuple(range(remote.layers[1] + 1))
    assert not remote.expert_layers_partial
    assert sum(d.weights for d in p.devices) == flash.total_bytes
    assert remote.total <= remote.budget
    (link,) = p.links
    hidden = 4096 * 4 * 4  # n_embd x hyper-connection streams x f32
    assert link.bytes_per_token == 2 * hidden and link.round_trips == 1
    assert link.seconds_per_token == pytest.approx(2 * hidden / 1.25e9)
    assert link.prefill_bytes == 2 * hidden * p.n_ubatch
    assert "--rpc mac.local:50052 -dev RPC0,CUDA0,CUDA1" in p.command
    assert "=RPC0[mac.local:50052]" in p.command
    options = load_options(p)
    assert options["rpc_servers"] == p.rpc_servers and options["devices"] == p.device_order
    text = plan_cli.render(p)
    assert "Link to mac.local:50052 (10GbE): 128 KiB per token" in text
    assert "holds layers 0 to" in text


def test_this_cpu_leads_when_it_has_no_gpu() -> None:
    """No GPU here: the CPU keeps the first layers (llama.cpp keeps the layers below
    n_gpu_layers on it), the two servers the rest; the logits come back from the last one."""
    info = inspect_gguf(default_model_path())
    remote = described("127.0.0.1:50052=400MiB@10GbE", "127.0.0.1:50053=400MiB@10GbE")
    p = plan(info, remote, ram_bytes=400 * MIB, n_ctx=4096)
    assert p.fits
    cpu = p.device("CPU")
    n_units = p.n_layer + 1
    assert cpu.layers[0] == 0
    assert n_units - p.n_gpu_layers == cpu.layers[1] + 1  # llama.cpp's i_gpu_start
    first, second = (p.device(n) for n in p.device_order)
    assert first.layers == (cpu.layers[1] + 1, first.layers[1])
    assert second.layers == (first.layers[1] + 1, p.n_layer)
    assert p.tensor_split == (
        float(first.layers[1] - first.layers[0] + 1),
        float(second.layers[1] - second.layers[0] + 1),
    )
    hidden = info.embedding_length * 4
    into, out = p.links
    assert into.bytes_per_token == 2 * hidden  # in from this CPU, out to the next server
    assert out.bytes_per_token == hidden + info.vocab_size * 4  # in, then the logits
    assert out.prefill_bytes == hidden * p.n_ubatch + info.vocab_size * 4  # last row's logits


def test_memory_forcing_experts_away_is_said(flash: GGUFInfo) -> None:
    remote = described("a:50052=60GiB@10GbE", "b:50052=60GiB@1GbE")
    p = plan(flash, remote, ram_bytes=40 * GIB, n_ctx=65_536)
    forced = [w for w in p.warnings if w.startswith("Memory forced the experts")]
    assert len(forced) == 1
    away = next(link for link in p.links if link.round_trips > 1)
    assert away.bytes_per_token > 2 * 4096 * 4 * 4


def test_unreachable_servers_are_words() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    devices, notes, probes = budgets(parse_specs([f"127.0.0.1:{port}"]))
    assert devices == [] and probes[0].problem
    assert any(f"Left out 127.0.0.1:{port}: nothing listens" in n for n in notes)
    devices, notes, _ = budgets(parse_specs([f"127.0.0.1:{port}=8GiB@10GbE"]))
    assert [d.budget for d in devices] == [8 * GIB]
    assert any("described, not measured" in n for n in notes)
