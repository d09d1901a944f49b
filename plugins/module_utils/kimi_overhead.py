"""What vLLM subtracts from a GPU besides the weights before it sizes the KV cache, per pipeline stage and per
vLLM version, and the per-version rules around it (block size, the printed token count, --kv-cache-memory-bytes).

vLLM (vllm/v1/worker/gpu_worker.py determine_available_memory, the same in every release from 0.10.2 to 0.33.0 but
for where the CUDA-graph estimate enters) computes

    available KV = ceil(gpu_memory_utilization x CUDA-visible total)          (v1/worker/utils.py request_memory)
                   - weights ("Model loading took")
                   - torch peak increase of profile_run (the larger of the forward at max_num_batched_tokens and,
                     on the last PP stage, the sampler's dummy run; the vision encoder's dummy batch on multimodal
                     models)
                   - non-torch increase since the start-up snapshot (NCCL, custom all-reduce, DeepEP buffers)
                   - the CUDA-graph memory estimate (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS, on by default)

From 0.27.0 vllm/utils/mem_utils.py memory_profiling counts everything consumed since the start-up snapshot (free
memory then minus free memory after the profile) plus the profile's transient peak, so what the model runner keeps
allocated outside the weights counts too. From 0.29.0 the K2 and DeepSeek architectures run on Model Runner V2,
whose sampler keeps per-request penalty state of vocabulary width (the "sampler_state" term) and whose dummy
sampler run differs from V1's (MODEL_RUNNER_V2_SINCE below).

The terms below model each of these. Where vLLM measures rather than computes (activation peak, graph pools), the
constant is taken from a published start-up log and says which; docs/planner.md has the ledger and the calibration.

Stdlib only and free of Ansible imports (the planner runs on nodes without `packaging`): versions are compared by
their release numbers, the way kimi_stack._version_key orders CUDA versions.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from .kimi_presets import GIB, PlanInputError

MIB = 1024**2
# The project's pinned vLLM (roles/kimi/defaults/main.yml kimi_vllm_pip_pins: vllm "0.33.0").
PINNED_VLLM_VERSION = "0.33.0"

# --- version thresholds, each checked in the released wheels' source ---------------------------------------------
# CacheConfig.kv_cache_memory_bytes and the --kv-cache-memory-bytes flag first appear in vLLM 0.10.2
# (vllm/config/__init__.py CacheConfig, vllm/engine/arg_utils.py add_argument("--kv-cache-memory-bytes"));
# 0.10.1.1 has neither. Upstream: github.com/vllm-project/vllm/pull/21489 "Allow users to specify kv cache memory
# size"; with it set, Worker.determine_available_memory returns that value and skips the profiling.
KV_CACHE_MEMORY_BYTES_SINCE = (0, 10, 2)
# VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS defaults to "1" in vllm/envs.py of every release from 0.20.0 to 0.34.0
# (the worker's log line says "default since v0.21.0"; the 0.20.x wheels already have it on) and to "0" in 0.18.0
# to 0.19.1, which profile the graphs but do not subtract them. Added off by default in
# github.com/vllm-project/vllm/pull/30515.
CUDAGRAPH_ESTIMATE_SINCE = (0, 20, 0)
# Worker.init_device takes the memory snapshot before init_worker_distributed_environment in 0.10.x (NCCL's
# communicator buffers then count as non-torch memory) and after it from 0.11.0 on (gpu_worker.py of each wheel).
SNAPSHOT_AFTER_NCCL_SINCE = (0, 11, 0)
# kv_cache_utils.py prints "GPU KV cache size" as num_blocks x block_size (x dcp) up to 0.20.0 and as
# int(max_concurrency x max_model_len) from 0.20.2 on (_report_kv_cache_config in 0.20.2, 0.21.0, 0.23.0;
# get_kv_cache_capacity from 0.24.0, read in 0.24.0 and 0.33.0).
TOKENS_FROM_CONCURRENCY_SINCE = (0, 20, 2)
# Up to 0.17.1, CudaPlatform.check_and_update_config (vllm/platforms/cuda.py of 0.10.2, 0.11.0, 0.11.1, 0.12.0,
# 0.13.0, 0.14.0, 0.15.0, 0.16.0 and 0.17.0, each read) forces an MLA model's block size when no backend is chosen:
# FlashMLA's 64 where FlashMLA runs (Hopper), CUTLASS MLA's 128 on Blackwell, and from 0.15.0 FlashInfer MLA's 64 on
# Blackwell (qk_nope_head_dim 128, as every K2/DeepSeek-V3 config has). From 0.18.0 that code is gone: the block
# size is the chosen backend's preferred one (_get_backend_priorities, AttentionBackend.get_preferred_block_size; read
# in 0.18.0, 0.20.0, 0.23.0, 0.24.0, 0.27.0, 0.30.0 and 0.33.0). A published Kimi-K2.5 log under 0.15.0 on H100
# confirms 64 there ("estimated maximum model length is 9664": 151 blocks of 64).
BACKEND_PRIORITIES_SINCE = (0, 18, 0)
FLASHINFER_MLA_FORCED_SINCE = (0, 15, 0)
# vllm/config/vllm.py: the default largest capture size is min(2 x max_num_seqs, 512), and 1024 instead of 512 on
# data-centre Blackwell (is_device_capability_family(100)) from 0.28.0 (read in 0.27.0 and 0.28.0).
BLACKWELL_1024_GRAPHS_SINCE = (0, 28, 0)

# --- the terms' constants --------------------------------------------------------------------------------------
# --- the profile's torch peak, by version range ------------------------------------------------------------------
# profile_run (vllm/v1/worker/gpu_model_runner.py, read in every release from 0.10.2 to 0.33.0) runs the dummy
# forward over max_num_batched_tokens tokens, lets its activations go, then on the last PP stage the sampler's dummy
# run over min(max_num_seqs, max_num_batched_tokens) requests x the vocabulary, with only the hidden states kept:
# the torch peak is the larger of the two runs, not their sum.
#
# The forward's peak is led by the fused-MoE workspaces (vllm/model_executor/layers/fused_moe/modular_kernel.py
# workspace_shapes: tokens x num_experts_per_tok x max(2 x intermediate / TP, hidden)), so it is modelled as
# bytes per token x num_experts_per_tok x hidden_size; the per-unit figure depends on the MoE kernel (the routed
# experts' weight format, the GPU family) and on the release, and is taken from published start-up logs: each
# entry names its case in tests/fixtures/planner/startup_logs.json. A release with no log of its own takes the
# larger figure of its neighbours (the safe side); a format or GPU with no log takes the largest of its range.
#
# The sampler's peak is bytes per logit. Up to 0.11.0 the top-k/top-p filter ran in FlashInfer whenever it
# imported (vllm/v1/sample/ops/topk_topp_sampler.py, 0.10.2 and 0.11.0), and from 0.18.0 in a Triton kernel for
# batches of 8 or more (apply_top_k_top_p_triton): neither sorts the vocabulary, and what stays is the logits in
# BF16 (2 B) and FP32 (4 B), the softmax (4 B) and the exponential draw (4 B) of random_sample: 14 B. From 0.11.1
# to 0.17.1 FlashInfer is opt-in (VLLM_USE_FLASHINFER_SAMPLER) and the default is torch.sort over the whole
# vocabulary (apply_top_k_top_p): values, int64 indices and the sort's own double buffers. Its size per logit is
# taken from the logs of those releases, where the sampler, not the forward, sets the peak: DeepSeek-R1 at 1,024
# requests x 129,280 logits, and Kimi-K2-Thinking at 1,024 x 163,840 confirms it (the recipe case).
# From 0.18.0 the logs give more than those 14 B: the Kimi-K2.5 runs on H200 (1,024 requests x 163,840 logits, the
# INT4 forward below them) spend 3.39 GiB of peak beyond the non-torch memory and the encoder's batch, 21.68 B per
# logit. The forward cannot hold it: without the vision encoder and at one request the same INT4 forward peaks at
# 1.85 GiB (k2.6-h200-nvl-tp8-ep-0.20.0), and a Kimi-K2.5 run at 64 requests with its encoder on spends at most
# 1.6 GiB on forward and encoder together (k2.5-h100-tp8-0.15.0). The DeepSeek-R1 runs of these releases do not
# tell: their FP8 forward (5.15 GiB at 8,192 tokens) is above their sampler (2.67 GiB at 21.68 B) either way.
SAMPLER_BYTES_PER_LOGIT_UNSORTED = 14.0
# (first release, bytes per logit, the case it comes from)
SAMPLER_BYTES_PER_LOGIT_BY_RELEASE = (
    ((0, 10, 1), SAMPLER_BYTES_PER_LOGIT_UNSORTED, "FlashInfer top-k/top-p by default: no sort"),
    ((0, 11, 1), 51.4, "dsr1-h200-0.11.2-*: 7.29 GiB besides weights and cache"),
    ((0, 12, 0), 51.4, "no log of 0.12: the larger of 0.11.2's and 0.13.0's"),
    ((0, 13, 0), 39.2, "dsr1-h200-0.13.0-*: 5.78 GiB"),
    ((0, 14, 0), 52.8, "dsr1-h200-0.14.1-*: 7.46 GiB"),
    ((0, 15, 0), 52.8, "no log of 0.15: the larger of 0.14.1's and 0.16.0's"),
    ((0, 16, 0), 39.4, "dsr1-h200-0.16.0-*: 5.81 GiB (0.17 has 0.16's worker and profile_run)"),
    ((0, 18, 0), 21.68, "Triton top-k/top-p, no sort; k2.5-h200-0.18.0-*: 3.39 GiB at 1,024 x 163,840"),
)
# Forward bytes per MoE token x expert per token x hidden unit: (first release, {(format, GPU family): bytes},
# source). The MoE tokens are max_num_batched_tokens, times DP where the engines gather theirs (moe_tokens).
# Format: the routed experts' ("fp8_block" DeepSeek/Kimi-K2-Instruct FP8, "int_group" the INT4 K2-Thinking/K2.5
# family); GPU family: the compute capability major (9 Hopper, 10 Blackwell).
FORWARD_BYTES_BY_RELEASE = (
    ((0, 10, 1), {("fp8_block", 9): 4.25}, "dsr1-h200-0.11.0-*: 2.81 GiB, the sampler unsorted"),
    # With the sort, the sampler sets these releases' peaks and hides the forward's: the largest forward their
    # logs allow (dsr1-h200-0.13.0-*, -0.16.0-*: 4.83 and 4.86 GiB of peak at 8,192 x 8 x 7,168).
    ((0, 11, 1), {("fp8_block", 9): 10.3}, "the bound dsr1-h200-0.13.0-* and -0.16.0-* set"),
    # INT4 (Marlin) on Hopper: one request without the vision encoder, where nothing but the forward can set the
    # peak (1.85 GiB at 8,192 tokens; the run is TP 8 with EP, whose unsharded expert intermediates make it the
    # larger of the two layouts). The DP 8 run of the same deployment (k2.6-h200-nvl-dp8-ep-0.20.0, 8 x 8,192
    # gathered tokens) checks it.
    (
        (0, 18, 0),
        {("fp8_block", 9): 11.77, ("fp8_block", 10): 7.86, ("int_group", 9): 4.23},
        "dsr1-h200-0.18.0-*, -0.19.0-* (6.10 GiB), dsr1-b200-0.18.0-* (4.39 GiB), k2.6-h200-nvl-tp8-ep-0.20.0",
    ),
)
# --- Model Runner V2 (vllm/v1/worker/gpu/model_runner.py) --------------------------------------------------------
# Up to 0.28.x V2 is the default only for the architectures listed in vllm/config/vllm.py
# DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES (read in 0.22.0 to 0.28.0: dense, unquantized ones in 0.22.0, a few MoE ones
# with DeepseekV2ForCausalLM from 0.24.0; never DeepseekV3ForCausalLM, KimiK25ForConditionalGeneration or
# Glm4MoeLiteForCausalLM), so every calibration case ran V1. From 0.29.0 VllmConfig.use_v2_model_runner picks V2
# for every architecture where Triton is present and no feature V2 lacks is asked for (read in 0.29.0 to 0.33.0:
# some speculative methods, dual batch overlap, elastic EP, custom logits processors, external_launcher with PP;
# the serve role sets none of them). "Using V2 Model Runner" in the start-up log confirms it. The terms below that
# depend on it were read in the source, not fitted: no published start-up log of a K2 or DeepSeek model under
# 0.29.0 or later has been found.
MODEL_RUNNER_V2_SINCE = (0, 29, 0)
# V2's profile_run runs the same dummy forward, then _dummy_sampler_run over min(max_num_seqs,
# max_num_batched_tokens) requests. 0.29.0 to 0.32.x: one default pass, no per-request processing and no top-k/top-p,
# the Gumbel-max kernel straight on the BF16 logits (vllm/v1/worker/gpu/sample/sampler.py, gumbel.py); the peak is
# compute_logits' gather across TP (vllm/distributed/device_communicators/cuda_communicator.py all_gather: the local
# shard, the gathered buffer and its reshaped copy), 2 + 2 + 2/TP B per logit, 2 B on one GPU.
# 0.33.0 adds a second pass with SamplingParams.for_sampler_warmup() (temperature, top-k, top-p, min-p, penalties,
# logprobs): the FP32 copy of the logits (4 B) beside the BF16 ones (2 B), then FlashInfer's
# top_k_top_p_sampling_from_logits (the default sampler on these GPUs, topk_topp_sampler.py
# flashinfer_sampler_supported; flashinfer/sampling.py of flashinfer-python 0.7.2.post1, the version 0.33.0 pins),
# which allocates the top-k-masked logits (4 B) and their softmax (4 B) as two new FP32 tensors: 14 B. Without
# FlashInfer the Triton top-k/top-p filters in place, so 14 B is the larger of the two paths.
SAMPLER_WARMUP_PASS_SINCE = (0, 33, 0)
V2_SAMPLER_WARMUP_BYTES_PER_LOGIT = 14.0
# The MoE workspaces stay allocated after the forward (vllm/v1/worker/workspace.py WorkspaceManager keeps the largest
# it has grown to), so V2's sampler pass adds to them rather than following the forward's whole peak. Triton, Marlin
# and Humming experts hold two activation-dtype (BF16) buffers of tokens x experts per token x max(2 x intermediate /
# TP, hidden) (experts/triton_moe.py, marlin_moe.py, fused_humming_moe.py workspace_shapes of 0.33.0): 4 B per
# token x expert per token x hidden unit for the K2 shapes, whose hidden size (7,168) is above twice the expert
# intermediate (2 x 2,048). DeepGEMM holds an FP8 and a BF16 buffer over expert-aligned rows (deep_gemm_moe.py): 3 B per
# aligned unit, 5.25 B per unit at 8,192 tokens with 384 local experts. 6 B covers both at the default token budget.
# profile_run also keeps the forward's BF16 hidden states (max_num_batched_tokens x hidden) while the sampler runs.
# The forward's own peak caps the two (the INT4 forward, 4.23 B per unit, is almost all workspace).
HELD_WORKSPACE_BYTES_PER_UNIT = 6.0
HIDDEN_STATE_BYTES = 2
# The V2 sampler's penalty state (vllm/v1/worker/gpu/sample/penalties.py PenaltiesState, 0.29.0 to 0.33.0): output
# token counts [max_num_seqs, vocab] int32 and a prompt token bit mask [max_num_seqs, ceil(vocab / 32)] int32, on the
# last PP stage, allocated by load_model after "Model loading took" is measured and kept for the engine's life: 0.64
# GiB at 1,024 sequences x 163,840 tokens. V1 keeps no such state on the GPU.
SAMPLER_STATE_BYTES_PER_ENTRY = 4

# A format on a GPU family without a figure of its own takes the format's Hopper figure where vLLM runs the same
# MoE buffers there, and the range's largest where, from a release on, it runs a kernel of its own that no log
# measures: (format, GPU family) -> that release. INT4 experts on data-centre Blackwell: from 0.23.0 FlashInfer's
# TRT-LLM MXINT4 MoE comes first in the WNA16 backend priorities (vllm/model_executor/layers/fused_moe/oracle/
# int_wna16.py of 0.23.0 to 0.33.0; it takes the K2 checkpoints' symmetric groups of 32) and allocates its buffers
# inside FlashInfer. Up to 0.22 Blackwell ran Marlin, as Hopper does (FlashInfer only with
# VLLM_USE_FLASHINFER_MOE_INT4=1, vllm/envs.py of 0.18.0). On Hopper 0.33.0 puts Humming before Marlin
# (quantization/utils/humming/priority.py), whose two workspaces are Marlin's (tokens x experts per token x hidden
# in BF16: experts/fused_humming_moe.py and experts/marlin_moe.py); the RTX PRO 6000 (sm_120) runs Marlin.
OWN_MOE_KERNEL_SINCE = {("int_group", 10): (0, 23, 0)}
# MoonViT's hidden size (K2.5-based checkpoints' vision_config.hidden_size; the miniature config test in
# tests/unit uses the same 1152). The encoder's dummy batch is costed at 73.2 B per token and hidden unit over
# max_num_batched_tokens tokens of this width: an estimate by analogy (the figure an earlier fit gave the language
# model), no published log isolates it.
VISION_HIDDEN_SIZE = 1152
ENCODER_BYTES_PER_TOKEN_PER_HIDDEN = 73.2
# Non-torch memory that grows after the start-up snapshot on a GPU with peers (custom all-reduce buffers, NCCL
# work buffers): "0.95 GiB for non-torch memory" in a published TP x EP start-up log (gpu_worker.py:857 "Free memory
# on device (181.84/184.31 GiB) ... 0.95 GiB for non-torch memory", a public repository found with the code search).
NON_TORCH_BYTES_WITH_PEERS = int(0.95 * GIB)
# Before 0.11.0 the snapshot precedes NCCL's init, so its communicators count too: "1.38 GiB for non-torch memory"
# with TP 2 on H200 under vLLM 0.10.2 (Qwen3-Next-80B start-up log, "Free memory on device (139.21/139.81 GiB)").
NON_TORCH_BYTES_WITH_NCCL_INIT = int(1.38 * GIB)
# Non-torch memory on a GPU without peers (no NCCL or all-reduce buffers; the libraries' own workspaces remain):
# what a one-GPU start of GLM-4.7-Flash under vLLM 0.27.1 on an H100 leaves after its weights, KV cache and the
# planned forward, ceil(0.9 x 79.19) - 55.87 - 15.03 - 0.05 = 0.33 GiB (startup_logs.json case
# glm-4.7-flash-h100-pcie-tp1-0.27.1). Published one-GPU profile lines print less, so the figure is on the safe
# side for them: "0.07 GiB for non-torch memory" (an H100 start of 2025-09), "0.16 GiB" (vLLM 0.26.0, a 16 GiB
# sm_90 GPU), "0.26 GiB" (RTX PRO 6000 Server, TP 1), all public logs found with the code search.
NON_TORCH_BYTES_ALONE = int(0.33 * GIB)
# DeepEP buffers (vllm/distributed/device_communicators/all2all.py, 0.23.0): VLLM_DEEPEP_BUFFER_SIZE_MB (default
# 1024, vllm/envs.py) of NVLink buffer, and as much RDMA buffer when the EP group spans nodes.
DEEPEP_BUFFER_BYTES = 1024 * MIB
# CUDA-graph estimate per captured graph: "Graph capturing finished ..., took 2.27 GiB" for 51 FULL + 51 PIECEWISE
# graphs (1,024 sequences) of DeepSeek-R1 on H200 under 0.18.0 and 0.19.0 (dsr1-h200-0.18.0-*, -0.19.0-*; 2.28 GiB
# under 0.20.0, Kimi-K2.5 took 1.61 GiB and B200 2.52 GiB under 0.18.0): 2.27 GiB / 102, one figure for every model
# (the Kimi models' graphs are smaller: the safe side).
CUDAGRAPH_BYTES_PER_GRAPH = int(2.27 * GIB / 102)
# Default max_num_seqs / max_num_batched_tokens of `vllm serve` (engine/arg_utils.py
# _set_default_max_num_seqs_and_batched_tokens_args, the same from 0.22.0 to 0.34.0; EngineArgs._set_default_args in
# 0.11.0 has the same figures): GPUs of 70 GiB or more (not A100) 1024 / 8192,
# others 256 / 2048.
LARGE_GPU_BYTES = 70 * GIB
DEFAULT_LIMITS_LARGE_GPU = (1024, 8192)
DEFAULT_LIMITS_SMALL_GPU = (256, 2048)
ALL2ALL_BACKENDS = (
    "allgather_reducescatter",
    "naive",
    "pplx",
    "deepep_high_throughput",
    "deepep_low_latency",
    "flashinfer_all2allv",
)
# vllm/config/parallel.py ParallelConfig.all2all_backend default (0.23.0).
DEFAULT_ALL2ALL_BACKEND = "allgather_reducescatter"


# ---------------------------------------------------------------------------------------------------------
# Versions
# ---------------------------------------------------------------------------------------------------------


def parse_version(text: str) -> tuple[int, ...]:
    """Release numbers of a vLLM version ('0.23.0', 'v0.11.1rc2', '0.10.1.1+cu129' -> (0, 10, 1, 1)).

    A pre-release is ordered with its release, which is what the thresholds above need (each names a release).
    """
    found = re.fullmatch(r"\s*v?(\d+(?:\.\d+)*)(?:[.+\-]?(?:a|b|rc|dev|post)\d*)*(?:\+[\w.]+)?\s*", str(text))
    if not found:
        raise PlanInputError("--vllm-version", f"not a vLLM version: {text!r} (for example 0.23.0)")
    return tuple(int(part) for part in found.group(1).split("."))


# The vLLM releases whose source the rules above were read in: every release from 0.10.1.1 to 0.33.0 (the files
# named above, fetched from each wheel on PyPI; docs/planner.md, "Versions"). A version in that span is planned with
# its own rules. One past the newest, up to RULES_NEAR_MINORS minor releases on, gets the newest's rules and a
# warning that names them; one older than the oldest (V0's engine profiled otherwise) or farther on is refused: no
# rule is near enough to plan it, and a silent default is the plan nobody checks until a load fails.
RULES_OLDEST = (0, 10, 1)
RULES_NEWEST = (0, 33, 0)
RULES_NEAR_MINORS = 10


def _release_text(release: tuple[int, ...]) -> str:
    return ".".join(str(part) for part in release)


def version_warning(version: str) -> str | None:
    """None when the planner's rules were read for this vLLM; a warning naming the rules used when it plans a newer
    one with the newest rules it has; PlanInputError (--vllm-version) when no rules are near."""
    release = parse_version(version)
    oldest, newest = _release_text(RULES_OLDEST), _release_text(RULES_NEWEST)
    if release < RULES_OLDEST:
        raise PlanInputError(
            "--vllm-version",
            f"vLLM {version} is older than {oldest}, the oldest whose memory profile the planner's rules were read in "
            "(an older engine profiles memory otherwise): no rule is near; plan a newer vLLM",
        )
    if release[:2] <= RULES_NEWEST[:2]:
        return None
    past = release[1] - RULES_NEWEST[1] if release[0] == RULES_NEWEST[0] else None
    if past is None or past > RULES_NEAR_MINORS:
        raise PlanInputError(
            "--vllm-version",
            f"vLLM {version} is more than {RULES_NEAR_MINORS} minor releases past {newest}, the newest whose source "
            "the planner's rules were read in: no rule is near; read its worker's memory profile and add its rules "
            "(docs/planner.md, 'Versions')",
        )
    return (
        f"vLLM {version}: no rule of this release was read; planned with vLLM {newest}'s rules, the newest read "
        "(docs/planner.md, 'Versions'). Compare the plan with its start-up log ('Available KV cache memory', 'GPU KV "
        "cache size') before relying on it."
    )


def _at_least(version: str, since: tuple[int, ...]) -> bool:
    return parse_version(version) >= since


def supports_kv_cache_memory_bytes(version: str) -> bool:
    """Whether this vLLM accepts --kv-cache-memory-bytes (CacheConfig.kv_cache_memory_bytes): 0.10.2 and later."""
    return _at_least(version, KV_CACHE_MEMORY_BYTES_SINCE)


def subtracts_cudagraph_estimate(version: str) -> bool:
    return _at_least(version, CUDAGRAPH_ESTIMATE_SINCE)


def prints_tokens_from_concurrency(version: str) -> bool:
    return _at_least(version, TOKENS_FROM_CONCURRENCY_SINCE)


# ---------------------------------------------------------------------------------------------------------
# Block size by attention backend
# ---------------------------------------------------------------------------------------------------------


def default_block_size(compute_major: int | None, kv_cache_dtype: str, version: str) -> int:
    """The KV block size vLLM picks for an MLA model when --block-size is not given.

    From 0.18.0 (vllm/platforms/cuda.py _get_backend_priorities, AttentionBackend.get_preferred_block_size): Hopper
    (9) takes FLASH_ATTN_MLA (block sizes multiple of 16: the default 16) for a 16-bit cache; it has no FP8 cache, so
    an FP8 cache goes to FLASHMLA (64). Blackwell (10) takes FLASHINFER_MLA ([32, 64]: the smallest, 32). Other GPUs
    (the RTX PRO 6000, sm_120) fall to TRITON_MLA (multiple of 16: 16).
    Before 0.18.0 (check_and_update_config): Hopper forced to FlashMLA's 64 whatever the cache dtype; Blackwell to
    CUTLASS MLA's 128, from 0.15.0 to FlashInfer MLA's 64; other GPUs keep the default 16.
    """
    fp8 = kv_cache_dtype.startswith("fp8")
    if compute_major is None:
        return 16  # CacheConfig.DEFAULT_BLOCK_SIZE
    if not _at_least(version, BACKEND_PRIORITIES_SINCE):
        if compute_major == 10:
            return 64 if _at_least(version, FLASHINFER_MLA_FORCED_SINCE) else 128
        return 64 if compute_major == 9 else 16
    if compute_major == 9:
        return 64 if fp8 else 16
    if compute_major == 10:
        return 32
    return 16


def default_limits(cuda_total_bytes: float | None) -> tuple[int, int]:
    """vLLM's default (max_num_seqs, max_num_batched_tokens) for `vllm serve` on a GPU of this size."""
    if cuda_total_bytes is not None and cuda_total_bytes >= LARGE_GPU_BYTES:
        return DEFAULT_LIMITS_LARGE_GPU
    return DEFAULT_LIMITS_SMALL_GPU


# ---------------------------------------------------------------------------------------------------------
# Overhead terms per stage
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OverheadInputs:
    """What the overhead of one GPU depends on (already validated)."""

    vllm_version: str
    hidden_size: int
    vocab_size: int
    has_vision: bool
    max_num_seqs: int
    max_num_batched_tokens: int
    enforce_eager: bool
    all2all_backend: str
    expert_parallel: bool
    tp: int
    dp: int
    pp: int
    gpus_per_node: int
    # The GPU's compute capability major (9 Hopper, 10 Blackwell); None when no GPU preset says it.
    compute_major: int | None = None
    # config.json's num_experts_per_tok, and the routed experts' weight format (WeightFormat.kind).
    experts_per_token: int = 8
    routed_format: str = "fp8_block"


def _by_release(table: tuple, version: str):
    release = parse_version(version)
    chosen = table[0]
    for entry in table:
        if release >= entry[0]:
            chosen = entry
    return chosen


def uses_model_runner_v2(version: str) -> bool:
    """Whether a K2 or DeepSeek model runs on Model Runner V2 under this release (MODEL_RUNNER_V2_SINCE)."""
    return _at_least(version, MODEL_RUNNER_V2_SINCE)


def sampler_bytes_per_logit(version: str) -> float:
    """Model Runner V1's sampler dummy run: bytes per logit under this release (SAMPLER_BYTES_PER_LOGIT_BY_RELEASE)."""
    return _by_release(SAMPLER_BYTES_PER_LOGIT_BY_RELEASE, version)[1]


def v2_sampler_bytes_per_logit(version: str, tp: int) -> float:
    """Model Runner V2's sampler dummy run: the logits' gather across TP, and from 0.33.0 the warmup pass."""
    gather = 2.0 + (2.0 + 2.0 / tp if tp > 1 else 0.0)
    if _at_least(version, SAMPLER_WARMUP_PASS_SINCE):
        return max(gather, V2_SAMPLER_WARMUP_BYTES_PER_LOGIT)
    return gather


def forward_bytes_per_unit(version: str, routed_format: str, compute_major: int | None) -> float:
    """The dummy forward's bytes per token x expert per token x hidden unit (FORWARD_BYTES_BY_RELEASE): the
    range's figure for this format and GPU family, else for this format on Hopper (unless this family runs a MoE
    kernel of its own in this release, OWN_MOE_KERNEL_SINCE), else the range's largest."""
    figures = _by_release(FORWARD_BYTES_BY_RELEASE, version)[1]
    if (routed_format, compute_major) in figures:
        return figures[(routed_format, compute_major)]
    own_kernel_since = OWN_MOE_KERNEL_SINCE.get((routed_format, compute_major))
    if (routed_format, 9) in figures and not (own_kernel_since and _at_least(version, own_kernel_since)):
        return figures[(routed_format, 9)]
    return max(figures.values())


def moe_tokens(inputs: OverheadInputs) -> int:
    """The tokens one GPU's MoE layers take in the dummy forward: max_num_batched_tokens, and with DP every
    engine's. With data_parallel_size above 1 the MoE layers of the DP engines run as one: the prepare/finalize
    step all-gathers every engine's tokens (AllGather+ReduceScatter, the default all2all backend, and the fallback
    without --enable-expert-parallel), sized per engine by the forward context's DP metadata without chunking
    (vllm/model_executor/layers/fused_moe/all2all_utils.py maybe_make_prepare_finalize,
    prepare_finalize/naive_dp_ep.py, vllm/forward_context.py DPMetadata.sp_local_sizes; read in 0.32.0). The
    profile runs max_num_batched_tokens on every engine, so each GPU's MoE sees DP times as many. The DeepEP backends
    send a token only where its experts are: for them this is the bound, the safe side. Measured: the Kimi-K2.6 DP 8
    run's forward is 7.4 times its TP 8 run's (k2.6-h200-nvl-dp8-ep-0.20.0)."""
    return inputs.max_num_batched_tokens * max(inputs.dp, 1)


def moe_units(inputs: OverheadInputs) -> int:
    """The MoE workspaces' size in units of one hidden element per routed token-expert pair: every per-unit constant
    (the forward's and what it leaves held) multiplies this."""
    return moe_tokens(inputs) * inputs.experts_per_token * inputs.hidden_size


def activation_bytes(inputs: OverheadInputs) -> int:
    """The torch peak of the dummy forward over max_num_batched_tokens tokens (every stage runs it), led by the MoE
    workspaces over the tokens the MoE layers gather (moe_tokens)."""
    per_unit = forward_bytes_per_unit(inputs.vllm_version, inputs.routed_format, inputs.compute_major)
    return int(moe_units(inputs) * per_unit)


def held_workspace_bytes(inputs: OverheadInputs) -> int:
    """What the forward leaves allocated while V2's sampler runs: the MoE workspaces (6 B per MoE unit) and the hidden
    states, at most the forward's peak."""
    hidden_states = inputs.max_num_batched_tokens * inputs.hidden_size * HIDDEN_STATE_BYTES
    return min(activation_bytes(inputs), int(moe_units(inputs) * HELD_WORKSPACE_BYTES_PER_UNIT) + hidden_states)


def sampler_peak_bytes(inputs: OverheadInputs) -> int:
    """The sampler's dummy run on the last stage: min(max_num_seqs, max_num_batched_tokens) x vocabulary logits; on
    Model Runner V2 on top of the MoE workspaces the forward left allocated."""
    requests = min(inputs.max_num_seqs, inputs.max_num_batched_tokens)
    logits = requests * inputs.vocab_size
    if uses_model_runner_v2(inputs.vllm_version):
        per_logit = v2_sampler_bytes_per_logit(inputs.vllm_version, inputs.tp)
        return held_workspace_bytes(inputs) + int(logits * per_logit)
    return int(logits * sampler_bytes_per_logit(inputs.vllm_version))


def sampler_bytes(inputs: OverheadInputs) -> int:
    """What the sampler's run adds to the peak: the part of its own peak above the forward's (the two run one after
    the other), 0 when the forward's is the larger."""
    return max(0, sampler_peak_bytes(inputs) - activation_bytes(inputs))


def sampler_state_bytes(inputs: OverheadInputs) -> int:
    """Model Runner V2's penalty state on the last stage (SAMPLER_STATE_BYTES_PER_ENTRY); none on V1."""
    if not uses_model_runner_v2(inputs.vllm_version):
        return 0
    entries = inputs.vocab_size + math.ceil(inputs.vocab_size / 32)
    return inputs.max_num_seqs * entries * SAMPLER_STATE_BYTES_PER_ENTRY


def encoder_bytes(inputs: OverheadInputs) -> int:
    """The vision encoder's dummy batch on the first stage (none with --language-model-only)."""
    if not inputs.has_vision:
        return 0
    return int(inputs.max_num_batched_tokens * VISION_HIDDEN_SIZE * ENCODER_BYTES_PER_TOKEN_PER_HIDDEN)


def non_torch_bytes(inputs: OverheadInputs) -> int:
    """NCCL, custom all-reduce and DeepEP memory that vLLM counts; a GPU without peers counts its libraries'
    workspaces only."""
    peers = inputs.tp * inputs.pp * inputs.dp > 1
    if not peers:
        return NON_TORCH_BYTES_ALONE
    counted = NON_TORCH_BYTES_WITH_PEERS
    if not _at_least(inputs.vllm_version, SNAPSHOT_AFTER_NCCL_SINCE):
        counted = NON_TORCH_BYTES_WITH_NCCL_INIT
    if inputs.expert_parallel and inputs.all2all_backend.startswith("deepep"):
        ep_size = inputs.tp * inputs.dp
        internode = ep_size > inputs.gpus_per_node
        counted += DEEPEP_BUFFER_BYTES * (2 if internode else 1)
    return counted


def cudagraph_capture_sizes(max_num_seqs: int, max_num_batched_tokens: int, largest_default: int = 512) -> list[int]:
    """vLLM's default capture sizes (vllm/config/vllm.py, 0.23.0 and 0.33.0): up to min(2 x max_num_seqs,
    largest_default, tokens); 1, 2, 4, then every 8 below 256, then every 16."""
    largest = min(max_num_seqs * 2, largest_default, max_num_batched_tokens)
    sizes = [size for size in (1, 2, 4) if size <= largest]
    sizes += list(range(8, min(largest + 1, 256), 8))
    sizes += list(range(256, largest + 1, 16))
    return sizes


def largest_default_capture(compute_major: int | None, version: str) -> int:
    """512, or 1024 on data-centre Blackwell from 0.28.0 (BLACKWELL_1024_GRAPHS_SINCE)."""
    if compute_major == 10 and _at_least(version, BLACKWELL_1024_GRAPHS_SINCE):
        return 1024
    return 512


def cudagraph_bytes(inputs: OverheadInputs) -> int:
    """The CUDA-graph estimate vLLM subtracts (FULL_AND_PIECEWISE: two graphs per capture size); 0 when eager or
    on a version that does not subtract it."""
    if inputs.enforce_eager or not subtracts_cudagraph_estimate(inputs.vllm_version):
        return 0
    largest = largest_default_capture(inputs.compute_major, inputs.vllm_version)
    graphs = 2 * len(cudagraph_capture_sizes(inputs.max_num_seqs, inputs.max_num_batched_tokens, largest))
    return graphs * CUDAGRAPH_BYTES_PER_GRAPH


def stage_overhead_bytes(inputs: OverheadInputs, stage: int) -> dict[str, int]:
    """Each overhead term of one GPU of pipeline stage `stage`, in bytes."""
    first, last = stage == 0, stage == inputs.pp - 1
    return {
        "activation": activation_bytes(inputs),
        "sampler": sampler_bytes(inputs) if last else 0,
        "sampler_state": sampler_state_bytes(inputs) if last else 0,
        "non_torch": non_torch_bytes(inputs),
        "encoder": encoder_bytes(inputs) if first else 0,
        "cudagraph": cudagraph_bytes(inputs),
    }


def requested_bytes(gpu_memory_utilization: float, cuda_total_bytes: float) -> int:
    """vLLM's requested memory: ceil(total x utilization) (vllm/v1/worker/utils.py request_memory, 0.23.0)."""
    return math.ceil(cuda_total_bytes * gpu_memory_utilization)


def logged_kv_tokens(num_blocks: int, block_size: int, dcp: int, max_model_len: int, version: str) -> int:
    """The "GPU KV cache size: N tokens" this version prints for num_blocks blocks per GPU.

    0.20.2 and later: int(max_concurrency x max_model_len) with max_concurrency = num_blocks / cdiv(cdiv(len, dcp),
    block_size) (kv_cache_utils.get_max_concurrency_for_kv_cache_config); before: num_blocks x block_size x dcp.
    """
    if not prints_tokens_from_concurrency(version):
        return num_blocks * block_size * dcp
    return int(logged_concurrency(num_blocks, block_size, dcp, max_model_len) * max_model_len)


def logged_concurrency(num_blocks: int, block_size: int, dcp: int, max_model_len: int) -> float:
    """ "Maximum concurrency for L tokens per request: X.XXx" before the scheduler's max_num_seqs cap."""
    per_request = math.ceil(math.ceil(max_model_len / dcp) / block_size)
    return num_blocks / per_request
