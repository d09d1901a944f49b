"""Serving replicas: independent vLLM groups described by the inventory, one Ansible group each.

A replica is an inventory group named ``kimi_replica_<name>`` whose hosts are serving nodes (``kimi_nodes``);
each is its own multi-node vLLM group with its own layout (group_vars of that group). An inventory without such
groups has one replica, ``default``, made of every node, so one-group inventories keep working unchanged.

Why a naming convention and not a variable: the per-replica phases (preflight, serve, verify, rolling) take
their host pattern and their ``serial`` batches from these groups, and Ansible templates a play's ``hosts`` and
``serial`` before any inventory variable exists; only the ``groups`` magic variable is there. Batching the play by
replica is what makes every ``run_once`` in the roles once *per replica* and lets a failed replica stop the run
while the replicas already converged keep serving.

Stdlib only; plugins/filter/kimi_replicas.py and the kimi role's checks use it, the unit tests import it directly.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

REPLICA_PREFIX = "kimi_replica_"
NODES_GROUP = "kimi_nodes"
DEFAULT_REPLICA = "default"


def replica_groups(groups: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """{group name: hosts in inventory order} of the replica groups, sorted by name; {} when there are none."""
    return {name: list(groups[name]) for name in sorted(groups) if name.startswith(REPLICA_PREFIX)}


def replica_name(group: str) -> str:
    """The replica's short name: ``kimi_replica_a`` -> ``a``; the nodes group is the ``default`` replica."""
    return group[len(REPLICA_PREFIX) :] if group.startswith(REPLICA_PREFIX) else DEFAULT_REPLICA


def replicas(groups: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """{replica name: hosts in inventory order}; one ``default`` replica of every node without replica groups."""
    found = replica_groups(groups)
    if not found:
        return {DEFAULT_REPLICA: list(groups.get(NODES_GROUP, []))}
    return {replica_name(group): hosts for group, hosts in found.items()}


def replica_by_host(found: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """{host: replica name} from {replica name: hosts} (what `replicas` returns); a host the inventory names in
    two replicas keeps the first."""
    owner: dict[str, str] = {}
    for name, hosts in found.items():
        for host in hosts:
            owner.setdefault(host, name)
    return owner


def replica_of(groups: Mapping[str, Sequence[str]], host: str) -> str | None:
    """The replica ``host`` serves in (the first, when the inventory is wrong and names it twice)."""
    return replica_by_host(replicas(groups)).get(host)


def problems(groups: Mapping[str, Sequence[str]]) -> list[str]:
    """What is wrong with the replica groups, one sentence each naming the group and the host; [] when fine."""
    found = replica_groups(groups)
    if not found:
        return []
    nodes = list(groups.get(NODES_GROUP, []))
    messages: list[str] = []
    owner: dict[str, str] = {}
    for group, hosts in found.items():
        if not hosts:
            messages.append(f"inventory group {group} has no hosts: give it its nodes or remove it")
        for host in hosts:
            if host not in nodes:
                messages.append(
                    f"{host} is in replica group {group} but not in {NODES_GROUP}: a replica's hosts are serving "
                    f"nodes (make {group} a child group of {NODES_GROUP})"
                )
            if host in owner:
                messages.append(
                    f"{host} is in two replicas, {owner[host]} and {group}: a node serves in exactly one "
                    f"replica (remove it from one of the groups)"
                )
            else:
                owner[host] = group
    missing = [host for host in nodes if host not in owner]
    if missing:
        messages.append(
            f"{', '.join(missing)} in {NODES_GROUP} but in no {REPLICA_PREFIX}<name> group: with replica groups "
            f"({', '.join(found)}), every node belongs to one"
        )
    return messages


def play_pattern(groups: Mapping[str, Sequence[str]]) -> str:
    """The ``hosts`` of a per-replica play: the replica groups in order, else the nodes group."""
    found = replica_groups(groups)
    return ",".join(found) if found else NODES_GROUP


def play_batches(groups: Mapping[str, Sequence[str]], selected: Iterable[str] | None = None) -> list[int | str]:
    """The ``serial`` of a per-replica play: one batch per replica, counting only the hosts ``--limit`` kept.

    ``selected`` is the hosts the run may touch (``query('inventory_hostnames', ansible_limit)``); None: all.
    Without replica groups, one batch of everything (``100%``), exactly as a play without ``serial``.
    """
    found = replica_groups(groups)
    if not found:
        return ["100%"]
    kept = None if selected is None else set(selected)
    sizes = [len([h for h in hosts if kept is None or h in kept]) for hosts in found.values()]
    return [size for size in sizes if size > 0] or ["100%"]
