"""The lab's PyPI wheelhouse: every wheel the nodes install, for `pip install --no-index --find-links URL`.

Contents come from lab/mirrors/wheelhouse-requirements.txt (exact pins of the whole closure) via
`pip download`, plus locally built placeholder wheels (lab/mirrors/placeholder-wheels.toml). The cache entry
is keyed by the recipe; a new entry starts from hard links to the newest older entry's wheels so a changed
pin downloads only what changed, not gigabytes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import platform
import re
import shutil
import sys
import time
import tomllib
import zipfile
from pathlib import Path

from labctl import _cache

REQUIREMENTS = _cache.MIRRORS_RECIPES / "wheelhouse-requirements.txt"
PLACEHOLDER_WHEELS = _cache.MIRRORS_RECIPES / "placeholder-wheels.toml"
# Where this machine keeps wheels that PyPI does not host (torch 2.13.0+cpu); pip's own config names it too,
# passing it explicitly keeps the build independent of that config. Colon-separated, like PATH.
DEFAULT_FIND_LINKS = "/opt/wheels"
# Placeholder wheels carry a compiled library; this tag says "Linux x86_64, glibc >= 2.17, any Python".
PLACEHOLDER_WHEEL_TAG = "py3-none-manylinux_2_17_x86_64"
# Fixed zip timestamps make the placeholder wheels byte-identical on every build.
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


def recipe_files() -> list[Path]:
    return [
        REQUIREMENTS,
        PLACEHOLDER_WHEELS,
        _cache.PLACEHOLDER_NCCL_SOURCE,
        Path(__file__),
        Path(_cache.__file__),
    ]


def canonical_name(name: str) -> str:
    """PEP 503 normalisation: 'Foo_Bar.baz' -> 'foo-bar-baz'."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_pins(requirements: Path) -> dict[str, str]:
    """{canonical name: version} of every `name[extras]==version` line (comments and blanks ignored)."""
    pins: dict[str, str] = {}
    for raw in requirements.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s;]+)", line)
        if not match:
            raise _cache.MirrorBuildError(f"{requirements.name}: not an exact pin: {line!r}")
        pins[canonical_name(match.group(1))] = match.group(3)
    return pins


def wheel_name_version(filename: str) -> tuple[str, str]:
    """'torch-2.13.0+cpu-cp311-...whl' -> ('torch', '2.13.0+cpu'); names come back canonical."""
    parts = filename.removesuffix(".whl").split("-")
    if len(parts) < 5:
        raise ValueError(f"not a wheel file name: {filename}")
    return canonical_name(parts[0]), parts[1]


def load_placeholder_specs(path: Path = PLACEHOLDER_WHEELS) -> list[dict]:
    specs = tomllib.loads(path.read_text()).get("wheel", [])
    for spec in specs:
        missing = {"name", "versions", "summary"} - spec.keys()
        if missing:
            raise _cache.MirrorBuildError(f"{path.name}: wheel entry lacks {sorted(missing)}: {spec}")
        if "placeholder" not in spec["summary"].lower():
            raise _cache.MirrorBuildError(f"{path.name}: {spec['name']} summary must say it is a placeholder")
    return specs


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def build_nccl_placeholder_wheel(name: str, version: str, summary: str, dest: Path, work: Path) -> Path:
    """A wheel named like NVIDIA's NCCL wheel whose nvidia/nccl/lib/libnccl.so.2 reports `version`."""
    library = _cache.compile_nccl_stub(version, work / f"{name}-{version}" / "libnccl.so.2")
    dist = f"{name.replace('-', '_')}-{version}"
    metadata = (
        "Metadata-Version: 2.1\n"
        f"Name: {name}\n"
        f"Version: {version}\n"
        f"Summary: {summary}\n"
        "License: MIT\n"
        "Description-Content-Type: text/plain\n\n"
        "Kimi lab placeholder. This is not NVIDIA's nvidia-nccl-cu13 wheel: its libnccl.so.2 exports\n"
        f"ncclGetVersion (reporting {version}, code {_cache.nccl_version_code(version)}) and nothing that\n"
        "communicates. The lab installs it to model the NCCL that torch's wheel brings on GPU nodes.\n"
    )
    wheel_meta = f"Wheel-Version: 1.0\nGenerator: kimi-lab\nRoot-Is-Purelib: false\nTag: {PLACEHOLDER_WHEEL_TAG}\n"
    files: list[tuple[str, bytes, int]] = [
        ("nvidia/nccl/lib/libnccl.so.2", library.read_bytes(), 0o755),
        (f"{dist}.dist-info/METADATA", metadata.encode(), 0o644),
        (f"{dist}.dist-info/WHEEL", wheel_meta.encode(), 0o644),
    ]
    record_lines = [f"{path},{_record_hash(data)},{len(data)}" for path, data, _ in files]
    record_lines.append(f"{dist}.dist-info/RECORD,,")
    files.append((f"{dist}.dist-info/RECORD", ("\n".join(record_lines) + "\n").encode(), 0o644))

    wheel_path = dest / f"{dist}-{PLACEHOLDER_WHEEL_TAG}.whl"
    with zipfile.ZipFile(wheel_path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for path, data, mode in files:
            info = zipfile.ZipInfo(path, date_time=ZIP_EPOCH)
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
    return wheel_path


def _check_interpreter() -> None:
    """pip download picks wheels for the running interpreter; the nodes run CPython 3.11 on x86_64 Linux."""
    if sys.version_info[:2] != (3, 11) or platform.machine() != "x86_64" or sys.platform != "linux":
        raise _cache.MirrorBuildError(
            "the wheelhouse must be built by CPython 3.11 on x86_64 Linux (the nodes' Python); "
            f"this is {platform.python_implementation()} {platform.python_version()} on {platform.machine()}"
        )


def _seed_from_previous(kind_dir: Path, dest: Path) -> int:
    """Hard-link the newest finished wheelhouse's wheels into `dest`; returns how many were linked."""
    previous = _cache.complete_entries(kind_dir)
    if not previous:
        return 0
    linked = 0
    for wheel in previous[0].glob("*.whl"):
        try:
            os.link(wheel, dest / wheel.name)
        except OSError:  # another filesystem: copy instead
            shutil.copy2(wheel, dest / wheel.name)
        linked += 1
    return linked


def _find_links() -> list[str]:
    raw = os.environ.get("KIMI_LAB_WHEEL_FIND_LINKS", DEFAULT_FIND_LINKS)
    return [d for d in raw.split(":") if d and Path(d).is_dir()]


def _pip_download(dest: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--dest", str(dest)]
    for folder in _find_links():
        cmd += ["--find-links", folder]
    cmd += ["-r", str(REQUIREMENTS)]
    _cache.run(cmd, what="pip download (wheelhouse)")


def _prune_and_check(dest: Path, expected: dict[str, str], rebuilt: set[str]) -> list[tuple[str, str]]:
    """Drop seeded wheels that are no longer pinned; fail if the closure pulled in anything unpinned.

    Wheels named in `rebuilt` (the placeholders) are removed too: they are built again from the recipe.
    """
    present: list[tuple[str, str]] = []
    unpinned: list[str] = []
    for wheel in sorted(dest.glob("*.whl")):
        name, version = wheel_name_version(wheel.name)
        if name in rebuilt:
            wheel.unlink()
        elif expected.get(name) == version:
            present.append((name, version))
        elif name in expected:  # an older pin's wheel inherited from the seed
            wheel.unlink()
        else:
            unpinned.append(f"{name}=={version}")
    if unpinned:
        raise _cache.MirrorBuildError(
            f"{REQUIREMENTS.name} is not a closed set: pip also needed {', '.join(unpinned)} (pin them)"
        )
    missing = sorted(set(expected) - {name for name, _ in present})
    if missing:
        raise _cache.MirrorBuildError(f"wheelhouse lacks pinned wheels: {', '.join(missing)}")
    return present


def _write_indexes(dest: Path, present: list[tuple[str, str]]) -> None:
    lock = sorted({f"{name}=={version}" for name, version in present})
    (dest / "requirements.lock").write_text("\n".join(lock) + "\n")
    sums = [f"{_cache.sha256_file(w)}  {w.name}" for w in sorted(dest.glob("*.whl"))]
    (dest / "SHA256SUMS").write_text("\n".join(sums) + "\n")


def _build_into(kind_dir: Path, dest: Path) -> None:
    _check_interpreter()
    started = time.monotonic()
    seeded = _seed_from_previous(kind_dir, dest)
    pins = parse_pins(REQUIREMENTS)
    before = {w.name for w in dest.glob("*.whl")}
    _pip_download(dest)
    download_seconds = time.monotonic() - started
    fetched = [w for w in dest.glob("*.whl") if w.name not in before]

    placeholders = load_placeholder_specs()
    present = _prune_and_check(dest, pins, {canonical_name(spec["name"]) for spec in placeholders})
    work = dest / ".work"
    for spec in placeholders:
        for version in spec["versions"]:
            build_nccl_placeholder_wheel(spec["name"], version, spec["summary"], dest, work)
            present.append((canonical_name(spec["name"]), version))
    shutil.rmtree(work)
    _write_indexes(dest, present)
    wheels = list(dest.glob("*.whl"))
    info = {
        "wheels": len(wheels),
        "bytes": sum(w.stat().st_size for w in wheels),
        "seeded_from_previous": seeded,
        "downloaded": len(fetched),
        "downloaded_bytes": sum(w.stat().st_size for w in fetched),
        "download_seconds": round(download_seconds, 1),
    }
    (dest / "build-info.json").write_text(json.dumps(info, indent=2) + "\n")


def build(cache: Path) -> dict:
    """Build (or reuse) the wheelhouse under cache/wheels/<key>/; returns {"wheelhouse": Path}."""
    kind_dir = Path(cache) / "wheels"
    key = _cache.recipe_key(recipe_files())
    entry = _cache.cached_build(kind_dir, key, lambda tmp: _build_into(kind_dir, tmp))
    return {"wheelhouse": entry}


def existing(cache: Path) -> dict | None:
    """build()'s result when the current recipe is already built under `cache`, else None; never builds."""
    entry = Path(cache) / "wheels" / _cache.recipe_key(recipe_files())
    return {"wheelhouse": entry} if _cache.is_complete(entry) else None
