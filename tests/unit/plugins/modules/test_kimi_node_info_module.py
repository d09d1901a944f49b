"""kimi_node_info as Ansible runs it on a node: with apt_sources it returns every enabled apt source of the tree
apt_etc_path names (a fixture here, /etc/apt on a node), in check mode too, under the node's bare
/usr/bin/python3 where this machine has one (kimi_node and kimi_apt_sources are packed with it: stdlib only);
without the option the result has no apt_sources at all, as before."""

from __future__ import annotations

import os
import sys

from tests.paths import FIXTURES
from tests.unit.ansible_adhoc import run_module

# A node runs modules with its own python3, without this venv's packages; where there is none, the venv's.
NODE_PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
UBUNTU = FIXTURES / "apt_sources" / "ubuntu-24.04"


def node_info(tmp_path, check: bool = False, **options) -> dict:
    args = {"data_path": str(tmp_path), "shm_path": str(tmp_path), **options}
    ok, result = run_module(tmp_path, "kimi_node_info", args, check=check, interpreter=NODE_PYTHON)
    assert ok, result.get("msg")
    assert result["changed"] is False
    return result


def test_apt_sources_are_read_from_the_tree_apt_etc_path_names_in_check_mode_too(tmp_path):
    for check in (False, True):
        result = node_info(tmp_path, check=check, apt_sources=True, apt_etc_path=str(UBUNTU))
        file = str(UBUNTU / "sources.list.d" / "ubuntu.sources")
        assert result["apt_sources"] == [
            {"file": file, "line": 15, "uri": "http://archive.ubuntu.com/ubuntu/"},
            {"file": file, "line": 23, "uri": "http://security.ubuntu.com/ubuntu/"},
        ]


def test_without_the_option_nothing_of_apt_is_read_or_returned(tmp_path):
    result = node_info(tmp_path, apt_etc_path=str(tmp_path / "no-such-dir"))
    assert "apt_sources" not in result
    assert result["data"]["path"] == str(tmp_path)
