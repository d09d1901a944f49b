"""Ansible callback: how long each task of a run took, and which were the slowest.

`ansible.posix.profile_tasks` prints the same kind of table, but this collection installs nothing from Galaxy
(requirements.yml: air-gapped sites and CI reach PyPI only), and the tests need the figures as data, not as
console text: with `KIMI_TASK_TIMES_FILE` set, every run appends one JSON line there (the playbook, its wall time,
the time per role and the slowest tasks), which `make test` sums up at its end (tests/timings.py).

Enable it with `ANSIBLE_CALLBACKS_ENABLED=kimi.k2.kimi_task_times` (or `kimi_task_times` from this checkout).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = r"""
name: kimi_task_times
type: aggregate
short_description: Time every task of a run; print the slowest and optionally append them to a JSON lines file
description:
  - Times each task from its start until the last host reported its result (the task's wall time under the
    linear strategy), and each role as the sum of its tasks.
  - At the end of the run prints the slowest tasks and roles; with I(file) set, appends one JSON object per run.
requirements:
  - enable in ansible.cfg (callbacks_enabled) or with ANSIBLE_CALLBACKS_ENABLED
options:
  file:
    description: A file to append one JSON line per run to (created with its directory); unset, nothing is written.
    type: path
    env:
      - name: KIMI_TASK_TIMES_FILE
    ini:
      - section: kimi_task_times
        key: file
  slowest:
    description: How many of the slowest tasks to print and record.
    type: int
    default: 15
    env:
      - name: KIMI_TASK_TIMES_SLOWEST
    ini:
      - section: kimi_task_times
        key: slowest
  quiet:
    description: Record to I(file) only, print nothing (tests run playbooks whose output nobody reads).
    type: bool
    default: false
    env:
      - name: KIMI_TASK_TIMES_QUIET
    ini:
      - section: kimi_task_times
        key: quiet
"""


@dataclass
class TaskTime:
    """One task's wall time in this run (a task run again in a loop of includes adds up under one key)."""

    name: str
    role: str
    action: str = ""
    seconds: float = 0.0
    hosts: set[str] = field(default_factory=set)


@dataclass
class RunTimes:
    """Every task's time, in the order tasks first started."""

    started: float = field(default_factory=time.monotonic)
    tasks: dict[str, TaskTime] = field(default_factory=dict)

    def add(self, key: str, name: str, role: str, seconds: float, hosts: set[str], action: str = "") -> None:
        entry = self.tasks.setdefault(key, TaskTime(name=name, role=role, action=action))
        entry.seconds += seconds
        entry.hosts |= hosts

    def slowest(self, count: int) -> list[TaskTime]:
        return sorted(self.tasks.values(), key=lambda task: task.seconds, reverse=True)[:count]

    def by_role(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        for task in self.tasks.values():
            totals[task.role] = totals.get(task.role, 0.0) + task.seconds
        return dict(sorted(totals.items(), key=lambda item: item[1], reverse=True))

    def by_action(self) -> dict[str, dict[str, float]]:
        """Time and task count per module: where a run that changes nothing spends its time (each task that
        reaches a node pays for at least one module run there)."""
        totals: dict[str, dict[str, float]] = {}
        for task in self.tasks.values():
            entry = totals.setdefault(task.action or "(unknown)", {"seconds": 0.0, "tasks": 0})
            entry["seconds"] += task.seconds
            entry["tasks"] += 1
        ranked = sorted(totals.items(), key=lambda item: item[1]["seconds"], reverse=True)
        return {
            action: {"seconds": round(entry["seconds"], 2), "tasks": int(entry["tasks"])} for action, entry in ranked
        }


def record(playbook: str, wall_s: float, times: RunTimes, count: int) -> dict[str, Any]:
    """The JSON object one run appends: what ran, how long, where the time went."""
    return {
        "playbook": playbook,
        "wall_s": round(wall_s, 2),
        "tasks": len(times.tasks),
        "roles_s": {role: round(seconds, 2) for role, seconds in times.by_role().items()},
        "actions": times.by_action(),
        "slowest": [
            {
                "task": task.name,
                "role": task.role,
                "action": task.action,
                "seconds": round(task.seconds, 2),
                "hosts": sorted(task.hosts),
            }
            for task in times.slowest(count)
        ],
    }


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "kimi_task_times"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self._times = RunTimes()
        self._playbook = ""
        # The task running now: its key, name, role, module, start and the hosts that reported on it so far.
        self._current: tuple[str, str, str, str, float] | None = None
        self._current_hosts: set[str] = set()
        self._last_result = 0.0

    def v2_playbook_on_start(self, playbook: Any) -> None:
        self._playbook = os.path.relpath(playbook._file_name)
        self._times = RunTimes()

    def _close_current(self) -> None:
        if self._current is None:
            return
        key, name, role, action, started = self._current
        # Until the last host's result: a task no host reported on (all skipped silently) counts until now.
        ended = self._last_result if self._current_hosts else time.monotonic()
        self._times.add(key, name, role, max(0.0, ended - started), self._current_hosts, action)
        self._current = None
        self._current_hosts = set()

    def _start(self, task: Any) -> None:
        self._close_current()
        role = task._role.get_name() if task._role else "(play)"
        path = task.get_path() or ""
        self._current = (f"{role}|{path}|{task.get_name()}", task.get_name(), role, task.action, time.monotonic())

    def v2_playbook_on_task_start(self, task: Any, is_conditional: bool) -> None:
        self._start(task)

    def v2_playbook_on_handler_task_start(self, task: Any) -> None:
        self._start(task)

    def _result(self, result: Any) -> None:
        self._current_hosts.add(result._host.get_name())
        self._last_result = time.monotonic()

    def v2_runner_on_ok(self, result: Any) -> None:
        self._result(result)

    def v2_runner_on_failed(self, result: Any, ignore_errors: bool = False) -> None:
        self._result(result)

    def v2_runner_on_skipped(self, result: Any) -> None:
        self._result(result)

    def v2_runner_on_unreachable(self, result: Any) -> None:
        self._result(result)

    def v2_playbook_on_stats(self, stats: Any) -> None:
        self._close_current()
        count = int(self.get_option("slowest"))
        line = record(self._playbook, time.monotonic() - self._times.started, self._times, count)
        target = self.get_option("file")
        if target:
            path = Path(target)
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(line) + "\n")
        if self.get_option("quiet"):
            return
        self._display.banner(f"SLOWEST TASKS ({line['wall_s']} s in all)")
        for task in line["slowest"]:
            self._display.display(f"{task['seconds']:8.2f} s  {task['role']}: {task['task']}")
        self._display.display(
            "by role: " + ", ".join(f"{role} {seconds} s" for role, seconds in line["roles_s"].items())
        )
