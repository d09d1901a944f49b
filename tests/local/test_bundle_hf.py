"""The bundle's checkpoint step on this host, for real: fetch_checkpoint lays a Hugging Face repository out as
a plain directory, and the clients the nodes run read it back through a static server.

The mirror here is a stand-in (MirrorStandIn below): Python's http.server answering by the rules
kimi_bundle_hf.server_rules and file_headers define, the one definition the offline_mirror role's nginx
configuration implements, plus what nginx adds on its own to a static file (an ETag of mtime and size,
Last-Modified, Accept-Ranges, 206 for one byte range). The lab test serves the same layout with the real nginx;
this file proves the layout and the rules, not nginx.

Two sources:
- the lab's olah 0.5.4 in offline mode with the lab's miniature checkpoint (lab/labctl/mirrors_hf, the cached
  mirror and tools venv, found as the lab finds them; skipped when they are not built): a first build, a second
  that reuses everything, a third after two files of the layout were damaged; then olah is stopped (by its
  pid) and the stand-in serves the bundle's directory, the layout under /hf as nginx will, to the real
  `hf download` and `hf cache verify` of the tools venv (huggingface_hub 2.4.0, with hf_xet), to the role's
  kimi_hf_repo_files module, and to fetch_checkpoint itself (reuse from another layout, a pin bump, a resume);
- a fake Hub written here (no lab needed but for the hf runs): two pages of tree, an LFS file with an xetHash
  behind a redirect to a "CDN" on another origin that cuts the first transfer, a token the CDN must not see.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from ansible_collections.kimi.k2.plugins.module_utils import kimi_checkpoint as ck
from kimi_tools import kimi_bundle_hf as kbh

from tests.lab_olah import free_port, lab_hf_or_skip, running_olah
from tests.unit.ansible_adhoc import run_module

# Tier 2 (tests/tiers.py, group local-bundle): make test-all, and CI while its time allows, or when its code changed.
pytestmark = pytest.mark.tier2("local-bundle")

HF_ENV_DROP = ("HF_HUB_OFFLINE", "HF_TOKEN", "HF_HUB_DISABLE_XET", "HF_ENDPOINT", "HF_HOME", "HF_HUB_CACHE")
TIMINGS: dict[str, float] = {}
# What hf asks besides the checkpoint (see test_hf_download_gets_every_file_from_the_layout).
AGENT_REGISTRY = "/api/agent-harnesses"


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@contextmanager
def timed(name: str) -> Iterator[None]:
    started = time.monotonic()
    yield
    TIMINGS[name] = time.monotonic() - started
    print(f"\n[timing] {name}: {TIMINGS[name]:.2f} s")


# ------------------------------------------------------------------------------------ the mirror stand-in


@dataclass(frozen=True)
class Logged:
    method: str
    path: str
    rule: str | None
    status: int
    range: str | None


class MirrorStandIn:
    """A static server of `docroot`, whose layout is under `prefix` (the bundle's directory and "/hf", as
    nginx serves it; or the layout itself and ""), answering by kbh.server_rules and kbh.file_headers (the
    per-file headers built from the layout's own tree answers, as the role builds them from the bundle)."""

    def __init__(self, docroot: Path, prefix: str = "", drop: frozenset[str] = frozenset()) -> None:
        self.root = docroot.resolve()
        self.prefix = prefix.rstrip("/")
        # Headers left out of every answer, to show which ones hf cannot do without.
        self.drop = drop
        self.rules = kbh.server_rules(self.prefix)
        self.per_file: dict[str, dict[str, str]] = {}
        layout = self.root / self.prefix.lstrip("/")
        for tree in layout.glob("api/models/*/*/tree/*"):
            repo_id = "/".join(tree.relative_to(layout).parts[2:4])
            files = ck.files_from_tree(json.loads(tree.read_text()))
            self.per_file.update(kbh.file_headers(repo_id, tree.name, files, self.prefix))
        self.log: list[Logged] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_HEAD(self) -> None:
                stand_in.answer(self, head=True)

            def do_GET(self) -> None:
                stand_in.answer(self, head=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        # HF_ENDPOINT: the clients append /api/... and /ORG/NAME/resolve/... to it as text.
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}{self.prefix}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, handler: BaseHTTPRequestHandler, head: bool) -> None:
        path = urllib.parse.unquote(urllib.parse.urlsplit(handler.path).path)  # nginx's $uri
        matched = kbh.match_rule(path, self.rules)
        file = (self.root / path.lstrip("/")).resolve()
        rule = matched[0].name if matched else None
        requested_range = handler.headers.get("Range")
        if matched is None or not file.is_relative_to(self.root) or not file.is_file():
            headers = kbh.rule_headers(matched[0].not_found_headers, matched[1]) if matched else []
            return self.send(handler, head, Logged(handler.command, handler.path, rule, 404, requested_range), headers)
        found_rule, groups = matched
        stat = file.stat()
        headers = [
            *kbh.rule_headers(found_rule.headers, groups),
            *self.per_file.get(path, {}).items(),
            ("Content-Type", found_rule.content_type or "application/octet-stream"),
            ("ETag", f'"{int(stat.st_mtime):x}-{stat.st_size:x}"'),  # nginx's own
            ("Last-Modified", formatdate(stat.st_mtime, usegmt=True)),
        ]
        start, end, status = 0, stat.st_size - 1, 200
        if found_rule.byte_ranges:
            headers.append(("Accept-Ranges", "bytes"))
            if requested_range and requested_range.startswith("bytes="):
                first, _, last = requested_range[6:].partition("-")
                start, end, status = int(first), min(int(last or end), end), 206
                if start >= stat.st_size:
                    headers.append(("Content-Range", f"bytes */{stat.st_size}"))
                    entry = Logged(handler.command, handler.path, rule, 416, requested_range)
                    return self.send(handler, head, entry, headers)
                headers.append(("Content-Range", f"bytes {start}-{end}/{stat.st_size}"))
        entry = Logged(handler.command, handler.path, rule, status, requested_range)
        self.send(handler, head, entry, headers, (file, start, end - start + 1))

    def send(self, handler, head: bool, entry: Logged, headers, body: tuple[Path, int, int] | None = None) -> None:
        self.log.append(entry)
        handler.send_response(entry.status)
        for name, value in headers:
            if name not in self.drop:
                handler.send_header(name, value)
        handler.send_header("Content-Length", str(body[2] if body else 0))
        handler.end_headers()
        if head or body is None:
            return
        file, start, length = body
        with file.open("rb") as handle:
            handle.seek(start)
            while length > 0 and (block := handle.read(min(length, 1 << 20))):
                handler.wfile.write(block)
                length -= len(block)


@contextmanager
def serving(docroot: Path, prefix: str = "", drop: frozenset[str] = frozenset()) -> Iterator[MirrorStandIn]:
    stand_in = MirrorStandIn(docroot, prefix, drop)
    try:
        yield stand_in
    finally:
        stand_in.close()


# ----------------------------------------------------------------------------------------- hf, the client


def hf_env(endpoint: str, home: Path) -> dict[str, str]:
    """The environment the checkpoint role gives hf download, pointed at `endpoint`; HF_HUB_OFFLINE unset."""
    env = {key: value for key, value in os.environ.items() if key not in HF_ENV_DROP}
    return {
        **env,
        "HF_ENDPOINT": endpoint,
        "HF_HOME": str(home),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        # Else hf asks pypi.org for a newer version once a day (cli/_cli_utils.py: check_cli_update).
        "HF_HUB_DISABLE_UPDATE_CHECK": "1",
        "NO_COLOR": "1",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }


def run_hf(hf: Path, endpoint: str, home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(hf), *args], env=hf_env(endpoint, home), capture_output=True, text=True, timeout=300, check=False
    )


def local_files(directory: Path) -> set[str]:
    """Files of an hf --local-dir, without hf's own metadata folder."""
    return {
        path.relative_to(directory).as_posix()
        for path in directory.rglob("*")
        if path.is_file() and ".cache" not in path.relative_to(directory).parts
    }


@pytest.fixture(scope="module")
def tools_hf() -> Path:
    from labctl import mirrors_hf, settings

    cache = settings.load_settings().cache
    python = mirrors_hf.existing_tools_python(cache)
    if python is None or not (python.parent / "hf").exists():
        pytest.skip(f"no lab tools venv (olah, hf) under {cache}: lab/lab build, or set KIMI_LAB_CACHE")
    return python.parent / "hf"


# ------------------------------------------------------------------------------------------ the lab's olah


@pytest.fixture(scope="module")
def lab_hf() -> dict:
    return lab_hf_or_skip()


@dataclass(frozen=True)
class LabBuild:
    hf: dict
    layout: Path
    first: kbh.CheckpointFetch
    second: kbh.CheckpointFetch
    third: kbh.CheckpointFetch
    damaged: tuple[str, ...]


def damage(layout: Path, fetch: kbh.CheckpointFetch) -> tuple[str, ...]:
    """One byte of the largest file flipped in place (same size: only the checksum tells), the smallest cut
    short by one byte (a stat tells)."""
    by_size = sorted(fetch.files, key=lambda item: item.size)
    largest, smallest = layout / by_size[-1].path, layout / by_size[0].path
    with largest.open("r+b") as handle:
        handle.seek(by_size[-1].size // 2)
        byte = handle.read(1)
        handle.seek(by_size[-1].size // 2)
        handle.write(bytes([byte[0] ^ 0xFF]))
    smallest.write_bytes(smallest.read_bytes()[:-1])
    return by_size[-1].repo_path, by_size[0].repo_path


@pytest.fixture(scope="module")
def lab_build(lab_hf, tmp_path_factory) -> LabBuild:
    """Three builds of one layout from olah (from empty, again, after damage), then olah is stopped."""
    base = tmp_path_factory.mktemp("lab-build")
    layout = base / "bundle" / "hf"

    def fetch() -> kbh.CheckpointFetch:
        return kbh.fetch_checkpoint(endpoint, lab_hf["repo_id"], lab_hf["revision"], [], [], layout)

    with running_olah(lab_hf, base / "olah") as endpoint:
        with timed("lab: first fetch_checkpoint from olah (16 MB)"):
            first = fetch()
        with timed("lab: second fetch_checkpoint (all reused)"):
            second = fetch()
        damaged = damage(layout, second)
        with timed("lab: third fetch_checkpoint after damage"):
            third = fetch()
    return LabBuild(lab_hf, layout, first, second, third, damaged)


@pytest.fixture(scope="module")
def lab_mirror(lab_build) -> Iterator[MirrorStandIn]:
    with serving(lab_build.layout.parent, "/hf") as stand_in:
        yield stand_in


def by_repo_path(fetch: kbh.CheckpointFetch) -> dict[str, kbh.LayoutFile]:
    return {item.repo_path: item for item in fetch.files}


def test_the_first_build_takes_every_file_from_the_source(lab_build):
    first, hf = lab_build.first, lab_build.hf
    assert {item.repo_path: item.size for item in first.files} == hf["files"]
    assert {item.how for item in first.files} == {kbh.FETCHED}
    assert (first.fetched_bytes, first.reused_bytes, first.resumed_bytes) == (hf["total_bytes"], 0, 0)
    for item in first.files:
        source = Path(hf["mirrors_path"]) / "models" / hf["repo_id"] / item.repo_path
        assert item.sha256 == sha256_of(source) == sha256_of(lab_build.layout / item.path)
    assert not (lab_build.layout / kbh.PARTIAL_DIR).exists()
    tree = json.loads((lab_build.layout / kbh.tree_path(hf["repo_id"], hf["revision"])).read_text())
    assert [entry["path"] for entry in tree] == sorted(hf["files"])
    revision = json.loads((lab_build.layout / kbh.revision_path(hf["repo_id"], hf["revision"])).read_text())
    assert revision["sha"] == hf["revision"] and len(revision["siblings"]) == len(hf["files"])


def test_the_manifest_entries_are_the_layouts_files_as_hashed(lab_build):
    entries = lab_build.third.manifest_entries("hf")
    on_disk = sorted(
        p.relative_to(lab_build.layout.parent).as_posix() for p in lab_build.layout.rglob("*") if p.is_file()
    )
    assert [entry["path"] for entry in entries] == on_disk
    for entry in entries:
        path = lab_build.layout.parent / entry["path"]
        assert (entry["size"], entry["sha256"]) == (path.stat().st_size, sha256_of(path))


def test_a_second_build_reuses_everything(lab_build):
    second, hf = lab_build.second, lab_build.hf
    assert second.fetched_bytes == 0 and second.reused_bytes == hf["total_bytes"]
    assert {item.how for item in (*second.files, *second.documents)} == {kbh.KEPT}
    first = by_repo_path(lab_build.first)
    assert by_repo_path(second) == {path: dataclasses.replace(item, how=kbh.KEPT) for path, item in first.items()}
    assert second.removed == ()


def test_damaged_files_are_found_and_fetched_again(lab_build):
    third, first = by_repo_path(lab_build.third), by_repo_path(lab_build.first)
    assert {path for path, item in third.items() if item.how == kbh.FETCHED} == set(lab_build.damaged)
    assert lab_build.third.fetched_bytes == sum(first[path].size for path in lab_build.damaged)
    for path, item in third.items():
        assert item.sha256 == first[path].sha256 == sha256_of(lab_build.layout / item.path)


def downloaded_checkpoint(lab_build: LabBuild, tools_hf: Path, endpoint: str, tmp_path: Path, server: str) -> Path:
    """`hf download` of the lab's checkpoint from `endpoint` into a new --local-dir: every file, the layout's bytes."""
    hf, target = lab_build.hf, tmp_path / "checkpoint"
    with timed(f"lab: hf download from {server}"):
        done = run_hf(tools_hf, endpoint, tmp_path / "hf-home", "download", hf["repo_id"], "--revision",
                      hf["revision"], "--local-dir", str(target))  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    expected = by_repo_path(lab_build.third)
    assert local_files(target) == set(expected)
    for path, item in expected.items():
        assert sha256_of(target / path) == item.sha256, path
    return target


def test_hf_download_gets_every_file_from_the_layout(lab_build, lab_mirror, tools_hf, tmp_path):
    hf = lab_build.hf
    lab_mirror.log.clear()
    target = downloaded_checkpoint(lab_build, tools_hf, lab_mirror.endpoint, tmp_path, "the stand-in")
    expected = by_repo_path(lab_build.third)
    # The tree once, a HEAD and a GET per file, every answer a 200; besides, hf's CLI asks for the agent
    # registry once (utils/_detect_agent.py, best effort: a 404 is ignored), which has no rule.
    registry = lab_mirror.prefix + AGENT_REGISTRY
    log = [entry for entry in lab_mirror.log if entry.path != registry]
    assert [(entry.method, entry.status) for entry in lab_mirror.log if entry.path == registry] == [("GET", 404)]
    asked = [(entry.method, entry.rule, entry.status) for entry in log]
    assert set(asked) == {("GET", "resolve", 200), ("GET", "tree", 200), ("HEAD", "resolve", 200)}, log
    assert asked.count(("GET", "tree", 200)) == 1
    assert asked.count(("HEAD", "resolve", 200)) == asked.count(("GET", "resolve", 200)) == len(expected)

    with timed("lab: hf cache verify against the stand-in"):
        verified = run_hf(tools_hf, lab_mirror.endpoint, tmp_path / "hf-home", "cache", "verify", hf["repo_id"],
                          "--revision", hf["revision"], "--local-dir", str(target))  # fmt: skip
    assert verified.returncode == 0, verified.stdout + verified.stderr


@pytest.mark.parametrize(
    ("drop", "error"),
    [
        ({"X-Repo-Commit"}, "is missing the 'X-Repo-Commit' header"),
        ({"X-Linked-Etag", "ETag"}, "Distant resource does not have an ETag"),
        ({"X-Linked-Etag", "X-Linked-Size"}, None),  # nginx's own ETag and Content-Length do
    ],
)
def test_which_headers_hf_cannot_do_without(lab_build, tools_hf, tmp_path, drop, error):
    hf = lab_build.hf
    with serving(lab_build.layout.parent, "/hf", frozenset(drop)) as stand_in:
        done = run_hf(tools_hf, stand_in.endpoint, tmp_path / "hf-home", "download", hf["repo_id"], "--revision",
                      hf["revision"], "--local-dir", str(tmp_path / "checkpoint"))  # fmt: skip
    if error is None:
        assert done.returncode == 0, done.stderr[-3000:]
    else:
        assert done.returncode != 0 and error in done.stderr, done.stderr[-3000:]


def test_the_roles_module_lists_what_the_bundle_holds(lab_build, lab_mirror, tmp_path):
    hf = lab_build.hf
    arguments = {"repo_id": hf["repo_id"], "revision": hf["revision"], "endpoint": lab_mirror.endpoint}
    with timed("lab: kimi_hf_repo_files against the stand-in"):
        ok, result = run_module(tmp_path, "kimi_hf_repo_files", arguments)
    assert ok, result
    assert result["files"] == [asdict(repo_file) for repo_file in lab_build.third.repo_files]
    assert {entry["path"]: entry["size"] for entry in result["files"]} == hf["files"]
    assert (result["revision"], result["total_bytes"]) == (hf["revision"], hf["total_bytes"])

    ok, refused = run_module(tmp_path, "kimi_hf_repo_files", {**arguments, "revision": "0" * 40})
    assert not ok
    assert "the revision does not exist in the repository" in refused["msg"]
    assert f"{hf['repo_id']} at {'0' * 40} is not in this offline mirror" in refused["msg"]


def test_a_new_layout_links_what_another_holds(lab_build, lab_mirror, tmp_path):
    hf, layout = lab_build.hf, tmp_path / "hf"
    fetch = kbh.fetch_checkpoint(
        lab_mirror.endpoint, hf["repo_id"], hf["revision"], [], [], layout, reuse_dirs=[lab_build.layout]
    )
    assert fetch.fetched_bytes == 0 and {item.how for item in fetch.files} == {kbh.LINKED}
    for item in fetch.files:
        assert (layout / item.path).stat().st_ino == (lab_build.layout / item.path).stat().st_ino
    # Served back by the stand-in, the layout's answers are the source's.
    for document in fetch.documents:
        assert (layout / document.path).read_bytes() == (lab_build.layout / document.path).read_bytes()


def test_a_pin_bump_takes_the_old_revisions_files_and_drops_them(lab_build, lab_mirror, tmp_path):
    hf, layout, old = lab_build.hf, tmp_path / "hf", "1" * 40
    shutil.copytree(lab_build.layout, layout)
    repo_dir = layout / hf["repo_id"] / "resolve"
    (repo_dir / hf["revision"]).rename(repo_dir / old)
    for document in lab_build.third.documents:
        (layout / document.path).rename((layout / document.path).with_name(old))
    fetch = kbh.fetch_checkpoint(lab_mirror.endpoint, hf["repo_id"], hf["revision"], [], [], layout)
    assert fetch.fetched_bytes == 0 and {item.how for item in fetch.files} == {kbh.LINKED}
    assert sorted(fetch.removed) == sorted(
        [f"{hf['repo_id']}/resolve/{old}/{path}" for path in hf["files"]]
        + [f"api/models/{hf['repo_id']}/{kind}/{old}" for kind in ("revision", "tree")]
    )
    assert not (repo_dir / old).exists()


def test_an_interrupted_download_is_continued_with_a_range(lab_build, lab_mirror, tmp_path):
    hf, layout = lab_build.hf, tmp_path / "hf"
    largest = max(lab_build.third.repo_files, key=lambda repo_file: repo_file.size)
    half = largest.size // 2
    partial = layout / kbh.PARTIAL_DIR / kbh.partial_name(largest, hf["revision"])
    partial.parent.mkdir(parents=True)
    partial.write_bytes((lab_build.layout / by_repo_path(lab_build.third)[largest.path].path).read_bytes()[:half])
    lab_mirror.log.clear()
    fetch = kbh.fetch_checkpoint(lab_mirror.endpoint, hf["repo_id"], hf["revision"], [], [], layout)
    assert fetch.resumed_bytes == half
    assert fetch.fetched_bytes == hf["total_bytes"] - half
    assert [entry.range for entry in lab_mirror.log if entry.range] == [f"bytes={half}-"]
    assert by_repo_path(fetch)[largest.path].sha256 == by_repo_path(lab_build.third)[largest.path].sha256
    assert not partial.parent.exists()


# ------------------------------------------------------------------------------------------- a fake Hub

FAKE_REPO = "org/gated-model"
LIAR_REPO = "org/liar"
FAKE_SHA = "0123456789abcdef0123456789abcdef01234567"
TOKEN = "hf_fakeTokenNeverPrinted0123456789"
CONFIG_BYTES = b'{"model_type": "kimi_k2"}\n'
WEIGHTS = random.Random(16).randbytes(3 << 20)
WEIGHTS_SHA256 = hashlib.sha256(WEIGHTS).hexdigest()
EXTRA = b"left out by the patterns\n"
CUT_AFTER = 1 << 20


def blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def fake_tree() -> list[list[dict]]:
    """The Hub's listing in two pages, the LFS file with an xetHash as the Hub gives it today."""
    return [
        [
            {"type": "file", "path": "config.json", "size": len(CONFIG_BYTES), "oid": blob_id(CONFIG_BYTES)},
            # The same bytes under another path: downloaded once.
            {"type": "file", "path": "config-copy.json", "size": len(CONFIG_BYTES), "oid": blob_id(CONFIG_BYTES)},
            {"type": "directory", "path": "weights", "size": 0, "oid": "d" * 40},
        ],
        [
            {
                "type": "file",
                "path": "weights/model.safetensors",
                "size": 134,
                "oid": "e" * 40,
                "lfs": {"oid": WEIGHTS_SHA256, "size": len(WEIGHTS), "pointerSize": 134},
                "xetHash": "f" * 64,
            },
            {"type": "file", "path": "extra.bin", "size": len(EXTRA), "oid": blob_id(EXTRA)},
        ],
    ]


class FakeHub:
    """The Hub's API and resolve for FAKE_REPO (token required) and LIAR_REPO (its LFS blob is not the
    listed one), and a CDN on another origin serving the LFS blob: its first transfer is cut after CUT_AFTER
    bytes, later ones honour Range. Records each request's path, Range and whether a token came with it."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str | None, bool]] = []
        self.cut_left = 1
        self.hub = self._server(self.answer_hub)
        self.cdn = self._server(self.answer_cdn)
        self.url, self.cdn_url = (f"http://127.0.0.1:{s.server_address[1]}" for s in (self.hub, self.cdn))

    def _server(self, answer) -> ThreadingHTTPServer:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                fake.seen.append(
                    (answer.__name__, self.path, self.headers.get("Range"), "Authorization" in self.headers)
                )
                answer(self)

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server

    def close(self) -> None:
        for server in (self.hub, self.cdn):
            server.shutdown()
            server.server_close()

    @staticmethod
    def send(handler, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        handler.send_response(status)
        for name, value in (headers or {}).items():
            handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def answer_hub(self, handler) -> None:
        path = handler.path
        if handler.headers.get("Authorization") != f"Bearer {TOKEN}":
            return self.send(handler, 401, b"{}", {"X-Error-Code": "GatedRepo", "X-Error-Message": "log in"})
        for repo in (FAKE_REPO, LIAR_REPO):
            api = f"/api/models/{repo}"
            if path == f"{api}/revision/{FAKE_SHA}":
                names = [entry["path"] for page in fake_tree() for entry in page if entry["type"] == "file"]
                info = {"id": repo, "sha": FAKE_SHA, "siblings": [{"rfilename": name} for name in names]}
                return self.send(handler, 200, json.dumps(info).encode())
            first_page = f"{api}/tree/{FAKE_SHA}?recursive=true&expand=false"
            if path == first_page:
                link = f'<{self.url}{first_page}&cursor=2>; rel="next"'
                return self.send(handler, 200, json.dumps(fake_tree()[0]).encode(), {"Link": link})
            if path == f"{first_page}&cursor=2":
                return self.send(handler, 200, json.dumps(fake_tree()[1]).encode())
            resolve = f"/{repo}/resolve/{FAKE_SHA}/"
            if path in (f"{resolve}config.json", f"{resolve}config-copy.json"):
                return self.send(handler, 200, CONFIG_BYTES, {"X-Repo-Commit": FAKE_SHA})
            if path == f"{resolve}weights/model.safetensors":
                blob = "liar" if repo == LIAR_REPO else WEIGHTS_SHA256
                location = f"{self.cdn_url}/blobs/{blob}?X-Amz-Signature=abc"
                return self.send(handler, 302, b"", {"Location": location, "X-Repo-Commit": FAKE_SHA})
        return self.send(handler, 404, b"{}", {"X-Error-Code": "RevisionNotFound"})

    def answer_cdn(self, handler) -> None:
        blob = WEIGHTS if handler.path.startswith(f"/blobs/{WEIGHTS_SHA256}?") else WEIGHTS[::-1]
        requested = handler.headers.get("Range")
        if requested is None and self.cut_left:
            self.cut_left -= 1
            handler.send_response(200)
            handler.send_header("Content-Length", str(len(blob)))
            handler.end_headers()
            handler.wfile.write(blob[:CUT_AFTER])
            handler.wfile.flush()
            handler.close_connection = True
            handler.connection.shutdown(socket.SHUT_RDWR)
            return
        if requested:
            start = int(requested.removeprefix("bytes=").split("-")[0])
            content_range = f"bytes {start}-{len(blob) - 1}/{len(blob)}"
            return self.send(handler, 206, blob[start:], {"Content-Range": content_range})
        return self.send(handler, 200, blob)


@pytest.fixture
def fake_hub() -> Iterator[FakeHub]:
    hub = FakeHub()
    try:
        yield hub
    finally:
        hub.close()


def fetch_fake(hub: FakeHub, layout: Path, repo: str = FAKE_REPO) -> kbh.CheckpointFetch:
    return kbh.fetch_checkpoint(hub.url, repo, FAKE_SHA, [], ["extra.bin"], layout, token=TOKEN)


def test_from_the_hub_pages_lfs_a_cdn_and_a_cut_transfer(fake_hub, tmp_path):
    layout = tmp_path / "hf"
    fetch = fetch_fake(fake_hub, layout)
    files = by_repo_path(fetch)
    assert sorted(files) == ["config-copy.json", "config.json", "weights/model.safetensors"]
    # Listed first (files are sorted by path), the copy is fetched and config.json linked to it.
    assert (files["config-copy.json"].how, files["config.json"].how) == (kbh.FETCHED, kbh.LINKED)
    assert files["weights/model.safetensors"].sha256 == WEIGHTS_SHA256
    assert (layout / files["weights/model.safetensors"].path).read_bytes() == WEIGHTS
    assert (layout / files["config.json"].path).read_bytes() == CONFIG_BYTES
    assert (layout / files["config-copy.json"].path).read_bytes() == CONFIG_BYTES
    # One resolve of the two configs; the shard's twice, its second attempt redirected to the CDN again.
    resolved = [path for server, path, _, _ in fake_hub.seen if server == "answer_hub" and "/resolve/" in path]
    prefix = f"/{FAKE_REPO}/resolve/{FAKE_SHA}/"
    assert sorted(resolved) == [f"{prefix}config-copy.json", *[f"{prefix}weights/model.safetensors"] * 2]
    # The cut transfer was continued where it stopped, within the run.
    cdn = [(path, requested) for server, path, requested, _ in fake_hub.seen if server == "answer_cdn"]
    assert [requested for _, requested in cdn] == [None, f"bytes={CUT_AFTER}-"]
    assert fetch.fetched_bytes == len(WEIGHTS) + len(CONFIG_BYTES) and fetch.resumed_bytes == 0
    # The token went to the Hub with every request, never to the CDN's signed URL.
    assert all(token for server, _, _, token in fake_hub.seen if server == "answer_hub")
    assert not any(token for server, _, _, token in fake_hub.seen if server == "answer_cdn")
    tree = json.loads((layout / kbh.tree_path(FAKE_REPO, FAKE_SHA)).read_text())
    source = [entry for page in fake_tree() for entry in page]
    assert tree == [{k: v for k, v in entry.items() if k != "xetHash"} for entry in source[:4]]
    revision = json.loads((layout / kbh.revision_path(FAKE_REPO, FAKE_SHA)).read_text())
    names = ["config.json", "config-copy.json", "weights/model.safetensors"]
    assert revision["siblings"] == [{"rfilename": name} for name in names]


def test_bytes_that_are_not_the_listed_ones_fail_and_leave_nothing(fake_hub, tmp_path):
    layout = tmp_path / "hf"
    with pytest.raises(kbh.CheckpointFetchError) as failed:
        fetch_fake(fake_hub, layout, LIAR_REPO)
    assert str(failed.value).startswith(f"{LIAR_REPO} weights/model.safetensors at {FAKE_SHA}: downloaded sha256 ")
    assert str(failed.value).endswith(f"the tree lists {WEIGHTS_SHA256}")
    assert not list(layout.rglob("model.safetensors")) and not list(layout.rglob("*.part"))


def test_an_unknown_revision_or_a_missing_token_is_named(fake_hub, tmp_path):
    with pytest.raises(kbh.CheckpointFetchError, match="the revision does not exist in the repository"):
        kbh.fetch_checkpoint(fake_hub.url, FAKE_REPO, "9" * 40, [], [], tmp_path / "hf", token=TOKEN)
    with pytest.raises(kbh.CheckpointFetchError, match=r"HTTP 401.*\(no token was sent\).*gated"):
        kbh.fetch_checkpoint(fake_hub.url, FAKE_REPO, FAKE_SHA, [], [], tmp_path / "hf")


def test_hf_downloads_the_hub_layout_and_keeps_a_file_it_can_hash(fake_hub, tools_hf, tmp_path):
    layout = tmp_path / "hf"
    fetch = fetch_fake(fake_hub, layout)
    target = tmp_path / "checkpoint"
    # A copy of the shard already there without hf's metadata (rsync'ed by an operator): X-Linked-Etag is its
    # sha256, so hf hashes and keeps it instead of fetching it again.
    (target / "weights").mkdir(parents=True)
    (target / "weights/model.safetensors").write_bytes(WEIGHTS)
    with serving(layout) as stand_in:
        done = run_hf(tools_hf, stand_in.endpoint, tmp_path / "hf-home", "download", FAKE_REPO, "--revision", FAKE_SHA,
                      "--local-dir", str(target))  # fmt: skip
        log = list(stand_in.log)
    assert done.returncode == 0, done.stderr[-3000:]
    assert local_files(target) == {"config.json", "config-copy.json", "weights/model.safetensors"}  # no extra.bin
    for item in fetch.files:
        assert sha256_of(target / item.repo_path) == item.sha256
    gets = [entry.path for entry in log if entry.method == "GET" and entry.rule == "resolve"]
    assert sorted(gets) == [f"/{FAKE_REPO}/resolve/{FAKE_SHA}/{name}" for name in ("config-copy.json", "config.json")]


def test_why_the_layout_drops_xet_hashes(fake_hub, tools_hf, tmp_path):
    """The same layout with the source's xetHash left in: hf (with hf_xet) skips the HEAD and asks for a xet
    token the static mirror cannot give. This is the control for servable_tree."""
    layout = tmp_path / "hf"
    fetch_fake(fake_hub, layout)
    source = [entry for page in fake_tree() for entry in page][:4]
    (layout / kbh.tree_path(FAKE_REPO, FAKE_SHA)).write_text(json.dumps(source))
    with serving(layout) as stand_in:
        done = run_hf(tools_hf, stand_in.endpoint, tmp_path / "hf-home", "download", FAKE_REPO, "--revision", FAKE_SHA,
                      "--local-dir", str(tmp_path / "checkpoint"))  # fmt: skip
        log = list(stand_in.log)
    assert done.returncode != 0
    assert any("/xet-read-token/" in entry.path and entry.status == 404 for entry in log), log


# ------------------------------------------------------------------------- the role's nginx, for real

SITE_TEMPLATE = Path(__file__).resolve().parents[2] / "roles" / "offline_mirror" / "templates" / "kimi-bundle.conf.j2"


@dataclass(frozen=True)
class Nginx:
    """The offline_mirror role's site, rendered from its template with the bundle's header rows as the role
    computes them (kimi.k2.hf_mirror_headers), served by Debian's nginx from the lab's apt mirror."""

    endpoint: str
    base: str
    access_log: Path
    site: str

    def requests(self) -> list[tuple[str, str, int]]:
        """(method, uri, status) of every request so far."""
        lines = self.access_log.read_text().splitlines()
        return [(method, uri, int(status)) for method, uri, status in (line.split(" ") for line in lines)]

    def ask(self, path: str, method: str = "HEAD", headers: dict | None = None):
        import urllib.request

        request = urllib.request.Request(self.base + path, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return answer.status, dict(answer.headers), answer.read()
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), error.read()


def unpacked_nginx(workdir: Path) -> Path:
    """Debian's nginx binary and its mime.types, unpacked from the lab's apt mirror (nothing installed)."""
    from labctl import mirrors_apt, settings

    apt = mirrors_apt.existing(settings.load_settings().cache)
    debs = sorted(apt["debian"].glob("nginx_*.deb")) + sorted(apt["debian"].glob("nginx-common_*.deb")) if apt else []
    if len(debs) != 2:
        pytest.skip("the lab's apt mirror has no nginx (make lab-build)")
    for deb in debs:
        subprocess.run(["dpkg-deb", "-x", str(deb), str(workdir)], check=True)
    return workdir


def render_site(context: dict) -> str:
    import jinja2

    # As ansible.builtin.template renders (trim_blocks on), with only the values the template reads.
    environment = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined)
    return environment.from_string(SITE_TEMPLATE.read_text()).render(context)


def header_rows(tree: list[dict], repo_id: str, revision: str) -> list[dict[str, str]]:
    """The rows as the role computes them: its kimi.k2.hf_mirror_headers filter, loaded from its file."""
    import importlib.util

    path = SITE_TEMPLATE.parents[3] / "plugins" / "filter" / "kimi_bundle.py"
    spec = importlib.util.spec_from_file_location("kimi_bundle_filter", path)
    assert spec is not None and spec.loader is not None
    bundle_filter = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bundle_filter)
    return bundle_filter.hf_mirror_headers(tree, repo_id, revision)


@pytest.fixture(scope="module")
def nginx_root(tmp_path_factory) -> Path:
    return unpacked_nginx(tmp_path_factory.mktemp("nginx-root"))


@contextmanager
def nginx_site(root: Path, bundle: Path, repo_id: str, revision: str, work: Path) -> Iterator[Nginx]:
    """The role's site for the checkpoint `repo_id` at `revision` in `bundle` (the directory holding hf/), run
    by nginx in the foreground in one process (no worker user to switch to); stopped by its pid."""
    work.mkdir(parents=True, exist_ok=True)
    port = free_port()
    tree = json.loads((bundle / kbh.HF_DIR / kbh.tree_path(repo_id, revision)).read_text())
    # The role's layout: nginx's root is the current link to a release, the bundle directory holding hf/.
    (work / "current").symlink_to(bundle)
    site = render_site(
        {
            "ansible_managed": "test",
            "offline_mirror_listen_host": "127.0.0.1",
            "kimi_offline_mirror_port": port,
            "offline_mirror_current": str(work / "current"),
            "offline_mirror_url": f"http://127.0.0.1:{port}",
            "offline_mirror_hf": {
                "repo_id": repo_id,
                "revision": revision,
                "headers": header_rows(tree, repo_id, revision),
            },
        }
    )
    (work / "site.conf").write_text(site)
    access_log = work / "access.log"
    (work / "tmp").mkdir()
    temp_paths = "\n".join(f"    {kind}_temp_path {work}/tmp/{kind};" for kind in ("proxy", "fastcgi", "uwsgi", "scgi"))
    (work / "nginx.conf").write_text(
        f"""daemon off;
master_process off;
pid {work}/nginx.pid;
error_log {work}/error.log;
events {{}}
http {{
    include {root}/etc/nginx/mime.types;
    default_type application/octet-stream;
    client_body_temp_path {work}/tmp/body;
{temp_paths}
    log_format kimi '$request_method $uri $status';
    access_log {access_log} kimi;
    # Debian's nginx.conf has gzip on: the checkpoint's locations must turn it off for what they serve.
    gzip on;
    gzip_types application/json text/plain;
    include {work}/site.conf;
}}
"""
    )
    nginx = [str(root / "usr/sbin/nginx"), "-p", str(work), "-c", str(work / "nginx.conf")]
    checked = subprocess.run([*nginx, "-t", "-q"], capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stderr
    process = subprocess.Popen(nginx, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert process.poll() is None and time.monotonic() < deadline, (work / "error.log").read_text()
            time.sleep(0.1)
        base = f"http://127.0.0.1:{port}"
        yield Nginx(f"{base}/hf", base, access_log, site)
    finally:
        process.terminate()  # this pid only
        process.wait(timeout=15)


@pytest.fixture(scope="module")
def lab_nginx(lab_build, nginx_root, tmp_path_factory) -> Iterator[Nginx]:
    hf = lab_build.hf
    work = tmp_path_factory.mktemp("lab-nginx")
    with nginx_site(nginx_root, lab_build.layout.parent, hf["repo_id"], hf["revision"], work) as nginx:
        yield nginx


def test_nginx_serves_the_layout_to_hf_download_by_the_rules(lab_build, lab_nginx, tools_hf, tmp_path):
    hf = lab_build.hf
    target = downloaded_checkpoint(lab_build, tools_hf, lab_nginx.endpoint, tmp_path, "the role's nginx")
    verified = run_hf(tools_hf, lab_nginx.endpoint, tmp_path / "hf-home", "cache", "verify", hf["repo_id"],
                      "--revision", hf["revision"], "--local-dir", str(target))  # fmt: skip
    assert verified.returncode == 0, verified.stdout + verified.stderr

    # The answers hf relies on, as the stand-in gives them (kbh.server_rules, kbh.file_headers).
    shard = max(lab_build.third.repo_files, key=lambda repo_file: repo_file.size)
    uri = f"/hf/{kbh.resolve_path(hf['repo_id'], hf['revision'], shard.path)}"
    status, headers, _ = lab_nginx.ask(uri, headers={"Accept-Encoding": "gzip"})
    assert status == 200
    assert headers["X-Repo-Commit"] == hf["revision"]
    assert headers["X-Linked-Etag"] == f'"{shard.sha256 or shard.git_oid}"'
    assert (headers["X-Linked-Size"], headers["Content-Length"]) == (str(shard.size), str(shard.size))
    assert "Content-Encoding" not in headers
    status, headers, body = lab_nginx.ask(uri, "GET", {"Range": "bytes=10-19"})
    assert (status, headers["Content-Range"], len(body)) == (206, f"bytes 10-19/{shard.size}", 10)
    tree_uri = f"/hf/{kbh.tree_path(hf['repo_id'], hf['revision'])}"
    status, headers, body = lab_nginx.ask(tree_uri, "GET", {"Accept-Encoding": "gzip"})
    assert (status, headers["Content-Type"], "Content-Encoding" in headers) == (200, "application/json", False)
    assert json.loads(body) == json.loads((lab_build.layout.parent / tree_uri[1:]).read_text())


def test_nginx_names_what_it_does_not_hold_as_the_hub_does(lab_build, lab_nginx, tmp_path):
    hf = lab_build.hf
    other = "f" * 40
    status, headers, _ = lab_nginx.ask(f"/hf/{kbh.resolve_path(hf['repo_id'], hf['revision'], 'nope.bin')}")
    assert status == 404
    assert (headers["X-Error-Code"], headers["X-Repo-Commit"]) == ("EntryNotFound", hf["revision"])
    assert headers["X-Error-Message"] == f"{hf['repo_id']} at {hf['revision']} is not in this offline mirror"
    status, headers, _ = lab_nginx.ask(f"/hf/{kbh.tree_path(hf['repo_id'], other)}", "GET")
    assert (status, headers["X-Error-Code"]) == (404, "RevisionNotFound")
    # The role's own module reads those words.
    arguments = {"repo_id": hf["repo_id"], "revision": other, "endpoint": lab_nginx.endpoint}
    ok, refused = run_module(tmp_path, "kimi_hf_repo_files", arguments)
    assert not ok and f"{hf['repo_id']} at {other} is not in this offline mirror" in refused["msg"], refused
    ok, listed = run_module(tmp_path, "kimi_hf_repo_files", {**arguments, "revision": hf["revision"]})
    assert ok and listed["files"] == [asdict(repo_file) for repo_file in lab_build.third.repo_files], listed
    # Nothing else under /hf/: no other API, no directory, no listing; and nothing but GET and HEAD.
    for path in (
        f"/hf/api/models/{hf['repo_id']}/xet-read-token/{hf['revision']}",
        f"/hf/{hf['repo_id']}/resolve/{hf['revision']}/",
        "/hf/api/models/",
        "/hf/",
    ):
        status, headers, _ = lab_nginx.ask(path, "GET")
        assert (status, "X-Error-Code" in headers) == (404, False), path
    status, _, _ = lab_nginx.ask(f"/hf/{kbh.tree_path(hf['repo_id'], hf['revision'])}", "POST")
    assert status == 403


def test_nginx_lets_hf_keep_a_file_a_node_holds_already(fake_hub, nginx_root, tools_hf, tmp_path):
    """The fake Hub's layout (its shard is an LFS file) behind the role's nginx: a copy of the shard a node holds
    already (rsync'ed, without hf's metadata) is hashed against X-Linked-Etag and kept, as with the Hub; the
    small files, whose etag is a git blob id hf cannot check, are fetched."""
    bundle = tmp_path / "bundle"
    fetch_fake(fake_hub, bundle / kbh.HF_DIR)
    target = tmp_path / "checkpoint"
    (target / "weights").mkdir(parents=True)
    (target / "weights/model.safetensors").write_bytes(WEIGHTS)
    with nginx_site(nginx_root, bundle, FAKE_REPO, FAKE_SHA, tmp_path / "nginx") as nginx:
        done = run_hf(tools_hf, nginx.endpoint, tmp_path / "hf-home", "download", FAKE_REPO, "--revision", FAKE_SHA,
                      "--local-dir", str(target))  # fmt: skip
        requests = nginx.requests()
    assert done.returncode == 0, done.stderr[-3000:]
    assert sha256_of(target / "weights/model.safetensors") == WEIGHTS_SHA256
    gets = sorted(uri.rsplit("/", 1)[1] for method, uri, _ in requests if method == "GET" and "/resolve/" in uri)
    assert gets == ["config-copy.json", "config.json"], requests
