"""Deploy inputs checked without a host: inventories, --listen and the API key, --max-fail, the fit plan."""

from __future__ import annotations

import contextlib
import signal
import socket
from pathlib import Path

import gguf
import pytest

from llamaforge.core.errors import DoesNotFit, InvalidOption, RecipeError
from llamaforge.core.paths import data_dir
from llamaforge.deploy.hosts.fitplan import fit_for_gpu
from llamaforge.deploy.hosts.inventory import inventory_hosts, inventory_json_schema, load_inventory
from llamaforge.deploy.hosts.ops import DeployParams
from llamaforge.deploy.hosts.remote import parse_listeners, port_clash
from llamaforge.deploy.hosts.rollout import too_many_failed
from llamaforge.deploy.release import Layout, ReleaseSpec, listen_address, release_record
from llamaforge.deploy.report import HostReport
from llamaforge.deploy.targets.systemd import render_unit
from llamaforge.gguf.tiny import TinyModelSpec, write_tiny_model
from llamaforge.serve.launcher import LlamaFlags

pytestmark = pytest.mark.quick

SCHEMA = data_dir("recipes") / "schema" / "host-inventory.schema.json"


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_checked_in_inventory_schema_matches_the_model() -> None:
    # Regenerate:
    # python -c "from llamaforge.deploy.hosts.inventory import inventory_json_schema as s; print(s(), end='')"
    assert SCHEMA.read_text(encoding="utf-8") == inventory_json_schema()


def test_the_example_inventory_lists_hosts_in_order_with_defaults_and_gpus() -> None:
    hosts = inventory_hosts("example")
    assert [(host.name, host.ssh.address, host.gpu) for host in hosts] == [
        ("gpu1", "deploy@10.0.0.11:22", "rtx4090"),
        ("gpu2", "deploy@10.0.0.12:22", "rtx3090"),
        ("cpu1", "ops@cpu1.lab.example:2222", None),
    ]
    inventory, path = load_inventory("example")
    assert hosts[0].ssh.known_hosts == path.parent / "example.known_hosts"  # relative to the inventory
    assert hosts[0].labels == {"rack": "a1"} and inventory.name == "example"
    assert [host.name for host in inventory_hosts("example", "cpu1,gpu1")] == ["gpu1", "cpu1"]  # its order
    with pytest.raises(InvalidOption) as unknown:
        inventory_hosts("example", "gpu3")
    assert "did you mean 'gpu2'" in (unknown.value.hint or "") and "example.toml" in unknown.value.message


def test_a_bad_inventory_names_the_file_and_field(tmp_path: Path) -> None:
    typo = write(tmp_path / "lab.toml", 'user = "lf"\n[[hosts]]\nname = "a"\naddres = "10.0.0.1"\n')
    with pytest.raises(RecipeError) as caught:
        load_inventory(str(typo))
    assert str(typo) in caught.value.message and "hosts.0.addres: unknown key" in caught.value.message
    assert "did you mean 'address'" in (caught.value.hint or "")
    top = write(tmp_path / "top.toml", 'knownhosts = "k"\n[[hosts]]\nname = "a"\naddress = "h"\n')
    with pytest.raises(RecipeError) as caught:
        load_inventory(str(top))
    assert "did you mean 'known_hosts'" in (caught.value.hint or "")
    gpu = write(tmp_path / "gpu.toml", '[[hosts]]\nname = "a"\naddress = "h"\ngpu = "rtx409"\n')
    with pytest.raises(RecipeError) as caught:
        load_inventory(str(gpu))
    assert "hosts.0.gpu" in caught.value.message and "rtx4090" in caught.value.message
    twice = write(
        tmp_path / "twice.toml",
        '[[hosts]]\nname = "a"\naddress = "h"\n[[hosts]]\nname = "a"\naddress = "i"\n',
    )
    with pytest.raises(RecipeError, match="given twice: a"):
        load_inventory(str(twice))
    one_machine = write(
        tmp_path / "one-machine.toml",
        'port = 2201\n[[hosts]]\nname = "a"\naddress = "H"\n[[hosts]]\nname = "b"\naddress = "h"\nport = 2201\n',
    )
    with pytest.raises(RecipeError, match=r"hosts a and b are one host \(h, port 2201\)"):
        load_inventory(str(one_machine))
    with_port = write(tmp_path / "with-port.toml", '[[hosts]]\nname = "a"\naddress = "127.0.0.1:2201"\n')
    with pytest.raises(RecipeError, match="holds a port: give the address alone and the port as port = N"):
        load_inventory(str(with_port))
    v6 = write(tmp_path / "v6.toml", '[[hosts]]\nname = "a"\naddress = "[fd00::2]"\nport = 2201\n')
    assert load_inventory(str(v6))[0].hosts[0].address == "fd00::2"
    with pytest.raises(RecipeError) as caught:
        load_inventory("exampel")
    assert "did you mean 'example'" in (caught.value.hint or "")
    with pytest.raises(InvalidOption, match="no hosts given"):
        DeployParams(build="k", model="tiny").host_list()


def _spec(**changes: object) -> ReleaseSpec:
    return ReleaseSpec(
        build_key="k",
        build_dir=Path("/nowhere"),
        manifest_sha256="a" * 64,
        model=Path("/m.gguf"),
        model_sha256="b" * 64,
        model_size=1000,
        **changes,
    )  # type: ignore[arg-type]


def test_listening_beyond_loopback_needs_the_key_file_and_never_holds_the_key() -> None:
    assert listen_address("127.0.0.1", api_key=False) == "127.0.0.1"  # loopback needs no key
    assert listen_address("0.0.0.0", api_key=True) == "0.0.0.0"
    with pytest.raises(InvalidOption) as refused:
        listen_address("0.0.0.0", api_key=False)
    assert "needs an API key" in refused.value.message and "--no-api-key" in (refused.value.hint or "")
    with pytest.raises(InvalidOption, match="not an IP address"):
        listen_address("everywhere", api_key=True)
    wide = _spec(listen="0.0.0.0")
    unit = render_unit(wide, Layout("lab"))
    assert "--host 0.0.0.0" in unit and "--api-key-file /opt/llamaforge/lab/current/api-key" in unit
    record = release_record(wide, "r", "systemd")
    assert record["api_key_file"] == "api-key" and record["listen"] == "0.0.0.0"
    assert "--api-key-file" not in render_unit(_spec(), Layout("lab"))
    assert release_record(_spec(), "r", "systemd")["api_key_file"] is None


def _host(status: str) -> HostReport:
    return HostReport(host="h", status=status, release=None, previous=None)  # type: ignore[arg-type]


def test_max_fail_stops_only_when_the_failed_share_is_exceeded() -> None:
    two = [_host("updated"), _host("rolled back")]
    assert too_many_failed(two, 0) and too_many_failed(two, 49.9)
    assert not too_many_failed(two, 50)  # exactly 50 %: not exceeded, the rollout goes on
    assert not too_many_failed([_host("updated"), _host("unchanged")], 0)
    assert too_many_failed([_host("unreachable")], 99) and not too_many_failed([_host("failed")], 100)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("fit")
    vocab = directory / "vocab.gguf"
    writer = gguf.GGUFWriter(vocab, "qwen2")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list([f"t{i}" for i in range(1000)])
    writer.add_token_types([1] * 1000)
    writer.add_token_merges(["t 1"])
    writer.add_eos_token_id(999)
    for step in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file):
        step()
    writer.close()
    return write_tiny_model(directory / "tiny.gguf", TinyModelSpec(arch="qwen3"), vocab).path


def test_the_fit_plan_sets_each_gpu_hosts_flags_and_refuses_what_does_not_fit(tiny_model: Path) -> None:
    assert fit_for_gpu(tiny_model, None, LlamaFlags(threads=2), host="cpu1").flags == LlamaFlags(threads=2)
    planned = fit_for_gpu(tiny_model, "rtx4060", LlamaFlags(threads=2), host="gpu1")
    assert planned.flags.args() == ["-ngl", "3", "-c", "4096", "--parallel", "1", "-fa", "on", "-t", "2"]
    assert any("8.0 GiB" in line for line in planned.summary)
    slots = fit_for_gpu(tiny_model, "rtx4060", LlamaFlags(ctx=8192, parallel=2), host="gpu1").flags
    assert (slots.ctx, slots.parallel) == (8192, 2)  # -c stays the total over the slots
    with pytest.raises(DoesNotFit) as refused:
        fit_for_gpu(tiny_model, "rtx4060", LlamaFlags(ctx=2**28), host="gpu1")
    assert refused.value.message.startswith("gpu1 (rtx4060): ") and "8.0 GiB" in refused.value.message
    assert "--force" in (refused.value.hint or "")
    with pytest.raises(DoesNotFit, match=r"-ngl 3 needs [0-9.]+ GiB with the margin, the GPU has 8.0 GiB"):
        fit_for_gpu(tiny_model, "rtx4060", LlamaFlags(ctx=2**26, n_gpu_layers=3), host="gpu1")
    forced = fit_for_gpu(tiny_model, "rtx4060", LlamaFlags(ctx=2**28), host="gpu1", force=True)
    assert forced.flags == LlamaFlags(ctx=2**28) and "--force" in forced.summary[0]


def test_the_cli_tables_show_every_host_and_never_a_key() -> None:
    from rich.console import Console

    from llamaforge.deploy.hosts.render import plan_cli, rollout_cli, status_cli
    from llamaforge.deploy.report import DeployPlanResult, DeployResult, DeployStatusResult
    from llamaforge.deploy.targets.base import ServiceState

    console = Console(record=True, width=200)
    key_file = "/opt/llamaforge/lab/releases/r1/api-key"
    hosts = [
        {
            "host": "lf@a:22",
            "status": "updated",
            "previous": "r0",
            "release": "r1",
            "sent_bytes": 2**20,
            "api_key_file": key_file,
        },
        {
            "host": "lf@b:22",
            "status": "interrupted",
            "previous": "r0",
            "release": "r0",
            "detail": "interrupted",
        },
    ]
    head = {"name": "lab", "target": "systemd"}
    rollout_cli(
        DeployResult.model_validate(
            {**head, "release": None, "passed": False, "interrupted": True, "wall_s": 3.2, "hosts": hosts}
        ),
        console,
    )
    planned = [
        {
            "host": "lf@a:22",
            "reachable": True,
            "current": "r0",
            "release": "r1",
            "action": "upload",
            "model_upload": False,
            "model_bytes": 0,
            "restart": True,
            "flags_before": None,
            "flags_after": ["-ngl", "3"],
            "listen": "0.0.0.0",
            "fit": ["all layers on the GPU"],
        },
        {
            "host": "lf@b:22",
            "reachable": False,
            "current": None,
            "release": "r1",
            "action": "none",
            "model_upload": False,
            "model_bytes": 0,
            "restart": False,
            "flags_before": None,
            "flags_after": [],
            "detail": "connection refused",
        },
    ]
    plan_cli(
        DeployPlanResult.model_validate({**head, "release": "r1", "record": {}, "hosts": planned}), console
    )
    up = {"host": "lf@a:22", "reachable": True, "current": "r1", "active": "active", "healthy": True}
    state = ServiceState("activating", 3, signal.SIGILL)  # what systemd says of a server killed at load
    down = {
        "host": "lf@c:22",
        "reachable": True,
        "current": "r1",
        "active": state.active,
        "crash": state.crash,
    }
    status_cli(DeployStatusResult.model_validate({**head, "hosts": [up, down]}), console)
    text = console.export_text()
    for expected in (
        "lf@a:22",
        "interrupted",
        "r1/api-key",
        "-ngl 3",
        "all layers on the GPU",
        "connection refused",
        "active",
        "interrupted in 3.2 s",
        "activating, killed by SIGILL (illegal instruction)",
    ):
        assert expected in text, expected


def _proc_net() -> str:
    return "".join(
        Path(name).read_text() for name in ("/proc/net/tcp", "/proc/net/tcp6") if Path(name).exists()
    )


def test_the_listeners_are_read_from_proc_net_as_the_kernel_writes_them() -> None:
    with contextlib.ExitStack() as stack:
        listening = []
        for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
            sock = stack.enter_context(socket.socket(family))
            try:
                sock.bind((address, 0))
            except OSError:  # no IPv6 on this machine
                continue
            sock.listen()
            listening.append((address, sock.getsockname()[1]))
        idle = stack.enter_context(socket.socket())
        idle.bind(("127.0.0.1", 0))  # bound, not listening: no listener
        unused = idle.getsockname()[1]
        found = parse_listeners(_proc_net())
    assert listening and all(item in found for item in listening), (listening, found)
    assert all(port != unused for _address, port in found)
    assert parse_listeners("  sl  local_address rem_address   st\n") == set()


def test_a_port_clashes_at_the_same_address_or_a_wildcard_only() -> None:
    taken = {("127.0.0.1", 8080), ("0.0.0.0", 9000), ("10.0.0.5", 7000), ("::", 6000)}
    assert port_clash(taken, "127.0.0.1", 8080) == "127.0.0.1:8080"
    assert port_clash(taken, "0.0.0.0", 8080) == "127.0.0.1:8080"  # a wildcard bind needs every address
    assert port_clash(taken, "127.0.0.1", 9000) == "0.0.0.0:9000"
    assert port_clash(taken, "127.0.0.1", 6000) == "[::]:6000"
    assert port_clash(taken, "127.0.0.1", 7000) is None  # another address, same port: both can bind
    assert port_clash(taken, "127.0.0.1", 8081) is None
