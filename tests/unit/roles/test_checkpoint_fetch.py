"""roles/checkpoint/files/kimi-checkpoint-fetch.py: the program that fetches an air-gapped bundle's checkpoint files
from the offline mirror as plain files, against a loopback server that serves byte ranges as nginx does (or not)."""

from __future__ import annotations

import http.server
import importlib.util
import json
import threading
from typing import ClassVar

import pytest

from tests import paths

PROGRAM = paths.REPO_ROOT / "roles" / "checkpoint" / "files" / "kimi-checkpoint-fetch.py"
DATA = bytes(range(256)) * 4096  # 1 MiB


def load_program():
    spec = importlib.util.spec_from_file_location("kimi_checkpoint_fetch", PROGRAM)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fetch = load_program()


class Mirror(http.server.BaseHTTPRequestHandler):
    """Serves DATA at /hf/<anything>; a 404 for /missing; honours `Range: bytes=N-` unless ranges are off."""

    ranges = True
    requests: ClassVar[list[str]] = []

    def do_GET(self):
        type(self).requests.append(self.headers.get("Range") or "")
        if not self.path.startswith("/hf/"):
            self.send_error(404)
            return
        start = 0
        asked = self.headers.get("Range")
        if asked and type(self).ranges:
            start = int(asked.removeprefix("bytes=").rstrip("-"))
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(DATA) - 1}/{len(DATA)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(DATA) - start))
        self.end_headers()
        self.wfile.write(DATA[start:])

    def log_message(self, *args):
        pass


@pytest.fixture
def mirror():
    Mirror.ranges, Mirror.requests = True, []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Mirror)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def test_a_missing_file_is_fetched_and_renamed_into_place(mirror, tmp_path):
    assert fetch.fetch(f"{mirror}/hf/r/resolve/s/model.bin", tmp_path, "sub/model.bin", len(DATA)) is True
    assert (tmp_path / "sub" / "model.bin").read_bytes() == DATA
    assert not fetch.partial_path(tmp_path, "sub/model.bin").exists()


def test_a_file_there_at_its_size_is_not_asked_for(mirror, tmp_path):
    (tmp_path / "model.bin").write_bytes(DATA)
    assert fetch.fetch(f"{mirror}/hf/x", tmp_path, "model.bin", len(DATA)) is False
    assert Mirror.requests == []


def test_a_cut_file_is_continued_with_a_range_request(mirror, tmp_path):
    partial = fetch.partial_path(tmp_path, "model.bin")
    partial.parent.mkdir(parents=True)
    partial.write_bytes(DATA[:1000])
    fetch.fetch(f"{mirror}/hf/x", tmp_path, "model.bin", len(DATA))
    assert Mirror.requests == ["bytes=1000-"]
    assert (tmp_path / "model.bin").read_bytes() == DATA


def test_a_server_that_ignores_the_range_starts_the_file_again(mirror, tmp_path):
    Mirror.ranges = False
    partial = fetch.partial_path(tmp_path, "model.bin")
    partial.parent.mkdir(parents=True)
    partial.write_bytes(b"x" * 1000)
    fetch.fetch(f"{mirror}/hf/x", tmp_path, "model.bin", len(DATA))
    assert (tmp_path / "model.bin").read_bytes() == DATA


def test_the_partial_file_is_where_the_roles_progress_counts(tmp_path):
    """kimi_checkpoint_node.partial_bytes counts hf's in-flight files: the same place, the same suffix."""
    from ansible_collections.kimi.k2.plugins.module_utils.kimi_checkpoint_node import HF_PARTIAL_DIR

    assert fetch.partial_path(tmp_path, "a/b.bin") == tmp_path / HF_PARTIAL_DIR / "a" / "b.bin.incomplete"


@pytest.mark.parametrize(
    ("path", "size", "words"),
    [
        ("/missing", len(DATA), "answered 404"),
        ("/hf/x", len(DATA) - 1, "sent more than the listed"),
        ("/hf/x", len(DATA) + 5, f"gave {len(DATA)} bytes, the manifest lists {len(DATA) + 5}"),
    ],
)
def test_a_file_it_cannot_get_at_its_size_is_named(mirror, tmp_path, monkeypatch, path, size, words):
    monkeypatch.setattr(fetch, "RETRY_SECONDS", 0)
    with pytest.raises(fetch.FetchError) as raised:
        fetch.fetch(f"{mirror}{path}", tmp_path, "model.bin", size)
    assert words in str(raised.value)
    assert not (tmp_path / "model.bin").exists()


def test_the_program_fetches_its_list_and_says_how_many(mirror, tmp_path, capsys):
    listed = tmp_path / "list.json"
    listed.write_text(json.dumps([{"url": f"{mirror}/hf/{n}", "path": n, "size": len(DATA)} for n in ("a", "b")]))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "a").write_bytes(DATA)
    assert fetch.main(["fetch", str(listed), str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.strip() == "fetched 1 of 2 files"
    assert (tmp_path / "out" / "b").read_bytes() == DATA


def test_a_failure_ends_with_an_error_line_the_role_shows(mirror, tmp_path, capsys):
    from ansible_collections.kimi.k2.plugins.module_utils.kimi_checkpoint import error_line

    listed = tmp_path / "list.json"
    listed.write_text(json.dumps([{"url": f"{mirror}/missing", "path": "a", "size": 1}]))
    assert fetch.main(["fetch", str(listed), str(tmp_path)]) == 1
    assert error_line(capsys.readouterr().out.splitlines()).startswith("Error: ")
