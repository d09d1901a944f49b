"""Port checks (read from /proc/net/tcp text) and the lab's FORWARD rules."""

from __future__ import annotations

import pytest
from labctl import net

TCP_HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


def tcp_line(address_hex: str, port: int, state: str = "0A") -> str:
    return f"   0: {address_hex}:{port:04X} 00000000:0000 {state} 00000000:00000000 00:00000000 00000000 0 0 1\n"


# 198.18.0.1 and 127.0.0.1 as /proc/net/tcp prints them (little-endian words).
BRIDGE_HEX = "010012C6"
LOOPBACK_HEX = "0100007F"
ANY_HEX = "00000000"


@pytest.mark.parametrize(
    ("tcp", "tcp6", "holder"),
    [
        (tcp_line(ANY_HEX, 8080), "", "0.0.0.0"),
        (tcp_line(BRIDGE_HEX, 8080), "", "198.18.0.1"),
        ("", tcp_line("0" * 32, 8080), "::"),
        ("", tcp_line("0000000000000000FFFF0000" + BRIDGE_HEX, 8080), "198.18.0.1"),
        (tcp_line(LOOPBACK_HEX, 8080), "", None),
        (tcp_line(ANY_HEX, 8081), "", None),
        (tcp_line(ANY_HEX, 8080, state="01"), "", None),
    ],
)
def test_port_conflict(tcp, tcp6, holder):
    assert net.port_conflict(8080, TCP_HEADER + tcp, TCP_HEADER + tcp6) == holder


def test_listeners_decode_addresses():
    text = TCP_HEADER + tcp_line(BRIDGE_HEX, 8090) + tcp_line(LOOPBACK_HEX, 8090)
    assert net.listeners(8090, text, "") == ["198.18.0.1", "127.0.0.1"]


def test_chain_drops_only_traffic_crossing_the_bridge_boundary():
    rules = [" ".join(rule) for rule in net.chain_rules()]
    assert rules == ["-i br-lab ! -o br-lab -j DROP", "-o br-lab ! -i br-lab -j DROP"]


def test_airgap_drops_only_connections_the_nodes_open_to_the_host():
    rules = [" ".join(rule) for rule in net.airgap_rules()]
    assert rules == ["-i br-lab -m conntrack --ctstate NEW,INVALID -j DROP"]
