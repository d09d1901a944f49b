"""bin/kimi-plan's contract (flags, JSON keys, exit statuses, text box) and the kimi_plan Ansible module."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from ansible_collections.kimi.k2.plugins.module_utils import kimi_overhead as overhead

from tests import paths
from tests.unit.ansible_adhoc import run_module

REPO_ROOT = paths.REPO_ROOT
KIMI_PLAN = REPO_ROOT / "bin" / "kimi-plan"
# The 2-layer miniature the lab's first figures were measured with (465,920 tokens; 931,968 with PP 2), kept as the
# record of that measurement; the lab now serves 4 layers (preset lab-mini).
LAB_MINI_2_LAYERS_MEASURED = str(REPO_ROOT / "tests" / "fixtures" / "lab-mini-2-layers-measured" / "config.json")
REQUIRED_KEYS = {
    "weights_gib_per_gpu",
    "kv_cache_gib_per_gpu",
    "kv_bytes_per_token_per_gpu",
    "kv_tokens",
    "max_concurrent_sequences",
    "fits",
    "reasons",
}
SEED_004 = [
    "--model",
    "Kimi-K2.7-Code",
    "--weights-bytes",
    "595177988208",
    "--gpu-memory-gib",
    "95.6",
    "--gpus-per-node",
    "8",
    "--gpu-memory-utilization",
    "0.9",
    "--reserve-gib",
    "3",
    "--tp",
    "8",
    # The guide's rule (utilization x the driver's total - reserve - weights), to reproduce its figures.
    "--overhead-model",
    "none",
]
SEED_000 = [
    "--model",
    "Kimi-K2.7-Code",
    "--params",
    "1040e9",
    "--weight-bytes-per-param",
    "1",
    "--weight-overhead",
    "1.05",
    "--gpus-per-node",
    "8",
    "--nodes",
    "2",
    "--gpu-memory-utilization",
    "0.92",
    "--reserve-gib",
    "4",
    "--tp",
    "8",
    "--pp",
    "2",
    "--enable-expert-parallel",
    "--kv-cache-dtype",
    "fp8",
    "--max-model-len",
    "32768",
    # The guide's rule, as SEED_004.
    "--overhead-model",
    "none",
]


def kimi_plan(*args: str, input_text: str | None = None) -> subprocess.CompletedProcess:
    # Run the file itself, as users and outside checks do (its shebang is /usr/bin/env python3).
    return subprocess.run([str(KIMI_PLAN), *args], capture_output=True, text=True, timeout=60, input=input_text)


def kimi_plan_json(*args: str) -> tuple[int, dict]:
    completed = kimi_plan("--json", *args)
    lines = completed.stdout.splitlines()
    assert len(lines) == 1, completed.stdout + completed.stderr
    return completed.returncode, json.loads(lines[0])


def test_is_an_executable_python3_script():
    assert KIMI_PLAN.stat().st_mode & 0o111
    assert KIMI_PLAN.read_text().startswith("#!/usr/bin/env python3\n")


def test_json_object_has_the_contract_keys_and_exit_0_when_it_fits():
    rc, plan = kimi_plan_json(*SEED_004, "--max-model-len", "131072")
    assert rc == 0
    assert plan.keys() >= REQUIRED_KEYS
    assert plan["fits"] is True and plan["reasons"] == []
    assert round(plan["kv_cache_gib_per_gpu"], 1) == 13.8
    assert plan["kv_bytes_per_token_per_gpu"] == 70272
    assert plan["max_concurrent_sequences"] == 1


def test_rtx_pro_6000_guide_layouts_through_the_cli():
    assert kimi_plan_json(*SEED_004, "--max-model-len", "131072", "--dcp", "8")[1]["max_concurrent_sequences"] == 12
    fp8 = kimi_plan_json(*SEED_004, "--max-model-len", "131072", "--dcp", "8", "--kv-cache-dtype", "fp8")
    assert fp8[1]["max_concurrent_sequences"] == 25


def test_misfit_exits_1_and_still_prints_the_object():
    rc, plan = kimi_plan_json(*SEED_004, "--max-model-len", "262144")
    assert rc == 1
    assert plan["fits"] is False
    assert any("17.16 GiB" in reason for reason in plan["reasons"])


def test_lab_figures_through_the_cli():
    measured = ("--model", LAB_MINI_2_LAYERS_MEASURED, "--gpu", "cpu", "--kv-cache-gib-per-gpu", "1")
    assert kimi_plan_json(*measured, "--block-size", "128")[1]["kv_tokens"] == 465920
    assert kimi_plan_json(*measured, "--block-size", "128", "--pp", "2")[1]["kv_tokens"] == 931968
    lab = ("--model", "lab-mini", "--gpu", "cpu", "--kv-cache-gib-per-gpu", "1", "--max-model-len", "2048")
    assert kimi_plan_json(*lab, "--block-size", "16", "--pp", "2", "--nodes", "2")[1]["kv_tokens"] == 466032
    assert kimi_plan_json(*lab, "--block-size", "16", "--pp", "4", "--nodes", "4")[1]["kv_tokens"] == 932064


def test_more_stages_than_layers_exits_1_naming_only_the_layout():
    lab = ("--model", "lab-mini", "--gpu", "cpu", "--kv-cache-gib-per-gpu", "1", "--max-model-len", "2048")
    rc, plan = kimi_plan_json(*lab, "--block-size", "16", "--pp", "5", "--nodes", "5")
    assert rc == 1
    assert plan["reasons"] == [
        "PP 5 exceeds the 4 layers of lab-mini (kimi_pipeline_parallel_size=5 leaves a pipeline stage without layers)"
    ]


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--tp", "0"], "--tp"),
        (["--tp", "eight"], "--tp"),
        (["--kv-cache-dtype", "int8"], "--kv-cache-dtype"),
        (["--gpu", "a100"], "--gpu"),
        (["--model", "Kimi-K9"], "--model"),
        (["--params", "1e12"], "--params"),
        (["--no-such-flag"], "--no-such-flag"),
    ],
)
def test_bad_flags_exit_2_with_one_line_naming_the_flag(args, flag):
    completed = kimi_plan("--json", "--gpu-memory-gib", "80", *args)
    assert completed.returncode == 2
    assert completed.stdout == ""
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1, completed.stderr
    assert flag in lines[0]


def test_a_vllm_past_the_rules_read_is_planned_with_the_newest_and_a_warning():
    completed = kimi_plan("--json", *SEED_004, "--vllm-version", "0.34.0")
    assert completed.returncode in (0, 1), completed.stderr  # planned (this seed's layout may not fit)
    assert json.loads(completed.stdout)["warnings"] == [overhead.version_warning("0.34.0")]
    assert completed.stderr.startswith("kimi-plan: warning: vLLM 0.34.0: no rule of this release was read; planned")
    assert "with vLLM 0.33.0's rules" in completed.stderr
    quiet = kimi_plan("--json", *SEED_004, "--vllm-version", "0.33.0")
    assert quiet.stderr == "" and json.loads(quiet.stdout)["warnings"] == []


@pytest.mark.parametrize(
    ("version", "words"),
    [("0.9.2", "older than 0.10.1"), ("0.44.0", "more than 10 minor releases past 0.33.0"), ("1.0.0", "no rule")],
)
def test_a_vllm_with_no_rules_near_is_refused_naming_the_flag(version, words):
    completed = kimi_plan("--json", *SEED_004, "--vllm-version", version)
    assert completed.returncode == 2 and completed.stdout == ""
    assert completed.stderr.startswith("kimi-plan: error: argument --vllm-version: ") and words in completed.stderr


@pytest.mark.parametrize("version", ["0.10.1.1", "0.11.1rc2", "0.15.0", "0.20.2", "0.23.0", "0.33.0", "0.33.4"])
def test_the_versions_whose_rules_were_read_plan_without_a_warning(version):
    assert overhead.version_warning(version) is None


def test_text_box_is_per_gpu_and_suggests_dcp():
    completed = kimi_plan(*SEED_004, "--max-model-len", "131072")
    assert completed.returncode == 0
    out = completed.stdout
    assert out.startswith("PER-GPU MEMORY BUDGET - Kimi-K2.7-Code")
    assert "--> KV cache" in out and "13.75 GiB" in out
    assert "replicated on all 8 TP ranks" in out
    assert "DCP 8 would hold 8x the KV tokens: 12 full-length sequences instead of 1" in out


def test_pooled_only_when_asked_and_labelled():
    rc, pooled = kimi_plan_json("--pooled", *SEED_000, "--gpu-memory-gib", "80")
    assert rc == 0
    assert pooled["mode"] == "pooled" and pooled["warning"].startswith("POOLED")
    assert pooled["kv_tokens"] == 2951927
    assert pooled["max_concurrent_sequences"] == 90
    assert pooled.keys() >= REQUIRED_KEYS
    # Per GPU, with the guide's own 80 GiB and weights: 0.92 x 80 - 4 - 1017.0 / 16 = 6.04 GiB of KV on each GPU,
    # 31 layers x 576 B per token on stage 0: 363,024 tokens, 11 sequences of 32K (not ~90).
    assert pooled["per_gpu_plan"]["max_concurrent_sequences"] == 11
    rc, per_gpu = kimi_plan_json(*SEED_000, "--gpu-memory-gib", "80")
    assert per_gpu["mode"] == "per-gpu" and per_gpu["max_concurrent_sequences"] == 11
    text = kimi_plan("--pooled", *SEED_000, "--gpu-memory-gib", "80").stdout
    assert text.splitlines()[0].startswith("POOLED arithmetic (the GreenNode guide)")
    assert "~90 full-length sequences" in text and "What vLLM actually allocates" in text


def test_cli_runs_without_ansible_on_the_path():
    # stdlib only: an interpreter with no site-packages (-S -I) still runs it.
    completed = subprocess.run(
        [
            sys.executable,
            "-S",
            "-I",
            str(KIMI_PLAN),
            "--json",
            "--model",
            LAB_MINI_2_LAYERS_MEASURED,
            "--gpu",
            "cpu",
            "--kv-cache-gib-per-gpu",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 0, completed.stderr
    assert json.loads(completed.stdout)["kv_tokens"] == 465920


# --- plugins/modules/kimi_plan.py through ansible ------------------------------------------------------------


def test_module_returns_the_plan(tmp_path):
    ok, result = run_module(
        tmp_path,
        "kimi_plan",
        {
            "model": LAB_MINI_2_LAYERS_MEASURED,
            "gpu": "cpu",
            "kv_cache_gib_per_gpu": 1,
            "pp": 2,
            "nodes": 2,
            "max_model_len": 2048,
        },
    )
    assert ok, result
    assert result["changed"] is False
    assert result["kv_tokens"] == 931968
    assert result["plan"]["stages"][0]["num_layers"] == 1
    assert result["table"].startswith("PER-GPU MEMORY BUDGET")


def test_module_fails_with_the_reasons_when_it_does_not_fit(tmp_path):
    args = {
        "model": "Kimi-K2.7-Code",
        "weights_bytes": 595177988208,
        "gpu_memory_gib": 95.6,
        "tp": 8,
        "max_model_len": 262144,
    }
    ok, result = run_module(tmp_path, "kimi_plan", args, check=True)
    assert not ok
    assert result["msg"].startswith("plan does not fit: one 262,144-token sequence needs 17.16 GiB")
    assert result["fits"] is False
    ok, result = run_module(tmp_path, "kimi_plan", {**args, "fail_on_misfit": False})
    assert ok and result["fits"] is False and result["reasons"]


def test_module_warns_when_it_plans_a_vllm_past_the_rules_read(tmp_path):
    ok, result = run_module(
        tmp_path,
        "kimi_plan",
        {"model": "Kimi-K2.7-Code", "gpu": "h200", "tp": 8, "vllm_version": "0.34.0", "fail_on_misfit": False},
    )
    assert ok, result
    # Ansible shows the module's warning (module.warn); the plan carries it too.
    assert result["plan"]["warnings"] == [overhead.version_warning("0.34.0")]


def test_module_names_the_bad_option(tmp_path):
    ok, result = run_module(tmp_path, "kimi_plan", {"gpu": "h200", "tp": 8, "dcp": 0})
    assert not ok
    assert result["msg"] == "dcp: must be >= 1 (got 0)"


# --check-log (contrib/kimi_tools/kimi_tools/kimi_plan_check.py; its pieces: tests/unit/contrib/test_kimi_plan_check.py)
DSR1_LOG = REPO_ROOT / "tests" / "fixtures" / "planner" / "logs" / "dsr1-h200-0.11.2-2b62be43.reconstructed.log"
DSR1_FLAGS = ("--gpu", "h200", "--model", "tests/fixtures/planner/configs/DeepSeek-R1-0528/config.json")


def test_check_log_prints_the_error_and_the_case_and_exits_0_within_tolerance():
    status, report = kimi_plan_json("--check-log", str(DSR1_LOG), "--case-source", "a run", *DSR1_FLAGS)
    assert status == 0
    assert {"budget_error", "tokens_error", "within_tolerance", "above_log", "case", "plan"} <= set(report)
    assert report["case"]["source"] == "a run" and report["case"]["options"]["tp"] == 8
    completed = kimi_plan("--check-log", "-", *DSR1_FLAGS, input_text=DSR1_LOG.read_text())
    assert completed.returncode == 0 and "within 2%" in completed.stdout, completed.stderr


def test_check_log_exits_1_when_the_plan_is_above_its_log(tmp_path):
    above = tmp_path / "above.log"
    above.write_text(
        DSR1_LOG.read_text().replace("Available KV cache memory: 41.62", "Available KV cache memory: 40.5")
    )
    completed = kimi_plan("--check-log", str(above), *DSR1_FLAGS)
    assert completed.returncode == 1 and "ABOVE the log" in completed.stdout


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--check-log", str(DSR1_LOG), "--tp", "4", *DSR1_FLAGS), "argument --tp: 4 disagrees with the log"),
        (("--check-log", "/nonexistent/startup.log", *DSR1_FLAGS), "argument --check-log: cannot read"),
        (("--case-source", "a run", *DSR1_FLAGS), "argument --case-source: only with --check-log"),
    ],
)
def test_check_log_bad_input_exits_2_naming_the_flag(args, named):
    completed = kimi_plan(*args)
    assert completed.returncode == 2 and named in completed.stderr and not completed.stdout
