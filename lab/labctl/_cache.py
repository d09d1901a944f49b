"""Shared helpers for the mirror builders: recipe keys, atomic cache entries, commands, the NCCL stub.

Every builder follows the same rule: the contents of a cache entry are a pure function of its recipe (the
recipe files plus the builder's own source), so the entry's directory name is a hash of that recipe. An entry
is built in a temporary sibling directory and renamed into place only when complete, so an interrupted build
never leaves a half-filled entry that a later warm call would trust.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

# lab/mirrors/: the recipes (package specs, requirements, placeholder sources, generator scripts).
MIRRORS_RECIPES = Path(__file__).resolve().parent.parent / "mirrors"
PLACEHOLDER_NCCL_SOURCE = MIRRORS_RECIPES / "placeholder" / "nccl_version.c"

# Marks a finished entry; its absence means "rebuild".
COMPLETE_MARKER = ".complete"
KEY_LENGTH = 16
# Finished entries kept per cache kind (the newest ones): enough to switch back and forth between branches
# without rebuilding, few enough that edits to a recipe do not fill the disk.
KEEP_ENTRIES = 3


class MirrorBuildError(RuntimeError):
    """A mirror could not be built; the message says which step failed and why."""


def recipe_key(files: Iterable[Path], extra: str = "") -> str:
    """Hash of the recipe files' names and contents (plus `extra`), stable across checkouts and machines.

    Names are taken relative to the lab directory when possible so the key does not depend on where the
    clone lives.
    """
    digest = hashlib.sha256()
    lab_dir = MIRRORS_RECIPES.parent
    for path in sorted({Path(f).resolve() for f in files}):
        try:
            name = path.relative_to(lab_dir).as_posix()
        except ValueError:
            name = path.name
        data = path.read_bytes()
        digest.update(f"{name}\0{len(data)}\0".encode())
        digest.update(data)
    digest.update(extra.encode())
    return digest.hexdigest()[:KEY_LENGTH]


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def is_complete(entry: Path) -> bool:
    return (entry / COMPLETE_MARKER).is_file()


def complete_entries(kind_dir: Path) -> list[Path]:
    """Finished entries of one cache kind, newest first (by the time they were completed)."""
    if not kind_dir.is_dir():
        return []
    entries = [p for p in kind_dir.iterdir() if p.is_dir() and not p.name.startswith(".") and is_complete(p)]
    return sorted(entries, key=lambda p: (p / COMPLETE_MARKER).stat().st_mtime, reverse=True)


@contextmanager
def _locked(kind_dir: Path) -> Iterator[None]:
    """Serialise builders of one cache kind (two `lab up` runs must not build the same entry twice)."""
    kind_dir.mkdir(parents=True, exist_ok=True)
    with (kind_dir / ".lock").open("w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def prune_old_entries(kind_dir: Path, keep: int = KEEP_ENTRIES) -> list[Path]:
    """Remove finished entries beyond the newest `keep`; returns what was removed."""
    removed = complete_entries(kind_dir)[keep:]
    for entry in removed:
        shutil.rmtree(entry, ignore_errors=True)
    return removed


def cached_build(kind_dir: Path, key: str, build: Callable[[Path], None]) -> Path:
    """Return `kind_dir/key`, calling `build(tmp_dir)` first if no finished entry exists.

    `build` fills a fresh temporary directory; it is renamed to the final name only after `build` returns,
    so a failure (or a kill) leaves no entry behind, only a `.tmp-*` directory that the next build removes.
    """
    entry = kind_dir / key
    if is_complete(entry):
        return entry
    with _locked(kind_dir):
        if is_complete(entry):  # another builder finished it while we waited for the lock
            return entry
        for stale in kind_dir.glob(f".tmp-{key}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        if entry.exists():  # an entry without its marker is a leftover from an older, broken layout
            shutil.rmtree(entry)
        tmp = kind_dir / f".tmp-{key}-{os.getpid()}"
        tmp.mkdir()
        try:
            build(tmp)
            (tmp / COMPLETE_MARKER).write_text(f"completed {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n")
            tmp.rename(entry)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        prune_old_entries(kind_dir)
    return entry


def cached_build_in_place(entry: Path, build: Callable[[Path], None]) -> Path:
    """Like cached_build, for contents that must not move after they are built (a venv embeds its path).

    The completion marker is written last, so a failed or killed build is rebuilt from scratch next time.
    """
    if is_complete(entry):
        return entry
    with _locked(entry.parent):
        if is_complete(entry):
            return entry
        shutil.rmtree(entry, ignore_errors=True)
        entry.mkdir(parents=True)
        try:
            build(entry)
            (entry / COMPLETE_MARKER).write_text(f"completed {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n")
        except BaseException:
            shutil.rmtree(entry, ignore_errors=True)
            raise
        prune_old_entries(entry.parent)
    return entry


def run(
    cmd: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None, what: str = ""
) -> subprocess.CompletedProcess[str]:
    """Run a command, raising MirrorBuildError with the tail of its output when it fails."""
    try:
        result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    except FileNotFoundError as exc:
        raise MirrorBuildError(f"{what or cmd[0]}: command not found: {cmd[0]}") from exc
    if result.returncode != 0:
        tail = (result.stdout + result.stderr).strip().splitlines()[-15:]
        raise MirrorBuildError(f"{what or ' '.join(cmd[:3])} failed (exit {result.returncode}):\n" + "\n".join(tail))
    return result


def nccl_version_code(version: str) -> int:
    """NCCL's integer version code (what ncclGetVersion returns) for 'major.minor.patch'.

    NCCL changed the encoding in 2.9: since then it is major*10000 + minor*100 + patch (2.30.7 -> 23007);
    before, major*1000 + minor*100 + patch (2.8.4 -> 2804).
    """
    parts = version.split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"NCCL version must be major.minor.patch, got {version!r}")
    major, minor, patch = (int(p) for p in parts)
    if (major, minor) >= (2, 9):
        return major * 10000 + minor * 100 + patch
    return major * 1000 + minor * 100 + patch


def nccl_upstream_version(package_version: str) -> str:
    """'2.30.7-1+cuda13.3' (a Debian version of libnccl2) -> '2.30.7'."""
    return package_version.split("-", 1)[0].split("+", 1)[0]


def compile_nccl_stub(version: str, output: Path, soname: str = "libnccl.so.2") -> Path:
    """Compile the placeholder libnccl for `version` ('2.30.7') to `output` with gcc."""
    output.parent.mkdir(parents=True, exist_ok=True)
    code = nccl_version_code(version)
    run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-O2",
            "-Wall",
            "-Werror",
            f"-DLAB_NCCL_VERSION_CODE={code}",
            f'-DLAB_NCCL_VERSION_STRING="{version}"',
            f"-Wl,-soname,{soname}",
            # No build-id: the same source and version give the same bytes, so cache keys stay honest.
            "-Wl,--build-id=none",
            "-o",
            str(output),
            str(PLACEHOLDER_NCCL_SOURCE),
        ],
        what=f"gcc (placeholder libnccl {version})",
    )
    return output
