"""Download once per site: which node fetches the checkpoint from which peers, round by round.

The nodes that hold a verified copy already (their marker matches) serve it from the start. When none does, one
node, the seed, downloads it from the Hub or the offline mirror first (round 0). In round r every holder serves the
checkpoint over the cluster network and as many new nodes fetch it as there are holders: 1, 2, 4, ... so N nodes
hold it after ceil(log2 N) rounds, each round about as long as one node's fetch from one peer, where N pulls from
the Hub share the site's one link. Each new node lists every holder as a source, starting with "its own" (holder
index = its own index in the round modulo the holders), so each holder serves one new node at a time and the others
only when that one fails.

Pure: the checkpoint role asks the `kimi.k2.checkpoint_spread` filter for the plan and
`kimi.k2.checkpoint_peer_files` for each node's fetch list; files/kimi-checkpoint-fetch.py does the fetching.
Written by hand: no library plans a doubling tree over Ansible hosts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote


class PeerPlanError(ValueError):
    """An input the distribution cannot use; the message names the variable."""


@dataclass(frozen=True)
class Fetch:
    """One node's turn: the round it fetches in and its sources, its own first."""

    host: str
    round: int
    sources: tuple[str, ...]


def _shown(nodes: Sequence[str]) -> str:
    return ", ".join(nodes[:8]) + (", ..." if len(nodes) > 8 else "")


def seed_of(nodes: Sequence[str], seed: str) -> str:
    """The node that downloads from the Hub when no node holds the checkpoint: `seed` (checkpoint_seed_host) when
    set, else the first node; refused when it is not one of `nodes`."""
    if not nodes:
        raise PeerPlanError("no node fetches the checkpoint in this play")
    if not seed:
        return nodes[0]
    if seed not in nodes:
        raise PeerPlanError(
            f"checkpoint_seed_host is {seed!r}, which is not one of the nodes this play fetches the checkpoint on "
            f"({_shown(nodes)}): name one of them, or leave it empty for the first node of the first replica"
        )
    return seed


def holders_first(nodes: Sequence[str], holders: Sequence[str], seed: str) -> list[str]:
    """The nodes in the order they come to hold the checkpoint's first copy: the holders (inventory order), or the
    seed when there is none; then the rest in inventory order."""
    first = [node for node in nodes if node in holders] or [seed_of(nodes, seed)]
    return first + [node for node in nodes if node not in first]


def schedule(nodes: Sequence[str], holders: Sequence[str] = (), seed: str = "") -> list[Fetch]:
    """Every node that fetches from peers, with its round (1, 2, ...) and its sources. Without holders the seed is
    round 0 and is not listed: it fetches from the Hub or the mirror."""
    order = holders_first(nodes, holders, seed)
    have = max(1, sum(1 for node in nodes if node in holders))
    plan: list[Fetch] = []
    round_number = 1
    while have < len(order):
        new = order[have : 2 * have]
        for offset, host in enumerate(new):
            own = offset % have
            plan.append(Fetch(host, round_number, tuple(order[(own + k) % have] for k in range(have))))
        have += len(new)
        round_number += 1
    return plan


def plan(nodes: Sequence[str], holders: Sequence[str] = (), seed: str = "") -> dict[str, Any]:
    """The plan as the role reads it: `seed` (the node that downloads from the Hub, or None when some node holds the
    checkpoint), `rounds` (after the seed's download) and `fetch` ({host: {round, sources}})."""
    fetches = schedule(nodes, holders, seed)
    has_holder = any(node in holders for node in nodes)
    return {
        "seed": None if has_holder else seed_of(nodes, seed),
        "rounds": max((fetch.round for fetch in fetches), default=0),
        "fetch": {fetch.host: {"round": fetch.round, "sources": list(fetch.sources)} for fetch in fetches},
    }


def source_urls(sources: Sequence[str], addresses: Mapping[str, Any], port: int) -> list[str]:
    """Each source's root URL on the cluster network (its kimi_cluster_address and kimi_checkpoint_peer_port)."""
    urls = []
    for host in sources:
        address = str(addresses.get(host) or "").strip()
        if not address:
            raise PeerPlanError(f"{host}: kimi_cluster_address is empty; its peers cannot reach it")
        host_part = f"[{address}]" if ":" in address else address
        urls.append(f"http://{host_part}:{int(port)}/")
    return urls


def peer_files(files: Sequence[Mapping[str, Any]], roots: Sequence[str]) -> list[dict[str, Any]]:
    """The fetch program's list: each listed file (path, size, checksums) with one URL per source root, in the
    sources' order. The peers serve the checkpoint directory as it is on disk, so a file's URL is its path."""
    if not roots:
        raise PeerPlanError("a fetch from peers needs at least one source")
    listed = []
    for item in files:
        entry = {key: value for key, value in item.items() if key != "url"}
        entry["urls"] = [root + quote(str(item["path"])) for root in roots]
        listed.append(entry)
    return listed
