"""`kimi.k2.checkpoint_*` filters: the checkpoint's spread over the cluster network
(plugins/module_utils/kimi_checkpoint_peers.py). The checkpoint role reads them; a refusal is an Ansible error
that names the variable.

    checkpoint_peer_plan: "{{ ansible_play_hosts_all | kimi.k2.checkpoint_spread(holders, checkpoint_seed_host) }}"
    content: "{{ checkpoint_repo.files | kimi.k2.checkpoint_peer_files(roots) }}"
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.kimi.k2.plugins.module_utils import kimi_checkpoint_peers


def checkpoint_spread(nodes: Sequence[str], holders: Sequence[str], seed: str = "") -> dict[str, Any]:
    """`nodes | kimi.k2.checkpoint_spread(holders, seed)`: {seed, rounds, fetch: {host: {round, sources}}}."""
    try:
        return kimi_checkpoint_peers.plan(list(nodes), list(holders), str(seed or ""))
    except kimi_checkpoint_peers.PeerPlanError as error:
        raise AnsibleFilterError(str(error)) from None


def checkpoint_peer_urls(sources: Sequence[str], addresses: Mapping[str, Any], port: Any) -> list[str]:
    """`sources | kimi.k2.checkpoint_peer_urls(addresses, kimi_checkpoint_peer_port)`: each source's root URL."""
    try:
        return kimi_checkpoint_peers.source_urls(list(sources), addresses, int(port))
    except kimi_checkpoint_peers.PeerPlanError as error:
        raise AnsibleFilterError(str(error)) from None


def checkpoint_peer_files(files: Sequence[Mapping[str, Any]], roots: Sequence[str]) -> list[dict[str, Any]]:
    """`checkpoint_repo.files | kimi.k2.checkpoint_peer_files(roots)`: the fetch program's list with peer URLs."""
    try:
        return kimi_checkpoint_peers.peer_files(files, list(roots))
    except kimi_checkpoint_peers.PeerPlanError as error:
        raise AnsibleFilterError(str(error)) from None


class FilterModule:
    def filters(self) -> dict[str, Callable[..., Any]]:
        return {
            "checkpoint_spread": checkpoint_spread,
            "checkpoint_peer_urls": checkpoint_peer_urls,
            "checkpoint_peer_files": checkpoint_peer_files,
        }
