"""Where a test run's time went: each layer's wall time, the slowest tests, the slowest playbook tasks.

`make test` and `make test-all` write into one directory (KIMI_TEST_TIMES_DIR, artifacts/test-times/ by default):
`layers.tsv` (a layer and its seconds per line, in order), one pytest JUnit XML per pytest layer or group
(`<name>.xml`), `molecule.tsv` (a scenario and its seconds per line) and `playbooks.jsonl` (one line per playbook
run, from the kimi_task_times callback). This prints the summary at the end of the run; it reads what is there and
says what is missing, and never fails the run.

Run: .venv/bin/python tests/timings.py [DIR] [--slowest N]
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

DEFAULT_DIR = Path(__file__).resolve().parent.parent / "artifacts" / "test-times"


@dataclass(frozen=True)
class Timed:
    name: str
    seconds: float
    where: str = ""


def minutes(seconds: float) -> str:
    whole = round(seconds)
    return f"{whole // 60} min {whole % 60:02d} s"


def read_pairs(path: Path) -> list[Timed]:
    """`name seconds` lines (layers.tsv, molecule.tsv)."""
    if not path.is_file():
        return []
    pairs = []
    for line in path.read_text().splitlines():
        fields = line.split()
        if len(fields) >= 2:
            pairs.append(Timed(fields[0], float(fields[1])))
    return pairs


def junit_tests(directory: Path) -> list[Timed]:
    """Every test case of every JUnit file, with its time (setup, call and teardown: a shared fixture's cost
    lands on the first test that asked for it)."""
    found = []
    for path in sorted(directory.glob("*.xml")):
        try:
            root = ET.parse(path).getroot()
        except ET.ParseError:
            continue
        for case in root.iter("testcase"):
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            found.append(Timed(name, float(case.get("time") or 0.0), path.stem))
    return found


def playbook_runs(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    runs = []
    for line in path.read_text().splitlines():
        try:
            runs.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return runs


def slowest_tasks(runs: Iterable[dict], count: int) -> list[Timed]:
    """Tasks summed over every run that made them (a task every converge repeats adds up)."""
    totals: dict[tuple[str, str], float] = {}
    for run in runs:
        for task in run.get("slowest", []):
            key = (task["role"], task["task"])
            totals[key] = totals.get(key, 0.0) + float(task["seconds"])
    ranked = sorted(totals.items(), key=lambda item: item[1], reverse=True)[:count]
    return [Timed(f"{role}: {task}", seconds) for (role, task), seconds in ranked]


def report(directory: Path, count: int) -> list[str]:
    lines = [f"== where the time went ({directory})"]
    layers = read_pairs(directory / "layers.tsv")
    if layers:
        lines.append("wall time per layer:")
        lines += [f"  {layer.name:<24} {layer.seconds:7.0f} s  ({minutes(layer.seconds)})" for layer in layers]
        total = sum(layer.seconds for layer in layers)
        lines.append(f"  {'total':<24} {total:7.0f} s  ({minutes(total)})")
    tests = sorted(junit_tests(directory), key=lambda test: test.seconds, reverse=True)
    if tests:
        lines.append(f"the {min(count, len(tests))} slowest of {len(tests)} tests:")
        lines += [f"  {test.seconds:7.1f} s  [{test.where}] {test.name}" for test in tests[:count]]
    scenarios = read_pairs(directory / "molecule.tsv")
    if scenarios:
        lines.append("Molecule scenarios:")
        lines += [f"  {scenario.seconds:7.0f} s  {scenario.name}" for scenario in scenarios]
    runs = playbook_runs(directory / "playbooks.jsonl")
    if runs:
        played = sum(float(run.get("wall_s", 0.0)) for run in runs)
        lines.append(f"{len(runs)} playbook runs, {played:.0f} s in all; the slowest tasks over all of them:")
        lines += [f"  {task.seconds:7.1f} s  {task.name}" for task in slowest_tasks(runs, count)]
    if len(lines) == 1:
        lines.append("  nothing recorded")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", nargs="?", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--slowest", type=int, default=15)
    args = parser.parse_args(argv)
    print("\n".join(report(args.directory, args.slowest)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
