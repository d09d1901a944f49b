"""The firewall role's table inet kimi, rendered by Ansible through the role's own checks and defaults
(tests/fixtures/firewall/render.yml, with the kimi role's kimi_router_hosts and kimi_monitoring_hosts read from
roles/kimi/vars/main.yml) for every node of a two-replica inventory, then loaded into throwaway network
namespaces (tests/netns.py; this host's ruleset is never touched) and tried with real TCP connections over a veth
pair:

* with a router, a node's API port admits the router, the monitoring host (the first replica's rank 0 without a
  kimi_monitoring group, as the monitoring role's default; that group when it has hosts) and the node's replica
  peers (their watchdogs ask rank 0's /health), and refuses the other replica's nodes and the lab host, each
  with a TCP reset (ECONNREFUSED at once, not a timeout);
* without a router the API port is the front door and admits any source, while the replica's ports still refuse
  strangers;
* a node's master, data-parallel RPC and Ray ports admit its replica's nodes only;
* a port the role does not name stays open, and the loopback always passes;
* loading the file replaces an older table inet kimi and leaves the host's other tables as they were;
* node1's file is the one tests/fixtures/firewall/nft records nft's listings of;
* a host the rules name without a cluster IPv4 address fails the play, naming the host and the variable, before
  any file is rendered.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import yaml

from tests import netns
from tests.ansible_run import REPO_ROOT, run_playbook
from tests.paths import FIXTURES

RENDER = REPO_ROOT / "tests" / "fixtures" / "firewall" / "render.yml"
RECORDED = FIXTURES / "firewall" / "nft" / "node1.nft"
ADDRESSES = {"node1": "10.99.0.11", "node2": "10.99.0.12", "node3": "10.99.0.13", "node4": "10.99.0.14"}
ROUTER, LAB_HOST = "10.99.0.5", "10.99.0.1"
ROUTER1 = {"kimi_cluster_address": ROUTER}
REPLICAS = {"a": ["node1", "node2"], "b": ["node3", "node4"]}
API, MASTER, DP_RPC, RAY_GCS, RAY_DASHBOARD, UNMANAGED = 8000, 29501, 13345, 6379, 8265, 9100
GROUP_PORTS = [MASTER, DP_RPC, RAY_GCS, RAY_DASHBOARD]
API_FROM_CLIENTS = "tcp dport @api_ports ip saddr @api_clients accept"
API_OPEN = "tcp dport @api_ports accept"

UNAVAILABLE = netns.unavailable()
needs_netns = pytest.mark.skipif(UNAVAILABLE is not None, reason=str(UNAVAILABLE))


def inventory(directory: Path, *, router: dict | None = ROUTER1, monitoring: list[str] | None = None) -> Path:
    """Two replicas of two nodes, router1 in a kimi_router group (none when router is None) with these host vars,
    and the facts the kimi role sets (its contract with the roles)."""
    nodes = {
        host: {"kimi_cluster_address": address, "kimi_replica_name": name, "kimi_replica_hosts": members}
        for name, members in REPLICAS.items()
        for host, address in ADDRESSES.items()
        if host in members
    }
    children = {"kimi_nodes": {"hosts": nodes}}
    if router is not None:
        children["kimi_router"] = {"hosts": {"router1": router}}
    if monitoring is not None:
        children["kimi_monitoring"] = {"hosts": dict.fromkeys(monitoring)}
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, "kimi_replicas": REPLICAS}
    path = directory / "hosts.yml"
    path.write_text(yaml.safe_dump({"all": {"vars": local, "children": children}}))
    return path


def render(directory: Path, extravars: dict | None = None, **kwargs):
    out = directory / "rendered"
    out.mkdir()
    extravars = {"firewall_render_dir": str(out), **(extravars or {})}
    outcome = run_playbook(RENDER, inventory(directory, **kwargs), extravars=extravars)
    return outcome, out


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    outcome, out = render(tmp_path_factory.mktemp("firewall"))
    assert outcome.rc == 0, outcome.failure_messages()
    return out


@pytest.fixture(scope="module")
def rendered_without_router(tmp_path_factory) -> Path:
    outcome, out = render(tmp_path_factory.mktemp("firewall-open"), router=None)
    assert outcome.rc == 0, outcome.failure_messages()
    return out


def file_sets(path: Path) -> dict[str, set]:
    """Each named set's elements (addresses and ports, without comments), as the rendered file writes them."""
    sets = re.findall(r"^\tset (\w+) \{\n(.*?)^\t\}", path.read_text(), re.MULTILINE | re.DOTALL)
    return {
        name: {int(e) if e.isdigit() else e for e in re.findall(r"^\t+([0-9.]+) comment", block, re.MULTILINE)}
        for name, block in sets
    }


def input_rules(path: Path) -> list[str]:
    """The input chain's rules, as the rendered file writes them."""
    chain = path.read_text().split("chain input {")[1].split("}")[0]
    lines = [line.strip() for line in chain.splitlines()]
    return [line for line in lines if line and not line.startswith(("#", "type filter"))]


def loaded_sets(path: Path) -> dict[str, set]:
    """Each named set's elements (without comments), as nft holds them after loading the file."""
    with netns.Netns() as namespace:
        namespace.nft("-f", str(path))
        document = json.loads(namespace.nft("-j", "list", "table", "inet", "kimi").stdout)
    sets = [item["set"] for item in document["nftables"] if "set" in item]
    return {s["name"]: {e["elem"]["val"] if isinstance(e, dict) else e for e in s.get("elem", [])} for s in sets}


def tried(rules: Path, node: str, expected: dict[str, dict[int, str]]) -> dict[str, dict[int, str]]:
    """Each source's outcome ('accepted', 'refused', 'timeout') on each port of node's cluster address once node's
    rules are loaded there, for the sources and ports of `expected`; asserts that every refusal came at once and
    that the node still reaches its own API on its cluster address (through the loopback)."""
    target = ADDRESSES[node]
    ports = sorted({API, *GROUP_PORTS, UNMANAGED})
    with netns.Netns() as server, netns.Netns() as clients:
        netns.link(server, clients, [target], list(expected))
        listener = server.listen("0.0.0.0", ports)
        try:
            # Without the table every source gets through: the refusals are the table's.
            assert {clients.connect(source, target, API)[0] for source in expected} == {"accepted"}
            server.nft("-f", str(rules))
            seen = {
                source: {port: clients.connect(source, target, port) for port in by_port}
                for source, by_port in expected.items()
            }
            # Refused with a reset, not dropped: the client knows at once.
            assert max(seconds for by in seen.values() for _, seconds in by.values()) < 1, seen
            assert server.connect(target, target, API)[0] == "accepted"
        finally:
            listener.kill()
            listener.wait()
    return {source: {port: outcome for port, (outcome, _) in by.items()} for source, by in seen.items()}


def test_every_node_admits_the_router_the_first_replicas_rank_0_and_its_own_replica_to_the_api(rendered):
    assert sorted(p.name for p in rendered.iterdir()) == [f"{host}.nft" for host in ADDRESSES]
    for host, address in ADDRESSES.items():
        sets = file_sets(rendered / f"{host}.nft")
        replica = {ADDRESSES[member] for member in next(m for m in REPLICAS.values() if host in m)}
        assert sets["api_clients"] == {ROUTER, ADDRESSES["node1"]} | replica, host
        assert sets["group_peers"] == replica, host
        assert address in sets["group_peers"]
        assert sets["api_ports"] == {API}
        assert sets["group_ports"] == set(GROUP_PORTS)
        assert API_FROM_CLIENTS in input_rules(rendered / f"{host}.nft")


def test_the_file_names_each_address_and_port(rendered):
    text = (rendered / "node1.nft").read_text()
    assert '10.99.0.5 comment "router1"' in text and '10.99.0.11 comment "node1"' in text
    assert '13345 comment "vLLM data-parallel RPC port",' in text
    assert input_rules(rendered / "node1.nft") == [
        'iif "lo" accept',
        "ct state established,related accept",
        API_FROM_CLIENTS,
        "tcp dport @api_ports reject with tcp reset",
        "tcp dport @group_ports ip saddr @group_peers accept",
        "tcp dport @group_ports reject with tcp reset",
    ]
    assert "type filter hook input priority filter; policy accept;" in text
    assert "flush ruleset" not in text


def test_node1s_file_is_the_one_nfts_listings_were_recorded_from(rendered):
    """tests/unit/plugins/module_utils/test_kimi_nftables.py and tests/local/test_kimi_nftables_module.py use
    the recorded file: when the role's rules change, copy node1.nft there and run tests/fixtures/firewall/record.py."""
    assert (rendered / "node1.nft").read_text() == RECORDED.read_text()


@needs_netns
def test_nft_holds_the_sets_the_file_writes(rendered, rendered_without_router):
    for path in [*rendered.iterdir(), *rendered_without_router.iterdir()]:
        assert loaded_sets(path) == file_sets(path), path.name


@needs_netns
def test_real_connections_are_admitted_or_refused_at_once(rendered):
    node2, node3, node4 = ADDRESSES["node2"], ADDRESSES["node3"], ADDRESSES["node4"]
    expected = {
        ROUTER: {API: "accepted", MASTER: "refused"},
        # node1's replica peer: its watchdog asks rank 0's /health.
        node2: {API: "accepted", **dict.fromkeys(GROUP_PORTS, "accepted")},
        node3: {API: "refused", MASTER: "refused", DP_RPC: "refused"},
        node4: {API: "refused", **dict.fromkeys(GROUP_PORTS, "refused")},
        LAB_HOST: {API: "refused", MASTER: "refused", RAY_DASHBOARD: "refused", UNMANAGED: "accepted"},
    }
    assert tried(rendered / "node1.nft", "node1", expected) == expected


@needs_netns
def test_the_monitoring_host_reaches_the_other_replicas_api_and_none_of_its_ports(rendered):
    node1, node2, node4 = ADDRESSES["node1"], ADDRESSES["node2"], ADDRESSES["node4"]
    expected = {
        ROUTER: {API: "accepted", MASTER: "refused"},
        # The monitoring host (the first replica's rank 0): Prometheus scrapes every replica's API.
        node1: {API: "accepted", **dict.fromkeys(GROUP_PORTS, "refused")},
        node2: {API: "refused", MASTER: "refused", RAY_GCS: "refused"},
        node4: {API: "accepted", **dict.fromkeys(GROUP_PORTS, "accepted")},
        LAB_HOST: {API: "refused", DP_RPC: "refused", UNMANAGED: "accepted"},
    }
    assert tried(rendered / "node3.nft", "node3", expected) == expected


@needs_netns
def test_loading_replaces_an_older_table_and_leaves_other_tables_alone(rendered, tmp_path):
    older = "table inet kimi {\n\tchain old {\n\t\ttype filter hook input priority 10; policy drop;\n\t}\n}\n"
    operator = "table ip filter {\n\tchain input {\n\t\ttype filter hook input priority 0; policy accept;\n"
    operator += "\t\ttcp dport 2222 drop\n\t}\n}\n"
    (tmp_path / "setup.nft").write_text(older + operator)
    with netns.Netns() as namespace:
        namespace.nft("-f", str(tmp_path / "setup.nft"))
        before = namespace.nft("list", "table", "ip", "filter").stdout
        namespace.nft("-f", str(rendered / "node1.nft"))
        namespace.nft("-f", str(rendered / "node1.nft"))  # twice: the same table, once
        chains = namespace.nft("list", "chains", "inet").stdout
        assert "chain input" in chains and "chain old" not in chains
        assert namespace.nft("list", "table", "ip", "filter").stdout == before


def test_without_a_router_every_nodes_api_is_open_and_its_replica_ports_are_not(rendered_without_router):
    assert sorted(p.name for p in rendered_without_router.iterdir()) == [f"{host}.nft" for host in ADDRESSES]
    for host in ADDRESSES:
        path = rendered_without_router / f"{host}.nft"
        rules = input_rules(path)
        assert API_OPEN in rules and API_FROM_CLIENTS not in rules, host
        assert "tcp dport @api_ports reject with tcp reset" not in rules, host
        assert rules[-2:] == [
            "tcp dport @group_ports ip saddr @group_peers accept",
            "tcp dport @group_ports reject with tcp reset",
        ], host
        replica = {ADDRESSES[member] for member in next(m for m in REPLICAS.values() if host in m)}
        assert file_sets(path)["group_peers"] == replica, host
        assert ROUTER not in path.read_text()


@needs_netns
def test_without_a_router_any_source_reaches_the_api_and_strangers_still_not_the_replica_ports(
    rendered_without_router,
):
    node2, node3 = ADDRESSES["node2"], ADDRESSES["node3"]
    stranger = "10.99.0.77"  # named nowhere in the inventory
    expected = {
        stranger: {API: "accepted", MASTER: "refused", DP_RPC: "refused", UNMANAGED: "accepted"},
        LAB_HOST: {API: "accepted", RAY_GCS: "refused", RAY_DASHBOARD: "refused"},
        node3: {API: "accepted", **dict.fromkeys(GROUP_PORTS, "refused")},
        node2: {API: "accepted", **dict.fromkeys(GROUP_PORTS, "accepted")},
    }
    assert tried(rendered_without_router / "node1.nft", "node1", expected) == expected


def test_a_kimi_monitoring_group_replaces_the_rank_0_fallback(tmp_path):
    outcome, out = render(tmp_path, monitoring=["node4"])
    assert outcome.rc == 0, outcome.failure_messages()
    node = {host: file_sets(out / f"{host}.nft")["api_clients"] for host in ADDRESSES}
    # node1 is node2's replica peer, no longer the monitoring host: replica b's nodes do not admit it.
    assert node["node2"] == {ROUTER, ADDRESSES["node4"], ADDRESSES["node1"], ADDRESSES["node2"]}
    assert node["node3"] == node["node4"] == {ROUTER, ADDRESSES["node3"], ADDRESSES["node4"]}
    assert '10.99.0.14 comment "node4"' in (out / "node2.nft").read_text()


def test_the_api_can_be_closed_without_a_router(tmp_path):
    """firewall_api_open false without a router: only the monitoring host and the replica's own nodes reach the
    API (with firewall_monitoring_hosts empty, the replica's nodes alone)."""
    outcome, out = render(
        tmp_path, router=None, extravars={"firewall_api_open": False, "firewall_monitoring_hosts": []}
    )
    assert outcome.rc == 0, outcome.failure_messages()
    for host in ADDRESSES:
        replica = {ADDRESSES[member] for member in next(m for m in REPLICAS.values() if host in m)}
        assert file_sets(out / f"{host}.nft")["api_clients"] == replica, host
        rules = input_rules(out / f"{host}.nft")
        assert API_FROM_CLIENTS in rules and API_OPEN not in rules, host


@pytest.mark.parametrize(
    ("router", "message"),
    [
        ({}, "router1 has no kimi_cluster_address (the kimi role sets it on every host of the play"),
        ({"kimi_cluster_address": ""}, "router1 has no kimi_cluster_address"),
        ({"kimi_cluster_address": "10.99.0.300"}, "router1's kimi_cluster_address 10.99.0.300 is not an IPv4 address"),
        ({"kimi_cluster_address": "fd00::5"}, "router1's kimi_cluster_address fd00::5 is not an IPv4 address"),
    ],
)
def test_a_host_without_a_cluster_ipv4_address_fails_before_anything_is_rendered(tmp_path, router, message):
    outcome, out = render(tmp_path, router=router)
    assert outcome.rc != 0
    failures = outcome.failures
    assert {f["host"] for f in failures} == set(ADDRESSES)
    assert {f["task"] for f in failures} == {
        "Refuse a host the rules name without a cluster IPv4 address (before anything changes)"
    }
    assert all(message in f["msg"] for f in failures), failures[0]["msg"]
    assert list(out.iterdir()) == []
