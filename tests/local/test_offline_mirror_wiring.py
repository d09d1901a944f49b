"""One setting points every node at the air-gapped bundle: the kimi role derives kimi_offline_mirror_url from the
kimi_offline_mirror group's host, and the nvidia_repo, vllm and checkpoint roles' source defaults follow it (the
bundle's apt/ signed by its own key, its wheels/ with no index). Without the group every source is the public one,
as before. Resolved by Ansible itself from the roles' defaults (tests/fixtures/offline_mirror/sources.yml)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from tests.ansible_run import REPO_ROOT, run_playbook

# Tier 2 (tests/tiers.py, group local-bundle): make test-all, and CI while its time allows, or when its code changed.
pytestmark = pytest.mark.tier2("local-bundle")

SOURCES = REPO_ROOT / "tests" / "fixtures" / "offline_mirror" / "sources.yml"
LOCAL = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
NODES = {"node1": {"kimi_host_ip": "10.99.0.11"}, "node2": {"kimi_host_ip": "10.99.0.12"}}


def resolve(tmp_path: Path, mirror: dict | None, extravars: dict | None = None) -> dict[str, dict]:
    children: dict = {"kimi_nodes": {"hosts": NODES}}
    if mirror is not None:
        children["kimi_offline_mirror"] = {"hosts": mirror}
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"vars": LOCAL, "children": children}}))
    out = tmp_path / "out"
    out.mkdir()
    result = run_playbook(SOURCES, inventory, extravars={"wiring_out": str(out), **(extravars or {})})
    assert result.rc == 0, result.failure_messages()
    return {path.stem: json.loads(path.read_text()) for path in sorted(out.glob("*.json"))}


def test_the_mirror_groups_host_is_every_nodes_one_source(tmp_path):
    resolved = resolve(tmp_path, {"mirror1": {"kimi_host_ip": "10.99.0.5"}})
    wheels = ["http://10.99.0.5:8081/wheels/"]
    expected = {
        "kimi_offline_mirror_url": "http://10.99.0.5:8081/",
        "nvidia_repo_url": "http://10.99.0.5:8081/apt/",
        "nvidia_repo_suite": "./",
        "nvidia_repo_key_url": "http://10.99.0.5:8081/apt/kimi-bundle-archive.gpg",
        "vllm_pip_find_links": wheels,
        "vllm_pip_no_index": True,
        "vllm_pip_trusted_hosts": ["10.99.0.5"],
        "vllm_pinset_find_links": wheels,
        "checkpoint_pip_find_links": wheels,
        "checkpoint_pip_no_index": True,
        "checkpoint_pip_trusted_hosts": ["10.99.0.5"],
        # The bundle does not carry the checkpoint (kimi_bundle_checkpoint false): the Hub, as before.
        "checkpoint_hf_endpoint": "https://huggingface.co",
        "checkpoint_from_bundle": False,
    }
    assert resolved == {"node1": expected, "node2": expected}


def test_a_serving_node_can_be_the_mirror_on_its_own_port_and_serve_the_checkpoint(tmp_path):
    # As typed with -e: strings.
    extravars = {"kimi_offline_mirror_port": "8099", "kimi_bundle_checkpoint": "true"}
    resolved = resolve(tmp_path, {"node1": None}, extravars)
    assert {node["nvidia_repo_url"] for node in resolved.values()} == {"http://10.99.0.11:8099/apt/"}
    # The checkpoint comes from the mirror's hf/ as plain files (the manifest lists them), not from a Hub endpoint.
    assert {node["checkpoint_from_bundle"] for node in resolved.values()} == {True}
    assert {node["checkpoint_hf_endpoint"] for node in resolved.values()} == {"https://huggingface.co"}


def test_without_a_mirror_the_sources_are_nvidias_repository_and_pypi(tmp_path):
    facts = {"distribution": "Ubuntu", "distribution_version": "24.04"}
    resolved = resolve(tmp_path, None, {"ansible_facts": facts, "kimi_bundle_checkpoint": True})
    for sources in resolved.values():
        assert sources["checkpoint_hf_endpoint"] == "https://huggingface.co"
        assert sources["checkpoint_from_bundle"] is False
        assert sources["kimi_offline_mirror_url"] == ""
        assert (
            sources["nvidia_repo_url"] == "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/"
        )
        assert sources["nvidia_repo_suite"] == "/"
        assert sources["nvidia_repo_key_url"] == sources["nvidia_repo_url"] + "3bf863cc.pub"
        assert sources["vllm_pip_find_links"] == sources["checkpoint_pip_find_links"] == []
        assert not sources["vllm_pip_no_index"] and not sources["checkpoint_pip_no_index"]
        assert sources["vllm_pip_trusted_hosts"] == sources["checkpoint_pip_trusted_hosts"] == []
