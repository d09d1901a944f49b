"""The one way every check writes its report on the controller: deterministic JSON, Markdown, other files of the
same report, each written atomically, and a report is never a change to what Ansible manages.

Reports (plan.json, preflight.json, parity.json, serve.json, nccl_tests.json/.log, drift-*.json/.md,
verify-*.json/.md/.svg) are what a check is for, not state it converges, so the modules that write them answer
changed=false whether or not a file's bytes changed; a second converge stays at changed=0. A reader (a
dashboard, `jq`, the next run) sees the old file or the new one, never half of one. A report without a module
of its own (plan, serve, nccl_tests) goes through plugins/modules/kimi_report_file.py.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def report_json(report: Mapping[str, Any] | Sequence[Any], compact: bool = False) -> str:
    """Sorted keys, so an unchanged result rewrites the same bytes; compact for reports of hundreds of hosts."""
    if compact:
        return json.dumps(report, sort_keys=True, separators=(",", ":")) + "\n"
    return json.dumps(report, indent=2, sort_keys=True) + "\n"


def write_atomic(path: Path, data: bytes | str) -> bool:
    """Write to a temporary file beside `path`, flush it to disk, rename it over `path`; False (nothing written)
    when the file already holds these bytes."""
    payload = data.encode() if isinstance(data, str) else data
    if path.is_file() and path.read_bytes() == payload:
        return False
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(payload)
            stream.flush()
            os.fsync(stream.fileno())
        Path(temporary).chmod(0o644)
        Path(temporary).replace(path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return True


def write_report_file(path: Path, data: bytes | str) -> bool:
    """One report file, its directory made first (a fresh checkout has no artifacts/); False when the file
    already holds these bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, data)


def write_report_files(
    directory: Path,
    basename: str,
    contents: Mapping[str, bytes | str],
    latest_basename: str | None = None,
    suffixes_of_latest: tuple[str, ...] = (),
) -> dict[str, Path]:
    """Write `<basename><suffix>` for every suffix in `contents`, then the same bytes as `<latest_basename><suffix>`.

    A latest file of a suffix listed in `suffixes_of_latest` that this report lacks is removed (an older run's
    chart must not sit beside a report without one). Returns {suffix: path, "latest" + suffix: path}.
    """
    if not basename or "/" in basename or basename.startswith("."):
        raise ValueError(f"basename {basename!r} must be a plain file name")
    if latest_basename is not None and latest_basename == basename:
        raise ValueError("latest_basename must differ from basename")
    directory.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for suffix, data in contents.items():
        paths[suffix] = directory / f"{basename}{suffix}"
        write_atomic(paths[suffix], data)
    if latest_basename is not None:
        for suffix, data in contents.items():
            paths[f"latest{suffix}"] = directory / f"{latest_basename}{suffix}"
            write_atomic(paths[f"latest{suffix}"], data)
        for suffix in suffixes_of_latest:
            stale = directory / f"{latest_basename}{suffix}"
            if suffix not in contents and stale.exists():
                stale.unlink()
    return paths
