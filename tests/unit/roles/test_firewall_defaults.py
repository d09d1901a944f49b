"""The firewall role closes the ports the serving roles open: its defaults cannot read theirs (a role's defaults
exist only where the role runs), so the numbers it writes out must equal vllm_serve's and ray_cluster's, and the
ports it derives must derive from the same kimi variables theirs do. Likewise the hosts it admits to the API are
the kimi role's router and monitoring hosts (the ones the router and monitoring roles serve from) and the
replica's own nodes, and the API is open to every client exactly when there is no router."""

from __future__ import annotations

import yaml

from tests.paths import REPO_ROOT

ROLES = REPO_ROOT / "roles"


def defaults(role: str) -> dict:
    return yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text())


FIREWALL = defaults("firewall")
FIREWALL_VARS = yaml.safe_load((ROLES / "firewall" / "vars" / "main.yml").read_text())
KIMI_VARS = yaml.safe_load((ROLES / "kimi" / "vars" / "main.yml").read_text())
SERVE = defaults("vllm_serve")
RAY = defaults("ray_cluster")


def test_the_written_out_group_ports_equal_the_serving_roles_defaults():
    ports = {entry["what"]: entry["port"] for entry in FIREWALL["firewall_group_ports"]}
    assert ports["vLLM data-parallel RPC port"] == SERVE["vllm_serve_data_parallel_rpc_port"]
    assert ports["Ray GCS port"] == RAY["ray_cluster_port"]
    assert ports["Ray dashboard port"] == RAY["ray_cluster_dashboard_port"]


def test_the_derived_ports_follow_the_serving_role_then_the_kimi_default():
    assert SERVE["vllm_serve_master_port"] == "{{ kimi_master_port }}"
    assert SERVE["vllm_serve_api_port"] == "{{ kimi_api_port }}"
    master = FIREWALL["firewall_group_ports"][0]
    assert master == {
        "port": "{{ vllm_serve_master_port | default(kimi_master_port) }}",
        "what": "multi-node master port",
    }
    assert FIREWALL["firewall_api_port"] == "{{ vllm_serve_api_port | default(kimi_api_port) }}"


def test_every_port_is_named_once():
    names = [entry["what"] for entry in FIREWALL["firewall_group_ports"]]
    assert len(names) == len(set(names)) == 4


def test_the_api_clients_are_the_kimi_roles_routers_and_monitoring_hosts_and_the_replicas_nodes():
    assert FIREWALL["firewall_router_hosts"] == "{{ kimi_router_hosts }}"
    assert FIREWALL["firewall_monitoring_hosts"] == "{{ kimi_monitoring_hosts }}"
    # The same variables the monitoring and router roles run on: the firewall admits the hosts that really scrape.
    assert defaults("monitoring")["monitoring_hosts"] == "{{ kimi_monitoring_hosts }}"
    assert defaults("router")["router_hosts"] == "{{ kimi_router_hosts }}"
    assert {"kimi_router_hosts", "kimi_monitoring_hosts"} <= KIMI_VARS.keys()
    clients = FIREWALL_VARS["firewall_api_client_hosts"]
    for hosts in ("firewall_router_hosts", "firewall_monitoring_hosts", "firewall_peer_hosts"):
        assert hosts in clients


def test_the_api_is_open_exactly_when_there_is_no_router():
    assert FIREWALL["firewall_api_open"] == "{{ firewall_router_hosts | length == 0 }}"
