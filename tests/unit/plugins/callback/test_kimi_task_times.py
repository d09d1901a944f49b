"""The task timer: its record of a run, and a real ansible-playbook run that appends one JSON line."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.ansible_run import REPO_ROOT

spec = importlib.util.spec_from_file_location(
    "kimi_task_times", REPO_ROOT / "plugins" / "callback" / "kimi_task_times.py"
)
timer = importlib.util.module_from_spec(spec)
# Its dataclasses look their module up in sys.modules.
sys.modules[spec.name] = timer
spec.loader.exec_module(timer)

PLAYBOOK = """\
- name: Two timed tasks
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Sleep a little
      ansible.builtin.command: sleep 0.6
      changed_when: false
    - name: Say something
      ansible.builtin.debug:
        msg: hello
"""


def test_the_record_ranks_tasks_and_sums_roles():
    times = timer.RunTimes()
    times.add("a", "Install", "vllm", 3.0, {"node1"}, "ansible.builtin.command")
    times.add("b", "Write the unit", "vllm_serve", 1.0, {"node1", "node2"}, "ansible.builtin.template")
    times.add("a", "Install", "vllm", 2.0, {"node2"}, "ansible.builtin.command")
    line = timer.record("site.yml", 7.5, times, count=1)
    assert line == {
        "playbook": "site.yml",
        "wall_s": 7.5,
        "tasks": 2,
        "roles_s": {"vllm": 5.0, "vllm_serve": 1.0},
        "actions": {
            "ansible.builtin.command": {"seconds": 5.0, "tasks": 1},
            "ansible.builtin.template": {"seconds": 1.0, "tasks": 1},
        },
        "slowest": [
            {
                "task": "Install",
                "role": "vllm",
                "action": "ansible.builtin.command",
                "seconds": 5.0,
                "hosts": ["node1", "node2"],
            }
        ],
    }


def test_a_run_appends_one_line_with_its_slowest_tasks_and_prints_them(tmp_path):
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    out = tmp_path / "times" / "playbooks.jsonl"
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"),
        "ANSIBLE_HOME": str(REPO_ROOT / ".ansible"),
        "ANSIBLE_CALLBACKS_ENABLED": "kimi_task_times",
        "KIMI_TASK_TIMES_FILE": str(out),
        "ANSIBLE_CALLBACK_PLUGINS": str(REPO_ROOT / "plugins" / "callback"),
    }
    playbook = Path(sys.executable).parent / "ansible-playbook"
    for _ in range(2):
        done = subprocess.run(
            [
                str(playbook),
                "-i",
                "localhost,",
                "-c",
                "local",
                "-e",
                f"ansible_python_interpreter={sys.executable}",
                str(tmp_path / "play.yml"),
            ],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 2
    first = lines[0]
    assert first["playbook"].endswith("play.yml") and first["tasks"] == 2
    assert first["slowest"][0]["task"] == "Sleep a little" and first["slowest"][0]["seconds"] >= 0.6
    assert first["slowest"][0]["hosts"] == ["localhost"]
    assert first["slowest"][0]["action"] == "ansible.builtin.command"
    assert first["actions"]["ansible.builtin.command"]["tasks"] == 1
    assert "SLOWEST TASKS" in done.stdout and "(play): Sleep a little" in done.stdout
