"""A rolling upgrade under load: failed requests and latency while playbooks/rolling.yml restarts each replica.

The rollout needs the lab (two single-node replicas behind the router), so the lab test
tests/lab/test_front_door.py measures it and records artifacts/bench/rolling-upgrade.json; this prints the
latest record and its date. Without a record it says how to make one (the figure is never invented here).

Run: .venv/bin/python bench/bench_rolling.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RECORD = Path(__file__).resolve().parent.parent / "artifacts" / "bench" / "rolling-upgrade.json"


def main() -> int:
    if not RECORD.is_file():
        print(
            "rolling upgrade: no record yet (it is measured on the lab: "
            "`.venv/bin/pytest -s -m lab tests/lab/test_front_door.py`, or `make lab-test`)"
        )
        return 0
    record = json.loads(RECORD.read_text())
    print(
        f"rolling upgrade ({record['measured_at']}, {record['what']}): "
        f"{record['failed']} failed of {record['requests']} requests at concurrency {record['concurrency']}, "
        f"latency p50 {record['latency_p50_s']} s, p99 {record['latency_p99_s']} s, max {record['latency_max_s']} s, "
        f"rollout {record['rollout_s']} s"
        + "".join(f"; {step} {seconds} s" for step, seconds in record.get("steps_s", {}).items())
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
