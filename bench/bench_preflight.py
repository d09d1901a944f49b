"""Preflight wall time on 2 and 8 lab nodes (issue 3's figure). Prints; asserts nothing.

Needs root and a lab that is down (it brings its own up and tears it down). Run with `make bench`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from tests.ansible_run import run_playbook  # noqa: E402

LAB = [sys.executable, str(REPO_ROOT / "lab" / "lab")]
NODE_COUNTS = (2, 8)
ROUNDS = 3


def lab(*args: str) -> None:
    subprocess.run([*LAB, *args], check=True, capture_output=True, text=True)


def preflight_seconds(node_count: int) -> list[float]:
    # The miniature model has 2 layers and 4 heads: 8 one-rank nodes take TP 4 x PP 2 (the planner accepts it),
    # so the bench measures the same checks on 8 nodes that the lab's TP 1 x PP 2 runs on 2.
    extravars = {} if node_count == 2 else {"kimi_tensor_parallel_size": 4, "kimi_pipeline_parallel_size": 2}
    times = []
    for _ in range(ROUNDS):
        started = time.monotonic()
        result = run_playbook(
            REPO_ROOT / "site.yml", REPO_ROOT / "inventories" / "lab", tags="preflight", extravars=extravars
        )
        times.append(time.monotonic() - started)
        if result.rc != 0:
            raise SystemExit(f"preflight failed on {node_count} nodes: {result.failure_messages()}")
    return times


def main() -> int:
    if os.geteuid() != 0:
        print("bench_preflight: skipped (needs root for the lab)")
        return 0
    status = subprocess.run([*LAB, "status"], capture_output=True, text=True, check=False)
    if status.returncode == 0 and not status.stdout.startswith("lab: down"):
        # The bench boots and removes labs of its own sizes: it must not take down a lab someone is using.
        print("bench_preflight: skipped (a lab is up; `make lab-down` first)")
        return 0
    for count in NODE_COUNTS:
        lab("up", str(count))
        try:
            times = preflight_seconds(count)
        finally:
            lab("down")
        print(
            f"preflight on {count} lab nodes: median {sorted(times)[len(times) // 2]:.1f} s "
            f"(runs: {', '.join(f'{t:.1f}' for t in times)})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
