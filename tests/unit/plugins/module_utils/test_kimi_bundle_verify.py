"""The mirror host's check of a bundle: the signature first (a stand-in for gpgv here; tests/local runs the real
one), then the manifest, then each file by size and sha256, each problem naming the file. And the check runs on a
bare python3: everything the module imports is the standard library or its own siblings."""

from __future__ import annotations

import ast
import hashlib
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_inputs as kbi
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_manifest as kbm
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_tree as kbt
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_verify as kv
from ansible_collections.kimi.k2.plugins.module_utils.kimi_bundle_signature import SignatureError

from tests import paths

A = "2EF5B607163A85FEC8C8F7BD01E2C050E1683E6D"
B = "69F52664110472A6B5B17950239F8A6D456B22DB"
VALID_A = f"[GNUPG:] VALIDSIG {A} 2026-12-02 1796255523 0 4 0 22 8 00 {A}\n"
VALID_B = f"[GNUPG:] VALIDSIG {B} 2026-12-02 1796255523 0 4 0 22 8 00 {B}\n"
ARMORED = b"-----BEGIN PGP SIGNATURE-----\n\niHUEABYKAB0WIQQu9bYHFjqF\n-----END PGP SIGNATURE-----\n"
VARIABLES = {
    "kimi_bundle_inventory_name": "mirror-test",
    "kimi_bundle_distribution": "debian-12",
    "kimi_bundle_codename": "bookworm",
    "vllm_python_version": "3.11",
    "vllm_platforms": ["manylinux_2_36_x86_64"],
    "kimi_deb_pins": {"nginx-light": "1.22.1-9+deb12u12"},
    "kimi_vllm_pip_pins": {"vllm": "0.23.0"},
}
DEB = "apt/nginx-light_1.22.1-9+deb12u12_all.deb"
WHEEL = "wheels/vllm-0.23.0-cp38-abi3-manylinux_2_31_x86_64.whl"
# What the mirror host's module imports, and what those import: each must run on a bare python3.
MIRROR_MODULES = ("kimi_bundle_verify", "kimi_bundle_signature", "kimi_bundle_tree", "kimi_checkpoint")


def gpgv(status: str, returncode: int = 0):
    return lambda argv: (returncode, status, "")


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    root = tmp_path / "bundle"
    for relative, data in {
        DEB: b"deb" * 1000,
        "apt/Packages": b"Package: nginx-light\n",
        "apt/kimi-bundle-archive.gpg": b"public key",
        WHEEL: b"wheel" * 10,
        "wheels/index.html": b"<a href='x'>x</a>",
    }.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_bytes(data)
    inputs = kbi.inputs_from_variables(VARIABLES)
    document = kbm.manifest_document(inputs, kbt.manifest_entries(root), datetime(2026, 12, 2, tzinfo=UTC))
    (root / kbt.MANIFEST_NAME).write_text(kbt.manifest_text(document))
    (root / kbt.SIGNATURE_NAME).write_bytes(ARMORED)
    return root


def test_a_bundle_signed_by_the_pinned_key_and_matching_its_manifest_passes(bundle):
    verdict = kv.verify_bundle(bundle, A, gpgv(VALID_A))
    result = verdict.result()
    assert result["problems"] == [] and result["signer"] == A
    assert (result["files"], result["symlinks"], result["bytes"]) == (5, 0, 3000 + 21 + 10 + 50 + 17)
    assert result["manifest_sha256"] == hashlib.sha256((bundle / "kimi-bundle.json").read_bytes()).hexdigest()
    assert result["built_for"]["apt_pins"] == {"nginx-light": "1.22.1-9+deb12u12"}
    assert result["created_at"] == "2026-12-02T00:00:00Z"


def test_a_flipped_byte_is_named_with_both_checksums_and_only_with_checksums(bundle):
    data = bytearray((bundle / WHEEL).read_bytes())
    data[7] ^= 1
    (bundle / WHEEL).write_bytes(bytes(data))
    (problem,) = kv.verify_bundle(bundle, A, gpgv(VALID_A)).problems
    assert problem.startswith(f"{WHEEL}: sha256 {hashlib.sha256(data).hexdigest()}, the manifest says ")
    assert kv.verify_bundle(bundle, A, gpgv(VALID_A), checksums=False).problems == []


def test_a_truncated_file_is_named_by_its_size(bundle):
    (bundle / DEB).write_bytes(b"deb")
    assert kv.verify_bundle(bundle, A, gpgv(VALID_A)).problems == [f"{DEB}: size 3 bytes, the manifest says 3000 bytes"]


def test_the_tree_is_not_judged_when_the_signature_fails(bundle, monkeypatch):
    monkeypatch.setattr(kv, "verify_tree", lambda *_: pytest.fail("the tree was read"))
    with pytest.raises(SignatureError, match=f"signed by {B}, not by the pinned key {A}"):
        kv.verify_bundle(bundle, A, gpgv(VALID_B))


def test_the_keyring_defaults_to_the_bundles_own_and_may_be_given(bundle, tmp_path):
    asked = []

    def run(argv: list[str]) -> tuple[int, str, str]:
        asked.append(argv[argv.index("--keyring") + 1])
        return 0, VALID_A, ""

    kv.verify_bundle(bundle, A, run)
    other = tmp_path / "site.gpg"
    other.write_bytes(b"site key")
    kv.verify_bundle(bundle, A, run, keyring=other)
    assert asked == [str(bundle / "apt/kimi-bundle-archive.gpg"), str(other)]


def test_a_directory_without_manifest_is_not_a_bundle(tmp_path):
    with pytest.raises(kbt.BundleError, match=r"no kimi-bundle\.json here: not a bundle"):
        kv.verify_bundle(tmp_path, A, gpgv(VALID_A))
    with pytest.raises(kbt.BundleError, match="not a directory"):
        kv.verify_bundle(tmp_path / "nowhere", A, gpgv(VALID_A))


def test_a_signed_manifest_this_collection_cannot_read_is_refused_by_key(bundle):
    document = json.loads((bundle / "kimi-bundle.json").read_text())
    document["totals"]["files"] = 99
    (bundle / "kimi-bundle.json").write_text(kbt.manifest_text(document))
    with pytest.raises(kbt.ManifestError, match=r"totals .* do not add up to files"):
        kv.verify_bundle(bundle, A, gpgv(VALID_A))


def test_the_mirror_check_reads_what_the_full_check_reads(bundle):
    # read_document is read_manifest without the inputs: both accept the builder's manifest alike.
    text = (bundle / "kimi-bundle.json").read_text()
    assert kbt.read_document(text) == kbm.read_manifest(text)


def test_the_failure_message_names_each_file_and_how_many_more():
    problems = [f"f{i}: missing" for i in range(23)]
    message = kv.failure_message(Path("/srv/b"), problems, shown=2)
    assert message == "/srv/b: 23 files differ from the signed manifest: f0: missing; f1: missing; and 21 more"


@pytest.mark.parametrize("name", MIRROR_MODULES)
def test_what_the_mirror_host_runs_is_stdlib_only(name):
    """A node's python3 has no `packaging`: kimi_bundle_inputs.py, kimi_bundle_manifest.py and
    kimi_bundle_fetch.py may not be imported on the mirror host."""
    tree = ast.parse((paths.REPO_ROOT / "plugins" / "module_utils" / f"{name}.py").read_text())
    absolute, siblings = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            absolute |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            absolute.add(node.module.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            siblings.add(node.module)
    assert absolute <= set(sys.stdlib_module_names) | {"__future__"}, absolute
    assert siblings <= set(MIRROR_MODULES), siblings
