"""nccl-tests across the cluster, the verdict: the parser for what all_reduce_perf (or the role's torch benchmark,
which prints the same layout) and NCCL's INFO logging print, the reader of nccl-tests' -J JSON file, and the
verdict against the site's gates.

Pure logic, no Ansible: plugins/modules/kimi_nccl_tests_result.py wraps it (verdict); tests call it with
recorded outputs (tests/fixtures/nccl_tests/). The output formats followed are nccl-tests' (2.x: the
`# nThread ...` header, the `#  Rank N Group ...` device lines, the size/count/type/redop/root table with
out-of-place and in-place time/algbw/busbw/#wrong, the `Out of bounds values` and `Avg bus bandwidth` footer)
and NCCL's debug lines (`host:pid:tid [dev] NCCL INFO ...`).

Both parsers stay. The JSON file gives the table, the footer and the library version with unrounded figures, but
only mpirun's all_reduce_perf writes one: the torchrun launcher's benchmark prints the text layout alone, an
empty nccl_tests_json_path means the printed table only, and a run cut short leaves no file (or a broken one),
when the printed rows are what says how far it got. The ranks, the transport, GPUDirect RDMA, the per-rank NCCL
versions and the failures are never in the JSON: they come from the printed header and NCCL's log lines.

Separate from kimi_nccl_tests_launch (the environment and the command): the verdict reads a finished run's output
and needs nothing of how it was launched.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

# What nccl_tests_require_transport accepts: RDMA is either InfiniBand or RoCE.
TRANSPORTS = ("", "IB", "RoCE", "RDMA")
# Exit status of coreutils timeout(1) when the limit was reached.
TIMEOUT_RC = 124


# ------------------------------------------------------------------------------------------ parsing

# mpirun --tag-output prefixes every line with [job,rank]<stdout>:
_TAG = re.compile(r"^\[\d+,\d+\]<std(?:out|err)>:\s?")
_TESTS_VERSION = re.compile(r"^#\s*nccl-tests version (\S+)")
_CODES = re.compile(r"nccl-headers=(\d+)|nccl-library=(\d+)")
_PROGRAM = re.compile(r"^#\s*Collective test starting: (\S+)")
_CONCLUDED = re.compile(r"^#\s*Collective test concluded: (\S+)")
_CONFIG = re.compile(
    r"^#\s*nThread (\d+) nGpus (\d+) minBytes (\d+) maxBytes (\d+) step: (\d+)\((factor|bytes)\) "
    r"warmup iters: (\d+) iters: (\d+) agg iters: (\d+) validation: (\d+) graph: (\d+)"
)
_RANK = re.compile(
    r"^#\s+Rank\s+(\d+)\s+Group\s+(\d+)\s+Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)\s+\[([0-9A-Fa-fx:.]+)\]\s+(.*?)\s*$"
)
_OUT_OF_BOUNDS = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)")
_AVG_BUSBW = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)")
_PER_ITER_HEADER = re.compile(r"out-of-place \(\+ per-iteration\)")
# host:pid:tid [cudaDev] [file:line [(func)]] NCCL INFO|WARN message; an optional [timestamp] before it.
_NCCL_LINE = re.compile(
    r"^(?:\[[^\]]*\]\s*)?(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+)\s+\[(?P<dev>\d+)\]\s+"
    r"(?:\S+:\d+\s+(?:\(\S*\)\s+)?)?NCCL (?P<level>INFO|WARN) (?P<msg>.*)$"
)
_VERSION_ONLY = re.compile(r"^NCCL version (\d+\.\d+\.\d+\S*)")
_NCCL_VERSION = re.compile(r"^NCCL version (\d+)\.(\d+)\.(\d+)(\S*)")
_NET_IB = re.compile(r"^NET/IB ?: Using(.*?)(?:;\s*OOB (\S+?):(\S+))?\s*$")
_IB_DEVICE = re.compile(r"\[(\d+)\]([^:\s\]]+):(\d+)(?::[^/\s]*)?/(IB|RoCE)")
_NET_IB_NONE = re.compile(r"^NET/IB ?: No device found")
_NET_SOCKET = re.compile(r"^NET/Socket ?: Using(.*)$")
_SOCKET_IF = re.compile(r"\[(\d+)\]([^:\s]+):(\S+)")
_USING_NETWORK = re.compile(r"^Using network (.+?)\s*$")
_BOOTSTRAP = re.compile(r"^Bootstrap ?: Using (\S+?):(\S+)")
_CHANNEL_NET = re.compile(
    r"^Channel \d+(?:/\d+)? : (\d+)\[[0-9a-fA-Fx]+\] -> (\d+)\[[0-9a-fA-Fx]+\]"
    r"(?: \[(send|receive)\])? via NET/([^/\s]+)/(\d+)(?:\(\d+\))?(/GDRDMA)?"
)
_CHANNEL_LOCAL = re.compile(r"^Channel \d+(?:/\d+)? : .* via (P2P|SHM|NVLS|CollNet)")
_COMM = re.compile(r"\bcomm 0x[0-9a-fA-F]+ rank (\d+) nRanks (\d+) nNodes (\d+) localRanks (\d+)")
_IB_HINT = re.compile(r"(?:Count|Could) not open (libibverbs\S*|libmlx5\S*)|NCCL_IB_DISABLE|ibv_\w+ failed")
# Lines that say the run (or its launch) failed; kept verbatim in the summary.
_FAILURE_LINES = re.compile(
    r"Test (?:NCCL|CUDA) failure|: Test failure |^# error:|Invalid number of GPUs|"
    r"mpirun detected that one or more processes exited with non-zero status|"
    r"mpirun noticed that process rank|mpirun was unable to|ORTE was unable to|PRTE has lost communication|"
    r"^ssh: |Permission denied \(|Host key verification failed|"
    r"ChildFailedError|RendezvousTimeoutError|DistNetworkError|torch\.distributed\.\S*Error|"
    r"^Traceback \(most recent call last\)|CUDA error|out of memory",
)
_EXIT_CODE = re.compile(r"^\s*Exit code:\s*(-?\d+)")


def decode_nccl_version(code: int) -> str:
    """NCCL's version code as X.Y.Z: X*10000+Y*100+Z since 2.9, X*1000+Y*100+Z before (2804 is 2.8.4)."""
    if code >= 10000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def upstream_version(version: str) -> str:
    """X.Y.Z of a Debian version (2.30.7-1+cuda13.3), a NCCL banner (2.30.7+cuda13.3) or a wheel (2.28.9)."""
    found = re.match(r"^\s*(\d+\.\d+\.\d+)", str(version or ""))
    return found.group(1) if found else str(version or "").strip()


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _row(tokens: list[str], group: int) -> dict[str, Any] | None:
    """A table row: size count type redop root, then out-of-place and in-place groups (time algbw busbw #wrong
    [+ 4 per-iteration columns]); the out-of-place group is blank when the test only runs in place."""
    if len(tokens) < 5 + 4 or not (tokens[0].isdigit() and tokens[1].isdigit()):
        return None
    if not re.match(r"^-?\d+$", tokens[4]):
        return None
    values = tokens[5:]
    sides: list[dict[str, Any] | None] = []
    for start in range(0, 2 * group, group):
        chunk = values[start : start + 4]
        if len(chunk) < 4:
            break
        time_us, algbw, busbw = (_number(item) for item in chunk[:3])
        if time_us is None or algbw is None or busbw is None:
            break
        wrong = None if chunk[3] == "N/A" else _number(chunk[3])
        sides.append(
            {"time_us": time_us, "algbw": algbw, "busbw": busbw, "wrong": None if wrong is None else int(wrong)}
        )
    if not sides:
        return None
    out_of_place, in_place = (sides[0], sides[1]) if len(sides) == 2 else (None, sides[0])
    return {
        "size": int(tokens[0]),
        "count": int(tokens[1]),
        "type": tokens[2],
        "redop": tokens[3],
        "root": int(tokens[4]),
        "out_of_place": out_of_place,
        "in_place": in_place,
    }


def _host_of_address(text: str) -> str:
    return text.split("<", 1)[0]


def _classify(network: str, links: set[str]) -> str:
    """NCCL's network name as the transport people mean: IB and RoCE are both NCCL's "IB" network; the link
    layer of the HCAs tells them apart. Plugins keep their own name."""
    if network.upper().startswith("IB"):
        if links == {"RoCE"}:
            return "RoCE"
        if "RoCE" in links and "IB" in links:
            return "IB+RoCE"
        return "IB"
    return network


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


class _State:
    """Accumulates what the lines say; summary() turns it into plain data."""

    def __init__(self) -> None:
        self.tests_version: str | None = None
        self.headers_code: int | None = None
        self.library_code: int | None = None
        self.program: str | None = None
        self.concluded = False
        self.config: dict[str, Any] | None = None
        self.per_iteration = False
        self.ranks: dict[int, dict[str, Any]] = {}
        self.rows: list[dict[str, Any]] = []
        self.out_of_bounds: int | None = None
        self.avg_busbw: float | None = None
        self.versions: dict[str, set[str]] = {}
        self.banners: dict[str, set[str]] = {}
        self.networks: dict[str, str] = {}
        self.ib_devices: dict[str, list[dict[str, Any]]] = {}
        self.oob: dict[str, str] = {}
        self.ib_missing: set[str] = set()
        self.ib_hints: list[str] = []
        self.sockets: dict[str, list[str]] = {}
        self.bootstrap: dict[str, str] = {}
        self.channel_nets: dict[str, dict[str, int]] = {}
        self.net_channels = 0
        self.gdr_channels = 0
        self.local_channels = 0
        self.comm_ranks: int | None = None
        self.comm_nodes: int | None = None
        self.warnings: list[str] = []
        self.failures: list[str] = []
        self.exit_codes: list[int] = []
        self.nccl_lines = 0

    def nccl(self, host: str, level: str, message: str) -> None:
        self.nccl_lines += 1
        if level == "WARN":
            self.warnings.append(f"{host}: {message.strip()}")
            return
        found = _NCCL_VERSION.match(message)
        if found:
            self.versions.setdefault(host, set()).add(".".join(found.group(1, 2, 3)))
            self.banners.setdefault(host, set()).add(message.split(" ", 2)[2].strip())
            return
        self._network(host, message)

    def _network(self, host: str, message: str) -> None:
        found = _NET_IB.match(message)
        if found:
            devices = [
                {"index": int(m.group(1)), "name": m.group(2), "port": int(m.group(3)), "link": m.group(4)}
                for m in _IB_DEVICE.finditer(found.group(1))
            ]
            self.ib_devices.setdefault(host, [])
            known = {device["name"] for device in self.ib_devices[host]}
            self.ib_devices[host] += [device for device in devices if device["name"] not in known]
            if found.group(2):
                self.oob[host] = f"{found.group(2)}:{_host_of_address(found.group(3))}"
            return
        if _NET_IB_NONE.match(message):
            self.ib_missing.add(host)
            return
        found = _NET_SOCKET.match(message)
        if found:
            interfaces = [f"{m.group(2)}:{_host_of_address(m.group(3))}" for m in _SOCKET_IF.finditer(found.group(1))]
            self.sockets[host] = _unique(self.sockets.get(host, []) + interfaces)
            return
        found = _USING_NETWORK.match(message)
        if found:
            self.networks[host] = found.group(1)
            return
        found = _BOOTSTRAP.match(message)
        if found:
            self.bootstrap[host] = f"{found.group(1)}:{_host_of_address(found.group(2))}"
            return
        found = _CHANNEL_NET.match(message)
        if found:
            self.net_channels += 1
            self.gdr_channels += 1 if found.group(6) else 0
            per_host = self.channel_nets.setdefault(host, {})
            per_host[found.group(4)] = per_host.get(found.group(4), 0) + 1
            return
        if _CHANNEL_LOCAL.match(message):
            self.local_channels += 1
            return
        found = _COMM.search(message)
        if found:
            self.comm_ranks, self.comm_nodes = int(found.group(2)), int(found.group(3))
            return
        if _IB_HINT.search(message):
            self.ib_hints.append(f"{host}: {message.strip()}")

    def comment(self, line: str) -> None:
        found = _TESTS_VERSION.match(line)
        if found:
            self.tests_version = found.group(1)
        for headers, library in _CODES.findall(line):
            if headers:
                self.headers_code = int(headers)
            if library:
                self.library_code = int(library)
        found = _PROGRAM.match(line)
        if found:
            self.program = found.group(1)
        if _CONCLUDED.match(line):
            self.concluded = True
        found = _CONFIG.match(line)
        if found:
            values = [int(found.group(i)) if i != 6 else found.group(i) for i in range(1, 12)]
            keys = ("nthread", "ngpus", "min_bytes", "max_bytes", "step", "step_kind", "warmup_iters", "iters")
            self.config = dict(zip(keys, values[:8], strict=True))
            self.config.update(agg_iters=values[8], validation=values[9], graph=values[10])
        if _PER_ITER_HEADER.search(line):
            self.per_iteration = True
        found = _RANK.match(line)
        if found:
            rank = int(found.group(1))
            self.ranks[rank] = {
                "rank": rank,
                "group": int(found.group(2)),
                "pid": int(found.group(3)),
                "host": found.group(4),
                "device": int(found.group(5)),
                "bus_id": found.group(6),
                "gpu": found.group(7),
            }
        found = _OUT_OF_BOUNDS.match(line)
        if found:
            self.out_of_bounds = int(found.group(1))
        found = _AVG_BUSBW.match(line)
        if found:
            self.avg_busbw = _number(found.group(1))


def parse_output(text: str) -> dict[str, Any]:
    """Everything the verdict and the report need from one run's output (stdout and stderr together, any
    order): the test's header, ranks and table, and what NCCL logged about its version and transport."""
    state = _State()
    for raw in text.splitlines():
        line = _TAG.sub("", raw.rstrip("\r"))
        nccl = _NCCL_LINE.match(line)
        if nccl:
            state.nccl(nccl.group("host"), nccl.group("level"), nccl.group("msg"))
        elif _VERSION_ONLY.match(line):
            # NCCL_DEBUG=VERSION or WARN prints the banner alone, without host or rank.
            state.nccl("?", "INFO", line)
        elif line.startswith("#"):
            state.comment(line)
        else:
            row = _row(line.split(), 8 if state.per_iteration else 4)
            if row is not None:
                state.rows.append(row)
        if _FAILURE_LINES.search(line):
            state.failures.append(line.strip())
        found = _EXIT_CODE.match(line)
        if found:
            state.exit_codes.append(int(found.group(1)))
    return _summary(state)


# ------------------------------------------------------------------------------------------ -J (JSON)

# The JSON nccl-tests writes with -J FILE.json (src/util.cu; JSON_FILE_VERSION 1 from v2.18.5, 2 from v2.19.2,
# 3 in v2.19.6, each adding keys only): the same table with unrounded doubles, the config, the devices, the
# footer. Booleans are written as the strings "true"/"false", doubles with printf's %lf, a NaN as "nan".
JSON_VERSIONS = (1, 2, 3)


def _json_double(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    return _number(str(value))


def _json_side(side: Any) -> dict[str, Any] | None:
    if not isinstance(side, dict):
        return None
    time_us = _json_double(side.get("time", side.get("cpu_time")))
    algbw, busbw = _json_double(side.get("alg_bw")), _json_double(side.get("bus_bw"))
    if time_us is None or algbw is None or busbw is None:
        return None
    wrong = _json_double(side.get("nwrong"))
    return {"time_us": time_us, "algbw": algbw, "busbw": busbw, "wrong": None if wrong is None else int(wrong)}


def parse_json_output(text: str) -> dict[str, Any]:
    """nccl-tests' -J file as the table rows, footer and devices the text parser gives; ValueError when it is
    not such a file (empty, cut short by a crash, or another version of the format)."""
    try:
        document = json.loads(text)
    except ValueError as error:
        raise ValueError(f"not JSON ({error})") from None
    if not isinstance(document, dict) or not isinstance(document.get("results"), list):
        raise ValueError("no 'results' list")
    if document.get("version") not in JSON_VERSIONS:
        raise ValueError(f"version {document.get('version')!r}, this parser reads {JSON_VERSIONS}")
    rows = []
    for entry in document["results"]:
        out_of_place, in_place = _json_side(entry.get("out_of_place")), _json_side(entry.get("in_place"))
        if in_place is None and out_of_place is None:
            continue
        root = str(entry.get("root", "-1")).strip()
        rows.append(
            {
                "size": int(entry["size"]),
                "count": int(entry["count"]),
                "type": str(entry.get("type", "")).strip(),
                "redop": str(entry.get("redop", "")).strip(),
                "root": int(root) if re.match(r"^-?\d+$", root) else -1,
                "out_of_place": out_of_place,
                "in_place": in_place,
            }
        )
    bounds = document.get("out_of_bounds") if isinstance(document.get("out_of_bounds"), dict) else {}
    average = document.get("average_bus_bandwidth") if isinstance(document.get("average_bus_bandwidth"), dict) else {}
    config = document.get("config") if isinstance(document.get("config"), dict) else {}
    devices = [d for d in config.get("devices", []) if isinstance(d, dict)]
    return {
        "version": document["version"],
        "nccl_version_code": document.get("nccl_version"),
        "rows": rows,
        "out_of_bounds": int(bounds["count"]) if "count" in bounds else None,
        "avg_busbw": _json_double(average.get("bandwidth")),
        "devices": devices,
        "errors": [str(e) for e in document.get("errors", []) if str(e).strip()],
    }


def merge_json(summary: dict[str, Any], report: dict[str, Any]) -> dict[str, Any]:
    """The text summary with the table, the footer and the NCCL library version taken from the JSON (exact
    figures); the transport, versions and failures stay the text's (NCCL logs them, not nccl-tests)."""
    merged = {**summary, "rows": report["rows"], "table_source": "json"}
    if report["out_of_bounds"] is not None:
        merged["out_of_bounds"] = report["out_of_bounds"]
    if report["avg_busbw"] is not None:
        merged["avg_busbw"] = round(report["avg_busbw"], 4)
        merged["complete"] = True
    if report["nccl_version_code"]:
        merged["nccl_library_version"] = decode_nccl_version(int(report["nccl_version_code"]))
    merged["failures"] = _unique([*summary["failures"], *(f"# error: {e}" for e in report["errors"])])[:20]
    if summary["rows"] and len(summary["rows"]) != len(report["rows"]):
        merged["warnings"] = [
            *summary["warnings"],
            f"the printed table has {len(summary['rows'])} sizes, the JSON file {len(report['rows'])}",
        ][:20]
    merged.update(_busbw_stats(report["rows"]))
    return merged


def _busbw_stats(rows: list[dict[str, Any]]) -> dict[str, Any]:
    best: tuple[float, int, str] | None = None
    values = []
    wrong_rows, wrong_total = [], 0
    for row in rows:
        for side in ("out_of_place", "in_place"):
            result = row[side]
            if result is None:
                continue
            values.append(result["busbw"])
            if best is None or result["busbw"] > best[0]:
                best = (result["busbw"], row["size"], side)
            if result["wrong"]:
                wrong_total += result["wrong"]
                wrong_rows.append(row["size"])
    return {
        "max_busbw": best[0] if best else None,
        "max_busbw_size": best[1] if best else None,
        "max_busbw_side": best[2] if best else None,
        "computed_avg_busbw": round(sum(values) / len(values), 4) if values else None,
        "wrong": wrong_total,
        "wrong_sizes": list(dict.fromkeys(wrong_rows)),
    }


def _transport(state: _State) -> tuple[str | None, dict[str, str]]:
    """The transport per host: the NET transport its channels were set up over, else the network NCCL said it
    uses; one value for the run, "mixed" when hosts disagree."""
    hosts = _unique([*state.networks, *state.channel_nets])
    by_host = {}
    for host in hosts:
        channel_nets = state.channel_nets.get(host)
        network = max(channel_nets, key=channel_nets.get) if channel_nets else state.networks[host]
        links = {device["link"] for device in state.ib_devices.get(host, [])}
        by_host[host] = _classify(network, links)
    kinds = set(by_host.values())
    overall = None if not kinds else (kinds.pop() if len(kinds) == 1 else "mixed")
    return overall, by_host


def _summary(state: _State) -> dict[str, Any]:
    ranks = [state.ranks[rank] for rank in sorted(state.ranks)]
    hosts = _unique(rank["host"] for rank in ranks)
    transport, transports_by_host = _transport(state)
    versions = {host: sorted(found) for host, found in state.versions.items()}
    summary: dict[str, Any] = {
        "program": state.program,
        "nccl_tests_version": state.tests_version,
        "complete": state.avg_busbw is not None,
        "concluded": state.concluded,
        "config": state.config,
        "rank_count": len(ranks) or None,
        "hosts": hosts,
        "ranks_per_host": {host: sum(1 for rank in ranks if rank["host"] == host) for host in hosts},
        "gpu_models": _unique(rank["gpu"] for rank in ranks),
        "ranks": ranks,
        "nccl_comm_ranks": state.comm_ranks,
        "nccl_comm_nodes": state.comm_nodes,
        "rows": state.rows,
        "out_of_bounds": state.out_of_bounds,
        "avg_busbw": state.avg_busbw,
        "nccl_versions": versions,
        "nccl_version_banners": {host: sorted(found) for host, found in state.banners.items()},
        "nccl_library_version": decode_nccl_version(state.library_code) if state.library_code else None,
        "nccl_headers_version": decode_nccl_version(state.headers_code) if state.headers_code else None,
        "transport": transport,
        "transports_by_host": transports_by_host,
        "networks_by_host": dict(state.networks),
        "ib_devices": state.ib_devices,
        "ib_missing_hosts": sorted(state.ib_missing),
        "ib_hints": _unique(state.ib_hints)[:10],
        "socket_interfaces": state.sockets,
        "oob_interfaces": state.oob,
        "bootstrap_interfaces": state.bootstrap,
        "net_channels": state.net_channels,
        "gdrdma_channels": state.gdr_channels,
        "gdrdma": (state.gdr_channels > 0) if state.net_channels else None,
        "local_channels": state.local_channels,
        "nccl_log_lines": state.nccl_lines,
        "warnings": _unique(state.warnings)[:20],
        "failures": _unique(state.failures)[:20],
        "exit_codes": state.exit_codes,
        "table_source": "text",
    }
    summary.update(_busbw_stats(state.rows))
    return summary


# ------------------------------------------------------------------------------------------ verdict


def _hosts_text(hosts: Sequence[str]) -> str:
    return ", ".join(hosts) if len(hosts) <= 4 else f"{', '.join(hosts[:4])} and {len(hosts) - 4} more"


def _socket_detail(summary: dict[str, Any]) -> str:
    interfaces = _unique(
        entry.split(":", 1)[0]
        for host, entries in summary["socket_interfaces"].items()
        if summary["transports_by_host"].get(host, "Socket") == "Socket"
        for entry in entries
    )
    return ", ".join(interfaces) or "interface not logged"


def _transport_problem(summary: dict[str, Any], required: str) -> str | None:
    transport = summary["transport"]
    accepted = {"IB": {"IB"}, "RoCE": {"RoCE"}, "RDMA": {"IB", "RoCE", "IB+RoCE"}}[required]
    if transport in accepted:
        return None
    if transport is None:
        return (
            f"NCCL's transport is unknown, {required} is required: the output has no 'Using network' or "
            "'via NET/...' lines (did NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS=INIT,NET reach the ranks?)"
        )
    by_host = summary["transports_by_host"]
    off = [host for host, kind in by_host.items() if kind not in accepted]
    if transport == "Socket" or any(by_host[host] == "Socket" for host in off):
        interfaces = _socket_detail(summary)
        reasons = []
        if summary["ib_missing_hosts"]:
            reasons.append(f"'NET/IB : No device found' on {_hosts_text(summary['ib_missing_hosts'])}")
        reasons += summary["ib_hints"][:2]
        why = "; ".join(reasons) or "NCCL did not load its IB transport"
        return (
            f"NCCL used Socket ({interfaces}), not {required}: it fell back to TCP sockets on {_hosts_text(off)} "
            f"({why}). Check that the HCAs are visible on every node (ibv_devinfo; rdma-core/libibverbs "
            "installed), that NCCL_IB_HCA names them and that NCCL_IB_DISABLE/NCCL_NET do not switch IB off"
        )
    return f"NCCL used {transport}, not {required} (per host: {', '.join(f'{h} {k}' for h, k in by_host.items())})"


def _version_problems(summary: dict[str, Any], expected: str, source: str) -> list[str]:
    want = upstream_version(expected)
    problems = []
    by_version: dict[str, list[str]] = {}
    for host, versions in summary["nccl_versions"].items():
        for version in versions:
            by_version.setdefault(version, []).append(host)
    for version, hosts in sorted(by_version.items()):
        if version != want:
            where = "ranks" if hosts == ["?"] else f"ranks on {_hosts_text(hosts)}"
            problems.append(f"{where} report NCCL {version}, the pinned {source} is {want}")
    library = summary["nccl_library_version"]
    if library and library != want and library not in by_version:
        problems.append(f"nccl-tests reports NCCL library {library}, the pinned {source} is {want}")
    if not by_version and not library:
        problems.append(f"no rank logged its NCCL version (expected {want}): is NCCL_DEBUG=INFO set?")
    return problems


def first_error(summary: dict[str, Any]) -> str:
    """The line that says most about why a run stopped: the test's own NCCL/CUDA failure, else NCCL's first
    warning, else the launcher's first error line."""
    failures = summary["failures"]
    for line in failures:
        if re.search(r"Test (?:NCCL|CUDA) failure|Invalid number of GPUs|^# error:|Traceback|Error\b", line):
            return line
    if summary["warnings"]:
        return summary["warnings"][0]
    return failures[0] if failures else "no error line was printed"


def judge(
    summary: dict[str, Any],
    min_busbw: float = 0.0,
    require_transport: str = "",
    expected_nccl_version: str = "",
    *,
    rc: int | None = None,
    expected_ranks: int = 0,
    require_gdrdma: bool = False,
    nccl_source: str = "libnccl2",
    timeout_s: int = 0,
) -> list[str]:
    """Every reason the run does not pass, each a sentence with the value seen and the one wanted."""
    problems = []
    if rc == TIMEOUT_RC:
        problems.append(f"the run was stopped after nccl_tests_timeout {timeout_s} s (timeout exit status 124)")
    elif rc:
        problems.append(f"the launcher exited with status {rc}")
    if not summary["complete"]:
        problems.append(
            f"the run did not finish: no 'Avg bus bandwidth' line after {len(summary['rows'])} sizes "
            f"(first error: {first_error(summary)})"
        )
    if summary["wrong"] or summary["out_of_bounds"]:
        sizes = ", ".join(_size_text(size) for size in summary["wrong_sizes"]) or "see the table"
        problems.append(
            f"the all-reduce returned wrong data: {summary['wrong']} wrong elements at sizes {sizes} "
            f"(Out of bounds values: {summary['out_of_bounds']})"
        )
    if expected_ranks and summary["rank_count"] is not None and summary["rank_count"] != expected_ranks:
        problems.append(
            f"{summary['rank_count']} ranks ran, {expected_ranks} expected (every GPU of every node in kimi_nodes)"
        )
    avg = summary["avg_busbw"]
    if min_busbw and avg is not None and avg < min_busbw:
        problems.append(f"avg bus bandwidth {avg:g} GB/s is below nccl_tests_min_busbw_gbs {min_busbw:g}")
    if require_transport:
        problem = _transport_problem(summary, require_transport)
        if problem:
            problems.append(problem)
    if require_gdrdma and summary["transport"] != "Socket" and not summary["gdrdma"]:
        problems.append(
            f"GPUDirect RDMA is not used: {summary['gdrdma_channels']} of {summary['net_channels']} NET channels "
            "say /GDRDMA (nvidia-peermem or DMA-BUF support, and the PCIe topology decide it)"
        )
    if expected_nccl_version:
        problems += _version_problems(summary, expected_nccl_version, nccl_source)
    return problems


def _size_text(size: int | None) -> str:
    if size is None:
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def report_lines(summary: dict[str, Any], problems: Sequence[str], min_busbw: float = 0.0) -> list[str]:
    """A few lines a person reads: who ran, which NCCL and transport, the bandwidth, the verdict."""
    hosts = summary["hosts"]
    program = summary["program"] or "all_reduce_perf"
    version = f" (nccl-tests {summary['nccl_tests_version']})" if summary["nccl_tests_version"] else ""
    lines = [
        f"{program}{version}: {summary['rank_count'] or '?'} ranks on {len(hosts)} hosts ({_hosts_text(hosts)})"
        + (f", {', '.join(summary['gpu_models'])}" if summary["gpu_models"] else "")
    ]
    versions = sorted({version for found in summary["nccl_versions"].values() for version in found})
    transport = summary["transport"] or "unknown"
    if summary["net_channels"]:
        transport += f", GPUDirect RDMA on {summary['gdrdma_channels']} of {summary['net_channels']} NET channels"
    if transport.startswith("Socket"):
        transport += f" over {_socket_detail(summary)}"
    lines.append(f"NCCL {', '.join(versions) or 'version not logged'}; transport {transport}")
    if summary["max_busbw"] is not None:
        avg = f"{summary['avg_busbw']:g} GB/s" if summary["avg_busbw"] is not None else "- (the run did not finish)"
        source = " (from nccl-tests' JSON file)" if summary.get("table_source") == "json" else ""
        lines.append(
            f"bus bandwidth: avg {avg} over {len(summary['rows'])} sizes; max {summary['max_busbw']:g} GB/s at "
            f"{_size_text(summary['max_busbw_size'])} ({summary['max_busbw_side'].replace('_', '-')}){source}"
        )
    lines.append(f"#wrong {summary['wrong']}, out of bounds {summary['out_of_bounds']}")
    gate = f"min avg busbw {min_busbw:g} GB/s" if min_busbw else "no busbw floor (report only)"
    if problems:
        lines.append(f"FAILED ({gate}):")
        lines += [f"- {problem}" for problem in problems]
    else:
        lines.append(f"passed ({gate})")
    return lines


def verdict(
    text: str,
    rc: int | None = None,
    *,
    min_busbw_gbs: float = 0.0,
    require_transport: str = "",
    require_gdrdma: bool = False,
    expected_nccl_version: str = "",
    nccl_source: str = "libnccl2",
    expected_ranks: int = 0,
    timeout_s: int = 0,
    json_text: str = "",
) -> dict[str, Any]:
    """What kimi_nccl_tests_result returns: the parsed run, every problem against the gates, the report lines
    and whether it passed. With `json_text` (the -J file) the table's figures come from it; a file that cannot
    be read leaves the printed table in use and says why among the warnings."""
    summary = parse_output(text)
    if json_text.strip():
        try:
            summary = merge_json(summary, parse_json_output(json_text))
        except (ValueError, KeyError, TypeError) as error:
            summary["warnings"] = [*summary["warnings"], f"nccl-tests' JSON file was not used: {error}"][:20]
    problems = judge(
        summary,
        min_busbw_gbs,
        require_transport,
        expected_nccl_version,
        rc=rc,
        expected_ranks=expected_ranks,
        require_gdrdma=require_gdrdma,
        nccl_source=nccl_source,
        timeout_s=timeout_s,
    )
    report = report_lines(summary, problems, min_busbw_gbs)
    return {"summary": summary, "problems": problems, "report": report, "passed": not problems}
