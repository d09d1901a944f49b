"""An air-gapped lab (issue #16): the nodes reach nothing but node1's offline mirror, which serves the bundle
`make bundle` built, and site.yml converges from it, verify included; a second run changes nothing.

It reuses the session's converge (`serving`), then takes away what a converge downloads, so that the offline run
must fetch it again from the bundle: the system NCCL debs (apt), the NCCL wheel in vLLM's venv (pip) and two files
of the checkpoint on each node (the bundle carries it: inventories/lab-offline sets kimi_bundle_checkpoint, and
node1 fetches them from its mirror and node2 from node1, download once per site). The air gap is `lab/lab airgap
on` (the nodes open no connection to the host) and each node's apt sources on the host are moved away, as an
air-gapped site has none: a fetch from the host's mirrors fails, and the only apt source left on a node is the
offline mirror.

The nodes keep the offline sources afterwards, so the next converge of the lab starts again (`converged = None`).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import time

import pytest

from tests.ansible_run import REPO_ROOT, run_playbook
from tests.lab_api import fetch_status, generates_a_token

# Tier 2 (tests/tiers.py, group lab-airgap; `make lab-airgap-test` runs it alone): make test-all, and CI while its
# time allows.
pytestmark = [pytest.mark.lab, pytest.mark.tier2("lab-airgap")]

SITE = REPO_ROOT / "site.yml"
LAB_INVENTORY = REPO_ROOT / "inventories" / "lab"
OFFLINE_INVENTORY = REPO_ROOT / "inventories" / "lab-offline"
# make bundle's defaults (Makefile: BUNDLE_OUT, BUNDLE_GNUPG), kept between runs: a rebuild reuses every file.
BUNDLE = REPO_ROOT / ".cache" / "bundle" / "lab"
GNUPG = REPO_ROOT / ".cache" / "bundle-gnupg"
# Where the bundle is carried in on node1 (inventories/lab-offline: offline_mirror_bundle_path).
CARRIED = "/var/tmp/kimi-bundle"
MIRROR = "http://198.18.0.11:8081/"
NODES = ("node1", "node2")
# What the offline converge must fetch again: the system NCCL debs, and the NCCL wheel vLLM loads.
DROPPED_DEBS = ("libnccl-dev", "libnccl2")
DROPPED_WHEEL = "nvidia-nccl-cu13"
# Their pin in the lab inventory (kimi_libnccl2_version), held again by the converge.
NCCL_PIN = "2.30.7-1+cuda13.3"
# The nodes' apt sources that point at the host: the lab's Debian mirror, and NVIDIA's (the converge points that one
# at the offline mirror, but until then every apt update would wait on it). Put aside, and the Debian one put back.
LAB_DEBIAN_SOURCE = "/etc/apt/sources.list.d/lab-debian.list"
NVIDIA_SOURCE = "/etc/apt/sources.list.d/nvidia-cuda.sources"
PUT_ASIDE = "/root/offline-test"
# The checkpoint's files taken away on every node (the weights and a small one), and the mirror's access log that
# shows who fetched them (Debian's nginx.conf logs there).
CHECKPOINT_DIR = "/data/models/lab-mini"
DROPPED_CHECKPOINT_FILES = ("model.safetensors", "config.json")
MIRROR_ACCESS_LOG = "/var/log/nginx/access.log"
# node1's peer server's log (roles/checkpoint: it serves node2 the checkpoint it fetched from its mirror).
PEER_ACCESS_LOG = "/var/lib/kimi-checkpoint/peer/access.log"
NODE_ADDRESSES = {"node1": "198.18.0.11", "node2": "198.18.0.12"}


def timed(what: str, run):
    started = time.monotonic()
    result = run()
    print(f"offline: {what} in {time.monotonic() - started:.1f} s")
    return result


def run_site(fingerprint: str, skip_tags: str | None = None):
    return timed(
        f"site.yml from the bundle (skipping {skip_tags})",
        lambda: run_playbook(
            SITE,
            LAB_INVENTORY,
            more_inventories=[OFFLINE_INVENTORY],
            extravars={"offline_mirror_fingerprint": fingerprint},
            skip_tags=skip_tags,
        ),
    )


def build_bundle() -> str:
    """make bundle (a rebuild of an unchanged bundle fetches nothing), then the fingerprint receivers pin."""
    build = subprocess.run(["make", "--no-print-directory", "bundle"], cwd=REPO_ROOT, capture_output=True, text=True)
    assert build.returncode == 0, build.stdout + build.stderr
    printed = subprocess.run(
        [str(REPO_ROOT / "bin" / "kimi-bundle"), "fingerprint", "--gnupg-home", str(GNUPG)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return re.search(r"[0-9A-F]{40}", printed).group(0)


def carry_in(lab) -> None:
    """The operator's disk: the bundle's tree copied to node1 as it is (tar over the lab's SSH)."""
    unpack = f"rm -rf {CARRIED} && mkdir -p {CARRIED} && tar -C {CARRIED} -xf -"
    with subprocess.Popen(["tar", "-C", str(BUNDLE), "-cf", "-", "."], stdout=subprocess.PIPE) as pack:
        copy = subprocess.run([*lab.command, "ssh", "node1", unpack], stdin=pack.stdout, capture_output=True)
    assert pack.returncode == 0 and copy.returncode == 0, copy.stderr


def vllm_python(lab, node: str) -> str:
    """The interpreter of the vLLM venv the serving unit runs (through the venv's own link, so pip is the venv's)."""
    python = "/opt/vllm/current/bin/python"
    assert lab.ssh(node, f"test -x {python}").returncode == 0, f"no vLLM venv on {node}"
    return python


def take_away_what_the_converge_fetches(lab) -> None:
    for node in NODES:
        purge = f"apt-get purge -y --allow-change-held-packages {' '.join(DROPPED_DEBS)}"
        assert lab.ssh(node, f"DEBIAN_FRONTEND=noninteractive {purge}", timeout=120).returncode == 0
        pip = f"{vllm_python(lab, node)} -m pip uninstall -y {DROPPED_WHEEL}"
        assert lab.ssh(node, pip, timeout=120).returncode == 0
        files = " ".join(f"{CHECKPOINT_DIR}/{name}" for name in DROPPED_CHECKPOINT_FILES)
        assert lab.ssh(node, f"rm -f {files}").returncode == 0


def bundled_checkpoint() -> dict[str, str]:
    """{file name: sha256} of the dropped checkpoint files, as the bundle's manifest lists them."""
    manifest = json.loads((BUNDLE / "kimi-bundle.json").read_text())
    checkpoint = manifest["built_for"]["checkpoint"]
    assert checkpoint, "the lab's bundle does not carry the checkpoint (inventories/lab-offline)"
    base = f"hf/{checkpoint['repo_id']}/resolve/{checkpoint['revision']}/"
    listed = {
        entry["path"][len(base) :]: entry["sha256"] for entry in manifest["files"] if entry["path"].startswith(base)
    }
    return {name: listed[name] for name in DROPPED_CHECKPOINT_FILES}


def apt_and_pip_sources(lab, node: str) -> str:
    """Every apt source and pip setting on the node, one line each."""
    listing = "grep -rhE '^(deb|URIs:)' /etc/apt/sources.list.d/ /etc/apt/sources.list 2>/dev/null; true"
    return lab.ssh(node, listing).stdout


@pytest.fixture
def airgapped(serving):
    """The converged lab cut off from the host, node1 holding the carried-in bundle; the fingerprint to pin."""
    fingerprint = timed("make bundle", build_bundle)
    timed("carrying the bundle in", lambda: carry_in(serving))
    take_away_what_the_converge_fetches(serving)
    for node in NODES:
        put_aside = f"mkdir -p {PUT_ASIDE} && mv {LAB_DEBIAN_SOURCE} {NVIDIA_SOURCE} {PUT_ASIDE}/"
        assert serving.ssh(node, put_aside).returncode == 0
    try:
        assert serving.run("airgap", "on").returncode == 0
        yield fingerprint
    finally:
        serving.run("airgap", "off")
        for node in NODES:
            serving.ssh(node, f"mv {PUT_ASIDE}/lab-debian.list {LAB_DEBIAN_SOURCE}; rm -rf {PUT_ASIDE}")
        # The nodes now install from node1's mirror: the next test that needs the lab's own converge makes it.
        serving.converged = None


def test_site_converges_from_the_bundle_with_no_route_but_the_mirror_and_a_second_run_changes_nothing(
    airgapped, lab_controller
):
    lab = lab_controller
    host_mirror = lab.status()["mirrors"]["apt_debian"] + "/Release"
    for node in NODES:
        assert lab.ssh(node, fetch_status(host_mirror)).returncode != 0, f"{node} still reaches {host_mirror}"

    first = run_site(airgapped)
    assert first.rc == 0, first.failure_messages()
    assert first.changed > 0, "the offline converge put nothing back"
    assert generates_a_token(), "the offline converge left no serving group"

    for node in NODES:
        # Everything a node installs from is the mirror on node1: one apt source, the wheels with no index.
        sources = apt_and_pip_sources(lab, node).split()
        assert [value for value in sources if value.startswith("http")] == [f"{MIRROR}apt/"], sources
        assert lab.ssh(node, fetch_status(f"{MIRROR}kimi-bundle.json")).stdout == "200"
        assert lab.ssh(node, fetch_status(host_mirror)).returncode != 0, f"{node} reaches {host_mirror}"
        # The dropped packages are back, at their pins, from the mirror.
        policy = lab.ssh(node, f"apt-cache policy {shlex.join(DROPPED_DEBS)}").stdout
        assert policy.count(f"{MIRROR}apt ./") >= len(DROPPED_DEBS), policy
        query = f"dpkg-query -W -f='${{Package}}=${{Version}} ${{Status}}\\n' {shlex.join(DROPPED_DEBS)}"
        installed = sorted(lab.ssh(node, query).stdout.splitlines())
        assert installed == [f"{deb}={NCCL_PIN} hold ok installed" for deb in DROPPED_DEBS], installed
        shown = lab.ssh(node, f"{vllm_python(lab, node)} -m pip show {DROPPED_WHEEL}")
        assert shown.returncode == 0, f"{DROPPED_WHEEL} is not back in {node}'s vLLM venv"
        # The checkpoint's files are back, the bundle's bytes: node1 (the seed: neither node held the checkpoint)
        # fetched them from its mirror, node2 from node1's peer server and not from the mirror (download once per
        # site, docs/checkpoint.md).
        for name, sha256 in bundled_checkpoint().items():
            summed = lab.ssh(node, f"sha256sum {CHECKPOINT_DIR}/{name}").stdout.split()
            assert summed[:1] == [sha256], f"{node}: {name} {summed}"
            fetched = f"grep -c '^{NODE_ADDRESSES[node]} .*\"GET /hf/.*/resolve/[0-9a-f]*/{name} HTTP/1.1\" 200 ' "
            from_mirror = int(lab.ssh("node1", fetched + MIRROR_ACCESS_LOG).stdout.strip() or 0)
            assert (from_mirror >= 1) == (node == "node1"), f"{node}: {name} from the mirror {from_mirror} time(s)"
            if node == "node2":
                peer = f"grep -c '^{NODE_ADDRESSES[node]} .*\"GET /{name} HTTP/1.1\" 200 ' {PEER_ACCESS_LOG}"
                assert int(lab.ssh("node1", peer).stdout.strip() or 0) >= 1, f"{node}: {name} not from node1"

    # Every phase that changes a node runs again; verify (which changes nothing, and passed above) is left out.
    second = run_site(airgapped, skip_tags="verify")
    assert second.rc == 0, second.failure_messages()
    assert second.changed == 0, second.stats.get("changed")
