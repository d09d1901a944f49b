"""Filters over plugins/module_utils/kimi_networks.py: `kimi.k2.network_list`, kimi_admin_networks as a list
(also from its comma-separated -e form), and `kimi.k2.in_networks`, whether an address is in one of them.

    kimi_admin_networks | kimi.k2.network_list
    firewall_controller_address | kimi.k2.in_networks(kimi_admin_network_list)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ansible_collections.kimi.k2.plugins.module_utils import kimi_networks


def in_networks(address: str, networks: Iterable[str]) -> bool:
    """`address | kimi.k2.in_networks(networks)`: True when the address is in one of the networks."""
    return kimi_networks.address_in_networks(str(address), [str(n) for n in networks])


def network_list(raw: Any) -> list[str]:
    """`kimi_admin_networks | kimi.k2.network_list`: the entries as trimmed strings, a -e string split at commas."""
    return kimi_networks.network_list(raw)


class FilterModule:
    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"in_networks": in_networks, "network_list": network_list}
