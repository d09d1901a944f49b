"""The checkpoint an air-gapped bundle carries, listed from its manifest as the checkpoint role reads it on a node
(plugins/module_utils/kimi_bundle_checkpoint.py, module kimi_bundle_checkpoint_files)."""

from __future__ import annotations

import ast
import hashlib
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_checkpoint as kc
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_inputs as kbi
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_manifest as kbm
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_tree as kbt
from ansible_collections.kimi.k2.plugins.module_utils.kimi_bundle_tree import ManifestError

from tests import paths

REPO = "kimi-lab/Kimi-K2-mini"
SHA = "99345edaba174721c2b71c311d774f10cd643c56"
VARIABLES = {
    "kimi_bundle_inventory_name": "lab",
    "kimi_bundle_distribution": "debian-12",
    "kimi_bundle_codename": "bookworm",
    "vllm_python_version": "3.11",
    "vllm_platforms": ["manylinux_2_36_x86_64"],
    "kimi_deb_pins": {"nginx-light": "1.22.1-9+deb12u12"},
    "kimi_vllm_pip_pins": {"vllm": "0.23.0"},
}
FILES = {
    "config.json": b"{}" * 10,
    "model.safetensors": b"weights" * 100,
    "docs/README.md": b"# mini",
}


def manifest(tmp_path: Path, checkpoint: bool = True, repo: str = REPO, revision: str = SHA, link: bool = False) -> str:
    root = tmp_path / "bundle"
    prefix = root / kc.files_prefix(repo, revision)
    for name, data in FILES.items():
        (prefix / name).parent.mkdir(parents=True, exist_ok=True)
        (prefix / name).write_bytes(data)
    (root / "apt").mkdir(exist_ok=True)
    (root / "apt" / "Packages").write_bytes(b"Package: nginx-light\n")
    if link:
        (prefix / "weights-link.safetensors").symlink_to("model.safetensors")
    variables = dict(VARIABLES)
    if checkpoint:
        variables.update(kimi_bundle_checkpoint=True, kimi_checkpoint_repo_id=repo, kimi_checkpoint_revision=revision)
    inputs = kbi.inputs_from_variables(variables)
    document = kbm.manifest_document(inputs, kbt.manifest_entries(root), datetime(2026, 12, 5, tzinfo=UTC))
    return kbt.manifest_text(document)


def test_the_listing_has_the_hub_listings_shape_with_the_manifests_sha256(tmp_path):
    listing = kc.bundle_listing(manifest(tmp_path), REPO, SHA, [], [])
    assert listing["revision"] == SHA and listing["resolved_from"] is None
    assert listing["file_count"] == 3 and listing["total_bytes"] == sum(map(len, FILES.values()))
    by_path = {item["path"]: item for item in listing["files"]}
    assert set(by_path) == set(FILES)
    for name, data in FILES.items():
        assert by_path[name]["size"] == len(data)
        assert by_path[name]["sha256"] == hashlib.sha256(data).hexdigest()
        assert by_path[name]["git_oid"] is None


def test_the_roles_patterns_select_as_against_the_hub(tmp_path):
    listing = kc.bundle_listing(manifest(tmp_path), REPO, SHA, ["*.json", "*.safetensors"], ["model*"])
    assert [item["path"] for item in listing["files"]] == ["config.json"]


def test_a_link_is_listed_with_the_bytes_it_points_at(tmp_path):
    listing = kc.bundle_listing(manifest(tmp_path, link=True), REPO, SHA, [], [])
    by_path = {item["path"]: item for item in listing["files"]}
    assert by_path["weights-link.safetensors"]["sha256"] == by_path["model.safetensors"]["sha256"]
    assert by_path["weights-link.safetensors"]["size"] == len(FILES["model.safetensors"])


@pytest.mark.parametrize(
    ("kwargs", "repo", "revision", "words"),
    [
        ({"checkpoint": False}, REPO, SHA, "the bundle carries no checkpoint (it was built without"),
        ({}, "other/model", SHA, f"the bundle carries {REPO} at {SHA}, the inventory pins other/model at {SHA}"),
        ({}, REPO, "1" * 40, f"the inventory pins {REPO} at {'1' * 40}"),
    ],
)
def test_a_bundle_without_this_checkpoint_is_named(tmp_path, kwargs, repo, revision, words):
    with pytest.raises(kc.BundleCheckpointError) as raised:
        kc.bundle_listing(manifest(tmp_path, **kwargs), repo, revision, [], [])
    assert words in str(raised.value)


def test_patterns_that_select_nothing_are_named(tmp_path):
    selecting = r"no file of .* that kimi_checkpoint_include/kimi_checkpoint_exclude"
    with pytest.raises(kc.BundleCheckpointError, match=selecting):
        kc.bundle_listing(manifest(tmp_path), REPO, SHA, ["*.bin"], [])


def test_a_manifest_this_collection_cannot_read_is_refused():
    with pytest.raises(ManifestError, match="is not JSON"):
        kc.bundle_listing("<html>", REPO, SHA, [], [])


def test_each_file_is_served_at_its_quoted_path_under_the_mirror():
    url = kc.file_url("http://198.18.0.11:8081/", REPO, SHA, "dir/a b.json")
    assert url == f"http://198.18.0.11:8081/hf/{REPO}/resolve/{SHA}/dir/a%20b.json"


def test_it_runs_on_a_bare_python3():
    """The module runs on a node, whose python3 has no `packaging`: standard library and stdlib-only siblings."""
    tree = ast.parse((paths.REPO_ROOT / "plugins" / "module_utils" / "kimi_bundle_checkpoint.py").read_text())
    absolute = {
        node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 0
    }
    siblings = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 1}
    assert absolute <= set(sys.stdlib_module_names) | {"__future__"}, absolute
    assert siblings <= {"kimi_bundle_tree", "kimi_checkpoint"}, siblings
