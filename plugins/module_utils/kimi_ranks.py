"""Which ranks joined the vLLM group, read from every rank's journal; pure parsing and judging.

vLLM's workers log one line each when they join the distributed group ("world_size=2 rank=1 local_rank=0
distributed_init_method=tcp://A:P backend=gloo") and, on GPUs, the NCCL their PyNccl communicator loaded
("vLLM is using nccl==2.28.9"; NCCL itself prints "NCCL version 2.28.9+cuda13.0" with NCCL_DEBUG=INFO).
A group is whole when every rank id of the world size is there, as often as there are data-parallel replicas,
every rank agrees on the world size and the rendezvous address, and every rank loaded the same NCCL, the
pinned one.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

JOIN_LINE = re.compile(
    r"world_size=(?P<world_size>\d+) rank=(?P<rank>\d+) local_rank=(?P<local_rank>\d+) "
    r"distributed_init_method=(?P<init_method>\S+) backend=(?P<backend>\w+)"
)
ASSIGNED_LINE = re.compile(r"rank (?P<rank>\d+) in world size (?P<world_size>\d+) is assigned as (?P<roles>.+)")
VLLM_NCCL_LINE = re.compile(r"vLLM is using nccl==(?P<version>\d+\.\d+\.\d+)")
NCCL_BANNER_LINE = re.compile(r"NCCL version (?P<version>\d+\.\d+\.\d+)")
PID_PREFIX = re.compile(r"\((?:\w+) pid=(?P<pid>\d+)\)")


def _pid(line: str) -> str | None:
    match = PID_PREFIX.search(line)
    return match.group("pid") if match else None


def parse_rank_journal(text: str) -> list[dict[str, Any]]:
    """One record per joining worker in one node's journal, with its roles and the NCCL version it logged.

    The NCCL line carries the worker's pid prefix, which ties it to the join line of the same process; a line
    without a prefix (NCCL's own banner) goes to the only worker when there is one.
    """
    workers: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    loose_versions: list[str] = []
    for line in text.splitlines():
        pid = _pid(line) or f"line{len(order)}"
        if join := JOIN_LINE.search(line):
            record = {key: join.group(key) for key in ("init_method", "backend")}
            record |= {key: int(join.group(key)) for key in ("world_size", "rank", "local_rank")}
            workers[pid] = {**record, "roles": "", "nccl_versions": []}
            order.append(pid)
        elif (assigned := ASSIGNED_LINE.search(line)) and pid in workers:
            workers[pid]["roles"] = assigned.group("roles").strip()
        elif version := VLLM_NCCL_LINE.search(line) or NCCL_BANNER_LINE.search(line):
            if pid in workers:
                workers[pid]["nccl_versions"].append(version.group("version"))
            else:
                loose_versions.append(version.group("version"))
    if len(order) == 1 and loose_versions:
        workers[order[0]]["nccl_versions"].extend(loose_versions)
    return [{**workers[pid], "nccl_version": _one_version(workers[pid]["nccl_versions"])} for pid in order]


def _one_version(versions: list[str]) -> str | None:
    distinct = sorted(set(versions))
    return ", ".join(distinct) if distinct else None


def _host_problems(ranks_by_host: dict[str, list[dict[str, Any]]]) -> list[str]:
    return [
        f"{host}: its journal shows no rank joining (no 'world_size=N rank=R' line in the unit's current run)"
        for host, ranks in ranks_by_host.items()
        if not ranks
    ]


def _world_problems(ranks: list[dict[str, Any]], expected_world_size: int, expected_processes: int) -> list[str]:
    problems = []
    sizes = sorted({r["world_size"] for r in ranks})
    if len(sizes) > 1:
        problems.append(f"ranks disagree on the world size: {', '.join(map(str, sizes))}")
    if expected_world_size and sizes and sizes != [expected_world_size]:
        problems.append(f"ranks report world size {sizes[0]}, the layout needs {expected_world_size}")
    world = expected_world_size or (sizes[0] if sizes else 0)
    replicas = max(1, expected_processes // world) if world and expected_processes else 1
    joined = Counter(r["rank"] for r in ranks)
    missing = [rank for rank in range(world) if joined[rank] < replicas]
    if missing:
        problems.append(f"rank(s) {', '.join(map(str, missing))} of world size {world} never joined")
    extra = [f"rank {rank} joined {count} times" for rank, count in sorted(joined.items()) if count > replicas]
    problems += [f"{text} (expected {replicas})" for text in extra]
    methods = sorted({r["init_method"] for r in ranks})
    if len(methods) > 1:
        problems.append(f"ranks rendezvous at different addresses: {', '.join(methods)}")
    return problems


def _nccl_problems(ranks: list[dict[str, Any]], expected_nccl_version: str) -> tuple[list[str], str]:
    nccl_ranks = [r for r in ranks if r["backend"] == "nccl"]
    if not nccl_ranks:
        backends = ", ".join(sorted({r["backend"] for r in ranks})) or "none"
        return [], f"not applicable: the ranks use {backends} (no NCCL; vLLM's CPU build uses gloo)"
    silent = [f"{r['host']} rank {r['rank']}" for r in nccl_ranks if not r["nccl_version"]]
    problems = [f"no NCCL version logged by {', '.join(silent)}"] if silent else []
    versions = sorted({r["nccl_version"] for r in nccl_ranks if r["nccl_version"]})
    if len(versions) > 1:
        by_version = {
            v: ", ".join(f"{r['host']} rank {r['rank']}" for r in nccl_ranks if r["nccl_version"] == v)
            for v in versions
        }
        listed = "; ".join(f"{version} on {where}" for version, where in by_version.items())
        problems.append(f"ranks load different NCCL versions: {listed}")
    if expected_nccl_version and versions and versions != [expected_nccl_version]:
        problems.append(f"ranks use NCCL {', '.join(versions)}, the pinned wheel is {expected_nccl_version}")
    return problems, ", ".join(versions) or "unknown"


def judge_rank_join(
    journals: dict[str, str], expected_world_size: int, expected_processes: int, expected_nccl_version: str
) -> dict[str, Any]:
    """Every rank of every host, the problems found, and a one-line summary."""
    ranks_by_host = {host: parse_rank_journal(text) for host, text in journals.items()}
    ranks = [{"host": host, **rank} for host, host_ranks in ranks_by_host.items() for rank in host_ranks]
    nccl_problems, nccl = _nccl_problems(ranks, expected_nccl_version)
    problems = _host_problems(ranks_by_host) + _world_problems(ranks, expected_world_size, expected_processes)
    problems += nccl_problems
    world = sorted({r["world_size"] for r in ranks})
    summary = (
        f"{len(ranks)} rank(s) joined on {sum(1 for r in ranks_by_host.values() if r)} node(s), world size "
        f"{'/'.join(map(str, world)) or '?'}, NCCL {nccl}"
    )
    return {"ranks": ranks, "problems": problems, "ok": not problems, "summary": summary, "nccl": nccl}
