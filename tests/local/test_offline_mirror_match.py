"""playbooks/offline_mirror.yml's check of the served bundle, on this host: the nodes' values, resolved from the
inventory as bin/kimi-bundle resolves them, against the manifest an offline mirror serves. A bundle built for them
passes without a change; one built for another pin set or another release is refused before anything is installed,
naming the node, the variable and both values, in check mode too; a mirror that does not answer is refused naming
its URL; and an inventory without kimi_offline_mirror_url runs no task at all.

The mirror is http.server on a loopback port serving a manifest written here (no files: what is compared is its
built_for, which bin/kimi-bundle inputs gives for this very inventory). The inventory sets kimi_offline_mirror_url
directly, so the playbook's first play (the mirror host's) matches no host and only the check runs. The two nodes
are this machine over a local connection, though the check runs everything on the controller.
"""

from __future__ import annotations

import functools
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_inputs as kbi
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_manifest as kbm
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_tree as kbt

from tests.ansible_run import REPO_ROOT, PlayResult, run_playbook
from tests.local.test_bundle_build import environment

# Tier 2 (tests/tiers.py, group local-bundle): make test-all, and CI while its time allows, or when its code changed.
pytestmark = pytest.mark.tier2("local-bundle")

PLAYBOOK = REPO_ROOT / "playbooks" / "offline_mirror.yml"
FETCH = "Fetch the manifest the offline mirror serves (from the controller)"
NO_MANIFEST = "Refuse to go on when the offline mirror serves no manifest"
MATCH = "Refuse a bundle built for other inputs than this node's (on the controller)"
NODES = ("node1", "node2")
LOCAL = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
# The release the inventory names (no default: an air-gapped inventory must say).
RELEASE = {"kimi_bundle_distribution": "debian-12", "kimi_bundle_codename": "bookworm"}


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Requests are not test output."""


@dataclass(frozen=True)
class Mirror:
    root: Path
    url: str

    def serve(self, built_for: dict[str, Any]) -> str:
        """Serve a manifest built for `built_for` (to_dict()'s form, its sha256 recomputed); its URL."""
        inputs = kbi.inputs_from_dict(built_for)
        document = kbm.manifest_document(inputs, [], datetime.now(UTC))
        (self.root / kbt.MANIFEST_NAME).write_text(kbt.manifest_text(document))
        return f"{self.url}{kbt.MANIFEST_NAME}"


@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mirror]:
    root = tmp_path_factory.mktemp("mirror")
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Mirror(root, f"http://127.0.0.1:{server.server_port}/")
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def write_inventory(directory: Path, **values: Any) -> Path:
    directory.mkdir(parents=True)
    nodes = {"kimi_nodes": {"hosts": dict.fromkeys(NODES)}}
    hosts = {"all": {"vars": {**LOCAL, **RELEASE, **values}, "children": nodes}}
    (directory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    return directory


@pytest.fixture(scope="module")
def inventory(tmp_path_factory: pytest.TempPathFactory, mirror: Mirror) -> Path:
    """The site's inventory: the roles' defaults, its release, and the mirror's URL set directly."""
    return write_inventory(tmp_path_factory.mktemp("inventory") / "site", kimi_offline_mirror_url=mirror.url)


@pytest.fixture(scope="module")
def built_for(inventory: Path) -> dict[str, Any]:
    """What bin/kimi-bundle build would record for this inventory, from the real command."""
    printed = subprocess.run(
        [sys.executable, str(REPO_ROOT / "bin" / "kimi-bundle"), "inputs", "-i", str(inventory)],
        env=environment(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert printed.returncode == 0, printed.stderr
    return json.loads(printed.stdout)


def other(built_for: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """built_for with some inputs changed (a copy)."""
    changed = json.loads(json.dumps(built_for))
    for key, value in changes.items():
        if isinstance(value, dict):
            changed[key].update(value)
        else:
            changed[key] = value
    return changed


def refusals(result: PlayResult, task: str) -> dict[str, str]:
    """Each refused node's message, after checking the run stopped at `task` with nothing changed."""
    assert result.rc != 0
    assert result.changed == 0, "something changed before the refusal"
    assert not result.unreachable_hosts
    assert {failure["task"] for failure in result.failures} == {task}
    return {failure["host"]: failure["msg"] for failure in result.failures}


def test_a_bundle_built_for_the_inventory_passes_without_a_change(inventory, mirror, built_for):
    mirror.serve(built_for)
    result = run_playbook(PLAYBOOK, inventory, timeout=300)
    assert result.rc == 0, result.failure_messages()
    assert result.changed == 0
    assert list(result.results_of(FETCH)) == ["node1"], "the manifest is fetched once for every node"
    matched = result.results_of(MATCH)
    assert sorted(matched) == list(NODES)
    for verdict in matched.values():
        assert verdict["differences"] == [] and verdict["inputs_sha256"] == built_for["inventory"]["sha256"]


def test_a_bundle_built_for_another_pin_set_is_refused_in_check_mode_too(inventory, mirror, built_for):
    vllm, nccl = built_for["pip_pins"]["vllm"], built_for["apt_pins"]["libnccl2"]
    bundle_vllm, bundle_nccl = "0.22.0", "2.29.7-1+cuda13.2"
    assert (bundle_vllm, bundle_nccl) != (vllm, nccl)
    url = mirror.serve(other(built_for, pip_pins={"vllm": bundle_vllm}, apt_pins={"libnccl2": bundle_nccl}))
    messages = refusals(run_playbook(PLAYBOOK, inventory, check=True, timeout=300), MATCH)
    assert sorted(messages) == list(NODES)
    for host, message in messages.items():
        assert message.startswith(f"{host}: the bundle at {url} was built for other inputs than this node's (2 ")
        assert f"apt package libnccl2 (kimi_deb_pins): the bundle has {bundle_nccl}, the inventory pins {nccl}" in (
            message
        )
        assert f"pip package vllm (kimi_vllm_pip_pins): the bundle has {bundle_vllm}, the inventory pins {vllm}" in (
            message
        )


def test_a_bundle_built_for_another_release_is_refused_naming_it(inventory, mirror, built_for):
    mirror.serve(other(built_for, distribution="debian-13", codename="trixie"))
    messages = refusals(run_playbook(PLAYBOOK, inventory, timeout=300), MATCH)
    assert sorted(messages) == list(NODES)
    for message in messages.values():
        assert "(2 differences)" in message
        assert (
            "distribution (kimi_bundle_distribution): the bundle has debian-13, the inventory wants debian-12; "
            "codename (kimi_bundle_codename): the bundle has trixie, the inventory wants bookworm." in message
        )


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_mirror_that_does_not_answer_is_refused_naming_its_url(inventory):
    url = f"http://127.0.0.1:{closed_port()}/"
    result = run_playbook(PLAYBOOK, inventory, extravars={"kimi_offline_mirror_url": url}, timeout=300)
    (message,) = refusals(result, NO_MANIFEST).values()
    assert message.startswith(f"{url}kimi-bundle.json did not answer with the bundle's manifest (Status code was -1")
    assert "Connection refused" in message
    assert "the offline mirror that kimi_offline_mirror_url names serves no bundle the controller can read" in message
    assert result.results_of(MATCH) == {}


def test_an_inventory_without_an_offline_mirror_runs_no_task(tmp_path):
    result = run_playbook(PLAYBOOK, write_inventory(tmp_path / "site"), timeout=120)
    assert result.rc == 0, result.failure_messages()
    ran = [event["event"] for event in result.events if event.get("event", "").startswith("runner_on_")]
    assert ran == []
