"""Node ranks and the parallel layout, derived from the inventory and checked before anything runs.

The order of hosts in the ``kimi_nodes`` group is the node order; ``kimi_node_rank`` on a host overrides its
rank. vLLM's native multi-node launcher needs every rank 0..N-1 exactly once (``--node-rank``), and rank 0
serves the API and is the ``--master-addr``: a gap or a duplicate makes the group wait forever for a rank that
never comes, so both are refused here with the host and variable named. The layout's rules (sizes, DCP, the GPU
count) are kimi_layout.py's, shared with the planner and the serve argv.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .kimi_layout import GPUS_PER_NODE, Layout, LayoutError, as_int, layout_from_values
from .kimi_layout import layout_problems as _layout_rules

RANK_VARIABLE = "kimi_node_rank"


class TopologyError(ValueError):
    """Inventory input that cannot describe a working cluster; the message names the variable and host."""


@dataclass
class Topology:
    """What the inventory resolves to: rank per host, the master, and the layout's fit to the nodes."""

    node_ranks: dict[str, int]
    hosts_by_rank: list[str]
    gpus_per_node: int
    layout: Layout
    problems: list[str] = field(default_factory=list)

    @property
    def master_host(self) -> str:
        return self.hosts_by_rank[0]

    def as_dict(self) -> dict[str, Any]:
        return {
            "node_ranks": dict(self.node_ranks),
            "hosts_by_rank": list(self.hosts_by_rank),
            "master_host": self.master_host,
            "node_count": len(self.hosts_by_rank),
            "gpus_per_node": self.gpus_per_node,
            "world_size": self.layout.world_size,
            "tensor_parallel_size": self.layout.tensor_parallel_size,
            "pipeline_parallel_size": self.layout.pipeline_parallel_size,
            "data_parallel_size": self.layout.data_parallel_size,
            "decode_context_parallel_size": self.layout.decode_context_parallel_size,
            "enable_expert_parallel": self.layout.enable_expert_parallel,
        }


def _as_int(value: Any, variable: str, host: str | None = None) -> int:
    """Accept ints and integer strings (inventory INI gives strings); refuse bools, floats and words."""
    try:
        return as_int(value, variable, host)
    except LayoutError as error:
        raise TopologyError(str(error)) from None


def resolve_node_ranks(hosts: list[str], overrides: dict[str, Any]) -> dict[str, int]:
    """Rank per host: inventory order unless ``kimi_node_rank`` overrides it; unique and contiguous 0..N-1."""
    if not hosts:
        raise TopologyError("the group kimi_nodes is empty: the inventory must list at least one node")
    duplicates = sorted({h for h in hosts if hosts.count(h) > 1})
    if duplicates:
        raise TopologyError(f"host(s) listed twice in kimi_nodes: {', '.join(duplicates)}")
    unknown = sorted(set(overrides) - set(hosts))
    if unknown:
        raise TopologyError(f"{RANK_VARIABLE} set for host(s) not in kimi_nodes: {', '.join(unknown)}")

    ranks = {
        host: _as_int(overrides[host], RANK_VARIABLE, host) if host in overrides else index
        for index, host in enumerate(hosts)
    }
    count = len(hosts)
    for host, rank in ranks.items():
        if not 0 <= rank < count:
            raise TopologyError(
                f"{RANK_VARIABLE}={rank} on host {host} is out of range: {count} node(s) take ranks 0..{count - 1}"
            )
    holders: dict[int, list[str]] = {}
    for host, rank in ranks.items():
        holders.setdefault(rank, []).append(host)
    clashes = {rank: names for rank, names in holders.items() if len(names) > 1}
    if clashes:
        detail = "; ".join(f"rank {rank}: {', '.join(names)}" for rank, names in sorted(clashes.items()))
        missing = sorted(set(range(count)) - set(holders))
        raise TopologyError(
            f"duplicate {RANK_VARIABLE} ({detail}); rank(s) {', '.join(map(str, missing))} have no host. "
            "Give each host a distinct rank, or drop the overrides to use inventory order"
        )
    return ranks


def build_layout(values: dict[str, Any], gpus_per_node: int | None = None) -> Layout:
    """Layout from the cluster-wide ``kimi_*`` variables, each a positive integer, DCP dividing TP
    (kimi_layout.py's rules; refused here, since the other checks would divide by them)."""
    try:
        layout = layout_from_values(values)
    except LayoutError as error:
        raise TopologyError(str(error)) from None
    problems = _layout_rules(layout, gpus_per_node=gpus_per_node)
    if problems:
        raise TopologyError("; ".join(map(str, problems)))
    return layout


def layout_problems(layout: Layout, node_count: int, gpus_per_node: int) -> list[str]:
    """Why this layout cannot run on these nodes (empty when it can): kimi_layout.py's rules."""
    return [str(problem) for problem in _layout_rules(layout, nodes=node_count, gpus_per_node=gpus_per_node)]


def resolve_topology(
    hosts: list[str], overrides: dict[str, Any], gpus_per_node: Any, layout_values: dict[str, Any]
) -> Topology:
    """Everything the inventory says about node order and layout, validated; problems listed, not raised."""
    per_node = _as_int(gpus_per_node, GPUS_PER_NODE)
    layout = build_layout(layout_values, per_node)
    ranks = resolve_node_ranks(hosts, overrides)
    by_rank = sorted(ranks, key=ranks.__getitem__)
    return Topology(
        node_ranks=ranks,
        hosts_by_rank=by_rank,
        gpus_per_node=per_node,
        layout=layout,
        problems=layout_problems(layout, len(hosts), per_node),
    )


# The kimi_topology module's options, read by the module and by its action plugin (which runs this logic in the
# controller's own process).
ARGUMENT_SPEC: dict[str, dict[str, Any]] = {
    "hosts": {"type": "list", "elements": "str", "required": True},
    # Free-form: inventory hostname to node rank.
    "rank_overrides": {"type": "dict", "default": {}},
    "gpus_per_node": {"type": "raw", "required": True},
    "tensor_parallel_size": {"type": "raw", "required": True},
    "pipeline_parallel_size": {"type": "raw", "default": 1},
    "data_parallel_size": {"type": "raw", "default": 1},
    "decode_context_parallel_size": {"type": "raw", "default": 1},
    "enable_expert_parallel": {"type": "bool", "default": False},
}
LAYOUT_OPTIONS = (
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "decode_context_parallel_size",
    "enable_expert_parallel",
)


def topology_answer(params: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The module's answer to validated options: its return values, and the message when the inventory is refused."""
    try:
        topology = resolve_topology(
            params["hosts"],
            params["rank_overrides"],
            params["gpus_per_node"],
            {name: params[name] for name in LAYOUT_OPTIONS},
        )
    except TopologyError as error:
        return {}, str(error)
    return topology.as_dict(), "; ".join(topology.problems) or None
