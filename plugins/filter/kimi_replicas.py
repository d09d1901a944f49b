"""`kimi.k2.replica_*` filters: the serving replicas an inventory describes (plugins/module_utils/kimi_replicas.py).

Per-replica playbooks take their ``hosts`` and ``serial`` from them, so that each batch of the play is one
replica (``groups`` is the only inventory data a play header can read):

    hosts: "{{ groups | kimi.k2.replica_play_pattern }}"
    serial: "{{ groups | kimi.k2.replica_play_batches(query('inventory_hostnames', ansible_limit | default('all'))) }}"
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ansible_collections.kimi.k2.plugins.module_utils import kimi_replicas


def replica_play_pattern(groups: Mapping[str, Sequence[str]]) -> str:
    """`groups | kimi.k2.replica_play_pattern`: the replica groups joined by commas, else ``kimi_nodes``."""
    return kimi_replicas.play_pattern(groups)


def replica_play_batches(groups: Mapping[str, Sequence[str]], selected: Iterable[str] | None = None) -> list[Any]:
    """`groups | kimi.k2.replica_play_batches(hosts)`: one ``serial`` batch per replica (hosts --limit kept)."""
    return kimi_replicas.play_batches(groups, selected)


def replicas(groups: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """`groups | kimi.k2.replicas`: {replica name: hosts in inventory order} (``default``: every node)."""
    return kimi_replicas.replicas(groups)


def replica_of(groups: Mapping[str, Sequence[str]], host: str) -> str:
    """`groups | kimi.k2.replica_of(inventory_hostname)`: the host's replica name, '' when it is in none."""
    return kimi_replicas.replica_of(groups, host) or ""


def replica_problems(groups: Mapping[str, Sequence[str]]) -> list[str]:
    """`groups | kimi.k2.replica_problems`: what is wrong with the replica groups, [] when nothing."""
    return kimi_replicas.problems(groups)


def router_input_facts(host_vars: Mapping[str, Any], nodes: Sequence[str]) -> dict[str, Any]:
    """`hostvars[router] | kimi.k2.router_input_facts(groups.kimi_nodes)`: what the input check needs of a router
    host, without its secrets: whether it is also a serving node and whether its certificate and key are set."""
    host = str(host_vars.get("inventory_hostname", ""))
    return {
        "host": host,
        "serving_node": host in nodes,
        "router_tls_certificate": bool(str(host_vars.get("router_tls_certificate") or "").strip()),
        "router_tls_key": bool(str(host_vars.get("router_tls_key") or "").strip()),
    }


def router_url(host_vars: Mapping[str, Any], port: Any) -> str:
    """`hostvars[router] | kimi.k2.router_url(kimi_router_port)`: the router's HTTPS root, at its cluster address
    when this run set it (the kimi role), else its ansible_host, else its inventory name."""
    address = str(
        host_vars.get("kimi_cluster_address")
        or host_vars.get("ansible_host")
        or host_vars.get("inventory_hostname", "")
    )
    host = f"[{address}]" if ":" in address else address
    return f"https://{host}:{int(port)}"


class FilterModule:
    """Ansible's entry point for the filters of this file."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        return {
            "replica_play_pattern": replica_play_pattern,
            "replica_play_batches": replica_play_batches,
            "replicas": replicas,
            "replica_of": replica_of,
            "replica_problems": replica_problems,
            "router_input_facts": router_input_facts,
            "router_url": router_url,
        }
