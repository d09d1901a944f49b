"""kimi_topology and kimi_inputs are answered by action plugins in the controller's process
(plugins/plugin_utils/kimi_in_process.py). Each case runs twice: as Ansible runs the task (ansible.cfg's
action_plugins: the plugin answers) and as the module alone (its file run by Python with the same options), and the
two answers must agree, refusals and their messages included."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.unit.ansible_adhoc import REPO_ROOT, run_module

# What only one of the two answers carries: the module echoes its options, Ansible adds its own keys.
# `failed` and `changed` are compared through the ok flag and asserted apart (Ansible moves `failed` out of the
# displayed result and adds `changed` to a module's failure).
NOT_COMPARED = {"invocation", "failed", "changed", "_ansible_no_log", "_ansible_verbose_always", "warnings"}

TOPOLOGY = {
    "hosts": ["node1", "node2"],
    "gpus_per_node": 8,
    "tensor_parallel_size": 8,
    "pipeline_parallel_size": 2,
}
# The checkpoint phase's own values, judged without those every phase reads (`common: false`).
HOST_VALUES = {
    "kimi_model": "kimi-k2.7-code",
    "kimi_checkpoint_repo_id": "moonshotai/Kimi-K2.7-Code",
    "kimi_checkpoint_revision": "74797c9c62378b951a1f6fcf5c4631024e9b8bef",
}


def run_module_file(tmp_path, module: str, args: dict) -> tuple[bool, dict]:
    """The module's own answer: its file run by Python, module_utils found through collections/ (as installed)."""
    args_file = tmp_path / f"{module}-args.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "collections")}
    completed = subprocess.run(
        [sys.executable, str(REPO_ROOT / "plugins" / "modules" / f"{module}.py"), str(args_file)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    result = json.loads(completed.stdout)
    return not result.get("failed", False), result


def answers(tmp_path, module: str, args: dict) -> tuple[tuple[bool, dict], tuple[bool, dict]]:
    def compared(ok_result: tuple[bool, dict]) -> tuple[bool, dict]:
        ok, result = ok_result
        return ok, {key: value for key, value in result.items() if key not in NOT_COMPARED}

    plugin_ok, plugin = run_module(tmp_path, module, args)
    assert plugin["changed"] is False
    return compared((plugin_ok, plugin)), compared(run_module_file(tmp_path, module, args))


@pytest.mark.parametrize(
    "args",
    [
        TOPOLOGY,
        {**TOPOLOGY, "rank_overrides": {"node1": 1, "node2": 0}},
        # Refused: two hosts claim rank 0; a layout of 24 GPUs on 16.
        {**TOPOLOGY, "rank_overrides": {"node1": 0, "node2": 0}},
        {**TOPOLOGY, "pipeline_parallel_size": 3},
    ],
    ids=["inventory-order", "overridden", "duplicate-rank", "layout-too-big"],
)
def test_kimi_topology_plugin_answers_as_the_module(tmp_path, args):
    (plugin_ok, plugin), (module_ok, module) = answers(tmp_path, "kimi_topology", args)
    assert (plugin_ok, plugin) == (module_ok, module)
    if args.get("pipeline_parallel_size") == 3 or args.get("rank_overrides") == {"node1": 0, "node2": 0}:
        assert not plugin_ok and plugin["msg"]
    else:
        assert plugin_ok and plugin["master_host"] in args["hosts"]


def test_kimi_topology_plugin_is_what_ansible_runs(tmp_path):
    # A module's answer echoes its options under `invocation`; the plugin's does not: no module ran.
    ok, result = run_module(tmp_path, "kimi_topology", TOPOLOGY)
    assert ok and "invocation" not in result
    assert result["node_ranks"] == {"node1": 0, "node2": 1} and result["world_size"] == 16


@pytest.mark.parametrize(
    "args",
    [
        {"hosts": {"node1": {"kimi_tensor_parallel_size": "a lot"}}, "phases": ["serve"]},
        {"hosts": {"node1": HOST_VALUES}, "phases": ["checkpoint"], "common": False},
    ],
    ids=["refused", "accepted"],
)
def test_kimi_inputs_plugin_answers_as_the_module(tmp_path, args):
    (plugin_ok, plugin), (module_ok, module) = answers(tmp_path, "kimi_inputs", args)
    assert (plugin_ok, plugin) == (module_ok, module)
    assert plugin["phases"] == args["phases"]
    assert plugin_ok == (not plugin["problems"]) == (args["hosts"]["node1"] is HOST_VALUES)


def test_options_the_spec_does_not_know_are_refused_by_the_plugin(tmp_path):
    ok, result = run_module(tmp_path, "kimi_inputs", {"hosts": {}, "phases": [], "phase": "serve"})
    assert not ok
    assert "phase" in result["msg"] and "Unsupported parameters" in result["msg"]
