"""The firewall role reads every port from the kimi role (no number of its own, so a port an inventory moves moves
the unit's flag and the rule together), and admits the kimi role's router and monitoring hosts (the ones the
router and monitoring roles serve from); the API is open to everyone only where the inventory says it is public
and has no router."""

from __future__ import annotations

import re

import yaml

from tests.paths import REPO_ROOT

ROLES = REPO_ROOT / "roles"
FIREWALL_FILES = [ROLES / "firewall" / f for f in ("defaults/main.yml", "vars/main.yml", "templates/kimi.nft.j2")]


def defaults(role: str) -> dict:
    return yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text())


FIREWALL = defaults("firewall")
FIREWALL_VARS = yaml.safe_load((ROLES / "firewall" / "vars" / "main.yml").read_text())
KIMI = defaults("kimi")
KIMI_VARS = yaml.safe_load((ROLES / "kimi" / "vars" / "main.yml").read_text())


def test_the_firewall_writes_no_port_number_of_its_own():
    ports = {value for name, value in KIMI.items() if name.endswith("_port")}
    for path in FIREWALL_FILES:
        content = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
        written = {int(n) for n in re.findall(r"(?<![\w.:/-])(\d{2,5})(?![\w.:/-])", content)} & ports
        assert not written, f"{path.relative_to(REPO_ROOT)} writes {sorted(written)}: read the kimi_*_port instead"


def test_every_service_port_the_rules_name_is_a_kimi_port():
    template = (ROLES / "firewall" / "templates" / "kimi.nft.j2").read_text()
    named = set(re.findall(r"\bkimi_\w+_port\b", template + yaml.safe_dump(FIREWALL_VARS)))
    assert named == {
        "kimi_api_port",
        "kimi_router_port",
        "kimi_offline_mirror_port",
        "kimi_checkpoint_peer_port",
        "kimi_node_exporter_port",
        "kimi_dcgm_exporter_port",
        "kimi_prometheus_port",
        "kimi_alertmanager_port",
    }
    assert named <= KIMI.keys()


def test_the_api_clients_are_the_kimi_roles_routers_and_monitoring_hosts():
    # The same variables the monitoring and router roles run on (they read them directly too, with no copy of
    # their own): the firewall admits the hosts that really scrape and route.
    assert {"kimi_router_hosts", "kimi_monitoring_hosts", "kimi_admin_network_list"} <= KIMI_VARS.keys()
    assert (
        FIREWALL_VARS["firewall_api_client_hosts"]
        == "{{ (kimi_router_hosts + kimi_monitoring_hosts) | unique | list }}"
    )


def test_the_api_is_public_only_when_the_inventory_says_so_and_there_is_no_router():
    assert KIMI["kimi_api_public"] is False and KIMI["kimi_admin_networks"] == []
    assert FIREWALL_VARS["firewall_api_public"] == ("{{ kimi_api_public | bool and kimi_router_hosts | length == 0 }}")
