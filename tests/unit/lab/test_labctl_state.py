"""The record `up` keeps about itself and the base's recipe key."""

from __future__ import annotations

from labctl import base
from labctl.state import LabRecord, StatePaths


def test_record_round_trips(tmp_path):
    paths = StatePaths(tmp_path)
    record = LabRecord(
        node_count=2,
        data_size_bytes=1024**3,
        http_port=8080,
        hf_port=8090,
        base_rootfs="/cache/base/x/rootfs",
        mirror_urls={"hf_endpoint": "http://198.18.0.1:8090"},
        checkpoint={"revision": "abc"},
        data_sizes={"node1": 1024**3, "node2": 64 * 1024**2},
    )
    record.save(paths)
    assert LabRecord.load(paths) == record


def test_missing_or_broken_record_means_down(tmp_path):
    paths = StatePaths(tmp_path)
    assert LabRecord.load(paths) is None
    paths.record.write_text("{not json")
    assert LabRecord.load(paths) is None


def test_base_key_follows_the_recipe():
    first = base.recipe("http://deb.debian.org/debian")
    assert base.recipe_key(first) == base.recipe_key(dict(first))
    other_mirror = base.recipe("http://mirror.example/debian")
    assert base.recipe_key(other_mirror) != base.recipe_key(first)
    more_packages = {**first, "packages": [*first["packages"], "curl"]}
    assert base.recipe_key(more_packages) != base.recipe_key(first)
    assert {"systemd", "openssh-server", "python3-apt", "sudo"} <= set(first["packages"])
