"""The interfaces preflight reads (kimi_node) and the interfaces parity reads (kimi_stack), pinned.

Both come from /sys/class/net and `ip -j addr`, but in two shapes that their consumers and fixtures depend
on: preflight's bare IPv4 addresses and "up" from the kernel's IFF_UP flag, parity's 'address/prefix' and
"up" from ip's UP and LOWER_UP flags. The expected values below are what the two separate readers returned
on these inputs before they became one reader with two views, so any drift in either shape fails here.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from ansible_collections.kimi.k2.plugins.module_utils import kimi_node, kimi_stack

from tests import paths

FIXTURES = paths.FIXTURES / "stack"
RECORDED_IP = (FIXTURES / "system" / "ip-j-addr.json").read_text()
# /sys/class/net (operstate, flags) on the machine that recorded ip-j-addr.json: the same four links.
RECORDED_SYSFS = {
    "eth0": ("up", "0x1003"),
    "ifb0": ("down", "0x82"),
    "ifb1": ("down", "0x82"),
    "lo": ("unknown", "0x9"),
}
# The lab-shaped node of facts/regenerate.py, whose stack view is the fixture facts/node1.json records.
LAB_IP = json.dumps(
    [
        {"ifname": "lo", "operstate": "UNKNOWN", "flags": ["LOOPBACK", "UP", "LOWER_UP"],
         "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8}]},
        {"ifname": "host0", "operstate": "UP", "flags": ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"],
         "addr_info": [{"family": "inet", "local": "198.18.0.11", "prefixlen": 24}]},
    ]
)  # fmt: skip
LAB_SYSFS = {"host0": ("up", "0x1003"), "lo": ("unknown", "0x9")}
# Where the two views part: a tun link (operstate unknown, IFF_UP, no LOWER_UP), a link without a flags
# file, one without an operstate file, one only ip knows, an address without prefixlen.
EDGE_SYSFS = {"tun0": ("unknown", "0x1091"), "ib0": ("up", None), "gone0": (None, "0x1003")}
EDGE_IP = json.dumps(
    [
        {"ifname": "tun0", "operstate": "UNKNOWN", "flags": ["POINTOPOINT", "MULTICAST", "NOARP", "UP"],
         "addr_info": [{"family": "inet", "local": "10.8.0.1", "prefixlen": 24}]},
        {"ifname": "ib0", "operstate": "UP", "flags": ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"],
         "addr_info": [{"family": "inet", "local": "10.0.0.1", "prefixlen": 24},
                       {"family": "inet6", "local": "fe80::1", "prefixlen": 64}]},
        {"ifname": "veth9", "operstate": "LOWERLAYERDOWN", "flags": ["BROADCAST", "UP"],
         "addr_info": [{"family": "inet", "local": "10.9.0.1"}]},
    ]
)  # fmt: skip


def sysfs_tree(root: Path, links: dict[str, tuple[str | None, str | None]]) -> Path:
    for name, (operstate, flags) in links.items():
        (root / name).mkdir(parents=True)
        if operstate is not None:
            (root / name / "operstate").write_text(f"{operstate}\n")
        if flags is not None:
            (root / name / "flags").write_text(f"{flags}\n")
    return root


def preflight_view(monkeypatch, root: Path, ip_text: str | None) -> dict:
    """kimi_node.interfaces with `ip` answering ip_text (None: ip fails)."""

    def fake_run(argv, **_kwargs):
        assert argv == ["ip", "-j", "addr", "show"]
        if ip_text is None:
            raise subprocess.CalledProcessError(1, argv)
        return subprocess.CompletedProcess(argv, 0, ip_text, "")

    monkeypatch.setattr(kimi_node.subprocess, "run", fake_run)
    return kimi_node.interfaces(root)


def parity_view(root: Path, ip_text: str | None) -> dict:
    """The interfaces kimi_stack.gather reports, with `ip` answering ip_text (None: ip fails)."""

    def run(argv):
        assert argv == ["ip", "-j", "addr", "show"]
        return (1, "", "ip: command failed") if ip_text is None else (0, ip_text, "")

    return kimi_stack.gather_interfaces(run, root)


def down(ipv4: list[str] | None = None) -> dict:
    return {"operstate": "down", "up": False, "ipv4": ipv4 or []}


# On the recorded machine /sys/class/net and ip agree, so parity's view is the same with or without /sys.
RECORDED_PARITY = {
    "eth0": {"operstate": "up", "up": True, "ipv4": ["192.0.2.2/24"]},
    "ifb0": down(),
    "ifb1": down(),
    "lo": {"operstate": "unknown", "up": True, "ipv4": ["127.0.0.1/8"]},
}
CASES = {
    # case: (sysfs, ip output, preflight view, parity view)
    "recorded": (
        RECORDED_SYSFS,
        RECORDED_IP,
        {
            "eth0": {"operstate": "up", "up": True, "ipv4": ["192.0.2.2"]},
            "ifb0": down(),
            "ifb1": down(),
            "lo": {"operstate": "unknown", "up": True, "ipv4": ["127.0.0.1"]},
        },
        RECORDED_PARITY,
    ),
    "ip fails": (
        RECORDED_SYSFS,
        None,
        {
            "eth0": {"operstate": "up", "up": True, "ipv4": []},
            "ifb0": down(),
            "ifb1": down(),
            "lo": {"operstate": "unknown", "up": True, "ipv4": []},  # IFF_UP from /sys alone
        },
        {
            "eth0": {"operstate": "up", "up": True, "ipv4": []},
            "ifb0": down(),
            "ifb1": down(),
            "lo": {"operstate": "unknown", "up": False, "ipv4": []},  # no LOWER_UP without ip's flags
        },
    ),
    "lab node": (
        LAB_SYSFS,
        LAB_IP,
        {
            "host0": {"operstate": "up", "up": True, "ipv4": ["198.18.0.11"]},
            "lo": {"operstate": "unknown", "up": True, "ipv4": ["127.0.0.1"]},
        },
        json.loads((FIXTURES / "facts" / "node1.json").read_text())["interfaces"],
    ),
    "edges": (
        EDGE_SYSFS,
        EDGE_IP,
        {
            "gone0": {"operstate": "unknown", "up": True, "ipv4": []},
            "ib0": {"operstate": "up", "up": False, "ipv4": ["10.0.0.1"]},  # no flags file reads as 0x0
            "tun0": {"operstate": "unknown", "up": True, "ipv4": ["10.8.0.1"]},
        },
        {
            "gone0": {"operstate": "unknown", "up": False, "ipv4": []},
            "ib0": {"operstate": "up", "up": True, "ipv4": ["10.0.0.1/24"]},
            "tun0": {"operstate": "unknown", "up": False, "ipv4": ["10.8.0.1/24"]},
            "veth9": {"operstate": "lowerlayerdown", "up": False, "ipv4": ["10.9.0.1/32"]},
        },
    ),
    "no /sys/class/net": (
        None,
        RECORDED_IP,
        {},
        RECORDED_PARITY,
    ),
}


@pytest.fixture(params=list(CASES), ids=list(CASES))
def case(request, tmp_path):
    sysfs, ip_text, preflight, parity = CASES[request.param]
    root = sysfs_tree(tmp_path / "net", sysfs) if sysfs is not None else tmp_path / "absent"
    return root, ip_text, preflight, parity


def test_preflight_view_is_unchanged(case, monkeypatch):
    root, ip_text, preflight, _parity = case
    found = preflight_view(monkeypatch, root, ip_text)
    assert found == preflight
    assert list(found) == sorted(found)


def test_parity_view_is_unchanged(case):
    root, ip_text, _preflight, parity = case
    found = parity_view(root, ip_text)
    assert found == parity
    assert list(found) == sorted(found)
