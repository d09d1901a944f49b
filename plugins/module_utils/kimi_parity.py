"""Cross-node parity of the pinned stack: every item of every node's stack facts, compared with the other
nodes and with the pins, with the exact command that fixes each difference.

Input is what `kimi_stack_facts` returned on each node (``{host: facts}``); nothing here touches a node.
An item with a pin must equal the pin on every node; an item without one must be the same on every node
(the most common value is taken as the reference, ties going to the first host, i.e. node rank 0).
Each node is flattened once into {item: value}, so the whole comparison is linear in hosts x items.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import kimi_report
from .kimi_stack import (
    check_env_interfaces,
    normalize_dist_name,
    upstream_version,
)

REPORT_SCHEMA = 1
ABSENT = "absent"
NO_FACTS = "no facts"
NCCL_WHEEL = "nvidia-nccl-cu13"
NCCL_DEB = "libnccl2"
# Rows a reader always wants in the table, even when every node agrees.
HEADLINE_KINDS = ("deb", "hold", "wheel", "driver", "fabric_manager", "cuda", "nccl", "iface", "env", "venv")
MISMATCH_MARK = " !"
WARNING_MARK = " ~"
MAX_CELL = 30


@dataclass
class Pins:
    """What every node must have. Empty fields are not pinned: those items only have to agree."""

    debs: dict[str, str] = field(default_factory=dict)
    hold_debs: bool = True
    wheels: dict[str, str] = field(default_factory=dict)
    wheel_overrides: dict[str, str] = field(default_factory=dict)
    driver_version: str | None = None
    cuda_version: str | None = None
    nccl_version: str | None = None
    venv_python: str | None = None
    nccl_env: dict[str, str] = field(default_factory=dict)
    per_host_env_keys: tuple[str, ...] = ("VLLM_HOST_IP",)
    require_fabric_manager: bool = False
    compare_all_wheels: bool = True

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Pins:
        known = {name for name in cls.__dataclass_fields__}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown pin fields: {', '.join(unknown)}")
        values = {key: value for key, value in data.items() if value is not None}
        for key in ("wheels", "wheel_overrides"):
            values[key] = {normalize_dist_name(k): str(v) for k, v in values.get(key, {}).items()}
        values["debs"] = {k: str(v) for k, v in values.get("debs", {}).items()}
        values["nccl_env"] = {k: str(v) for k, v in values.get("nccl_env", {}).items()}
        values["per_host_env_keys"] = tuple(values.get("per_host_env_keys", cls.per_host_env_keys))
        return cls(**values)

    def expected_wheels(self) -> dict[str, str]:
        """Pinned wheels with the recorded overrides applied (an override is installed after the resolve)."""
        return {**self.wheels, **self.wheel_overrides}

    def expected_nccl(self) -> tuple[str | None, str]:
        """The NCCL version vLLM must load, and where that expectation comes from."""
        if self.nccl_version:
            return self.nccl_version, "pin"
        wheels = self.expected_wheels()
        if NCCL_WHEEL in wheels:
            source = "override" if NCCL_WHEEL in self.wheel_overrides else "pin"
            return wheels[NCCL_WHEEL], f"{NCCL_WHEEL} {source}"
        return None, "consensus"


@dataclass
class Item:
    """One row of the comparison: how to read it from a flattened node and what it must be."""

    key: str
    label: str
    kind: str
    severity: str = "error"
    expected: str | None = None
    expected_from: str = "consensus"
    # Per-host expectations (fabric manager must equal that node's own driver).
    per_host_expected: Callable[[dict[str, Any]], str | None] | None = None
    matches: Callable[[str, str], bool] = field(default=lambda value, expected: value == expected)


# ---------------------------------------------------------------- flattening one node


def flatten(facts: dict[str, Any] | None, pins: Pins) -> dict[str, Any]:
    """One node's facts as {item key: short value}, plus '_ctx' with what fixes need (venv, env file...)."""
    if not facts:
        return {"_ctx": {"missing": True}}
    facts = facts.get("kimi_stack", facts)
    flat: dict[str, Any] = {}
    debs = facts.get("debs", {})
    for name, entry in debs.items():
        flat[f"deb:{name}"] = entry.get("version") if entry.get("installed") else ABSENT
    for name in pins.debs:
        entry = debs.get(name, {})
        flat.setdefault(f"deb:{name}", ABSENT)
        if pins.hold_debs:
            flat[f"hold:{name}"] = ("held" if entry.get("held") else "not held") if entry.get("installed") else "n/a"

    driver = facts.get("driver", {})
    flat["driver"] = driver.get("version") or ABSENT
    gpus = driver.get("gpus", [])
    flat["gpu:count"] = str(len(gpus))
    flat["gpu:model"] = ", ".join(sorted({gpu.get("name", "?") for gpu in gpus})) or "none"
    fabric = facts.get("fabric_manager", {})
    flat["fabric_manager"] = fabric.get("version") or ABSENT

    cuda = facts.get("cuda", {})
    flat["cuda:toolkit"] = cuda.get("toolkit_version") or ABSENT
    flat["cuda:runtime"] = cuda.get("cudart_version") or ABSENT

    venv = facts.get("venv", {})
    flat["venv"] = "present" if venv.get("exists") else "missing"
    flat["venv:python"] = venv.get("python") or ABSENT
    packages = venv.get("packages", {})
    wanted = set(pins.expected_wheels()) | (set(packages) if pins.compare_all_wheels else set())
    for name in wanted:
        flat[f"wheel:{name}"] = packages.get(name, ABSENT)

    nccl = facts.get("nccl", {})
    if nccl.get("error"):
        flat["nccl:version"] = f"error: {nccl['error']}"
    else:
        flat["nccl:version"] = nccl.get("version") or ("not found" if not nccl.get("path") else "unread")
    flat["nccl:source"] = nccl.get("source") or "none"

    nccl_env = facts.get("nccl_env", {})
    values = nccl_env.get("values", {})
    flat["env:file"] = "present" if nccl_env.get("exists") else "missing"
    for key, value in values.items():
        if key not in pins.per_host_env_keys:
            flat[f"env:{key}"] = value
    for key in pins.nccl_env:
        flat.setdefault(f"env:{key}", "unset")
    checks = check_env_interfaces(values, facts.get("interfaces", {}), nccl_env.get("infiniband_devices"))
    for key, check in checks.items():
        flat[f"iface:{key}"] = check["status"]

    flat["kernel"] = facts.get("kernel") or ABSENT
    os_info = facts.get("os", {})
    flat["os"] = f"{os_info.get('id', '?')} {os_info.get('version_id', '?')}".strip()
    flat["_ctx"] = {
        "missing": False,
        "venv": venv.get("path") or "/opt/vllm/current",
        "env_file": nccl_env.get("path") or "the NCCL environment file",
        "env_values": values,
        "iface_checks": checks,
        "nccl": nccl,
        "fabric_package": fabric.get("package"),
        "driver_version": driver.get("version"),
        "debs": debs,
    }
    return flat


# ---------------------------------------------------------------- which items, and what they must be


def _prefix_match(value: str, expected: str) -> bool:
    return value == expected or value.startswith(expected + ".")


def build_items(keys: set[str], pins: Pins) -> list[Item]:
    """An Item for every key any node reported, plus every pinned one, in a stable reading order."""
    items: dict[str, Item] = {}
    expected_wheels = pins.expected_wheels()
    nccl_expected, nccl_from = pins.expected_nccl()
    for key in keys:
        kind, _, name = key.partition(":")
        item = Item(key=key, label=key, kind=kind)
        if kind == "deb":
            item.label = f"{name} (deb)"
            if name in pins.debs:
                item.expected, item.expected_from = pins.debs[name], "pin"
        elif kind == "hold":
            item.label = f"{name} held"
            item.expected, item.expected_from = "held", "pin"
            item.matches = lambda value, expected: value in (expected, "n/a")
        elif kind == "wheel":
            item.label = f"{name} (wheel)"
            if name in expected_wheels:
                override = name in pins.wheel_overrides
                item.expected, item.expected_from = expected_wheels[name], "override" if override else "pin"
        elif key == "driver":
            item.label = "NVIDIA driver"
            if pins.driver_version:
                item.expected, item.expected_from = pins.driver_version, "pin"
        elif key == "fabric_manager":
            item.label = "fabric manager = driver"
            item.expected_from = "driver"
            item.per_host_expected = _fabric_manager_expectation(pins)
        elif key == "cuda:toolkit":
            item.label = "CUDA toolkit"
            if pins.cuda_version:
                item.expected, item.expected_from, item.matches = pins.cuda_version, "pin", _prefix_match
        elif key == "cuda:runtime":
            item.label = "CUDA runtime (cudart)"
        elif key == "nccl:version":
            item.label = "NCCL vLLM loads"
            if nccl_expected:
                item.expected, item.expected_from = nccl_expected, nccl_from
        elif key == "nccl:source":
            item.label = "NCCL loaded from"
        elif kind == "env":
            item.label = f"{name}" if name != "file" else "NCCL env file"
            if name in pins.nccl_env:
                item.expected, item.expected_from = pins.nccl_env[name], "pin"
        elif kind == "iface":
            item.label = f"{name} interface"
            item.expected, item.expected_from = "ok", "check"
        elif key == "venv":
            item.label = "vLLM venv"
            if expected_wheels:
                item.expected, item.expected_from = "present", "pin"
        elif key == "venv:python":
            item.label = "venv Python"
            if pins.venv_python:
                item.expected, item.expected_from, item.matches = pins.venv_python, "pin", _prefix_match
        elif key in ("kernel", "os"):
            item.label = "kernel" if key == "kernel" else "OS"
            item.severity = "warning"
        elif kind == "gpu":
            item.label = f"GPU {name}"
        items[key] = item
    return sorted(items.values(), key=_reading_order)


def _fabric_manager_expectation(pins: Pins) -> Callable[[dict[str, Any]], str | None]:
    def expected(flat: dict[str, Any]) -> str | None:
        driver = flat.get("driver")
        if driver in (None, ABSENT):
            return None  # no driver: nothing to equal (a CPU node)
        if flat.get("fabric_manager") == ABSENT and not pins.require_fabric_manager:
            return None  # not an NVSwitch system
        return driver

    return expected


_ORDER = ("deb", "driver", "fabric_manager", "gpu", "cuda", "venv", "wheel", "nccl", "env", "iface")


def _reading_order(item: Item) -> tuple[int, int, str, int]:
    """Pinned rows first within a kind; a deb's hold row right under its version row."""
    kind, _, name = item.key.partition(":")
    is_hold = kind == "hold"
    kind = "deb" if is_hold else kind
    rank = _ORDER.index(kind) if kind in _ORDER else len(_ORDER)
    pinned = 0 if item.expected_from != "consensus" or is_hold else 1
    return rank, pinned, name or item.key, int(is_hold)


# ---------------------------------------------------------------- comparing


def compare(facts_by_host: dict[str, dict[str, Any] | None], pins: Pins) -> dict[str, Any]:
    """The parity report: rows (item, values per host, expected, ok), failures with fixes, warnings."""
    hosts = list(facts_by_host)
    flats = {host: flatten(facts_by_host[host], pins) for host in hosts}
    missing = [host for host in hosts if flats[host]["_ctx"]["missing"]]
    present = [host for host in hosts if host not in missing]
    keys = {key for host in present for key in flats[host] if key != "_ctx"}
    keys |= {f"deb:{name}" for name in pins.debs} | {f"wheel:{name}" for name in pins.expected_wheels()}
    rows, failures, warnings = [], [], []
    for item in build_items(keys, pins):
        row = _compare_item(item, present, flats)
        rows.append(row)
        for host in present:
            if row["ok"][host]:
                continue
            entry = _failure(item, host, row, flats[host], pins, facts_by_host)
            (failures if item.severity == "error" else warnings).append(entry)
    for host in missing:
        failures.append(
            {
                "host": host,
                "item": "facts",
                "label": "stack facts",
                "value": NO_FACTS,
                "expected": "facts from kimi_stack_facts",
                "fix": f"on {host}: run kimi_stack_facts (the host was unreachable or skipped)",
                "message": f"{host}: no stack facts",
            }
        )
    return {
        "schema": REPORT_SCHEMA,
        "ok": not failures,
        "hosts": hosts,
        "hosts_without_facts": missing,
        "summary": {
            "hosts": len(hosts),
            "items": len(rows),
            "items_differing": sum(1 for row in rows if not row["all_ok"]),
            "failures": len(failures),
            "warnings": len(warnings),
        },
        "rows": rows,
        "failures": failures,
        "warnings": warnings,
    }


def _compare_item(item: Item, hosts: list[str], flats: dict[str, dict[str, Any]]) -> dict[str, Any]:
    values = {host: _missing_value(item, flats[host]) for host in hosts}
    expected, expected_from = item.expected, item.expected_from
    if expected is None and item.per_host_expected is None and values:
        expected = _consensus([values[host] for host in hosts])
    ok = {}
    for host in hosts:
        wanted = item.per_host_expected(flats[host]) if item.per_host_expected else expected
        ok[host] = wanted is None or item.matches(values[host], wanted)
    shown_expected = "= driver" if item.per_host_expected else expected
    return {
        "item": item.key,
        "label": item.label,
        "severity": item.severity,
        "expected": shown_expected,
        "expected_from": expected_from,
        "values": values,
        "ok": ok,
        "all_ok": all(ok.values()),
    }


def _missing_value(item: Item, flat: dict[str, Any]) -> str:
    if item.key in flat:
        return flat[item.key]
    kind = item.kind
    if kind == "iface":
        return "unset"
    if kind == "env":
        return "unset"
    return ABSENT


def _consensus(values: list[str]) -> str:
    """The most common value; on a tie the first host's (node rank 0 is the reference)."""
    counts = Counter(values)
    best = max(counts.values())
    return next(value for value in values if counts[value] == best)


# ---------------------------------------------------------------- fixes


def _failure(
    item: Item,
    host: str,
    row: dict[str, Any],
    flat: dict[str, Any],
    pins: Pins,
    facts_by_host: dict[str, Any],
) -> dict[str, Any]:
    value = row["values"][host]
    expected = item.per_host_expected(flat) if item.per_host_expected else row["expected"]
    origin = {"pin": "pinned", "consensus": "on the other nodes", "override": "the recorded override"}.get(
        row["expected_from"], row["expected_from"]
    )
    fix = _fix(item, host, value, expected, flat, pins, facts_by_host)
    message = f"{host}: {item.label} is {value}, expected {expected} ({origin})"
    if item.kind == "iface":
        key = item.key.split(":", 1)[1]
        check = flat["_ctx"]["iface_checks"].get(key, {})
        message = f"{host}: {key}={check.get('spec')} in {flat['_ctx']['env_file']}: {check.get('problem')}"
    return {
        "host": host,
        "item": item.key,
        "label": item.label,
        "value": value,
        "expected": expected,
        "expected_from": row["expected_from"],
        "fix": fix,
        "message": message,
    }


def _apt_install(package: str, version: str, hold: bool) -> str:
    command = f"apt-get install -y --allow-change-held-packages {package}={version}"
    return f"{command} && apt-mark hold {package}" if hold else command


def _fix(
    item: Item,
    host: str,
    value: str,
    expected: str,
    flat: dict[str, Any],
    pins: Pins,
    facts_by_host: dict[str, Any],
) -> str:
    ctx = flat["_ctx"]
    name = item.key.split(":", 1)[1] if ":" in item.key else item.key
    on = f"on {host}: "
    if item.kind == "deb":
        if expected == ABSENT:
            return on + f"apt-get remove {name} (no other node has it)"
        return on + _apt_install(name, expected, pins.hold_debs and name in pins.debs)
    if item.kind == "hold":
        return on + f"apt-mark hold {name}"
    if item.kind == "wheel":
        return on + _pip_fix(ctx["venv"], name, expected, name in pins.wheel_overrides)
    if item.key == "venv":
        return on + f"create the vLLM venv {ctx['venv']} (re-run the vllm role with --limit {host})"
    if item.key == "venv:python":
        return on + f"recreate {ctx['venv']} with Python {expected} (re-run the vllm role with --limit {host})"
    if item.key == "driver":
        return on + _driver_fix(ctx, expected, facts_by_host)
    if item.key == "fabric_manager":
        return on + _fabric_manager_fix(ctx, expected, facts_by_host)
    if item.kind == "cuda":
        return on + f"install CUDA {expected} (re-run the cuda role with --limit {host})"
    if item.key == "nccl:version":
        return on + _nccl_fix(ctx, value, expected, pins)
    if item.key == "nccl:source":
        return on + (
            f"vLLM loads NCCL from {value} ({ctx['nccl'].get('path')}) while the other nodes load it from "
            f"{expected}; make this node's venv and {ctx['env_file']} match theirs"
        )
    if item.kind == "env":
        if name == "file":
            return on + f"write {ctx['env_file']} (re-run the nccl role with --limit {host})"
        if expected == "unset":
            return on + f"remove {name} from {ctx['env_file']}"
        return on + f"set {name}={expected} in {ctx['env_file']}"
    if item.kind == "iface":
        check = ctx["iface_checks"].get(name, {})
        return on + (
            f"{name}={check.get('spec')} in {ctx['env_file']}: {check.get('problem')}; name an interface "
            "that exists on every node, is up and has an IPv4 address (kimi_network_interface)"
        )
    if item.kind == "gpu":
        return on + f"{item.label} is {value} while the other nodes have {expected}; check the hardware"
    return on + f"{item.label} is {value}, the other nodes have {expected}"


def _pip_fix(venv: str, name: str, version: str, override: bool) -> str:
    if version == ABSENT:
        return f"{venv}/bin/python -m pip uninstall -y {name}"
    note = " (the recorded NCCL-wheel override, installed after torch)" if override else ""
    return f"{venv}/bin/python -m pip install --no-deps '{name}=={version}'{note}"


def _deb_version_elsewhere(package: str | None, upstream: str, facts_by_host: dict[str, Any]) -> str | None:
    """The full Debian version of ``package`` at ``upstream`` as another node has it (for an exact fix)."""
    if not package:
        return None
    for facts in facts_by_host.values():
        entry = ((facts or {}).get("kimi_stack", facts or {}).get("debs") or {}).get(package) or {}
        if entry.get("installed") and upstream_version(entry.get("version")) == upstream:
            return entry["version"]
    return None


def _driver_fix(ctx: dict[str, Any], expected: str, facts_by_host: dict[str, Any]) -> str:
    branch = expected.split(".", 1)[0]
    package = next((n for n in ctx["debs"] if n.startswith(f"nvidia-driver-{branch}")), f"nvidia-driver-{branch}")
    version = _deb_version_elsewhere(package, expected, facts_by_host)
    if version:
        return _apt_install(package, version, True) + " && reboot"
    return f"install {package} at {expected} (apt-cache madison {package}), apt-mark hold {package}, reboot"


def _fabric_manager_fix(ctx: dict[str, Any], driver: str, facts_by_host: dict[str, Any]) -> str:
    current = ctx.get("fabric_package")
    branch = driver.split(".", 1)[0]
    # NVIDIA names fabric manager per driver branch (nvidia-fabricmanager-580); newer repos also ship an
    # unversioned nvidia-fabricmanager. Keep the node's naming, but on the driver's branch.
    package = "nvidia-fabricmanager" if current == "nvidia-fabricmanager" else f"nvidia-fabricmanager-{branch}"
    version = _deb_version_elsewhere(package, driver, facts_by_host)
    if version:
        return _apt_install(package, version, True)
    return f"install {package} at {driver} (apt-cache madison {package}) and apt-mark hold {package}"


def _nccl_fix(ctx: dict[str, Any], value: str, expected: str, pins: Pins) -> str:
    nccl = ctx["nccl"]
    source, path = nccl.get("source"), nccl.get("path")
    if source == "wheel":
        return _pip_fix(ctx["venv"], NCCL_WHEEL, expected, NCCL_WHEEL in pins.wheel_overrides)
    if source == "system":
        deb = pins.debs.get(NCCL_DEB)
        if deb and upstream_version(deb) == expected:
            return _apt_install(NCCL_DEB, deb, pins.hold_debs)
        return (
            f"vLLM loads the system {path} (NCCL {value}) because the venv has no {NCCL_WHEEL} wheel; "
            f"install {NCCL_WHEEL}=={expected} into {ctx['venv']}"
        )
    if source == "VLLM_NCCL_SO_PATH":
        return (
            f"VLLM_NCCL_SO_PATH={path} in {ctx['env_file']} is NCCL {value}; point it at NCCL {expected} or remove it"
        )
    return f"no libnccl.so.2 found; install {NCCL_WHEEL}=={expected} into {ctx['venv']}"


# ---------------------------------------------------------------- rendering


def render_table(report: dict[str, Any], max_hosts: int = 12, all_rows: bool = False) -> str:
    """A row per item, a column per host; '!' marks a value that differs from the expected one.

    Rows shown: pinned items, the headline kinds and every differing item (``all_rows`` shows all). With
    more hosts than ``max_hosts`` the hosts with differences come first and the rest fold into one column.
    """
    hosts = report["hosts"]
    failing_hosts = {entry["host"] for entry in report["failures"] + report["warnings"]}
    shown = [h for h in hosts if h in failing_hosts][:max_hosts]
    shown += [h for h in hosts if h not in shown][: max(0, max_hosts - len(shown))]
    shown = [h for h in hosts if h in shown]  # keep node order
    folded = [h for h in hosts if h not in shown and h not in report["hosts_without_facts"]]
    rows = [
        row
        for row in report["rows"]
        if all_rows
        or not row["all_ok"]
        or row["expected_from"] != "consensus"
        or row["item"].split(":", 1)[0] in HEADLINE_KINDS
    ]
    header = ["item", "expected", *shown] + ([f"+{len(folded)} hosts"] if folded else [])
    lines = [header]
    for row in rows:
        cells = [_cell(row["label"]), _cell(row["expected"] if row["expected"] is not None else "-")]
        for host in shown:
            cells.append(_host_cell(row, host))
        if folded:
            differing = sum(1 for h in folded if not row["ok"].get(h, True))
            cells.append(f"{differing} differ{MISMATCH_MARK}" if differing else "same")
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip() for line in lines]
    text.insert(1, "  ".join("-" * width for width in widths))
    hidden = len(report["rows"]) - len(rows)
    notes = ["! differs from expected (an error), ~ differs (a warning)"]
    if hidden:
        notes.append(f"{hidden} more items are identical on every host (all of them are in the JSON report)")
    return "\n".join([*text, "", *notes])


def _host_cell(row: dict[str, Any], host: str) -> str:
    if host not in row["values"]:
        return NO_FACTS + MISMATCH_MARK
    mark = "" if row["ok"][host] else (MISMATCH_MARK if row["severity"] == "error" else WARNING_MARK)
    return _cell(row["values"][host], len(mark)) + mark


def _cell(text: str, reserve: int = 0) -> str:
    text = str(text)
    limit = MAX_CELL - reserve
    return text if len(text) <= limit else text[: limit - 3] + "..."


def render_fixes(report: dict[str, Any]) -> str:
    """One line per failure: what is wrong where, then the command that fixes it."""
    lines = []
    for entry in report["failures"]:
        lines.append(f"- {entry['message']}\n    fix: {entry['fix']}")
    for entry in report["warnings"]:
        lines.append(f"- warning: {entry['message']}")
    return "\n".join(lines)


def summary_message(report: dict[str, Any], max_hosts: int = 12) -> str:
    """The message a failed parity run shows: the verdict, the table and the fixes."""
    summary = report["summary"]
    if report["ok"]:
        head = f"parity OK: {summary['items']} items identical on {summary['hosts']} hosts"
    else:
        failing_hosts = sorted({entry["host"] for entry in report["failures"]}, key=report["hosts"].index)
        head = (
            f"parity FAILED: {summary['failures']} differences on {', '.join(failing_hosts)} "
            f"({summary['items_differing']} of {summary['items']} items differ)"
        )
    parts = [head, "", render_table(report, max_hosts)]
    fixes = render_fixes(report)
    if fixes:
        parts += ["", fixes]
    return "\n".join(parts)


def report_json(report: dict[str, Any]) -> str:
    """Deterministic JSON (sorted keys, no timestamp), so an unchanged cluster rewrites the same file.

    Compact, because 256 hosts x ~230 items is ~2 MB already; `jq .` makes it readable.
    """
    return kimi_report.report_json(report, compact=True)
