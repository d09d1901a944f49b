"""The checkpoint phase downloading once per site: wall time on 1, 2 and 4 lab nodes spreading from node to node,
and on 4 nodes each downloading from the mirror; bytes from the mirror and from peers.

The measurement needs four lab nodes and a generated checkpoint of gigabytes, so the lab test
tests/lab/test_checkpoint_spread.py makes it and records artifacts/bench/checkpoint-spread.json; this prints the
latest record. Without a record it says how to make one (the figure is never invented here).

Run: .venv/bin/python bench/bench_spread.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RECORD = Path(__file__).resolve().parent.parent / "artifacts" / "bench" / "checkpoint-spread.json"
RUNS = (
    ("spread_1", "1 node"),
    ("spread_2", "2 nodes, spread"),
    ("spread_4", "4 nodes, spread"),
    ("mirror_4", "4 nodes, each from the mirror"),
)


def gib(count: int) -> str:
    return f"{count / 1024**3:.2f} GiB"


def run_line(label: str, figures: dict) -> str:
    peers = ", ".join(f"{node} served {gib(sent)}" for node, sent in sorted(figures["peer_bytes"].items()))
    return f"  {label}: {figures['seconds']:.0f} s, {gib(figures['mirror_bytes'])} from the mirror" + (
        f"; {peers}" if peers else ""
    )


def main() -> int:
    if not RECORD.is_file():
        print(
            "checkpoint spread: no record yet (it is measured on the lab: "
            "`make test-group GROUP=lab-checkpoint-spread`, or `make test-all`)"
        )
        return 0
    record = json.loads(RECORD.read_text())
    print(f"checkpoint spread ({record['measured_at']}, {record['what']}):")
    for key, label in RUNS:
        if key in record:
            print(run_line(label, record[key]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
