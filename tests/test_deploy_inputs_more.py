"""More deploy inputs refused when read, naming the inventory file and the field. Each goes through ``invoke``
where the user meets it; none reaches a host (the build key is refused after the inventory is read)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import invoke

pytestmark = pytest.mark.quick


def test_a_boolean_port_in_an_inventory_is_refused_naming_the_field(tmp_path: Path) -> None:
    # TOML's `true` read as port 1 and the deploy went on to dial that port.
    for text, field in (
        ('port = true\n[[hosts]]\nname = "a"\naddress = "127.0.0.1"\n', "port"),
        ('[[hosts]]\nname = "a"\naddress = "127.0.0.1"\nport = false\n', "hosts.0.port"),
    ):
        path = tmp_path / "fleet.toml"
        path.write_text(text, encoding="utf-8")
        result = invoke("deploy.plan", "--inventory", str(path), "--model", "tiny", "--build", "zzzz")
        assert result.returncode == 2, result.stderr
        assert f"invalid host inventory {path}" in result.stderr
        assert f"{field}: Input should be a valid integer" in result.stderr
        assert "host-inventory.schema.json" in result.stderr
        assert "Traceback" not in result.stderr


def test_a_bracketed_ipv6_address_with_a_port_in_an_inventory_says_where_the_port_goes(
    tmp_path: Path,
) -> None:
    # '[::1]:22' was "not a DNS name or an IP address", where 'h:22' already said to give the port apart.
    path = tmp_path / "fleet.toml"
    path.write_text('[[hosts]]\nname = "a"\naddress = "[::1]:22"\n', encoding="utf-8")
    result = invoke("deploy.plan", "--inventory", str(path), "--model", "tiny", "--build", "zzzz")
    assert result.returncode == 2, result.stderr
    assert f"invalid host inventory {path}" in result.stderr
    assert "hosts.0.address: '[::1]:22' holds a port: give the address alone and the port as port = N" in (
        result.stderr
    )
    assert "Traceback" not in result.stderr


def test_an_inventory_key_file_or_known_hosts_that_cannot_serve_is_refused_before_any_host(
    tmp_path: Path,
) -> None:
    # --ssh-key and --known-hosts were checked, the inventory's own were not: ssh only warns about an identity
    # file it cannot read and goes on with the agent's keys.
    (tmp_path / "keys").mkdir()
    host = '[[hosts]]\nname = "a"\naddress = "127.0.0.1"\n'
    for text, says in (
        (f'key_file = "nokey"\n{host}', f"key_file {tmp_path / 'nokey'} does not exist"),
        (f'{host}key_file = "keys"\n', f"hosts[a].key_file {tmp_path / 'keys'} is a directory"),
        (f'known_hosts = "keys"\n{host}', f"known_hosts {tmp_path / 'keys'} is a directory"),
    ):
        path = tmp_path / "fleet.toml"
        path.write_text(text, encoding="utf-8")
        result = invoke("deploy.plan", "--inventory", str(path), "--model", "tiny", "--build", "zzzz")
        assert result.returncode == 2, result.stderr
        assert f"error: host inventory {path}: {says}" in result.stderr
        assert "relative to the inventory" in result.stderr
        assert "Traceback" not in result.stderr


def test_a_host_selection_of_only_commas_is_refused_instead_of_deploying_to_no_host(tmp_path: Path) -> None:
    # ' , ' picked none of the inventory's hosts, and the deploy went on with an empty host list.
    path = tmp_path / "fleet.toml"
    path.write_text(
        '[[hosts]]\nname = "a"\naddress = "127.0.0.1"\n[[hosts]]\nname = "b"\naddress = "127.0.0.2"\n',
        encoding="utf-8",
    )
    for select in (" , ", ","):
        result = invoke(
            "deploy.plan", "--inventory", str(path), "--hosts", select, "--model", "tiny", "--build", "zzzz"
        )
        assert result.returncode == 2, result.stderr
        assert f"error: --hosts {select!r} names no host of the inventory {path}" in result.stderr
        assert "leave --hosts out for all of them: a, b" in result.stderr
        assert "Traceback" not in result.stderr
