"""kimi_admin_networks entries and the firewall role's lockout question (is the controller in one of them)."""

from __future__ import annotations

import pytest
from ansible_collections.kimi.k2.plugins.module_utils.kimi_networks import (
    address_in_networks,
    network_list,
    network_problem,
)


@pytest.mark.parametrize("text", ["10.0.0.0/8", "192.0.2.7", " 192.0.2.7/32 ", "2001:db8::/48", "fd00::1"])
def test_addresses_and_networks_nft_takes_pass(text):
    assert network_problem(text) is None


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("10.0.0.0/33", "is not an IPv4/IPv6 address or CIDR network"),
        ("10.0.0", "is not an IPv4/IPv6 address or CIDR network"),
        ("", "is not an IPv4/IPv6 address or CIDR network"),
        ("10.1.2.3/8", "has host bits set: write the network 10.0.0.0/8 or the address alone"),
        ("2001:db8::1/48", "write the network 2001:db8::/48"),
    ],
)
def test_what_nft_would_refuse_or_widen_is_named(text, words):
    assert words in network_problem(text)


@pytest.mark.parametrize(
    ("address", "networks", "inside"),
    [
        ("198.18.0.1", ["198.18.0.1/32"], True),
        ("198.18.0.1", ["198.18.0.0/15"], True),
        ("198.18.0.1", ["10.0.0.0/8", "198.18.0.2"], False),
        ("::ffff:198.18.0.1", ["198.18.0.0/24"], True),
        ("2001:db8::5", ["2001:db8::/48"], True),
        ("2001:db8::5", ["198.18.0.0/15"], False),
        ("198.18.0.1", ["not-a-network", "198.18.0.0/16"], True),
        ("", ["0.0.0.0/0"], False),
        ("controller", ["0.0.0.0/0"], False),
        ("198.18.0.1", [], False),
    ],
)
def test_an_address_is_in_a_network_of_its_own_family(address, networks, inside):
    assert address_in_networks(address, networks) is inside


@pytest.mark.parametrize(
    ("raw", "entries"),
    [
        (["10.0.0.0/8", " 192.0.2.7 "], ["10.0.0.0/8", "192.0.2.7"]),
        ("10.0.0.0/8, 192.0.2.7,", ["10.0.0.0/8", "192.0.2.7"]),
        ("", []),
        ([], []),
    ],
)
def test_the_list_and_the_e_string_give_the_same_entries(raw, entries):
    assert network_list(raw) == entries


def test_anything_else_is_named():
    with pytest.raises(TypeError, match="must be a list of addresses or CIDR networks"):
        network_list({"net": "10.0.0.0/8"})
