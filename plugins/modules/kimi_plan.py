#!/usr/bin/python
"""Ansible module: the per-GPU memory plan of a vLLM layout for a Kimi K2-family checkpoint."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kimi_plan
short_description: Per-GPU memory plan for vLLM serving a Kimi K2-family model; fails when it does not fit
description:
  - Computes, per GPU and per pipeline stage, the weights vLLM loads, the KV cache budget that is left, the KV
    tokens one replica holds (whole blocks) and the full-length sequences the deployment serves at once.
  - Models vLLM's rules, not pooled memory; MLA latent KV is replicated on every TP rank, pipeline stages split
    layers (vLLM's default partition), DCP splits a sequence's tokens, each DP rank has its own KV, expert
    parallelism shards routed experts over tp x dp ranks. See docs/planner.md.
  - The options are bin/kimi-plan's flags in snake_case. Pure computation; changes nothing, check mode returns
    the same answer.
  - Fails with the reasons when the plan does not fit, unless I(fail_on_misfit=false).
options:
  model:
    description: Model preset (Kimi-K2-Instruct, Kimi-K2-Instruct-0905, Kimi-K2-Thinking, Kimi-K2.5, Kimi-K2.6,
      Kimi-K2.7-Code, lab-mini) or the path of a checkpoint's config.json (or its folder) on the machine running
      the module.
    type: str
    default: Kimi-K2.7-Code
  weights_bytes:
    description: Checkpoint bytes, spread evenly over the tp x pp GPUs of one replica (the guides' rule).
      Without it (and without I(params)) the planner uses the component breakdown of the config and its
      quantization.
    type: int
  params:
    description: Parameter count; weights are I(params) x I(weight_bytes_per_param) x I(weight_overhead), spread
      like I(weights_bytes). Excludes I(weights_bytes).
    type: float
  weight_bytes_per_param:
    description: Bytes per parameter, with I(params).
    type: float
  weight_overhead:
    description: Multiplier for I(params) (default 1).
    type: float
  gpu:
    description: GPU preset (h100-80gb, h200, h200-nvl, rtx-pro-6000-server, b200, cpu) or the name nvidia-smi
      prints. C(cpu) is vLLM's CPU backend; give its memory with I(gpu_memory_gib) or a measured
      I(kv_cache_gib_per_gpu).
    type: str
  gpu_memory_gib:
    description: Memory per GPU the driver reports, GiB; overrides the preset's.
    type: float
  gpus_per_node:
    description: GPUs per node (default 8; 1 for C(cpu)).
    type: int
  nodes:
    description: Nodes; when given, tp x pp x dp must equal nodes x gpus_per_node.
    type: int
  gpu_memory_utilization:
    description: vLLM's --gpu-memory-utilization.
    type: float
    default: 0.9
  reserve_gib:
    description: Extra GiB per GPU kept back on top of the modelled overhead (0, as the kimi role's
      kimi_reserve_gib and bin/kimi-plan; the RTX PRO 6000 guide keeps 3 with I(overhead_model=none)).
    type: float
    default: 0.0
  kv_cache_gib_per_gpu:
    description: A measured KV budget per GPU (vLLM's "Available KV cache memory", or VLLM_CPU_KVCACHE_SPACE);
      replaces the computed one.
    type: float
  tp:
    description: Tensor parallel size.
    type: int
    default: 1
  pp:
    description: Pipeline parallel size.
    type: int
    default: 1
  dp:
    description: Data parallel size (each DP rank holds its own KV cache); default 1.
    type: int
  dcp:
    description: Decode context parallel size; must divide I(tp).
    type: int
    default: 1
  enable_expert_parallel:
    description: vLLM's --enable-expert-parallel (routed experts sharded whole over tp x dp ranks).
    type: bool
    default: false
  kv_cache_dtype:
    description: KV cache data type.
    type: str
    default: bf16
    choices: [bf16, fp8, auto, fp8_e4m3, fp8_e5m2]
  max_model_len:
    description: Tokens per sequence (default the model's max_position_embeddings).
    type: int
  block_size:
    description: KV block size in tokens (default the one vLLM's attention backend picks for the GPU and cache
      dtype, for example 16 on Hopper with a BF16 cache and 64 with FP8; 128 for C(cpu)).
    type: int
  pp_layer_partition:
    description: Layers per pipeline stage, as VLLM_PP_LAYER_PARTITION (for example C(31,30)).
    type: str
  language_model_only:
    description: vLLM's --language-model-only; leaves the vision encoder out of the weights.
    type: bool
    default: false
  vllm_version:
    description: The vLLM release whose rules apply (overhead terms, block size, printed token count,
      --kv-cache-memory-bytes support). From 0.10.1 to 0.33.x its own rules; up to ten minor releases past 0.33 the
      0.33.0 rules with a warning naming them; anything else is refused (no rule is near).
    type: str
    default: 0.33.0
  max_num_seqs:
    description: vLLM's --max-num-seqs (default vLLM's for the GPU); sizes the sampler and CUDA-graph terms and
      caps the concurrency.
    type: int
  max_num_batched_tokens:
    description: vLLM's --max-num-batched-tokens (default vLLM's for the GPU); sizes the forward (activation) term.
    type: int
  enforce_eager:
    description: vLLM's --enforce-eager (no CUDA graphs, so no graph memory estimate).
    type: bool
    default: false
  all2all_backend:
    description: The expert-parallel all2all backend; the C(deepep_*) ones add DeepEP's buffers.
    type: str
    default: allgather_reducescatter
    choices: [allgather_reducescatter, naive, pplx, deepep_high_throughput, deepep_low_latency, flashinfer_all2allv]
  overhead_model:
    description: C(vllm) subtracts the modelled per-stage overhead from the utilization of the CUDA-visible total;
      C(none) is the guides' rule, utilization x the driver's total - reserve - weights.
    type: str
    default: vllm
    choices: [vllm, none]
  pooled:
    description: Return the GreenNode guide's pooled arithmetic (labelled, for comparison; not what vLLM allocates).
    type: bool
    default: false
  fail_on_misfit:
    description: Fail when the plan does not fit. With C(false) the module returns the plan and its reasons.
    type: bool
    default: true
author:
  - Kimi K2 deployment collection
extends_documentation_fragment:
  - kimi.k2.attributes
  - kimi.k2.attributes.reads_only
"""

EXAMPLES = r"""
- name: Check the layout fits before anything is installed
  kimi_plan:
    model: Kimi-K2.7-Code
    gpu: h100-80gb
    gpus_per_node: 8
    nodes: 2
    tp: 8
    pp: 2
    enable_expert_parallel: true
    kv_cache_dtype: fp8
    max_model_len: 32768
    gpu_memory_utilization: 0.92
    reserve_gib: 4
  run_once: true
  delegate_to: localhost

- name: The lab's CPU nodes with a measured KV budget
  kimi_plan:
    model: lab-mini
    gpu: cpu
    kv_cache_gib_per_gpu: 1
    pp: 2
    nodes: 2
    max_model_len: 2048
"""

RETURN = r"""
fits:
  description: Whether the plan works.
  returned: always
  type: bool
reasons:
  description: Why it does not fit, each naming the numbers involved.
  returned: always
  type: list
  elements: str
kv_tokens:
  description: Tokens one replica holds, rounded down to whole blocks.
  returned: always
  type: int
  sample: 465920
max_concurrent_sequences:
  description: Full-length sequences the whole deployment holds at once (rounded down).
  returned: always
  type: int
weights_gib_per_gpu:
  description: Weights on one GPU of the stage that decides the KV tokens.
  returned: always
  type: float
kv_cache_gib_per_gpu:
  description: KV budget per GPU of that stage.
  returned: always
  type: float
kv_bytes_per_token_per_gpu:
  description: One token's KV bytes on one GPU of that stage (divided by DCP).
  returned: always
  type: raw
kv_cache_memory_bytes:
  description: The per-GPU KV budget to pass as vLLM's --kv-cache-memory-bytes (the smallest stage's, floored).
  returned: always
  type: int
kv_cache_memory_bytes_supported:
  description: Whether the pinned vLLM (I(vllm_version)) has --kv-cache-memory-bytes.
  returned: always
  type: bool
kv_tokens_deployed:
  description: The "GPU KV cache size" vLLM logs when started with that --kv-cache-memory-bytes.
  returned: always
  type: int
plan:
  description: The whole plan (per stage, weight breakdown, notes, suggestions), as bin/kimi-plan --json prints.
  returned: always
  type: dict
table:
  description: The readable budget box bin/kimi-plan prints without --json.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kimi.k2.plugins.module_utils.kimi_overhead import ALL2ALL_BACKENDS
from ansible_collections.kimi.k2.plugins.module_utils.kimi_plan_options import OPTION_DEFAULTS, plan_from_options
from ansible_collections.kimi.k2.plugins.module_utils.kimi_plan_render import render_text
from ansible_collections.kimi.k2.plugins.module_utils.kimi_presets import PlanInputError

# Types per option; the defaults are the planner's own (OPTION_DEFAULTS), the ones bin/kimi-plan uses, so the CLI
# and the play give the same plan for the same inputs.
_PLAN_TYPES = dict(
    model="str",
    weights_bytes="int",
    params="float",
    weight_bytes_per_param="float",
    weight_overhead="float",
    gpu="str",
    gpu_memory_gib="float",
    gpus_per_node="int",
    nodes="int",
    gpu_memory_utilization="float",
    reserve_gib="float",
    kv_cache_gib_per_gpu="float",
    tp="int",
    pp="int",
    dp="int",
    dcp="int",
    enable_expert_parallel="bool",
    kv_cache_dtype="str",
    max_model_len="int",
    block_size="int",
    pp_layer_partition="str",
    language_model_only="bool",
    pooled="bool",
    vllm_version="str",
    max_num_seqs="int",
    max_num_batched_tokens="int",
    enforce_eager="bool",
    all2all_backend="str",
    overhead_model="str",
)
PLAN_OPTIONS = {
    name: {"type": kind, **({"default": OPTION_DEFAULTS[name]} if OPTION_DEFAULTS[name] is not None else {})}
    for name, kind in _PLAN_TYPES.items()
}
PLAN_OPTIONS["kv_cache_dtype"]["choices"] = ["bf16", "fp8", "auto", "fp8_e4m3", "fp8_e5m2"]
PLAN_OPTIONS["all2all_backend"]["choices"] = list(ALL2ALL_BACKENDS)
PLAN_OPTIONS["overhead_model"]["choices"] = ["vllm", "none"]

SUMMARY_KEYS = (
    "fits",
    "reasons",
    "kv_tokens",
    "max_concurrent_sequences",
    "weights_gib_per_gpu",
    "kv_cache_gib_per_gpu",
    "kv_bytes_per_token_per_gpu",
    "kv_cache_memory_bytes",
    "kv_cache_memory_bytes_supported",
    "kv_tokens_deployed",
)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(PLAN_OPTIONS, fail_on_misfit=dict(type="bool", default=True)),
        mutually_exclusive=[("weights_bytes", "params")],
        required_by={"params": ("weight_bytes_per_param",)},
        supports_check_mode=True,
    )
    options = {key: module.params[key] for key in PLAN_OPTIONS}
    try:
        plan = plan_from_options(options)
    except PlanInputError as exc:
        error = f"{exc.flag.removeprefix('--').replace('-', '_')}: {exc.message}"
    else:
        error = None
    if error:
        # Outside the except block, so Ansible reports the message, not a traceback.
        module.fail_json(msg=error)
    for warning in plan.get("warnings", []):
        module.warn(warning)
    result = {key: plan.get(key) for key in SUMMARY_KEYS}
    result.update(changed=False, plan=plan, table=render_text(plan))
    if not plan["fits"] and module.params["fail_on_misfit"]:
        module.fail_json(msg="plan does not fit: " + "; ".join(plan["reasons"]), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
