"""The per-stage, per-version overhead model (plugins/module_utils/kimi_overhead.py) and what the plan derives
from it: the budget from the CUDA-visible total, the block size by backend, the printed token count, the
concurrency cap, and the deployment values (--kv-cache-memory-bytes and the tokens it yields)."""

from __future__ import annotations

import math

import pytest
from ansible_collections.kimi.k2.plugins.module_utils import kimi_overhead as ko
from ansible_collections.kimi.k2.plugins.module_utils import kimi_plan_options as plan_options
from ansible_collections.kimi.k2.plugins.module_utils import kimi_presets as presets

from tests import paths

GIB = 1024**3
H200_TP8 = {"model": "Kimi-K2.7-Code", "gpu": "h200", "tp": 8, "max_model_len": 131072}
GREENNODE = {
    "model": "Kimi-K2.7-Code",
    "gpu": "h100",
    "nodes": 2,
    "tp": 8,
    "pp": 2,
    "enable_expert_parallel": True,
    "kv_cache_dtype": "fp8",
    "max_model_len": 32768,
    "gpu_memory_utilization": 0.92,
}


OVERHEAD_INPUTS = {
    "vllm_version": "0.33.0",
    "hidden_size": 7168,
    "vocab_size": 163840,
    "has_vision": False,
    "max_num_seqs": 1024,
    "max_num_batched_tokens": 8192,
    "enforce_eager": False,
    "all2all_backend": "allgather_reducescatter",
    "expert_parallel": True,
    "tp": 1,
    "dp": 1,
    "pp": 1,
    "gpus_per_node": 8,
}


def plan(**options):
    return plan_options.plan_from_options(options)


# --- versions ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "release"),
    [
        ("0.23.0", (0, 23, 0)),
        ("v0.11.1rc2", (0, 11, 1)),
        ("0.10.1.1+cu129", (0, 10, 1, 1)),
        ("0.24.0.dev3", (0, 24, 0)),
    ],
)
def test_versions_parse_to_their_release(text, release):
    assert ko.parse_version(text) == release


@pytest.mark.parametrize("text", ["", "latest", "0.x", "nightly-2025"])
def test_a_version_that_does_not_parse_names_the_flag(text):
    with pytest.raises(presets.PlanInputError) as error:
        plan(**H200_TP8, vllm_version=text)
    assert error.value.flag == "--vllm-version"


def test_kv_cache_memory_bytes_since_0_10_2():
    # CacheConfig.kv_cache_memory_bytes and --kv-cache-memory-bytes are in the 0.10.2 wheel, not in 0.10.1.1.
    assert not ko.supports_kv_cache_memory_bytes("0.10.1.1")
    assert ko.supports_kv_cache_memory_bytes("0.10.2")
    assert ko.supports_kv_cache_memory_bytes(ko.PINNED_VLLM_VERSION)
    assert plan(**H200_TP8)["kv_cache_memory_bytes_supported"] is True


def test_the_pinned_version_is_the_default():
    assert ko.PINNED_VLLM_VERSION == "0.33.0"
    assert plan(**H200_TP8)["vllm_version"] == "0.33.0"


# --- block size by backend and architecture -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("major", "dtype", "version", "block"),
    [
        (9, "bf16", "0.23.0", 16),  # FLASH_ATTN_MLA, multiples of 16
        (9, "fp8", "0.23.0", 64),  # FLASHMLA: FLASH_ATTN_MLA has no FP8 cache
        (10, "bf16", "0.23.0", 32),  # FLASHINFER_MLA [32, 64]
        (12, "bf16", "0.23.0", 16),  # TRITON_MLA on the RTX PRO 6000
        (9, "bf16", "0.33.0", 16),
        (10, "fp8", "0.33.0", 32),
        (9, "bf16", "0.18.0", 16),  # the first release without the forcing below
        (9, "bf16", "0.11.0", 64),  # FlashMLA forced on Hopper up to 0.17.1
        (9, "bf16", "0.15.0", 64),  # (the published K2.5 H100 log: 9,664 tokens = 151 blocks of 64)
        (9, "fp8", "0.17.1", 64),
        (10, "bf16", "0.11.0", 128),  # CUTLASS MLA forced on Blackwell up to 0.14.1
        (10, "bf16", "0.14.1", 128),
        (10, "bf16", "0.15.0", 64),  # FlashInfer MLA forced to 64 from 0.15.0 to 0.17.1
        (10, "bf16", "0.17.1", 64),
        (12, "bf16", "0.15.0", 16),  # no FlashMLA on sm_120: the default stays
        (None, "bf16", "0.23.0", 16),
    ],
)
def test_block_size_follows_the_attention_backend(major, dtype, version, block):
    assert ko.default_block_size(major, dtype, version) == block


def test_presets_carry_the_architecture_and_a_given_block_size_wins():
    assert plan(**{**GREENNODE, "gpu_memory_utilization": 0.92})["block_size"] == 64
    assert plan(**H200_TP8)["block_size"] == 16
    assert plan(**H200_TP8, block_size=128)["block_size"] == 128
    assert plan(model="lab-mini", gpu="cpu", kv_cache_gib_per_gpu=1)["block_size"] == 128


# --- the budget: ceil(util x CUDA-visible total) - weights - overhead - reserve ----------------------------------


def test_gpu_presets_keep_both_totals():
    h200 = presets.find_gpu("h200")
    assert (h200.memory_gib, h200.cuda_memory_gib) == (pytest.approx(140.4, abs=0.01), 139.81)
    assert presets.find_gpu("h100").cuda_memory_gib == 79.19
    assert presets.find_gpu("b200").cuda_memory_gib == 178.35
    assert presets.find_gpu("h200").cuda_memory_source


def test_budget_is_requested_minus_weights_minus_each_term():
    result = plan(**H200_TP8)
    stage = result["stages"][0]
    requested = math.ceil(0.9 * 139.81 * GIB) / GIB
    assert result["gpu_memory_gib"] == 139.81 and result["gpu_memory_gib_driver"] == pytest.approx(140.4, abs=0.01)
    assert stage["kv_cache_gib_per_gpu"] == pytest.approx(
        requested - stage["weights_gib_per_gpu"] - stage["overhead_gib"], abs=1e-3
    )
    terms = {"activation", "sampler", "sampler_state", "non_torch", "encoder", "cudagraph"}
    assert set(stage["overhead_breakdown_gib"]) == terms
    assert stage["overhead_gib"] == pytest.approx(sum(stage["overhead_breakdown_gib"].values()), abs=1e-3)


def test_reserve_is_an_extra_on_top_of_the_overhead():
    base, reserved = plan(**H200_TP8), plan(**H200_TP8, reserve_gib=2)
    assert base["kv_cache_gib_per_gpu"] - reserved["kv_cache_gib_per_gpu"] == pytest.approx(2, abs=1e-3)


def test_overhead_model_none_is_the_planner_before_issue_15():
    result = plan(**H200_TP8, overhead_model="none")
    assert result["gpu_memory_gib"] == pytest.approx(143771 / 1024, abs=1e-4)
    assert result["stages"][0]["overhead_gib"] == 0
    assert result["kv_cache_gib_per_gpu"] == pytest.approx(0.9 * 143771 / 1024 - result["weights_gib_per_gpu"], 1e-3)


def test_sampler_on_the_last_stage_encoder_on_the_first():
    # 0.14.1 sorts the vocabulary: 1,024 x 163,840 logits x 52.8 B outgrow the forward, on the last stage only.
    stages = plan(**GREENNODE, vllm_version="0.14.1")["stages"]
    assert stages[0]["overhead_breakdown_gib"]["sampler"] == 0
    forward = 8192 * 8 * 7168 * 10.3 / GIB
    assert stages[1]["overhead_breakdown_gib"]["activation"] == pytest.approx(forward, abs=1e-3)
    sampler = 1024 * 163840 * 52.8 / GIB
    assert stages[1]["overhead_breakdown_gib"]["sampler"] == pytest.approx(sampler - forward, abs=1e-3)
    assert stages[0]["overhead_breakdown_gib"]["encoder"] > 0
    assert stages[1]["overhead_breakdown_gib"]["encoder"] == 0
    text_only = plan(**GREENNODE, language_model_only=True)["stages"]
    assert text_only[0]["overhead_breakdown_gib"]["encoder"] == 0


def test_the_peak_is_the_larger_of_the_forward_and_the_sampler():
    # profile_run runs them one after the other: the sampler adds only what outgrows the forward (Model Runner V1,
    # the K2 models' runner up to 0.28).
    v1 = {**H200_TP8, "vllm_version": "0.28.0"}
    int4 = plan(**v1)["stages"][0]["overhead_breakdown_gib"]  # 21.68 B a logit, above the INT4 forward
    assert int4["activation"] + int4["sampler"] == pytest.approx(1024 * 163840 * 21.68 / GIB, abs=1e-3)
    one_request = plan(**v1, max_num_seqs=1)["stages"][0]["overhead_breakdown_gib"]
    assert one_request["activation"] == int4["activation"] and one_request["sampler"] == 0
    fp8 = plan(**{**v1, "model": "Kimi-K2-Instruct"})["stages"][0]["overhead_breakdown_gib"]
    assert fp8["activation"] > 1024 * 163840 * 21.68 / GIB and fp8["sampler"] == 0  # the FP8 forward is above it
    sorted_ = plan(**H200_TP8, vllm_version="0.11.2")["stages"][0]["overhead_breakdown_gib"]
    assert sorted_["activation"] + sorted_["sampler"] == pytest.approx(1024 * 163840 * 51.4 / GIB, abs=1e-3)


def test_sampler_scales_with_min_of_seqs_and_batched_tokens():
    small = plan(**H200_TP8, vllm_version="0.11.2", max_num_seqs=64)["stages"][0]["overhead_breakdown_gib"]
    assert small["sampler"] == 0  # 64 x 163,840 x 51.4 B stay below the forward
    capped = plan(**H200_TP8, vllm_version="0.11.2", max_num_seqs=4096, max_num_batched_tokens=2048)
    breakdown = capped["stages"][0]["overhead_breakdown_gib"]
    assert breakdown["activation"] + breakdown["sampler"] == pytest.approx(2048 * 163840 * 51.4 / GIB, abs=1e-3)


@pytest.mark.parametrize(
    ("version", "per_logit"),
    [
        ("0.10.2", 14.0),
        ("0.11.0", 14.0),
        ("0.11.1", 51.4),
        ("0.12.0", 51.4),
        ("0.13.0", 39.2),
        ("0.14.1", 52.8),
        ("0.15.0", 52.8),
        ("0.17.1", 39.4),
        ("0.18.0", 21.68),
        ("0.33.0", 21.68),
    ],
)
def test_the_sampler_sorts_the_vocabulary_from_0_11_1_to_0_17(version, per_logit):
    assert ko.sampler_bytes_per_logit(version) == per_logit


# --- Model Runner V2 (0.29.0 on) ------------------------------------------------------------------------------


@pytest.mark.parametrize(("version", "v2"), [("0.27.1", False), ("0.28.0", False), ("0.29.0", True), ("0.33.0", True)])
def test_the_k2_models_run_on_model_runner_v2_from_0_29(version, v2):
    assert ko.uses_model_runner_v2(version) is v2


def test_model_runner_v2_keeps_penalty_state_on_the_last_stage_only():
    # PenaltiesState: [max_num_seqs, vocab] int32 counts and [max_num_seqs, vocab / 32] int32 bits.
    stages = plan(**GREENNODE)["stages"]
    state = 1024 * (163840 + 163840 // 32) * 4 / GIB
    assert stages[0]["overhead_breakdown_gib"]["sampler_state"] == 0
    assert stages[1]["overhead_breakdown_gib"]["sampler_state"] == pytest.approx(state, abs=1e-3)
    fewer = plan(**GREENNODE, max_num_seqs=256)["stages"][1]["overhead_breakdown_gib"]["sampler_state"]
    assert fewer == pytest.approx(state / 4, abs=1e-3)
    v1 = plan(**GREENNODE, vllm_version="0.28.0")["stages"][1]["overhead_breakdown_gib"]["sampler_state"]
    assert v1 == 0


@pytest.mark.parametrize(
    ("version", "tp", "per_logit"),
    [
        ("0.29.0", 1, 2.0),  # the BF16 logits, no gather
        ("0.29.0", 2, 5.0),  # the shard (1), the gathered buffer (2) and its reshaped copy (2)
        ("0.32.0", 8, 4.25),
        ("0.33.0", 8, 14.0),  # the warmup pass: BF16 + FP32 logits, FlashInfer's masked logits and softmax
        ("0.33.0", 1, 14.0),
    ],
)
def test_model_runner_v2_sampler_pass_by_release_and_tp(version, tp, per_logit):
    assert ko.v2_sampler_bytes_per_logit(version, tp) == per_logit


def test_model_runner_v2_samples_on_top_of_the_held_moe_workspaces():
    units = 8192 * 8 * 7168
    int4 = plan(**H200_TP8)["stages"][0]["overhead_breakdown_gib"]  # 0.33.0
    # The INT4 forward (4.23 B a unit) is below the workspace bound (6 B): all of it stays under the sampler's pass.
    assert int4["activation"] == pytest.approx(units * 4.23 / GIB, abs=1e-3)
    assert int4["sampler"] == pytest.approx(1024 * 163840 * 14.0 / GIB, abs=1e-3)
    before_warmup = plan(**H200_TP8, vllm_version="0.32.0")["stages"][0]["overhead_breakdown_gib"]
    assert before_warmup["sampler"] == pytest.approx(1024 * 163840 * 4.25 / GIB, abs=1e-3)
    # FP8 (11.77 B a unit): 6 B of it held, the hidden states and the warmup pass stay below the forward's own peak.
    fp8 = plan(**{**H200_TP8, "model": "Kimi-K2-Instruct"})["stages"][0]["overhead_breakdown_gib"]
    held = int(units * 6.0) + 8192 * 7168 * 2
    assert held + 1024 * 163840 * 14.0 < units * 11.77
    assert fp8["sampler"] == 0 and fp8["sampler_state"] > 0
    inputs = ko.OverheadInputs(**{**OVERHEAD_INPUTS, "routed_format": "fp8_block"}, compute_major=9)
    assert ko.held_workspace_bytes(inputs) == held


def test_the_forward_figure_follows_the_format_and_the_gpu_family():
    assert ko.forward_bytes_per_unit("0.18.0", "fp8_block", 9) == 11.77
    assert ko.forward_bytes_per_unit("0.18.0", "fp8_block", 10) == 7.86
    # No Blackwell INT4 log: Hopper's figure while Blackwell runs Hopper's Marlin (to 0.22), the largest once it
    # runs FlashInfer's TRT-LLM MXINT4 MoE (0.23.0 on); the RTX PRO 6000 (sm_120) keeps Marlin.
    assert ko.forward_bytes_per_unit("0.18.0", "int_group", 10) == 4.23
    assert ko.forward_bytes_per_unit("0.22.0", "int_group", 10) == 4.23
    assert ko.forward_bytes_per_unit("0.23.0", "int_group", 10) == 11.77
    assert ko.forward_bytes_per_unit("0.33.0", "int_group", 10) == 11.77
    assert ko.forward_bytes_per_unit("0.33.0", "int_group", 12) == 4.23
    assert ko.forward_bytes_per_unit("0.33.0", "int_group", 9) == 4.23
    assert ko.forward_bytes_per_unit("0.18.0", "bf16", 9) == 11.77  # no log of the format: the largest
    assert ko.forward_bytes_per_unit("0.11.0", "int_group", 9) == 4.25
    assert ko.forward_bytes_per_unit("0.16.0", "fp8_block", 12) == 10.3


def test_activation_grows_with_batched_tokens_and_experts_per_token():
    low = plan(**H200_TP8, max_num_batched_tokens=2048)["stages"][0]["overhead_breakdown_gib"]["activation"]
    high = plan(**H200_TP8, max_num_batched_tokens=16384)["stages"][0]["overhead_breakdown_gib"]["activation"]
    assert high == pytest.approx(8 * low, rel=1e-3)
    assert low == pytest.approx(2048 * 8 * 7168 * 4.23 / GIB, abs=1e-3)  # Kimi-K2.7-Code: INT4 experts, 8 per token


def test_with_dp_every_engines_tokens_reach_each_moe_layer():
    # The DP engines' MoE layers all-gather every engine's batch: 8 engines of 8,192 tokens are 65,536 per GPU.
    tp8 = {**H200_TP8, "max_num_seqs": 1, "enable_expert_parallel": True}
    dp8 = {**tp8, "tp": 1, "dp": 8}
    one = plan(**tp8)["stages"][0]["overhead_breakdown_gib"]["activation"]
    assert plan(**dp8)["stages"][0]["overhead_breakdown_gib"]["activation"] == pytest.approx(8 * one, abs=1e-3)
    # Without --enable-expert-parallel the MoE falls back to the same all-gather.
    no_ep = plan(**{**dp8, "enable_expert_parallel": False})["stages"][0]["overhead_breakdown_gib"]["activation"]
    assert no_ep == pytest.approx(8 * one, abs=1e-3)
    assert ko.moe_tokens(ko.OverheadInputs(**{**OVERHEAD_INPUTS, "dp": 4})) == 4 * 8192
    assert ko.moe_tokens(ko.OverheadInputs(**OVERHEAD_INPUTS)) == 8192


def test_cudagraph_estimate_only_when_captured_and_subtracted():
    assert plan(**H200_TP8)["stages"][0]["overhead_breakdown_gib"]["cudagraph"] > 0
    assert plan(**H200_TP8, enforce_eager=True)["stages"][0]["overhead_breakdown_gib"]["cudagraph"] == 0
    assert plan(**H200_TP8, vllm_version="0.11.0")["stages"][0]["overhead_breakdown_gib"]["cudagraph"] == 0
    assert ko.cudagraph_capture_sizes(1024, 8192)[-1] == 512
    assert len(ko.cudagraph_capture_sizes(1024, 8192)) == 3 + 31 + 17


def test_blackwell_captures_up_to_1024_from_0_28():
    assert ko.largest_default_capture(10, "0.27.0") == 512
    assert ko.largest_default_capture(10, "0.28.0") == 1024
    assert ko.largest_default_capture(9, "0.33.0") == 512
    assert ko.cudagraph_capture_sizes(1024, 8192, 1024)[-1] == 1024
    b200 = {**H200_TP8, "gpu": "b200"}
    old = plan(**b200, vllm_version="0.27.0")["stages"][0]["overhead_breakdown_gib"]["cudagraph"]
    new = plan(**b200, vllm_version="0.28.0")["stages"][0]["overhead_breakdown_gib"]["cudagraph"]
    assert new > old


def test_deepep_buffers_with_expert_parallel_only():
    base = plan(**GREENNODE)["stages"][0]["overhead_breakdown_gib"]["non_torch"]
    deepep = plan(**GREENNODE, all2all_backend="deepep_low_latency")["stages"][0]["overhead_breakdown_gib"]
    # EP 8 inside one node: the NVLink buffer only.
    assert deepep["non_torch"] - base == pytest.approx(1.0, abs=1e-3)
    no_ep = {**GREENNODE, "enable_expert_parallel": False, "all2all_backend": "deepep_low_latency"}
    assert plan(**no_ep)["stages"][0]["overhead_breakdown_gib"]["non_torch"] == base


def test_nccl_init_counts_before_0_11():
    old = plan(**H200_TP8, vllm_version="0.10.2")["stages"][0]["overhead_breakdown_gib"]["non_torch"]
    assert old == pytest.approx(1.38, abs=1e-3)


def test_a_gpu_without_peers_counts_its_libraries_workspaces_and_less_than_with_peers():
    glm = str(paths.FIXTURES / "planner" / "configs" / "GLM-4.7-Flash" / "config.json")
    alone = plan(model=glm, gpu="h100", tp=1, vllm_version="0.27.1")["stages"][0]["overhead_breakdown_gib"]
    assert alone["non_torch"] == pytest.approx(0.33, abs=1e-3)
    paired = plan(model=glm, gpu="h100", tp=2, vllm_version="0.27.1")["stages"][0]["overhead_breakdown_gib"]
    assert 0 < alone["non_torch"] < paired["non_torch"] == pytest.approx(0.95, abs=1e-3)


def test_no_overhead_on_one_cpu_and_the_lab_figures_stay():
    result = plan(model="lab-mini", gpu="cpu", gpu_memory_gib=8, gpu_memory_utilization=0.3)
    assert result["overhead_model"] == "none"
    assert result["stages"][0]["overhead_gib"] == 0


# --- printed tokens, concurrency and the max_num_seqs cap -------------------------------------------------------------


def test_printed_tokens_follow_the_version():
    # 1000 blocks of 16 at a 1,000-token length: 0.23 prints int(1000 / 63 x 1000), 0.20.0 prints 16,000.
    assert ko.logged_kv_tokens(1000, 16, 1, 1000, "0.23.0") == int(1000 / 63 * 1000)
    assert ko.logged_kv_tokens(1000, 16, 1, 1000, "0.20.0") == 16000
    assert ko.logged_kv_tokens(1024, 16, 8, 131072, "0.23.0") == 1024 * 16 * 8


def test_concurrency_is_capped_by_max_num_seqs():
    short = {**H200_TP8, "max_model_len": 256}
    uncapped = plan(**short)
    assert uncapped["max_concurrent_sequences"] == 1024  # vLLM's default max_num_seqs on a large GPU
    assert uncapped["max_concurrency_logged"] > 1024
    assert plan(**short, max_num_seqs=100)["max_concurrent_sequences"] == 100


@pytest.mark.parametrize(
    ("option", "flag"), [("max_num_seqs", "--max-num-seqs"), ("max_num_batched_tokens", "--max-num-batched-tokens")]
)
@pytest.mark.parametrize("value", [0, -4])
def test_non_positive_limits_name_the_flag(option, flag, value):
    with pytest.raises(presets.PlanInputError) as error:
        plan(**H200_TP8, **{option: value})
    assert error.value.flag == flag


def test_unknown_all2all_backend_names_the_flag():
    with pytest.raises(presets.PlanInputError) as error:
        plan(**H200_TP8, all2all_backend="carrier-pigeon")
    assert error.value.flag == "--all2all-backend"


# --- deploying the plan exactly -----------------------------------------------------------------------------------


def test_kv_cache_memory_bytes_is_the_smallest_stage_budget_floored():
    result = plan(**GREENNODE)
    budgets = [stage["kv_cache_gib_per_gpu"] for stage in result["stages"]]
    assert isinstance(result["kv_cache_memory_bytes"], int)
    assert result["kv_cache_memory_bytes"] / GIB == pytest.approx(min(budgets), abs=1e-3)


def test_kv_tokens_deployed_from_that_one_value_on_every_stage():
    result = plan(**GREENNODE)
    budget = result["kv_cache_memory_bytes"]
    # Stage 0 holds 31 layers, stage 1 30: the same bytes give stage 0 fewer blocks, and it decides.
    blocks = min(budget // (64 * layers * 576) for layers in (31, 30))
    assert result["kv_blocks_per_gpu"] == blocks
    assert result["kv_tokens_deployed"] == ko.logged_kv_tokens(blocks, 64, 1, 32768, "0.23.0")
    assert result["kv_tokens_deployed"] <= result["kv_tokens"]


def test_concurrency_is_what_the_one_deployed_budget_holds():
    # Stage 1's budget goes to every worker; stage 0, of one more layer, then holds fewer tokens than the stage that
    # decides kv_tokens: the load test's concurrency must hold under that start too.
    result = plan(**GREENNODE)
    assert result["kv_tokens_deployed"] // 32768 < result["kv_tokens"] // 32768
    assert result["sequences_per_replica"] == result["kv_tokens_deployed"] // 32768
    assert result["max_concurrent_sequences"] == result["sequences_per_replica"]
    assert result["sequences_per_replica"] == int(result["max_concurrency_logged"])


def test_a_deployed_budget_short_of_one_sequence_is_refused():
    options = {**GREENNODE, "gpu_memory_utilization": 0.601, "max_model_len": 262144}
    result = plan(**options)
    # Each stage holds one sequence with its own budget; the smallest budget, given to both, does not.
    assert result["kv_tokens_deployed"] < 262144 <= result["kv_tokens"], "the case no longer sits between the two"
    assert not result["fits"]
    assert result["sequences_per_replica"] == 0
    (reason,) = result["reasons"]
    assert "--kv-cache-memory-bytes" in reason and "kimi_max_model_len" in reason
    # What the reason advises makes the plan fit.
    assert plan(**{**options, "gpu_memory_utilization": 0.62})["fits"]


def test_measured_budget_is_deployed_as_is():
    result = plan(**H200_TP8, kv_cache_gib_per_gpu=20)
    assert result["kv_cache_memory_bytes"] == 20 * GIB
    assert result["kv_tokens_deployed"] == result["kv_tokens"]


def test_a_budget_below_the_overhead_is_refused_naming_the_variable():
    result = plan(**H200_TP8, gpu_memory_utilization=0.55)
    assert not result["fits"]
    reason = result["reasons"][0]
    assert "modelled overhead" in reason
    assert "--gpu-memory-utilization (kimi_gpu_memory_utilization)" in reason


def test_a_measured_budget_that_leaves_no_room_for_the_overhead_is_refused():
    result = plan(**H200_TP8, kv_cache_gib_per_gpu=60)
    assert result["fits"]
    tight = plan(**H200_TP8, kv_cache_gib_per_gpu=1, gpu_memory_utilization=0.55)
    assert not tight["fits"]
    assert "modelled overhead" in tight["reasons"][0]
