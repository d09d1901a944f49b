"""roles/checkpoint/files/kimi-checkpoint-fetch.py: the program that fetches the checkpoint's files as plain files,
from an air-gapped bundle's offline mirror or from the peers that hold it, against a loopback server that serves
byte ranges as nginx does (or not)."""

from __future__ import annotations

import hashlib
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
    assert fetch.fetch([f"{mirror}/hf/r/resolve/s/model.bin"], tmp_path, "sub/model.bin", len(DATA)) is True
    assert (tmp_path / "sub" / "model.bin").read_bytes() == DATA
    assert not fetch.partial_path(tmp_path, "sub/model.bin").exists()


def test_a_file_there_at_its_size_is_not_asked_for(mirror, tmp_path):
    (tmp_path / "model.bin").write_bytes(DATA)
    assert fetch.fetch([f"{mirror}/hf/x"], tmp_path, "model.bin", len(DATA)) is False
    assert Mirror.requests == []


def test_a_cut_file_is_continued_with_a_range_request(mirror, tmp_path):
    partial = fetch.partial_path(tmp_path, "model.bin")
    partial.parent.mkdir(parents=True)
    partial.write_bytes(DATA[:1000])
    fetch.fetch([f"{mirror}/hf/x"], tmp_path, "model.bin", len(DATA))
    assert Mirror.requests == ["bytes=1000-"]
    assert (tmp_path / "model.bin").read_bytes() == DATA


def test_a_server_that_ignores_the_range_starts_the_file_again(mirror, tmp_path):
    Mirror.ranges = False
    partial = fetch.partial_path(tmp_path, "model.bin")
    partial.parent.mkdir(parents=True)
    partial.write_bytes(b"x" * 1000)
    fetch.fetch([f"{mirror}/hf/x"], tmp_path, "model.bin", len(DATA))
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
        ("/hf/x", len(DATA) + 5, f"gave {len(DATA)} bytes, the list says {len(DATA) + 5}"),
    ],
)
def test_a_file_it_cannot_get_at_its_size_is_named(mirror, tmp_path, monkeypatch, path, size, words):
    monkeypatch.setattr(fetch, "RETRY_SECONDS", 0)
    with pytest.raises(fetch.FetchError) as raised:
        fetch.fetch([f"{mirror}{path}"], tmp_path, "model.bin", size)
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


# ------------------------------------------------------------------------- several sources (the peers)

SHA256 = hashlib.sha256(DATA).hexdigest()
BLOB_ID = hashlib.sha1(f"blob {len(DATA)}\0".encode() + DATA).hexdigest()


def test_a_source_that_cannot_give_the_file_is_left_for_the_next(mirror, tmp_path, monkeypatch):
    monkeypatch.setattr(fetch, "RETRY_SECONDS", 0)
    urls = ["http://127.0.0.1:9/hf/x", f"{mirror}/missing", f"{mirror}/hf/x"]
    assert fetch.fetch(urls, tmp_path, "model.bin", len(DATA), sha256=SHA256) is True
    assert (tmp_path / "model.bin").read_bytes() == DATA


@pytest.mark.parametrize("listed", [{"sha256": "0" * 64}, {"git_oid": "0" * 40}])
def test_a_corrupt_file_is_deleted_and_fetched_again_from_the_next_source(mirror, tmp_path, capsys, listed):
    """The first source's bytes do not match the list: the partial goes, the second source is asked from byte 0."""
    good = {"sha256": SHA256} if "sha256" in listed else {"git_oid": BLOB_ID}
    with pytest.raises(fetch.EverySourceFailedError) as raised:
        fetch.fetch([f"{mirror}/hf/a", f"{mirror}/hf/b"], tmp_path, "model.bin", len(DATA), **listed)
    kind = "sha256" if "sha256" in listed else "git blob id"
    assert str(raised.value).startswith("model.bin: every source failed: ")
    assert str(raised.value).count(f"its {kind} is not {'0' * (64 if 'sha256' in listed else 40)} (deleted)") == 2
    assert "trying the next source" in capsys.readouterr().out
    assert not fetch.partial_path(tmp_path, "model.bin").exists() and not (tmp_path / "model.bin").exists()
    Mirror.requests.clear()
    assert fetch.fetch([f"{mirror}/hf/a"], tmp_path, "model.bin", len(DATA), **good) is True
    assert Mirror.requests == [""]


def test_every_source_failing_ends_with_status_3_so_the_role_falls_back_to_the_hub(
    mirror, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(fetch, "RETRY_SECONDS", 0)
    listed = tmp_path / "list.json"
    item = {"urls": [f"{mirror}/missing", "http://127.0.0.1:9/x"], "path": "a", "size": len(DATA), "sha256": SHA256}
    other = {"urls": [f"{mirror}/hf/b"], "path": "b", "size": len(DATA), "sha256": SHA256}
    listed.write_text(json.dumps([item, other]))
    assert fetch.main(["fetch", str(listed), str(tmp_path)]) == 3
    out = capsys.readouterr().out
    assert "Error: a: every source failed: " in out and "answered 404" in out and "http://127.0.0.1:9/x" in out
    # The next file still came from its peer; only the failed one is listed for the Hub.
    assert (tmp_path / "b").read_bytes() == DATA
    assert json.loads((tmp_path / "fetch-failed.json").read_text()) == ["a"]
    listed.write_text(json.dumps([other]))
    assert fetch.main(["fetch", str(listed), str(tmp_path)]) == 0 and not (tmp_path / "fetch-failed.json").exists()


def test_one_peer_is_checked_too_and_its_bad_file_sends_the_node_to_the_hub(mirror, tmp_path):
    """Round 1 has one holder: its file is still checked, and a bad one is status 3 (the Hub gives it), where the
    mirror's one URL is left to the role's verification."""
    listed = tmp_path / "list.json"
    listed.write_text(json.dumps([{"urls": [f"{mirror}/hf/a"], "path": "a", "size": len(DATA), "sha256": "0" * 64}]))
    assert fetch.main(["fetch", str(listed), str(tmp_path / "peer")]) == 3
    listed.write_text(json.dumps([{"url": f"{mirror}/hf/a", "path": "a", "size": len(DATA), "sha256": "0" * 64}]))
    assert fetch.main(["fetch", str(listed), str(tmp_path / "mirror")]) == 0
    assert (tmp_path / "mirror" / "a").read_bytes() == DATA and not (tmp_path / "peer" / "a").exists()


# ------------------------------------------------------------------ what the program checked, for the verification


def test_the_files_checked_on_arrival_are_recorded_with_their_stat(mirror, tmp_path):
    """A peer's file kept after its checksum passed is recorded; the mirror's (left to the verification), one without
    a checksum and one that was there already are not; the record is written again by every run."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "there").write_bytes(DATA)
    listed = tmp_path / "list.json"
    listed.write_text(
        json.dumps(
            [
                {"urls": [f"{mirror}/hf/a"], "path": "peer", "size": len(DATA), "sha256": SHA256},
                {"urls": [f"{mirror}/hf/b"], "path": "sub/blob", "size": len(DATA), "git_oid": BLOB_ID},
                {"urls": [f"{mirror}/hf/c"], "path": "unlisted", "size": len(DATA)},
                {"url": f"{mirror}/hf/d", "path": "mirror", "size": len(DATA), "sha256": SHA256},
                {"urls": [f"{mirror}/hf/e"], "path": "there", "size": len(DATA), "sha256": SHA256},
            ]
        )
    )
    assert fetch.main(["fetch", str(listed), str(out)]) == 0
    record = json.loads((tmp_path / "fetch-checked.json").read_text())
    assert sorted(record) == ["peer", "sub/blob"]
    found = (out / "peer").stat()
    assert record["peer"] == {"size": found.st_size, "mtime_ns": found.st_mtime_ns, "ino": found.st_ino}
    assert fetch.main(["fetch", str(listed), str(out)]) == 0  # everything there now: nothing checked this time
    assert json.loads((tmp_path / "fetch-checked.json").read_text()) == {}


def test_the_verification_does_not_hash_what_was_checked_on_arrival_while_its_stat_holds(mirror, tmp_path):
    from ansible_collections.kimi.k2.plugins.module_utils.kimi_checkpoint import RepoFile
    from ansible_collections.kimi.k2.plugins.module_utils.kimi_checkpoint_node import (
        read_arrival_record,
        run_verification,
    )

    out = tmp_path / "out"
    listed = tmp_path / "list.json"
    names = ("a", "b")
    listed.write_text(
        json.dumps([{"urls": [f"{mirror}/hf/{n}"], "path": n, "size": len(DATA), "sha256": SHA256} for n in names])
    )
    assert fetch.main(["fetch", str(listed), str(out)]) == 0
    files = [RepoFile(n, len(DATA), SHA256, None) for n in names]
    record = read_arrival_record(tmp_path / "fetch-checked.json")
    result = run_verification(out, files, True, None, arrival=record)
    assert result["ok"] and (result["hashed"], result["checked_on_arrival"]) == (0, 2)
    # b overwritten in place after the check (same size, new mtime): hashed again, and its corruption found.
    with (out / "b").open("r+b") as stream:
        stream.write(b"\xff")
    result = run_verification(out, files, True, None, arrival=record)
    assert (result["hashed"], result["checked_on_arrival"]) == (1, 1)
    assert result["bad"] == ["b"]
    # Without the record (checkpoint_force_verify, another source), or with one that does not parse: every file.
    (tmp_path / "fetch-checked.json").write_text("{not json")
    assert read_arrival_record(tmp_path / "fetch-checked.json") is None
    assert run_verification(out, files, True, None, arrival=None)["hashed"] == 2
    # `only` (a marker's stale files) is narrowed the same way.
    narrowed = run_verification(out, files, True, ["a"], arrival=record)
    assert (narrowed["hashed"], narrowed["checked_on_arrival"]) == (0, 1)


# ------------------------------------------------------------------------- several files at once (--workers)


class Gate(Mirror):
    """Serves DATA only once `parties` requests are in flight together (a 503 when they never are)."""

    barrier: ClassVar[threading.Barrier] = threading.Barrier(1)

    def do_GET(self):
        try:
            type(self).barrier.wait()
        except threading.BrokenBarrierError:
            self.send_error(503)
            return
        super().do_GET()


@pytest.fixture
def gate():
    servers = []

    def start(parties: int, timeout: float) -> str:
        Gate.ranges, Gate.requests, Gate.barrier = True, [], threading.Barrier(parties, timeout=timeout)
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Gate)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_workers_fetch_that_many_files_at_once(gate, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(fetch, "RETRY_SECONDS", 0)
    url = gate(3, timeout=10)
    listed = tmp_path / "list.json"
    names = ("a", "b", "c")
    items = [{"urls": [f"{url}/hf/{n}"], "path": n, "size": len(DATA), "sha256": SHA256} for n in names]
    listed.write_text(json.dumps(items))
    # Three files held back until three requests are in flight: with three workers they all come.
    assert fetch.main(["fetch", "--workers", "3", str(listed), str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.strip().endswith("fetched 3 of 3 files")
    assert all((tmp_path / "out" / n).read_bytes() == DATA for n in names)
    assert sorted(json.loads((tmp_path / "fetch-checked.json").read_text())) == list(names)


def test_one_worker_asks_for_one_file_at_a_time(gate, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(fetch, "RETRY_SECONDS", 0)
    url = gate(2, timeout=0.5)
    listed = tmp_path / "list.json"
    listed.write_text(json.dumps([{"urls": [f"{url}/hf/{n}"], "path": n, "size": len(DATA)} for n in ("a", "b")]))
    # Alone, each request waits for a second that never comes: every file fails and goes to the Hub, in list order.
    assert fetch.main(["fetch", str(listed), str(tmp_path / "out")]) == 3
    assert json.loads((tmp_path / "fetch-failed.json").read_text()) == ["a", "b"]


@pytest.mark.parametrize("workers", ["0", "-1", "x", ""])
def test_a_bad_worker_count_is_refused_before_anything_is_fetched(tmp_path, capsys, workers):
    listed = tmp_path / "list.json"
    listed.write_text("[]")
    assert fetch.main(["fetch", "--workers", workers, str(listed), str(tmp_path)]) == 2
    assert "Error: usage: kimi-checkpoint-fetch.py [--workers N (1 or more)] LIST.json DIR" in capsys.readouterr().err
