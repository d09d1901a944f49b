"""The checkpoint part of an air-gapped bundle (bin/kimi-bundle): the pinned Hugging Face repository, fetched
from the Hub (or a mirror) into a plain directory. The offline mirror serves its files as plain files, and the
checkpoint role on each node fetches them with plain GETs and checks them against the bundle's manifest
(plugins/module_utils/kimi_bundle_checkpoint.py, docs/air-gapped.md): nothing here imitates the Hub's API. The
directory, relative to the bundle's ``hf/``:

- ``ORG/NAME/resolve/SHA/PATH``: the files themselves (resolve_path), the paths the nodes fetch;
- ``api/models/ORG/NAME/revision/SHA``: the source's answer to GET /api/models/ORG/NAME/revision/SHA, with its
  ``siblings`` narrowed to the bundle's files (revision_path);
- ``api/models/ORG/NAME/tree/SHA``: every page of GET /api/models/ORG/NAME/tree/SHA?recursive=true&expand=false
  merged into one JSON array, narrowed to the bundle's files and their folders, without ``xetHash`` (tree_path,
  servable_tree). The two answers are the source's own word on each file's size and checksum: ``bin/kimi-bundle
  verify`` checks the files against them as well as against the manifest.

Why a plain directory and not olah: olah 0.5.4's offline mode reads every LFS object whole into memory and
hashes the whole file on every HEAD, which a 1 TB checkpoint (about 60 shards of several GB) cannot afford. A
static server (nginx, configured by the offline_mirror role) streams files with sendfile and honours byte
ranges.

How it fetches, and why not huggingface_hub: stdlib urllib, the same two API requests kimi_hf_repo_files makes,
then one GET per file of the resolve URL (redirects followed; the token is sent to the endpoint's own origin
only, as huggingface_hub drops it for a CDN). bin/kimi-bundle runs in the controller's environment, which has no
huggingface_hub (module_utils use the standard library and ``packaging``); the layout needs the source's JSON
answers as they are, which HfApi turns into objects; hf_hub_download keeps its own metadata in the target
directory and cannot take a file another directory already holds.

Reuse and resume: a file already at its place in the layout, or anywhere under the reuse directories (a previous
bundle's ``hf/``, an ``hf download --local-dir`` copy, a HF cache), whose size and checksum (the tree's LFS
sha256, else its git blob id, as kimi_checkpoint verifies) match is kept or hard-linked (copied across file
systems); only files of a listed size are ever hashed. The rest is downloaded into a partial file named by its
checksum, continued with a Range request after an interruption, verified, and renamed into place. What the
layout held that this revision does not need is removed at the end, after it could be reused.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import shutil
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from email.message import Message
from pathlib import Path, PurePosixPath
from typing import Any

from ansible_collections.kimi.k2.plugins.module_utils.kimi_bundle_tree import BundleError, safe_path
from ansible_collections.kimi.k2.plugins.module_utils.kimi_checkpoint import (
    HASH_BLOCK,
    RepoFile,
    explain_hub_error,
    files_from_tree,
    hub_retry_delay,
    is_commit_sha,
    next_page,
    select_files,
)
from ansible_collections.kimi.k2.plugins.module_utils.kimi_inputs import REPO_ID
from ansible_collections.kimi.k2.plugins.module_utils.kimi_report import write_atomic

from .kimi_bundle_apt import link_or_copy

# The layout's directory in a bundle; the offline mirror serves it as HF_ENDPOINT <mirror>/hf.
HF_DIR = "hf"
# Partial downloads live here, under the layout's directory, until verified; removed when a run completes.
PARTIAL_DIR = ".partial"
# Tree fields nothing in the bundle uses (the xet protocol's hash): left out of the stored listing.
UNSERVABLE_TREE_FIELDS = ("xetHash",)
# How each file of the layout came to be there in this run.
KEPT, LINKED, FETCHED = "kept", "linked", "fetched"
DEFAULT_WORKERS = 8
DEFAULT_TIMEOUT = 60.0
USER_AGENT = "kimi-bundle"
CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


class CheckpointFetchError(BundleError):
    """The checkpoint could not be fetched or verified; the message names the file or request and why."""


class _HubAnswerError(Exception):
    """One failed request: the HTTP status (-1: no answer) and what the server said."""

    def __init__(self, status: int, reason: str, headers: Message | None = None, transferred: int = 0) -> None:
        super().__init__(f"HTTP {status} {reason}" if status > 0 else reason)
        self.status = status
        self.reason = reason
        self.headers = headers
        # Bytes of the file written before the transfer broke.
        self.transferred = transferred


# ---------------------------------------------------------------------------------------------- the layout


def resolve_path(repo_id: str, revision: str, path: str) -> str:
    """Where a file of the checkpoint lies in the layout (and on the offline mirror, as a plain file)."""
    return f"{repo_id}/resolve/{revision}/{path}"


def revision_path(repo_id: str, revision: str) -> str:
    return f"api/models/{repo_id}/revision/{revision}"


def tree_path(repo_id: str, revision: str) -> str:
    return f"api/models/{repo_id}/tree/{revision}"


def resolve_url(endpoint: str, repo_id: str, revision: str, path: str) -> str:
    """The URL hf_hub_url builds: the file's path quoted, its slashes kept."""
    return f"{endpoint}/{repo_id}/resolve/{revision}/{urllib.parse.quote(path)}"


def tree_url(endpoint: str, repo_id: str, revision: str) -> str:
    """The first page of the listing, asked exactly as kimi_hf_repo_files and HfApi.list_repo_tree ask it."""
    return f"{endpoint}/{tree_path(repo_id, revision)}?recursive=true&expand=false"


def revision_url(endpoint: str, repo_id: str, revision: str) -> str:
    return f"{endpoint}/{revision_path(repo_id, revision)}"


# ------------------------------------------------------------------------------------- the tree (pure)


def merge_pages(pages: Iterable[Any]) -> list[dict[str, Any]]:
    """The pages of a paginated tree answer as one listing; a page that is not a list of entries, an entry
    without a path, or one path listed twice (pages that overlap) is refused."""
    entries: list[dict[str, Any]] = []
    seen: set[str] = set()
    for number, page in enumerate(pages, start=1):
        if not isinstance(page, list):
            raise CheckpointFetchError(f"tree page {number} is not a JSON array")
        for entry in page:
            if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
                raise CheckpointFetchError(f"tree page {number} has an entry without a path: {entry!r}"[:300])
            if entry["path"] in seen:
                raise CheckpointFetchError(f"tree page {number} lists {entry['path']} again (overlapping pages)")
            seen.add(entry["path"])
            entries.append(entry)
    return entries


def checked_files(
    entries: Sequence[Mapping[str, Any]], include: Sequence[str], exclude: Sequence[str]
) -> list[RepoFile]:
    """The files the role selects from the listing (kimi_checkpoint's reading and matching), each with a path
    that stays inside the layout; none selected is an error, as in kimi_hf_repo_files."""
    try:
        files = select_files(files_from_tree(list(entries)), list(include), list(exclude))
    except (KeyError, TypeError, ValueError) as error:
        raise CheckpointFetchError(f"the tree listing has a malformed file entry: {error}") from None
    unsafe = [repo_file.path for repo_file in files if not safe_path(repo_file.path)]
    if unsafe:
        raise CheckpointFetchError(f"the tree listing names paths outside the repository: {', '.join(unsafe[:5])}")
    if not files:
        raise CheckpointFetchError("no file of the tree listing matches the include/exclude patterns")
    return files


def _folders_of(paths: Iterable[str]) -> set[str]:
    folders: set[str] = set()
    for path in paths:
        folders.update(str(parent) for parent in PurePosixPath(path).parents if str(parent) != ".")
    return folders


def servable_tree(entries: Sequence[Mapping[str, Any]], files: Sequence[RepoFile]) -> list[dict[str, Any]]:
    """The listing the mirror serves: the selected files and the folders above them, in the source's order,
    each entry as the source gave it but for the fields a static server cannot honour."""
    chosen = {repo_file.path for repo_file in files}
    folders = _folders_of(chosen)
    kept = []
    for entry in entries:
        wanted = chosen if entry.get("type") == "file" else folders
        if entry.get("path") in wanted:
            kept.append({key: value for key, value in entry.items() if key not in UNSERVABLE_TREE_FIELDS})
    return kept


def servable_revision(info: Mapping[str, Any], files: Sequence[RepoFile]) -> dict[str, Any]:
    """The revision answer the mirror serves: the source's, its siblings narrowed to the bundle's files."""
    chosen = {repo_file.path for repo_file in files}
    served = dict(info)
    if isinstance(info.get("siblings"), list):
        served["siblings"] = [s for s in info["siblings"] if isinstance(s, dict) and s.get("rfilename") in chosen]
    return served


def json_document(value: Any) -> bytes:
    """The bytes of a served JSON answer: compact as the Hub's, key order as the source gave it."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


# ------------------------------------------------------------------------------- local copies (pure parts)


@dataclass(frozen=True)
class Digest:
    """What one read of a local file found: its size, sha256 and (when asked) git blob id."""

    size: int
    sha256: str
    git_oid: str | None = None


def content_matches(repo_file: RepoFile, digest: Digest | None) -> bool:
    """The local bytes are the listed file's: same size and the checksum the Hub gives (LFS sha256, else git
    blob id). A file the Hub gives no checksum for never matches, so it is never taken from a local copy."""
    if digest is None or digest.size != repo_file.size:
        return False
    if repo_file.sha256:
        return digest.sha256 == repo_file.sha256
    return bool(repo_file.git_oid) and digest.git_oid == repo_file.git_oid


def content_problem(repo_file: RepoFile, digest: Digest) -> str | None:
    """Why downloaded bytes are not the listed file (size, then checksum); None when they are."""
    if digest.size != repo_file.size:
        return f"{digest.size} bytes, the tree lists {repo_file.size}"
    if repo_file.sha256 and digest.sha256 != repo_file.sha256:
        return f"sha256 {digest.sha256}, the tree lists {repo_file.sha256}"
    if not repo_file.sha256 and repo_file.git_oid and digest.git_oid != repo_file.git_oid:
        return f"git blob id {digest.git_oid}, the tree lists {repo_file.git_oid}"
    return None


def reuse_candidates(repo_file: RepoFile, target: str, sizes: Mapping[str, int]) -> list[str]:
    """Local files that may hold the file's bytes, in the order they are hashed: only those of its size (a
    stat decides, so nothing else is read), its own place in the layout first, then by path."""
    same_size = [path for path, size in sizes.items() if size == repo_file.size]
    return sorted(same_size, key=lambda path: (path != target, path))


def partial_name(repo_file: RepoFile, revision: str) -> str:
    """The partial download's name: its checksum, so a partial left by an interrupted build of another
    revision continues the same bytes and never becomes another file."""
    key = repo_file.sha256 or repo_file.git_oid
    if key is None:
        key = hashlib.sha256(f"{revision}/{repo_file.path}".encode()).hexdigest()
    return f"{key}.part"


def download_groups(missing: Iterable[RepoFile], revision: str) -> list[list[RepoFile]]:
    """The files to download grouped by partial download: files with the same checksum (the same bytes under
    two paths) are downloaded once, by the first of their group, and the others take a copy of it; two
    threads never write one partial."""
    groups: dict[str, list[RepoFile]] = {}
    for repo_file in missing:
        groups.setdefault(partial_name(repo_file, revision), []).append(repo_file)
    return list(groups.values())


def unwanted_paths(present: Iterable[str], wanted: Iterable[str]) -> list[str]:
    """What the layout holds that this revision does not use (another revision's files and answers)."""
    keep = set(wanted)
    return sorted(path for path in present if path not in keep)


def content_range_start(value: str | None) -> int | None:
    """The first byte of a 206 answer's Content-Range, or None when it has none."""
    found = CONTENT_RANGE.fullmatch((value or "").strip())
    return int(found.group(1)) if found else None


# ------------------------------------------------------------------------------------ the server rules


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    default = {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), parts.port or default


class _SameOriginAuthRedirect(urllib.request.HTTPRedirectHandler):
    """Follows redirects; the token goes along only while the origin stays the same. A Hub resolve of an LFS
    file redirects to a CDN with a signed URL, which must not see it (huggingface_hub drops it there too)."""

    def redirect_request(
        self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Message, newurl: str
    ) -> urllib.request.Request | None:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        auth = req.unredirected_hdrs.get("Authorization")
        if new is not None and auth and _origin(req.full_url) == _origin(newurl):
            new.add_unredirected_header("Authorization", auth)
        return new


class HubClient:
    """GETs against the Hub or a mirror, with kimi_checkpoint's retry rule and error messages."""

    def __init__(self, endpoint: str, token: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.token = token or None
        self.timeout = timeout
        self._opener = urllib.request.build_opener(_SameOriginAuthRedirect())

    def open(self, url: str, headers: Mapping[str, str] | None = None) -> Any:
        """One request's response (the caller closes it); _HubAnswerError for an error status or no answer."""
        request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT, **(headers or {})})
        if self.token:
            # Unredirected: the redirect handler decides whether it follows.
            request.add_unredirected_header("Authorization", f"Bearer {self.token}")
        try:
            return self._opener.open(request, timeout=self.timeout)
        except urllib.error.HTTPError as error:
            error.close()
            raise _HubAnswerError(error.code, str(error.reason), error.headers) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
            reason = getattr(error, "reason", error)
            raise _HubAnswerError(-1, f"no answer: {reason!s}") from None

    def retrying(self, what: str, call: Callable[[], Any]) -> Any:
        """call() until it succeeds or hub_retry_delay gives up; then CheckpointFetchError, explained."""
        attempt = 1
        while True:
            try:
                return call()
            except _HubAnswerError as error:
                retry_after = error.headers.get("Retry-After") if error.headers else None
                delay = hub_retry_delay(attempt, error.status, retry_after)
                if delay is None:
                    raise CheckpointFetchError(self.explain(what, error, attempt)) from None
            time.sleep(delay)
            attempt += 1

    def explain(self, what: str, error: _HubAnswerError, attempts: int) -> str:
        if error.status < 0:
            return f"{what}: cannot reach {self.endpoint}: {error.reason} (after {attempts} attempt(s))"
        code = error.headers.get("X-Error-Code") if error.headers else None
        message = error.headers.get("X-Error-Message") if error.headers else None
        return explain_hub_error(what, error.status, error.reason, bool(self.token), code, message)

    def get_json(self, url: str, what: str) -> tuple[Any, str | None]:
        """The parsed answer of a GET and its Link header."""

        def call() -> tuple[Any, str | None]:
            with self.open(url, {"Accept": "application/json"}) as response:
                try:
                    body, link = response.read(), response.headers.get("Link")
                except (OSError, http.client.HTTPException) as error:  # cut mid-answer: as if none came
                    raise _HubAnswerError(-1, f"the answer broke: {error!r}") from None
            try:
                return json.loads(body), link
            except ValueError as error:
                raise CheckpointFetchError(f"{what}: unexpected answer from {url.split('?')[0]}: {error}") from None

        return self.retrying(what, call)


def fetch_revision(client: HubClient, repo_id: str, revision: str) -> dict[str, Any]:
    """The source's revision answer, which must name this very commit."""
    what = f"reading revision {revision} of {repo_id}"
    info, _ = client.get_json(revision_url(client.endpoint, repo_id, revision), what)
    if not isinstance(info, dict) or info.get("sha") != revision:
        found = info.get("sha") if isinstance(info, dict) else None
        raise CheckpointFetchError(f"{what}: the answer names commit {found!r}, not {revision}")
    return info


def fetch_tree(client: HubClient, repo_id: str, revision: str) -> list[dict[str, Any]]:
    """Every page of the recursive listing (Link rel="next"), merged."""
    what = f"listing {repo_id} at revision {revision}"
    url: str | None = tree_url(client.endpoint, repo_id, revision)
    pages, asked = [], set()
    while url:
        if url in asked:  # a server sending the same page again would loop forever
            raise CheckpointFetchError(f"{what}: the pages link back to {url}")
        asked.add(url)
        page, link = client.get_json(url, what)
        pages.append(page)
        url = next_page(link)
    return merge_pages(pages)


# ---------------------------------------------------------------------------------- local files (I/O)


def digest_file(path: Path, with_git_oid: bool) -> Digest:
    """Size, sha256 and optionally the git blob id of a file in one read (a shard is read once, not twice)."""
    sha256 = hashlib.sha256()
    with path.open("rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        sha1 = hashlib.sha1(f"blob {size}\0".encode(), usedforsecurity=False) if with_git_oid else None
        read = 0
        while block := handle.read(HASH_BLOCK):
            sha256.update(block)
            if sha1 is not None:
                sha1.update(block)
            read += len(block)
    # A file that changed size while read: the blob header above is wrong, so no git id is claimed.
    git_oid = sha1.hexdigest() if sha1 is not None and read == size else None
    return Digest(read, sha256.hexdigest(), git_oid)


class LocalFiles:
    """Regular files under some directories, by absolute path and size (symlinks to files followed, so a HF
    cache's snapshots count), each hashed at most once per kind of digest, from several threads."""

    def __init__(self, roots: Iterable[Path], skip: Iterable[Path] = ()) -> None:
        skipped = {Path(path).absolute() for path in skip}
        self.sizes: dict[str, int] = {}
        for root in roots:
            self._walk(Path(root).absolute(), skipped)
        self._digests: dict[tuple[str, bool], Digest | None] = {}
        self._lock = threading.Lock()

    def _walk(self, root: Path, skipped: set[Path]) -> None:
        if not root.is_dir() or root in skipped:
            return
        for directory, folders, names in os.walk(root):
            folders[:] = [name for name in folders if Path(directory, name) not in skipped]
            for name in names:
                path = Path(directory, name)
                try:
                    found = path.stat()
                except OSError:  # a dangling link
                    continue
                if path.is_file():
                    self.sizes[str(path)] = found.st_size

    def of_size(self, size: int) -> dict[str, int]:
        return {path: found for path, found in self.sizes.items() if found == size}

    def digest(self, path: str, with_git_oid: bool) -> Digest | None:
        key = (path, with_git_oid)
        with self._lock:
            if key in self._digests:
                return self._digests[key]
        try:
            found: Digest | None = digest_file(Path(path), with_git_oid)
        except OSError:  # gone since the walk (a bad copy another thread removed)
            found = None
        with self._lock:
            self._digests[key] = found
        return found

    def forget(self, path: str) -> None:
        """`path` was removed or replaced: its digests no longer hold."""
        with self._lock:
            for key in [key for key in self._digests if key[0] == path]:
                del self._digests[key]


# ------------------------------------------------------------------------------------------- the fetch


@dataclass(frozen=True)
class LayoutFile:
    """One file of the layout: its path under the layout's directory, its repository path (None for the two
    API answers), size, sha256 and how it came to be there in this run (KEPT, LINKED, FETCHED)."""

    path: str
    size: int
    sha256: str
    how: str
    repo_path: str | None = None


@dataclass(frozen=True)
class CheckpointFetch:
    """The layout after fetch_checkpoint. fetched_bytes came over the network in this run; resumed_bytes were
    already in partial downloads; reused_bytes were kept in place or taken from a local copy."""

    repo_id: str
    revision: str
    files: tuple[LayoutFile, ...]
    documents: tuple[LayoutFile, ...]
    repo_files: tuple[RepoFile, ...]
    fetched_bytes: int
    resumed_bytes: int
    reused_bytes: int
    removed: tuple[str, ...]

    def manifest_entries(self, prefix: str = "hf") -> list[dict[str, Any]]:
        """{path, size, sha256} of every file of the layout, `prefix`/ before each path, sorted: the bundle's
        manifest takes them as they are instead of hashing the checkpoint again."""
        base = prefix.strip("/")
        entries = [
            {"path": f"{base}/{item.path}" if base else item.path, "size": item.size, "sha256": item.sha256}
            for item in (*self.files, *self.documents)
        ]
        return sorted(entries, key=lambda entry: entry["path"])


def _size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else 0


def _first_failure_or_results(futures: Sequence[Future]) -> list[Any]:
    """The futures' results in order, or the first failure raised as soon as it happens: the other files
    not started yet are cancelled rather than downloaded for hours before the run fails."""
    done, pending = wait(futures, return_when=FIRST_EXCEPTION)
    failed = [future for future in futures if future in done and future.exception() is not None]
    if failed:
        for future in pending:
            future.cancel()
        raise failed[0].exception()  # type: ignore[misc]
    return [future.result() for future in futures]


class _Fetcher:
    """One fetch_checkpoint run: where things go, and the bytes that came over the network."""

    def __init__(self, client: HubClient, repo_id: str, revision: str, out: Path, partial_dir: Path) -> None:
        self.client = client
        self.repo_id = repo_id
        self.revision = revision
        self.out = out
        self.partial_dir = partial_dir
        self.fetched_bytes = 0
        self.resumed_bytes = 0
        self._lock = threading.Lock()

    def target(self, repo_file: RepoFile) -> Path:
        return self.out / resolve_path(self.repo_id, self.revision, repo_file.path)

    def _layout_file(self, repo_file: RepoFile, sha256: str, how: str) -> LayoutFile:
        path = self.target(repo_file).relative_to(self.out).as_posix()
        return LayoutFile(path, repo_file.size, sha256, how, repo_file.path)

    def from_local(self, repo_file: RepoFile, local: LocalFiles) -> LayoutFile | None:
        """The file kept in place or taken from a local copy with the same bytes; None when none has them. A
        file at its place with other bytes is removed at once, so a failed run never leaves it there."""
        target = self.target(repo_file)
        if target.is_symlink():  # the layout holds files only (a link could leave the bundle)
            target.unlink()
            local.forget(str(target))
        with_git = repo_file.sha256 is None
        for candidate in reuse_candidates(repo_file, str(target), local.of_size(repo_file.size)):
            digest = local.digest(candidate, with_git)
            if digest is not None and content_matches(repo_file, digest):
                if candidate == str(target):
                    return self._layout_file(repo_file, digest.sha256, KEPT)
                target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    link_or_copy(Path(candidate), target)
                except FileNotFoundError:  # another thread found it bad at its own place and removed it
                    continue
                local.forget(str(target))
                return self._layout_file(repo_file, digest.sha256, LINKED)
            if candidate == str(target):
                target.unlink(missing_ok=True)
                local.forget(candidate)
        return None

    def download(self, repo_file: RepoFile) -> LayoutFile:
        """The file from the source into its partial, verified, renamed into place. A resumed partial that
        fails verification is dropped and the file fetched once more from its first byte."""
        partial = self.partial_dir / partial_name(repo_file, self.revision)
        resumed = _size(partial) > 0
        digest, got = self._fetch_into(repo_file, partial)
        problem = content_problem(repo_file, digest)
        if problem and resumed:
            partial.unlink()
            digest, again = self._fetch_into(repo_file, partial)
            got += again
            problem = content_problem(repo_file, digest)
        if problem:
            partial.unlink(missing_ok=True)
            raise CheckpointFetchError(f"{self.repo_id} {repo_file.path} at {self.revision}: downloaded {problem}")
        with self._lock:
            self.resumed_bytes += max(repo_file.size - got, 0)
        target = self.target(repo_file)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial.chmod(0o644)
        partial.replace(target)
        return self._layout_file(repo_file, digest.sha256, FETCHED)

    def copy_of(self, downloaded: LayoutFile, repo_file: RepoFile) -> LayoutFile:
        """A file with the same bytes as one just downloaded, linked (or copied) from it."""
        target = self.target(repo_file)
        target.parent.mkdir(parents=True, exist_ok=True)
        link_or_copy(self.out / downloaded.path, target)
        return self._layout_file(repo_file, downloaded.sha256, LINKED)

    def _fetch_into(self, repo_file: RepoFile, partial: Path) -> tuple[Digest, int]:
        """The partial completed from the source: its digest and the bytes this took. A transfer cut after
        some bytes arrived continues from them and starts the retry count again, as hf's http_get does;
        error statuses get kimi_checkpoint's bounded retries."""
        url = resolve_url(self.client.endpoint, self.repo_id, self.revision, repo_file.path)
        what = f"downloading {repo_file.path} of {self.repo_id} at {self.revision}"
        got = failures = 0
        while True:
            before = _size(partial)
            try:
                got += self._get_rest(url, repo_file.size, partial)
                return digest_file(partial, repo_file.sha256 is None), got
            except _HubAnswerError as error:
                got += error.transferred
                failures = 1 if _size(partial) > before else failures + 1
                retry_after = error.headers.get("Retry-After") if error.headers else None
                delay = hub_retry_delay(failures, error.status, retry_after)
                if delay is None:
                    raise CheckpointFetchError(self.client.explain(what, error, failures)) from None
            time.sleep(delay)

    def _get_rest(self, url: str, size: int, partial: Path) -> int:
        """One GET of what the partial lacks (a Range from its length; 200 instead of 206 starts it over);
        returns the bytes written."""
        partial.parent.mkdir(parents=True, exist_ok=True)
        have = _size(partial)
        if have > size:  # not this file's beginning
            partial.unlink()
            have = 0
        if have == size and size > 0:  # complete already: the digest decides
            return 0
        headers = {"Accept-Encoding": "identity", **({"Range": f"bytes={have}-"} if have else {})}
        with self.client.open(url, headers) as response:
            start = content_range_start(response.headers.get("Content-Range"))
            append = bool(have) and response.status == 206 and start == have
            if response.status == 206 and not append:
                raise _HubAnswerError(-1, f"asked for bytes {have}- and got a range from {start}")
            written = self._copy(response, partial, "ab" if append else "wb", size)
        # A connection closed early reads as a short body, not an error: continue from where it stopped.
        if _size(partial) < size:
            raise _HubAnswerError(-1, f"the transfer ended at byte {_size(partial)} of {size}", transferred=written)
        return written

    def _copy(self, response: Any, partial: Path, mode: str, size: int) -> int:
        """The answer's body into the partial; a broken connection keeps what arrived for the next attempt,
        a failing disk is raised as it is (no retry helps)."""
        written = 0
        with partial.open(mode) as out:
            # Never more than one byte past the listed size: verification then names the size.
            while out.tell() <= size:
                try:
                    block = response.read(HASH_BLOCK)
                except (OSError, http.client.HTTPException) as error:
                    raise _HubAnswerError(-1, f"the transfer broke: {error!r}", transferred=written) from None
                if not block:
                    break
                out.write(block)
                written += len(block)
                with self._lock:
                    self.fetched_bytes += len(block)
        return written


def _place_files(
    fetcher: _Fetcher, files: Sequence[RepoFile], local: LocalFiles, workers: int, say: Callable[[str], None]
) -> list[LayoutFile]:
    """Every file in place, in the listing's order: first what local copies hold (hashing in parallel), then
    the rest downloaded, `workers` at a time."""
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        settled = _first_failure_or_results([pool.submit(fetcher.from_local, f, local) for f in files])
        missing = [repo_file for repo_file, found in zip(files, settled, strict=True) if found is None]
        say(f"{len(files) - len(missing)} files reused, {len(missing)} to download")
        groups = download_groups(missing, fetcher.revision)
        downloaded = _first_failure_or_results([pool.submit(fetcher.download, group[0]) for group in groups])
    placed = {}
    for group, first in zip(groups, downloaded, strict=True):
        placed[group[0].path] = first
        placed.update({twin.path: fetcher.copy_of(first, twin) for twin in group[1:]})
    return [found if found is not None else placed[f.path] for f, found in zip(files, settled, strict=True)]


def _remove_unwanted(out: Path, wanted: Iterable[str], partial_dir: Path) -> list[str]:
    """Remove the layout's files this revision does not use and the folders left empty; returns their paths.
    The partial downloads are not looked at (the caller removes them once every file is in place)."""
    present = []
    for directory, folders, names in os.walk(out):
        folders[:] = [name for name in folders if Path(directory, name) != partial_dir]
        present += [Path(directory, name).relative_to(out).as_posix() for name in names]
    removed = unwanted_paths(present, wanted)
    for path in removed:
        (out / path).unlink()
    for directory, _, _ in sorted(os.walk(out), key=lambda item: -len(item[0])):
        if Path(directory) != out and not any(Path(directory).iterdir()):
            Path(directory).rmdir()
    return removed


def _write_document(out: Path, path: str, payload: bytes) -> LayoutFile:
    target = out / path
    target.parent.mkdir(parents=True, exist_ok=True)
    how = FETCHED if write_atomic(target, payload) else KEPT
    return LayoutFile(path, len(payload), hashlib.sha256(payload).hexdigest(), how)


def _check_arguments(endpoint: str, repo_id: str, revision: str) -> None:
    if not REPO_ID.fullmatch(repo_id or ""):
        raise CheckpointFetchError(f"repo_id {repo_id!r} is not a Hub repository id (org/name)")
    # A bundle is frozen: a branch would name whatever the source has on the day of the build.
    if not is_commit_sha(revision):
        raise CheckpointFetchError(f"revision {revision!r} is not a 40-hex commit sha")
    if urllib.parse.urlsplit(endpoint).scheme not in ("http", "https"):
        raise CheckpointFetchError(f"endpoint {endpoint!r} is not an http(s) URL")


def fetch_checkpoint(
    endpoint: str,
    repo_id: str,
    revision: str,
    include: Sequence[str],
    exclude: Sequence[str],
    out_hf_dir: Path,
    reuse_dirs: Sequence[Path] = (),
    token: str | None = None,
    *,
    workers: int = DEFAULT_WORKERS,
    timeout: float = DEFAULT_TIMEOUT,
    log: Callable[[str], None] | None = None,
) -> CheckpointFetch:
    """`repo_id` at `revision` from `endpoint` (the Hub, or a mirror that answers like it) laid out under
    `out_hf_dir` for a static server (see the module docstring), the files the role's include/exclude select.

    Each file is kept in place, taken from `reuse_dirs` or the layout itself (same size and checksum), or
    downloaded (a partial under `out_hf_dir`/.partial continued), `workers` at a time; each is verified against
    the listing's size and LFS sha256 or git blob id. Files of another revision are removed after this one
    took what it could from them; the two API answers are written last, so a layout without them is
    incomplete. CheckpointFetchError names what failed. The token goes to the endpoint's origin only.
    """
    _check_arguments(endpoint, repo_id, revision)
    say = log or (lambda _line: None)
    out = Path(out_hf_dir).absolute()
    partial_dir = out / PARTIAL_DIR
    client = HubClient(endpoint, token, timeout)
    info = fetch_revision(client, repo_id, revision)
    entries = fetch_tree(client, repo_id, revision)
    files = checked_files(entries, include, exclude)
    say(f"{repo_id} at {revision}: {len(files)} files, {sum(f.size for f in files)} bytes")
    fetcher = _Fetcher(client, repo_id, revision, out, partial_dir)
    local = LocalFiles([out, *map(Path, reuse_dirs)], skip=[partial_dir])
    layout = _place_files(fetcher, files, local, workers, say)
    documents = (
        _write_document(out, tree_path(repo_id, revision), json_document(servable_tree(entries, files))),
        _write_document(out, revision_path(repo_id, revision), json_document(servable_revision(info, files))),
    )
    removed = _remove_unwanted(out, [item.path for item in (*layout, *documents)], partial_dir)
    # Every file is in place: what is left there belongs to files this revision does not have.
    shutil.rmtree(partial_dir, ignore_errors=True)
    return CheckpointFetch(
        repo_id=repo_id,
        revision=revision,
        files=tuple(layout),
        documents=documents,
        repo_files=tuple(files),
        fetched_bytes=fetcher.fetched_bytes,
        resumed_bytes=fetcher.resumed_bytes,
        reused_bytes=sum(item.size for item in layout if item.how != FETCHED),
        removed=tuple(removed),
    )
