"""Parse nvidia-smi's CSV queries into GPU and compute-process facts (stdlib only, no Ansible imports).

The queries (what plugins/modules/kimi_gpu_info.py runs on each node):

    nvidia-smi --query-gpu=index,name,uuid,memory.total,memory.used,driver_version,pci.bus_id \
        --format=csv,noheader,nounits
    nvidia-smi --query-compute-apps=pid,process_name,used_memory,gpu_uuid --format=csv,noheader,nounits

The parser also takes the variants people paste: with the header line ("memory.total [MiB]") and with units
in the values ("81559 MiB", when ``nounits`` is left out). Fields the driver cannot fill read "[N/A]",
"[Not Supported]" and the like; they become None rather than a parse error.
"""

from __future__ import annotations

import csv
import re
from typing import Any

GPU_QUERY_FIELDS = ("index", "name", "uuid", "memory.total", "memory.used", "driver_version", "pci.bus_id")
APPS_QUERY_FIELDS = ("pid", "process_name", "used_memory", "gpu_uuid")
CSV_FORMAT = "--format=csv,noheader,nounits"
GPU_QUERY_ARGS = ("--query-gpu=" + ",".join(GPU_QUERY_FIELDS), CSV_FORMAT)
APPS_QUERY_ARGS = ("--query-compute-apps=" + ",".join(APPS_QUERY_FIELDS), CSV_FORMAT)

# Placeholders nvidia-smi prints instead of a value (with or without the brackets).
_UNAVAILABLE = re.compile(
    r"^\[?(N/A|Not Supported|Unknown Error|Insufficient Permissions|GPU is lost|Requested functionality has been"
    r" deprecated)\]?$",
    re.IGNORECASE,
)
_MIB = re.compile(r"^(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>MiB|GiB|KiB|B)?$", re.IGNORECASE)
_UNIT_FACTORS = {None: 1.0, "mib": 1.0, "gib": 1024.0, "kib": 1 / 1024, "b": 1 / (1024 * 1024)}


class NvidiaSmiParseError(ValueError):
    """Output that is not the CSV the query asked for (the message quotes the offending line)."""


def clean(value: str | None) -> str | None:
    """A field's text, or None for an empty field or one of nvidia-smi's placeholders."""
    if value is None:
        return None
    text = value.strip()
    if not text or _UNAVAILABLE.match(text):
        return None
    return text


def parse_mib(value: str | None) -> int | None:
    """'81559', '81559 MiB' or '[N/A]' -> 81559, 81559, None (other binary units are converted to MiB)."""
    text = clean(value)
    if text is None:
        return None
    match = _MIB.match(text)
    if not match:
        raise NvidiaSmiParseError(f"not a memory size in MiB: {value!r}")
    unit = match.group("unit")
    return round(float(match.group("number")) * _UNIT_FACTORS[unit.lower() if unit else None])


def _is_header(cells: list[str], fields: tuple[str, ...]) -> bool:
    # The header names the first field, followed by a unit in brackets for some ("memory.total [MiB]").
    first = cells[0].strip().lower()
    return first == fields[0] or first.startswith(fields[0] + " [")


def parse_rows(text: str, fields: tuple[str, ...]) -> list[dict[str, str | None]]:
    """CSV lines of one query into dicts keyed by the query's field names (header line skipped if present)."""
    rows = []
    lines = [line for line in text.splitlines() if line.strip()]
    for number, cells in enumerate(csv.reader(lines, skipinitialspace=True), start=1):
        if number == 1 and _is_header(cells, fields):
            continue
        if len(cells) != len(fields):
            raise NvidiaSmiParseError(
                f"line {number}: expected {len(fields)} fields ({', '.join(fields)}), got {len(cells)}: "
                f"{lines[number - 1]!r}"
            )
        rows.append({field: clean(cell) for field, cell in zip(fields, cells, strict=True)})
    return rows


def _int_or_none(value: str | None, what: str) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError as exc:
        raise NvidiaSmiParseError(f"{what} is not an integer: {value!r}") from exc


def parse_gpus(text: str) -> list[dict[str, Any]]:
    """The GPU query's output as one dict per GPU."""
    gpus = []
    for row in parse_rows(text, GPU_QUERY_FIELDS):
        total = parse_mib(row["memory.total"])
        gpus.append(
            {
                "index": _int_or_none(row["index"], "index"),
                "name": row["name"],
                "uuid": row["uuid"],
                "memory_total_mib": total,
                "memory_total_gib": None if total is None else round(total / 1024, 3),
                "memory_used_mib": parse_mib(row["memory.used"]),
                "driver_version": row["driver_version"],
                "pci_bus_id": row["pci.bus_id"],
            }
        )
    return gpus


def parse_compute_apps(text: str) -> list[dict[str, Any]]:
    """The compute-apps query's output as one dict per process (empty output: no process holds a GPU)."""
    if text.strip().lower().startswith("no running processes found"):
        return []
    return [
        {
            "pid": _int_or_none(row["pid"], "pid"),
            "process_name": row["process_name"],
            "used_memory_mib": parse_mib(row["used_memory"]),
            "gpu_uuid": row["gpu_uuid"],
        }
        for row in parse_rows(text, APPS_QUERY_FIELDS)
    ]


def gpu_facts(gpu_text: str, apps_text: str = "") -> dict[str, Any]:
    """GPUs with the compute processes on each, plus the summary preflight checks read."""
    gpus = parse_gpus(gpu_text)
    processes = parse_compute_apps(apps_text)
    index_by_uuid = {gpu["uuid"]: gpu["index"] for gpu in gpus if gpu["uuid"]}
    for gpu in gpus:
        gpu["processes"] = [proc for proc in processes if proc["gpu_uuid"] == gpu["uuid"]]
    for proc in processes:
        proc["gpu_index"] = index_by_uuid.get(proc["gpu_uuid"])
    totals = [gpu["memory_total_mib"] for gpu in gpus if gpu["memory_total_mib"] is not None]
    return {
        "gpu_count": len(gpus),
        "gpus": gpus,
        "gpu_names": sorted({gpu["name"] for gpu in gpus if gpu["name"]}),
        "driver_versions": sorted({gpu["driver_version"] for gpu in gpus if gpu["driver_version"]}),
        "memory_total_mib_min": min(totals) if totals else None,
        "memory_total_mib_sum": sum(totals),
        "compute_processes": processes,
        "busy_gpus": [
            {"index": gpu["index"], "uuid": gpu["uuid"], "pids": [proc["pid"] for proc in gpu["processes"]]}
            for gpu in gpus
            if gpu["processes"]
        ],
    }


def describe_busy(facts: dict[str, Any]) -> list[str]:
    """One line per process holding GPU memory: what preflight prints when GPUs are not free."""
    lines = []
    for proc in facts["compute_processes"]:
        where = f"GPU {proc['gpu_index']}" if proc.get("gpu_index") is not None else proc["gpu_uuid"]
        used = "unknown memory" if proc["used_memory_mib"] is None else f"{proc['used_memory_mib']} MiB"
        lines.append(f"PID {proc['pid']} ({proc['process_name'] or '?'}) holds {used} on {where}")
    return lines
