"""Node ranks and the parallel layout, derived from the inventory and checked before anything runs.

The order of hosts in the ``kimi_nodes`` group is the node order; ``kimi_node_rank`` on a host overrides its
rank. vLLM's native multi-node launcher needs every rank 0..N-1 exactly once (``--node-rank``), and rank 0
serves the API and is the ``--master-addr``: a gap or a duplicate makes the group wait forever for a rank that
never comes, so both are refused here with the host and variable named.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

RANK_VARIABLE = "kimi_node_rank"


class TopologyError(ValueError):
    """Inventory input that cannot describe a working cluster; the message names the variable and host."""


@dataclass(frozen=True)
class Layout:
    """The parallel layout of one deployment, as vLLM's flags name it."""

    tensor_parallel_size: int
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    decode_context_parallel_size: int = 1
    enable_expert_parallel: bool = False

    @property
    def world_size(self) -> int:
        """GPUs (ranks) the whole deployment occupies."""
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.data_parallel_size


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
    where = f" on host {host}" if host else ""
    if isinstance(value, bool):
        raise TopologyError(f"{variable}{where} must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    raise TopologyError(f"{variable}{where} must be an integer, got {value!r}")


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


def build_layout(values: dict[str, Any]) -> Layout:
    """Layout from the cluster-wide ``kimi_*`` variables, each a positive integer."""
    sizes = {}
    for name in (
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "data_parallel_size",
        "decode_context_parallel_size",
    ):
        variable = f"kimi_{name}"
        size = _as_int(values.get(name, 1), variable)
        if size < 1:
            raise TopologyError(f"{variable} must be at least 1, got {size}")
        sizes[name] = size
    expert_parallel = values.get("enable_expert_parallel", False)
    if not isinstance(expert_parallel, bool):
        raise TopologyError(f"kimi_enable_expert_parallel must be true or false, got {expert_parallel!r}")
    layout = Layout(enable_expert_parallel=expert_parallel, **sizes)
    if layout.tensor_parallel_size % layout.decode_context_parallel_size:
        raise TopologyError(
            f"kimi_decode_context_parallel_size={layout.decode_context_parallel_size} must divide "
            f"kimi_tensor_parallel_size={layout.tensor_parallel_size} "
            "(vLLM splits each TP group into DCP ranks)"
        )
    return layout


def layout_problems(layout: Layout, node_count: int, gpus_per_node: int) -> list[str]:
    """Why this layout cannot run on these nodes (empty when it can)."""
    total = node_count * gpus_per_node
    if layout.world_size != total:
        return [
            f"layout needs {layout.world_size} GPUs "
            f"(kimi_tensor_parallel_size {layout.tensor_parallel_size} x "
            f"kimi_pipeline_parallel_size {layout.pipeline_parallel_size} x kimi_data_parallel_size "
            f"{layout.data_parallel_size}) but kimi_nodes has {node_count} node(s) x kimi_gpus_per_node "
            f"{gpus_per_node} = {total}"
        ]
    return []


def resolve_topology(
    hosts: list[str], overrides: dict[str, Any], gpus_per_node: Any, layout_values: dict[str, Any]
) -> Topology:
    """Everything the inventory says about node order and layout, validated; problems listed, not raised."""
    per_node = _as_int(gpus_per_node, "kimi_gpus_per_node")
    if per_node < 1:
        raise TopologyError(f"kimi_gpus_per_node must be at least 1, got {per_node}")
    ranks = resolve_node_ranks(hosts, overrides)
    layout = build_layout(layout_values)
    by_rank = sorted(ranks, key=ranks.__getitem__)
    return Topology(
        node_ranks=ranks,
        hosts_by_rank=by_rank,
        gpus_per_node=per_node,
        layout=layout,
        problems=layout_problems(layout, len(hosts), per_node),
    )
