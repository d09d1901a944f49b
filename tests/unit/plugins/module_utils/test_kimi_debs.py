"""What a pinned set still needs, from dpkg-query's lines (kimi.k2.kimi_deb_pins, for
roles/kimi/tasks/pinned_debs.yml)."""

from __future__ import annotations

from ansible_collections.kimi.k2.plugins.module_utils.kimi_debs import DebState, parse_dpkg_query, pin_work

PINNED = {"libnccl2": "2.30.7-1+cuda13.3", "libnccl-dev": "2.30.7-1+cuda13.3"}


def line(name: str, version: str, selection: str = "hold", status: str = "installed") -> str:
    return f"{name}\t{version}\t{selection}\t{status}\n"


def test_dpkg_query_lines_parse_and_odd_lines_are_ignored():
    text = line("libnccl2", "2.30.7-1+cuda13.3") + "garbage\n" + line("cuda-toolkit-13-3", "13.3.0-1", "install")
    assert parse_dpkg_query(text) == {
        "libnccl2": DebState("2.30.7-1+cuda13.3", "hold", "installed"),
        "cuda-toolkit-13-3": DebState("13.3.0-1", "install", "installed"),
    }


def test_a_set_at_its_pins_and_held_needs_nothing():
    text = line("libnccl2", "2.30.7-1+cuda13.3") + line("libnccl-dev", "2.30.7-1+cuda13.3")
    assert pin_work(text, PINNED) == {"install": [], "hold": []}


def test_a_fresh_node_installs_and_holds_everything():
    assert pin_work("", PINNED) == {
        "install": ["libnccl2=2.30.7-1+cuda13.3", "libnccl-dev=2.30.7-1+cuda13.3"],
        "hold": ["libnccl2", "libnccl-dev"],
    }


def test_another_version_is_installed_again_and_held_again_and_a_lost_hold_is_put_back():
    text = line("libnccl2", "2.28.3-1+cuda13.0") + line("libnccl-dev", "2.30.7-1+cuda13.3", selection="install")
    assert pin_work(text, PINNED) == {"install": ["libnccl2=2.30.7-1+cuda13.3"], "hold": ["libnccl2", "libnccl-dev"]}


def test_removed_packages_with_their_config_left_are_not_installed():
    text = line("libnccl2", "2.30.7-1+cuda13.3", "deinstall", "config-files") + line("libnccl-dev", "2.30.7-1+cuda13.3")
    assert pin_work(text, PINNED) == {"install": ["libnccl2=2.30.7-1+cuda13.3"], "hold": ["libnccl2"]}
