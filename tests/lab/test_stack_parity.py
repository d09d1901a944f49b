"""The stack and parity phases on the shared, serving two-node lab: skew caught and repaired, a pin bumped and held.

Skew is injected the way it happens in the field: a deb or a wheel changed by hand on one node. Parity must
name the node, the item and both versions; re-running site.yml must bring the node back, and parity passes.
The lab is the one `serving` converged (tests/lab/conftest.py): the stack is already there, so no test here
pays for a converge of fresh nodes (these tests once booted a third node and converged all three, 5 minutes
of CI). Two nodes are enough: parity judges each pinned item against the pin, not against the other nodes,
and each skew is put on a different node. Only the stack and parity phases run; the service keeps running.
"""

from __future__ import annotations

import shutil

import pytest
import yaml

from tests.ansible_run import REPO_ROOT, run_playbook

pytestmark = pytest.mark.lab

SITE = REPO_ROOT / "site.yml"
PARITY = REPO_ROOT / "playbooks" / "parity.yml"
LAB_INVENTORY = REPO_ROOT / "inventories" / "lab"
NCCL_PIN = "2.30.7-1+cuda13.3"


def converge(limit: str | None = None, **extra):
    result = run_playbook(SITE, LAB_INVENTORY, tags="stack,parity", limit=limit, extravars=extra, timeout=2400)
    assert result.rc == 0, result.failure_messages()
    return result


def parity(inventory=LAB_INVENTORY, **extra):
    return run_playbook(PARITY, inventory, extravars=extra, timeout=600)


def on_node(lab, node: str, command: str) -> str:
    proc = lab.ssh(node, command, timeout=600)
    assert proc.returncode == 0, f"{node}: {command}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout.strip()


def parity_failure(result, *fragments: str) -> str:
    assert result.rc != 0, "parity should have failed"
    for message in result.failure_messages():
        if all(fragment in message for fragment in fragments):
            return message
    raise AssertionError(f"no parity failure names {fragments}: {result.failure_messages()}")


def test_a_different_libnccl2_and_nccl_wheel_are_named_with_their_node_then_a_bumped_pin_repairs_and_holds(
    serving,
):
    # Two drifts at once, one per node (one parity run and one converge for both keeps the lab layer in CI's
    # time): the system libnccl2 downgraded on node2, the venv's NCCL wheel swapped on node1. The stack's own
    # idempotence and holds are test_site_on_lab.py's.
    on_node(
        serving,
        "node2",
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --allow-change-held-packages --allow-downgrades "
        "libnccl2=2.30.5-1+cuda13.3 libnccl-dev=2.30.5-1+cuda13.3",
    )
    mirrors = yaml.safe_load((LAB_INVENTORY / "group_vars" / "all" / "generated.yml").read_text())
    on_node(
        serving,
        "node1",
        "/opt/vllm/current/bin/pip install -q --no-index --no-deps --trusted-host 198.18.0.1 "
        f"--find-links {mirrors['lab_pip_find_links']} nvidia-nccl-cu13==2.30.4",
    )
    failed = parity()
    parity_failure(failed, "node2", "libnccl2", "2.30.5-1+cuda13.3", NCCL_PIN)
    parity_failure(failed, "node1", "nvidia-nccl-cu13", "2.30.4", "2.28.9")
    # The same converge that repairs both also bumps the pin: every node upgraded, held, and parity passes.
    bumped = "2.30.8-1+cuda13.3"
    try:
        converge(kimi_libnccl2_version=bumped)
        for node in ("node1", "node2"):
            state = on_node(serving, node, "dpkg-query -W -f='${Version} ${Status}' libnccl2")
            assert state == f"{bumped} hold ok installed"
        assert parity(kimi_libnccl2_version=bumped).rc == 0
    finally:
        converge()
    assert parity().rc == 0


# Tier 2, with drift (tests/tiers.py): four stack and parity runs (about 3.5 min) for one interface name.
@pytest.mark.tier2("lab-drift")
def test_an_interface_missing_on_one_node_is_reported_for_that_node(serving, tmp_path):
    inventory = tmp_path / "inventory"
    inventory.mkdir()
    hosts = yaml.safe_load((LAB_INVENTORY / "hosts.yml").read_text())
    hosts["kimi_nodes"]["hosts"]["node2"]["kimi_network_interface"] = "ib7"
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts, sort_keys=False))
    shutil.copytree(LAB_INVENTORY / "group_vars", inventory / "group_vars")
    # Only the stack writes the environment file with the wrong name; preflight would refuse it first.
    written = run_playbook(SITE, inventory, tags="stack", limit="node2", timeout=1200)
    assert written.rc == 0, written.failure_messages()
    try:
        parity_failure(parity(inventory), "node2", "ib7")
    finally:
        converge(limit="node2")
    assert parity().rc == 0
