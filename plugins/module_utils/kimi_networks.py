"""Admin networks for the firewall: what kimi_admin_networks may hold, and whether an address falls in one.

Stdlib ``ipaddress`` only: ansible.utils' ipaddr filters need netaddr and a collection the nodes' controller may
not have, and the two questions asked here are one call each. Imported by plugins/module_utils/kimi_inputs.py (the
input check) and plugins/filter/kimi_networks.py (the kimi role's kimi_admin_network_list, the firewall role's
lockout check): one parser of the input for both.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def network_list(raw: Any) -> list[str]:
    """kimi_admin_networks as a list of trimmed, non-empty strings: a list as the inventory writes it, or the
    comma-separated string `-e kimi_admin_networks=10.0.0.0/8,192.0.2.7` gives. Anything else is a TypeError (the
    input check names it before any role reads the list)."""
    entries = raw.split(",") if isinstance(raw, str) else raw
    if not isinstance(entries, (list, tuple)):
        raise TypeError(f"must be a list of addresses or CIDR networks (got {raw!r})")
    return [text for text in (str(entry).strip() for entry in entries) if text]


def network_problem(text: str) -> str | None:
    """Why `text` is not an IPv4/IPv6 address or network as nft takes it in an interval set, or None.

    A network with host bits set (10.0.0.5/8) is refused rather than widened: the operator meant one of two
    things, and nft would load the wider one silently."""
    text = text.strip()
    try:
        ipaddress.ip_network(text, strict=True)
    except ValueError as error:
        if "has host bits set" in str(error):
            wider = ipaddress.ip_network(text, strict=False)
            return f"{text!r} has host bits set: write the network {wider} or the address alone"
        return f"{text!r} is not an IPv4/IPv6 address or CIDR network (e.g. 192.0.2.0/24, 2001:db8::/48)"
    return None


def networks(texts: Iterable[str]) -> list[Network]:
    """The valid entries of `texts` as networks (an address alone is its /32 or /128); invalid ones are skipped:
    the input check reports them."""
    return [ipaddress.ip_network(t.strip(), strict=True) for t in texts if network_problem(str(t)) is None]


def address_in_networks(address: str, texts: Iterable[str]) -> bool:
    """Whether `address` (IPv4 or IPv6; an IPv4-mapped IPv6 address counts as its IPv4 one) is in any of the
    networks; False for anything that is not an address."""
    try:
        parsed = ipaddress.ip_address(address.strip())
    except ValueError:
        return False
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        parsed = parsed.ipv4_mapped
    return any(parsed in network for network in networks(texts) if network.version == parsed.version)
