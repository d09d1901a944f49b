"""Every port is one kimi_*_port of the kimi role: moving each in an inventory moves the flag of the unit that
listens on it and the firewall rule that admits it, together (issue: the firewall once guarded a literal 13345
while vLLM's data-parallel RPC listened on the port the inventory set).

The serving units are rendered by playbooks/serve.yml on this host (as tests/local/test_serve_render.py renders
them, services unmanaged) for the mp layout (master port), the dp_ep layout (data-parallel RPC port) and the ray
layout (GCS and dashboard ports); the firewall's table by the role's own checks and template
(tests/fixtures/firewall/render.yml, as tests/local/test_firewall_render.py renders it) for the same ports.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.ansible_run import REPO_ROOT, run_playbook
from tests.local.test_firewall_render import file_sets, render
from tests.local.test_serve_render import render_vars

INVENTORIES = REPO_ROOT / "inventories"
# Each port moved off its default, none onto another's.
MOVED = {
    "kimi_api_port": 18000,
    "kimi_master_port": 39501,
    "kimi_data_parallel_rpc_port": 23345,
    "kimi_ray_port": 16379,
    "kimi_ray_dashboard_port": 18265,
    "kimi_node_exporter_port": 19100,
    "kimi_dcgm_exporter_port": 19400,
    "kimi_prometheus_port": 19090,
    "kimi_alertmanager_port": 19093,
    "kimi_router_port": 8443,
}


def exec_starts(root: Path) -> str:
    return "\n".join(p.read_text() for p in sorted(root.rglob("*.service")) if "kimi-" in p.name)


@pytest.mark.parametrize(
    ("inventory", "extra", "flags"),
    [
        ("greennode", {}, ["--port 18000", "--master-port 39501"]),
        ("h200-dp-ep", {}, ["--port 18000", "--data-parallel-rpc-port 23345"]),
        (
            "greennode",
            {"kimi_serve_layout": "ray", "kimi_tensor_parallel_size": 16, "kimi_pipeline_parallel_size": 1},
            ["--port 18000", "--port=16379", "--dashboard-port=18265"],
        ),
    ],
    ids=["mp", "dp_ep", "ray"],
)
def test_moving_each_port_moves_the_units_flags(inventory, extra, flags, tmp_path):
    outcome = run_playbook(
        REPO_ROOT / "playbooks" / "serve.yml",
        INVENTORIES / inventory,
        extravars={**render_vars(tmp_path), **MOVED, **extra},
        timeout=600,
    )
    assert outcome.rc == 0, outcome.failure_messages()
    units = exec_starts(tmp_path)
    for flag in flags:
        assert flag in units, f"{flag} not in the rendered units"
    # No default is left anywhere a unit listens.
    for default in (" 8000", " 29501", " 13345", "=6379", "=8265"):
        assert not re.search(rf"--[a-z-]+{re.escape(default)}\b", units), default


def test_moving_each_port_moves_the_firewall_rules(tmp_path):
    outcome, out = render(tmp_path, router_host="node1", extravars=MOVED)
    assert outcome.rc == 0, outcome.failure_messages()
    node1, node3 = file_sets(out / "node1.nft"), file_sets(out / "node3.nft")
    assert node1["api_ports"] == node3["api_ports"] == {18000}
    assert node1["exporter_ports"] == node3["exporter_ports"] == {19100, 19400}
    # node1 is the monitoring host and the router: its own services moved too.
    assert node1["monitoring_ports"] == {19090, 19093}
    assert node1["router_ports"] == {8443}
