"""The bundle manifest: what a bundle was built for, every file's size and sha256, and the checks on both.

Every refusal must name the variable or the file and both values, since that is what an operator at an
air-gapped site has to act on; the assertions therefore compare whole lines, not fragments, where they can.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_fetch as kbf
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_inputs as kbi
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_manifest as kbm
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_tree as kbt
from ansible_collections.kimi.k2.plugins.module_utils.kimi_bundle_fetch import Artifact
from ansible_collections.kimi.k2.plugins.module_utils.kimi_bundle_inputs import BuildInputs, Checkpoint

REVISION = "0123456789abcdef0123456789abcdef01234567"
CREATED = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
# An inventory's resolved variables, as roles/kimi/defaults/main.yml and the roles' defaults make them for Debian 12.
GOOD = {
    "kimi_bundle_inventory_name": "site-a",
    "kimi_bundle_distribution": "debian-12",
    "kimi_bundle_codename": "bookworm",
    "kimi_bundle_architecture": "amd64",
    "vllm_python_version": "3.11",
    "vllm_platforms": ["manylinux_2_36_x86_64"],
    "kimi_deb_pins": {
        "libnccl2": "2.30.7-1+cuda13.3",
        "libnccl-dev": "2.30.7-1+cuda13.3",
        "cuda-toolkit-13-3": "13.3.0-1",
    },
    "firewall_deb_pins": {"bookworm": {"nftables": "1.0.6-2+deb12u2"}},
    "monitoring_deb_pins": {"bookworm": {"prometheus": "2.42.0+ds-5+deb12u1"}, "noble": {"prometheus": "2.45.3"}},
    "kimi_bundle_apt_packages": ["python3-venv", "g++"],
    "kimi_vllm_pip_pins": {"vllm": "0.23.0", "Nvidia_NCCL_cu13": "2.28.9"},
    "kimi_vllm_pip_overrides": {},
    "checkpoint_hf_version": "2.4.0",
    "kimi_bundle_checkpoint": True,
    "kimi_checkpoint_repo_id": "moonshotai/Kimi-K2-Instruct",
    "kimi_checkpoint_revision": REVISION,
    "kimi_checkpoint_include": ["*.safetensors", "*.json"],
    "kimi_checkpoint_exclude": [],
}


def inputs(**changes: object) -> BuildInputs:
    return kbi.inputs_from_variables({**GOOD, **changes})


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write(root: Path, relative: str, data: bytes) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    """A small bundle: an apt repository, a wheelhouse, a checkpoint with one relative symlink."""
    root = tmp_path / "bundle"
    write(root, "apt/libnccl2_2.30.7-1+cuda13.3_amd64.deb", b"deb" * 1000)
    write(root, "apt/Packages", b"Package: libnccl2\n")
    write(root, "wheels/vllm-0.23.0-cp38-abi3-manylinux_2_31_x86_64.whl", b"wheel")
    write(root, "hf/models/moonshotai/Kimi-K2-Instruct/config.json", b"{}")
    (root / "hf/latest").symlink_to("models/moonshotai/Kimi-K2-Instruct")
    return root


# ---------------------------------------------------------------------------------------------- inputs


def test_inputs_from_variables_normalises_and_merges_every_pin_source():
    built = inputs()
    assert built.distribution == "debian-12" and built.codename == "bookworm" and built.architecture == "amd64"
    assert built.python_version == "3.11" and built.platforms == ("manylinux_2_36_x86_64",)
    assert built.apt_pins == {
        "cuda-toolkit-13-3": "13.3.0-1",
        "libnccl-dev": "2.30.7-1+cuda13.3",
        "libnccl2": "2.30.7-1+cuda13.3",
        "nftables": "1.0.6-2+deb12u2",
        "prometheus": "2.42.0+ds-5+deb12u1",
    }
    assert built.apt_pin_sources["nftables"] == "firewall_deb_pins"
    assert built.apt_pin_sources["libnccl2"] == "kimi_deb_pins"
    assert built.apt_packages == ("g++", "python3-venv")
    assert built.pip_pins == {"nvidia-nccl-cu13": "2.28.9", "vllm": "0.23.0"}
    assert built.checkpoint == Checkpoint("moonshotai/Kimi-K2-Instruct", REVISION, ("*.json", "*.safetensors"), ())


def test_the_inputs_digest_covers_what_matters_and_not_the_inventory_name():
    base = inputs()
    assert base.inputs_sha256() == hashlib.sha256(kbi.canonical_json(base.matters()).encode()).hexdigest()
    assert inputs(kimi_bundle_inventory_name="site-b").inputs_sha256() == base.inputs_sha256()
    # The same set written otherwise (PEP 503 names, key order) is the same bundle.
    same = inputs(kimi_vllm_pip_pins={"nvidia-nccl-cu13": "2.28.9", "VLLM": "0.23.0"})
    assert same.inputs_sha256() == base.inputs_sha256()
    bumped = inputs(kimi_vllm_pip_pins={"vllm": "0.23.1", "nvidia-nccl-cu13": "2.28.9"})
    assert bumped.inputs_sha256() != base.inputs_sha256()


def test_without_the_checkpoint_its_variables_are_not_read():
    built = inputs(kimi_bundle_checkpoint=False, kimi_checkpoint_revision="main", kimi_checkpoint_repo_id="")
    assert built.checkpoint is None and built.to_dict()["checkpoint"] is None


def test_the_architecture_defaults_to_amd64_and_role_pins_are_optional():
    variables = {k: v for k, v in GOOD.items() if k not in ("kimi_bundle_architecture", "firewall_deb_pins")}
    built = kbi.inputs_from_variables(variables)
    assert built.architecture == "amd64" and "nftables" not in built.apt_pins


BAD_INPUTS = [
    ("kimi_bundle_inventory_name", "", "must be a name (got '')"),
    ("kimi_bundle_inventory_name", "../site", "must be a name (got '../site')"),
    ("kimi_bundle_distribution", "Debian 12", "must be NAME-VERSION, e.g. \"debian-12\" (got 'Debian 12')"),
    ("kimi_bundle_codename", "noble", "is 'noble', but debian-12 is 'bookworm'"),
    ("kimi_bundle_architecture", "x86_64", "must be one of amd64, arm64, ppc64el, s390x (got 'x86_64')"),
    ("vllm_python_version", 3.1, 'must be a quoted string such as "3.11" (got the number 3.1)'),
    ("vllm_python_version", "3.11.4", "got '3.11.4'"),
    ("vllm_platforms", "manylinux_2_36_x86_64", "must be a list (got 'manylinux_2_36_x86_64')"),
    ("vllm_platforms", [], "must name at least one platform tag"),
    ("vllm_platforms", ["macosx_14_0_arm64"], "has 'macosx_14_0_arm64', which is not a Linux platform tag"),
    ("vllm_platforms", ["manylinux_2_36_aarch64"], "has 'manylinux_2_36_aarch64', not for x86_64"),
    ("kimi_deb_pins", "{{ kimi_deb_pins }}", "must be a mapping of Debian package to exact version"),
    ("kimi_deb_pins", {"libnccl2": ">=2.30"}, "pins libnccl2 to '>=2.30', not one exact Debian version"),
    ("kimi_deb_pins", {"LibNCCL2": "2.30.7-1"}, "has 'LibNCCL2', which is not a Debian package name"),
    ("firewall_deb_pins", {"noble": {"nftables": "1.0.9-1"}}, "has no entry for bookworm (it has noble)"),
    ("kimi_bundle_apt_packages", ["python3 venv"], "has an entry that is not a valid name: 'python3 venv'"),
    ("kimi_vllm_pip_pins", {}, "must be a mapping of package to version"),
    ("kimi_vllm_pip_pins", {"vllm": ">=0.23"}, "pins vllm to '>=0.23', not one exact PEP 440 version"),
    ("kimi_vllm_pip_pins", {"vllm": "0.23.0", "VLLM": "0.23.0"}, "pins vllm and VLLM, one package (PEP 503)"),
    ("kimi_vllm_pip_pins", {"vllm": 0.23}, "pins vllm to 0.23, not one exact PEP 440 version"),
    ("kimi_vllm_pip_overrides", {"nvidia-nccl-cu13": "latest"}, "pins nvidia-nccl-cu13 to 'latest'"),
    ("kimi_vllm_pip_overrides", ["nccl"], "must be a mapping of package to version"),
    ("checkpoint_hf_version", 2.4, "pins huggingface-hub to 2.4, not one exact PEP 440 version"),
    ("checkpoint_hf_version", ">=2.4", "pins huggingface-hub to '>=2.4', not one exact PEP 440 version"),
    ("kimi_bundle_checkpoint", "maybe", "must be true or false (got 'maybe')"),
    ("kimi_checkpoint_repo_id", "Kimi-K2", "must be a Hub repository id org/name (got 'Kimi-K2')"),
    ("kimi_checkpoint_revision", "main", "must be a 40-hex commit (got 'main')"),
    ("kimi_checkpoint_include", "*.json", "must be a list (got '*.json')"),
    ("kimi_checkpoint_exclude", [1], "has an entry that is not a valid name: 1"),
]


@pytest.mark.parametrize(("variable", "value", "expected"), BAD_INPUTS, ids=[f"{v}={x!r}" for v, x, _ in BAD_INPUTS])
def test_a_bad_variable_is_refused_by_name(variable, value, expected):
    with pytest.raises(kbi.BundleInputError) as caught:
        inputs(**{variable: value})
    assert caught.value.variables == [variable]
    assert isinstance(caught.value, ValueError)
    assert str(caught.value).startswith(f"{variable} ") and expected in str(caught.value)


def test_the_hf_cli_version_is_optional_normalised_and_survives_the_dict():
    assert inputs().hf_version == "2.4.0" and inputs(checkpoint_hf_version="2.4").hf_version == "2.4"
    without = kbi.inputs_from_variables({k: v for k, v in GOOD.items() if k != "checkpoint_hf_version"})
    assert without.hf_version is None and without.to_dict()["hf_version"] is None
    assert without.inputs_sha256() != inputs().inputs_sha256()
    assert kbi.inputs_from_dict(inputs().to_dict()).hf_version == "2.4.0"
    data = inputs().to_dict()
    data["hf_version"] = "latest"
    with pytest.raises(kbi.BundleInputError) as caught:
        kbi.inputs_from_dict(data)
    assert caught.value.variables == ["built_for.hf_version"]


class RecordingVariables(dict):
    """Variables that note every name read, to prove which an inventory must resolve."""

    def __init__(self, values: dict) -> None:
        super().__init__(values)
        self.read: set[str] = set()

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __contains__(self, key) -> bool:
        self.read.add(key)
        return super().__contains__(key)

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)


def test_input_variables_are_exactly_the_names_the_inputs_are_read_from():
    variables = RecordingVariables({**GOOD, "router_deb_pins": {"bookworm": {"haproxy": "2.6.12-1+deb12u4"}}})
    kbi.inputs_from_variables(variables)
    assert variables.read == set(kbi.INPUT_VARIABLES)
    assert len(kbi.INPUT_VARIABLES) == len(set(kbi.INPUT_VARIABLES))


def test_a_bad_pin_inside_a_release_names_the_release():
    with pytest.raises(kbi.BundleInputError) as caught:
        inputs(firewall_deb_pins={"bookworm": {"nftables": "1.0.*"}})
    assert str(caught.value) == "firewall_deb_pins.bookworm pins nftables to '1.0.*', not one exact Debian version"


def test_a_missing_variable_is_named():
    variables = {k: v for k, v in GOOD.items() if k != "vllm_python_version"}
    with pytest.raises(kbi.BundleInputError) as caught:
        kbi.inputs_from_variables(variables)
    assert caught.value.variables == ["vllm_python_version"] and "(got None)" in str(caught.value)


def test_every_bad_variable_is_named_in_one_error():
    with pytest.raises(kbi.BundleInputError) as caught:
        inputs(vllm_python_version="three", kimi_checkpoint_revision="main", kimi_deb_pins=[])
    assert caught.value.variables == ["vllm_python_version", "kimi_deb_pins", "kimi_checkpoint_revision"]


def test_one_package_pinned_twice_to_different_versions_names_both_variables():
    pins = {**GOOD["kimi_deb_pins"], "nftables": "1.0.6-2"}
    with pytest.raises(kbi.BundleInputError) as caught:
        inputs(kimi_deb_pins=pins)
    assert str(caught.value) == (
        "firewall_deb_pins pins nftables to 1.0.6-2+deb12u2, kimi_deb_pins to 1.0.6-2: make them agree"
    )


def test_inputs_survive_the_round_trip_through_their_dict():
    original = inputs()
    back = kbi.inputs_from_dict(json.loads(json.dumps(original.to_dict())))
    assert back == original and back.to_dict() == original.to_dict()
    assert back.apt_pin_sources["nftables"] == "built_for.apt_pins"


def test_a_bad_value_in_a_dict_names_the_manifest_key():
    data = inputs().to_dict()
    data["python_version"] = "3.x"
    data["checkpoint"]["revision"] = "main"
    with pytest.raises(kbi.BundleInputError) as caught:
        kbi.inputs_from_dict(data)
    assert caught.value.variables == ["built_for.python_version", "built_for.checkpoint.revision"]


# ------------------------------------------------------------------------------------------ comparison


def test_a_bundle_built_for_these_inputs_has_no_difference():
    assert kbi.compare_inputs(inputs(), inputs()) == []


def test_a_bundle_for_python_3_12_is_refused_for_3_11_nodes():
    bundle = inputs(vllm_python_version="3.12", vllm_platforms=["manylinux_2_39_x86_64"])
    assert kbi.compare_inputs(bundle, inputs()) == [
        "python_version (vllm_python_version): the bundle has 3.12, the inventory wants 3.11",
        "platforms (vllm_platforms): the bundle has manylinux_2_39_x86_64, the inventory wants manylinux_2_36_x86_64",
    ]


def test_an_apt_pin_bump_names_the_package_its_variable_and_both_versions():
    wanted = inputs(
        kimi_deb_pins={**GOOD["kimi_deb_pins"], "libnccl2": "2.30.8-1+cuda13.3"},
        firewall_deb_pins={"bookworm": {"nftables": "1.0.6-2+deb12u3"}},
    )
    assert kbi.compare_inputs(inputs(), wanted) == [
        "apt package libnccl2 (kimi_deb_pins): the bundle has 2.30.7-1+cuda13.3, the inventory pins 2.30.8-1+cuda13.3",
        "apt package nftables (firewall_deb_pins): the bundle has 1.0.6-2+deb12u2, the inventory pins 1.0.6-2+deb12u3",
    ]


def test_a_pip_package_missing_from_the_bundle_is_named():
    wanted = inputs(kimi_vllm_pip_pins={**GOOD["kimi_vllm_pip_pins"], "flashinfer-python": "0.5.2"})
    assert kbi.compare_inputs(inputs(), wanted) == [
        "pip package flashinfer-python (kimi_vllm_pip_pins): the inventory pins 0.5.2, the bundle has no "
        "flashinfer-python"
    ]


def test_pins_only_the_bundle_has_are_named_too():
    wanted = inputs(kimi_vllm_pip_pins={"vllm": "0.23.0"}, kimi_bundle_apt_packages=["python3-venv"])
    assert kbi.compare_inputs(inputs(), wanted) == [
        "apt_packages (kimi_bundle_apt_packages): the bundle has g++, python3-venv, the inventory wants python3-venv",
        "pip package nvidia-nccl-cu13 (kimi_vllm_pip_pins): the bundle pins 2.28.9, the inventory does not pin "
        "nvidia-nccl-cu13",
    ]


def test_pip_versions_compare_as_pep_440_versions():
    bundle = inputs(kimi_vllm_pip_pins={"vllm": "0.23", "nvidia-nccl-cu13": "2.28.9"})
    assert kbi.compare_inputs(bundle, inputs(kimi_vllm_pip_pins={"vllm": "0.23.0", "nvidia-nccl-cu13": "2.28.9"})) == []


def test_an_override_and_the_checkpoint_revision_are_compared():
    other = "f" * 40
    bundle = inputs(kimi_vllm_pip_overrides={"nvidia-nccl-cu13": "2.30.4"})
    wanted = inputs(kimi_checkpoint_revision=other)
    assert kbi.compare_inputs(bundle, wanted) == [
        "pip override nvidia-nccl-cu13 (kimi_vllm_pip_overrides): the bundle pins 2.30.4, the inventory does not pin "
        "nvidia-nccl-cu13",
        f"checkpoint revision (kimi_checkpoint_revision): the bundle has {REVISION}, the inventory wants {other}",
    ]


def test_a_bundle_without_the_checkpoint_is_named_when_one_is_wanted():
    assert kbi.compare_inputs(inputs(kimi_bundle_checkpoint=False), inputs()) == [
        f"checkpoint (kimi_bundle_checkpoint): the bundle has none, the inventory wants moonshotai/Kimi-K2-Instruct at "
        f"{REVISION}"
    ]


def test_another_hf_cli_version_is_named_with_its_variable():
    assert kbi.compare_inputs(inputs(checkpoint_hf_version="2.3.0"), inputs()) == [
        "hf_version (checkpoint_hf_version): the bundle has 2.3.0, the inventory wants 2.4.0"
    ]
    without = kbi.inputs_from_variables({k: v for k, v in GOOD.items() if k != "checkpoint_hf_version"})
    assert kbi.compare_inputs(without, inputs()) == [
        "hf_version (checkpoint_hf_version): the bundle has none, the inventory wants 2.4.0"
    ]


def test_another_distribution_and_inventory_are_named():
    bundle = inputs(
        kimi_bundle_inventory_name="site-b",
        kimi_bundle_distribution="ubuntu-24.04",
        kimi_bundle_codename="noble",
        firewall_deb_pins={"noble": {"nftables": "1.0.6-2+deb12u2"}},
        monitoring_deb_pins={"noble": {"prometheus": "2.42.0+ds-5+deb12u1"}},
    )
    assert kbi.compare_inputs(bundle, inputs()) == [
        "inventory_name (kimi_bundle_inventory_name): the bundle has site-b, the inventory wants site-a",
        "distribution (kimi_bundle_distribution): the bundle has ubuntu-24.04, the inventory wants debian-12",
        "codename (kimi_bundle_codename): the bundle has noble, the inventory wants bookworm",
    ]


DIFFERENT_VALUES = {
    "inventory_name": "site-z",
    "distribution": "debian-13",
    "codename": "trixie",
    "architecture": "arm64",
    "python_version": "3.12",
    "platforms": ("manylinux_2_39_x86_64",),
    "apt_pins": {"libnccl2": "1-1"},
    "pip_pins": {"vllm": "9.9"},
    "pip_overrides": {"torch": "1.0"},
    "apt_packages": ("gcc",),
    "checkpoint": None,
    "hf_version": "9.9",
}


@pytest.mark.parametrize("name", [f.name for f in dataclasses.fields(BuildInputs) if f.compare])
def test_every_compared_field_of_the_inputs_is_reported_when_it_differs(name):
    """A field added to BuildInputs without a line in compare_inputs would let preflight accept a wrong bundle."""
    changed = dataclasses.replace(inputs(), **{name: DIFFERENT_VALUES[name]})
    assert kbi.compare_inputs(changed, inputs()) != []
    assert changed.inputs_sha256() != inputs().inputs_sha256() or name == "inventory_name"


# ---------------------------------------------------------------------------------------------- the tree


def test_manifest_entries_list_every_file_with_size_and_sha256_sorted(bundle):
    write(bundle, kbt.MANIFEST_NAME, b"old manifest")
    write(bundle, kbt.SIGNATURE_NAME, b"old signature")
    write(bundle, "notes/kimi-bundle.json", b"not the manifest: nested")
    assert kbt.manifest_entries(bundle) == [
        {"path": "apt/Packages", "size": 18, "sha256": sha(b"Package: libnccl2\n")},
        {"path": "apt/libnccl2_2.30.7-1+cuda13.3_amd64.deb", "size": 3000, "sha256": sha(b"deb" * 1000)},
        {"path": "hf/latest", "symlink": "models/moonshotai/Kimi-K2-Instruct"},
        {"path": "hf/models/moonshotai/Kimi-K2-Instruct/config.json", "size": 2, "sha256": sha(b"{}")},
        {"path": "notes/kimi-bundle.json", "size": 24, "sha256": sha(b"not the manifest: nested")},
        {"path": "wheels/vllm-0.23.0-cp38-abi3-manylinux_2_31_x86_64.whl", "size": 5, "sha256": sha(b"wheel")},
    ]


def test_files_are_hashed_in_blocks_and_the_size_is_of_the_bytes_read(tmp_path, monkeypatch):
    monkeypatch.setattr(kbt, "HASH_BLOCK", 7)
    data = bytes(range(256)) * 3
    assert kbt.hash_file(write(tmp_path, "blob", data)) == (768, sha(data))


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("../../outside", "is a symlink to ../../outside, outside the bundle"),
        ("/etc/hostname", "is a symlink to the absolute path /etc/hostname"),
        ("nowhere", "is a symlink to nowhere, which does not exist"),
    ],
)
def test_a_symlink_leaving_the_root_is_refused_by_name(bundle, target, reason):
    write(bundle.parent, "outside", b"secret")
    (bundle / "apt" / "link").symlink_to(target)
    with pytest.raises(kbt.BundleTreeError) as caught:
        kbt.manifest_entries(bundle)
    assert str(caught.value) == f"{bundle.resolve()}: apt/link {reason}"


def test_a_symlink_through_a_directory_link_that_leaves_the_root_is_refused(bundle):
    """Judged by where the kernel lands, not by the text: a/b/up -> ../.. is the root, so up/../x leaves it."""
    deep = bundle / "a" / "b"
    deep.mkdir(parents=True)
    (deep / "up").symlink_to("../..")
    write(bundle.parent, "x", b"outside")
    (deep / "sneaky").symlink_to("up/../x")
    with pytest.raises(kbt.BundleTreeError, match=re.escape("a/b/sneaky is a symlink to up/../x, outside the bundle")):
        kbt.manifest_entries(bundle)


def test_a_special_file_is_refused_by_name(bundle):
    os.mkfifo(bundle / "apt" / "pipe")
    with pytest.raises(kbt.BundleTreeError, match="apt/pipe is not a regular file, a directory or a symlink"):
        kbt.manifest_entries(bundle)


# ------------------------------------------------------------------------------------------ the document


def test_the_manifest_text_is_canonical_and_reads_back(bundle):
    document = kbm.manifest_document(inputs(), kbt.manifest_entries(bundle), CREATED)
    text = kbt.manifest_text(document)
    assert text.endswith("}\n") and not text.endswith("\n\n")
    assert text == json.dumps(json.loads(text), sort_keys=True, indent=2) + "\n"
    assert document["schema"] == kbt.SCHEMA_VERSION and document["created_at"] == "2026-03-01T12:00:00Z"
    assert document["built_for"]["inventory"] == {"name": "site-a", "sha256": inputs().inputs_sha256()}
    assert document["totals"] == {"files": 4, "symlinks": 1, "bytes": 3000 + 18 + 5 + 2}
    again = kbm.manifest_document(inputs(), kbt.manifest_entries(bundle), CREATED)
    assert kbt.manifest_text(again) == text
    assert kbm.read_manifest(text) == document
    assert kbm.manifest_inputs(kbm.read_manifest(text)) == inputs()


def test_the_creation_time_is_written_in_utc_and_must_carry_a_zone():
    later = datetime(2026, 3, 1, 14, 0, 0, tzinfo=timezone(timedelta(hours=2)))
    assert kbm.manifest_document(inputs(), [], later)["created_at"] == "2026-03-01T12:00:00Z"
    with pytest.raises(ValueError, match="created_at must carry a time zone"):
        kbm.manifest_document(inputs(), [], datetime(2026, 3, 1))


def manifest_of(bundle: Path) -> str:
    return kbt.manifest_text(kbm.manifest_document(inputs(), kbt.manifest_entries(bundle), CREATED))


def edited(text: str, change: object) -> str:
    document = json.loads(text)
    change(document)
    return json.dumps(document)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda d: d.update(schema=2), "schema 2 of kind 'kimi.k2 bundle manifest' is not one this collection reads"),
        (
            lambda d: d["built_for"]["apt_pins"].update(libnccl2="2.30.8-1+cuda13.3"),
            "built_for.inventory.sha256 is",
        ),
        (lambda d: d["built_for"].update(python_version="3"), "built_for.python_version must be"),
        (lambda d: d["files"][0].update(path="../etc/passwd"), "files[0]: needs a relative path inside the bundle"),
        (lambda d: d["files"][0].update(path="/etc/passwd"), "files[0]: needs a relative path inside the bundle"),
        (lambda d: d["files"][1].update(sha256="ABC"), "files[1] (apt/libnccl2_2.30.7-1+cuda13.3_amd64.deb): sha256"),
        (lambda d: d["files"][0].update(size=-1), "files[0] (apt/Packages): size must be a whole number"),
        (lambda d: d["files"].reverse(), "is listed after"),
        (lambda d: d["files"].append(dict(d["files"][-1])), "(paths must be sorted and unique)"),
        (lambda d: d["totals"].update(bytes=1), "totals"),
    ],
)
def test_a_manifest_that_cannot_be_trusted_is_refused_naming_the_key(bundle, change, expected):
    with pytest.raises(kbt.ManifestError) as caught:
        kbm.read_manifest(edited(manifest_of(bundle), change))
    assert expected in str(caught.value)


def test_a_manifest_that_is_not_json_is_refused():
    with pytest.raises(kbt.ManifestError, match=re.escape("kimi-bundle.json is not JSON")):
        kbm.read_manifest("{")


# ------------------------------------------------------------------------- the served bundle against a node


def served(**changes: object) -> str:
    """The manifest a mirror serves for a bundle built for GOOD with `changes` (no files: only built_for counts)."""
    return kbt.manifest_text(kbm.manifest_document(inputs(**changes), [], CREATED))


def test_a_bundle_built_for_the_nodes_values_matches_and_names_its_inputs_digest():
    match = kbf.match_manifest(served(), GOOD)
    assert match == kbf.BundleMatch(inputs().inputs_sha256(), [])


def test_a_bundle_built_for_another_pin_set_names_each_variable_and_both_values():
    text = served(
        kimi_vllm_pip_pins={"vllm": "0.23.1", "nvidia-nccl-cu13": "2.28.9"},
        kimi_deb_pins={**GOOD["kimi_deb_pins"], "libnccl2": "2.30.8-1+cuda13.3"},
    )
    match = kbf.match_manifest(text, GOOD)
    assert match.differences == [
        "apt package libnccl2 (kimi_deb_pins): the bundle has 2.30.8-1+cuda13.3, the inventory pins 2.30.7-1+cuda13.3",
        "pip package vllm (kimi_vllm_pip_pins): the bundle has 0.23.1, the inventory pins 0.23.0",
    ]
    assert match.inputs_sha256 != inputs().inputs_sha256()
    assert kbf.mismatch_message("node1", "http://mirror:8081/kimi-bundle.json", match.differences) == (
        "node1: the bundle at http://mirror:8081/kimi-bundle.json was built for other inputs than this node's "
        "(2 differences), so nothing is installed from it: apt package libnccl2 (kimi_deb_pins): the bundle has "
        "2.30.8-1+cuda13.3, the inventory pins 2.30.7-1+cuda13.3; pip package vllm (kimi_vllm_pip_pins): the bundle "
        "has 0.23.1, the inventory pins 0.23.0. Build and serve a bundle for this inventory (bin/kimi-bundle build "
        "-i INVENTORY), or set these variables as the bundle has them."
    )


def test_a_bundle_for_another_release_and_inventory_names_them_by_variable():
    other_release = {
        "kimi_bundle_inventory_name": "site-b",
        "kimi_bundle_distribution": "ubuntu-24.04",
        "kimi_bundle_codename": "noble",
        "firewall_deb_pins": {"noble": {"nftables": "1.0.6-2+deb12u2"}},
        "monitoring_deb_pins": {"noble": {"prometheus": "2.42.0+ds-5+deb12u1"}},
    }
    assert kbf.match_manifest(served(**other_release), GOOD).differences == [
        "inventory_name (kimi_bundle_inventory_name): the bundle has site-b, the inventory wants site-a",
        "distribution (kimi_bundle_distribution): the bundle has ubuntu-24.04, the inventory wants debian-12",
        "codename (kimi_bundle_codename): the bundle has noble, the inventory wants bookworm",
    ]
    one = kbf.mismatch_message("node1", "kimi-bundle.json", ["codename (kimi_bundle_codename): the bundle has noble"])
    assert "(1 difference)," in one


def test_a_pin_written_otherwise_is_the_same_bundle():
    """Ansible hands the node's values over as the inventory writes them; PEP 503 names and PEP 440 versions match."""
    variables = {**GOOD, "kimi_vllm_pip_pins": {"VLLM": "0.23", "nvidia_nccl_cu13": "2.28.9"}}
    assert kbf.match_manifest(served(), variables).differences == []


def test_a_built_for_edited_after_the_build_is_refused_as_a_manifest_before_it_is_compared():
    document = json.loads(served())
    document["built_for"]["pip_pins"]["vllm"] = "0.23.1"
    with pytest.raises(kbt.ManifestError) as caught:
        kbf.match_manifest(json.dumps(document), {**GOOD, "kimi_vllm_pip_pins": {"vllm": "0.23.1"}})
    assert "built_for.inventory.sha256 is" in str(caught.value) and "(edited after the build?)" in str(caught.value)
    message = kbf.bad_manifest_message("node1", "http://mirror:8081/kimi-bundle.json", caught.value)
    assert message.startswith(
        "node1: http://mirror:8081/kimi-bundle.json is not a bundle manifest this collection can use, nothing is "
        "installed from it: kimi-bundle.json: built_for.inventory.sha256 is "
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<html>404 Not Found</html>", "kimi-bundle.json is not JSON"),
        ('{"schema": 9, "kind": "other"}', "kimi-bundle.json: schema 9 of kind 'other' is not one this collection"),
    ],
)
def test_a_page_that_is_no_manifest_is_refused_by_name(text, expected):
    with pytest.raises(kbt.ManifestError, match=re.escape(expected)):
        kbf.match_manifest(text, GOOD)


def test_node_values_no_bundle_is_built_for_are_named_not_compared():
    variables = {**GOOD, "kimi_bundle_distribution": "", "vllm_python_version": 3.12}
    with pytest.raises(kbi.BundleInputError) as caught:
        kbf.match_manifest(served(), variables)
    assert caught.value.variables == ["kimi_bundle_distribution", "vllm_python_version"]
    message = kbf.bad_node_inputs_message("node2", caught.value)
    assert message.startswith(
        "node2: the bundle cannot be matched against this node's values, which no bundle is built for: "
        "kimi_bundle_distribution must be NAME-VERSION"
    )
    assert "; vllm_python_version must be a quoted string" in message


# ----------------------------------------------------------------------------------------- verification


def test_an_untouched_bundle_verifies(bundle):
    assert kbt.verify_tree(bundle, kbm.read_manifest(manifest_of(bundle))) == []


def test_a_truncated_file_is_named_with_both_sizes_without_hashing_it(bundle, monkeypatch):
    document = kbm.read_manifest(manifest_of(bundle))
    deb = bundle / "apt/libnccl2_2.30.7-1+cuda13.3_amd64.deb"
    deb.write_bytes(deb.read_bytes()[:1234])
    hashed = []
    real_hash = kbt.hash_file
    monkeypatch.setattr(kbt, "hash_file", lambda path: hashed.append(path.name) or real_hash(path))
    assert kbt.verify_tree(bundle, document) == [
        "apt/libnccl2_2.30.7-1+cuda13.3_amd64.deb: size 1234 bytes, the manifest says 3000 bytes"
    ]
    assert deb.name not in hashed and sorted(hashed) == sorted(
        ["Packages", "config.json", "vllm-0.23.0-cp38-abi3-manylinux_2_31_x86_64.whl"]
    )


def test_a_changed_byte_at_the_same_size_is_named_with_both_digests(bundle):
    document = kbm.read_manifest(manifest_of(bundle))
    wheel = bundle / "wheels/vllm-0.23.0-cp38-abi3-manylinux_2_31_x86_64.whl"
    wheel.write_bytes(b"wheeL")
    assert kbt.verify_tree(bundle, document) == [
        f"wheels/vllm-0.23.0-cp38-abi3-manylinux_2_31_x86_64.whl: sha256 {sha(b'wheeL')}, the manifest says "
        f"{sha(b'wheel')}"
    ]
    assert kbt.verify_tree(bundle, document, checksums=False) == []


def test_an_extra_a_missing_and_a_redirected_file_are_each_named(bundle):
    document = kbm.read_manifest(manifest_of(bundle))
    write(bundle, "wheels/evil-1.0-py3-none-any.whl", b"extra")
    (bundle / "apt/Packages").unlink()
    (bundle / "hf/latest").unlink()
    (bundle / "hf/latest").symlink_to("models")
    assert kbt.verify_tree(bundle, document) == [
        "apt/Packages: missing (the manifest lists 18 bytes)",
        "hf/latest: points to models, the manifest says models/moonshotai/Kimi-K2-Instruct",
        "wheels/evil-1.0-py3-none-any.whl: is not in the manifest (an extra file)",
    ]


def test_a_directory_swapped_for_a_link_out_of_the_bundle_is_not_followed(bundle, tmp_path):
    document = kbm.read_manifest(manifest_of(bundle))
    elsewhere = tmp_path / "elsewhere"
    (bundle / "wheels").rename(elsewhere)
    (bundle / "wheels").symlink_to(elsewhere)
    assert kbt.verify_tree(bundle, document) == [
        f"wheels: is a symlink to the absolute path {elsewhere}",
        "wheels/vllm-0.23.0-cp38-abi3-manylinux_2_31_x86_64.whl: missing (the manifest lists 5 bytes)",
    ]


# -------------------------------------------------------------------------------- the bundle's contents

PACKAGES = """\
Package: libnccl2
Version: 2.30.7-1+cuda13.3
Architecture: amd64
Filename: ./libnccl2_2.30.7-1+cuda13.3_amd64.deb
Description: NCCL
 the long description
 .

Package: libnccl-dev
Version: 2.30.6-1+cuda13.3
Architecture: amd64
Filename: ./libnccl-dev_2.30.6-1+cuda13.3_amd64.deb

Package: cuda-toolkit-13-3
Version: 13.3.0-1
Architecture: amd64
Filename: ./cuda-toolkit-13-3_13.3.0-1_amd64.deb

Package: nftables
Version: 1.0.6-2+deb12u2
Architecture: arm64
Filename: ./nftables_1.0.6-2+deb12u2_arm64.deb

Package: prometheus
Version: 2.42.0+ds-5+deb12u1
Architecture: amd64
Filename: ./prometheus_2.42.0+ds-5+deb12u1_amd64.deb

Package: python3-venv
Version: 3.11.2-1+b1
Architecture: all
Filename: ./python3-venv_3.11.2-1+b1_all.deb
"""


def test_the_apt_index_lacks_a_pinned_version_an_unpinned_package_and_the_architecture():
    assert kbm.apt_index_problems(PACKAGES, inputs(), "apt/Packages") == [
        "./nftables_1.0.6-2+deb12u2_arm64.deb (apt/Packages): built for arm64, the nodes are amd64",
        "apt package libnccl-dev 2.30.7-1+cuda13.3 (kimi_deb_pins): not in the bundle's apt/Packages "
        "(it has 2.30.6-1+cuda13.3)",
        "apt package nftables 1.0.6-2+deb12u2 (firewall_deb_pins): not in the bundle's apt/Packages",
        "apt package g++ (kimi_bundle_apt_packages): not in the bundle's apt/Packages",
    ]


def test_a_packages_index_is_read_as_deb822():
    stanzas = kbm.parse_deb822(PACKAGES)
    assert len(stanzas) == 6 and stanzas[0]["Description"] == "NCCL\nthe long description\n."
    with pytest.raises(kbt.BundleError, match="Packages line 2: not a 'Field: value' line: 'garbage'"):
        kbm.parse_deb822("Package: a\ngarbage\n")


WHEELS = [
    "wheels/vllm-0.23.0-cp38-abi3-manylinux_2_31_x86_64.whl",
    "wheels/torch-2.11.0-cp311-cp311-manylinux_2_28_x86_64.whl",
    "wheels/nvidia_nccl_cu13-2.28.9-py3-none-manylinux_2_18_x86_64.whl",
    "wheels/six-1.17.0-py2.py3-none-any.whl",
    "wheels/local-1.0-cp311-cp311-linux_x86_64.whl",
    "wheels/huggingface_hub-2.4.0-py3-none-any.whl",
]


def test_a_wheelhouse_for_the_nodes_python_and_platform_has_no_problem():
    assert kbm.wheelhouse_problems(WHEELS, inputs()) == []


def test_wheels_for_python_3_12_are_named_by_file_and_the_pin_they_leave_without_a_wheel():
    wheels = [*WHEELS[:1], "wheels/torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl", *WHEELS[3:]]
    assert kbm.wheelhouse_problems(wheels, inputs(kimi_vllm_pip_pins={"vllm": "0.23.0", "torch": "2.11.0"})) == [
        "wheels/torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl: cannot be installed with Python 3.11 on "
        "manylinux_2_36_x86_64 (its tags: cp312-cp312-manylinux_2_28_x86_64)",
        "pip package torch 2.11.0 (kimi_vllm_pip_pins): no wheel for Python 3.11 on manylinux_2_36_x86_64 in the "
        "bundle",
    ]


def test_a_pinned_package_missing_from_the_wheelhouse_is_named_with_what_it_has():
    wanted = inputs(kimi_vllm_pip_pins={"vllm": "0.23.1"}, kimi_vllm_pip_overrides={"flashinfer-python": "0.5.2"})
    assert kbm.wheelhouse_problems(WHEELS, wanted) == [
        "pip package vllm 0.23.1 (kimi_vllm_pip_pins): no wheel for Python 3.11 on manylinux_2_36_x86_64 in the "
        "bundle (it has 0.23.0)",
        "pip package flashinfer-python 0.5.2 (kimi_vllm_pip_overrides): no wheel for Python 3.11 on "
        "manylinux_2_36_x86_64 in the bundle",
    ]


def test_the_hf_cli_without_its_wheel_is_named_with_its_variable():
    assert kbm.wheelhouse_problems(WHEELS, inputs(checkpoint_hf_version="2.5.0")) == [
        "pip package huggingface-hub 2.5.0 (checkpoint_hf_version): no wheel for Python 3.11 on "
        "manylinux_2_36_x86_64 in the bundle (it has 2.4.0)"
    ]


def test_a_wheel_newer_than_the_nodes_glibc_and_a_bad_name_are_named():
    problems = kbm.wheelhouse_problems(
        [*WHEELS, "wheels/new-1.0-cp311-cp311-manylinux_2_39_x86_64.whl", "wheels/not-a-wheel.whl"], inputs()
    )
    assert problems[0].startswith("wheels/new-1.0-cp311-cp311-manylinux_2_39_x86_64.whl: cannot be installed")
    assert problems[1].startswith("wheels/not-a-wheel.whl: not a wheel file name")
    assert len(problems) == 2


# ------------------------------------------------------------------------------------------ rebuilding

OLD_VLLM = b"vllm 0.22.0"
TORCH = b"torch 2.11.0"
SHARD = b"shard-1"


def previous_document() -> dict:
    files = [
        {"path": "hf/snapshots/aaaa/model-1.safetensors", "size": len(SHARD), "sha256": sha(SHARD)},
        {"path": "wheels/torch-2.11.0-cp311-cp311-manylinux_2_28_x86_64.whl", "size": len(TORCH), "sha256": sha(TORCH)},
        {"path": "wheels/vllm-0.22.0-cp38-abi3-manylinux_2_31_x86_64.whl", "size": 11, "sha256": sha(OLD_VLLM)},
    ]
    return kbm.read_manifest(kbt.manifest_text(kbm.manifest_document(inputs(), files, CREATED)))


def test_after_a_pin_bump_only_what_changed_is_fetched():
    new_vllm = b"vllm 0.23.0!"
    wanted = [
        Artifact("wheels/torch-2.11.0-cp311-cp311-manylinux_2_28_x86_64.whl", len(TORCH), sha(TORCH)),
        Artifact("wheels/vllm-0.23.0-cp38-abi3-manylinux_2_31_x86_64.whl", len(new_vllm), sha(new_vllm)),
        # The checkpoint at a new revision: the shard is the same blob under another snapshot.
        Artifact("hf/snapshots/bbbb/model-1.safetensors", len(SHARD), sha(SHARD)),
        Artifact("hf/snapshots/bbbb/config.json", 2, None),
    ]
    plan = kbf.changed_since(previous_document(), wanted)
    assert plan.reuse == [
        (
            "wheels/torch-2.11.0-cp311-cp311-manylinux_2_28_x86_64.whl",
            "wheels/torch-2.11.0-cp311-cp311-manylinux_2_28_x86_64.whl",
        ),
        ("hf/snapshots/bbbb/model-1.safetensors", "hf/snapshots/aaaa/model-1.safetensors"),
    ]
    assert plan.fetch == [
        (wanted[1], "not in the previous build"),
        (wanted[3], "its sha256 is not known before the download"),
    ]
    assert plan.drop == [
        "hf/snapshots/aaaa/model-1.safetensors",
        "wheels/vllm-0.22.0-cp38-abi3-manylinux_2_31_x86_64.whl",
    ]
    assert plan.fetch_bytes() == len(new_vllm) + 2


def test_a_file_changed_under_the_same_name_is_fetched_with_both_digests():
    changed = Artifact("wheels/vllm-0.22.0-cp38-abi3-manylinux_2_31_x86_64.whl", 11, sha(b"rebuilt"))
    plan = kbf.changed_since(previous_document(), [changed])
    assert plan.reuse == []
    assert plan.fetch == [(changed, f"changed (sha256 {sha(OLD_VLLM)} before, {sha(b'rebuilt')} now)")]


def test_a_published_size_that_disagrees_with_the_same_digest_is_fetched():
    odd = Artifact("hf/snapshots/aaaa/model-1.safetensors", 999, sha(SHARD))
    plan = kbf.changed_since(previous_document(), [odd])
    assert plan.fetch == [(odd, "its published size 999 differs from the previous build's 7 bytes")]
    assert plan.fetch_bytes() == 999 and kbf.FetchPlan([], [(Artifact("x"), "new")], []).fetch_bytes() is None


def test_an_interrupted_build_resumes_from_what_its_tree_holds(tmp_path):
    """No manifest yet: the files already in place (written whole, then renamed) are the previous build."""
    write(tmp_path, "wheels/torch.whl", TORCH)
    wanted = [Artifact("wheels/torch.whl", None, sha(TORCH)), Artifact("wheels/vllm.whl", 5, "e" * 64)]
    plan = kbf.plan_fetches(kbt.manifest_entries(tmp_path), wanted)
    assert plan.reuse == [("wheels/torch.whl", "wheels/torch.whl")] and [a.path for a, _ in plan.fetch] == [
        "wheels/vllm.whl"
    ]


@pytest.mark.parametrize(
    ("artifacts", "expected"),
    [
        ([Artifact("a"), Artifact("a")], "artifact 'a': needs a unique relative path"),
        ([Artifact("../a")], "artifact '../a': needs a unique relative path"),
        ([Artifact(kbt.MANIFEST_NAME)], "artifact 'kimi-bundle.json': needs a unique relative path"),
        ([Artifact("a", -1)], "artifact a: size must be a whole number"),
        ([Artifact("a", 1, "xyz")], "artifact a: sha256 must be 64 lower-case hex digits"),
    ],
)
def test_bad_artifacts_are_refused_by_path(artifacts, expected):
    with pytest.raises(kbt.BundleError, match=re.escape(expected)):
        kbf.plan_fetches([], artifacts)


def test_identical_bytes_at_several_old_paths_are_reused_from_the_artifacts_own_path():
    files = [{"path": p, "size": len(SHARD), "sha256": sha(SHARD)} for p in ("a/shard", "b/shard", "c/shard")]
    plan = kbf.plan_fetches(files, [Artifact("b/shard", len(SHARD), sha(SHARD))])
    assert plan.reuse == [("b/shard", "b/shard")] and plan.drop == ["a/shard", "c/shard"]
