#!/usr/bin/python3
"""Fetch the checkpoint's files as plain files over HTTP: from the site's offline mirror (air-gapped), or from the
nodes that already hold it (download once per site; roles/checkpoint/tasks/spread.yml).

Installed on a node by the checkpoint role and run by its download script (detached, like `hf download`). It reads
a JSON list the role wrote: each file's path in the checkpoint directory, its size, its checksums where listed
(sha256, git blob id) and its sources, in order: one URL (`url`: the mirror) or the peers' (`urls`: every node that
holds the checkpoint, this node's own first). For each file not yet there at its size it streams the file into a
partial file, continues an interrupted one with a Range request, and once the file has exactly the listed size (and,
from peers, its listed checksum), renames it into place. A source that cannot give it (no answer, an HTTP
error, a short or a corrupt file) is left for the next one; a corrupt partial is deleted first. Only when every
source failed for a file does the program go on without it, and end with status 3, naming each source's failure
and listing those files in fetch-failed.json beside the list, so that the role fetches them from the Hub with a
warning.

Why a program of its own and not `hf download`: the mirror and the peers (nginx) serve plain files, and a plain GET
needs none of the Hub's protocol (docs/air-gapped.md, docs/checkpoint.md). Why not curl, wget or aria2: a minimal
node may have none of them; python3 is there for Ansible, and the checksums the Hub lists include git blob ids that
no download tool checks. Partial files go where the role's progress report counts hf's own
(`<dir>/.cache/huggingface/download/<path>.incomplete`), so progress and stall detection work the same. The role
verifies every file again afterwards (kimi_checkpoint_verify) before it writes the marker, except the content of a
file this program checked as it took it from a peer: fetch-checked.json, beside the list, records each such file's
stat (size, mtime, inode) once it is in place, and the verification hashes it again only when that stat changed,
so a 595 GB checkpoint is read once on arrival, not twice.

`--workers N` fetches N files at once (the role passes checkpoint_hf_max_workers, as it does to `hf download`): one
HTTP stream and one sha256 run at about a core's speed, 1-2 GB/s, well below a 100-400 Gb/s cluster network, so a
node takes several files at a time, each over its own connection and hashed on its own thread (hashlib releases
the GIL on large blocks).

Standard library only. Usage: kimi-checkpoint-fetch.py [--workers N] LIST.json DIR
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

PARTIAL_DIR = Path(".cache") / "huggingface" / "download"
CHUNK = 8 << 20
# Attempts per source; a peer that fails is left for the next one sooner than the only mirror.
ATTEMPTS = 5
PEER_ATTEMPTS = 2
RETRY_SECONDS = 5
TIMEOUT_SECONDS = 60


class FetchError(Exception):
    """A file could not be fetched at its listed size; the message names it and why."""


class EverySourceFailedError(FetchError):
    """No source gave the file at its size and checksum: each source's failure, in the message."""


def partial_path(directory: Path, path: str) -> Path:
    return directory / PARTIAL_DIR / f"{path}.incomplete"


def _request(url: str, start: int) -> urllib.request.Request:
    headers = {"User-Agent": "kimi-checkpoint-fetch"}
    if start:
        headers["Range"] = f"bytes={start}-"
    return urllib.request.Request(url, headers=headers)


def _append(url: str, partial: Path, size: int) -> None:
    """One GET from where the partial file ends (a server that ignores the Range starts it again)."""
    start = partial.stat().st_size if partial.exists() else 0
    if start > size:
        partial.unlink()
        start = 0
    with urllib.request.urlopen(_request(url, start), timeout=TIMEOUT_SECONDS) as response:
        resumed = start > 0 and response.status == 206
        with partial.open("ab" if resumed else "wb") as out:
            while block := response.read(CHUNK):
                out.write(block)
                if out.tell() > size:
                    raise FetchError(f"{url} sent more than the listed {size} bytes")


def content_problem(partial: Path, sha256: str | None, git_oid: str | None) -> str | None:
    """Why the fetched bytes are not the listed file (its sha256, or its git blob id), or None. The same rule as
    kimi_checkpoint.content_problem, which the role's verification runs: this program runs alone on the node with
    the standard library, so it cannot import the collection's module_utils."""
    if not sha256 and not git_oid:
        return None
    digest = hashlib.sha256() if sha256 else hashlib.sha1()  # git names a blob by its sha1
    if not sha256:
        digest.update(f"blob {partial.stat().st_size}\0".encode())
    with partial.open("rb") as stream:
        while block := stream.read(CHUNK):
            digest.update(block)
    wanted = sha256 or git_oid
    return None if digest.hexdigest() == wanted else f"its {'sha256' if sha256 else 'git blob id'} is not {wanted}"


def from_source(url: str, partial: Path, size: int, attempts: int) -> None:
    """The file at its full size from one source, continuing the partial file; FetchError when it cannot."""
    for attempt in range(1, attempts + 1):
        try:
            _append(url, partial, size)
        except (OSError, urllib.error.URLError) as error:
            if isinstance(error, urllib.error.HTTPError) and error.code < 500 and error.code != 429:
                raise FetchError(f"{url} answered {error.code} {error.reason}") from None
            if attempt == attempts:
                raise FetchError(f"{url}: {error} (after {attempts} attempts)") from None
            print(f"retrying {url} in {RETRY_SECONDS} s: {error}", flush=True)
            time.sleep(RETRY_SECONDS)
            continue
        if partial.stat().st_size == size:
            return
    got = partial.stat().st_size if partial.exists() else 0
    raise FetchError(f"{url} gave {got} bytes, the list says {size}")


def fetch(
    urls: list[str],
    directory: Path,
    path: str,
    size: int,
    sha256: str | None = None,
    git_oid: str | None = None,
    peers: bool = False,
    checked: dict[str, dict[str, int]] | None = None,
) -> bool:
    """The file at `directory/path` with `size` bytes (and its checksum, when listed) from the first source that
    gives it; False when it was there already, True when fetched. From peers (`peers`, or several sources) each
    file's checksum is checked before it is kept, and every source failing is EverySourceFailedError; a file kept
    after its checksum passed gets its stat in `checked`."""
    target = directory / path
    if target.is_file() and not target.is_symlink() and target.stat().st_size == size:
        return False
    partial = partial_path(directory, path)
    partial.parent.mkdir(parents=True, exist_ok=True)
    peers = peers or len(urls) > 1
    attempts = PEER_ATTEMPTS if peers else ATTEMPTS
    failures = []
    for url in urls:
        try:
            from_source(url, partial, size, attempts)
        except FetchError as error:
            failures.append(str(error))
            continue
        # From the mirror there is no other source to turn to: the role's verification after the fetch judges the
        # file (hashing it here too would read every byte twice). A peer's file is checked here, so that a bad one
        # is fetched from the next peer, or from the Hub, rather than kept.
        problem = content_problem(partial, sha256, git_oid) if peers else None
        if problem is None:
            target.parent.mkdir(parents=True, exist_ok=True)
            partial.replace(target)
            if peers and (sha256 or git_oid) and checked is not None:
                checked[path] = file_stat(target)
            return True
        partial.unlink()
        failures.append(f"{url}: {problem} (deleted)")
        print(f"{path} from {url}: {problem}; trying the next source", flush=True)
    if not peers:
        raise FetchError(failures[0])
    raise EverySourceFailedError(f"{path}: every source failed: " + "; ".join(failures))


def file_stat(path: Path) -> dict[str, int]:
    """The stat the role's verification compares (kimi_checkpoint.file_stat's fields)."""
    found = path.stat()
    return {"size": found.st_size, "mtime_ns": found.st_mtime_ns, "ino": found.st_ino}


def checked_list(listed: Path) -> Path:
    """Where the files whose checksum this program checked on arrival are recorded, with their stat, beside the
    list (the role's verification does not hash them again while that stat holds)."""
    return listed.with_name("fetch-checked.json")


def failed_list(listed: Path) -> Path:
    """Where the paths every source failed for are written, beside the list (the role fetches those from the Hub)."""
    return listed.with_name("fetch-failed.json")


def parse_arguments(argv: list[str]) -> argparse.Namespace | None:
    """LIST.json, DIR and --workers (at least 1); None, after an error line, when they are not usable."""
    parser = argparse.ArgumentParser(prog="kimi-checkpoint-fetch.py", add_help=False)
    parser.add_argument("--workers", default="1")
    parser.add_argument("listing")
    parser.add_argument("directory")
    try:
        arguments, unknown = parser.parse_known_args(argv[1:])
    except SystemExit:
        arguments, unknown = None, []
    if arguments is None or unknown or not arguments.workers.isdigit() or int(arguments.workers) < 1:
        print("Error: usage: kimi-checkpoint-fetch.py [--workers N (1 or more)] LIST.json DIR", file=sys.stderr)
        return None
    arguments.workers = int(arguments.workers)
    return arguments


def fetch_item(item: dict, directory: Path) -> tuple[bool, dict[str, dict[str, int]]]:
    """One listed file (fetch), with what it checked on arrival (its own record: the caller merges them)."""
    checked: dict[str, dict[str, int]] = {}
    urls = [str(url) for url in item.get("urls") or [item["url"]]]
    fetched = fetch(
        urls,
        directory,
        str(item["path"]),
        int(item["size"]),
        item.get("sha256"),
        item.get("git_oid"),
        peers="urls" in item,
        checked=checked,
    )
    return fetched, checked


def main(argv: list[str]) -> int:
    arguments = parse_arguments(argv)
    if arguments is None:
        return 2
    listing = Path(arguments.listing)
    listed = json.loads(listing.read_text())
    directory = Path(arguments.directory)
    failed_list(listing).unlink(missing_ok=True)
    checked_list(listing).unlink(missing_ok=True)
    fetched = 0
    failed: list[str] = []
    fatal: FetchError | None = None
    checked: dict[str, dict[str, int]] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=arguments.workers) as pool:
        running = {pool.submit(fetch_item, item, directory): str(item["path"]) for item in listed}
        # Results are taken here, on one thread: the record and the counts are never written from two at once.
        for done in concurrent.futures.as_completed(running):
            try:
                was_fetched, was_checked = done.result()
            except EverySourceFailedError as error:
                # The other files may still come from the peers: only this one goes to the Hub.
                print(f"Error: {error}", flush=True)
                failed.append(running[done])
                continue
            except FetchError as error:
                # From the mirror there is no other source: files not started yet are not asked for; those under
                # way end as they end (their partial files are continued by the next run).
                print(f"Error: {error}", flush=True)
                fatal = fatal or error
                for waiting in running:
                    waiting.cancel()
                continue
            except concurrent.futures.CancelledError:
                continue
            fetched += was_fetched
            checked.update(was_checked)
            # Written as it grows: what was checked stays recorded whatever stops the program after.
            checked_list(listing).write_text(json.dumps(checked, sort_keys=True) + "\n")
    checked_list(listing).write_text(json.dumps(checked, sort_keys=True) + "\n")
    if fatal is not None:
        return 1
    print(f"fetched {fetched} of {len(listed)} files", flush=True)
    if failed:
        failed = [str(item["path"]) for item in listed if str(item["path"]) in set(failed)]
        failed_list(listing).write_text(json.dumps(failed) + "\n")
        print(f"Error: every source failed for {len(failed)} file(s): {', '.join(failed)}", flush=True)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
