"""Ansible callback: remember, per host, the phase, task and message of the failure that took it out of the run.

Ansible drops a failed or unreachable host from the later plays of a run and carries on with the others. The
kimi role stops every later phase of the group when that happened (roles/kimi/tasks/main.yml); this callback
gives it the words: the host's last fatal failure becomes the host fact `kimi_failure` ({phase, task, msg,
what}), so the message names the node, the phase and what failed instead of "see above". Written by hand: no
Ansible facility hands a failure of one play to a later play.

Needs no enabling: it only records, prints nothing, and is harmless in any run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = r"""
name: kimi_phase_failures
type: aggregate
short_description: Record each host's fatal failure (phase, task, message) as the host fact kimi_failure
description:
  - On a failure that is not ignored and on an unreachable host, sets the non-persistent host fact
    C(kimi_failure) to C({phase, task, msg, what}); C(phase) is the play variable C(kimi_phase), or the play's
    name before " | ".
  - A later failure of the same host replaces an earlier one (a rescued failure is followed by the fatal one).
"""

MAX_MESSAGE = 400


def phase_of(play_name: str, play_vars: Mapping[str, Any]) -> str:
    """The phase a play belongs to: its kimi_phase variable, else the part of its name before ' | '."""
    phase = play_vars.get("kimi_phase")
    if isinstance(phase, str) and phase:
        return phase
    return play_name.split(" | ", 1)[0].strip().lower() or "unnamed"


def failure_text(result: Mapping[str, Any]) -> str:
    """One line of what went wrong: the module's msg, else stderr, else the return code."""
    message = result.get("msg") or result.get("stderr") or (f"rc={result['rc']}" if "rc" in result else "")
    text = " ".join(str(message).split())
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "kimi_phase_failures"
    CALLBACK_NEEDS_ENABLED = False

    def __init__(self) -> None:
        super().__init__()
        self._variables: Any = None
        self._phase = "unnamed"

    def v2_playbook_on_play_start(self, play: Any) -> None:
        self._variables = play.get_variable_manager()
        self._phase = phase_of(play.get_name(), play.vars or {})

    def _record(self, result: Any, what: str) -> None:
        if self._variables is None:
            return
        facts = {
            "kimi_failure": {
                "phase": self._phase,
                "task": result.task_name or "",
                "msg": failure_text(result._result),
                "what": what,
            }
        }
        self._variables.set_nonpersistent_facts(result._host.get_name(), facts)

    def v2_runner_on_failed(self, result: Any, ignore_errors: bool = False) -> None:
        if not ignore_errors:
            self._record(result, "failed")

    def v2_runner_on_unreachable(self, result: Any) -> None:
        self._record(result, "was unreachable")
