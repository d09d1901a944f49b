"""bin/kimi-bundle end to end on this host: the inventory read by playbooks/bundle_inputs.yml (no node contacted,
no role task run, role defaults under the inventory's values), a signed bundle built from the lab's cached
mirrors and the lab's checkpoint (from its olah, run here on loopback), verified, refused when a byte, the key
or a pin differs, rebuilt without fetching anything, and resumed after an interruption.

The inventory is this test's own (nodes at a closed loopback port, so anything that tried to reach one would fail
at once): the lab's Debian 12 and Python 3.11, a small pin set (the NCCL debs, acl, jinja2 and the placeholder
NCCL wheel, the hf CLI at the checkpoint role's default, the firewall role's nftables pin), so that a build takes
seconds. The sources are the lab's current mirrors, as `make bundle` finds them. Skips when they are not built
(make lab-build), or without apt-ftparchive (apt-utils) or gpg (gnupg).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_manifest as kbm
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from tests.ansible_run import REPO_ROOT, VENV_BIN, run_playbook
from tests.lab_olah import lab_hf_or_skip, running_olah

# Tier 2 (tests/tiers.py, group local-bundle): make test-all, and CI while its time allows, or when its code changed.
pytestmark = [
    pytest.mark.tier2("local-bundle"),
    pytest.mark.skipif(shutil.which("apt-get") is None, reason="no apt-get: not a Debian-family host"),
    pytest.mark.skipif(shutil.which("apt-ftparchive") is None, reason="no apt-ftparchive (apt-get install apt-utils)"),
    pytest.mark.skipif(shutil.which("gpg") is None, reason="no gpg (apt-get install gnupg)"),
]

KIMI_BUNDLE = REPO_ROOT / "bin" / "kimi-bundle"
PLAYBOOK = REPO_ROOT / "playbooks" / "bundle_inputs.yml"
LAB_VARS = yaml.safe_load((REPO_ROOT / "inventories/lab/group_vars/all/lab.yml").read_text())
KIMI_DEFAULTS = yaml.safe_load((REPO_ROOT / "roles/kimi/defaults/main.yml").read_text())
FIREWALL_DEFAULTS = yaml.safe_load((REPO_ROOT / "roles/firewall/defaults/main.yml").read_text())
HF_VERSION = yaml.safe_load((REPO_ROOT / "roles/checkpoint/defaults/main.yml").read_text())["checkpoint_hf_version"]
NCCL_DEB = KIMI_DEFAULTS["kimi_libnccl2_version"]
NFTABLES = FIREWALL_DEFAULTS["firewall_deb_pins"]["bookworm"]["nftables"]
NCCL, SMALL = "nvidia-nccl-cu13", "jinja2"
NOWHERE = {"ansible_host": "127.0.0.1", "ansible_port": 9}


def deb_versions(repository: Path, package: str) -> set[str]:
    stanzas = kbm.parse_deb822((repository / "Packages").read_text())
    return {stanza["Version"] for stanza in stanzas if stanza.get("Package") == package}


def wheel_versions(wheelhouse: Path, name: str) -> list[str]:
    found = [parse_wheel_filename(path.name) for path in wheelhouse.glob("*.whl")]
    return sorted({str(version) for wheel, version, _, _ in found if wheel == canonicalize_name(name)}, key=Version)


def lab_sources() -> dict | None:
    """The lab's current mirrors (as `make bundle` finds them) when they hold every pin here, else None."""
    from labctl import mirrors_apt, mirrors_wheels, settings

    cache = settings.load_settings().cache
    apt, wheels = mirrors_apt.existing(cache), mirrors_wheels.existing(cache)
    if not (apt and wheels):
        return None
    nccl = wheel_versions(wheels["wheelhouse"], NCCL)
    debs_there = NCCL_DEB in deb_versions(apt["nvidia"], "libnccl2") and NFTABLES in deb_versions(
        apt["debian"], "nftables"
    )
    wheels_there = (
        len(nccl) >= 2
        and wheel_versions(wheels["wheelhouse"], SMALL)
        and HF_VERSION in wheel_versions(wheels["wheelhouse"], "huggingface-hub")
    )
    if not (debs_there and wheels_there):
        return None
    return {"apt": apt, "wheelhouse": wheels["wheelhouse"], "nccl": nccl}


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> Iterator[dict]:
    """The lab's mirrors, and its checkpoint from its olah on loopback (the builds here carry it)."""
    found = lab_sources()
    if found is None:
        pytest.skip("the lab's mirrors are not built or lack the pins (make lab-build)")
    hf = lab_hf_or_skip()
    with running_olah(hf, tmp_path_factory.mktemp("olah") / "run") as endpoint:
        yield {**found, "hf": hf, "hf_endpoint": endpoint}


def write_inventory(directory: Path, sources: dict, **changes) -> Path:
    """Two nodes nobody can reach and the small pin set; `changes` override group_vars/all."""
    values = {
        "kimi_bundle_inventory_name": "bundle-test",
        "kimi_bundle_distribution": "debian-12",
        "kimi_bundle_codename": "bookworm",
        "vllm_python_version": LAB_VARS["vllm_python_version"],
        "vllm_platforms": LAB_VARS["vllm_platforms"],
        "kimi_monitoring_enabled": False,
        # What the converge would install unpinned, kept to one small package (the real lists pull in gcc).
        "vllm_os_packages": ["acl"],
        "checkpoint_os_packages": [],
        "kimi_bundle_apt_packages": ["acl"],
        "kimi_vllm_pip_pins": {SMALL: wheel_versions(sources["wheelhouse"], SMALL)[-1], NCCL: sources["nccl"][0]},
        # The lab's checkpoint, all but its README (the patterns are the role's).
        "kimi_bundle_checkpoint": True,
        "kimi_checkpoint_repo_id": sources["hf"]["repo_id"],
        "kimi_checkpoint_revision": sources["hf"]["revision"],
        "kimi_checkpoint_include": [],
        "kimi_checkpoint_exclude": ["README.md"],
        **changes,
    }
    (directory / "group_vars" / "all").mkdir(parents=True, exist_ok=True)
    hosts = {"kimi_nodes": {"hosts": {"node1": NOWHERE, "node2": NOWHERE}}}
    (directory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    (directory / "group_vars" / "all" / "bundle.yml").write_text(yaml.safe_dump(values))
    return directory


def kimi_bundle(*arguments: str | Path, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(KIMI_BUNDLE), *map(str, arguments)],
        env=environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def environment() -> dict[str, str]:
    return {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"),
        "ANSIBLE_HOME": str(REPO_ROOT / ".ansible"),
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }


def source_flags(sources: dict) -> list[str]:
    apt = sources["apt"]
    flags = [f"--apt-source=[trusted=yes] file:{apt[name]} ./" for name in ("nvidia", "debian")]
    return [*flags, f"--pip-find-links={sources['wheelhouse']}", f"--hf-endpoint={sources['hf_endpoint']}"]


def build(inventory: Path, out: Path, gnupg: Path, sources: dict) -> subprocess.CompletedProcess:
    return kimi_bundle("build", "-i", inventory, "-o", out, "--gnupg-home", gnupg, "--json", *source_flags(sources))


@pytest.fixture(scope="module")
def inventory(tmp_path_factory, sources) -> Path:
    return write_inventory(tmp_path_factory.mktemp("inventory"), sources)


@pytest.fixture(scope="module")
def gnupg(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("gnupg")


@pytest.fixture(scope="module")
def built(tmp_path_factory, inventory, gnupg, sources) -> tuple[Path, dict]:
    """One build from empty, shared: tests that change the bundle work on a copy."""
    out = tmp_path_factory.mktemp("first") / "bundle"
    result = build(inventory, out, gnupg, sources)
    assert result.returncode == 0, result.stderr
    return out, json.loads(result.stdout)


def copy_bundle(bundle: Path, target: Path) -> Path:
    """A copy made of hard links (seconds, no space): a test that changes a file breaks its link first."""
    shutil.copytree(bundle, target, copy_function=os.link)
    return target


def flip_one_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-10] ^= 1
    path.unlink()  # the copy's hard link: the shared bundle keeps its bytes
    path.write_bytes(bytes(data))


# --------------------------------------------------------------------------------------- the inventory


def test_the_inputs_are_role_defaults_under_the_inventorys_values_and_no_node_is_contacted(inventory, tmp_path):
    result = kimi_bundle("inputs", "-i", inventory)
    assert result.returncode == 0, result.stderr
    inputs = json.loads(result.stdout)
    # The firewall role's pin and the checkpoint role's hf CLI are their defaults; Python is the inventory's
    # (the vllm role's default is another); monitoring is off, so none of its pins.
    assert inputs["apt_pins"] == {
        "cuda-toolkit-13-3": KIMI_DEFAULTS["kimi_cuda_toolkit_version"],
        "libnccl-dev": NCCL_DEB,
        "libnccl2": NCCL_DEB,
        "nftables": NFTABLES,
    }
    assert (inputs["hf_version"], inputs["python_version"], inputs["apt_packages"]) == (HF_VERSION, "3.11", ["acl"])

    played = run_playbook(PLAYBOOK, inventory, extravars={"kimi_bundle_inputs_file": str(tmp_path / "inputs.json")})
    assert played.rc == 0 and not played.unreachable_hosts, played.failure_messages()
    ran = [event["event_data"] for event in played.events if event["event"] == "runner_on_ok"]
    assert {data.get("role") or "" for data in ran} == {""}, "a task of one of the roles ran"
    assert {data["task"] for data in ran} == {task["name"] for task in yaml.safe_load(PLAYBOOK.read_text())[0]["tasks"]}
    assert sorted(json.loads((tmp_path / "inputs.json").read_text())["hosts"]) == ["node1", "node2"]


def test_nodes_resolving_different_pins_are_refused_naming_the_variable(sources, tmp_path):
    inventory = write_inventory(tmp_path / "inventory", sources)
    (inventory / "host_vars").mkdir()
    (inventory / "host_vars" / "node2.yml").write_text(yaml.safe_dump({"kimi_libnccl2_version": "2.30.8-1+cuda13.3"}))
    result = kimi_bundle("inputs", "-i", inventory)
    assert result.returncode == 2
    assert result.stderr.startswith("kimi-bundle: error: kimi_deb_pins differs between nodes (node1: {")
    assert "node2: {" in result.stderr and result.stderr.count("\n") == 1


def test_a_package_the_converge_installs_but_the_bundle_would_lack_is_named(sources, tmp_path):
    inventory = write_inventory(tmp_path / "inventory", sources, vllm_os_packages=["acl", "libnuma1"])
    result = kimi_bundle("inputs", "-i", inventory)
    assert result.returncode == 2
    assert "kimi_bundle_apt_packages lacks libnuma1, which the converge installs" in result.stderr


# ------------------------------------------------------------------------------------------ the build


def test_a_build_is_the_signed_closure_of_the_pins_and_verifies(built, gnupg):
    out, summary = built
    names = ["advisories", "apt", "hf", "kimi-bundle.json", "kimi-bundle.json.asc", "wheels"]
    assert sorted(path.name for path in out.iterdir()) == names
    assert not out.with_name(out.name + ".partial").exists()
    steps = summary["steps"]
    assert summary["reused"] == 0
    assert summary["fetched"] == steps["apt"]["files"] + steps["wheels"]["files"] + steps["hf"]["files"]
    assert summary["fetched_bytes"] > 0 and summary["bytes"] >= summary["fetched_bytes"]
    fingerprint = kimi_bundle("fingerprint", "--gnupg-home", gnupg).stdout.strip()
    assert summary["fingerprint"] == fingerprint

    verified = kimi_bundle("verify", out, "--fingerprint", fingerprint)
    assert verified.returncode == 0, verified.stdout
    assert verified.stdout.startswith(f"kimi-bundle: {out} verified: {summary['files']} files")
    assert "for inventory bundle-test (debian-12 bookworm amd64, Python 3.11)" in verified.stdout


def test_a_byte_flipped_in_one_deb_is_named(built, tmp_path):
    out, summary = built
    bundle = copy_bundle(out, tmp_path / "bundle")
    libnccl = next((bundle / "apt").glob("libnccl2_*.deb"))
    flip_one_byte(libnccl)
    result = kimi_bundle("verify", bundle, "--fingerprint", summary["fingerprint"])
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0] == f"kimi-bundle: {bundle}: 1 problem(s), do not use it:"
    assert lines[1].startswith(f"apt/{libnccl.name}: sha256 ") and len(lines) == 2


def test_the_checkpoint_is_the_hubs_files_and_a_changed_shard_is_named(built, sources, tmp_path):
    out, summary = built
    hf = sources["hf"]
    carried = {name: size for name, size in hf["files"].items() if name != "README.md"}
    assert summary["steps"]["hf"]["files"] == len(carried)
    resolve = out / "hf" / hf["repo_id"] / "resolve" / hf["revision"]
    assert {path.name: path.stat().st_size for path in resolve.iterdir()} == carried
    bundle = copy_bundle(out, tmp_path / "bundle")
    flip_one_byte(bundle / resolve.relative_to(out) / "model.safetensors")
    result = kimi_bundle("verify", bundle, "--fingerprint", summary["fingerprint"])
    assert result.returncode == 1
    shard = f"hf/{hf['repo_id']}/resolve/{hf['revision']}/model.safetensors"
    assert result.stdout.splitlines()[1].startswith(f"{shard}: sha256 "), result.stdout


def test_a_bundle_signed_by_another_key_is_refused(built):
    out, summary = built
    other = "0123456789ABCDEF0123456789ABCDEF01234567"
    result = kimi_bundle("verify", out, "--fingerprint", other)
    assert result.returncode == 1
    assert f"is signed by {summary['fingerprint']}, not by the pinned key {other}" in result.stdout


def test_a_bundle_built_for_another_pin_is_named_with_the_variable(built, sources, tmp_path):
    out, summary = built
    old, new = sources["nccl"][0], sources["nccl"][1]
    pins = {SMALL: wheel_versions(sources["wheelhouse"], SMALL)[-1], NCCL: new}
    inventory = write_inventory(tmp_path / "inventory", sources, kimi_vllm_pip_pins=pins)
    result = kimi_bundle("verify", out, "--fingerprint", summary["fingerprint"], "-i", inventory)
    assert result.returncode == 1
    assert result.stdout.splitlines()[1:] == [
        f"pip package {NCCL} (kimi_vllm_pip_pins): the bundle has {old}, the inventory pins {new}"
    ]


def test_a_rebuild_reuses_everything_and_fetches_nothing(built, inventory, gnupg, sources, tmp_path):
    out, first = built
    bundle = copy_bundle(out, tmp_path / "bundle")
    result = build(inventory, bundle, gnupg, sources)
    assert result.returncode == 0, result.stderr
    again = json.loads(result.stdout)
    assert (again["fetched"], again["fetched_bytes"]) == (0, 0)
    assert again["reused"] == first["fetched"] and again["reused_bytes"] == first["fetched_bytes"]
    assert (again["fingerprint"], again["files"], again["bytes"]) == (
        first["fingerprint"],
        first["files"],
        first["bytes"],
    )
    assert kimi_bundle("verify", bundle, "--fingerprint", again["fingerprint"]).returncode == 0


def test_an_interrupted_build_leaves_no_bundle_and_resumes_without_fetching_the_debs_again(
    inventory, gnupg, sources, tmp_path
):
    out = tmp_path / "bundle"
    command = [sys.executable, str(KIMI_BUNDLE), "build", "-i", str(inventory), "-o", str(out)]
    command += ["--gnupg-home", str(gnupg), *source_flags(sources)]
    with subprocess.Popen(command, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as run:
        for line in run.stdout:
            if line.startswith("kimi-bundle: apt: "):
                run.send_signal(signal.SIGINT)  # as Ctrl-C, while the wheels step runs
                break
        _, stderr = run.communicate(timeout=300)
    assert run.returncode == 130, stderr
    assert "interrupted (a build resumes from <OUT>.partial on the next run)" in stderr
    assert not out.exists() and (tmp_path / "bundle.partial" / "bundle" / "apt").is_dir()
    assert kimi_bundle("verify", out, "--fingerprint", "A" * 40).returncode == 1

    result = build(inventory, out, gnupg, sources)
    assert result.returncode == 0, result.stderr
    resumed = json.loads(result.stdout)
    assert resumed["steps"]["apt"]["fetched"] == 0 and resumed["steps"]["apt"]["reused"] > 0
    assert not (tmp_path / "bundle.partial").exists()
    assert kimi_bundle("verify", out, "--fingerprint", resumed["fingerprint"]).returncode == 0
