"""Pure logic of the checkpoint phase: which files are missing, whether the disk can take them, how a
download is going, whether what is on disk is what the Hub listed, and the marker that says "done".

No Ansible, no network: the modules feed this plain data (a file list from the Hub, sizes read from disk) so
every rule here is unit-tested on its own.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path

COMMIT_SHA = re.compile(r"^[0-9a-f]{40}$")
# 2: the marker records every file's Hub checksum and its size, mtime_ns and inode at verification, so a file
# changed after it was marked is found by a stat (the role before trusting the marker, drift on its schedule).
MARKER_VERSION = 2
# What a stat compares. Not st_dev: on NFS every client numbers the mount itself, so a shared copy would differ
# per node. Not ctime: chown/chmod (the role's own ownership task) change it without touching the content.
STAT_FIELDS = ("size", "mtime_ns", "ino")
# Read files in 8 MiB blocks: large enough that hashing a 600 GB checkpoint is disk-bound, not call-bound.
HASH_BLOCK = 8 << 20


@dataclass(frozen=True)
class RepoFile:
    """One file of the repository at the pinned revision, as the Hub lists it."""

    path: str
    size: int
    # sha256 of the content where the Hub gives one (LFS files), else None.
    sha256: str | None = None
    # The git blob id (sha1 over "blob <size>\0" + content) the Hub gives for every file; None if unknown.
    git_oid: str | None = None


def is_commit_sha(revision: str) -> bool:
    return bool(COMMIT_SHA.match(revision or ""))


def files_from_tree(entries: list[dict]) -> list[RepoFile]:
    """RepoFile for every file entry of the Hub's `tree?recursive=true` answer (directories are dropped)."""
    files = []
    for entry in entries:
        if entry.get("type") != "file":
            continue
        lfs = entry.get("lfs") or {}
        # For an LFS file the top-level oid is the pointer's blob id, not the content's: only lfs.oid checks it.
        git_oid = None if lfs else entry.get("oid")
        size = int(lfs.get("size", entry.get("size", 0)))
        files.append(RepoFile(path=entry["path"], size=size, sha256=lfs.get("oid"), git_oid=git_oid))
    return sorted(files, key=lambda f: f.path)


def select_files(files: list[RepoFile], include: list[str], exclude: list[str]) -> list[RepoFile]:
    """The files `hf download --include/--exclude` fetches: matching any include (all when none), no exclude."""
    chosen = []
    for repo_file in files:
        if include and not any(fnmatch.fnmatch(repo_file.path, pattern) for pattern in include):
            continue
        if any(fnmatch.fnmatch(repo_file.path, pattern) for pattern in exclude):
            continue
        chosen.append(repo_file)
    return chosen


# The Hub API's answers, as kimi_hf_repo_files reads them (it fetches with ansible-core's fetch_url).
NEXT_LINK = re.compile(r'<([^>]+)>;\s*rel="next"')
# Answers worth asking again (what huggingface_hub's http_backoff retries): no answer at all (-1: refused,
# reset, timed out), rate limited, and the gateway/server errors of a Hub under load or a mirror restarting.
HUB_RETRY_STATUSES = frozenset({-1, 429, 500, 502, 503, 504})
HUB_ATTEMPTS = 3
HUB_MAX_RETRY_WAIT = 30.0
# The Hub names its 4xx answers in X-Error-Code (huggingface_hub maps them to its exception classes).
HUB_ERROR_CODES = {
    "GatedRepo": "the repository is gated: accept its conditions on the Hub with the token's account",
    "RepoNotFound": "the repository does not exist, or the token cannot see it",
    "RevisionNotFound": "the revision does not exist in the repository",
    "EntryNotFound": "the path does not exist at the revision",
}


def next_page(link: str | None) -> str | None:
    """The URL of the next page from a paginated answer's Link header, or None on the last page."""
    found = NEXT_LINK.search(link or "")
    return found.group(1) if found else None


def hub_retry_delay(attempt: int, status: int, retry_after: str | None = None) -> float | None:
    """Seconds to wait before asking again after attempt number `attempt` (from 1) answered `status` (-1: no
    answer), or None to give up: not a retryable answer, or the last attempt. Retry-After (seconds) counts when
    the server sends it, bounded so a run never sleeps for long."""
    if status not in HUB_RETRY_STATUSES or attempt >= HUB_ATTEMPTS:
        return None
    try:
        wait = float(retry_after) if retry_after is not None else 2.0 ** (attempt - 1)
    except ValueError:  # an HTTP date instead of seconds
        wait = 2.0 ** (attempt - 1)
    return min(max(wait, 0.0), HUB_MAX_RETRY_WAIT)


def explain_hub_error(
    what: str,
    status: int,
    reason: str,
    has_token: bool,
    error_code: str | None = None,
    error_message: str | None = None,
) -> str:
    """One line for a failed Hub request: what was asked, the HTTP status and what it means, and the Hub's own
    error code and message when it sends them (a gated repository, an unknown revision). Never the token."""
    token_state = "a token was sent" if has_token else "no token was sent"
    if status in (401, 403, 404):
        line = (
            f"{what}: HTTP {status}: the repository or revision does not exist, or it is private/gated and "
            f"the token is missing or wrong ({token_state})"
        )
    else:
        line = f"{what}: HTTP {status} {reason}".rstrip()
    said = [part for part in (HUB_ERROR_CODES.get(error_code or "", error_code), error_message) if part]
    if said:
        line += f"; the Hub says: {': '.join(said)}"[:400]
    return line


# ----------------------------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class Plan:
    total_bytes: int
    present_bytes: int
    missing: list[str]
    missing_bytes: int
    # Files on disk at a size other than the listed one: a later verify names them and the repair deletes them.
    wrong_size: list[str]


def plan(files: list[RepoFile], sizes_on_disk: dict[str, int]) -> Plan:
    """What is still to download, from the listed files and the sizes found locally (absent = not a key).

    A file at the wrong size counts as missing in full: hf restarts an interrupted file from zero.
    """
    missing, wrong_size = [], []
    present = missing_bytes = 0
    for repo_file in files:
        size = sizes_on_disk.get(repo_file.path)
        if size == repo_file.size:
            present += size
            continue
        missing.append(repo_file.path)
        missing_bytes += repo_file.size
        if size is not None:
            wrong_size.append(repo_file.path)
    total = sum(f.size for f in files)
    return Plan(total, present, missing, missing_bytes, wrong_size)


def disk_shortfall(host: str, path: str, missing_bytes: int, margin_bytes: int, free_bytes: int) -> str | None:
    """None when the free space covers what is missing plus the margin; otherwise the refusal, per host."""
    needed = missing_bytes + margin_bytes
    if needed <= free_bytes:
        return None
    return (
        f"{host}: not enough free space for the checkpoint under {path}: needed {needed} bytes "
        f"({human_bytes(needed)}: {human_bytes(missing_bytes)} missing + {human_bytes(margin_bytes)} margin), "
        f"available {free_bytes} bytes ({human_bytes(free_bytes)}); nothing was downloaded"
    )


def existing_ancestor(path: str) -> str:
    """The nearest directory that exists at or above `path` (its filesystem is the one that will hold it)."""
    current = Path(path).absolute()
    while not current.is_dir() and current.parent != current:
        current = current.parent
    return str(current)


# ----------------------------------------------------------------------------------------------- progress


def human_bytes(count: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(count) < 1000 or unit == "TB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} TB"  # unreachable; keeps type checkers calm


def human_duration(seconds: float) -> str:
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def progress_line(host: str, done: int, total: int, rate_bps: float | None) -> str:
    """One progress line: bytes on disk vs total, percentage, rate and ETA (unknown until a rate exists)."""
    percent = 100.0 * done / total if total else 100.0
    line = f"{host}: {human_bytes(done)} of {human_bytes(total)} ({percent:.1f}%)"
    if rate_bps is None or rate_bps <= 0:
        return f"{line}, rate unknown yet, ETA unknown"
    eta = max(total - done, 0) / rate_bps
    return f"{line}, {human_bytes(rate_bps)}/s, ETA {human_duration(eta)}"


def rate(previous: tuple[float, int] | None, now: tuple[float, int]) -> float | None:
    """Bytes per second between two (time, bytes) samples; None without a usable earlier sample."""
    if previous is None or now[0] <= previous[0]:
        return None
    return max(now[1] - previous[1], 0) / (now[0] - previous[0])


# The line of a log that states what went wrong: a Python exception ending a traceback ("httpx2.ReadTimeout:
# timed out", "huggingface_hub.errors.RepositoryNotFoundError: ...") or a CLI's own "Error: ..." line.
ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*(?:Error|Exception|Timeout)\b|Error\b)")
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def error_line(lines: list[str]) -> str | None:
    """The last line of a log that states an error, for a one-line failure message; None when there is none."""
    for line in reversed(lines):
        text = ANSI_ESCAPE.sub("", line).strip()
        if ERROR_LINE.match(text):
            return text
    return None


def stall_message(host: str, seconds: float, done: int, total: int, timeout: float, pid: int | None) -> str:
    """Why a download that stopped getting bytes was stopped: host, the seconds without growth, bytes so far."""
    percent = 100.0 * done / total if total else 100.0
    job = f"the hf job (pid {pid})" if pid is not None else "the hf job"
    return (
        f"{host}: the download stalled: no new bytes on disk for {seconds:.0f} s (checkpoint_stall_timeout "
        f"{timeout:g} s) with {done} bytes ({human_bytes(done)}, {percent:.1f}%) of {total} on disk; stopped {job}, "
        f"nothing is marked done"
    )


# ------------------------------------------------------------------------------------------- verification


def git_blob_sha1(path: Path) -> str:
    digest = hashlib.sha1(usedforsecurity=False)
    digest.update(f"blob {path.stat().st_size}\0".encode())
    with path.open("rb") as handle:
        while block := handle.read(HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def content_problem(path: Path, name: str, sha256: str | None, git_oid: str | None) -> str | None:
    """Why the file's content is not the listed one (the Hub's or the bundle manifest's sha256 where given, else the
    git blob id); None when it is."""
    if sha256 and file_sha256(path) != sha256:
        return f"{name}: sha256 differs from the listed {sha256}"
    if not sha256 and git_oid and git_blob_sha1(path) != git_oid:
        return f"{name}: git blob id differs from the listed {git_oid}"
    return None


def verify(directory: Path, files: list[RepoFile], checksums: bool, only: list[str] | None = None) -> list[str]:
    """Problems with the local copy, one per bad file, naming it; empty when every file is as listed.

    Every file's size is checked; with `only`, the content of those files alone (the others passed before).
    """
    problems = []
    hashed = None if only is None else set(only)
    for repo_file in files:
        path = directory / repo_file.path
        if not path.is_file():
            problems.append(f"{repo_file.path}: missing")
            continue
        size = path.stat().st_size
        if size != repo_file.size:
            problems.append(f"{repo_file.path}: size {size}, listed {repo_file.size}")
            continue
        if not checksums or (hashed is not None and repo_file.path not in hashed):
            continue
        if problem := content_problem(path, repo_file.path, repo_file.sha256, repo_file.git_oid):
            problems.append(problem)
    return problems


def bad_paths(problems: list[str]) -> list[str]:
    return [problem.split(": ", 1)[0] for problem in problems]


# ------------------------------------------------------------------------------- file stats in the marker


def file_stat(path: Path) -> dict[str, int] | None:
    """The STAT_FIELDS of a regular file (symlinks followed, as vLLM reads them); None when there is none."""
    try:
        found = path.stat()
    except OSError:
        return None
    if not stat.S_ISREG(found.st_mode):
        return None
    return {"size": found.st_size, "mtime_ns": found.st_mtime_ns, "ino": found.st_ino}


def marker_files(files: list[RepoFile], stats: dict[str, dict[str, int] | None]) -> dict[str, dict]:
    """The marker's per-file record: the Hub's checksum (drift hashes against it without the Hub) and the stat
    at verification. A file without a stat is left out: the marker is written only once all files verified."""
    entries = {}
    for repo_file in files:
        found = stats.get(repo_file.path)
        if found is None:
            continue
        entries[repo_file.path] = {"sha256": repo_file.sha256, "git_oid": repo_file.git_oid, **found}
    return entries


def stat_differences(recorded: dict[str, dict], seen: dict[str, dict[str, int] | None]) -> list[str]:
    """One line per recorded file whose size, mtime or inode is not what the marker recorded, or that is gone.

    A same-size overwrite in place (dd conv=notrunc) changes the mtime; a replaced file (cp, a new download)
    has a new inode. Only content restored together with its mtime escapes this: the sample hash finds that.
    """
    problems = []
    for name in sorted(recorded):
        entry, now = recorded[name] or {}, seen.get(name)
        if now is None:
            problems.append(f"{name}: missing")
            continue
        changed = [
            f"{key} {now.get(key)}, recorded {entry.get(key)}" for key in STAT_FIELDS if entry.get(key) != now.get(key)
        ]
        if changed:
            problems.append(f"{name}: changed since its verification ({'; '.join(changed)})")
    return problems


def has_checksum(entry: dict | None) -> bool:
    return bool((entry or {}).get("sha256") or (entry or {}).get("git_oid"))


def sample_files(recorded: dict[str, dict], count: int, index: int) -> list[str]:
    """`count` files with a recorded checksum, chosen by `index` so that consecutive indexes walk through all
    of them in turn (index i takes the i-th window of `count` names in sorted order, wrapping around)."""
    names = sorted(name for name, entry in recorded.items() if has_checksum(entry))
    if count <= 0 or not names:
        return []
    count = min(count, len(names))
    start = (index * count) % len(names)
    return [names[(start + offset) % len(names)] for offset in range(count)]


# ------------------------------------------------------------------------------------------------- marker


@dataclass(frozen=True)
class Marker:
    repo_id: str
    revision: str
    file_count: int
    total_bytes: int
    include: list[str]
    exclude: list[str]
    verified_at: str
    files: dict[str, dict] = field(default_factory=dict)
    version: int = MARKER_VERSION


def marker_for(
    repo_id: str,
    revision: str,
    files: list[RepoFile],
    include: list[str],
    exclude: list[str],
    when: str,
    stats: dict[str, dict[str, int] | None] | None = None,
) -> Marker:
    entries = marker_files(files, stats or {})
    size = sum(f.size for f in files)
    return Marker(repo_id, revision, len(files), size, list(include), list(exclude), when, entries)


def marker_json(marker: Marker) -> str:
    return json.dumps(asdict(marker), indent=2, sort_keys=True) + "\n"


def read_marker(text: str | None) -> dict | None:
    """The marker's fields, or None when it is absent or unreadable (treated as "not done")."""
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def marker_matches(marker: dict | None, repo_id: str, revision: str, include: list[str], exclude: list[str]) -> bool:
    """True when the marker records this repository at this commit with these patterns, at this version.

    `revision` must be a commit sha: a branch could have moved, so it never matches a marker by name. A marker
    of an older version does not match: the role verifies once more and rewrites it (now with file stats).
    """
    if marker is None or marker.get("version") != MARKER_VERSION:
        return False
    return pin_matches(marker, repo_id, revision, include, exclude)


def is_old_marker(marker: dict | None) -> bool:
    """A marker of an earlier version (1: no per-file stats), readable but to be rewritten by the next run."""
    version = (marker or {}).get("version")
    return isinstance(version, int) and version < MARKER_VERSION


def pin_matches(marker: dict | None, repo_id: str, revision: str, include: list[str], exclude: list[str]) -> bool:
    """marker_matches without the version: the marker is for this pin, whatever it records beyond that."""
    if marker is None or not is_commit_sha(revision):
        return False
    return (
        marker.get("repo_id") == repo_id
        and marker.get("revision") == revision
        and list(marker.get("include") or []) == list(include)
        and list(marker.get("exclude") or []) == list(exclude)
    )


def sample_check(
    directory: Path, recorded: dict[str, dict], count: int, index: int, skip: set[str]
) -> tuple[list[str], list[str]]:
    """Hash the rotating sample (sample_files) against the checksums the marker recorded: (hashed, problems).

    Files in `skip` (already found changed by their stat) are not hashed again.
    """
    hashed = [name for name in sample_files(recorded, count, index) if name not in skip]
    problems = []
    for name in hashed:
        path = directory / name
        if not path.is_file():
            problems.append(f"{name}: missing")
        elif problem := content_problem(path, name, recorded[name].get("sha256"), recorded[name].get("git_oid")):
            problems.append(problem)
    return hashed, problems
