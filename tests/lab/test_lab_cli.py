"""lab/lab against the real host: bad input leaves nothing, nodes are real systemd machines on br-lab, faults
(crash, cut) behave like the real ones, /data is sized, the mirrors answer, and `down` leaves nothing."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from labctl import inventory, net, teardown
from labctl.cli import REQUIRED_PROGRAMS
from labctl.settings import REPO_ROOT, node_address

from tests.ansible_run import run_playbook
from tests.lab_api import fetch_status

pytestmark = pytest.mark.lab


def one_line_error(proc) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def ssh_port_open(address: str) -> bool:
    """Probe a node's sshd from the host, only ever through br-lab."""
    net.require_bridge_route(address)
    try:
        with socket.create_connection((address, 22), timeout=1):
            return True
    except OSError:
        return False


def wait_for(predicate, timeout_s: float = 10) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


# --- bad input: one line, exit 2, nothing created -------------------------------------------------------------


@pytest.mark.parametrize("count", ["0", "9"])
def test_up_rejects_node_counts_outside_1_to_8(lab_controller, count):
    lab_controller.ensure_down()
    assert "from 1 to 8" in one_line_error(lab_controller.run("up", count))
    assert teardown.leftovers(lab_controller.paths) == []


@pytest.mark.parametrize("variable", ["KIMI_LAB_HTTP_PORT", "KIMI_LAB_HF_PORT"])
def test_up_rejects_a_taken_port(lab_controller, variable):
    lab_controller.ensure_down()
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = holder.getsockname()[1]
        message = one_line_error(lab_controller.run("up", "2", env={variable: str(port)}))
    assert f"port {port}" in message
    assert variable in message
    assert teardown.leftovers(lab_controller.paths) == []


def test_up_names_a_missing_host_program(lab_controller, tmp_path):
    lab_controller.ensure_down()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for program in REQUIRED_PROGRAMS:
        if program != "debootstrap":
            (bin_dir / program).symlink_to(shutil.which(program))
    message = one_line_error(lab_controller.run("up", "2", env={"PATH": str(bin_dir)}))
    assert "missing host programs: debootstrap" in message
    assert "apt-get install debootstrap" in message
    assert teardown.leftovers(lab_controller.paths) == []


def test_failed_up_removes_what_it_created(lab_controller):
    """A node that cannot become ready in time (timeout 0) fails the up, which then tears itself down."""
    lab_controller.ensure_down()
    proc = lab_controller.run("up", "1", env={"KIMI_LAB_BOOT_TIMEOUT": "0"})
    assert proc.returncode == 1
    assert "node1 did not accept SSH within 0 s" in proc.stderr
    assert teardown.leftovers(lab_controller.paths) == []


def test_up_killed_while_booting_removes_what_it_created(lab_controller):
    """CI's timeout sends SIGTERM: an `up` stopped half-way (nodes booting) must still clean up after itself."""
    lab_controller.ensure_down()
    proc = subprocess.Popen(
        [*lab_controller.command, "up", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT
    )
    pid_file = lab_controller.paths.node_pid_file("node1")
    booting = wait_for(pid_file.exists, timeout_s=300)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert booting, err
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "up failed; removing what it created" in err
    assert teardown.leftovers(lab_controller.paths) == []


# --- a running 2-node lab ---------------------------------------------------------------------------------------


def test_up_again_keeps_a_healthy_lab_of_that_size(lab):
    """`make demo` twice: the second `up 2` checks the lab (nodes accept SSH, mirrors answer) and changes nothing."""
    before = lab.status()
    pids = [lab.paths.node_pid_file(n["name"]).read_text() for n in before["nodes"]]
    started = time.monotonic()
    proc = lab.run("up", "2")
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    assert "a healthy lab with 2 node(s) is already up" in proc.stdout
    assert elapsed < 10, elapsed
    after = lab.status()
    assert after == before
    assert [lab.paths.node_pid_file(n["name"]).read_text() for n in after["nodes"]] == pids


def test_up_with_another_size_is_refused_while_a_lab_is_up(lab):
    message = one_line_error(lab.run("up", "3"))
    assert "a lab with 2 nodes is already up, and 3 were asked for" in message
    assert "`lab/lab down` first" in message and "`make demo NODES=2`" in message
    assert [n["state"] for n in lab.status()["nodes"]] == ["running", "running"]


def test_up_again_with_a_crashed_node_names_it_and_the_fix(lab):
    assert lab.run("crash", "node2").returncode == 0
    try:
        message = one_line_error(lab.run("up", "2"))
        assert "not healthy: node2 is not running (crashed)" in message
        assert "`lab/lab start node2`" in message
    finally:
        assert lab.run("start", "node2").returncode == 0


def test_nodes_boot_real_systemd_and_accept_ssh(lab):
    for name in ("node1", "node2"):
        proc = lab.ssh(name, "cat /proc/1/comm; hostname; systemctl is-system-running; ls /etc/apt/sources.list.d")
        assert proc.returncode in (0, 1), proc.stderr  # is-system-running exits 1 when degraded
        comm, hostname, system_state, sources = proc.stdout.split(maxsplit=3)
        assert (comm, hostname) == ("systemd", name)
        assert system_state in ("running", "degraded")
        assert sources.split() == ["lab-debian.list"]


def test_nodes_reach_each_other_by_name(lab):
    assert lab.ssh("node1", "ping -c1 -W2 node2").returncode == 0
    assert lab.ssh("node2", f"ping -c1 -W2 {node_address(1)}").returncode == 0


def test_status_json_is_the_molecule_contract(lab):
    report = lab.status()
    assert [n["name"] for n in report["nodes"]] == ["node1", "node2"]
    for node in report["nodes"]:
        assert node["address"] == node_address(int(node["name"][-1]))
        assert node["state"] == "running"
        assert Path(node["ssh_key"]).is_file()
        assert Path(node["known_hosts"]).is_file()
    assert report["servers"]["http"]["pid"] and report["servers"]["hf"]["pid"]


def test_inventory_drives_ansible_with_strict_host_keys(lab, tmp_path):
    hosts = yaml.safe_load(inventory.hosts_path().read_text())
    assert list(hosts["kimi_nodes"]["hosts"]) == ["node1", "node2"]
    generated = yaml.safe_load(inventory.generated_vars_path().read_text())
    assert generated["lab_node_count"] == 2
    assert generated["lab_hf_endpoint"] == lab.status()["mirrors"]["hf_endpoint"]
    playbook = tmp_path / "hostname.yml"
    playbook.write_text(
        "- hosts: kimi_nodes\n  gather_facts: false\n  tasks:\n"
        "    - name: Read the hostname\n      ansible.builtin.command: hostname\n      changed_when: false\n"
    )
    result = run_playbook(playbook, inventory.inventory_dir(), timeout=120)
    assert result.rc == 0, result.failure_messages()
    outputs = {host: res["stdout"] for host, res in result.results_of("Read the hostname").items()}
    assert outputs == {"node1": "node1", "node2": "node2"}


def test_mirror_servers_answer_on_the_bridge_address_from_a_node(lab):
    """The static server serves the Debian repository's index; olah answers for the checkpoint's revision
    (olah's own front page is not asked for: olah 0.5.4 fails rendering it)."""
    report = lab.status()
    checkpoint = report["checkpoint"]
    urls = [
        report["mirrors"]["apt_debian"] + "/Packages",
        f"{report['mirrors']['hf_endpoint']}/api/models/{checkpoint['repo_id']}/revision/{checkpoint['revision']}",
    ]
    script = "import sys, urllib.request\nfor url in sys.argv[1:]:\n    print(urllib.request.urlopen(url).status)\n"
    proc = lab.ssh("node1", f"python3 -c '{script}' {' '.join(urls)}")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["200", "200"]


def test_data_is_sized_and_resizable(lab):
    def data_size(node: str) -> int:
        proc = lab.ssh(node, "df -B1 --output=size /data | tail -1")
        assert proc.returncode == 0, proc.stderr
        return int(proc.stdout)

    assert data_size("node2") == 4 * 1024**3
    assert lab.ssh("node2", "head -c 80M /dev/zero > /data/fill").returncode == 0
    assert "bytes are in use" in one_line_error(lab.run("data-size", "node2", "64M"))
    assert lab.ssh("node2", "rm /data/fill").returncode == 0
    assert lab.run("data-size", "node2", "64M").returncode == 0
    try:
        assert data_size("node2") == 64 * 1024**2
        fill = lab.ssh("node2", "head -c 100M /dev/zero > /data/fill; echo $?; rm -f /data/fill")
        assert fill.stdout.split()[-1] != "0"
        assert "No space left on device" in fill.stderr
        assert data_size("node1") == 4 * 1024**3
    finally:
        assert lab.run("data-size", "node2", "4G").returncode == 0
    assert data_size("node2") == 4 * 1024**3


def test_commands_name_nodes_outside_the_lab(lab):
    assert "node3 is not in this lab" in one_line_error(lab.run("crash", "node3"))
    assert "not a lab node name" in one_line_error(lab.run("cut", "node9"))
    assert "already running" in one_line_error(lab.run("start", "node1"))


def test_crash_then_start_keeps_the_nodes_disk(lab):
    write = lab.ssh("node2", "echo kept > /root/before-crash && echo kept > /data/before-crash && sync")
    assert write.returncode == 0, write.stderr
    assert lab.run("crash", "node2").returncode == 0
    assert [n["state"] for n in lab.status()["nodes"]] == ["running", "crashed"]
    assert not ssh_port_open(node_address(2))
    assert lab.ssh("node1", "ping -c1 -W1 node2").returncode != 0

    start = lab.run("start", "node2")
    assert start.returncode == 0, start.stderr
    assert lab.ssh("node2", "cat /root/before-crash /data/before-crash").stdout.split() == ["kept", "kept"]
    assert lab.ssh("node1", "ping -c1 -W2 node2").returncode == 0


def test_cut_then_heal(lab):
    assert lab.run("cut", "node1").returncode == 0
    try:
        assert [n["state"] for n in lab.status()["nodes"]] == ["cut", "running"]
        assert not ssh_port_open(node_address(1))
        assert lab.ssh("node2", "ping -c1 -W1 node1").returncode != 0
    finally:
        assert lab.run("heal", "node1").returncode == 0
    assert wait_for(lambda: ssh_port_open(node_address(1)))
    assert lab.ssh("node1", "ping -c1 -W2 node2").returncode == 0


def test_airgap_keeps_the_nodes_off_the_host_but_not_off_each_other(lab):
    """An air-gapped site: a node's fetch from the host's mirror fails, from another node it works, and the
    host still reaches every node (Ansible's SSH). `off` gives the mirrors back; `down` removes the chain too."""
    apt_index = lab.status()["mirrors"]["apt_debian"] + "/Packages"
    fetch = fetch_status(apt_index)
    serve_on_node2 = "python3 -m http.server 18181 --bind 0.0.0.0 --directory /etc >/dev/null 2>&1 & echo $!"
    pid = lab.ssh("node2", serve_on_node2).stdout.strip()
    try:
        assert lab.run("airgap", "on").returncode == 0
        assert lab.run("airgap", "on").returncode == 0, "a second `on` must be a no-op"
        assert lab.status()["airgap"] is True
        refused = lab.ssh("node1", fetch)
        assert refused.returncode != 0, f"node1 still fetched {apt_index} from the host: {refused.stdout}"
        peer = fetch_status(f"http://{node_address(2)}:18181/hostname")
        assert wait_for(lambda: lab.ssh("node1", peer).stdout == "200")
        assert lab.ssh("node1", "hostname").stdout.strip() == "node1"
    finally:
        assert lab.run("airgap", "off").returncode == 0
        lab.ssh("node2", f"kill {pid}")
    assert lab.status()["airgap"] is False
    assert lab.ssh("node1", fetch).stdout == "200"
    assert lab.run("airgap", "on").returncode == 0  # left on: `down` must remove it (next test)


def test_down_leaves_nothing_behind(lab):
    lab.ensure_down()
    assert teardown.leftovers(lab.paths) == []
    assert not net.link_exists("br-lab")
    assert json.loads(lab.run("status", "--json").stdout)["up"] is False


# --- the largest lab ----------------------------------------------------------------------------------------------


def test_eight_nodes(lab_controller):
    report = lab_controller.ensure_up(8)
    assert [n["state"] for n in report["nodes"]] == ["running"] * 8
    assert lab_controller.ssh("node8", f"ping -c1 -W2 {node_address(1)}").returncode == 0
    lab_controller.ensure_down()
    assert teardown.leftovers(lab_controller.paths) == []
