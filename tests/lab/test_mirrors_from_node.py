"""The lab's mirrors, used from a node exactly as the roles will use them: apt, pip with no index, hf."""

from __future__ import annotations

import shlex

import pytest
import yaml

from tests.ansible_run import REPO_ROOT

pytestmark = pytest.mark.lab

GENERATED = REPO_ROOT / "inventories" / "lab" / "group_vars" / "all" / "generated.yml"
READ_NCCL_VERSION = (
    "import ctypes; lib = ctypes.CDLL('libnccl.so.2'); v = ctypes.c_int(); "
    "assert lib.ncclGetVersion(ctypes.byref(v)) == 0; print(v.value)"
)


def on_node(lab, node: str, script: str, timeout: float = 600) -> str:
    """Run a shell script on a node; fail the test with its output when it fails."""
    proc = lab.ssh(node, f"bash -c {shlex.quote('set -euo pipefail; ' + script)}", timeout=timeout)
    assert proc.returncode == 0, f"on {node}: {script}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout.strip()


@pytest.fixture
def mirrors(lab):
    return yaml.safe_load(GENERATED.read_text())


def test_apt_installs_a_pinned_libnccl2_that_reports_its_version(lab, mirrors):
    source = f"deb [trusted=yes] {mirrors['lab_apt_nvidia_url']} ./"
    try:
        on_node(lab, "node1", f"echo '{source}' > /etc/apt/sources.list.d/test-nvidia.list && apt-get update -qq")
        on_node(lab, "node1", "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libnccl2=2.30.7-1+cuda13.3")
        assert on_node(lab, "node1", "dpkg-query -W -f='${Version}' libnccl2") == "2.30.7-1+cuda13.3"
        # The placeholder carries a real shared library: its ncclGetVersion answers the package's version code.
        assert on_node(lab, "node1", f'python3 -c "{READ_NCCL_VERSION}"') == "23007"
        versions = on_node(lab, "node1", "apt-cache madison libnccl2 | awk '{print $3}'").split()
        assert "2.30.7-1+cuda13.3" in versions and len(versions) >= 2, "the mirror needs another version for skew tests"
    finally:
        on_node(
            lab,
            "node1",
            "DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq libnccl2 || true; "
            "rm -f /etc/apt/sources.list.d/test-nvidia.list",
        )


def test_pip_installs_from_the_wheelhouse_with_no_index_and_hf_downloads_the_checkpoint(lab, mirrors):
    venv = "/tmp/test-hf-venv"
    target = "/data/test-download"
    try:
        # python3-venv comes from the lab's Debian mirror (the node's only apt source).
        on_node(lab, "node2", "apt-get update -qq")
        on_node(lab, "node2", "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv")
        on_node(
            lab,
            "node2",
            # Plain HTTP on the lab bridge: pip must be told to trust the mirror's host.
            f"python3 -m venv {venv} && {venv}/bin/pip install -q --no-index --trusted-host 198.18.0.1 "
            f"--find-links {mirrors['lab_pip_find_links']} huggingface_hub==2.4.0",
        )
        on_node(
            lab,
            "node2",
            f"HF_ENDPOINT={mirrors['lab_hf_endpoint']} HF_HUB_DISABLE_TELEMETRY=1 {venv}/bin/hf download "
            f"{mirrors['lab_checkpoint_repo_id']} --revision {mirrors['lab_checkpoint_revision']} "
            f"--local-dir {target}",
        )
        listing = on_node(lab, "node2", f"cd {target} && find . -type f -not -path './.cache/*' -printf '%P %s\\n'")
        sizes = {name: int(size) for name, size in (line.split() for line in listing.splitlines())}
        assert sum(sizes.values()) == mirrors["lab_checkpoint_total_bytes"]
        assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(sizes)
    finally:
        on_node(lab, "node2", f"rm -rf {venv} {target}")
