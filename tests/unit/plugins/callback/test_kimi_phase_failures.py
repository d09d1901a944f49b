"""The failure recorder's words: which phase a play is, and one line of what failed."""

from __future__ import annotations

import importlib.util

from tests.ansible_run import REPO_ROOT

spec = importlib.util.spec_from_file_location(
    "kimi_phase_failures", REPO_ROOT / "plugins" / "callback" / "kimi_phase_failures.py"
)
recorder = importlib.util.module_from_spec(spec)
spec.loader.exec_module(recorder)


class FakeVariables:
    def __init__(self) -> None:
        self.facts: dict[str, dict] = {}

    def set_nonpersistent_facts(self, host: str, facts: dict) -> None:
        self.facts.setdefault(host, {}).update(facts)


class FakeHost:
    def __init__(self, name: str) -> None:
        self.name = name

    def get_name(self) -> str:
        return self.name


class FakeResult:
    def __init__(self, host: str, task: str, result: dict) -> None:
        self._host, self.task_name, self._result = FakeHost(host), task, result


class FakePlay:
    def __init__(self, name: str, play_vars: dict, variables: FakeVariables) -> None:
        self.vars, self._name, self._variables = play_vars, name, variables

    def get_name(self) -> str:
        return self._name

    def get_variable_manager(self) -> FakeVariables:
        return self._variables


def test_the_phase_is_the_play_variable_or_the_name_before_the_bar():
    assert recorder.phase_of("Checkpoint | the pinned checkpoint", {"kimi_phase": "checkpoint"}) == "checkpoint"
    assert recorder.phase_of("Stack | pinned and held driver", {}) == "stack"
    assert recorder.phase_of("", {}) == "unnamed"


def test_what_failed_is_one_line_from_msg_stderr_or_rc():
    assert recorder.failure_text({"msg": "disk /data:\n need 10 GiB"}) == "disk /data: need 10 GiB"
    assert recorder.failure_text({"stderr": "hf: boom", "rc": 3}) == "hf: boom"
    assert recorder.failure_text({"rc": 3}) == "rc=3"
    assert len(recorder.failure_text({"msg": "x" * 1000})) == recorder.MAX_MESSAGE


def test_the_last_fatal_failure_of_a_host_is_its_fact_and_ignored_ones_are_not():
    variables = FakeVariables()
    callback = recorder.CallbackModule()
    callback.v2_playbook_on_play_start(FakePlay("Checkpoint | x", {"kimi_phase": "checkpoint"}, variables))
    callback.v2_runner_on_failed(FakeResult("node2", "Probe", {"msg": "ignored"}), ignore_errors=True)
    assert variables.facts == {}
    callback.v2_runner_on_failed(FakeResult("node2", "Download", {"msg": "hf exited 3"}))
    callback.v2_runner_on_unreachable(FakeResult("node3", "Download", {"msg": "ssh: no route"}))
    assert variables.facts["node2"]["kimi_failure"] == {
        "phase": "checkpoint",
        "task": "Download",
        "msg": "hf exited 3",
        "what": "failed",
    }
    assert variables.facts["node3"]["kimi_failure"]["what"] == "was unreachable"
