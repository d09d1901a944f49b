#!/usr/bin/python3
"""Fetch the checkpoint's files from the site's offline mirror with plain HTTP GETs (roles/checkpoint, air-gapped).

Installed on a node by the checkpoint role and run by its download script (detached, like `hf download`) when the
checkpoint comes from the bundle. It reads a JSON list the role wrote (each file's URL on the mirror, its path in
the checkpoint directory and its size, from the bundle's manifest) and, for each file not yet there at its size,
streams it into a partial file, continues an interrupted one with a Range request, and renames it into place once
it has exactly the listed size. It does not hash: the role verifies every file's sha256 against the same manifest
afterwards (kimi_checkpoint_verify), and deletes and fetches again what fails.

Why a program of its own and not `hf download`: the mirror serves the bundle's files as plain files (nginx), and a
plain GET needs none of the Hub's protocol (docs/air-gapped.md). Why not curl or wget: a minimal node may have
neither; python3 is there for Ansible. Partial files go where the role's progress report counts hf's own
(`<dir>/.cache/huggingface/download/<path>.incomplete`), so progress and stall detection work the same.

Standard library only. Usage: kimi-checkpoint-fetch.py LIST.json DIR
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

PARTIAL_DIR = Path(".cache") / "huggingface" / "download"
CHUNK = 8 << 20
ATTEMPTS = 5
RETRY_SECONDS = 5
TIMEOUT_SECONDS = 60


class FetchError(Exception):
    """A file could not be fetched at its listed size; the message names it and why."""


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


def fetch(url: str, directory: Path, path: str, size: int) -> bool:
    """The file at `directory/path` with `size` bytes; False when it was there already, True when fetched."""
    target = directory / path
    if target.is_file() and not target.is_symlink() and target.stat().st_size == size:
        return False
    partial = partial_path(directory, path)
    partial.parent.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, ATTEMPTS + 1):
        try:
            _append(url, partial, size)
        except (OSError, urllib.error.URLError) as error:
            if isinstance(error, urllib.error.HTTPError) and error.code < 500 and error.code != 429:
                raise FetchError(f"{url} answered {error.code} {error.reason}") from None
            if attempt == ATTEMPTS:
                raise FetchError(f"{url}: {error} (after {ATTEMPTS} attempts)") from None
            print(f"retrying {path} in {RETRY_SECONDS} s: {error}", flush=True)
            time.sleep(RETRY_SECONDS)
            continue
        if partial.stat().st_size == size:
            break
    got = partial.stat().st_size
    if got != size:
        raise FetchError(f"{url} gave {got} bytes, the manifest lists {size}")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial.replace(target)
    return True


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("Error: usage: kimi-checkpoint-fetch.py LIST.json DIR", file=sys.stderr)
        return 2
    listed = json.loads(Path(argv[1]).read_text())
    directory = Path(argv[2])
    fetched = 0
    for item in listed:
        try:
            fetched += fetch(str(item["url"]), directory, str(item["path"]), int(item["size"]))
        except FetchError as error:
            print(f"Error: {error}", flush=True)
            return 1
    print(f"fetched {fetched} of {len(listed)} files", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
