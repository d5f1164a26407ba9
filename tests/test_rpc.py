"""One model over llama.cpp RPC workers: the split planner, the topology's rules and the worker unit (no host).

The live topology (1 head + 2 workers on the test hosts' internal network) is in tests/test_deploy_rpc.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llamaforge.core.errors import InvalidOption
from llamaforge.core.registry import operations
from llamaforge.deploy.release import Layout, ReleaseSpec
from llamaforge.deploy.targets.rpc_server import RpcServerTarget
from llamaforge.deploy.targets.systemd import render_unit
from llamaforge.deploy.topology.workers import BuildMismatch, check_builds, check_rpc_address, parse_workers
from llamaforge.gguf.tiny import TinyModelSpec
from llamaforge.serve.fit import GiB, Settings, estimate_memory, synthetic_header
from llamaforge.serve.launcher import LlamaFlags
from llamaforge.serve.shape import model_shape
from llamaforge.serve.split import SplitDevice, assign_layers, parse_devices, plan_split

pytestmark = pytest.mark.quick

SHAPE = TinyModelSpec(arch="qwen3", n_layer=8, n_embd=512, n_ff=1024, n_head=8, n_head_kv=2, head_dim=64)
HEADER = synthetic_header(SHAPE, n_vocab=32000)
TWO = [SplitDevice("a", 4 * GiB, "10.0.0.2:50052"), SplitDevice("b", 4 * GiB, "10.0.0.3:50052")]


def test_layers_follow_llamacpps_upper_bound_over_the_split_points() -> None:
    # 4 blocks + output over two equal devices: points 0.5, 1; fractions 0, .2, .4 | .6, .8
    assert assign_layers(4, [1, 1], 5) == [0, 0, 0, 1, 1]
    assert assign_layers(4, [2, 1], 5) == [0, 0, 0, 0, 1]
    # 32 blocks at 24 GiB : 8 GiB: the first device takes 25 of the 33, the output goes to the last
    placement = assign_layers(32, [24, 8], 33)
    assert placement.count(0) == 25 and placement[-1] == 1
    # -ngl 3 keeps blocks 0-1 on the head's CPU (i_gpu_start = n_layer + 1 - ngl)
    assert assign_layers(4, [1, 1], 3) == [None, None, 0, 0, 1]
    assert assign_layers(4, [1, 0], 5) == [0, 0, 0, 0, 0]  # a zero share gets nothing
    with pytest.raises(InvalidOption):
        assign_layers(4, [0, 0], 5)


def test_the_split_adds_up_to_the_single_device_plan() -> None:
    settings = Settings(ctx=512)
    plan = plan_split(HEADER, TWO, settings)
    assert [share.layers for share in plan.devices] == [(0, 1, 2, 3, 4), (5, 6, 7)]
    assert [share.output for share in plan.devices] == [False, True] and plan.fits
    single_gpu, single_host = estimate_memory(model_shape(HEADER), HEADER.tensors, settings, n_gpu_layers=9)
    assert sum(share.memory.weights for share in plan.devices) == single_gpu.weights
    assert sum(share.memory.kv_cache for share in plan.devices) == single_gpu.kv_cache
    assert plan.head_host.weights == single_host.weights  # token_embd stays on the head
    assert plan.devices[0].memory.kv_cache == 5 * plan.devices[1].memory.kv_cache // 3


def test_an_explicit_tensor_split_and_a_device_that_is_too_small() -> None:
    plan = plan_split(HEADER, TWO, Settings(ctx=512), tensor_split=[1, 3])
    assert [share.layer_range for share in plan.devices] == ["0-2", "3-7"]
    assert plan.tensor_split == (1, 3)
    small = [TWO[0], SplitDevice("b", 1 * GiB + 5_000_000, "10.0.0.3:50052")]
    tight = plan_split(HEADER, small, Settings(ctx=512), margin_bytes=1 * GiB)
    assert [share.fits for share in tight.devices] == [True, False] and not tight.fits
    with pytest.raises(InvalidOption):
        plan_split(HEADER, TWO, Settings(ctx=512), tensor_split=[1])
    starved = [TWO[0], SplitDevice("b", 1 * GiB, "10.0.0.3:50052")]  # "does not fit" named no margin
    with pytest.raises(InvalidOption, match=r"--margin 1.0 GiB keeps all the memory of b \(1.0 GiB\) free"):
        plan_split(HEADER, starved, Settings(ctx=512), margin_bytes=1 * GiB)


def test_the_plans_flags_are_llama_servers() -> None:
    plan = plan_split(HEADER, TWO, Settings(ctx=512))
    flags = list(plan.flags)
    assert flags[flags.index("--rpc") + 1] == "10.0.0.2:50052,10.0.0.3:50052"
    assert flags[flags.index("-ts") + 1] == "4,4" and flags[flags.index("-ngl") + 1] == "9"
    assert flags[flags.index("-fit") + 1] == "off"  # llama.cpp's own fit would move the planned split
    assert LlamaFlags(rpc=("a:1",), tensor_split=(0.5, 1.0)).args() == ["--rpc", "a:1", "-ts", "0.5,1"]


def test_devices_parse_in_llamacpps_order() -> None:
    devices = parse_devices("10.0.0.2=24GiB, 10.0.0.3:50053=8GiB, gpu=24GiB")
    assert [(d.endpoint, d.memory_bytes // GiB) for d in devices] == [
        ("10.0.0.2:50052", 24),
        ("10.0.0.3:50053", 8),
        (None, 24),
    ]
    for bad in ("10.0.0.2", "gpu=8GiB,10.0.0.2=8GiB", ""):
        with pytest.raises(InvalidOption):
            parse_devices(bad)
    for empty in ("10.0.0.2=0", "10.0.0.2=8GiB,gpu=0GiB"):  # it blamed a tensor split nobody gave
        with pytest.raises(InvalidOption, match=r"device '.*=0(GiB)?' has no memory"):
            parse_devices(empty)
    with pytest.raises(InvalidOption, match=r"device 10.0.0.2 '24576' is 24576 bytes") as caught:
        parse_devices("10.0.0.2=24576")  # nvidia-smi's MiB, read as bytes, planned a 24 KiB GPU
    assert "24576MiB" in (caught.value.hint or "")


def test_rpc_addresses_must_be_private_or_loopback() -> None:
    for good in ("10.1.2.3", "172.20.0.2", "192.168.1.5", "127.0.0.1"):
        assert check_rpc_address(good, worker="w") == good
    for bad, words in (
        ("0.0.0.0", "every network"),
        ("::", "IPv6"),
        ("8.8.8.8", "public"),
        ("gpu2.example.org", "not an IP"),
        ("2001:4860::8888", "IPv6"),
    ):
        with pytest.raises(InvalidOption) as caught:
            check_rpc_address(bad, worker="lf@gpu2:22")
        assert words in caught.value.message and "gpu2" in caught.value.message
    with pytest.raises(InvalidOption):
        RpcServerTarget("0.0.0.0")


def test_an_ipv6_worker_is_refused_for_llamacpps_rpc_speaks_ipv4_only() -> None:
    """llama.cpp b11312's rpc-server and its client use AF_INET, and --rpc [fd00::2]:50052 aborts the head
    ("Failed to parse endpoint"): a topology of IPv6 workers was planned and could never run."""
    for ipv6 in ("fd00::2", "::1", "fe80::2%eth1", "fe80::2%3", "fd00::2%enp0s31f6", "fe80::2%br-lan.10"):
        with pytest.raises(InvalidOption, match=r"is IPv6: llama\.cpp's RPC backend speaks IPv4 only"):
            check_rpc_address(ipv6, worker="w")
    for device in ("[::1]:50052=8GiB", "fd00::2=8GiB", "[fd00::2]=8GiB"):
        with pytest.raises(InvalidOption, match=r"is IPv6: llama\.cpp's RPC backend speaks IPv4 only"):
            parse_devices(device)


def test_a_hostile_ipv6_scope_id_is_refused_before_anything_else() -> None:
    # Python's ipaddress takes anything after '%'; the address reaches the head's unit and its --rpc list
    for bad in (
        "fe80::2%eth0\nExecStartPre=+x",
        "fe80::2%eth0\nX=1",
        "fe80::2%a b",
        "fd00::1%$(id)",
        "fe80::2%eth0;reboot",
        "fe80::2%-x",
        "fe80::2%sixteen-chars-ifname",
    ):
        with pytest.raises(InvalidOption) as caught:
            check_rpc_address(bad, worker="lf@gpu2:22")
        assert "gpu2" in caught.value.message and caught.value.hint
    with pytest.raises(InvalidOption, match="scope id"):
        parse_workers("lf@h2:22", "fe80::2%eth0\nX=1")


def test_workers_parse_with_their_addresses_and_memory() -> None:
    workers = parse_workers("lf@h2:22,lf@h3:22", "10.0.0.2,10.0.0.3", memory="24GiB,8GiB")
    assert [(w.endpoint, w.memory_bytes) for w in workers] == [
        ("10.0.0.2:50052", 24 * GiB),
        ("10.0.0.3:50052", 8 * GiB),
    ]
    for hosts, addresses, memory in (
        ("lf@h2", "10.0.0.2,10.0.0.3", None),
        ("lf@h2,lf@h3", "10.0.0.2,10.0.0.2", None),
        ("lf@h2", "10.0.0.2", "1GiB,2GiB"),
        ("lf@h2", "1.1.1.1", None),
    ):
        with pytest.raises(InvalidOption):
            parse_workers(hosts, addresses, memory=memory)


def test_a_worker_on_another_build_is_refused_naming_it() -> None:
    check_builds("h1", "aaa", {"h2": "aaa", "h3": None})
    with pytest.raises(BuildMismatch) as caught:
        check_builds("h1", "aaa", {"h2": "aaa", "h3": "bbb"})
    assert "h3 runs bbb" in caught.value.message and "h2" not in caught.value.message


def test_the_worker_unit_binds_its_address_and_keeps_a_cache() -> None:
    spec = ReleaseSpec("k", Path("/b"), "m", Path(), "", 0, port=50052)
    text = RpcServerTarget("172.20.0.3", 50052, threads=2).service_files(spec, Layout("lab"))[
        "rpc-server.service"
    ]
    lines = text.splitlines()
    assert "ExecStart=/opt/llamaforge/lab/current/bin/ggml-rpc-server -H 172.20.0.3 -p 50052 -c -t 2" in lines
    assert "CacheDirectory=llamaforge-lab-rpc" in lines
    assert "Environment=LLAMA_CACHE=/var/cache/llamaforge-lab-rpc" in lines
    for line in ("NoNewPrivileges=yes", "ProtectSystem=strict", "User=llamaforge", "Restart=on-failure"):
        assert line in lines
    head = render_unit(
        ReleaseSpec("k", Path("/b"), "m", Path("/m"), "s", 1, LlamaFlags(rpc=("10.0.0.2:50052",))),
        Layout("lab"),
    )
    assert "StartLimitIntervalSec=0" in head.splitlines()  # the head retries until its workers are back
    assert "StartLimitIntervalSec" not in render_unit(
        ReleaseSpec("k", Path("/b"), "m", Path("/m"), "s", 1), Layout("lab")
    )


def test_topology_operations_are_registered_with_their_kinds() -> None:
    ops = operations()
    assert ops["topology.deploy"].destructive and ops["topology.rollback"].destructive
    assert ops["topology.status"].read_only and ops["topology.plan"].read_only
    assert ops["models.split"].read_only


def test_buffers_are_grouped_by_the_device_llamacpp_names() -> None:
    from llamaforge.smoke.through import device_of, load_log_devices

    log = [
        "llama_model_loader: loaded meta data with 30 key-value pairs",
        "load_tensors:   CPU_Mapped model buffer size =     4.00 MiB",
        "load_tensors: RPC0[172.18.0.3:50052] model buffer size =     2.00 MiB",
        "load_tensors: RPC0[172.18.0.4:50052] model buffer size =     3.00 MiB",
        "llama_kv_cache: RPC0[172.18.0.3:50052] KV buffer size =     1.00 MiB",
        "sched_reserve: RPC0[172.18.0.4:50052] compute buffer size =     0.50 MiB",
        "sched_reserve:        CPU compute buffer size =     0.25 MiB",
    ]
    devices = load_log_devices(log)
    assert devices["head"] == {"weights": 4 << 20, "compute": 1 << 18}
    assert devices["RPC0[172.18.0.3:50052]"] == {"weights": 2 << 20, "kv_cache": 1 << 20}
    assert devices["RPC0[172.18.0.4:50052]"] == {"weights": 3 << 20, "compute": 1 << 19}
    assert device_of("CUDA0") == "CUDA0" and device_of("CPU_REPACK") == "head"


def test_the_heads_flags_are_the_plans() -> None:
    from llamaforge.deploy.topology.service import plan_flags

    plan = plan_split(HEADER, TWO, Settings(ctx=512, parallel=2), tensor_split=[3, 1])
    assert plan_flags(plan.flags, None).args() == list(plan.flags)
    assert plan_flags(plan.flags, 2).args() == [
        *plan.flags[: plan.flags.index("-fit")],
        "-t",
        "2",
        *plan.flags[plan.flags.index("-fit") :],
    ]


def test_a_topology_file_fills_the_options_and_typos_are_named(tmp_path: Path) -> None:
    from llamaforge.core.errors import RecipeError
    from llamaforge.deploy.topology.ops import TopologyDeployParams

    good = tmp_path / "lab.toml"
    good.write_text(
        '[hosts]\nother = "inventory tables are left alone"\n[topology]\nhead = "lf@h1:22"\n'
        '[[topology.workers]]\nhost = "lf@h2:22"\nrpc_address = "10.0.0.2"\nmemory = "8GiB"\n'
        '[[topology.workers]]\nhost = "lf@h3:22"\nrpc_address = "10.0.0.3"\nmemory = "4GiB"\n',
        encoding="utf-8",
    )
    params = TopologyDeployParams(topology=str(good), build="k", model="tiny")
    assert (params.head, params.rpc_workers, params.rpc_addresses) == (
        "lf@h1:22",
        "lf@h2:22,lf@h3:22",
        "10.0.0.2,10.0.0.3",
    )
    assert [w.memory_bytes for w in params.workers(params.worker_memory)] == [8 * GiB, 4 * GiB]
    bad = tmp_path / "typo.toml"
    bad.write_text(
        '[topology]\nhead = "lf@h1:22"\n[[topology.workers]]\nhost = "lf@h2:22"\nrpc_adress = "10.0.0.2"\n',
        encoding="utf-8",
    )
    with pytest.raises(RecipeError) as caught:
        TopologyDeployParams(topology=str(bad), build="k", model="tiny")
    assert str(bad) in caught.value.message and "rpc_adress" in caught.value.message
    assert "rpc_address" in (caught.value.hint or "")
    with pytest.raises(InvalidOption):
        TopologyDeployParams(topology=str(good), head="lf@h9:22", build="k", model="tiny")
    with pytest.raises(InvalidOption):
        TopologyDeployParams(build="k", model="tiny").workers()
