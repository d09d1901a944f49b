"""How long parity takes over a big cluster: 256 hosts, each with a full vLLM venv's worth of wheels.

Every host is a copy of the recorded lab node facts, with 200 wheels in its venv (a resolved vLLM 0.23.0 set
has ~190), and three hosts carry a difference each, so the failure path (fixes, table) is measured too.
Prints one line per stage and the total; the issue asks for well under a second.

Run: .venv/bin/python bench/bench_parity.py [hosts]
"""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Same arrangement as tests/conftest.py: the collection's code is this checkout's, through collections/.
sys.path.insert(0, str(REPO / "collections"))

from ansible_collections.kimi.k2.plugins.module_utils.kimi_parity import Pins, compare, render_table, report_json  # noqa: E402

FACTS = REPO / "tests" / "fixtures" / "stack" / "facts" / "node1.json"
WHEELS_PER_HOST = 200
PINS = {
    "debs": {"libnccl2": "2.30.7-1+cuda13.3", "libnccl-dev": "2.30.7-1+cuda13.3"},
    "wheels": {"vllm": "0.23.0", "torch": "2.11.0", "nvidia-nccl-cu13": "2.28.9"},
    "nccl_env": {"NCCL_SOCKET_IFNAME": "host0"},
}


def make_cluster(hosts: int, wheels: int = WHEELS_PER_HOST) -> dict[str, dict]:
    """``hosts`` copies of a lab node's facts; hosts 2, 3 and 4 (if present) each differ in one item."""
    base = json.loads(FACTS.read_text())
    base["venv"]["packages"].update({f"dependency-{i:03d}": f"1.{i}.0" for i in range(wheels)})
    cluster = {}
    for index in range(hosts):
        name = f"node{index + 1:03d}"
        facts = copy.deepcopy(base)
        facts["hostname"] = name
        facts["nccl_env"]["values"]["VLLM_HOST_IP"] = f"10.0.{index // 250}.{index % 250 + 1}"
        cluster[name] = facts
    names = list(cluster)
    if hosts > 1:
        cluster[names[1]]["debs"]["libnccl2"]["version"] = "2.30.5-1+cuda13.3"
    if hosts > 2:
        cluster[names[2]]["venv"]["packages"]["nvidia-nccl-cu13"] = "2.30.4"
        cluster[names[2]]["nccl"]["version"] = "2.30.4"
    if hosts > 3:
        del cluster[names[3]]["interfaces"]["host0"]
    return cluster


def timed(label: str, action, results: dict):  # noqa: ANN001, ANN201
    start = time.perf_counter()
    value = action()
    results[label] = time.perf_counter() - start
    return value


def main() -> None:
    hosts = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    cluster = make_cluster(hosts)
    pins = Pins.from_dict(PINS)
    results: dict[str, float] = {}
    report = timed("compare", lambda: compare(cluster, pins), results)
    timed("table", lambda: render_table(report), results)
    text = timed("json", lambda: report_json(report), results)
    total = sum(results.values())
    items = report["summary"]["items"]
    print(
        f"parity: {hosts} hosts x {items} items ({hosts * items} cells), {report['summary']['failures']} "
        f"differences found; compare {results['compare'] * 1000:.0f} ms, table {results['table'] * 1000:.0f} ms, "
        f"json {results['json'] * 1000:.0f} ms ({len(text) // 1024} KiB); total {total * 1000:.0f} ms"
    )


if __name__ == "__main__":
    main()
