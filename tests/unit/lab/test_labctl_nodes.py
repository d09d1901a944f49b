"""What each node is told about itself before it boots (identity, network, apt source, ssh keys)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from labctl import nodes
from labctl.state import StatePaths


def test_hosts_file_lists_every_node_and_keeps_debians_own_name_line():
    text = nodes.render_hosts("node2", 3)
    lines = text.splitlines()
    assert "127.0.1.1\tnode2" in lines
    assert "198.18.0.1\tlab-host" in lines
    assert [line for line in lines if line.startswith("198.18.0.1")][1:] == [
        "198.18.0.11\tnode1",
        "198.18.0.12\tnode2",
        "198.18.0.13\tnode3",
    ]


def test_network_file_is_static_and_has_no_gateway():
    text = nodes.render_network(4)
    assert "Name=host0" in text
    assert "Address=198.18.0.14/24" in text
    assert "Gateway" not in text


def test_apt_source_is_the_lab_mirror_only():
    assert nodes.render_apt_source(8080) == "deb [trusted=yes] http://198.18.0.1:8080/apt/debian ./\n"


def test_known_hosts_line_names_node_and_address():
    line = nodes.render_known_hosts_line(2, "ssh-ed25519 AAAAC3Nza root@node2\n")
    assert line == "node2,198.18.0.12 ssh-ed25519 AAAAC3Nza\n"


def test_machine_ids_are_fresh_32_hex():
    first, second = nodes.new_machine_id(), nodes.new_machine_id()
    assert first != second
    assert len(first) == 32
    assert int(first, 16) >= 0


def test_identity_written_into_the_node_root(tmp_path):
    paths = StatePaths(tmp_path)
    root = paths.node_root("node2")
    (root / "etc/ssh").mkdir(parents=True)
    (root / "root").mkdir()
    paths.node_dir("node2").mkdir(parents=True, exist_ok=True)
    client_public_key = nodes.ensure_client_key(paths)

    nodes.write_identity(paths, 2, 2, 8080, client_public_key)

    assert (root / "etc/hostname").read_text() == "node2\n"
    assert len((root / "etc/machine-id").read_text().strip()) == 32
    assert "Address=198.18.0.12/24" in (root / "etc/systemd/network/10-lab-host0.network").read_text()
    assert (root / "etc/apt/sources.list.d/lab-debian.list").read_text().startswith("deb [trusted=yes]")
    assert (root / "root/.ssh/authorized_keys").read_text() == client_public_key
    private_key = root / "etc/ssh/ssh_host_ed25519_key"
    assert stat.S_IMODE(private_key.stat().st_mode) == 0o600
    assert stat.S_IMODE((root / "root/.ssh").stat().st_mode) == 0o700
    assert private_key.read_bytes() == paths.node_host_key("node2").read_bytes()


def test_host_key_survives_a_second_identity_write(tmp_path):
    """A node started again after a crash must keep the host key that known_hosts names."""
    paths = StatePaths(tmp_path)
    paths.node_dir("node1").mkdir(parents=True)
    first = nodes.ensure_host_key(paths, "node1")
    assert nodes.ensure_host_key(paths, "node1") == first
    assert first.startswith("ssh-ed25519 ")


def test_known_hosts_file_has_one_line_per_node(tmp_path):
    paths = StatePaths(tmp_path)
    for name in ("node1", "node2"):
        paths.node_dir(name).mkdir(parents=True)
        nodes.ensure_host_key(paths, name)
    nodes.write_known_hosts(paths, 2)
    lines = paths.known_hosts.read_text().splitlines()
    assert [line.split()[0] for line in lines] == ["node1,198.18.0.11", "node2,198.18.0.12"]
    pub = Path(str(paths.node_host_key("node2")) + ".pub").read_text().split()[1]
    assert lines[1].split()[2] == pub


def test_nspawn_boots_systemd_on_the_bridge_with_data_bound(tmp_path):
    argv = nodes.nspawn_argv(StatePaths(tmp_path), "node3")
    assert argv[0] == "systemd-nspawn"
    assert {"--boot", "--register=no", "--keep-unit", "--network-bridge=br-lab", "--machine=node3"} <= set(argv)
    assert f"--bind={tmp_path}/nodes/node3/data:/data" in argv
    assert f"--directory={tmp_path}/nodes/node3/root" in argv


def test_a_booting_node_has_stopped_only_when_its_recorded_process_has_exited(tmp_path):
    paths = StatePaths(tmp_path)
    paths.node_dir("node1").mkdir(parents=True)
    assert nodes.stopped_while_booting(paths, "node1")  # never launched: no pid file
    # A live process whose command line does not (yet) name systemd-nspawn, as in the instant of the exec.
    paths.node_pid_file("node1").write_text(f"{os.getpid()}\n")
    assert not nodes.is_running(paths, "node1")
    assert not nodes.stopped_while_booting(paths, "node1")
    child = subprocess.Popen(["true"])
    child.wait()
    paths.node_pid_file("node1").write_text(f"{child.pid}\n")
    assert nodes.stopped_while_booting(paths, "node1")
