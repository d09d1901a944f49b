"""kimi_bundle_verify as Ansible runs it on a mirror host, with real gpg keys and a real signed bundle.

Each test builds a small bundle in tmp_path (an apt directory with the exported keyring, a wheelhouse, a relative
symlink), writes its manifest with kimi_bundle_manifest.manifest_document and signs it detached and armored with a
key made in a GnuPG home of the test's own, then runs `ansible localhost -m kimi.k2.kimi_bundle_verify` with the
host's bare /usr/bin/python3 (no `packaging`, like a node's): the module must run there. A good bundle passes
(read-only, in check mode too); a flipped byte names the file and both sha256; a truncated file is named by its
size; a manifest signed by another key is refused naming both fingerprints, whether or not the bundle's keyring was
swapped for that key's; an unsigned manifest is refused. Skips without gpg, gpgv or /usr/bin/python3.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_inputs as kbi
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_manifest as kbm
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_tree as kbt
from kimi_tools import kimi_bundle_apt as kba

from tests.unit.ansible_adhoc import run_module

NODE_PYTHON = "/usr/bin/python3"
# Tier 2 (tests/tiers.py, group local-bundle): make test-all, and CI while its time allows, or when its code changed.
pytestmark = [
    pytest.mark.tier2("local-bundle"),
    pytest.mark.skipif(shutil.which("gpg") is None, reason="no gpg (apt-get install gnupg)"),
    pytest.mark.skipif(shutil.which("gpgv") is None, reason="no gpgv (apt-get install gpgv)"),
    pytest.mark.skipif(not os.access(NODE_PYTHON, os.X_OK), reason=f"no {NODE_PYTHON} (a node's interpreter)"),
]

VARIABLES = {
    "kimi_bundle_inventory_name": "mirror-module-test",
    "kimi_bundle_distribution": "debian-12",
    "kimi_bundle_codename": "bookworm",
    "vllm_python_version": "3.11",
    "vllm_platforms": ["manylinux_2_36_x86_64"],
    "kimi_deb_pins": {"nginx-light": "1.22.1-9+deb12u12"},
    "kimi_vllm_pip_pins": {"vllm": "0.23.0"},
}
DEB = "apt/nginx-light_1.22.1-9+deb12u12_all.deb"
WHEEL = "wheels/vllm-0.23.0-cp38-abi3-manylinux_2_31_x86_64.whl"
FILES = {
    DEB: b"deb\n" * 2500,
    "apt/Packages": b"Package: nginx-light\nVersion: 1.22.1-9+deb12u12\n",
    WHEEL: bytes(range(256)) * 8,
    "wheels/index.html": b'<a href="vllm-0.23.0-cp38-abi3-manylinux_2_31_x86_64.whl">vllm</a>\n',
}


def make_key(home: Path, name: str) -> kba.SigningKey:
    return kba.build_dir_signing_key(home, f"{name} <{name}@kimi-bundle.test>")


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """Two signing keys, each in a GnuPG home of its own: the site's and someone else's."""
    homes = {name: tmp_path_factory.mktemp(f"gnupg-{name}") for name in ("site", "other")}
    try:
        yield {name: make_key(home, name) for name, home in homes.items()}
    finally:
        for home in homes.values():
            kba.stop_gpg_agent(home)  # the agents gpg started for these homes, no other


def sign(key: kba.SigningKey, bundle: Path) -> None:
    command = kba.gpg_command(
        key,
        "--yes",
        "--local-user",
        key.key_id,
        "--armor",
        "--detach-sign",
        "--output",
        str(bundle / "kimi-bundle.json.asc"),
    )
    subprocess.run([*command, str(bundle / "kimi-bundle.json")], check=True, capture_output=True, timeout=60)


def build_bundle(root: Path, key: kba.SigningKey) -> Path:
    for relative, data in FILES.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_bytes(data)
    (root / "wheels" / "latest.whl").symlink_to(Path(WHEEL).name)
    kba.export_keyring(root / "apt", key)
    document = kbm.manifest_document(
        kbi.inputs_from_variables(VARIABLES), kbt.manifest_entries(root), datetime.now(UTC)
    )
    (root / "kimi-bundle.json").write_text(kbt.manifest_text(document))
    return root


@pytest.fixture
def bundle(tmp_path, keys) -> Path:
    root = build_bundle(tmp_path / "bundle", keys["site"])
    sign(keys["site"], root)
    return root


def verify(tmp_path: Path, bundle: Path, fingerprint: str, *, check: bool = False, **extra):
    args = {"path": str(bundle), "fingerprint": fingerprint, **extra}
    return run_module(tmp_path, "kimi_bundle_verify", args, check=check, interpreter=NODE_PYTHON)


def test_a_bundle_signed_by_the_pinned_key_passes_on_a_bare_python(tmp_path, bundle, keys):
    fingerprint = keys["site"].key_id
    ok, result = verify(tmp_path, bundle, fingerprint)
    assert ok, result.get("msg")
    assert result["changed"] is False and result["problems"] == []
    assert result["signer"] == fingerprint
    assert (result["files"], result["symlinks"]) == (len(FILES) + 1, 1)  # and the keyring
    assert result["built_for"]["inventory"]["name"] == "mirror-module-test"
    assert result["manifest_sha256"] == hashlib.sha256((bundle / "kimi-bundle.json").read_bytes()).hexdigest()


def test_check_mode_and_a_fingerprint_as_gpg_prints_it_give_the_same_answer(tmp_path, bundle, keys):
    fingerprint = keys["site"].key_id
    spaced = " ".join(fingerprint[i : i + 4] for i in range(0, 40, 4)).lower()
    ok, result = verify(tmp_path, bundle, spaced, check=True)
    assert ok, result.get("msg")
    assert result["changed"] is False and result["signer"] == fingerprint


def test_a_flipped_byte_names_the_file_and_both_checksums(tmp_path, bundle, keys):
    data = bytearray((bundle / WHEEL).read_bytes())
    data[100] ^= 1
    (bundle / WHEEL).write_bytes(bytes(data))
    ok, result = verify(tmp_path, bundle, keys["site"].key_id)
    assert not ok
    expected = hashlib.sha256(FILES[WHEEL]).hexdigest()
    assert result["problems"] == [f"{WHEEL}: sha256 {hashlib.sha256(data).hexdigest()}, the manifest says {expected}"]
    assert result["msg"] == f"{bundle}: 1 file differs from the signed manifest: {result['problems'][0]}"
    # Sizes alone do not see it.
    assert verify(tmp_path, bundle, keys["site"].key_id, checksums=False)[0]


def test_a_truncated_file_is_named_by_its_size(tmp_path, bundle, keys):
    (bundle / DEB).write_bytes(FILES[DEB][:1000])
    ok, result = verify(tmp_path, bundle, keys["site"].key_id, checksums=False)
    assert not ok
    assert result["problems"] == [f"{DEB}: size 1000 bytes, the manifest says {len(FILES[DEB])} bytes"]


def test_a_manifest_signed_by_another_key_is_refused_naming_both_fingerprints(tmp_path, bundle, keys):
    site, other = keys["site"].key_id, keys["other"].key_id
    sign(keys["other"], bundle)
    ok, result = verify(tmp_path, bundle, site)
    assert not ok
    assert f"kimi-bundle.json is signed by {other}, which " in result["msg"]
    assert f"not by the pinned key {site}" in result["msg"]
    # Whoever re-signed it can swap the bundle's keyring too: the pin still refuses it.
    kba.export_keyring(bundle / "apt", keys["other"])
    ok, result = verify(tmp_path, bundle, site)
    assert not ok
    assert f"kimi-bundle.json is signed by {other}, not by the pinned key {site}" in result["msg"]


def test_an_unsigned_manifest_is_refused(tmp_path, bundle, keys):
    (bundle / "kimi-bundle.json.asc").unlink()
    ok, result = verify(tmp_path, bundle, keys["site"].key_id)
    assert not ok
    assert result["msg"] == f"{bundle}: kimi-bundle.json.asc is missing: the manifest is unsigned, and an unsigned " + (
        "bundle is refused"
    )


def test_a_manifest_changed_after_signing_is_refused(tmp_path, bundle, keys):
    manifest = bundle / "kimi-bundle.json"
    manifest.write_text(manifest.read_text().replace("mirror-module-test", "mirror-module-tesT"))
    ok, result = verify(tmp_path, bundle, keys["site"].key_id)
    assert not ok
    assert "(changed after it was signed) (BADSIG)" in result["msg"]


def test_a_bad_fingerprint_is_refused_before_gpgv_runs(tmp_path, bundle):
    ok, result = verify(tmp_path, bundle, "01E2C050E1683E6D")
    assert not ok
    assert result["msg"] == "fingerprint '01E2C050E1683E6D' is not an OpenPGP v4 fingerprint (40 hex digits)"
