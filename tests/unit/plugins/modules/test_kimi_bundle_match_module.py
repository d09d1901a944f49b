"""kimi_bundle_match as Ansible runs it: a served manifest built for the node's values passes without a change, in
check mode too; one built for other inputs, one that is no manifest, and node values no bundle is built for each
fail with a message naming the host (the wording itself is tests/unit/plugins/module_utils/test_kimi_bundle.py's)."""

from __future__ import annotations

from tests.unit.ansible_adhoc import run_module
from tests.unit.plugins.module_utils.test_kimi_bundle import GOOD, inputs, served

SOURCE = "http://10.0.0.5:8081/kimi-bundle.json"


def args(manifest: str, **changes: object) -> dict:
    return {"manifest": manifest, "variables": {**GOOD, **changes}, "host": "node1", "source": SOURCE}


def test_a_bundle_built_for_the_nodes_values_passes_unchanged_in_check_mode_too(tmp_path):
    for check in (False, True):
        ok, result = run_module(tmp_path, "kimi_bundle_match", args(served()), check=check)
        assert ok, result
        assert result["changed"] is False and result["differences"] == []
        assert result["inputs_sha256"] == inputs().inputs_sha256()


def test_a_bundle_built_for_another_pin_fails_naming_the_host_the_variable_and_both_values(tmp_path):
    ok, result = run_module(tmp_path, "kimi_bundle_match", args(served(checkpoint_hf_version="2.3.0")))
    assert not ok and result["changed"] is False
    difference = "hf_version (checkpoint_hf_version): the bundle has 2.3.0, the inventory wants 2.4.0"
    assert result["differences"] == [difference]
    assert result["msg"].startswith(f"node1: the bundle at {SOURCE} was built for other inputs than this node's")
    assert difference in result["msg"]


def test_a_page_that_is_no_manifest_fails_naming_where_it_came_from(tmp_path):
    ok, result = run_module(tmp_path, "kimi_bundle_match", args("<html>503</html>"))
    assert not ok and result["differences"] == [] and "inputs_sha256" not in result
    assert result["msg"].startswith(f"node1: {SOURCE} is not a bundle manifest this collection can use")
    assert "kimi-bundle.json is not JSON" in result["msg"]


def test_node_values_no_bundle_is_built_for_fail_naming_the_variable(tmp_path):
    ok, result = run_module(tmp_path, "kimi_bundle_match", args(served(), kimi_bundle_codename="jammy"))
    assert not ok
    assert result["msg"] == (
        "node1: the bundle cannot be matched against this node's values, which no bundle is built for: "
        "kimi_bundle_codename is 'jammy', but debian-12 is 'bookworm'"
    )
