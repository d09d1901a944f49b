"""Run playbooks through ansible-runner's Python API and read the outcome from its events.

Tests assert on per-host stats and on the failing task's message, not on scraped console text.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ansible_runner

from tests.paths import REPO_ROOT

VENV_BIN = REPO_ROOT / ".venv" / "bin"


@dataclass
class PlayResult:
    """What a playbook run did, per host, as the runner's events tell it."""

    rc: int
    status: str
    stats: dict[str, dict[str, int]]
    failures: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)

    def count(self, kind: str, host: str | None = None) -> int:
        """Total of one stat ('changed', 'failures', 'dark', 'ok', ...) over all hosts or for one host."""
        per_host = self.stats.get(kind, {})
        return per_host.get(host, 0) if host else sum(per_host.values())

    @property
    def changed(self) -> int:
        return self.count("changed")

    @property
    def unreachable_hosts(self) -> list[str]:
        return sorted(self.stats.get("dark", {}))

    def failure_messages(self) -> list[str]:
        return [f"{item['host']}: {item['task']}: {item['msg']}" for item in self.failures]

    def results_of(self, task_name: str) -> dict[str, dict[str, Any]]:
        """Each host's result of the task with this name (ok, changed or failed)."""
        found = {}
        for event in self.events:
            data = event.get("event_data", {})
            if event.get("event", "").startswith("runner_on_") and data.get("task") == task_name:
                found[data.get("host")] = data.get("res", {})
        return found


def _failure(event: dict[str, Any]) -> dict[str, Any] | None:
    data = event.get("event_data", {})
    kind = event.get("event")
    if kind == "runner_on_failed" and data.get("ignore_errors"):
        return None
    if kind not in ("runner_on_failed", "runner_on_unreachable"):
        return None
    result = data.get("res", {})
    return {
        "host": data.get("host"),
        "task": data.get("task"),
        "msg": result.get("msg", ""),
        "unreachable": kind == "runner_on_unreachable",
        "result": result,
    }


def task_times_env(env: dict[str, str]) -> dict[str, str]:
    """With KIMI_TEST_TIMES_DIR set (make test sets it), the kimi_task_times callback appends each run's slowest
    tasks to playbooks.jsonl there, beside any callback the test enabled itself."""
    times_dir = os.environ.get("KIMI_TEST_TIMES_DIR")
    if not times_dir:
        return {}
    enabled = [name for name in env.get("ANSIBLE_CALLBACKS_ENABLED", "").split(",") if name]
    return {
        "ANSIBLE_CALLBACKS_ENABLED": ",".join([*enabled, "kimi_task_times"]),
        "KIMI_TASK_TIMES_FILE": str(Path(times_dir) / "playbooks.jsonl"),
        "KIMI_TASK_TIMES_QUIET": "1",
    }


def run_playbook(
    playbook: str | Path,
    inventory: str | Path,
    *,
    extravars: dict[str, Any] | None = None,
    tags: str | None = None,
    skip_tags: str | None = None,
    limit: str | None = None,
    check: bool = False,
    diff: bool = False,
    envvars: dict[str, str] | None = None,
    timeout: int = 1800,
    project_dir: Path = REPO_ROOT,
    more_inventories: Sequence[str | Path] = (),
) -> PlayResult:
    """Run one playbook with the project's ansible.cfg and collect its events.

    It runs from the repository root unless `project_dir` says otherwise (a user's own project, whose
    ansible.cfg `envvars` then names as ANSIBLE_CONFIG). `more_inventories` come after `inventory`, as further
    `-i` sources do for ansible-playbook: their variables win.
    """
    cmdline = []
    if check:
        cmdline.append("--check")
    if diff:
        cmdline.append("--diff")
    env = {
        "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"),
        "ANSIBLE_HOME": str(REPO_ROOT / ".ansible"),
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "ANSIBLE_NOCOLOR": "1",
        # ansible-runner sets ANSIBLE_CALLBACK_PLUGINS to its own directory, which hides ansible.cfg's
        # callback_plugins; it appends to a value given here, so the project's callbacks load as they do for
        # ansible-playbook (kimi_phase_failures words the message of a phase stopped by a failed node).
        "ANSIBLE_CALLBACK_PLUGINS": str(REPO_ROOT / "plugins" / "callback"),
    }
    env.update(envvars or {})
    env.update(task_times_env(env))
    with tempfile.TemporaryDirectory(prefix="kimi-runner-") as private_dir:
        runner = ansible_runner.run(
            private_data_dir=private_dir,
            project_dir=str(project_dir),
            playbook=str(Path(playbook).resolve()),
            inventory=[str(Path(source).resolve()) for source in (inventory, *more_inventories)],
            extravars=extravars or {},
            tags=tags,
            skip_tags=skip_tags,
            limit=limit,
            cmdline=" ".join(cmdline) or None,
            envvars=env,
            quiet=True,
            timeout=timeout,
        )
        events = list(runner.events)
        stats = runner.stats or {}
    failures = [f for f in (_failure(e) for e in events) if f]
    return PlayResult(rc=runner.rc, status=runner.status, stats=stats, failures=failures, events=events)
