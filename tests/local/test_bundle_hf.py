"""The bundle's checkpoint step on this host, for real: fetch_checkpoint lays a Hugging Face repository out as
a plain directory (hf/ORG/NAME/resolve/SHA/PATH, and the source's revision and tree answers under hf/api/), and
the offline mirror's nginx serves that directory as plain static files to the checkpoint role's fetch program.

The builder, from three sources:
- the lab's olah 0.5.4 in offline mode with the lab's miniature checkpoint (lab/labctl/mirrors_hf, the cached
  mirror and tools venv, found as the lab finds them; skipped when they are not built): a first build, a second
  that reuses everything, a third after two files of the layout were damaged; then olah is stopped (by its pid);
- a static Hub stand-in written here (StaticHub): a built layout answering the three requests fetch_checkpoint
  makes of a Hub (revision, tree, resolve, a Range from a byte answered with 206), the source of a new layout
  that links what another holds, of a pin bump and of a resumed download;
- a fake Hub written here (no lab needed): two pages of tree, an LFS file behind a redirect to a "CDN" on another
  origin that cuts the first transfer, a token the CDN must not see, a repository whose bytes are not the listed
  ones, an unknown revision.

The mirror: the offline_mirror role's site rendered from its template and run by Debian's nginx (unpacked from
the lab's apt mirror; skipped without it) serves the lab's layout; the checkpoint role's
files/kimi-checkpoint-fetch.py fetches every file from it with plain GETs, continuing a partial one with a Range
(206), and gets the layout's bytes. Under /hf/ nginx serves files and nothing else (a directory or a file the
bundle lacks is a 404), GET and HEAD only (else 403), and no Hub header: the mirror does not imitate the Hub any
more (docs/air-gapped.md, "The checkpoint from the bundle"), so no Hub client (`hf download`) is run against it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import random
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType

import pytest
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_checkpoint as kbc
from kimi_tools import kimi_bundle_hf as kbh

from tests.lab_olah import free_port, lab_hf_or_skip, running_olah

# Tier 2 (tests/tiers.py, group local-bundle): make test-all, and CI while its time allows, or when its code changed.
pytestmark = pytest.mark.tier2("local-bundle")

ROOT = Path(__file__).resolve().parents[2]
TIMINGS: dict[str, float] = {}


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@contextmanager
def timed(name: str) -> Iterator[None]:
    started = time.monotonic()
    yield
    TIMINGS[name] = time.monotonic() - started
    print(f"\n[timing] {name}: {TIMINGS[name]:.2f} s")


# --------------------------------------------------------------------------------- a static Hub stand-in

# The requests fetch_checkpoint makes of a Hub (kbh.revision_url, kbh.tree_url, kbh.resolve_url), path and query
# as sent. Each is answered with the layout's file at the path without the query: the tree in one page, no Link.
HUB_REQUESTS = (
    re.compile(r"/api/models/[^/?]+/[^/?]+/revision/[0-9a-f]{40}"),
    re.compile(r"/api/models/[^/?]+/[^/?]+/tree/[0-9a-f]{40}\?recursive=true&expand=false"),
    re.compile(r"/[^/?]+/[^/?]+/resolve/[0-9a-f]{40}/[^?]+"),
)


@dataclass(frozen=True)
class Asked:
    path: str
    status: int
    range: str | None


class StaticHub:
    """A built layout as the source of fetch_checkpoint: the answers of HUB_REQUESTS from its files, a Range
    `bytes=N-` answered with 206 and its Content-Range, anything else 404. Records each request."""

    def __init__(self, layout: Path) -> None:
        self.layout = layout.resolve()
        self.asked: list[Asked] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                hub.answer(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def file_for(self, requested: str) -> Path | None:
        if not any(pattern.fullmatch(requested) for pattern in HUB_REQUESTS):
            return None
        file = (self.layout / urllib.parse.unquote(urllib.parse.urlsplit(requested).path).lstrip("/")).resolve()
        return file if file.is_relative_to(self.layout) and file.is_file() else None

    def answer(self, handler: BaseHTTPRequestHandler) -> None:
        requested_range = handler.headers.get("Range")
        file = self.file_for(handler.path)
        size = file.stat().st_size if file else 0
        start = 0
        if file is None:
            status, headers = 404, {}
        elif requested_range is None:
            status, headers = 200, {}
        elif (asked := re.fullmatch(r"bytes=(\d+)-", requested_range)) and int(asked[1]) < size:
            start = int(asked[1])
            status, headers = 206, {"Content-Range": f"bytes {start}-{size - 1}/{size}"}
        else:
            status, headers = 416, {"Content-Range": f"bytes */{size}"}
        self.asked.append(Asked(handler.path, status, requested_range))
        handler.send_response(status)
        for name, value in headers.items():
            handler.send_header(name, value)
        handler.send_header("Content-Length", str(size - start if status in (200, 206) else 0))
        handler.end_headers()
        if file is not None and status in (200, 206):
            with file.open("rb") as handle:
                handle.seek(start)
                shutil.copyfileobj(handle, handler.wfile)


@contextmanager
def static_hub(layout: Path) -> Iterator[StaticHub]:
    hub = StaticHub(layout)
    try:
        yield hub
    finally:
        hub.close()


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
def lab_hub(lab_build) -> Iterator[StaticHub]:
    """The third build's layout as a Hub-like source, once olah is gone."""
    with static_hub(lab_build.layout) as hub:
        yield hub


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


def test_a_new_layout_links_what_another_holds(lab_build, lab_hub, tmp_path):
    hf, layout = lab_build.hf, tmp_path / "hf"
    fetch = kbh.fetch_checkpoint(
        lab_hub.endpoint, hf["repo_id"], hf["revision"], [], [], layout, reuse_dirs=[lab_build.layout]
    )
    assert fetch.fetched_bytes == 0 and {item.how for item in fetch.files} == {kbh.LINKED}
    for item in fetch.files:
        assert (layout / item.path).stat().st_ino == (lab_build.layout / item.path).stat().st_ino
    # The layout's answers are the source's, as the stand-in served them from the other layout.
    for document in fetch.documents:
        assert (layout / document.path).read_bytes() == (lab_build.layout / document.path).read_bytes()


def test_a_pin_bump_takes_the_old_revisions_files_and_drops_them(lab_build, lab_hub, tmp_path):
    hf, layout, old = lab_build.hf, tmp_path / "hf", "1" * 40
    shutil.copytree(lab_build.layout, layout)
    repo_dir = layout / hf["repo_id"] / "resolve"
    (repo_dir / hf["revision"]).rename(repo_dir / old)
    for document in lab_build.third.documents:
        (layout / document.path).rename((layout / document.path).with_name(old))
    fetch = kbh.fetch_checkpoint(lab_hub.endpoint, hf["repo_id"], hf["revision"], [], [], layout)
    assert fetch.fetched_bytes == 0 and {item.how for item in fetch.files} == {kbh.LINKED}
    assert sorted(fetch.removed) == sorted(
        [f"{hf['repo_id']}/resolve/{old}/{path}" for path in hf["files"]]
        + [f"api/models/{hf['repo_id']}/{kind}/{old}" for kind in ("revision", "tree")]
    )
    assert not (repo_dir / old).exists()


def test_an_interrupted_download_is_continued_with_a_range(lab_build, lab_hub, tmp_path):
    hf, layout = lab_build.hf, tmp_path / "hf"
    largest = max(lab_build.third.repo_files, key=lambda repo_file: repo_file.size)
    half = largest.size // 2
    partial = layout / kbh.PARTIAL_DIR / kbh.partial_name(largest, hf["revision"])
    partial.parent.mkdir(parents=True)
    partial.write_bytes((lab_build.layout / by_repo_path(lab_build.third)[largest.path].path).read_bytes()[:half])
    lab_hub.asked.clear()
    fetch = kbh.fetch_checkpoint(lab_hub.endpoint, hf["repo_id"], hf["revision"], [], [], layout)
    assert fetch.resumed_bytes == half
    assert fetch.fetched_bytes == hf["total_bytes"] - half
    ranged = [(entry.status, entry.range) for entry in lab_hub.asked if entry.range]
    assert ranged == [(206, f"bytes={half}-")]
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


# ------------------------------------------------------------------------- the role's nginx, for real

SITE_TEMPLATE = ROOT / "roles" / "offline_mirror" / "templates" / "kimi-bundle.conf.j2"
FETCH_PROGRAM = ROOT / "roles" / "checkpoint" / "files" / "kimi-checkpoint-fetch.py"
# What the mirror sent while it imitated the Hub; it sends none of them now.
HUB_HEADERS = {"x-repo-commit", "x-linked-etag", "x-linked-size", "x-error-code", "x-error-message"}


@dataclass(frozen=True)
class Nginx:
    """The offline_mirror role's site, rendered from its template for the bundle's checkpoint as the role reads
    it from the manifest (offline_mirror_checkpoint), served by Debian's nginx from the lab's apt mirror."""

    base: str
    access_log: Path
    site: str

    def requests(self) -> list[tuple[str, str, int, str]]:
        """(method, uri, status, Range or "-") of every request so far."""
        lines = self.access_log.read_text().splitlines()
        return [
            (method, uri, int(status), ranged) for method, uri, status, ranged in (line.split(" ") for line in lines)
        ]

    def ask(self, path: str, method: str = "GET", headers: dict | None = None):
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


def fetch_program() -> ModuleType:
    """The checkpoint role's kimi-checkpoint-fetch.py, loaded from its file."""
    spec = importlib.util.spec_from_file_location("kimi_checkpoint_fetch", FETCH_PROGRAM)
    assert spec is not None and spec.loader is not None
    program = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(program)
    return program


@pytest.fixture(scope="module")
def nginx_root(tmp_path_factory) -> Path:
    return unpacked_nginx(tmp_path_factory.mktemp("nginx-root"))


@contextmanager
def nginx_site(root: Path, bundle: Path, repo_id: str, revision: str, work: Path) -> Iterator[Nginx]:
    """The role's site for the checkpoint `repo_id` at `revision` in `bundle` (the directory holding hf/), run
    by nginx in the foreground in one process (no worker user to switch to); stopped by its pid."""
    work.mkdir(parents=True, exist_ok=True)
    port = free_port()
    # The role's layout: nginx's root is the current link to a release, the bundle directory holding hf/.
    (work / "current").symlink_to(bundle)
    site = render_site(
        {
            "ansible_managed": "test",
            "offline_mirror_listen_host": "127.0.0.1",
            "kimi_offline_mirror_port": port,
            "offline_mirror_current": str(work / "current"),
            # The manifest's built_for.checkpoint, as the role reads it.
            "offline_mirror_checkpoint": {"repo_id": repo_id, "revision": revision},
        }
    )
    assert "location /hf/ {" in site
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
    log_format kimi '$request_method $uri $status $http_range';
    access_log {access_log} kimi;
    # Debian's nginx.conf has gzip on: the checkpoint's location must turn it off for what it serves.
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
        yield Nginx(f"http://127.0.0.1:{port}", access_log, site)
    finally:
        process.terminate()  # this pid only
        process.wait(timeout=15)


def test_nginx_serves_the_layout_as_plain_files_to_the_fetch_program(lab_build, nginx_root, tmp_path, capsys):
    hf, program = lab_build.hf, fetch_program()
    repo_id, revision = hf["repo_id"], hf["revision"]
    in_layout = {item.repo_path: lab_build.layout / item.path for item in lab_build.third.files}
    # The list the role writes for the program from the manifest: URL on the mirror, path, size.
    listed = tmp_path / "files.json"
    with nginx_site(nginx_root, lab_build.layout.parent, repo_id, revision, tmp_path / "nginx") as nginx:
        mirror_url = nginx.base + "/"
        files = [
            {"url": kbc.file_url(mirror_url, repo_id, revision, item.path), "path": item.path, "size": item.size}
            for item in lab_build.third.repo_files
        ]
        listed.write_text(json.dumps(files))
        # A node's earlier run was cut halfway through the largest file.
        target = tmp_path / "checkpoint"
        largest = max(lab_build.third.repo_files, key=lambda repo_file: repo_file.size)
        half = largest.size // 2
        partial = program.partial_path(target, largest.path)
        partial.parent.mkdir(parents=True)
        partial.write_bytes(in_layout[largest.path].read_bytes()[:half])

        with timed("lab: kimi-checkpoint-fetch.py from the role's nginx"):
            assert program.main(["kimi-checkpoint-fetch.py", str(listed), str(target)]) == 0
        assert f"fetched {len(files)} of {len(files)} files" in capsys.readouterr().out.splitlines()
        for path, source in in_layout.items():
            assert (target / path).read_bytes() == source.read_bytes(), path
        assert not partial.exists()
        # One GET per file, a 200 with the whole file; the partial's rest asked from its end and sent as a 206.
        uri = {path: f"/hf/{kbh.resolve_path(repo_id, revision, path)}" for path in in_layout}
        expected = [("GET", uri[path], 200, "-") for path in in_layout if path != largest.path]
        expected.append(("GET", uri[largest.path], 206, f"bytes={half}-"))
        assert sorted(nginx.requests()) == sorted(expected)
        # Run again, it finds every file at its size and asks nothing.
        assert program.main(["kimi-checkpoint-fetch.py", str(listed), str(target)]) == 0
        assert len(nginx.requests()) == len(expected)

        # A file as it is, whatever the client accepts, and no Hub header.
        status, headers, body = nginx.ask(uri[largest.path], headers={"Accept-Encoding": "gzip"})
        assert (status, body) == (200, in_layout[largest.path].read_bytes())
        assert not {name.lower() for name in headers} & (HUB_HEADERS | {"content-encoding"}), headers
        status, headers, _ = nginx.ask(uri[largest.path], "HEAD")
        assert (status, headers["Content-Length"]) == (200, str(largest.size))
        # The JSON the builder kept under hf/api/ is a static file like the others.
        for document in lab_build.third.documents:
            status, headers, body = nginx.ask(f"/hf/{document.path}", headers={"Accept-Encoding": "gzip"})
            assert (status, body) == (200, (lab_build.layout / document.path).read_bytes()), document.path
            assert not {name.lower() for name in headers} & (HUB_HEADERS | {"content-encoding"}), headers

        # Files only: a directory, a file the bundle does not hold, another revision are 404, without Hub codes.
        for path in (
            f"/hf/{repo_id}/resolve/{revision}/",
            f"/hf/{repo_id}/resolve/{revision}",
            f"/hf/api/models/{repo_id}/tree/",
            "/hf/api/models/",
            "/hf/",
            f"/hf/{kbh.resolve_path(repo_id, revision, 'nope.bin')}",
            f"/hf/{kbh.resolve_path(repo_id, 'f' * 40, largest.path)}",
            f"/hf/{kbh.tree_path(repo_id, 'f' * 40)}",
        ):
            status, headers, _ = nginx.ask(path)
            assert status == 404, path
            assert not {name.lower() for name in headers} & HUB_HEADERS, (path, headers)
        missing = kbc.file_url(mirror_url, repo_id, revision, "nope.bin")
        with pytest.raises(program.FetchError, match=r"answered 404 Not Found$"):
            program.fetch([missing], tmp_path / "other", "nope.bin", 1)
        # Read-only: GET and HEAD, nothing else.
        for method in ("POST", "PUT", "DELETE"):
            status, _, _ = nginx.ask(uri[largest.path], method)
            assert status == 403, method
