"""Coding agents' sessions through the router with leastconn and with session affinity: prefix-cache hit rate,
TTFT and requests per replica.

The replay needs the lab's two single-node replicas behind the router, so the lab test
tests/lab/test_front_door.py measures it (tests/agent_replay.py) and records artifacts/bench/session-affinity.json;
this prints the latest record and its date. Without a record it says how to make one (the figure is never invented
here).

Run: .venv/bin/python bench/bench_affinity.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RECORD = Path(__file__).resolve().parent.parent / "artifacts" / "bench" / "session-affinity.json"
MODES = ("leastconn", "affinity")


def mode_line(mode: str, figures: dict) -> str:
    replicas = ", ".join(
        f"{name} {r['session_requests']} requests"
        + (f" (hit rate {r['hit_rate']:.0%})" if r["hit_rate"] is not None else "")
        for name, r in sorted(figures["replicas"].items())
    )
    rate = figures["hit_rate_after_first_turn"]
    return (
        f"  {mode}: hit rate after the first turn {rate:.0%} ({figures['later_turns_without_a_hit']} of "
        f"{figures['later_turns']} later turns without a hit), TTFT mean {figures['ttft_mean_s'] * 1000:.0f} ms, "
        f"p99 {figures['ttft_p99_s'] * 1000:.0f} ms (turns after the first: mean "
        f"{figures['ttft_mean_after_first_turn_s'] * 1000:.0f} ms, p99 "
        f"{figures['ttft_p99_after_first_turn_s'] * 1000:.0f} ms); {replicas}"
    )


def main() -> int:
    if not RECORD.is_file():
        print(
            "session affinity: no record yet (it is measured on the lab: "
            "`make test-group GROUP=lab-front-door`, or `make test-all`)"
        )
        return 0
    record = json.loads(RECORD.read_text())
    print(f"session affinity ({record['measured_at']}, {record['what']}):")
    for mode in MODES:
        print(mode_line(mode, record[mode]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
