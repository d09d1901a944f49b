"""A large checkpoint-shaped repository for timing checkpoint downloads: `lab/lab bulk-checkpoint --gib N`.

The miniature checkpoint (mirrors_hf) is 15 MB: too small to time how long nodes take to fetch a real
checkpoint. This builder makes `kimi-lab/Kimi-K2-bulk-<N>GiB`, a git repository of the same shape as a real
sharded checkpoint (config.json, model.safetensors.index.json, model-0000K-of-0000M.safetensors) whose shards
hold N GiB of deterministic pseudo-random bytes. They are valid safetensors files (one U8 tensor each) but no
model: they exist to be transferred and checksummed. Nothing comes from a hub.

Layout under the lab cache:
- hf-bulk/<key>/mirrors/models/kimi-lab/Kimi-K2-bulk-<N>GiB: the repository, one entry per size (<key>
  hashes the size and this builder's sources), built and pruned by _cache.cached_build like every mirror.
- hf-bulk/mirrors/models/kimi-lab/Kimi-K2-bulk-<N>GiB: a symlink to the newest entry of that size. This
  directory is olah's second `mirrors-path` (serve.start_servers): olah 0.5.4 checks the mirrors paths on
  every request (server_mirror.has_local_mirror), so a repository built after `lab/lab up` is served at once.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
from decimal import Decimal, InvalidOperation
from pathlib import Path

from labctl import _cache, mirrors_hf

KIND = "hf-bulk"
# The stable directory olah is pointed at; not a cache entry (it has no completion marker, so pruning skips it).
SERVED = "mirrors"
REPO_ORG = "kimi-lab"
REPO_PREFIX = "Kimi-K2-bulk-"
MIB = 1 << 20
GIB = 1 << 30
MIN_GIB = Decimal("0.001")
# The entry needs twice its size on disk (work tree + git pack); 64 GiB is already most of the lab host's disk.
MAX_GIB = Decimal(64)
GIB_DECIMALS = 3
# Small shards, because olah 0.5.4 serves a local mirror's file by reading the whole git blob into memory, in its
# event loop, and then sends it in 4 KiB chunks (about 30 MB/s, one core). The shard size bounds olah's memory per
# request in flight (an hf client keeps up to --max-workers, 8 by default, in flight) and how long each request
# stalls all the others. Measured on the lab host, 4 hf clients at once with hf's default 10 s read timeout: with
# 128 MiB shards (before SERVING_CONFIG) all 4 failed on read timeouts and retried until olah held 19 GB; with 32 MiB
# shards all 4 finished (1 GiB each in 170 s), olah peaking at 1.1 GB, one GET per file per client.
SHARD_MAX_BYTES = 32 * MIB
# Each shard starts with the 8-byte length and a JSON header space-padded to this size, so the data size
# (which the header names) does not change the header's own size.
HEADER_BYTES = 256
BLOCK_BYTES = MIB
INDEX_NAME = "model.safetensors.index.json"
COMMIT_MESSAGE = "Kimi-K2-bulk: lab checkpoint for download timing (pseudo-random bytes, not a model)"
# Random bytes do not compress: zlib at its default level would spend minutes for nothing. Above the threshold
# `git add` streams a file straight into a pack, without loose objects or delta search.
GIT_OPTIONS = ("-c", "core.compression=0", "-c", "core.bigFileThreshold=1m")
# Kept in the repository's own config for the `git cat-file --batch` that olah (GitPython) runs there: below
# core.bigFileThreshold (512 MiB by default) git reads a whole blob into memory before writing it out; above, it
# streams it. Measured: a HEAD of a 512 MiB shard took 4.7 s with the default, 1.4 s with this.
SERVING_CONFIG = {"core.bigFileThreshold": "1m"}
# Free space the build wants beyond the two copies (work tree + pack) of the checkpoint.
DISK_MARGIN_BYTES = GIB


# ---------------------------------------------------------------------------------------------- pure parts


def parse_gib(text: str) -> Decimal:
    """`--gib` as a Decimal (exact, so 0.1 names the same repository everywhere); ValueError when it is not a
    number of GiB from MIN_GIB to MAX_GIB with at most GIB_DECIMALS decimals."""
    try:
        gib = Decimal(text)
    except InvalidOperation:
        gib = None
    if gib is None or not gib.is_finite() or not MIN_GIB <= gib <= MAX_GIB or _decimals(gib) > GIB_DECIMALS:
        raise ValueError(
            f"--gib must be a number of GiB from {MIN_GIB} to {MAX_GIB} with at most {GIB_DECIMALS} decimals "
            f"(e.g. 2 or 0.5), got {text!r}"
        )
    return gib


def _decimals(value: Decimal) -> int:
    exponent = value.normalize().as_tuple().exponent
    return max(0, -exponent) if isinstance(exponent, int) else 0


def shard_bytes_total(gib: Decimal) -> int:
    """What the shards hold in all: N GiB, rounded to a whole byte."""
    return int((gib * GIB).to_integral_value())


def repo_name(gib: Decimal) -> str:
    """Kimi-K2-bulk-2GiB, Kimi-K2-bulk-0.5GiB: 2, 2.0 and 2.000 name the same repository."""
    return f"{REPO_PREFIX}{format(gib.normalize(), 'f')}GiB"


def repo_id(gib: Decimal) -> str:
    return f"{REPO_ORG}/{repo_name(gib)}"


def shard_plan(total_bytes: int, max_shard: int = SHARD_MAX_BYTES) -> list[tuple[str, int]]:
    """(file name, size) of each shard: as few as fit `max_shard`, of equal size (the first ones a byte
    larger when it does not divide), so every shard takes about as long to fetch."""
    if total_bytes < 8 + HEADER_BYTES:
        raise ValueError(f"a shard needs at least {8 + HEADER_BYTES} bytes, got {total_bytes} in all")
    count = -(-total_bytes // max_shard)
    size, larger = divmod(total_bytes, count)
    return [
        (f"model-{k:05d}-of-{count:05d}.safetensors", size + 1 if k <= larger else size) for k in range(1, count + 1)
    ]


def tensor_name(shard: int) -> str:
    return f"bulk.shard_{shard:05d}.data"


def shard_header(shard: int, shard_size: int) -> bytes:
    """The safetensors prefix of a shard: 8-byte little-endian length, then the padded JSON header naming one
    U8 tensor that fills the rest of the file."""
    data = shard_size - 8 - HEADER_BYTES
    header = {
        "__metadata__": {"format": "pt", "lab": "pseudo-random bytes for download timing, not weights"},
        tensor_name(shard): {"dtype": "U8", "shape": [data], "data_offsets": [0, data]},
    }
    text = json.dumps(header, separators=(",", ":")).encode()
    if len(text) > HEADER_BYTES:
        raise ValueError(f"shard header of {len(text)} bytes does not fit in {HEADER_BYTES}")
    return struct.pack("<Q", HEADER_BYTES) + text.ljust(HEADER_BYTES)


def random_block(shard: int, block: int, size: int) -> bytes:
    """Block `block` of shard `shard`'s data: SHAKE-128 output (incompressible, identical on every machine and
    Python, about 500 MB/s on one core here)."""
    return hashlib.shake_128(f"kimi-lab bulk {shard} {block}".encode()).digest(size)


def weight_index(plan: list[tuple[str, int]]) -> dict:
    """model.safetensors.index.json for `plan`, as transformers writes it (total_size: the tensors' bytes)."""
    return {
        "metadata": {"total_size": sum(size - 8 - HEADER_BYTES for _, size in plan)},
        "weight_map": {tensor_name(k): name for k, (name, _) in enumerate(plan, start=1)},
    }


def disk_needed(total_bytes: int) -> int:
    return 2 * total_bytes + DISK_MARGIN_BYTES


# ------------------------------------------------------------------------------------------------- build


def recipe_files() -> list[Path]:
    # mirrors_hf.py is part of the recipe: its commit_repository makes the revision.
    return [mirrors_hf.model_config_path(), Path(__file__), Path(mirrors_hf.__file__), Path(_cache.__file__)]


def served_root(cache: Path) -> Path:
    """The mirrors path olah lists next to the miniature's: symlinks to the newest repository of each size."""
    return Path(cache) / KIND / SERVED


def write_shard(path: Path, shard: int, size: int) -> None:
    with path.open("wb") as out:
        out.write(shard_header(shard, size))
        remaining, block = size - 8 - HEADER_BYTES, 0
        while remaining > 0:
            chunk = min(BLOCK_BYTES, remaining)
            out.write(random_block(shard, block, chunk))
            remaining, block = remaining - chunk, block + 1


def _require_disk(kind_dir: Path, total_bytes: int) -> None:
    free = shutil.disk_usage(kind_dir).free
    if free < disk_needed(total_bytes):
        raise _cache.MirrorBuildError(
            f"a {total_bytes / GIB:.3g} GiB bulk checkpoint needs about {disk_needed(total_bytes) / GIB:.1f} GiB "
            f"free under {kind_dir} (work tree + git pack), and {free / GIB:.1f} GiB are"
        )


def _build(entry: Path, gib: Decimal) -> None:
    _require_disk(entry.parent, shard_bytes_total(gib))
    repo = entry / "mirrors" / "models" / REPO_ORG / repo_name(gib)
    repo.mkdir(parents=True)
    shutil.copyfile(mirrors_hf.model_config_path(), repo / "config.json")
    plan = shard_plan(shard_bytes_total(gib))
    for shard, (name, size) in enumerate(plan, start=1):
        write_shard(repo / name, shard, size)
    (repo / INDEX_NAME).write_text(json.dumps(weight_index(plan), indent=2) + "\n")
    sha = mirrors_hf.commit_repository(repo, message=COMMIT_MESSAGE, git_options=GIT_OPTIONS)
    for name, value in SERVING_CONFIG.items():  # the local config is not part of the commit: the sha is unchanged
        _cache.run(["git", "-C", str(repo), "config", name, value], what=f"git config {name}")
    files = {p.name: p.stat().st_size for p in sorted(repo.iterdir()) if p.is_file()}
    manifest = {"repo_id": repo_id(gib), "revision": sha, "files": files, "total_bytes": sum(files.values())}
    (entry / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


def publish(cache: Path, entry: Path, name: str) -> Path:
    """Point served_root's link for `name` at `entry`'s repository (atomically: olah may be serving the old
    one), and drop links whose entries were pruned. Returns the link."""
    links = served_root(cache) / "models" / REPO_ORG
    links.mkdir(parents=True, exist_ok=True)
    link, staged = links / name, links / f".{name}.{os.getpid()}"
    staged.unlink(missing_ok=True)
    staged.symlink_to(entry / "mirrors" / "models" / REPO_ORG / name, target_is_directory=True)
    staged.replace(link)
    for stale in links.iterdir():
        if stale.is_symlink() and not stale.exists():
            stale.unlink()
    return link


def build(cache: Path, gib: Decimal) -> dict:
    """Build (or reuse) the N GiB repository and publish it where olah looks; returns its manifest plus
    mirrors_path (the entry's own mirrors directory, for an olah of a test's own)."""
    key = _cache.recipe_key(recipe_files(), extra=f"bulk shard bytes {shard_bytes_total(gib)}")
    kind_dir = Path(cache) / KIND
    entry = _cache.cached_build(kind_dir, key, lambda tmp: _build(tmp, gib))
    publish(Path(cache), entry, repo_name(gib))
    manifest = json.loads((entry / "manifest.json").read_text())
    return {**manifest, "mirrors_path": str(entry / "mirrors")}
