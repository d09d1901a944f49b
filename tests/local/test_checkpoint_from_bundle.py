"""The checkpoint role fetching an air-gapped bundle's checkpoint from the offline mirror as plain files
(docs/air-gapped.md, "The checkpoint from the bundle"), run for real through ansible-runner on this host (local
connection) against a loopback server that serves a bundle's directory as the offline mirror's nginx does.

No hf CLI and no Hub protocol: the role lists the files from the served manifest (kimi_bundle_checkpoint_files),
fetches them with the role's own program, verifies each against the manifest's sha256 and writes the marker; a
second run changes nothing; a served file whose bytes are not the manifest's is named and leaves no marker.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import os
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_checkpoint as kc
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_inputs as kbi
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_manifest as kbm
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_tree as kbt

from tests.ansible_run import REPO_ROOT, run_playbook

PLAYBOOK = REPO_ROOT / "playbooks" / "checkpoint.yml"
REPO = "kimi-lab/Kimi-K2-mini"
SHA = "99345edaba174721c2b71c311d774f10cd643c56"
FILES = {
    "config.json": b'{"model_type": "kimi_k2"}\n',
    "model-00001-of-00002.safetensors": os.urandom(300_000),
    "model-00002-of-00002.safetensors": os.urandom(200_000),
    "tokenizer/tokenizer.json": b"{}" * 1000,
}
VARIABLES = {
    "kimi_bundle_inventory_name": "bundle-test",
    "kimi_bundle_distribution": "debian-12",
    "kimi_bundle_codename": "bookworm",
    "vllm_python_version": "3.11",
    "vllm_platforms": ["manylinux_2_36_x86_64"],
    "kimi_deb_pins": {"nginx-light": "1.22.1-9+deb12u12"},
    "kimi_vllm_pip_pins": {"vllm": "0.33.0"},
    "kimi_bundle_checkpoint": True,
    "kimi_checkpoint_repo_id": REPO,
    "kimi_checkpoint_revision": SHA,
}
MARKER = ".kimi-checkpoint.json"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the role sets ownership: run as root")


def write_bundle(root: Path) -> None:
    """A bundle's directory as bin/kimi-bundle lays it out: the checkpoint's files under hf/, and the manifest."""
    prefix = root / kc.files_prefix(REPO, SHA)
    for name, data in FILES.items():
        (prefix / name).parent.mkdir(parents=True, exist_ok=True)
        (prefix / name).write_bytes(data)
    document = kbm.manifest_document(
        kbi.inputs_from_variables(VARIABLES), kbt.manifest_entries(root), datetime(2026, 12, 5, tzinfo=UTC)
    )
    (root / kbt.MANIFEST_NAME).write_text(kbt.manifest_text(document))


class Files(http.server.SimpleHTTPRequestHandler):
    """Plain files, GET and HEAD, as the mirror's nginx serves the bundle; each GET's path is recorded."""

    def do_GET(self):
        type(self).asked.append(self.path)
        super().do_GET()

    def log_message(self, *args):
        pass


@pytest.fixture
def mirror(tmp_path) -> Iterator[tuple[str, Path, type]]:
    root = tmp_path / "bundle"
    write_bundle(root)
    handler = type("Served", (Files,), {"asked": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/", root, handler
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def run(tmp_path, mirror):
    url, _, _ = mirror
    layout = {
        "ansible_connection": "local",
        "ansible_python_interpreter": str(REPO_ROOT / ".venv" / "bin" / "python"),
        "kimi_model": "lab-mini",
        "kimi_checkpoint_repo_id": REPO,
        "kimi_checkpoint_revision": SHA,
        "kimi_checkpoint_dir": str(tmp_path / "data" / "models" / "mini"),
        "checkpoint_state_dir": str(tmp_path / "state"),
        "checkpoint_hf_venv_root": str(tmp_path / "kimi-hf"),
        "checkpoint_python": "/usr/bin/python3",
        "checkpoint_os_packages": [],
        "checkpoint_margin_bytes": 1_000_000,
        "checkpoint_progress_interval": 1,
        "checkpoint_launcher": "nohup",
        # The mirror this collection does not run here: named by its URL, as an inventory may.
        "kimi_offline_mirror_url": url,
        "kimi_bundle_checkpoint": True,
        # Never asked: the bundle's checkpoint does not come from a Hub.
        "checkpoint_hf_endpoint": "http://127.0.0.1:9/",
    }
    inventory = tmp_path / "hosts.yml"
    data = {"all": {"children": {"kimi_nodes": {"hosts": {"n1": {}}, "vars": layout}}}}
    inventory.write_text(yaml.safe_dump(data, sort_keys=False))
    return lambda: run_playbook(PLAYBOOK, inventory, timeout=300)


def test_the_files_come_from_the_mirror_as_plain_files_checked_against_the_manifest(run, mirror, tmp_path):
    _, _, served = mirror
    first = run()
    assert first.rc == 0, first.failure_messages()
    directory = tmp_path / "data" / "models" / "mini"
    for name, data in FILES.items():
        assert hashlib.sha256((directory / name).read_bytes()).digest() == hashlib.sha256(data).digest(), name
    marker = json.loads((directory / MARKER).read_text())
    assert (marker["repo_id"], marker["revision"], marker["file_count"]) == (REPO, SHA, len(FILES))
    assert marker["total_bytes"] == sum(map(len, FILES.values()))
    # The manifest, then each file once at its plain URL; no Hub API, no hf CLI installed.
    files = sorted(path for path in served.asked if path.startswith("/hf/"))
    assert files == sorted(f"/{kc.files_prefix(REPO, SHA)}{name}" for name in FILES)
    assert "/kimi-bundle.json" in served.asked
    assert not (tmp_path / "kimi-hf").exists()

    served.asked.clear()
    second = run()
    assert second.rc == 0 and second.changed == 0, second.stats
    assert [path for path in served.asked if path.startswith("/hf/")] == []


def test_a_served_file_that_is_not_the_manifests_is_named_and_no_marker_is_written(run, mirror, tmp_path):
    _, root, _ = mirror
    shard = root / kc.files_prefix(REPO, SHA) / "model-00002-of-00002.safetensors"
    flipped = bytearray(shard.read_bytes())
    flipped[1000] ^= 0xFF
    shard.write_bytes(bytes(flipped))
    result = run()
    assert result.rc != 0
    messages = " ".join(result.failure_messages())
    assert "model-00002-of-00002.safetensors" in messages and "sha256" in messages, messages
    assert not (tmp_path / "data" / "models" / "mini" / MARKER).exists()
