"""The planner's options, shared by bin/kimi-plan and the kimi_plan module: defaults, validation of every
value as typed (strings from -e or a shell), and the plan they ask for. Each refusal names the flag.
"""

from __future__ import annotations

import math
from typing import Any

from .kimi_overhead import (
    ALL2ALL_BACKENDS,
    DEFAULT_ALL2ALL_BACKEND,
    PINNED_VLLM_VERSION,
    default_block_size,
    default_limits,
    version_warning,
)
from .kimi_plan import PlanInputs, compute_plan, pooled_plan
from .kimi_presets import (
    CPU_BLOCK_SIZE,
    DEFAULT_MODEL,
    GIB,
    GpuSpec,
    PlanInputError,
    find_gpu,
    find_model,
)

# ---------------------------------------------------------------------------------------------------------
# Options (shared by the CLI and the Ansible module)
# ---------------------------------------------------------------------------------------------------------

OPTION_DEFAULTS: dict[str, Any] = {
    "model": DEFAULT_MODEL,
    "weights_bytes": None,
    "params": None,
    "weight_bytes_per_param": None,
    "weight_overhead": None,
    "gpu": None,
    "gpu_memory_gib": None,
    "gpus_per_node": None,
    "nodes": None,
    "gpu_memory_utilization": 0.9,
    "reserve_gib": 0.0,
    "kv_cache_gib_per_gpu": None,
    "tp": 1,
    "pp": 1,
    "dp": None,
    "dcp": 1,
    "enable_expert_parallel": False,
    "kv_cache_dtype": "bf16",
    "max_model_len": None,
    "block_size": None,
    "pp_layer_partition": None,
    "language_model_only": False,
    "pooled": False,
    "vllm_version": PINNED_VLLM_VERSION,
    "max_num_seqs": None,
    "max_num_batched_tokens": None,
    "enforce_eager": False,
    "all2all_backend": DEFAULT_ALL2ALL_BACKEND,
    "overhead_model": "vllm",
}
KV_CACHE_DTYPES = ("bf16", "fp8", "auto", "fp8_e4m3", "fp8_e5m2")
OVERHEAD_MODELS = ("vllm", "none")
# vLLM's CPU backend defaults for `vllm serve` (engine/arg_utils.py, 0.23.0): 128 sequences and 2048 batched tokens
# per rank of the world.
CPU_DEFAULT_LIMITS_PER_RANK = (128, 2048)


def flag_name(option: str) -> str:
    return "--" + option.replace("_", "-")


def _parse_number(value: Any, kind: type) -> int | float:
    if isinstance(value, bool):
        raise ValueError("a boolean is not a number")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError("not finite")
    if kind is int:
        if not number.is_integer():
            raise ValueError("not a whole number")
        return int(number)
    return number


def _number(options: dict[str, Any], key: str, kind: type, minimum: float, *, strict: bool = False) -> Any:
    """options[key] as an int or float >= minimum (> minimum when strict), or None when absent."""
    value = options.get(key)
    if value is None:
        return None
    try:
        number = _parse_number(value, kind)
    except (TypeError, ValueError) as exc:
        expected = "a whole number" if kind is int else "a number"
        raise PlanInputError(flag_name(key), f"expected {expected}, got {value!r}") from exc
    if number < minimum or (strict and number == minimum):
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        raise PlanInputError(flag_name(key), f"must be {bound} (got {value})")
    return number


def _checkpoint_weight_bytes(options: dict[str, Any]) -> int | None:
    weights = _number(options, "weights_bytes", int, 1)
    params = _number(options, "params", float, 0, strict=True)
    per_param = _number(options, "weight_bytes_per_param", float, 0, strict=True)
    overhead = _number(options, "weight_overhead", float, 0, strict=True)
    if weights is not None and params is not None:
        raise PlanInputError("--weights-bytes", "give either --weights-bytes or --params, not both")
    if params is None:
        if per_param is not None or overhead is not None:
            flag = "--weight-bytes-per-param" if per_param is not None else "--weight-overhead"
            raise PlanInputError(flag, "only applies with --params")
        return weights
    if per_param is None:
        raise PlanInputError("--params", "needs --weight-bytes-per-param")
    return round(params * per_param * (overhead if overhead is not None else 1.0))


def _partition(value: Any) -> tuple[int, ...] | None:
    if value in (None, ""):
        return None
    parts = value.split(",") if isinstance(value, str) else list(value)
    try:
        return tuple(int(str(part).strip()) for part in parts)
    except ValueError as exc:
        raise PlanInputError("--pp-layer-partition", f"not a comma-separated list of integers: {value!r}") from exc


def _gpu_and_memory(options: dict[str, Any], overhead_model: str) -> tuple[GpuSpec | None, float | None]:
    """The GPU preset and the total the budget starts from: --gpu-memory-gib as given, else the preset's
    CUDA-visible total (what vLLM multiplies) or, for the guides' rule (--overhead-model none), the driver's."""
    gpu = find_gpu(str(options["gpu"])) if options.get("gpu") else None
    memory = _number(options, "gpu_memory_gib", float, 0, strict=True)
    if memory is None and gpu is not None:
        memory = gpu.vllm_total_gib if overhead_model == "vllm" else gpu.memory_gib
    if gpu is not None and gpu.is_cpu and memory is None and options.get("kv_cache_gib_per_gpu") is None:
        raise PlanInputError("--gpu-memory-gib", "--gpu cpu needs the memory (or --kv-cache-gib-per-gpu)")
    if memory is None and options.get("kv_cache_gib_per_gpu") is None:
        raise PlanInputError("--gpu", "give --gpu NAME or --gpu-memory-gib G (or a measured --kv-cache-gib-per-gpu)")
    return gpu, memory


# Option -> (type, minimum, strictly greater): checked before anything else so an error names the flag at fault.
NUMERIC_OPTIONS: dict[str, tuple[type, float, bool]] = {
    "tp": (int, 1, False),
    "pp": (int, 1, False),
    "dp": (int, 1, False),
    "dcp": (int, 1, False),
    "nodes": (int, 1, False),
    "gpus_per_node": (int, 1, False),
    "max_model_len": (int, 1, False),
    "block_size": (int, 1, False),
    "gpu_memory_utilization": (float, 0, True),
    "reserve_gib": (float, 0, False),
    "kv_cache_gib_per_gpu": (float, 0, True),
    "gpu_memory_gib": (float, 0, True),
    "max_num_seqs": (int, 1, False),
    "max_num_batched_tokens": (int, 1, False),
}


def _choice(options: dict[str, Any], key: str, choices: tuple[str, ...]) -> str:
    value = str(options[key]).lower()
    if value not in choices:
        raise PlanInputError(flag_name(key), f"must be one of {', '.join(choices)} (got {value!r})")
    return value


def _limits(numbers: dict[str, Any], gpu: GpuSpec | None, memory: float | None, world_size: int) -> tuple[int, int]:
    """max_num_seqs and max_num_batched_tokens as given, else vLLM's defaults for this GPU."""
    if gpu is not None and gpu.is_cpu:
        seqs, tokens = (limit * world_size for limit in CPU_DEFAULT_LIMITS_PER_RANK)
    else:
        seqs, tokens = default_limits(None if memory is None else memory * GIB)
    return numbers["max_num_seqs"] or seqs, numbers["max_num_batched_tokens"] or tokens


def inputs_from_options(raw: dict[str, Any]) -> PlanInputs:
    """Validate the options (CLI flags in snake_case) into PlanInputs; PlanInputError names the bad flag."""
    unknown = set(raw) - set(OPTION_DEFAULTS)
    if unknown:
        raise PlanInputError(flag_name(sorted(unknown)[0]), "unknown option")
    options = {**OPTION_DEFAULTS, **{key: value for key, value in raw.items() if value is not None}}
    numbers = {key: _number(options, key, *spec[:2], strict=spec[2]) for key, spec in NUMERIC_OPTIONS.items()}
    if numbers["gpu_memory_utilization"] > 1:
        raise PlanInputError("--gpu-memory-utilization", f"must be <= 1 (got {numbers['gpu_memory_utilization']})")
    dtype = str(options["kv_cache_dtype"]).lower()
    if dtype not in KV_CACHE_DTYPES:
        raise PlanInputError("--kv-cache-dtype", f"must be one of {', '.join(KV_CACHE_DTYPES)} (got {dtype!r})")
    version = str(options["vllm_version"]).strip()
    # Refuses, naming --vllm-version, what does not parse or has no rule near; else the warning, if any.
    warning = version_warning(version)
    all2all = _choice(options, "all2all_backend", ALL2ALL_BACKENDS)
    overhead_model = _choice(options, "overhead_model", OVERHEAD_MODELS)
    weights_bytes = _checkpoint_weight_bytes(options)
    partition = _partition(options.get("pp_layer_partition"))
    model = find_model(str(options["model"]))
    gpu, memory = _gpu_and_memory(options, overhead_model)
    is_cpu = gpu is not None and gpu.is_cpu
    explicit_memory = options.get("gpu_memory_gib") is not None
    kv_dtype = "bf16" if dtype == "auto" else dtype
    gpus_per_node = numbers["gpus_per_node"] or (1 if is_cpu else 8)
    tp, pp = numbers["tp"], numbers["pp"]
    dp = numbers["dp"] or 1  # vLLM's default; a mismatch with --nodes is a reason, not a guess
    max_model_len = numbers["max_model_len"] or model.max_position_embeddings
    if not max_model_len:
        raise PlanInputError("--max-model-len", "the model config has no max_position_embeddings: give it")
    max_num_seqs, max_num_batched_tokens = _limits(numbers, gpu, memory, tp * pp * dp)
    compute_major = gpu.compute_major if gpu else None
    block_size = CPU_BLOCK_SIZE if is_cpu else default_block_size(compute_major, kv_dtype, version)
    return PlanInputs(
        model=model,
        gpu=gpu,
        gpu_memory_gib=memory,
        gpus_per_node=gpus_per_node,
        nodes=numbers["nodes"],
        gpu_memory_utilization=numbers["gpu_memory_utilization"],
        reserve_gib=numbers["reserve_gib"],
        kv_cache_gib_per_gpu=numbers["kv_cache_gib_per_gpu"],
        tp=tp,
        pp=pp,
        dp=dp,
        dcp=numbers["dcp"],
        enable_expert_parallel=bool(options["enable_expert_parallel"]),
        kv_cache_dtype=kv_dtype,
        max_model_len=max_model_len,
        block_size=numbers["block_size"] or block_size,
        weights_bytes=weights_bytes,
        pp_layer_partition=partition,
        language_model_only=bool(options["language_model_only"]),
        vllm_version=version,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        enforce_eager=bool(options["enforce_eager"]),
        all2all_backend=all2all,
        overhead_model=overhead_model,
        gpu_memory_gib_driver=None if explicit_memory or gpu is None else gpu.memory_gib,
        version_warning=warning,
    )


def plan_from_options(raw: dict[str, Any]) -> dict[str, Any]:
    """The plan (or, with pooled=True, the GreenNode guide's pooled arithmetic) for CLI-style options."""
    inputs = inputs_from_options(raw)
    plan = pooled_plan(inputs) if raw.get("pooled") else compute_plan(inputs)
    plan["warnings"] = [inputs.version_warning] if inputs.version_warning else []
    return plan
