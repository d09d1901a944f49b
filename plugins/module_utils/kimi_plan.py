"""Per-GPU memory planner for vLLM serving Kimi K2-family checkpoints (MLA attention, MoE experts).

It computes what vLLM will allocate on each GPU of a layout (tp, pp, dp, dcp, expert parallel), not what the
pooled memory of all GPUs would allow: under tensor parallelism vLLM keeps the whole MLA latent KV cache on every
TP rank, so pooling all GPUs' memory overstates the KV tokens by the TP factor (docs/planner.md).

This file is the arithmetic. The layout's rules (shared with the inventory check and the serve argv) are in
kimi_layout.py, the presets (models, GPUs) in kimi_presets.py, the options shared by bin/kimi-plan and the
kimi_plan module in kimi_plan_options.py, the text in kimi_plan_render.py and the command line in
kimi_plan_cli.py. Stdlib only and free of Ansible imports. Every rule carries a comment naming the
vLLM source or document it follows; the numbers behind each preset name their source too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from .kimi_layout import GPU_COUNT, Layout, layout_problems
from .kimi_overhead import (
    DEFAULT_ALL2ALL_BACKEND,
    PINNED_VLLM_VERSION,
    OverheadInputs,
    logged_concurrency,
    logged_kv_tokens,
    requested_bytes,
    stage_overhead_bytes,
    supports_kv_cache_memory_bytes,
)
from .kimi_presets import BF16_BYTES, FP32_BYTES, GIB, UNQUANTIZED, GpuSpec, ModelSpec, PlanInputError, WeightFormat

# ---------------------------------------------------------------------------------------------------------
# How vLLM splits the layers over pipeline stages and pages the KV cache
# ---------------------------------------------------------------------------------------------------------


def pp_partition(num_layers: int, pp: int, override: Sequence[int] | None = None) -> list[int]:
    """Decoder layers per pipeline stage, as vLLM's get_pp_indices splits them.

    vllm/distributed/utils.py get_pp_indices: without VLLM_PP_LAYER_PARTITION every stage gets
    num_layers // pp layers and the remainder goes one layer each to the stages before the last one, counting
    back from the second-to-last (the last stage also holds the final norm and LM head). 61 layers over 2
    stages: [31, 30]. VLLM_PP_LAYER_PARTITION ("31,30") overrides it when it has pp entries summing to the
    layer count.
    """
    if override is not None:
        parts = [int(part) for part in override]
        if len(parts) != pp or sum(parts) != num_layers or min(parts) < 1:
            raise PlanInputError(
                "--pp-layer-partition",
                f"{','.join(map(str, parts))} must have {pp} positive entries summing to {num_layers} layers",
            )
        return parts
    parts = [num_layers // pp] * pp
    for offset in range(2, num_layers % pp + 2):
        parts[-offset] += 1
    return parts


def kv_bytes_per_token_per_layer(model: ModelSpec, kv_cache_dtype: str) -> int:
    """MLA KV bytes per token and layer: (kv_lora_rank + qk_rope_head_dim) x dtype bytes.

    vLLM sizes a dense MLA cache as one head of kv_lora_rank + qk_rope_head_dim values (MLAAttentionSpec with
    num_kv_heads=1, head_size=kv_lora_rank + qk_rope_head_dim): 576 x 2 B in BF16, 576 x 1 B in FP8. The
    656-byte FP8 layout with scales belongs to the sparse-MLA backends only.
    """
    return model.kv_values_per_token_per_layer * kv_dtype_bytes(kv_cache_dtype)


def kv_dtype_bytes(kv_cache_dtype: str) -> int:
    return 1 if kv_cache_dtype.startswith("fp8") else 2


def tokens_in_budget(budget_bytes: float, bytes_per_token_on_gpu: int, block_size: int, dcp: int) -> int:
    """Tokens one replica holds, in whole blocks, from one GPU's KV budget.

    vllm/v1/core/kv_cache_utils.py: num_blocks = available_memory // page_size // num_layers (page = block_size
    tokens of one layer), reported tokens = num_blocks x block_size, multiplied by the DCP size ("Multiplying
    the GPU KV cache size by the dcp_world_size"): each DCP rank stores every dcp-th token of a sequence.
    """
    if budget_bytes <= 0 or bytes_per_token_on_gpu <= 0:
        return 0
    blocks = int(budget_bytes // (block_size * bytes_per_token_on_gpu))
    return blocks * block_size * dcp


# ---------------------------------------------------------------------------------------------------------
# Per-GPU weight bytes from the component breakdown of config.json and its quantization
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sharding:
    """How one rank's share of each component is cut."""

    tp: int
    dp: int
    expert_parallel: bool

    @property
    def moe_group(self) -> int:
        # vLLM's data-parallel doc: "expert layers form a tensor parallel group of size DP x TP" by default, or an
        # expert-parallel group of the same size with --enable-expert-parallel (EP_SIZE = TP_SIZE x DP_SIZE,
        # docs/serving/expert_parallel_deployment.md). Attention, the dense layer, the shared expert and the
        # embeddings stay tensor-parallel inside each DP rank.
        return self.tp * self.dp


def _attention_bytes(model: ModelSpec, layer: int, tp: int) -> dict[str, int]:
    """One MLA layer on one TP rank (DeepseekV2MLAAttention in vllm/model_executor/models/deepseek_v2.py)."""
    q = model.quantization
    prefix = f"model.layers.{layer}.self_attn"
    heads = math.ceil(model.num_attention_heads / tp)
    qk_head = model.qk_nope_head_dim + model.qk_rope_head_dim
    replicated = q.format_for(f"{prefix}.kv_a_proj_with_mqa").linear_bytes(
        model.kv_values_per_token_per_layer, model.hidden_size
    )
    sharded = 0
    norms = model.kv_lora_rank * BF16_BYTES
    if model.q_lora_rank:
        # q_a_proj and kv_a_proj_with_mqa are replicated on every TP rank (vLLM fuses them into one
        # ReplicatedLinear-like fused_qkv_a_proj); q_b_proj, kv_b_proj (ColumnParallel) and o_proj (RowParallel)
        # are split by heads.
        replicated += q.format_for(f"{prefix}.q_a_proj").linear_bytes(model.q_lora_rank, model.hidden_size)
        sharded += q.format_for(f"{prefix}.q_b_proj").linear_bytes(heads * qk_head, model.q_lora_rank)
        norms += model.q_lora_rank * BF16_BYTES
    else:
        sharded += q.format_for(f"{prefix}.q_proj").linear_bytes(heads * qk_head, model.hidden_size)
    kv_b_format = q.format_for(f"{prefix}.kv_b_proj")
    kv_b_out = heads * (model.qk_nope_head_dim + model.v_head_dim)
    sharded += kv_b_format.linear_bytes(kv_b_out, model.kv_lora_rank)
    sharded += q.format_for(f"{prefix}.o_proj").linear_bytes(model.hidden_size, heads * model.v_head_dim)
    # MLA backends absorb kv_b_proj into W_UK_T/W_UV after loading (MLACommonImpl.process_weights_after_loading):
    # a quantized kv_b_proj is dequantized into a new BF16 tensor that stays beside the original.
    absorbed = 0 if kv_b_format.kind == "bf16" else kv_b_out * model.kv_lora_rank * BF16_BYTES
    return {
        "attention": replicated + sharded,
        "mla_absorbed_bf16": absorbed,
        "norms": norms + 2 * model.hidden_size * BF16_BYTES,
    }


def _mlp_bytes(fmt_gate_up: WeightFormat, fmt_down: WeightFormat, hidden: int, intermediate: int) -> int:
    """A SwiGLU MLP shard: gate and up [intermediate, hidden], down [hidden, intermediate]."""
    return 2 * fmt_gate_up.linear_bytes(intermediate, hidden) + fmt_down.linear_bytes(hidden, intermediate)


def _moe_bytes(model: ModelSpec, layer: int, sharding: Sharding) -> dict[str, int]:
    """One MoE layer on one rank: router, shared expert(s) and this rank's share of the routed experts."""
    q = model.quantization
    prefix = f"model.layers.{layer}.mlp"
    # The router (mlp.gate) is built without a quant method, BF16 weight plus an fp32 e_score_correction_bias,
    # replicated on every rank.
    router = model.n_routed_experts * model.hidden_size * BF16_BYTES + model.n_routed_experts * FP32_BYTES
    shared_inter = math.ceil(model.moe_intermediate_size * model.n_shared_experts / sharding.tp)
    shared = _mlp_bytes(
        q.format_for(f"{prefix}.shared_experts.gate_proj"),
        q.format_for(f"{prefix}.shared_experts.down_proj"),
        model.hidden_size,
        shared_inter,
    )
    gate_up = q.format_for(f"{prefix}.experts.0.gate_proj")
    down = q.format_for(f"{prefix}.experts.0.down_proj")
    group = sharding.moe_group
    if sharding.expert_parallel:
        # determine_expert_map gives each EP rank n // ep experts and the first n % ep ranks one more: the
        # largest rank holds ceil(n / ep) whole experts.
        experts = math.ceil(model.n_routed_experts / group)
        routed = experts * _mlp_bytes(gate_up, down, model.hidden_size, model.moe_intermediate_size)
    else:
        inter = math.ceil(model.moe_intermediate_size / group)
        routed = model.n_routed_experts * _mlp_bytes(gate_up, down, model.hidden_size, inter)
    return {"router": router, "shared_experts": shared, "routed_experts": routed}


def stage_weight_bytes(
    model: ModelSpec,
    layers: range,
    *,
    first_stage: bool,
    last_stage: bool,
    sharding: Sharding,
    include_vision: bool,
) -> dict[str, int]:
    """Bytes of each component on one GPU of one pipeline stage."""
    totals = dict.fromkeys(
        (
            "embedding",
            "attention",
            "mla_absorbed_bf16",
            "norms",
            "dense_mlp",
            "router",
            "shared_experts",
            "routed_experts",
        ),
        0,
    )
    tp = sharding.tp
    for layer in layers:
        for key, value in _attention_bytes(model, layer, tp).items():
            totals[key] += value
        if model.is_moe_layer(layer):
            for key, value in _moe_bytes(model, layer, sharding).items():
                totals[key] += value
        else:
            prefix = f"model.layers.{layer}.mlp"
            totals["dense_mlp"] += _mlp_bytes(
                model.quantization.format_for(f"{prefix}.gate_proj"),
                model.quantization.format_for(f"{prefix}.down_proj"),
                model.hidden_size,
                math.ceil(model.intermediate_size / tp),
            )
    # VocabParallelEmbedding and ParallelLMHead split the vocabulary over TP ranks; with PP the embedding lives
    # on the first stage, the final norm and LM head on the last (PPMissingLayer elsewhere).
    vocab_shard = math.ceil(model.vocab_size / tp)
    if first_stage:
        totals["embedding"] = vocab_shard * model.hidden_size * BF16_BYTES
    if last_stage:
        totals["norms"] += model.hidden_size * BF16_BYTES
        if not (model.tie_word_embeddings and first_stage):
            totals["lm_head"] = UNQUANTIZED.linear_bytes(vocab_shard, model.hidden_size)
    if include_vision and first_stage and model.vision_params:
        # --mm-encoder-tp-mode data (the GreenNode and RTX PRO 6000 guides) keeps a whole BF16 copy of the encoder
        # on each GPU.
        totals["vision_encoder"] = model.vision_params * BF16_BYTES
    return {key: value for key, value in totals.items() if value}


def checkpoint_weight_bytes(model: ModelSpec, *, include_vision: bool = True) -> int:
    """Weight bytes of one unsharded copy (tp = dp = pp = 1) as stored: the component estimate of the checkpoint
    (without the BF16 copies vLLM derives after loading)."""
    components = stage_weight_bytes(
        model,
        range(model.num_hidden_layers),
        first_stage=True,
        last_stage=True,
        sharding=Sharding(1, 1, expert_parallel=False),
        include_vision=include_vision,
    )
    return sum(value for key, value in components.items() if key != "mla_absorbed_bf16")


# ---------------------------------------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanInputs:
    """Everything one plan depends on, already validated."""

    model: ModelSpec
    gpu: GpuSpec | None
    gpu_memory_gib: float | None
    gpus_per_node: int
    nodes: int | None
    gpu_memory_utilization: float
    reserve_gib: float
    kv_cache_gib_per_gpu: float | None
    tp: int
    pp: int
    dp: int
    dcp: int
    enable_expert_parallel: bool
    kv_cache_dtype: str
    max_model_len: int
    block_size: int
    weights_bytes: int | None = None
    pp_layer_partition: tuple[int, ...] | None = None
    language_model_only: bool = False
    vllm_version: str = PINNED_VLLM_VERSION
    # None: vLLM's default for the GPU (kimi_overhead.default_limits), filled in by inputs_from_options.
    max_num_seqs: int = 1024
    max_num_batched_tokens: int = 8192
    enforce_eager: bool = False
    all2all_backend: str = DEFAULT_ALL2ALL_BACKEND
    # "vllm": subtract the modelled per-stage overhead (kimi_overhead.py) from util x the CUDA-visible total;
    # "none": the guides' rule, util x the driver's total - reserve - weights (the planner before issue 15).
    overhead_model: str = "vllm"
    # The driver's figure (nvidia-smi) when gpu_memory_gib holds the CUDA-visible one; display only.
    gpu_memory_gib_driver: float | None = None
    # kimi_overhead.version_warning's for vllm_version: the rules it was planned with when they are another
    # release's (the plan's "warnings").
    version_warning: str | None = None

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def is_cpu(self) -> bool:
        return self.gpu is not None and self.gpu.is_cpu

    @property
    def models_overhead(self) -> bool:
        # vLLM's CPU backend sizes its cache from VLLM_CPU_KVCACHE_SPACE, not from a profile: no overhead there.
        return self.overhead_model == "vllm" and not self.is_cpu

    def overhead_inputs(self) -> OverheadInputs:
        return OverheadInputs(
            vllm_version=self.vllm_version,
            hidden_size=self.model.hidden_size,
            vocab_size=self.model.vocab_size,
            has_vision=bool(self.model.vision_params) and not self.language_model_only,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            enforce_eager=self.enforce_eager,
            all2all_backend=self.all2all_backend,
            expert_parallel=self.enable_expert_parallel,
            tp=self.tp,
            dp=self.dp,
            pp=self.pp,
            gpus_per_node=self.gpus_per_node,
            compute_major=self.gpu.compute_major if self.gpu else None,
            experts_per_token=self.model.num_experts_per_tok,
            routed_format=self.model.quantization.format_for(
                f"model.layers.{self.model.first_k_dense_replace}.mlp.experts.0.down_proj"
            ).kind,
        )


def _gib(value: float) -> float:
    return value / GIB


def _round(value: float, digits: int = 4) -> float:
    return round(value, digits)


def _stage_plan(inputs: PlanInputs, index: int, layers: range, usable_gib: float | None) -> dict[str, Any]:
    model = inputs.model
    if inputs.weights_bytes is not None:
        # The guides' rule: the checkpoint's bytes spread evenly over the tp x pp GPUs of one replica.
        breakdown = {"even_split": inputs.weights_bytes / (inputs.tp * inputs.pp)}
    else:
        breakdown = stage_weight_bytes(
            model,
            layers,
            first_stage=index == 0,
            last_stage=index == inputs.pp - 1,
            sharding=Sharding(inputs.tp, inputs.dp, inputs.enable_expert_parallel),
            include_vision=not inputs.language_model_only,
        )
    weights_gib = _gib(sum(breakdown.values()))
    overhead = stage_overhead_bytes(inputs.overhead_inputs(), index) if inputs.models_overhead else {}
    overhead_gib = _gib(sum(overhead.values()))
    if inputs.kv_cache_gib_per_gpu is not None:
        kv_gib = inputs.kv_cache_gib_per_gpu  # measured budget replaces the computed one
    elif usable_gib is not None:
        # util x total - reserve - weights - the modelled overhead, on this GPU
        kv_gib = usable_gib - weights_gib - overhead_gib
    else:
        kv_gib = 0.0
    per_token_on_gpu = len(layers) * kv_bytes_per_token_per_layer(model, inputs.kv_cache_dtype)
    tokens = _stage_tokens(inputs, kv_gib * GIB, per_token_on_gpu)
    return {
        "stage": index,
        "layers": [layers.start, layers.stop],
        "num_layers": len(layers),
        "weights_gib_per_gpu": _round(weights_gib),
        "weights_breakdown_gib": {key: _round(_gib(value)) for key, value in breakdown.items()},
        "kv_cache_gib_per_gpu": _round(kv_gib),
        "kv_bytes_per_token_per_gpu": _per_gpu_bytes(per_token_on_gpu, inputs.dcp),
        "kv_tokens": tokens,
        "overhead_gib": _round(overhead_gib),
        "overhead_breakdown_gib": {key: _round(_gib(value)) for key, value in overhead.items()},
        "_kv_gib_exact": kv_gib,
        "_weights_gib_exact": weights_gib,
        "_overhead_gib_exact": overhead_gib,
        "_per_token_on_gpu": per_token_on_gpu,
    }


def _stage_blocks(inputs: PlanInputs, budget_bytes: float, per_token_on_gpu: int) -> int:
    # kv_cache_utils.get_num_blocks: available // page_size // num_layers, page = block_size tokens of one layer.
    if budget_bytes <= 0 or per_token_on_gpu <= 0:
        return 0
    return int(budget_bytes // (inputs.block_size * per_token_on_gpu))


def _stage_tokens(inputs: PlanInputs, budget_bytes: float, per_token_on_gpu: int) -> int:
    """Tokens as vLLM reports them: whole blocks on the CPU backend, the pinned version's printed figure on GPUs."""
    if inputs.is_cpu:
        return tokens_in_budget(budget_bytes, per_token_on_gpu, inputs.block_size, inputs.dcp)
    blocks = _stage_blocks(inputs, budget_bytes, per_token_on_gpu)
    return logged_kv_tokens(blocks, inputs.block_size, inputs.dcp, inputs.max_model_len, inputs.vllm_version)


def _deployment(inputs: PlanInputs, stages: list[dict[str, Any]]) -> dict[str, Any]:
    """What deploying the plan exactly needs: one --kv-cache-memory-bytes for every worker, safe on every stage
    (the smallest stage budget, floored), and the tokens vLLM then logs (the fewest whole blocks over the stages,
    printed the way the version prints them)."""
    budget = max(0, math.floor(min(stage["_kv_gib_exact"] for stage in stages) * GIB))
    blocks = min(_stage_blocks(inputs, budget, stage["_per_token_on_gpu"]) for stage in stages)
    if inputs.is_cpu:
        tokens = blocks * inputs.block_size * inputs.dcp
        concurrency = None
    else:
        tokens = logged_kv_tokens(blocks, inputs.block_size, inputs.dcp, inputs.max_model_len, inputs.vllm_version)
        concurrency = round(logged_concurrency(blocks, inputs.block_size, inputs.dcp, inputs.max_model_len), 2)
    return {
        "kv_cache_memory_bytes": budget,
        "kv_blocks_per_gpu": blocks,
        "kv_tokens_deployed": tokens,
        "max_concurrency_logged": concurrency,
        "kv_cache_memory_bytes_supported": supports_kv_cache_memory_bytes(inputs.vllm_version),
    }


def _per_gpu_bytes(per_token_on_gpu: int, dcp: int) -> int | float:
    # Under DCP each GPU stores 1/dcp of a sequence's tokens: its share of a token's KV is per_token / dcp.
    value = per_token_on_gpu / dcp
    return int(value) if value.is_integer() else round(value, 3)


def compute_plan(inputs: PlanInputs, *, with_suggestions: bool = True) -> dict[str, Any]:
    """The per-GPU plan: weights, KV budget and tokens per stage, the deployment's concurrency, and why it
    does or does not fit."""
    model = inputs.model
    layout = Layout(inputs.tp, inputs.pp, inputs.dp, inputs.dcp, inputs.enable_expert_parallel)
    problems = layout_problems(layout, nodes=inputs.nodes, gpus_per_node=inputs.gpus_per_node, model=model)
    reasons = [str(problem) for problem in problems]
    # A broken layout (e.g. more stages than layers, leaving a stage empty) makes every memory figure derived from
    # it meaningless; nodes that the layout does not cover leave the per-GPU figures as they are.
    broken = [problem for problem in problems if problem.rule != GPU_COUNT]
    notes: list[str] = []
    usable_gib = None
    if inputs.gpu_memory_gib is not None and inputs.models_overhead:
        # vLLM requests ceil(total x utilization) bytes (v1/worker/utils.py request_memory).
        usable_gib = _gib(requested_bytes(inputs.gpu_memory_utilization, inputs.gpu_memory_gib * GIB))
        usable_gib -= inputs.reserve_gib
    elif inputs.gpu_memory_gib is not None:
        usable_gib = inputs.gpu_memory_utilization * inputs.gpu_memory_gib - inputs.reserve_gib
    elif inputs.kv_cache_gib_per_gpu is not None:
        notes.append("GPU memory not given: the weights were not checked against it")
    partition = pp_partition(model.num_hidden_layers, inputs.pp, inputs.pp_layer_partition)
    stages, start = [], 0
    for index, count in enumerate(partition):
        stages.append(_stage_plan(inputs, index, range(start, start + count), usable_gib))
        start += count
    # vLLM gives every worker the smallest worker's block count, so the stage with the fewest tokens decides
    # (with equal budgets that is the stage with the most layers).
    limiting = min(stages, key=lambda stage: (stage["kv_tokens"], stage["_kv_gib_exact"]))
    deployment = _deployment(inputs, stages)
    if not broken:
        reasons += _memory_problems(inputs, stages, usable_gib)
        reasons += _sequence_problems(inputs, limiting) or _deployed_sequence_problems(inputs, deployment)
    kv_tokens = limiting["kv_tokens"]
    # The scheduler never runs more than max_num_seqs requests per engine, whatever the cache holds.
    per_replica = min(_tokens_held(kv_tokens, deployment) // inputs.max_model_len, inputs.max_num_seqs)
    notes += _weight_notes(inputs)
    plan = {
        "mode": "per-gpu",
        "model": model.name,
        "model_source": model.source,
        "quantization": model.quantization.name,
        "gpu": inputs.gpu.key if inputs.gpu else None,
        "gpu_memory_gib": None if inputs.gpu_memory_gib is None else _round(inputs.gpu_memory_gib),
        "gpu_memory_gib_driver": None if inputs.gpu_memory_gib_driver is None else _round(inputs.gpu_memory_gib_driver),
        "vllm_version": inputs.vllm_version,
        "overhead_model": "vllm" if inputs.models_overhead else "none",
        "max_num_seqs": inputs.max_num_seqs,
        "max_num_batched_tokens": inputs.max_num_batched_tokens,
        "enforce_eager": inputs.enforce_eager,
        "all2all_backend": inputs.all2all_backend,
        "gpus_per_node": inputs.gpus_per_node,
        "nodes": inputs.nodes if inputs.nodes is not None else math.ceil(inputs.world_size / inputs.gpus_per_node),
        "gpus_total": inputs.world_size,
        "tp": inputs.tp,
        "pp": inputs.pp,
        "dp": inputs.dp,
        "dcp": inputs.dcp,
        "enable_expert_parallel": inputs.enable_expert_parallel,
        "ep_size": inputs.tp * inputs.dp if inputs.enable_expert_parallel else None,
        "gpu_memory_utilization": inputs.gpu_memory_utilization,
        "reserve_gib": inputs.reserve_gib,
        "usable_gib_per_gpu": None if usable_gib is None else _round(usable_gib),
        "kv_cache_dtype": inputs.kv_cache_dtype,
        "block_size": inputs.block_size,
        "max_model_len": inputs.max_model_len,
        "weights_source": "even-split" if inputs.weights_bytes is not None else "component-breakdown",
        "weights_gib_per_gpu": limiting["weights_gib_per_gpu"],
        "weights_gib_per_gpu_max": max(stage["weights_gib_per_gpu"] for stage in stages),
        "kv_cache_source": "measured" if inputs.kv_cache_gib_per_gpu is not None else "computed",
        "kv_cache_gib_per_gpu": limiting["kv_cache_gib_per_gpu"],
        "kv_bytes_per_token_per_gpu": limiting["kv_bytes_per_token_per_gpu"],
        "kv_values_per_token_per_layer": model.kv_values_per_token_per_layer,
        "kv_gib_per_sequence_per_gpu": _round(_sequence_gib_per_gpu(inputs, limiting["num_layers"])),
        "kv_tokens": kv_tokens,
        "sequences_per_replica": per_replica,
        "replicas": inputs.dp,
        "max_concurrent_sequences": per_replica * inputs.dp,
        "limiting_stage": limiting["stage"],
        "overhead_gib_per_gpu_max": max(stage["overhead_gib"] for stage in stages),
        **deployment,
        "stages": [{k: v for k, v in stage.items() if not k.startswith("_")} for stage in stages],
        "fits": not reasons,
        "reasons": reasons,
        "notes": notes,
    }
    if with_suggestions:
        plan["suggestions"] = suggest_layouts(inputs, plan)
    return plan


def _sequence_gib_per_gpu(inputs: PlanInputs, num_layers: int) -> float:
    per_token = num_layers * kv_bytes_per_token_per_layer(inputs.model, inputs.kv_cache_dtype)
    return inputs.max_model_len * per_token / inputs.dcp / GIB


def _memory_problems(inputs: PlanInputs, stages: list[dict[str, Any]], usable_gib: float | None) -> list[str]:
    problems = []
    for stage in stages:
        if inputs.kv_cache_gib_per_gpu is not None:
            needed = stage["_weights_gib_exact"] + stage["_overhead_gib_exact"]
            if usable_gib is not None and needed > usable_gib:
                problems.append(
                    f"stage {stage['stage']}: weights need {stage['_weights_gib_exact']:.2f} GiB per GPU"
                    f"{_overhead_words(stage)} but only {usable_gib:.2f} GiB is usable"
                )
            continue
        if stage["_kv_gib_exact"] <= 0:
            problems.append(
                f"stage {stage['stage']}: weights {stage['_weights_gib_exact']:.2f} GiB{_overhead_words(stage)} + "
                f"reserve {inputs.reserve_gib:g} GiB exceed {inputs.gpu_memory_utilization:g} x "
                f"{inputs.gpu_memory_gib or 0:.2f} GiB = "
                f"{inputs.gpu_memory_utilization * (inputs.gpu_memory_gib or 0):.2f} GiB per GPU "
                f"(short by {-stage['_kv_gib_exact']:.2f} GiB){_overhead_advice(inputs, stage)}"
            )
    return problems


def _overhead_words(stage: dict[str, Any]) -> str:
    if not stage["_overhead_gib_exact"]:
        return ""
    terms = ", ".join(f"{key} {value:.2f}" for key, value in stage["overhead_breakdown_gib"].items() if value)
    return f" + modelled overhead {stage['_overhead_gib_exact']:.2f} GiB ({terms})"


def _overhead_advice(inputs: PlanInputs, stage: dict[str, Any]) -> str:
    # vLLM would fail at load or at its profile, ten minutes in; say which knob frees the memory.
    if not stage["_overhead_gib_exact"] or stage["_weights_gib_exact"] > (inputs.gpu_memory_gib or 0):
        return ""
    return (
        "; the budget leaves less than the modelled overhead: raise --gpu-memory-utilization "
        "(kimi_gpu_memory_utilization) or lower --max-num-batched-tokens / --max-num-seqs"
    )


def _sequence_problems(inputs: PlanInputs, limiting: dict[str, Any]) -> list[str]:
    # vLLM refuses to start when one request of max_model_len does not fit the KV cache ("To serve at least one
    # request with the models's max seq len ...").
    if limiting["kv_tokens"] >= inputs.max_model_len or limiting["_kv_gib_exact"] <= 0:
        return []
    need = _sequence_gib_per_gpu(inputs, limiting["num_layers"])
    return [
        f"one {inputs.max_model_len:,}-token sequence needs {need:.2f} GiB of KV cache per GPU "
        f"({limiting['num_layers']} layers x {inputs.model.kv_values_per_token_per_layer} values x "
        f"{kv_dtype_bytes(inputs.kv_cache_dtype)} B / DCP {inputs.dcp}), but stage {limiting['stage']} has "
        f"{limiting['_kv_gib_exact']:.2f} GiB per GPU ({limiting['kv_tokens']:,} tokens)"
    ]


def _tokens_held(kv_tokens: int, deployment: dict[str, Any]) -> int:
    """The tokens a replica holds however it is started. With vLLM's own profile every stage keeps its own budget
    (kv_tokens); where the version takes --kv-cache-memory-bytes the serve phase gives every worker the smallest stage
    budget (kimi_kv_cache_memory_from_plan auto, the CPU lab included), with which a stage of more layers holds fewer
    (kv_tokens_deployed). The fewer of the two, so that the concurrency derived from it (the verify phase's load
    test) holds under both."""
    if not deployment["kv_cache_memory_bytes_supported"]:
        return kv_tokens
    return min(kv_tokens, deployment["kv_tokens_deployed"])


def _deployed_sequence_problems(inputs: PlanInputs, deployment: dict[str, Any]) -> list[str]:
    # Every stage holds a sequence with its own budget, but the one budget every worker is given may leave the stage
    # of more layers short of one: vLLM then refuses to start with --kv-cache-memory-bytes.
    if not deployment["kv_cache_memory_bytes_supported"] or deployment["kv_tokens_deployed"] >= inputs.max_model_len:
        return []
    return [
        f"with the one budget every worker is given (--kv-cache-memory-bytes {deployment['kv_cache_memory_bytes']:,}, "
        f"the smallest stage's) a stage of more layers holds {deployment['kv_tokens_deployed']:,} tokens, "
        f"less than one {inputs.max_model_len:,}-token sequence, and vLLM refuses such a start: lower --max-model-len "
        "(kimi_max_model_len) or raise --gpu-memory-utilization (kimi_gpu_memory_utilization)"
    ]


def _weight_notes(inputs: PlanInputs) -> list[str]:
    notes = []
    if inputs.weights_bytes is not None and inputs.dp > 1:
        notes.append(
            "--weights-bytes spreads the checkpoint over the tp x pp GPUs of one replica; with DP the routed "
            "experts are shared by all tp x dp ranks, so the component breakdown (no --weights-bytes) is closer"
        )
    if inputs.weights_bytes is None and inputs.model.vision_params and not inputs.language_model_only:
        notes.append(
            "the vision encoder is counted as a whole BF16 copy on each first-stage GPU "
            "(--mm-encoder-tp-mode data); --language-model-only leaves it out"
        )
    return notes


# ---------------------------------------------------------------------------------------------------------
# Layout changes that would hold more
# ---------------------------------------------------------------------------------------------------------


def suggest_layouts(inputs: PlanInputs, plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Re-plan with one change at a time (more DCP, an FP8 cache, no vision encoder) and keep those that help."""
    candidates: list[tuple[str, str, PlanInputs]] = []
    for dcp in range(inputs.dcp + 1, inputs.tp + 1):
        if inputs.tp % dcp == 0:
            candidates.append((f"DCP {dcp}", f"--dcp {dcp}", replace(inputs, dcp=dcp)))
    if kv_dtype_bytes(inputs.kv_cache_dtype) > 1:
        candidates.append(("an FP8 KV cache", "--kv-cache-dtype fp8", replace(inputs, kv_cache_dtype="fp8")))
    if inputs.model.vision_params and inputs.weights_bytes is None and not inputs.language_model_only:
        candidates.append(("no vision encoder", "--language-model-only", replace(inputs, language_model_only=True)))
    suggestions = []
    for label, change, alternative in candidates:
        other = compute_plan(alternative, with_suggestions=False)
        if other["kv_tokens"] <= plan["kv_tokens"]:
            continue
        ratio = other["kv_tokens"] / plan["kv_tokens"] if plan["kv_tokens"] else None
        suggestions.append(
            {
                "change": change,
                "label": label,
                "kv_tokens": other["kv_tokens"],
                "kv_tokens_ratio": None if ratio is None else round(ratio, 2),
                "max_concurrent_sequences": other["max_concurrent_sequences"],
                "fits": other["fits"],
                "text": _suggestion_text(label, ratio, plan, other),
            }
        )
    return suggestions


def _sequences(count: int) -> str:
    return f"{count} full-length sequence{'' if count == 1 else 's'}"


def _suggestion_text(label: str, ratio: float | None, plan: dict[str, Any], other: dict[str, Any]) -> str:
    times = f"{ratio:.3g}x the KV tokens" if ratio else f"{other['kv_tokens']:,} KV tokens"
    return (
        f"{label} would hold {times}: {_sequences(other['max_concurrent_sequences'])} instead of "
        f"{plan['max_concurrent_sequences']}"
    )


# ---------------------------------------------------------------------------------------------------------
# The GreenNode guide's pooled arithmetic (only on request; docs/sources.md)
# ---------------------------------------------------------------------------------------------------------


def pooled_plan(inputs: PlanInputs) -> dict[str, Any]:
    """The GreenNode guide's box: all GPUs' memory as one pool, all layers' KV in one place. Not what vLLM allocates.

    Reproduced only for comparison: it ignores that TP ranks each hold the whole latent KV cache, rounds the
    token count to the nearest token instead of whole blocks, and spreads the weights over every GPU.
    """
    if inputs.gpu_memory_gib is None:
        raise PlanInputError("--pooled", "needs the GPU memory (--gpu or --gpu-memory-gib)")
    if inputs.weights_bytes is not None:
        weights_gib = _gib(inputs.weights_bytes)
    else:
        weights_gib = _gib(checkpoint_weight_bytes(inputs.model, include_vision=not inputs.language_model_only))
    gpus = inputs.world_size
    total_gib = gpus * inputs.gpu_memory_gib
    usable_gib = total_gib * inputs.gpu_memory_utilization - gpus * inputs.reserve_gib
    pool_gib = usable_gib - weights_gib
    per_token = inputs.model.num_hidden_layers * kv_bytes_per_token_per_layer(inputs.model, inputs.kv_cache_dtype)
    tokens = max(0, math.floor(pool_gib * GIB / per_token + 0.5))
    sequence_gib = inputs.max_model_len * per_token / GIB
    sequences = tokens // inputs.max_model_len
    reasons = []
    if sequences < 1:
        reasons.append(f"pooled KV of {pool_gib:.1f} GiB holds no {inputs.max_model_len:,}-token sequence")
    per_gpu = compute_plan(inputs, with_suggestions=False)
    return {
        "mode": "pooled",
        "warning": (
            "POOLED arithmetic (the GreenNode guide): every GPU's memory as one pool; vLLM does not allocate this way"
        ),
        "model": inputs.model.name,
        "gpus_total": gpus,
        "total_gpu_gib": _round(total_gib, 2),
        "usable_gib": _round(usable_gib, 2),
        "weights_gib": _round(weights_gib, 2),
        "kv_pool_gib": _round(pool_gib, 2),
        "kv_bytes_per_token": per_token,
        "kv_tokens": tokens,
        "kv_gib_per_sequence": _round(sequence_gib),
        "max_model_len": inputs.max_model_len,
        "max_concurrent_sequences": sequences,
        "weights_gib_per_gpu": _round(weights_gib / gpus),
        "kv_cache_gib_per_gpu": _round(pool_gib / gpus),
        "kv_bytes_per_token_per_gpu": per_token,
        "fits": not reasons,
        "reasons": reasons,
        "per_gpu_plan": per_gpu,
    }
