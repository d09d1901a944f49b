"""The bundle's apt step on this host, for real: apt-get resolves and fetches the pins' closure in a private
apt root, apt-ftparchive indexes it, gpg signs it, and apt, with the exported keyring as its only trust,
installs (simulated, then download-only, which hashes every .deb) each pin from the bundle alone.

The sources are the lab's cached apt mirrors (lab/labctl/mirrors_apt: NVIDIA placeholders and a Debian 12
subset, flat and unsigned, so file: URIs with trusted=yes), found as the lab finds them; the pins are the
role's (kimi_libnccl2_version). Skips when no built mirror holds the pins (lab/lab build), or without
apt-ftparchive (the apt-utils package) or gpg (gnupg). Each build takes well under a second.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
import yaml
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_inputs as kbi
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_manifest as kbm
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_tree as kbt
from kimi_tools import kimi_bundle_apt as kba
from kimi_tools.kimi_bundle_apt import AptBundleError, AptRequest, AptSource

from tests.paths import REPO_ROOT

# Tier 2 (tests/tiers.py, group local-bundle): make test-all, and CI while its time allows, or when its code changed.
pytestmark = [
    pytest.mark.tier2("local-bundle"),
    pytest.mark.skipif(shutil.which("apt-get") is None, reason="no apt-get: not a Debian-family host"),
    pytest.mark.skipif(shutil.which("apt-ftparchive") is None, reason="no apt-ftparchive (apt-get install apt-utils)"),
    pytest.mark.skipif(shutil.which("gpg") is None, reason="no gpg (apt-get install gnupg)"),
]

DEBIAN_PACKAGE = "acl"  # a real Debian 12 package whose closure (libacl1, libc6, ...) is small
HOST_APT_STATE = (Path("/etc/apt"), Path("/var/lib/apt"), Path("/var/cache/apt"), Path("/var/lib/dpkg/status"))


def role_variable(name: str) -> str:
    """The lab inventory's value, else the role default's (both plain strings for these variables)."""
    defaults = yaml.safe_load((REPO_ROOT / "roles/kimi/defaults/main.yml").read_text())
    lab = yaml.safe_load((REPO_ROOT / "inventories/lab/group_vars/all/lab.yml").read_text()) or {}
    return str(lab.get(name, defaults[name]))


PIN = role_variable("kimi_libnccl2_version")


def variables(pin: str = PIN) -> dict:
    return {
        "kimi_bundle_inventory_name": "bundle-apt-test",
        "kimi_bundle_distribution": "debian-12",
        "kimi_bundle_codename": "bookworm",
        "vllm_python_version": "3.11",
        "vllm_platforms": ["manylinux_2_36_x86_64"],
        "kimi_deb_pins": {"libnccl2": pin, "libnccl-dev": pin},
        "kimi_bundle_apt_packages": [DEBIAN_PACKAGE],
        "kimi_vllm_pip_pins": {"vllm": "0.23.0"},
    }


def versions_in(repository: Path, package: str) -> set[str]:
    stanzas = kbm.parse_deb822((repository / "Packages").read_text())
    return {stanza["Version"] for stanza in stanzas if stanza.get("Package") == package}


def lab_mirrors() -> dict[str, Path] | None:
    """The lab's apt mirrors for the current recipe (mirrors_apt.existing, as lab/lab picks them), else the
    newest built entry that holds the pins; None when none does."""
    from labctl import _cache, mirrors_apt, settings

    cache = settings.load_settings().cache
    candidates = [mirrors_apt.existing(cache)]
    candidates += [{"nvidia": e / "nvidia", "debian": e / "debian"} for e in _cache.complete_entries(cache / "apt")]
    for found in filter(None, candidates):
        nvidia, debian = found["nvidia"], found["debian"]
        if PIN in versions_in(nvidia, "libnccl2") & versions_in(nvidia, "libnccl-dev") and versions_in(
            debian, DEBIAN_PACKAGE
        ):
            return found
    return None


@pytest.fixture(scope="module")
def mirrors() -> dict[str, Path]:
    found = lab_mirrors()
    if found is None:
        pytest.skip(f"no built lab apt mirror holds libnccl2 {PIN} and {DEBIAN_PACKAGE} (lab/lab build)")
    return found


@pytest.fixture(scope="module")
def sources(mirrors) -> list[AptSource]:
    # The lab's mirrors are unsigned: trusted=yes is said here, for them only.
    return [AptSource(f"file:{mirrors['nvidia']}", trusted=True), AptSource(f"file:{mirrors['debian']}", trusted=True)]


@pytest.fixture(scope="module")
def signing_key(tmp_path_factory):
    home = tmp_path_factory.mktemp("gnupg")
    try:
        yield kba.build_dir_signing_key(home)
    finally:
        kba.stop_gpg_agent(home)  # the agent gpg started for this home, no other


def build(bundle: Path, work: Path, sources, key, pin: str = PIN) -> kba.AptBuild:
    return kba.build_apt_repository(kbi.inputs_from_variables(variables(pin)), sources, bundle, work, key)


@pytest.fixture(scope="module")
def first_build(tmp_path_factory, sources, signing_key) -> tuple[Path, kba.AptBuild]:
    """One build from empty, shared: tests that change the bundle work on a copy."""
    base = tmp_path_factory.mktemp("first")
    return base / "bundle", build(base / "bundle", base / "work", sources, signing_key)


def copy_bundle(first_build, tmp_path: Path) -> Path:
    bundle = tmp_path / "bundle"
    shutil.copytree(first_build[0], bundle)
    return bundle


def debs(apt_dir: Path) -> dict[str, Path]:
    return {path.name: path for path in apt_dir.glob("*.deb")}


def flip_one_byte(path: Path) -> None:
    """Change the content, keep the size: what apt alone does not notice in its archives directory."""
    with path.open("r+b") as handle:
        handle.seek(-10, os.SEEK_END)
        byte = handle.read(1)
        handle.seek(-1, os.SEEK_CUR)
        handle.write(bytes([byte[0] ^ 1]))


# ------------------------------------------------------------------------------------------ the build


def test_the_pins_and_a_debian_package_resolve_offline_from_the_signed_bundle(first_build, tmp_path):
    bundle, built = first_build
    apt_dir = bundle / kba.APT_DIR
    installs = built.check.installs
    assert installs["libnccl2"] == PIN and installs["libnccl-dev"] == PIN
    assert {DEBIAN_PACKAGE, "libacl1", "libc6"} <= set(installs), "the Debian package came with its dependencies"
    closure = {download.filename for download in built.fetch.downloads}
    assert set(debs(apt_dir)) == closure and len(closure) == len(installs)
    assert sorted(path.name for path in apt_dir.iterdir() if path.suffix != ".deb") == sorted(kba.GENERATED_NAMES)
    assert built.fetch.reused == () and built.fetch.fetched_bytes == sum(
        p.stat().st_size for p in debs(apt_dir).values()
    )

    release = kbm.parse_deb822((apt_dir / "Release").read_text())[0]
    assert {key: release[key] for key in ("Origin", "Label", "Suite", "Codename", "Architectures")} == {
        "Origin": "kimi-bundle",
        "Label": "kimi.k2 bundle for bundle-apt-test",
        "Suite": "bookworm",
        "Codename": "bookworm",
        "Architectures": "amd64",
    }
    assert (apt_dir / "InRelease").read_text().startswith("-----BEGIN PGP SIGNED MESSAGE-----")
    assert (apt_dir / "Release.gpg").read_text().startswith("-----BEGIN PGP SIGNATURE-----")
    assert not built.keyring.read_bytes().startswith(b"-----"), "nodes' signed-by wants a binary keyring"
    inputs = kbi.inputs_from_variables(variables())
    assert kbm.apt_index_problems((apt_dir / "Packages").read_text(), inputs) == []

    # Moved elsewhere (as onto the mirror host), with no other source, apt still verifies and resolves it.
    moved = copy_bundle(first_build, tmp_path) / kba.APT_DIR
    check = kba.check_repository(moved, AptRequest.from_inputs(inputs), tmp_path / "check", inputs)
    assert check.installs == installs


def test_a_second_build_fetches_nothing_and_a_pin_bump_fetches_only_the_changed_debs(
    first_build, sources, signing_key, tmp_path
):
    bundle = copy_bundle(first_build, tmp_path)
    keyring = first_build[1].keyring.read_bytes()
    again = build(bundle, tmp_path / "work", sources, signing_key)
    assert (again.fetch.fetched, again.fetch.fetched_bytes) == ((), 0)
    assert again.fetch.reused_bytes == first_build[1].fetch.fetched_bytes and again.dropped == ()
    assert again.keyring.read_bytes() == keyring
    assert kba.build_dir_signing_key(signing_key.gnupg_home) == signing_key, "the build directory's key is reused"

    nvidia = Path(sources[0].uri.removeprefix("file:"))
    others = sorted((versions_in(nvidia, "libnccl2") & versions_in(nvidia, "libnccl-dev")) - {PIN})
    if not others:
        pytest.skip(f"the lab's nvidia mirror has no libnccl2 besides {PIN} to bump to")
    bumped = build(bundle, tmp_path / "work", sources, signing_key, pin=others[-1])
    upstream = others[-1].split(":")[-1]
    assert sorted(bumped.fetch.fetched) == [f"libnccl-dev_{upstream}_amd64.deb", f"libnccl2_{upstream}_amd64.deb"]
    assert bumped.dropped == (f"libnccl-dev_{PIN}_amd64.deb", f"libnccl2_{PIN}_amd64.deb")
    assert len(bumped.fetch.reused) == len(bumped.fetch.downloads) - 2


def test_a_deb_corrupted_in_the_bundle_is_fetched_again_rather_than_kept_for_its_size(
    first_build, sources, signing_key, tmp_path
):
    bundle = copy_bundle(first_build, tmp_path)
    libc6 = next(path for name, path in debs(bundle / kba.APT_DIR).items() if name.startswith("libc6_"))
    flip_one_byte(libc6)
    again = build(bundle, tmp_path / "work", sources, signing_key)
    assert again.fetch.fetched == (libc6.name,)
    assert kbt.hash_file(libc6)[1] == next(d.sha256 for d in again.fetch.downloads if d.filename == libc6.name)


# ------------------------------------------------------------------------------------------ refusals


def test_a_pin_the_sources_lack_fails_naming_the_package_and_the_version(sources, signing_key, tmp_path):
    missing = "2.30.99-1+cuda13.3"
    with pytest.raises(AptBundleError) as refused:
        build(tmp_path / "bundle", tmp_path / "work", sources, signing_key, pin=missing)
    message = str(refused.value)
    assert f"apt package libnccl2 {missing} (kimi_deb_pins): no apt source has this version" in message
    assert f"E: Version '{missing}' for 'libnccl2' was not found" in message, "apt's own words"
    assert not debs(tmp_path / "bundle" / kba.APT_DIR)


def test_a_source_that_does_not_answer_is_named(sources, signing_key, tmp_path):
    gone = AptSource(f"file:{tmp_path / 'no-such-mirror'}", trusted=True)
    with pytest.raises(
        AptBundleError, match=re.escape(f"apt source file:{tmp_path / 'no-such-mirror'} ./ does not answer: ")
    ):
        build(tmp_path / "bundle", tmp_path / "work", [sources[0], gone], signing_key)


@pytest.mark.parametrize("signed", ["InRelease", "Release"])
def test_a_tampered_release_is_refused_by_apts_signature_check(first_build, tmp_path, signed):
    apt_dir = copy_bundle(first_build, tmp_path) / kba.APT_DIR
    if signed == "Release":  # apt falls back to Release + Release.gpg when there is no InRelease
        (apt_dir / "InRelease").unlink()
    path = apt_dir / signed
    path.write_text(path.read_text().replace("Label: kimi.k2 bundle for", "Label: someone else's bundle for"))
    inputs = kbi.inputs_from_variables(variables())
    with pytest.raises(AptBundleError, match=f"(?s)apt-get update from the bundle's.*{signed}.*BADSIG"):
        kba.check_repository(apt_dir, AptRequest.from_inputs(inputs), tmp_path / "check", inputs)


def test_a_deb_whose_content_changed_is_refused_by_apts_hash_check(first_build, tmp_path):
    apt_dir = copy_bundle(first_build, tmp_path) / kba.APT_DIR
    libnccl2 = debs(apt_dir)[f"libnccl2_{PIN}_amd64.deb"]
    flip_one_byte(libnccl2)
    inputs = kbi.inputs_from_variables(variables())
    with pytest.raises(
        AptBundleError, match=re.escape(f"{libnccl2.name}: its content does not match the signed index")
    ):
        kba.check_repository(apt_dir, AptRequest.from_inputs(inputs), tmp_path / "check", inputs)


# ------------------------------------------------------------------------------------------ the host


def host_apt_state() -> dict[str, tuple[int, int]]:
    """(mtime_ns, size) of everything under the host's apt configuration, lists and caches, and dpkg's status."""
    state = {}
    for top in HOST_APT_STATE:
        for path in [top, *top.rglob("*")] if top.is_dir() else [top] if top.exists() else []:
            info = path.lstat()
            state[str(path)] = (info.st_mtime_ns, info.st_size)
    return state


def test_the_hosts_apt_state_is_neither_read_for_configuration_nor_written(sources, signing_key, tmp_path):
    before = host_apt_state()
    built = build(tmp_path / "bundle", tmp_path / "work", sources, signing_key)
    after = host_apt_state()
    changed = sorted(path for path in before.keys() | after.keys() if before.get(path) != after.get(path))
    assert changed == [], f"the build changed the host's apt state: {changed}"
    assert built.fetch.fetched, "the build did fetch"
    for base in (tmp_path / "work" / "apt-root", tmp_path / "work" / "apt-check"):
        root = kba.AptRoot(base.resolve(), "amd64", (), True)
        resolved = kba.resolved_apt_paths(root)
        assert set(resolved) == set(kba.PRIVATE_PATHS) and kba.paths_outside(resolved, root.base) == []
