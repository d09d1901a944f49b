"""Action plugin for kimi_checkpoint_status: `mode: wait` polls the node and prints a progress line per poll.

Ansible prints nothing while a task runs, and `until` retries print only the task name. This plugin runs the
module's `progress` mode every `interval` seconds from the controller and displays its line as it comes, so a
download of hours shows bytes, percentage, rate and ETA at a steady pace. The download itself runs detached
on the node: if this connection drops, only the watching stops, and a re-run attaches to the same job.
Every other mode passes straight through to the module.
"""

from __future__ import annotations

import time
from collections import deque

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

MODULE = "kimi_checkpoint_status"
# The rate (and so the ETA) is averaged over this many polls: steady, yet follows a real change of speed.
RATE_WINDOW = 6

display = Display()


class ActionModule(ActionBase):
    def run(self, tmp: str | None = None, task_vars: dict | None = None) -> dict:
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        if args.get("mode") != "wait":
            result.update(self._execute_module(module_name=MODULE, module_args=args, task_vars=task_vars))
            return result
        interval = float(args.get("interval", 30))
        timeout = float(args.get("timeout", 0))
        args.update(mode="progress", host=args.get("host") or task_vars.get("inventory_hostname", ""))
        samples: deque[tuple[float, int]] = deque(maxlen=RATE_WINDOW)
        started, polls, lines = time.monotonic(), 0, []
        while True:
            if samples:
                args.update(previous_time=samples[0][0], previous_bytes=samples[0][1])
            answer = self._execute_module(module_name=MODULE, module_args=args, task_vars=task_vars)
            if answer.get("failed"):
                result.update(answer)
                return result
            polls += 1
            samples.append((answer["time"], answer["bytes_on_disk"]))
            lines.append(answer["line"])
            display.display(answer["line"])
            if not answer["running"]:
                break
            if timeout and time.monotonic() - started >= timeout:
                break
            time.sleep(interval)
        result.update(answer)
        result.update(mode="wait", changed=False, polls=polls, lines=lines[-20:])
        result["timed_out"] = bool(answer["running"])
        return result
