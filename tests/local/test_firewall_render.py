"""The firewall role's table inet kimi, rendered by Ansible through the role's own checks and defaults
(tests/fixtures/firewall/render.yml, with the kimi role's kimi_router_hosts and kimi_monitoring_hosts read from
roles/kimi/vars/main.yml) for every node of a two-replica inventory, then loaded into throwaway network
namespaces (tests/netns.py; this host's ruleset is never touched) and tried with real TCP connections over a veth
pair. Default deny:

* a node's replica peers reach every port, the ones vLLM, NCCL and Ray pick at random included;
* kimi_admin_networks (the lab host here) reach SSH, and Prometheus and Alertmanager on the monitoring host (the
  first replica's rank 0 without a kimi_monitoring group) only;
* the API port admits the router and the monitoring host; the exporters the monitoring host only;
* without a router the API is closed to everyone else unless kimi_api_public, and then open to any source;
* a node that is also the router opens the router's port to everyone;
* anyone else is refused with a TCP reset (ECONNREFUSED at once, not a timeout) on every port;
* loading the file replaces an older table inet kimi and leaves the host's other tables as they were;
* node1's file is the one tests/fixtures/firewall/nft records nft's listings of;
* a host the rules name without a cluster IPv4 address, and rules that would shut the controller out of SSH,
  fail the play on every node, naming the host and the variable, before any file is rendered.
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
ROUTER, LAB_HOST, STRANGER = "10.99.0.5", "10.99.0.1", "10.99.0.77"
ROUTER1 = {"kimi_cluster_address": ROUTER}
REPLICAS = {"a": ["node1", "node2"], "b": ["node3", "node4"]}
SSH, API, MASTER, DP_RPC, RAY_GCS, RAY_DASHBOARD = 22, 8000, 29501, 13345, 6379, 8265
NODE_EXPORTER, DCGM, PROMETHEUS, ALERTMANAGER, ROUTER_PORT = 9100, 9400, 9090, 9093, 443
# A port vLLM's engine core or a worker's message queue picks at random at each start.
RANDOM = 41234
GROUP_PORTS = [MASTER, DP_RPC, RAY_GCS, RAY_DASHBOARD, RANDOM]
MIRROR_PORT = 8081
# kimi_checkpoint_peer_port: closed to every node outside the replica unless the checkpoint phase fills the set.
CHECKPOINT_PEER = 29700
ALL_PORTS = sorted(
    {SSH, API, *GROUP_PORTS, NODE_EXPORTER, DCGM, PROMETHEUS, ALERTMANAGER, ROUTER_PORT, MIRROR_PORT, CHECKPOINT_PEER}
)
# The lab host is the admin network; the controller (this test, over a local connection) has no SSH address.
RENDER_VARS = {"kimi_admin_networks": [f"{LAB_HOST}/32"], "firewall_controller_address": ""}
API_FROM_CLIENTS = "tcp dport @api_ports ip saddr @api_clients accept"
API_OPEN = "tcp dport @api_ports accept"

UNAVAILABLE = netns.unavailable()
needs_netns = pytest.mark.skipif(UNAVAILABLE is not None, reason=str(UNAVAILABLE))


def inventory(directory: Path, *, router: dict | None = ROUTER1, monitoring: list[str] | None = None,
              router_host: str = "router1", mirror: str | None = None) -> Path:  # fmt: skip
    """Two replicas of two nodes, router_host in a kimi_router group (none when router is None) with these host
    vars (a node as the router keeps its own), and the facts the kimi role sets (its contract with the roles)."""
    nodes = {
        host: {"kimi_cluster_address": address, "kimi_replica_name": name, "kimi_replica_hosts": members}
        for name, members in REPLICAS.items()
        for host, address in ADDRESSES.items()
        if host in members
    }
    children = {"kimi_nodes": {"hosts": nodes}}
    if router is not None:
        children["kimi_router"] = {"hosts": {router_host: None if router_host in nodes else router}}
    if monitoring is not None:
        children["kimi_monitoring"] = {"hosts": dict.fromkeys(monitoring)}
    if mirror is not None:
        children["kimi_offline_mirror"] = {"hosts": {mirror: None}}
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, "kimi_replicas": REPLICAS}
    path = directory / "hosts.yml"
    path.write_text(yaml.safe_dump({"all": {"vars": local, "children": children}}))
    return path


def render(directory: Path, extravars: dict | None = None, **kwargs):
    out = directory / "rendered"
    out.mkdir(parents=True)
    extravars = {"firewall_render_dir": str(out), **RENDER_VARS, **(extravars or {})}
    outcome = run_playbook(RENDER, inventory(directory, **kwargs), extravars=extravars)
    return outcome, out


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    outcome, out = render(tmp_path_factory.mktemp("firewall"))
    assert outcome.rc == 0, outcome.failure_messages()
    return out


@pytest.fixture(scope="module")
def rendered_public(tmp_path_factory) -> Path:
    """No router, and the inventory says the API is public."""
    outcome, out = render(
        tmp_path_factory.mktemp("firewall-public"), router=None, extravars={"kimi_api_public": "true"}
    )
    assert outcome.rc == 0, outcome.failure_messages()
    return out


def file_sets(path: Path) -> dict[str, set]:
    """Each named set's elements (addresses, networks and ports, without comments), as the rendered file writes
    them."""
    sets = re.findall(r"^\tset (\w+) \{\n(.*?)^\t\}", path.read_text(), re.MULTILINE | re.DOTALL)
    return {
        name: {int(e) if e.isdigit() else e for e in re.findall(r"^\t\t\t([0-9a-f.:/]+)", block, re.MULTILINE)}
        for name, block in sets
    }


def input_rules(path: Path) -> list[str]:
    """The input chain's rules, as the rendered file writes them."""
    chain = path.read_text().split("chain input {")[1].split("\n\t}")[0]
    lines = [line.strip() for line in chain.splitlines()]
    return [line for line in lines if line and not line.startswith(("#", "type filter"))]


def loaded_sets(path: Path) -> dict[str, set]:
    """Each named set's elements (without comments), as nft holds them after loading the file."""
    with netns.Netns() as namespace:
        namespace.nft("-f", str(path))
        document = json.loads(namespace.nft("-j", "list", "table", "inet", "kimi").stdout)
    sets = [item["set"] for item in document["nftables"] if "set" in item]
    found = {}
    for entry in sets:
        elements = set()
        for element in entry.get("elem", []):
            value = element["elem"]["val"] if isinstance(element, dict) and "elem" in element else element
            if isinstance(value, dict) and "prefix" in value:
                value = f"{value['prefix']['addr']}/{value['prefix']['len']}"
            elements.add(value)
        found[entry["name"]] = elements
    return found


def tried(rules: Path, node: str, expected: dict[str, dict[int, str]]) -> dict[str, dict[int, str]]:
    """Each source's outcome ('accepted', 'refused', 'timeout') on each port of node's cluster address once node's
    rules are loaded there, for the sources and ports of `expected`; asserts that every refusal came at once and
    that the node still reaches its own API on its cluster address (through the loopback)."""
    target = ADDRESSES[node]
    with netns.Netns() as server, netns.Netns() as clients:
        netns.link(server, clients, [target], list(expected))
        listener = server.listen("0.0.0.0", ALL_PORTS)
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


def every_port(outcome: str, **but: str) -> dict[int, str]:
    """Every port of ALL_PORTS with `outcome`, except those named (by their constant's name) with theirs."""
    named = {globals()[name.upper()]: value for name, value in but.items()}
    return {port: named.get(port, outcome) for port in ALL_PORTS}


def test_every_node_admits_the_router_and_the_monitoring_host_to_the_api_and_its_replica_to_all(rendered):
    assert sorted(p.name for p in rendered.iterdir()) == [f"{host}.nft" for host in ADDRESSES]
    for host in ADDRESSES:
        sets = file_sets(rendered / f"{host}.nft")
        replica = {ADDRESSES[member] for member in next(m for m in REPLICAS.values() if host in m)}
        assert sets["api_clients"] == {ROUTER, ADDRESSES["node1"]}, host
        assert sets["monitoring_hosts"] == {ADDRESSES["node1"]}, host
        assert sets["replica_peers"] == replica, host
        assert sets["admin_networks"] == {LAB_HOST} and sets["admin_networks6"] == set(), host
        assert (sets["ssh_ports"], sets["api_ports"], sets["exporter_ports"]) == ({SSH}, {API}, {NODE_EXPORTER, DCGM})
        # Only the monitoring host (node1) opens Prometheus and Alertmanager; no node is the router.
        assert ("monitoring_ports" in sets) == (host == "node1"), host
        assert "router_ports" not in sets and "mirror_ports" not in sets
        assert API_FROM_CLIENTS in input_rules(rendered / f"{host}.nft")


def test_the_chain_denies_by_default_and_names_each_address_and_port(rendered):
    text = (rendered / "node1.nft").read_text()
    assert '10.99.0.5 comment "router1"' in text and '10.99.0.11 comment "node1"' in text
    assert '9100 comment "node-exporter",' in text and '9093 comment "Alertmanager"' in text
    assert input_rules(rendered / "node1.nft") == [
        'iif "lo" accept',
        "ct state established,related accept",
        "ct state invalid drop",
        "meta l4proto { icmp, icmpv6 } accept",
        "udp sport 67 udp dport 68 accept",
        "udp sport 547 udp dport 546 accept",
        "ip saddr @replica_peers accept",
        "tcp dport @ssh_ports ip saddr @admin_networks accept",
        "tcp dport @ssh_ports ip6 saddr @admin_networks6 accept",
        API_FROM_CLIENTS,
        "tcp dport @exporter_ports ip saddr @monitoring_hosts accept",
        "tcp dport @monitoring_ports ip saddr @admin_networks accept",
        "tcp dport @monitoring_ports ip6 saddr @admin_networks6 accept",
        "tcp dport @checkpoint_peer_ports ip saddr @checkpoint_peers accept",
        "meta l4proto tcp reject with tcp reset",
    ]
    assert "type filter hook input priority filter; policy drop;" in text
    assert "flush ruleset" not in text


def test_node1s_file_is_the_one_nfts_listings_were_recorded_from(rendered):
    """tests/unit/plugins/module_utils/test_kimi_nftables.py and tests/local/test_kimi_nftables_module.py use
    the recorded file: when the role's rules change, copy node1.nft there and run tests/fixtures/firewall/record.py."""
    assert (rendered / "node1.nft").read_text() == RECORDED.read_text()


@needs_netns
def test_nft_holds_the_sets_the_file_writes(rendered, rendered_public):
    for path in [*rendered.iterdir(), *rendered_public.iterdir()]:
        assert loaded_sets(path) == file_sets(path), path.name


@needs_netns
def test_real_connections_to_the_monitoring_host_are_admitted_or_refused_at_once(rendered):
    node2, node3 = ADDRESSES["node2"], ADDRESSES["node3"]
    expected = {
        ROUTER: every_port("refused", api="accepted"),
        # node1's replica peer: every port, the random ones included.
        node2: every_port("accepted"),
        node3: every_port("refused"),
        LAB_HOST: every_port("refused", ssh="accepted", prometheus="accepted", alertmanager="accepted"),
        STRANGER: every_port("refused"),
    }
    assert tried(rendered / "node1.nft", "node1", expected) == expected


@needs_netns
def test_the_monitoring_host_reaches_the_api_and_exporters_of_the_other_replica_and_nothing_else(rendered):
    node1, node2, node4 = ADDRESSES["node1"], ADDRESSES["node2"], ADDRESSES["node4"]
    expected = {
        ROUTER: every_port("refused", api="accepted"),
        node1: every_port("refused", api="accepted", node_exporter="accepted", dcgm="accepted"),
        node2: every_port("refused"),
        node4: every_port("accepted"),
        # node3 runs no Prometheus: the admin network reaches its SSH only.
        LAB_HOST: every_port("refused", ssh="accepted"),
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


@needs_netns
def test_without_a_router_and_with_kimi_api_public_any_source_reaches_the_api_and_nothing_else(rendered_public):
    assert sorted(p.name for p in rendered_public.iterdir()) == [f"{host}.nft" for host in ADDRESSES]
    rules = input_rules(rendered_public / "node3.nft")
    assert API_OPEN in rules and API_FROM_CLIENTS not in rules
    assert ROUTER not in (rendered_public / "node3.nft").read_text()
    expected = {
        STRANGER: every_port("refused", api="accepted"),
        LAB_HOST: every_port("refused", api="accepted", ssh="accepted"),
        ADDRESSES["node1"]: every_port("refused", api="accepted", node_exporter="accepted", dcgm="accepted"),
        ADDRESSES["node4"]: every_port("accepted"),
    }
    assert tried(rendered_public / "node3.nft", "node3", expected) == expected


def test_without_a_router_the_api_stays_closed_unless_the_inventory_says_it_is_public(tmp_path):
    outcome, out = render(tmp_path, router=None)
    assert outcome.rc == 0, outcome.failure_messages()
    for host in ADDRESSES:
        assert file_sets(out / f"{host}.nft")["api_clients"] == {ADDRESSES["node1"]}, host
        rules = input_rules(out / f"{host}.nft")
        assert API_FROM_CLIENTS in rules and API_OPEN not in rules, host


def test_a_kimi_monitoring_group_replaces_the_rank_0_fallback(tmp_path):
    outcome, out = render(tmp_path, monitoring=["node4"])
    assert outcome.rc == 0, outcome.failure_messages()
    node = {host: file_sets(out / f"{host}.nft") for host in ADDRESSES}
    assert all(node[host]["api_clients"] == {ROUTER, ADDRESSES["node4"]} for host in ADDRESSES)
    assert all(node[host]["monitoring_hosts"] == {ADDRESSES["node4"]} for host in ADDRESSES)
    assert [host for host in ADDRESSES if "monitoring_ports" in node[host]] == ["node4"]


@needs_netns
def test_a_node_that_is_also_the_router_opens_its_port_to_everyone(tmp_path):
    outcome, out = render(tmp_path, router_host="node1")
    assert outcome.rc == 0, outcome.failure_messages()
    assert file_sets(out / "node1.nft")["router_ports"] == {ROUTER_PORT}
    assert "router_ports" not in file_sets(out / "node2.nft")
    expected = {
        STRANGER: every_port("refused", router_port="accepted"),
        ADDRESSES["node3"]: every_port("refused", router_port="accepted"),
    }
    assert tried(out / "node1.nft", "node1", expected) == expected


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


def test_rules_that_would_shut_the_controller_out_fail_every_node_before_anything_is_rendered(tmp_path):
    outcome, out = render(tmp_path, extravars={"firewall_controller_address": "192.0.2.50"})
    assert outcome.rc != 0
    assert {f["host"] for f in outcome.failures} == set(ADDRESSES)
    message = outcome.failures[0]["msg"]
    assert "The firewall would shut this run's controller out of node" in message
    assert "it connects from 192.0.2.50" in message and 'kimi_admin_networks: ["192.0.2.50/32"]' in message
    assert list(out.iterdir()) == []
    # The controller inside an admin network, or a node of the replica (Ansible run from rank 0), is fine.
    for controller, networks in (("192.0.2.50", ["192.0.2.0/24"]), (ADDRESSES["node1"], [])):
        ok, _ = render(tmp_path / controller, extravars={"firewall_controller_address": controller,
                                                          "kimi_admin_networks": networks})  # fmt: skip
        failed = {f["host"] for f in ok.failures}
        assert failed == ({"node3", "node4"} if controller == ADDRESSES["node1"] else set()), ok.failure_messages()


@needs_netns
def test_the_mirrors_node_opens_its_port_to_the_nodes_the_router_and_the_controller_only(tmp_path):
    outcome, out = render(tmp_path, mirror="node3")
    assert outcome.rc == 0, outcome.failure_messages()
    assert file_sets(out / "node3.nft")["mirror_ports"] == {MIRROR_PORT}
    assert file_sets(out / "node3.nft")["mirror_clients"] == {*ADDRESSES.values(), ROUTER}
    assert "mirror_ports" not in file_sets(out / "node1.nft")
    expected = {
        ADDRESSES["node1"]: {MIRROR_PORT: "accepted", SSH: "refused"},
        ROUTER: {MIRROR_PORT: "accepted", SSH: "refused"},
        # The controller reads the served manifest before anything is installed (playbooks/offline_mirror.yml).
        LAB_HOST: {MIRROR_PORT: "accepted", SSH: "accepted"},
        STRANGER: {MIRROR_PORT: "refused", SSH: "refused"},
    }
    assert tried(out / "node3.nft", "node3", expected) == expected


@needs_netns
def test_the_checkpoint_peer_port_opens_to_the_nodes_the_checkpoint_phase_adds_and_to_them_only(rendered, tmp_path):
    """The checkpoint role adds the play's nodes to the empty checkpoint_peers set while it spreads the checkpoint
    (roles/checkpoint/tasks/peer_firewall.yml): node3, of the other replica, then reaches node1's peer port and no
    other; a stranger still reaches nothing."""
    node2, node3 = ADDRESSES["node2"], ADDRESSES["node3"]
    during_the_phase = tmp_path / "node1-spreading.nft"
    during_the_phase.write_text(
        (rendered / "node1.nft").read_text() + f"add element inet kimi checkpoint_peers {{ {node2}, {node3} }}\n"
    )
    expected = {
        node2: every_port("accepted"),
        node3: every_port("refused", checkpoint_peer="accepted"),
        STRANGER: every_port("refused"),
    }
    assert tried(during_the_phase, "node1", expected) == expected
