"""site.yml against the real lab, through ansible-runner: converge, idempotence, and every preflight refusal.

Each refusal must stop the play in preflight, name the host, the check and both numbers, and change nothing.
The wall time of each refused run is printed (`-s` shows it); benchmarks, not tests, judge speed.
"""

from __future__ import annotations

import json
import shutil
import time

import pytest
import yaml

from tests.ansible_run import REPO_ROOT, run_playbook
from tests.lab_api import (
    LISTENERS,
    NODE2_ADDRESS,
    RANK0_ADDRESS,
    connect_from_node_command,
    connect_outcome,
    generates_a_token,
    reachable_ports,
)

pytestmark = pytest.mark.lab

SITE = REPO_ROOT / "site.yml"
LAB_INVENTORY = REPO_ROOT / "inventories" / "lab"
# The watchdogs' bound for a group to form again (tests/lab/test_site_then_heal.py's HEAL_BOUND_S).
HEAL_AFTER_CUT_BOUND_S = 300
NCCL_PIN = "2.30.7-1+cuda13.3"


def run_site(**kwargs):
    started = time.monotonic()
    result = run_playbook(SITE, kwargs.pop("inventory", LAB_INVENTORY), **kwargs)
    print(f"site.yml {kwargs} -> rc {result.rc} in {time.monotonic() - started:.1f} s")
    return result


API_CHECK_TASK = "Check the API on rank 0 (model listed, launch flags, a structured tool call, reasoning)"


def api_check_status(result, name: str) -> str:
    checks = result.results_of(API_CHECK_TASK)["node1"]["checks"]
    return next(check["status"] for check in checks if check["name"] == name)


def assert_refused(result, *fragments: str) -> str:
    """The play failed, changed nothing, and one failure message carries every fragment; returns it."""
    assert result.rc != 0, "the play should have been refused"
    assert result.changed == 0, f"a refused play changed something: {result.stats.get('changed')}"
    for message in result.failure_messages():
        if all(fragment in message for fragment in fragments):
            return message
    raise AssertionError(f"no failure names {fragments}; failures: {result.failure_messages()}")


START_TASK = "Time this start from its journal (every rank, its current invocation)"


def assert_each_rank_timed_its_start(result) -> None:
    """The serve phase read where the start it made spent its time from each rank's journal (docs/self-healing.md,
    "Where a start spends its time"): both ranks formed the group and loaded, rank 0's API came up and generated."""
    starts = result.results_of(START_TASK)
    for node in ("node1", "node2"):
        milestones = starts[node]["milestones"]
        reached = [name for name, at in milestones.items() if at is not None]
        assert {"started", "rendezvous_entered", "group_formed", "weights_loaded", "compiled"} <= set(reached), (
            node,
            milestones,
        )
        assert starts[node]["workers"] == 1, starts[node]
        print(f"{node} start: " + ", ".join(f"{p['end']} +{p['seconds']:.1f} s" for p in starts[node]["phases"]))
    rank0 = starts["node1"]["milestones"]
    assert rank0["started"] < rank0["group_formed"] < rank0["engine_ready"] < rank0["api_up"] <= rank0["first_token"]
    assert starts["node1"]["reported"]["init_engine_s"] > 0
    assert starts["node2"]["milestones"]["api_up"] is None  # a headless rank serves no API


def test_site_converges_and_a_second_run_changes_nothing(serving):
    # `serving` ran the first converge of this lab (once for the whole session; tests/lab/conftest.py).
    first = serving.converged
    assert first.rc == 0, first.failure_messages()
    assert first.changed > 0, "the first converge of fresh nodes changed nothing"
    second = run_site()
    assert second.rc == 0, second.failure_messages()
    assert second.changed == 0, second.stats.get("changed")
    assert second.count("failures") == 0
    # The first converge made the model generate (tool call); the second, which changed nothing on a service that
    # passed that full verify, only read (docs/verify.md, "What a converge that changes nothing checks").
    assert api_check_status(first, "tool_call") == "pass"
    assert api_check_status(second, "tool_call") == "skip"
    report = json.loads((REPO_ROOT / "artifacts" / "verify-latest.json").read_text())
    skipped = {check["name"]: check["detail"] for check in report["checks"] if check["status"] == "skip"}
    assert skipped["load_test"].startswith("nothing changed since the full verify that passed"), skipped
    assert report["loadtest"] is None
    assert_each_rank_timed_its_start(first)
    # The stack phase pinned and held the system NCCL and CUDA on every node (the parity phase of both runs
    # passed: it is part of site.yml).
    for node in ("node1", "node2"):
        versions = serving.ssh(node, "dpkg-query -W -f='${Package}=${Version}\\n' libnccl2 libnccl-dev").stdout
        assert sorted(versions.split()) == [f"libnccl-dev={NCCL_PIN}", f"libnccl2={NCCL_PIN}"], versions
        holds = serving.ssh(node, "apt-mark showhold").stdout.split()
        assert {"libnccl2", "libnccl-dev", "cuda-toolkit-13-3"} <= set(holds), holds


def test_every_listening_socket_is_closed_to_the_lab_host_but_ssh_the_public_api_and_monitoring(serving):
    """Default deny, tried on every TCP socket each node really listens on (ss, not a list kept here): the lab
    host is the admin network (SSH; Prometheus and Alertmanager on node1, the monitoring host) and, with no router
    in this inventory and kimi_api_public, a client of the API; vLLM's, Ray's and the exporters' ports refuse it.
    The replica's other node reaches every one of them, the ports vLLM picked at random included."""
    addresses = {"node1": RANK0_ADDRESS, "node2": NODE2_ADDRESS}
    allowed = {"node1": {22, 8000, 9090, 9093}, "node2": {22}}
    for node, address in addresses.items():
        listening = serving.ssh(node, LISTENERS)
        assert listening.returncode == 0, listening.stderr
        ports = reachable_ports(listening.stdout, address)
        # vLLM's API (rank 0), the master port and node-exporter at least: the list is the node's, not ours.
        assert {22, 9100} <= set(ports) and (node == "node2" or {8000, 29501} <= set(ports)), ports
        from_lab_host = {port: connect_outcome(address, port) for port in ports}
        assert from_lab_host == {p: "accepted" if p in allowed[node] else "refused" for p in ports}, node
        peer = "node2" if node == "node1" else "node1"
        tried = serving.ssh(peer, connect_from_node_command([f"{address}:{port}" for port in ports]))
        assert tried.returncode == 0, tried.stderr
        assert set(json.loads(tried.stdout).values()) == {"accepted"}, (node, tried.stdout)


def test_data_filesystem_too_small_is_refused_with_both_numbers(serving):
    # After the converge /data holds the ~8.6 MB checkpoint: what is still needed is the margin (0.05 GiB),
    # and 20 MiB leaves less free than that.
    assert serving.run("data-size", "node2", "20M").returncode == 0
    try:
        message = assert_refused(run_site(tags="preflight"), "node2: data_disk: disk /data: need")
        assert "available" in message and " B (" in message
    finally:
        assert serving.run("data-size", "node2", "4G").returncode == 0


def test_wrong_interface_name_is_refused_for_every_node(serving):
    result = run_site(tags="preflight", extravars={"kimi_network_interface": "ib9"})
    for node in ("node1", "node2"):
        assert_refused(result, f"{node}: interfaces: interface ib9 does not exist (node has: host0, lo)")


def test_a_taken_port_is_refused_naming_the_process(serving):
    # Our own vLLM (kimi-vllm.service) holds its ports after the converge, and preflight accepts that (the master
    # port below stays ours); a stranger holding one must be refused. The stranger takes the port a run with
    # kimi_api_port 8001 would need, so the serving group is never touched.
    started = serving.ssh("node1", "systemd-run --unit=port-squatter python3 -m http.server 8001")
    assert started.returncode == 0, started.stderr
    try:
        result = run_site(tags="preflight", extravars={"kimi_api_port": 8001})
        message = assert_refused(result, "node1: ports: port 8001 (API) is taken by pid", "http.server")
        assert "port 29501" not in message, "our own vLLM's master port was counted as taken"
    finally:
        serving.ssh("node1", "systemctl stop port-squatter")
    assert generates_a_token()


def test_layout_not_matching_the_nodes_is_refused(serving):
    result = run_site(tags="preflight", extravars={"kimi_pipeline_parallel_size": 3})
    assert_refused(result, "layout needs 3 GPUs", "kimi_nodes has 2 node(s) x kimi_gpus_per_node 1 = 2")


def test_duplicate_ranks_are_refused(serving, tmp_path):
    inventory = tmp_path / "inventory"
    inventory.mkdir()
    hosts = yaml.safe_load((LAB_INVENTORY / "hosts.yml").read_text())
    for host in hosts["kimi_nodes"]["hosts"].values():
        host["kimi_node_rank"] = 0
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts, sort_keys=False))
    shutil.copytree(LAB_INVENTORY / "group_vars", inventory / "group_vars")
    result = run_site(tags="preflight", inventory=inventory)
    assert_refused(result, "duplicate kimi_node_rank (rank 0: node1, node2); rank(s) 1 have no host")


def test_a_plan_that_does_not_fit_is_refused(serving):
    # 1 MiB of KV per rank holds 896 tokens: less than one 2,048-token sequence.
    result = run_site(tags="preflight", extravars={"kimi_kv_cache_gib_per_gpu": 0.0009765625})
    message = assert_refused(result, "plan does not fit")
    assert "2,048" in message or "2048" in message, message


# Tier 2 with the other heals (tests/tiers.py): the group takes about two minutes to form again.
@pytest.mark.tier2("lab-heal")
def test_a_node_cut_off_the_network_is_reported_unreachable(serving):
    assert serving.run("cut", "node2").returncode == 0
    try:
        result = run_site(tags="preflight")
        assert result.rc != 0
        assert result.unreachable_hosts == ["node2"]
        (failure,) = [f for f in result.failures if f["unreachable"]]
        assert failure["host"] == "node2" and failure["msg"]
    finally:
        assert serving.run("heal", "node2").returncode == 0
    # The cut broke the group's gloo connections; the watchdogs form it again once the link is back (96 s
    # measured), which also spares the next file a converge.
    healed = time.monotonic()
    while not generates_a_token(timeout=10):
        assert time.monotonic() - healed < HEAL_AFTER_CUT_BOUND_S, (
            f"the group did not serve within {HEAL_AFTER_CUT_BOUND_S} s of node2's link coming back"
        )
        time.sleep(3)
    print(f"network cut of node2: the group served again {time.monotonic() - healed:.1f} s after the link came back")
