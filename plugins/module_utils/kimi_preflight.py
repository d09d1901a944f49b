"""Preflight verdicts: every node's facts checked against what the plan needs, as one table.

Each check yields a cell per host: ``ok``, ``warn``, ``fail`` or ``n/a`` with a short text. A failing cell's
text names the check and both numbers (needed vs found), so the play's message reads on its own. On CPU lab
nodes the GPU checks are replaced by their CPU equivalents (cores, RAM for the KV cache), not skipped. With an
offline mirror (air-gapped site), apt_sources refuses every apt source a node has besides the mirror, so that no
apt-get update later waits on a source it cannot reach.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from .kimi_node import matches_any
from .kimi_presets import PlanInputError, find_gpu, find_model

GIB = 1024**3
MIB = 1024**2
CHECKS = (
    "devices",
    "driver",
    "memory",
    "shm",
    "data_disk",
    "interfaces",
    "host_ip",
    "ports",
    "device_processes",
    "apt_sources",
)


@dataclass
class Cell:
    status: str  # ok | warn | fail | n/a
    text: str


@dataclass
class Requirements:
    """What the cluster needs from every node (the same for all nodes)."""

    accelerator: str  # "nvidia" or "cpu"
    gpus_per_node: int
    gpu: str = ""  # GPU preset (nvidia): the names nvidia-smi may print and the memory it reports
    model: str = ""  # model preset: its published checkpoint size when data_required_bytes is 0
    driver_version_prefix: str = ""  # e.g. "580." (nvidia, optional)
    ram_gpu_factor: float = 2.0  # warn when RAM < factor x total GPU memory (nvidia)
    cpu_ram_per_rank_bytes: int = 0  # cpu: RAM each rank needs (KV cache + the process)
    shm_min_bytes: int = 0
    data_required_bytes: int = 0  # the whole checkpoint; 0 takes the model preset's published size
    data_margin_bytes: int = 0
    interfaces: list[str] = field(default_factory=list)
    own_units: list[str] = field(default_factory=list)
    offline_mirror_url: str = ""  # air-gapped site: the one URL every apt source must be under; "" checks nothing
    apt_sources_managed: list[str] = field(default_factory=list)  # source files the converge rewrites to the mirror


@dataclass
class HostExpectation:
    """What differs per host: its address for VLLM_HOST_IP and the ports it must be able to bind."""

    host_ip: str
    ports: dict[int, str] = field(default_factory=dict)  # port -> purpose


def _gib(value: float) -> str:
    return f"{value / GIB:.2f} GiB"


def _bytes(value: float) -> str:
    return f"{int(value):,} B ({_gib(value)})"


def check_devices(req: Requirements, node: dict, gpu: dict | None) -> Cell:
    if req.accelerator == "cpu":
        cores = node["cpu_count"]
        if cores < req.gpus_per_node:
            return Cell("fail", f"cpu: {req.gpus_per_node} rank(s) need {req.gpus_per_node} core(s), found {cores}")
        return Cell("ok", f"cpu: {cores} cores for {req.gpus_per_node} rank(s)")
    gpus = (gpu or {}).get("gpus", [])
    if len(gpus) != req.gpus_per_node:
        return Cell("fail", f"GPUs: need {req.gpus_per_node}, nvidia-smi lists {len(gpus)}")
    preset = find_gpu(req.gpu)
    wrong_name = [g["name"] for g in gpus if g["name"] not in preset.driver_names]
    if wrong_name:
        return Cell("fail", f"GPU model: kimi_gpu {preset.key} is '{preset.driver_names[0]}', found '{wrong_name[0]}'")
    smallest = min(g["memory_total_mib"] for g in gpus)
    # The preset is what the driver reports for that model; allow 1% for ECC/firmware differences.
    if preset.memory_mib and smallest < preset.memory_mib * 0.99:
        return Cell(
            "fail", f"GPU memory: kimi_gpu {preset.key} plans {preset.memory_mib} MiB, smallest GPU has {smallest} MiB"
        )
    return Cell("ok", f"{len(gpus)} x {gpus[0]['name']} ({smallest} MiB)")


def check_driver(req: Requirements, gpu: dict | None) -> Cell:
    if req.accelerator == "cpu":
        return Cell("n/a", "cpu: no GPU driver")
    versions = sorted({g.get("driver_version", "") for g in (gpu or {}).get("gpus", [])})
    if not versions:
        return Cell("fail", "driver: nvidia-smi reported no driver version")
    if len(versions) > 1:
        return Cell("fail", f"driver: GPUs report different versions {', '.join(versions)}")
    if req.driver_version_prefix and not versions[0].startswith(req.driver_version_prefix):
        return Cell("fail", f"driver: need {req.driver_version_prefix}*, found {versions[0]}")
    return Cell("ok", f"driver {versions[0]}")


def check_memory(req: Requirements, node: dict, gpu: dict | None) -> Cell:
    ram = node["memory_total_bytes"]
    if req.accelerator == "cpu":
        needed = req.cpu_ram_per_rank_bytes * req.gpus_per_node
        if ram < needed:
            return Cell("fail", f"RAM: {req.gpus_per_node} CPU rank(s) need {_gib(needed)}, node has {_gib(ram)}")
        return Cell("ok", f"RAM {_gib(ram)} (need {_gib(needed)})")
    gpu_total = sum(g["memory_total_mib"] for g in (gpu or {}).get("gpus", [])) * MIB
    wanted = req.ram_gpu_factor * gpu_total
    if ram < wanted:
        # A warning, not a stop: loading works with less RAM, only slower (no full host-side staging).
        return Cell("warn", f"RAM {_gib(ram)} is below {req.ram_gpu_factor:g}x GPU memory ({_gib(wanted)})")
    return Cell("ok", f"RAM {_gib(ram)}")


def check_shm(req: Requirements, node: dict) -> Cell:
    size = node["shm"]["total_bytes"]
    if size < req.shm_min_bytes:
        return Cell("fail", f"/dev/shm: need {_bytes(req.shm_min_bytes)}, have {_bytes(size)}")
    return Cell("ok", f"/dev/shm {_gib(size)}")


def checkpoint_bytes(req: Requirements) -> int | None:
    """The checkpoint's size: given, or the model preset's published one (None when neither is known)."""
    if req.data_required_bytes:
        return req.data_required_bytes
    try:
        return find_model(req.model).checkpoint_bytes if req.model else None
    except PlanInputError:
        return None


def check_data_disk(req: Requirements, node: dict) -> Cell:
    data = node["data"]
    required = checkpoint_bytes(req)
    if required is None:
        return Cell(
            "fail", f"checkpoint size of {req.model or 'the model'} is not published: set kimi_checkpoint_bytes"
        )
    present = min(node.get("checkpoint_dir_bytes", 0), required)
    needed = required - present + req.data_margin_bytes
    free = data["free_bytes"]
    where = data["measured_at"]
    if free < needed:
        return Cell(
            "fail",
            f"disk {where}: need {_bytes(needed)} (checkpoint still missing {_bytes(needed - req.data_margin_bytes)}"
            f" + margin {_bytes(req.data_margin_bytes)}), available {_bytes(free)}",
        )
    return Cell("ok", f"{where}: {_gib(free)} free, need {_gib(needed)}")


def check_interfaces(req: Requirements, node: dict) -> Cell:
    found = node["interfaces"]
    problems = []
    for name in req.interfaces:
        link = found.get(name)
        if link is None:
            problems.append(f"interface {name} does not exist (node has: {', '.join(sorted(found))})")
        elif not link["up"]:
            problems.append(f"interface {name} is {link['operstate']}, not up")
        elif not link["ipv4"]:
            problems.append(f"interface {name} has no IPv4 address")
    if problems:
        return Cell("fail", "; ".join(problems))
    return Cell("ok", ", ".join(f"{n} {found[n]['ipv4'][0]}" for n in req.interfaces))


def check_host_ip(expect: HostExpectation, node: dict) -> Cell:
    addresses = sorted({a for link in node["interfaces"].values() for a in link["ipv4"]})
    if not expect.host_ip:
        return Cell("fail", "VLLM_HOST_IP: kimi_host_ip is empty and the NCCL interface has no IPv4 to derive it from")
    if expect.host_ip not in addresses:
        return Cell("fail", f"VLLM_HOST_IP {expect.host_ip} is not an address of this node ({', '.join(addresses)})")
    return Cell("ok", expect.host_ip)


def check_ports(req: Requirements, expect: HostExpectation, node: dict) -> Cell:
    taken = []
    for port, purpose in sorted(expect.ports.items()):
        status = node["ports"].get(str(port), {"free": True, "holders": []})
        if status["free"]:
            continue
        holders = status["holders"]
        if holders and all(matches_any(h["unit"], req.own_units) for h in holders):
            continue  # held by our own service from an earlier run: not a conflict
        who = ", ".join(f"pid {h['pid']} ({h['cmdline'][:60] or '?'})" for h in holders) or "an unknown process"
        taken.append(f"port {port} ({purpose}) is taken by {who}")
    if taken:
        return Cell("fail", "; ".join(taken))
    return Cell("ok", ", ".join(str(p) for p in sorted(expect.ports)) or "none needed")


def check_device_processes(req: Requirements, node: dict, gpu: dict | None) -> Cell:
    if req.accelerator == "cpu":
        return Cell("n/a", "cpu: no GPU memory to hold")
    strangers = []
    for process in (gpu or {}).get("compute_processes", []):
        described = node["processes"].get(str(process["pid"]), {})
        if matches_any(described.get("unit"), req.own_units):
            continue
        strangers.append(f"pid {process['pid']} {process.get('process_name', '')} ({process['used_memory_mib']} MiB)")
    if strangers:
        return Cell("fail", "GPU memory held by other processes: " + "; ".join(strangers))
    return Cell("ok", "no foreign GPU processes")


def _normalised_url(url: str) -> str:
    """Scheme and host in lower case (they are case-insensitive), the path without trailing slashes."""
    try:
        parts = urlsplit(url)
    except ValueError:  # not a URL urllib reads (cdrom://[Debian GNU/Linux ...]): compared as written
        return url.rstrip("/")
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}{parts.path.rstrip('/')}"


def on_mirror(uri: str, mirror_url: str) -> bool:
    """Whether apt fetches ``uri`` from the offline mirror: the mirror's URL itself or a path below it (a path
    segment boundary, so http://m:8081 does not cover http://m:80810)."""
    uri, mirror = _normalised_url(uri), _normalised_url(mirror_url)
    return uri == mirror or uri.startswith(mirror + "/")


def _is_local(uri: str) -> bool:
    """file: sources read the node's own disk (the mirror host's source of the bundle it serves)."""
    return uri.lower().startswith("file:")


def foreign_apt_sources(req: Requirements, sources: list[dict]) -> list[dict]:
    """The sources an air-gapped node cannot reach: not on the mirror, not file:, not in a file the converge
    rewrites (nvidia_repo points its own at the mirror in the stack phase)."""
    return [
        source
        for source in sources
        if source["file"] not in req.apt_sources_managed
        and not _is_local(source["uri"])
        and not on_mirror(source["uri"], req.offline_mirror_url)
    ]


def _named_by_file(sources: list[dict]) -> tuple[str, int]:
    """'FILE names URI (line N), URI (lines N, M); FILE2 names ...' in apt's order, and how many (file, URI) pairs:
    a deb and a deb-src line of one URI are one thing to remove."""
    lines: dict[str, dict[str, list[str]]] = {}
    for source in sources:
        lines.setdefault(source["file"], {}).setdefault(source["uri"], []).append(str(source["line"]))
    text = "; ".join(
        f"{file} names "
        + ", ".join(f"{uri} (line{'s' if len(at) > 1 else ''} {', '.join(at)})" for uri, at in uris.items())
        for file, uris in lines.items()
    )
    return text, sum(len(uris) for uris in lines.values())


def check_apt_sources(req: Requirements, node: dict) -> Cell:
    if not req.offline_mirror_url:
        return Cell("n/a", "no offline mirror: the node's own apt sources apply")
    if "apt_sources" not in node:
        return Cell("fail", "apt sources were not read (kimi_node_info needs apt_sources: true with an offline mirror)")
    foreign = foreign_apt_sources(req, node["apt_sources"])
    if not foreign:
        return Cell("ok", "no apt source besides the offline mirror")
    named, count = _named_by_file(foreign)
    return Cell(
        "fail",
        f"{named}: remove or disable {'it' if count == 1 else 'them'}: an air-gapped node's only apt source is the"
        f" offline mirror {req.offline_mirror_url} (docs/air-gapped.md)",
    )


def evaluate_host(req: Requirements, expect: HostExpectation, node: dict, gpu: dict | None) -> dict[str, Cell]:
    return {
        "devices": check_devices(req, node, gpu),
        "driver": check_driver(req, gpu),
        "memory": check_memory(req, node, gpu),
        "shm": check_shm(req, node),
        "data_disk": check_data_disk(req, node),
        "interfaces": check_interfaces(req, node),
        "host_ip": check_host_ip(expect, node),
        "ports": check_ports(req, expect, node),
        "device_processes": check_device_processes(req, node, gpu),
        "apt_sources": check_apt_sources(req, node),
    }


def evaluate(
    req: Requirements,
    expectations: dict[str, HostExpectation],
    node_facts: dict[str, dict],
    gpu_facts: dict[str, dict | None],
) -> dict[str, Any]:
    """The whole table, the failures and warnings as sentences, and whether the play may go on."""
    table = {
        host: evaluate_host(req, expectations[host], node_facts[host], gpu_facts.get(host)) for host in expectations
    }
    failures = [
        f"{host}: {name}: {cell.text}"
        for host, row in table.items()
        for name, cell in row.items()
        if cell.status == "fail"
    ]
    warnings = [
        f"{host}: {name}: {cell.text}"
        for host, row in table.items()
        for name, cell in row.items()
        if cell.status == "warn"
    ]
    return {
        "passed": not failures,
        "failures": failures,
        "notices": warnings,
        "table": {
            host: {name: {"status": c.status, "text": c.text} for name, c in row.items()} for host, row in table.items()
        },
        "summary_lines": render_table(table),
    }


def render_table(table: dict[str, dict[str, Cell]]) -> list[str]:
    """A row per node, a column per check: the verdict only (details are in the failures and the JSON)."""
    header = ["node", *CHECKS]
    rows = [[host, *(row[name].status for name in CHECKS)] for host, row in table.items()]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(cell).ljust(widths[i]) for i, cell in enumerate(r)).rstrip() for r in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines
