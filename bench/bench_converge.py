"""A converge that changes nothing: how long `site.yml` takes on a lab that is already converged and serving, and
where that time goes (per role, the slowest tasks), for 2 and 4 nodes.

Measuring needs root and the lab (it boots a lab of N nodes, converges it, then times a second `site.yml` with the
kimi_task_times callback, and takes the lab down): `make bench-converge NODES=N`, which records
artifacts/bench/noop-converge-<N>.json. `make bench` prints the latest records and their dates; without one it says
how to make it (a figure is never invented here).

Run: .venv/bin/python bench/bench_converge.py [--measure N]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RECORDS = REPO / "artifacts" / "bench"
VENV_BIN = REPO / ".venv" / "bin"
NODE_COUNTS = (2, 4)


def record_path(nodes: int) -> Path:
    return RECORDS / f"noop-converge-{nodes}.json"


def lab(*args: str) -> None:
    subprocess.run([sys.executable, str(REPO / "lab" / "lab"), *args], cwd=REPO, check=True)


def site(times_file: Path | None = None) -> tuple[int, float, str]:
    """One site.yml against the lab: exit code, wall seconds, the recap's last lines."""
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_HOME": str(REPO / ".ansible")}
    if times_file:
        env |= {"ANSIBLE_CALLBACKS_ENABLED": "kimi_task_times", "KIMI_TASK_TIMES_FILE": str(times_file)}
    started = time.monotonic()
    done = subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "site.yml", "-i", "inventories/lab"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    recap = done.stdout[done.stdout.rfind("PLAY RECAP") :]
    return done.returncode, time.monotonic() - started, recap


def changed_total(recap: str) -> int:
    return sum(int(field.split("=")[1]) for field in recap.split() if field.startswith("changed="))


def measure(nodes: int) -> dict:
    lab("down")
    lab("up", str(nodes))
    try:
        rc, first_s, recap = site()
        if rc != 0:
            raise SystemExit(f"the first converge of {nodes} nodes failed (rc {rc}):\n{recap}")
        with tempfile.TemporaryDirectory() as scratch:
            times_file = Path(scratch) / "times.jsonl"
            rc, noop_s, recap = site(times_file)
            run = json.loads(times_file.read_text().splitlines()[-1])
    finally:
        lab("down")
    if rc != 0:
        raise SystemExit(f"the second converge of {nodes} nodes failed (rc {rc}):\n{recap}")
    return {
        "measured_at": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nodes": nodes,
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip(),
        "first_converge_s": round(first_s, 1),
        "noop_converge_s": round(noop_s, 1),
        "noop_changed": changed_total(recap),
        "tasks": run["tasks"],
        "roles_s": run["roles_s"],
        "slowest": run["slowest"][:10],
    }


def show(record: dict) -> None:
    print(
        f"no-op converge, {record['nodes']} nodes ({record['measured_at']}, {record['commit']}): "
        f"{record['noop_converge_s']} s, changed={record['noop_changed']}, {record['tasks']} tasks "
        f"(the first converge {record['first_converge_s']} s)"
    )
    print("  by role: " + ", ".join(f"{role} {seconds} s" for role, seconds in record["roles_s"].items()))
    for task in record["slowest"][:5]:
        print(f"  {task['seconds']:6.1f} s  {task['role']}: {task['task']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure", type=int, metavar="N", help="boot N lab nodes, converge, time a no-op converge")
    args = parser.parse_args(argv)
    if args.measure:
        if not 1 <= args.measure <= 4:
            parser.error(f"--measure {args.measure}: the lab serves the model on 1 to 4 nodes")
        RECORDS.mkdir(parents=True, exist_ok=True)
        record = measure(args.measure)
        record_path(args.measure).write_text(json.dumps(record, indent=2) + "\n")
        show(record)
        return 0
    for nodes in NODE_COUNTS:
        path = record_path(nodes)
        if path.is_file():
            show(json.loads(path.read_text()))
        else:
            print(f"no-op converge, {nodes} nodes: no record yet (on the lab: make bench-converge NODES={nodes})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
