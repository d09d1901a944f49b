"""The planner's rules, each pinned with hand-checked numbers (plugins/module_utils/kimi_plan.py, docs/planner.md)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from ansible_collections.kimi.k2.plugins.module_utils import kimi_plan as kp
from ansible_collections.kimi.k2.plugins.module_utils import kimi_plan_options as plan_options
from ansible_collections.kimi.k2.plugins.module_utils import kimi_presets as presets

from tests import paths

GIB = 1024**3
FIXTURES = paths.FIXTURES
# The miniature model config the lab serves (lab/mirrors/hf/config.json, committed in the repository).
LAB_MINI_CONFIG = paths.REPO_ROOT / "lab" / "mirrors" / "hf" / "config.json"
K27 = presets.MODEL_PRESETS["Kimi-K2.7-Code"]
K2_INSTRUCT = presets.MODEL_PRESETS["Kimi-K2-Instruct"]
LAB_MINI = presets.MODEL_PRESETS["lab-mini"]
# The 2-layer miniature the lab's first vLLM figures were measured with (465,920 and 931,968 tokens): its config as it
# was then, kept as the record of that measurement. The lab now serves 4 layers (lab/mirrors/hf/config.json).
LAB_MINI_2_LAYERS_MEASURED = FIXTURES / "lab-mini-2-layers-measured" / "config.json"
LAB_MINI_2_LAYERS = replace(LAB_MINI, num_hidden_layers=2)

# The RTX PRO 6000 guide: Kimi-K2.7-Code on eight RTX PRO 6000 Server Edition, its users-per-card rule (0.90 x
# the 95.6 GiB the driver reports - 3 GiB) and the checkpoint's 595,177,988,208 bytes spread over the eight cards.
SEED_004 = {
    "model": "Kimi-K2.7-Code",
    "weights_bytes": 595_177_988_208,
    "gpu_memory_gib": 95.6,
    "gpus_per_node": 8,
    "gpu_memory_utilization": 0.9,
    "reserve_gib": 3,
    "tp": 8,
    "max_model_len": 131072,
    # The guide's rule (util x memory - reserve - weights), not vLLM's profile: issue 15 kept it as
    # --overhead-model none.
    "overhead_model": "none",
}
# The GreenNode guide: 2 nodes x 8 H100, TP8 x PP2 with EP, "1,040 B params @ fp8 (x1.05)", 0.92 and 4 GiB, fp8
# cache, 32K.
SEED_000 = {
    "model": "Kimi-K2.7-Code",
    "params": 1040e9,
    "weight_bytes_per_param": 1,
    "weight_overhead": 1.05,
    "gpus_per_node": 8,
    "nodes": 2,
    "gpu_memory_utilization": 0.92,
    "reserve_gib": 4,
    "tp": 8,
    "pp": 2,
    "enable_expert_parallel": True,
    "kv_cache_dtype": "fp8",
    "max_model_len": 32768,
    "overhead_model": "none",  # the guide's rule, as SEED_004
}
LAB = {"model": "lab-mini", "gpu": "cpu", "kv_cache_gib_per_gpu": 1}
LAB_MEASURED = {**LAB, "model": str(LAB_MINI_2_LAYERS_MEASURED)}


def plan(**options):
    return plan_options.plan_from_options(options)


# --- MLA KV bytes per token per layer = (kv_lora_rank + qk_rope_head_dim) x dtype bytes -----------------------


def test_mla_kv_bytes_per_token_per_layer():
    assert kp.kv_bytes_per_token_per_layer(K27, "bf16") == (512 + 64) * 2 == 1152
    assert kp.kv_bytes_per_token_per_layer(K27, "fp8") == 576
    assert kp.kv_bytes_per_token_per_layer(LAB_MINI, "bf16") == 1152
    # The RTX PRO 6000 guide: "61 layers store 576 values per token ..., 70,272 bytes in 16-bit".
    assert 61 * kp.kv_bytes_per_token_per_layer(K27, "bf16") == 70_272


def test_kv_bytes_follow_the_config_not_the_head_count():
    other = presets.model_from_config({**json.loads(LAB_MINI_CONFIG.read_text()), "kv_lora_rank": 256}, "x")
    assert kp.kv_bytes_per_token_per_layer(other, "bf16") == (256 + 64) * 2


# --- TP replicates the latent KV on every TP rank ------------------------------------------------------------


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_tp_replicates_latent_kv(tp):
    result = plan(model="Kimi-K2.7-Code", gpu="h200", tp=tp, kv_cache_gib_per_gpu=10, max_model_len=32768)
    # Every TP rank stores all 61 layers of every token: more TP ranks do not add KV tokens.
    assert result["kv_bytes_per_token_per_gpu"] == 70_272
    assert result["kv_tokens"] == (10 * GIB // (16 * 70_272)) * 16 == 152_784


# --- PP splits layers with vLLM's default partition; the largest stage decides ----------------------------------


def test_pp_partition_matches_vllm_get_pp_indices():
    assert kp.pp_partition(61, 2) == [31, 30]
    assert kp.pp_partition(61, 4) == [15, 15, 16, 15]
    assert kp.pp_partition(61, 3) == [20, 21, 20]
    assert kp.pp_partition(20, 4) == [5, 5, 5, 5]
    assert kp.pp_partition(2, 2) == [1, 1]
    assert kp.pp_partition(61, 2, override=[30, 31]) == [30, 31]


def test_pp_partition_override_must_cover_the_layers():
    with pytest.raises(presets.PlanInputError) as error:
        kp.pp_partition(61, 2, override=[30, 30])
    assert error.value.flag == "--pp-layer-partition"


def test_largest_stage_decides_the_tokens():
    result = plan(model="Kimi-K2.7-Code", gpu="h100", tp=8, pp=2, kv_cache_gib_per_gpu=5, max_model_len=32768)
    stage0, stage1 = result["stages"]
    assert (stage0["num_layers"], stage1["num_layers"]) == (31, 30)
    assert stage0["kv_bytes_per_token_per_gpu"] == 31 * 1152
    assert result["limiting_stage"] == 0
    assert result["kv_tokens"] == stage0["kv_tokens"] == (5 * GIB // (16 * 31 * 1152)) * 16
    assert stage1["kv_tokens"] > stage0["kv_tokens"]


def test_pp_layer_partition_override_moves_the_limit():
    result = plan(model="Kimi-K2.7-Code", gpu="h100", tp=8, pp=2, kv_cache_gib_per_gpu=5, pp_layer_partition="30,31")
    assert result["limiting_stage"] == 1
    assert [stage["num_layers"] for stage in result["stages"]] == [30, 31]


# --- the lab's figures -----------------------------------------------------------------------------------------


def test_measured_2_layer_config_is_the_preset_with_2_layers():
    from_file = presets.load_model_config(LAB_MINI_2_LAYERS_MEASURED, "lab-mini")
    assert replace(from_file, source=LAB_MINI.source) == LAB_MINI_2_LAYERS


def test_lab_figure_one_gib_miniature_model_block_128():
    # Measured with the 2-layer miniature: "CPU KV cache size: 465,920 tokens".
    result = plan(**LAB_MEASURED)
    assert result["block_size"] == 128  # vLLM's CPU backend
    assert result["kv_tokens"] == 465_920 == math.floor(2**30 / (2 * 576 * 2) / 128) * 128


def test_lab_figure_with_pp2():
    # Measured with the 2-layer miniature over 2 nodes: 931,968 tokens (one layer per stage).
    result = plan(**LAB_MEASURED, pp=2, nodes=2)
    assert result["kv_tokens"] == 931_968 == math.floor(2**30 / (1 * 576 * 2) / 128) * 128
    assert result["fits"], result["reasons"]


@pytest.mark.parametrize(
    ("pp", "layers_per_stage", "tokens_block_16", "tokens_block_128"),
    [
        (1, [4], 233_008, 232_960),
        (2, [2, 2], 466_032, 465_920),
        (3, [1, 2, 1], 466_032, 465_920),
        (4, [1, 1, 1, 1], 932_064, 931_968),
    ],
)
def test_lab_figures_of_the_4_layer_miniature(pp, layers_per_stage, tokens_block_16, tokens_block_128):
    # What the lab's `make demo NODES=pp` (PP = nodes) plans; the serve phase compares vLLM's logged KV tokens with
    # it. Blocks of 16 tokens without AMX (CPU_MLA), 128 with (lab/labctl/inventory.py cpu_kv_block_size).
    for block, tokens in ((16, tokens_block_16), (128, tokens_block_128)):
        result = plan(**LAB, pp=pp, nodes=pp, max_model_len=2048, block_size=block)
        assert [stage["num_layers"] for stage in result["stages"]] == layers_per_stage
        most = max(layers_per_stage)
        assert result["kv_tokens"] == tokens == math.floor(2**30 / (most * 576 * 2) / block) * block
        assert result["fits"], result["reasons"]


@pytest.mark.parametrize("pp", [5, 8])
def test_more_stages_than_layers_is_the_only_reason(pp):
    """A lab of 5..8 nodes (PP = nodes) leaves a stage without layers: the layout is the reason, not the memory
    figures derived from it (an empty stage has 0 tokens, which once read as "stage 0 has 1.00 GiB per GPU
    (0 tokens)")."""
    result = plan(**LAB, pp=pp, nodes=pp, max_model_len=2048, block_size=16)
    assert result["fits"] is False
    assert result["reasons"] == [
        f"PP {pp} exceeds the 4 layers of lab-mini (kimi_pipeline_parallel_size={pp} leaves a pipeline stage "
        "without layers)"
    ]


# --- DCP divides a sequence's KV over DCP ranks (dcp must divide tp) ------------------------------------------------


def test_dcp_divides_kv_per_gpu_and_multiplies_tokens():
    base = plan(model="Kimi-K2.7-Code", gpu="h200", tp=8, kv_cache_gib_per_gpu=10, max_model_len=131072)
    dcp8 = plan(model="Kimi-K2.7-Code", gpu="h200", tp=8, dcp=8, kv_cache_gib_per_gpu=10, max_model_len=131072)
    assert dcp8["kv_bytes_per_token_per_gpu"] == 70_272 // 8 == 8_784
    assert dcp8["kv_tokens"] == base["kv_tokens"] * 8
    assert dcp8["kv_gib_per_sequence_per_gpu"] == pytest.approx(base["kv_gib_per_sequence_per_gpu"] / 8, abs=1e-4)


def test_dcp_must_divide_tp():
    result = plan(model="Kimi-K2.7-Code", gpu="h200", tp=8, dcp=3, max_model_len=32768)
    assert not result["fits"]
    assert any(
        "kimi_decode_context_parallel_size=3 must divide kimi_tensor_parallel_size=8" in reason
        for reason in result["reasons"]
    )


# --- DP attention gives each DP rank its own KV --------------------------------------------------------------------


def test_dp_ranks_each_hold_their_own_kv():
    one = plan(model="Kimi-K2.7-Code", gpu="h200", tp=8, kv_cache_gib_per_gpu=20, max_model_len=32768)
    two = plan(
        model="Kimi-K2.7-Code",
        gpu="h200",
        tp=8,
        dp=2,
        nodes=2,
        enable_expert_parallel=True,
        kv_cache_gib_per_gpu=20,
        max_model_len=32768,
    )
    assert two["kv_tokens"] == one["kv_tokens"]  # per replica
    assert two["replicas"] == 2
    assert two["max_concurrent_sequences"] == 2 * (one["kv_tokens"] // 32768)


def test_dp_defaults_to_one_and_unused_nodes_are_a_reason():
    result = plan(model="Kimi-K2.7-Code", gpu="h200", tp=8, nodes=2, enable_expert_parallel=True, max_model_len=32768)
    assert result["dp"] == 1
    assert result["ep_size"] == 8
    assert not result["fits"]
    assert "layout needs 8 GPUs" in result["reasons"][0]
    assert "but kimi_nodes has 2 node(s) x kimi_gpus_per_node 8 = 16" in result["reasons"][0]
    assert plan(model="Kimi-K2.7-Code", gpu="h200", tp=8, dp=2, nodes=2, max_model_len=32768)["ep_size"] is None


# --- expert parallelism shards routed experts (EP = tp x dp); the rest is replicated or TP-sharded ---------------


def test_int4_routed_expert_bytes():
    # gate and up [2048, 7168], down [7168, 2048]: int4 packed (0.5 B) + one BF16 scale per 32 inputs.
    gate = 2048 * 7168 // 2 + 2048 * (7168 // 32) * 2
    down = 7168 * 2048 // 2 + 7168 * (2048 // 32) * 2
    fmt = presets.K2_INT4.format_for("model.layers.1.mlp.experts.0.gate_proj")
    assert fmt.linear_bytes(2048, 7168) == gate == 8_257_536
    assert 2 * gate + down == 24_772_608
    assert (2 * gate + down) / (3 * 2048 * 7168) == pytest.approx(0.5625)


def test_fp8_block_expert_bytes():
    # one byte per weight plus one fp32 scale per 128 x 128 block: 16 x 56 blocks.
    fmt = presets.K2_FP8.format_for("model.layers.1.mlp.experts.0.gate_proj")
    assert fmt.linear_bytes(2048, 7168) == 2048 * 7168 + 16 * 56 * 4 == 14_683_648


def test_ep_shards_whole_experts_over_tp_times_dp():
    per_expert = 24_772_608
    for tp, dp in ((8, 1), (8, 2), (16, 1)):
        moe = kp._moe_bytes(K27, 1, kp.Sharding(tp, dp, expert_parallel=True))
        assert moe["routed_experts"] == math.ceil(384 / (tp * dp)) * per_expert
    # 384 experts over 5 ranks: the largest rank holds ceil(384 / 5) = 77.
    assert kp._moe_bytes(K27, 1, kp.Sharding(5, 1, True))["routed_experts"] == 77 * per_expert


def test_without_ep_experts_are_tp_sharded_over_tp_times_dp():
    ep = kp._moe_bytes(K27, 1, kp.Sharding(8, 2, expert_parallel=True))
    tp_sharded = kp._moe_bytes(K27, 1, kp.Sharding(8, 2, expert_parallel=False))
    assert tp_sharded["routed_experts"] == ep["routed_experts"]  # 384 x 1/16 of each expert == 24 whole experts


def test_dp_does_not_shard_attention_or_shared_expert():
    def stage(tp, dp):
        return kp.stage_weight_bytes(
            K27,
            range(61),
            first_stage=True,
            last_stage=True,
            sharding=kp.Sharding(tp, dp, True),
            include_vision=False,
        )

    tp8, tp8_dp2 = stage(8, 1), stage(8, 2)
    for key in ("attention", "shared_experts", "dense_mlp", "embedding", "lm_head", "router"):
        assert tp8[key] == tp8_dp2[key], key
    assert tp8_dp2["routed_experts"] * 2 == tp8["routed_experts"]


def test_attention_keeps_replicated_projections_on_every_rank():
    one, eight = (kp._attention_bytes(K27, 1, tp)["attention"] for tp in (1, 8))
    # q_a_proj [1536, 7168] and kv_a_proj_with_mqa [576, 7168] in BF16 stay whole on each rank.
    replicated = (1536 + 576) * 7168 * 2
    assert eight == replicated + (one - replicated) // 8
    assert eight > one / 8


def test_block_fp8_refuses_shards_smaller_than_a_block():
    result = plan(model="Kimi-K2-Instruct", gpu="h100", tp=32, nodes=4, max_model_len=131072)
    assert not result["fits"]
    assert any("128-wide quantization block" in reason for reason in result["reasons"])


# --- per-GPU weights from the component breakdown, not total / GPUs ---------------------------------------------


def test_component_breakdown_matches_the_published_checkpoint_size():
    estimate = kp.checkpoint_weight_bytes(K27)
    assert K27.checkpoint_bytes == 595_177_988_208
    assert abs(estimate - K27.checkpoint_bytes) / K27.checkpoint_bytes < 0.001


def test_lab_mini_breakdown_matches_its_bf16_safetensors():
    # The 2-layer miniature's model.safetensors held 8,463,392 bytes of BF16 tensors (docs/lab-measurements.md); the
    # 4-layer one the lab builds now holds 15,750,752 (its safetensors header's data offsets).
    assert kp.checkpoint_weight_bytes(LAB_MINI_2_LAYERS) == 8_463_392
    assert kp.checkpoint_weight_bytes(LAB_MINI) == 15_750_752


def test_component_breakdown_differs_from_even_split():
    common = {"model": "Kimi-K2.7-Code", "gpu": "h200", "tp": 8, "max_model_len": 131072}
    even = plan(**common, weights_bytes=595_177_988_208)
    component = plan(**common)
    assert even["weights_source"] == "even-split"
    assert component["weights_source"] == "component-breakdown"
    assert even["weights_gib_per_gpu"] == pytest.approx(595_177_988_208 / 8 / GIB, abs=1e-4)
    # Replicated projections and a whole vision encoder per GPU make the real share larger than total / 8.
    assert component["weights_gib_per_gpu"] > even["weights_gib_per_gpu"] + 1
    breakdown = component["stages"][0]["weights_breakdown_gib"]
    assert breakdown["vision_encoder"] == pytest.approx(400e6 * 2 / GIB, abs=1e-4)


def test_language_model_only_drops_the_vision_encoder():
    with_vision = plan(model="Kimi-K2.7-Code", gpu="h200", tp=8, max_model_len=131072)
    without = plan(model="Kimi-K2.7-Code", gpu="h200", tp=8, max_model_len=131072, language_model_only=True)
    assert "vision_encoder" not in without["stages"][0]["weights_breakdown_gib"]
    assert with_vision["weights_gib_per_gpu"] - without["weights_gib_per_gpu"] == pytest.approx(0.7451, abs=1e-3)


def test_fp8_checkpoint_keeps_a_bf16_copy_of_kv_b_proj():
    parts = kp._attention_bytes(K2_INSTRUCT, 1, 8)
    assert parts["mla_absorbed_bf16"] == 8 * 256 * 512 * 2  # 64 heads / 8 x (128 + 128) x 512 in BF16
    assert kp._attention_bytes(K27, 1, 8)["mla_absorbed_bf16"] == 0  # BF16 kv_b_proj is used in place


def test_pp_stages_hold_embedding_first_and_lm_head_last():
    stages = plan(model="Kimi-K2.7-Code", gpu="h100", tp=8, pp=2, nodes=2, max_model_len=32768)["stages"]
    assert "embedding" in stages[0]["weights_breakdown_gib"]
    assert "lm_head" not in stages[0]["weights_breakdown_gib"]
    assert "lm_head" in stages[1]["weights_breakdown_gib"]
    assert "dense_mlp" not in stages[1]["weights_breakdown_gib"]


# --- KV cache = util x reported memory - reserve - weights; a measured budget replaces it --------------------------


def test_kv_budget_rule():
    result = plan(**SEED_004)
    assert result["usable_gib_per_gpu"] == pytest.approx(0.9 * 95.6 - 3)
    assert result["kv_cache_gib_per_gpu"] == pytest.approx(0.9 * 95.6 - 3 - 595_177_988_208 / 8 / GIB, abs=1e-4)


def test_measured_kv_budget_replaces_the_computed_one():
    result = plan(**SEED_004, kv_cache_gib_per_gpu=2.5)
    assert result["kv_cache_source"] == "measured"
    assert result["kv_cache_gib_per_gpu"] == 2.5
    assert result["kv_tokens"] == (int(2.5 * GIB) // (16 * 70_272)) * 16


def test_kv_tokens_are_whole_blocks():
    budget = (0.9 * 95.6 - 3) * GIB - 595_177_988_208 / 8
    for block in (16, 32, 128):
        result = plan(**SEED_004, block_size=block)
        assert result["kv_tokens"] % block == 0
        assert result["kv_tokens"] == int(budget // (block * 70_272)) * block
    assert plan(**SEED_004)["block_size"] == 16
    assert plan(**SEED_004, block_size=128)["kv_tokens"] < plan(**SEED_004)["kv_tokens"]


def test_weights_that_do_not_fit_name_both_numbers():
    result = plan(model="Kimi-K2-Instruct", gpu="h100", tp=8, max_model_len=131072)
    assert not result["fits"]
    reason = result["reasons"][0]
    # Issue 15: the budget starts from the CUDA-visible total (79.19 GiB on an H100), not nvidia-smi's 79.65.
    assert "stage 0: weights" in reason and "exceed 0.9 x 79.19 GiB" in reason
    assert "modelled overhead" in reason


def test_gpu_count_must_match_the_nodes():
    result = plan(model="Kimi-K2.7-Code", gpu="h100", tp=8, pp=2, dp=1, nodes=3, max_model_len=32768)
    assert not result["fits"]
    assert result["reasons"][0] == (
        "layout needs 16 GPUs (kimi_tensor_parallel_size 8 x kimi_pipeline_parallel_size 2 x "
        "kimi_data_parallel_size 1) but kimi_nodes has 3 node(s) x kimi_gpus_per_node 8 = 24"
    )


# --- the RTX PRO 6000 guide's figures, exactly ---------------------------------------------------------------------


def test_rtx_pro_6000_guide_card_budget_and_one_session_under_tp():
    result = plan(**SEED_004)
    assert round(result["kv_cache_gib_per_gpu"], 1) == 13.8
    assert round(result["usable_gib_per_gpu"] * 8, 1) == 664.3
    assert round(result["weights_gib_per_gpu"] * 8, 1) == 554.3
    assert round(result["weights_gib_per_gpu"], 1) == 69.3
    assert result["max_concurrent_sequences"] == 1
    assert result["fits"]


def test_rtx_pro_6000_guide_dcp8_twelve_sessions_in_16_bit_and_25_in_fp8():
    assert plan(**SEED_004, dcp=8)["max_concurrent_sequences"] == 12
    assert plan(**SEED_004, dcp=8, kv_cache_dtype="fp8")["max_concurrent_sequences"] == 25
    # "a 128K session costs about 1.07 GiB per card with DCP 8"
    assert round(plan(**SEED_004, dcp=8)["kv_gib_per_sequence_per_gpu"], 2) == 1.07


def test_rtx_pro_6000_guide_256k_session_needs_17_16_gib_and_does_not_fit_under_tp():
    result = plan(**{**SEED_004, "max_model_len": 262144})
    assert round(result["kv_gib_per_sequence_per_gpu"], 2) == 17.16
    assert not result["fits"]
    assert "17.16 GiB of KV cache per GPU" in result["reasons"][0]
    assert "13.75 GiB" in result["reasons"][0]


def test_rtx_pro_6000_guide_with_the_rtx_pro_preset_keeps_the_session_counts():
    # The preset holds what the driver reports (97887 MiB = 95.59 GiB); the RTX PRO 6000 guide rounds it to 95.6.
    options = {**SEED_004, "gpu": "rtx-pro-6000-server"}
    del options["gpu_memory_gib"]
    result = plan(**options)
    assert result["kv_cache_gib_per_gpu"] == pytest.approx(13.746, abs=1e-3)
    assert result["max_concurrent_sequences"] == 1
    assert plan(**options, dcp=8)["max_concurrent_sequences"] == 12
    assert plan(**options, dcp=8, kv_cache_dtype="fp8")["max_concurrent_sequences"] == 25


def test_suggestions_name_the_dcp_gain():
    texts = [item["text"] for item in plan(**SEED_004)["suggestions"]]
    assert "DCP 8 would hold 8x the KV tokens: 12 full-length sequences instead of 1" in texts


# --- the GreenNode guide: its pooled arithmetic only on request, and the per-GPU answer ----------------------------


def test_greennode_guide_pooled_arithmetic_reproduced_on_request():
    pooled = plan(**SEED_000, gpu_memory_gib=80, pooled=True)
    assert pooled["mode"] == "pooled" and "POOLED" in pooled["warning"]
    assert pooled["total_gpu_gib"] == 1280.0
    assert pooled["usable_gib"] == 1113.6
    assert round(pooled["weights_gib"], 1) == 1017.0
    assert round(pooled["kv_pool_gib"], 1) == 96.6
    assert round(pooled["kv_bytes_per_token"] / 1024, 1) == 34.3
    assert pooled["kv_tokens"] == 2_951_927
    assert round(pooled["kv_gib_per_sequence"], 1) == 1.1
    assert pooled["max_concurrent_sequences"] == 90


def test_greennode_guide_shape_per_gpu_is_not_pooled():
    per_gpu = plan(**SEED_000, gpu="h100")
    assert per_gpu["mode"] == "per-gpu"
    assert per_gpu["weights_gib_per_gpu"] == pytest.approx(1017.0 / 16, abs=0.01)
    assert per_gpu["kv_bytes_per_token_per_gpu"] == 31 * 576
    assert per_gpu["max_concurrent_sequences"] == 10  # not ~90
    # With what vLLM loads for the real INT4 checkpoint instead of the guide's "1,040 B params @ fp8":
    options = {k: v for k, v in SEED_000.items() if not k.startswith(("params", "weight_"))}
    assert plan(**options, gpu="h100")["max_concurrent_sequences"] == 60


# --- presets ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["Kimi-K2-Instruct", "Kimi-K2-Instruct-0905", "Kimi-K2-Thinking", "Kimi-K2.7-Code"])
def test_kimi_presets_share_the_k2_architecture(name):
    spec = presets.MODEL_PRESETS[name]
    assert (spec.num_hidden_layers, spec.first_k_dense_replace, spec.hidden_size) == (61, 1, 7168)
    assert (spec.n_routed_experts, spec.n_shared_experts, spec.moe_intermediate_size) == (384, 1, 2048)
    assert (spec.intermediate_size, spec.q_lora_rank, spec.kv_lora_rank) == (18432, 1536, 512)
    assert (spec.qk_rope_head_dim, spec.qk_nope_head_dim, spec.v_head_dim) == (64, 128, 128)
    assert (spec.num_attention_heads, spec.vocab_size) == (64, 163840)


def test_quantization_of_the_presets():
    assert K2_INSTRUCT.quantization.format_for("model.layers.5.self_attn.q_b_proj").kind == "fp8_block"
    assert K2_INSTRUCT.quantization.format_for("lm_head").kind == "bf16"
    for name in ("Kimi-K2-Thinking", "Kimi-K2.7-Code"):
        q = presets.MODEL_PRESETS[name].quantization
        assert q.format_for("model.layers.5.mlp.experts.7.down_proj").kind == "int_group"
        for module in (
            "model.layers.5.self_attn.kv_b_proj",
            "model.layers.5.mlp.shared_experts.up_proj",
            "model.layers.0.mlp.gate_proj",
            "lm_head",
        ):
            assert q.format_for(module).kind == "bf16", module


def test_lab_mini_equals_the_reference_config():
    from_file = presets.load_model_config(LAB_MINI_CONFIG, "lab-mini")
    assert replace(from_file, source=LAB_MINI.source) == LAB_MINI


def test_model_path_is_accepted(tmp_path):
    config = json.loads(LAB_MINI_2_LAYERS_MEASURED.read_text())
    (tmp_path / "config.json").write_text(json.dumps(config))
    result = plan(model=str(tmp_path), gpu="cpu", kv_cache_gib_per_gpu=1)
    assert result["kv_tokens"] == 465_920


def test_config_with_text_config_and_compressed_tensors():
    config = {
        "vision_config": {"hidden_size": 1152},
        "text_config": {
            **json.loads(LAB_MINI_CONFIG.read_text()),
            "quantization_config": {
                "quant_method": "compressed-tensors",
                "format": "pack-quantized",
                "config_groups": {
                    "group_0": {"weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32}}
                },
                "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*"],
            },
        },
    }
    spec = presets.model_from_config(config, "nested")
    assert spec.num_hidden_layers == 4
    assert spec.vision_params == presets.MOONVIT_PARAMS
    assert spec.quantization.format_for("model.layers.1.mlp.experts.3.up_proj").group_size == 32
    assert spec.quantization.format_for("model.layers.1.self_attn.o_proj").kind == "bf16"


@pytest.mark.parametrize(
    ("changes", "drop", "words"),
    [
        # DeepSeek-V3.2's config keys for its lightning indexer.
        ({"index_topk": 2048, "index_n_heads": 64, "index_head_dim": 128}, (), "sparse-attention indexer"),
        # A Llama/Qwen-shaped attention: KV heads and a head size, no latent cache.
        ({"num_key_value_heads": 8, "head_dim": 128}, ("kv_lora_rank",), "is a GQA/MHA model (8 KV heads"),
        ({"n_routed_experts": 0}, (), "is a dense model (n_routed_experts is 0"),
    ],
    ids=["deepseek-v3.2-indexer", "gqa", "dense"],
)
def test_a_model_whose_cache_the_planner_does_not_model_is_refused_saying_what_is_missing(changes, drop, words):
    config = {**json.loads(LAB_MINI_CONFIG.read_text()), **changes}
    for key in drop:
        config.pop(key)
    with pytest.raises(ValueError, match="the planner cannot plan other") as refused:
        presets.model_from_config(config, "other", "other/config.json")
    assert words in str(refused.value)


def test_a_config_file_the_planner_cannot_plan_is_refused_naming_the_option(tmp_path):
    config = {**json.loads(LAB_MINI_CONFIG.read_text()), "index_topk": 2048}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(presets.PlanInputError) as refused:
        presets.find_model(str(tmp_path))
    assert refused.value.flag == "--model" and "sparse-attention indexer" in refused.value.message


def test_unsupported_quantization_is_refused():
    with pytest.raises(ValueError, match="unsupported quant_method"):
        presets.quantization_from_config({"quantization_config": {"quant_method": "awq"}})


@pytest.mark.parametrize(
    ("name", "mib"),
    [
        ("h100-80gb", 81559),
        ("NVIDIA H100 80GB HBM3", 81559),
        ("h200", 143771),
        ("h200-nvl", 143771),
        ("rtx-pro-6000-server", 97887),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", 97887),
        ("b200", 183359),
    ],
)
def test_gpu_presets_hold_what_the_driver_reports(name, mib):
    spec = presets.find_gpu(name)
    assert spec.memory_mib == mib
    assert spec.source


def test_cpu_pseudo_gpu_needs_its_memory():
    with pytest.raises(presets.PlanInputError) as error:
        plan(model="lab-mini", gpu="cpu")
    assert error.value.flag == "--gpu-memory-gib"
    result = plan(model="lab-mini", gpu="cpu", gpu_memory_gib=8, gpu_memory_utilization=0.3, reserve_gib=0)
    assert result["kv_cache_gib_per_gpu"] == pytest.approx(0.3 * 8 - kp.checkpoint_weight_bytes(LAB_MINI) / GIB, 1e-3)


def test_driver_name_lookup():
    assert presets.gpu_preset_for_driver_name("NVIDIA H200").key == "h200"
    assert presets.gpu_preset_for_driver_name("NVIDIA H200 NVL").key == "h200-nvl"
    assert presets.gpu_preset_for_driver_name("NVIDIA A100-SXM4-80GB") is None


# --- option validation ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "flag"),
    [
        ({"tp": 0}, "--tp"),
        ({"tp": "two"}, "--tp"),
        ({"pp": 1.5}, "--pp"),
        ({"gpu_memory_utilization": 1.2}, "--gpu-memory-utilization"),
        ({"kv_cache_dtype": "int8"}, "--kv-cache-dtype"),
        ({"model": "Kimi-K9"}, "--model"),
        ({"gpu": "a100"}, "--gpu"),
        ({"params": 1e12}, "--params"),
        ({"weights_bytes": 10, "params": 10, "weight_bytes_per_param": 1}, "--weights-bytes"),
        ({"weight_overhead": 1.05}, "--weight-overhead"),
        ({"frobnicate": 1}, "--frobnicate"),
    ],
)
def test_bad_options_name_the_flag(options, flag):
    with pytest.raises(presets.PlanInputError) as error:
        plan(**{"gpu": "h200", **options})
    assert error.value.flag == flag


# --- Kimi-K2.5 and K2.6: K2.7-Code's architecture (the vLLM recipe), their own repository and checkpoint ------------


@pytest.mark.parametrize("name", ["Kimi-K2.5", "Kimi-K2.6"])
def test_k25_and_k26_are_k27_codes_architecture_with_their_own_repository_and_checkpoint(name):
    preset = presets.MODEL_PRESETS[name]
    different = {"name", "repo_id", "checkpoint_bytes", "source"}
    assert {k: v for k, v in vars(preset).items() if k not in different} == {
        k: v for k, v in vars(K27).items() if k not in different
    }
    assert preset.repo_id == f"moonshotai/{name}" and preset.checkpoint_bytes == 595_148_192_736
    # The same shape plans the same (the weights come from the component breakdown): only the names differ.
    shape = {"gpu": "h200", "tp": 8, "kv_cache_gib_per_gpu": 10, "max_model_len": 131072}
    mine, k27 = plan(model=name, **shape), plan(model="Kimi-K2.7-Code", **shape)
    assert {k for k in mine if mine[k] != k27[k]} == {"model", "model_source"}
    assert mine["kv_tokens"] == 152_784
