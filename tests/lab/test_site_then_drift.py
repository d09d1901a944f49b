"""playbooks/drift.yml against the real, serving lab: clean after a converge, every injected drift named with
its host, and clean again after site.yml. Nothing on the nodes may change while drift.yml runs.

Seven kinds of drift are injected at once, each at its own host/kind pair (a unit edited on node2, the NCCL
environment file edited on node1, node2's checkpoint marker changed, node1's weights corrupted in place at
the same size, a libnccl2 installed by hand on node2, a held package unheld on node1, the headless rank
stopped), and each finding is asserted on its own with its host; one drift run keeps the lab layer inside
CI's time (a drift run is a check-mode converge). site.yml repairs all of them (the corrupted weights: its
checkpoint phase sees their stat differ from the marker's, verifies them, fetches them again).
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request

import pytest

from tests.ansible_run import REPO_ROOT, run_playbook
from tests.lab_api import RANK0_ADDRESS

# Tier 2 (tests/tiers.py): make test-all, and CI while its time allows.
pytestmark = [pytest.mark.lab, pytest.mark.tier2("lab-drift")]

SITE = REPO_ROOT / "site.yml"
DRIFT = REPO_ROOT / "playbooks" / "drift.yml"
LAB_INVENTORY = REPO_ROOT / "inventories" / "lab"
REPORT_TASK = "Write the drift report on the controller"
NCCL_PIN = "2.30.7-1+cuda13.3"
OTHER_NCCL = "2.30.5-1+cuda13.3"
MARKER = "/data/models/lab-mini/.kimi-checkpoint.json"
WEIGHTS = "/data/models/lab-mini/model.safetensors"


def firing_alerts() -> set[tuple[str, str]]:
    """(alert name, node) of every alert rank 0's Prometheus has firing (the monitoring phase runs there)."""
    route = subprocess.run(["ip", "route", "get", RANK0_ADDRESS], capture_output=True, text=True, check=True)
    assert "dev br-lab" in route.stdout, route.stdout
    with urllib.request.urlopen(f"http://{RANK0_ADDRESS}:9090/api/v1/alerts", timeout=10) as reply:
        alerts = json.load(reply)["data"]["alerts"]
    return {(a["labels"]["alertname"], a["labels"].get("node", "")) for a in alerts if a["state"] == "firing"}


def wait_for_alert(name: str, node: str, firing: bool, timeout: float = 60) -> float:
    started = time.monotonic()
    while ((name, node) in firing_alerts()) != firing:
        assert time.monotonic() - started < timeout, f"{name} on {node} not {'firing' if firing else 'resolved'}"
        time.sleep(2)
    return time.monotonic() - started


def run(playbook, **kwargs):
    started = time.monotonic()
    result = run_playbook(playbook, LAB_INVENTORY, **kwargs)
    print(f"{playbook.name} {kwargs} -> rc {result.rc} in {time.monotonic() - started:.1f} s")
    return result


def drift():
    result = run(DRIFT)
    assert result.changed == 0, f"drift.yml changed something: {result.stats.get('changed')}"
    (report,) = result.results_of(REPORT_TASK).values()
    return result, report


def on_node(lab, node: str, command: str) -> str:
    proc = lab.ssh(node, command)
    assert proc.returncode == 0, f"{node}: {command}: {proc.stderr}"
    return proc.stdout


def assert_named(messages: list[str], host: str, kind: str, *fragments: str) -> None:
    wanted = f"{host}: {kind}: "
    if not any(m.startswith(wanted) and all(f in m for f in fragments) for m in messages):
        raise AssertionError(f"no '{wanted}...{' ... '.join(fragments)}' among:\n" + "\n".join(messages))


def test_each_injected_drift_is_named_with_its_host_then_site_repairs_all(serving):
    marker = on_node(serving, "node2", f"cat {MARKER}")
    on_node(serving, "node2", "echo '# edited by hand' >> /etc/systemd/system/kimi-vllm-headless.service")
    on_node(serving, "node1", "echo NCCL_DEBUG=TRACE >> /etc/kimi/nccl.env")
    on_node(serving, "node2", f'sed -i \'s/"revision": "[0-9a-f]*"/"revision": "{"0" * 40}"/\' {MARKER}')
    assert on_node(serving, "node2", f"cat {MARKER}") != marker
    on_node(
        serving,
        "node2",
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --allow-change-held-packages --allow-downgrades "
        f"libnccl2={OTHER_NCCL} libnccl-dev={OTHER_NCCL}",
    )
    on_node(serving, "node1", "apt-mark unhold cuda-toolkit-13-3")
    on_node(serving, "node2", "systemctl stop kimi-vllm-headless.service")
    # The firewall's TCP reset for everyone it does not admit, deleted by hand with nft (strangers then wait for a
    # timeout instead of a refusal). The lab's nodes have no /etc/protocols: nft lists the protocol as a number.
    on_node(
        serving,
        "node2",
        "nft delete rule inet kimi input handle "
        "$(nft -a list chain inet kimi input | awk '/reject with tcp reset/ {print $NF}')",
    )
    good_weights = on_node(serving, "node1", f"sha256sum {WEIGHTS}").split()[0]
    # Same size, same inode, new mtime: what the marker's size alone (drift before marker version 2) missed.
    on_node(serving, "node1", f"dd if=/dev/urandom of={WEIGHTS} bs=1 count=16 seek=4096 conv=notrunc status=none")
    assert on_node(serving, "node1", f"sha256sum {WEIGHTS}").split()[0] != good_weights

    result, report = drift()
    assert result.rc != 0
    messages = report["messages"]
    assert_named(messages, "node2", "edited", "edited by hand", "kimi-vllm-headless.service (unit file)")
    assert_named(messages, "node1", "edited", "edited by hand", "/etc/kimi/nccl.env (environment file)")
    assert_named(messages, "node2", "checkpoint", "marker does not match the pin", "0" * 40)
    assert_named(messages, "node1", "checkpoint", "checkpoint file model.safetensors: changed since its verification")
    assert_named(messages, "node2", "version", "libnccl2", OTHER_NCCL, NCCL_PIN)
    assert_named(messages, "node1", "hold", "cuda-toolkit-13-3")
    assert_named(messages, "node2", "service", "kimi-vllm-headless.service")
    assert_named(messages, "node2", "converge", "firewall", "rule missing: meta l4proto", "reject with tcp reset")
    # The verdict reached node-exporter on every node, and Prometheus turned it into a firing alert.
    for node in ("node1", "node2"):
        assert "kimi_drift_ok 0" in on_node(serving, node, "cat /var/lib/prometheus/node-exporter/kimi_drift.prom")
    print(f"KimiDriftFound firing {wait_for_alert('KimiDriftFound', 'node2', True):.1f} s after drift.yml ended")
    # drift.yml only read: every injected change is still there.
    assert "# edited by hand" in on_node(serving, "node2", "cat /etc/systemd/system/kimi-vllm-headless.service")
    assert "NCCL_DEBUG=TRACE" in on_node(serving, "node1", "cat /etc/kimi/nccl.env")
    assert OTHER_NCCL in on_node(serving, "node2", "dpkg-query -W -f='${Version}' libnccl2")
    assert on_node(serving, "node1", f"sha256sum {WEIGHTS}").split()[0] != good_weights
    assert on_node(serving, "node2", "systemctl is-active kimi-vllm-headless.service || true").strip() != "active"

    # The phases that own what was broken (stack, firewall, checkpoint, serve); preflight, parity and verify would
    # pass as they did in the converge before, and monitoring was not touched.
    repaired = run(SITE, skip_tags="preflight,parity,monitoring,verify")
    assert repaired.rc == 0, repaired.failure_messages()
    assert on_node(serving, "node1", f"sha256sum {WEIGHTS}").split()[0] == good_weights
    # Right after a converge drift is clean (this run is also the "no drift" case: a separate one before the
    # injection would repeat it).
    result, report = drift()
    assert result.rc == 0, report["messages"]
    assert report["drifted"] is False
    assert report["report_paths"]["markdown"].endswith(".md")
    print(f"KimiDriftFound resolved {wait_for_alert('KimiDriftFound', 'node2', False):.1f} s after a clean drift.yml")
