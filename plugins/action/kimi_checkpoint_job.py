"""Action plugin for kimi_checkpoint_job: `state: finished` polls the node and prints a progress line per poll.

Ansible prints nothing while a task runs, and `until` retries print only the task name. This plugin runs the
module's `state: finished` (one blocking poll) from the controller and displays its line as it comes, so a
download of hours shows bytes, percentage, rate and ETA at a steady pace. Each poll blocks on the node for
up to `interval` seconds and answers as soon as the job ends: one module run per line, yet the end of the
download is seen when it happens rather than up to a whole interval later. The download itself runs
detached on the node: if this connection drops, only the watching stops, and a re-run attaches to the job.

A download whose bytes on disk do not grow for `stall_timeout` seconds (a network cut that leaves
connections open, a hung mount) is stopped through the module's `state: stopped`, and the answer says so
(`stalled`, `stall_message`) for the role to fail with.
The other states pass straight through to the module.
"""

from __future__ import annotations

import time
from collections import deque

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

# By FQCN: the collection's module, found the way every task of the collection finds it.
MODULE = "kimi.k2.kimi_checkpoint_job"
# The rate (and so the ETA) is averaged over this many polls: steady, yet follows a real change of speed.
RATE_WINDOW = 6

display = Display()


class ActionModule(ActionBase):
    def run(self, tmp: str | None = None, task_vars: dict | None = None) -> dict:
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        if args.get("state") != "finished":
            result.update(self._execute_module(module_name=MODULE, module_args=args, task_vars=task_vars))
            return result
        interval = float(args.get("interval", 30))
        timeout = float(args.get("timeout", 0))
        stall_timeout = float(args.get("stall_timeout", 0))
        args.update(host=args.get("host") or task_vars.get("inventory_hostname", ""))
        samples: deque[tuple[float, int]] = deque(maxlen=RATE_WINDOW)
        started, polls, lines = time.monotonic(), 0, []
        # The most bytes seen and the node's time when they were first seen: no growth since then is a stall.
        most, grew_at = -1, 0.0
        stalled_for = 0.0
        while True:
            if samples:
                args.update(previous_time=samples[0][0], previous_bytes=samples[0][1])
            # The first line comes at once; later polls wait on the node (see the module docstring).
            wait = 0.0 if not polls else interval
            if timeout:
                wait = max(min(wait, timeout - (time.monotonic() - started)), 0.0)
            answer = self._execute_module(module_name=MODULE, module_args={**args, "wait": wait}, task_vars=task_vars)
            if answer.get("failed"):
                result.update(answer)
                return result
            polls += 1
            samples.append((answer["time"], answer["bytes_on_disk"]))
            lines.append(answer["line"])
            display.display(answer["line"])
            if answer["bytes_on_disk"] > most:
                most, grew_at = answer["bytes_on_disk"], answer["time"]
            stalled_for = answer["time"] - grew_at
            if not answer["running"]:
                break
            if stall_timeout and stalled_for >= stall_timeout:
                stop_args = {**args, "state": "stopped", "wait": 0, "stalled_seconds": stalled_for}
                stopped = self._execute_module(module_name=MODULE, module_args=stop_args, task_vars=task_vars)
                if stopped.get("failed"):
                    result.update(stopped)
                    return result
                display.display(stopped["stall_message"])
                result.update(answer)
                result.update(
                    state="finished", changed=False, polls=polls, lines=lines[-20:], timed_out=False, stalled=True,
                    stalled_seconds=round(stalled_for), stall_message=stopped["stall_message"], running=False,
                    exit_status=None, pid=stopped["pid"],
                )  # fmt: skip
                return result
            if timeout and time.monotonic() - started >= timeout:
                break
        result.update(answer)
        result.update(state="finished", changed=False, polls=polls, lines=lines[-20:], stalled=False)
        result["stalled_seconds"] = round(stalled_for)
        result["timed_out"] = bool(answer["running"])
        return result
