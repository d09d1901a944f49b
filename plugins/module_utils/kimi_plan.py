"""Per-GPU memory planner for vLLM serving Kimi K2-family checkpoints (MLA attention, MoE experts).

It computes what vLLM will allocate on each GPU of a layout (tp, pp, dp, dcp, expert parallel), not what the
pooled memory of all GPUs would allow: under tensor parallelism vLLM keeps the whole MLA latent KV cache on every
TP rank, so pooling all GPUs' memory overstates the KV tokens by the TP factor (docs/planner.md).

Stdlib only and free of Ansible imports: plugins/modules/kimi_plan.py imports it as ``ansible.module_utils.kimi_plan``,
bin/kimi-plan and the unit tests import it directly. Every rule carries a comment naming the vLLM source or
document it follows; the numbers behind each preset name their source too.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

GIB = 1024**3
BF16_BYTES = 2
FP32_BYTES = 4
DEFAULT_MODEL = "Kimi-K2.7-Code"
DEFAULT_GPU_BLOCK_SIZE = 16
# vLLM's CPU backend pages the KV cache in blocks of 128 tokens (vllm/platforms/cpu.py,
# CpuPlatform.check_and_update_config); the lab measured "CPU KV cache size: 465,920 tokens" for 1 GiB with
# the 2-layer miniature model, which is floor(2^30 / (2 x 576 x 2 B) / 128) x 128 (docs/lab-facts.md).
CPU_BLOCK_SIZE = 128
# MoonViT, the vision encoder of the K2.5-based checkpoints: about 400M parameters, BF16 (the RTX PRO 6000 guide).
MOONVIT_PARAMS = 400_000_000


class PlanInputError(ValueError):
    """An input the planner cannot use; ``flag`` names the CLI flag (the module maps it to its option)."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(f"{flag}: {message}")
        self.flag = flag
        self.message = message


# ---------------------------------------------------------------------------------------------------------
# How weights are stored: bytes of one linear layer's weight as vLLM keeps it after loading.
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WeightFormat:
    """Storage of a linear layer's weight: unquantized, FP8 with block scales, or packed integers in groups."""

    kind: str  # "bf16", "fp8_block", "fp8_channel", "int_group", "int_channel"
    bits: int = 16
    block: tuple[int, int] = (128, 128)
    group_size: int = 32

    def linear_bytes(self, out_features: int, in_features: int) -> int:
        """Bytes of a [out_features, in_features] weight with its scales (one rank's shard)."""
        if out_features <= 0 or in_features <= 0:
            return 0
        if self.kind == "bf16":
            return out_features * in_features * BF16_BYTES
        if self.kind == "fp8_block":
            # DeepSeek-style block FP8: one byte per weight plus one fp32 weight_scale_inv per 128x128 block
            # (quantization_config.weight_block_size; vllm/model_executor/layers/quantization/fp8.py).
            scales = math.ceil(out_features / self.block[0]) * math.ceil(in_features / self.block[1])
            return out_features * in_features + scales * FP32_BYTES
        if self.kind == "fp8_channel":
            return out_features * in_features + out_features * FP32_BYTES
        packed = out_features * math.ceil(in_features * self.bits / 32) * 4
        if self.kind == "int_group":
            # compressed-tensors pack-quantized: weights packed 32/bits to an int32 along the input dimension,
            # one BF16 scale per group of group_size inputs (symmetric: no zero point). The tiny weight_shape
            # tensor is left out.
            return packed + out_features * math.ceil(in_features / self.group_size) * BF16_BYTES
        return packed + out_features * BF16_BYTES  # int_channel

    def describe(self) -> str:
        if self.kind == "bf16":
            return "BF16"
        if self.kind == "fp8_block":
            return f"FP8 with {self.block[0]}x{self.block[1]} block scales"
        if self.kind == "fp8_channel":
            return "FP8 with per-channel scales"
        if self.kind == "int_group":
            return f"INT{self.bits} in groups of {self.group_size} with BF16 scales"
        return f"INT{self.bits} with per-channel scales"


UNQUANTIZED = WeightFormat("bf16")


@dataclass(frozen=True)
class Quantization:
    """Which linear layers a checkpoint quantizes, read from config.json's quantization_config."""

    name: str
    quantized_format: WeightFormat = UNQUANTIZED
    ignore: tuple[str, ...] = ()
    quantize_all_linears: bool = False

    def format_for(self, module_name: str) -> WeightFormat:
        """Format of the linear layer with this module name (DeepSeek-V3 names, as in the checkpoint)."""
        if self.quantized_format.kind == "bf16" or module_name == "lm_head":
            # vLLM builds the LM head as ParallelLMHead, which the FP8 and compressed-tensors methods leave
            # unquantized; K2's compressed-tensors config lists it in `ignore` as well.
            return UNQUANTIZED
        if any(_ignore_matches(pattern, module_name) for pattern in self.ignore):
            return UNQUANTIZED
        return self.quantized_format


def _ignore_matches(pattern: str, module_name: str) -> bool:
    # compressed-tensors: "re:" entries are regular expressions matched against the module name, other entries
    # name a module (or its last component).
    if pattern.startswith("re:"):
        return re.match(pattern[3:], module_name) is not None
    return module_name == pattern or module_name.endswith("." + pattern)


def quantization_from_config(config: dict[str, Any]) -> Quantization:
    """Read config.json's quantization_config (top level or text_config) into a Quantization."""
    text = config.get("text_config") or {}
    qcfg = config.get("quantization_config") or text.get("quantization_config")
    if not qcfg:
        return Quantization("BF16 (no quantization_config)")
    method = qcfg.get("quant_method")
    if method == "fp8":
        block = qcfg.get("weight_block_size")
        ignored = tuple(qcfg.get("modules_to_not_convert") or qcfg.get("ignored_layers") or ())
        if block:
            fmt = WeightFormat("fp8_block", bits=8, block=(int(block[0]), int(block[1])))
        else:
            fmt = WeightFormat("fp8_channel", bits=8)
        return Quantization(f"{fmt.describe()}, BF16 elsewhere", fmt, ignored, quantize_all_linears=True)
    if method == "compressed-tensors":
        return _compressed_tensors_quantization(qcfg)
    raise ValueError(f"unsupported quant_method {method!r} in quantization_config")


def _compressed_tensors_quantization(qcfg: dict[str, Any]) -> Quantization:
    groups = qcfg.get("config_groups") or {}
    if len(groups) != 1:
        raise ValueError("compressed-tensors: exactly one config group is supported")
    group = next(iter(groups.values()))
    weights = group.get("weights") or {}
    bits = int(weights.get("num_bits", 0))
    kind = weights.get("type", "int")
    strategy = weights.get("strategy", "group")
    if kind == "int" and strategy == "group":
        fmt = WeightFormat("int_group", bits=bits, group_size=int(weights.get("group_size") or 128))
    elif kind == "int" and strategy == "channel":
        fmt = WeightFormat("int_channel", bits=bits)
    elif kind == "float" and bits == 8 and strategy == "block":
        block = weights.get("block_structure") or [128, 128]
        fmt = WeightFormat("fp8_block", bits=8, block=(int(block[0]), int(block[1])))
    elif kind == "float" and bits == 8:
        fmt = WeightFormat("fp8_channel", bits=8)
    else:
        raise ValueError(f"compressed-tensors: unsupported weight scheme {kind} {bits}-bit {strategy}")
    ignore = tuple(qcfg.get("ignore") or ())
    return Quantization(f"compressed-tensors {fmt.describe()}", fmt, ignore)


# ---------------------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSpec:
    """The config.json numbers the planner needs (DeepSeek-V3 / Kimi K2 architecture)."""

    name: str
    num_hidden_layers: int
    hidden_size: int
    intermediate_size: int
    moe_intermediate_size: int
    n_routed_experts: int
    n_shared_experts: int
    first_k_dense_replace: int
    num_attention_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    vocab_size: int
    max_position_embeddings: int
    quantization: Quantization
    moe_layer_freq: int = 1
    tie_word_embeddings: bool = False
    vision_params: int = 0
    checkpoint_bytes: int | None = None
    source: str = ""
    # The Hub repository the preset describes; the input check refuses a checkpoint_repo_id that differs.
    repo_id: str = ""

    @property
    def kv_values_per_token_per_layer(self) -> int:
        """MLA caches one latent vector plus the shared RoPE key per token and layer."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    def is_moe_layer(self, index: int) -> bool:
        # DeepseekV2DecoderLayer (vllm/model_executor/models/deepseek_v2.py): a layer uses the MoE block when
        # n_routed_experts is set, index >= first_k_dense_replace and index % moe_layer_freq == 0.
        return (
            self.n_routed_experts > 0
            and index >= self.first_k_dense_replace
            and index % max(self.moe_layer_freq, 1) == 0
        )


def _kimi_k2_architecture(**overrides: Any) -> dict[str, Any]:
    # Kimi K2 config.json (moonshotai/Kimi-K2-Instruct and the later K2 checkpoints): checked against public
    # copies found with the search tool (docs/planner.md lists them).
    values: dict[str, Any] = {
        "num_hidden_layers": 61,
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "n_routed_experts": 384,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "num_attention_heads": 64,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "vocab_size": 163840,
    }
    values.update(overrides)
    return values


# Kimi-K2-Instruct(-0905): quant_method fp8, fmt e4m3, weight_block_size [128, 128] (block FP8 everywhere a
# linear layer is, as DeepSeek-V3 ships it).
K2_FP8 = Quantization(
    "FP8 with 128x128 block scales, BF16 elsewhere",
    WeightFormat("fp8_block", bits=8, block=(128, 128)),
    quantize_all_linears=True,
)
# Kimi-K2-Thinking and the K2.5-based checkpoints: compressed-tensors pack-quantized, int4 symmetric, group 32,
# ignore = lm_head, self_attn, shared_experts, and the dense layer's mlp.(gate|up|down)_proj: only the routed
# experts are INT4.
K2_INT4 = Quantization(
    "compressed-tensors INT4 routed experts (groups of 32), BF16 elsewhere",
    WeightFormat("int_group", bits=4, group_size=32),
    ignore=(
        "lm_head",
        "re:.*self_attn.*",
        "re:.*shared_experts.*",
        r"re:.*mlp\.(gate|up|gate_up|down)_proj.*",
        "re:.*vision_tower.*",
        "re:.*mm_projector.*",
    ),
)

MODEL_PRESETS: dict[str, ModelSpec] = {
    "Kimi-K2-Instruct": ModelSpec(
        name="Kimi-K2-Instruct",
        repo_id="moonshotai/Kimi-K2-Instruct",
        max_position_embeddings=131072,
        quantization=K2_FP8,
        source="moonshotai/Kimi-K2-Instruct config.json (block FP8, 128K context)",
        **_kimi_k2_architecture(),
    ),
    "Kimi-K2-Instruct-0905": ModelSpec(
        name="Kimi-K2-Instruct-0905",
        repo_id="moonshotai/Kimi-K2-Instruct-0905",
        max_position_embeddings=262144,
        quantization=K2_FP8,
        source="moonshotai/Kimi-K2-Instruct-0905 config.json (block FP8, YaRN factor 64: 256K context)",
        **_kimi_k2_architecture(),
    ),
    "Kimi-K2-Thinking": ModelSpec(
        name="Kimi-K2-Thinking",
        repo_id="moonshotai/Kimi-K2-Thinking",
        max_position_embeddings=262144,
        quantization=K2_INT4,
        source="moonshotai/Kimi-K2-Thinking config.json (compressed-tensors INT4 experts, 256K context)",
        **_kimi_k2_architecture(),
    ),
    "Kimi-K2.7-Code": ModelSpec(
        name="Kimi-K2.7-Code",
        repo_id="moonshotai/Kimi-K2.7-Code",
        max_position_embeddings=262144,
        quantization=K2_INT4,
        vision_params=MOONVIT_PARAMS,
        # Sum of the 64 safetensors files of moonshotai/Kimi-K2.7-Code, as the RTX PRO 6000 guide reports it.
        checkpoint_bytes=595_177_988_208,
        source=(
            "moonshotai/Kimi-K2.7-Code (K2.5 architecture + MoonViT; INT4 experts as K2-Thinking; RTX PRO 6000 guide)"
        ),
        **_kimi_k2_architecture(),
    ),
}


def load_model_config(path: Path, name: str | None = None) -> ModelSpec:
    """A ModelSpec from a checkpoint's config.json (or the directory holding it)."""
    config_path = path / "config.json" if path.is_dir() else path
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {config_path}: {exc}") from exc
    return model_from_config(config, name or config_path.parent.name or str(config_path), str(config_path))


def model_from_config(config: dict[str, Any], name: str, source: str = "config.json") -> ModelSpec:
    """Read the architecture from a config dict; K2.5-style configs nest it under text_config."""
    text = config.get("text_config") or config
    try:
        spec = ModelSpec(
            name=name,
            num_hidden_layers=int(text["num_hidden_layers"]),
            hidden_size=int(text["hidden_size"]),
            intermediate_size=int(text["intermediate_size"]),
            moe_intermediate_size=int(text.get("moe_intermediate_size") or 0),
            n_routed_experts=int(text.get("n_routed_experts") or 0),
            n_shared_experts=int(text.get("n_shared_experts") or 0),
            first_k_dense_replace=int(text.get("first_k_dense_replace") or 0),
            moe_layer_freq=int(text.get("moe_layer_freq") or 1),
            num_attention_heads=int(text["num_attention_heads"]),
            q_lora_rank=int(text["q_lora_rank"]) if text.get("q_lora_rank") else None,
            kv_lora_rank=int(text["kv_lora_rank"]),
            qk_rope_head_dim=int(text["qk_rope_head_dim"]),
            qk_nope_head_dim=int(text["qk_nope_head_dim"]),
            v_head_dim=int(text["v_head_dim"]),
            vocab_size=int(text["vocab_size"]),
            max_position_embeddings=int(text.get("max_position_embeddings") or 0),
            tie_word_embeddings=bool(text.get("tie_word_embeddings", False)),
            quantization=quantization_from_config(config),
            vision_params=MOONVIT_PARAMS if config.get("vision_config") else 0,
            source=source,
        )
    except KeyError as exc:
        raise ValueError(f"{source}: not an MLA config, {exc.args[0]!r} is missing") from exc
    return spec


def _lab_mini() -> ModelSpec:
    # The lab's miniature Kimi-K2-shaped checkpoint: lab/mirrors/hf/config.json, copied here field for field so the
    # planner needs no file at run time. 4 layers (2 when the lab's figures were first measured,
    # tests/fixtures/lab-mini-2-layers-measured/), so that PP = nodes covers a 4-node lab.
    config = {
        "num_hidden_layers": 4,
        "hidden_size": 256,
        "intermediate_size": 512,
        "moe_intermediate_size": 128,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "num_attention_heads": 4,
        "q_lora_rank": 128,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "vocab_size": 2112,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": False,
    }
    return model_from_config(config, "lab-mini", "lab/mirrors/hf/config.json (lab miniature)")


MODEL_PRESETS["lab-mini"] = _lab_mini()


def find_model(value: str) -> ModelSpec:
    """A preset by name (case-insensitive, "moonshotai/" optional) or a path to config.json or its folder."""
    wanted = value.strip().removeprefix("moonshotai/").lower()
    for key, spec in MODEL_PRESETS.items():
        if key.lower() == wanted:
            return spec
    path = Path(value).expanduser()
    if path.exists():
        try:
            return load_model_config(path)
        except ValueError as exc:
            raise PlanInputError("--model", str(exc)) from exc
    names = ", ".join(MODEL_PRESETS)
    raise PlanInputError("--model", f"unknown model {value!r} (presets: {names}; or a path to config.json)")


# ---------------------------------------------------------------------------------------------------------
# GPUs: memory.total as nvidia-smi reports it (MiB), the number vLLM's gpu_memory_utilization multiplies.
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuSpec:
    """A GPU model as the driver reports it."""

    key: str
    driver_names: tuple[str, ...]
    memory_mib: int | None
    source: str
    aliases: tuple[str, ...] = ()
    is_cpu: bool = False

    @property
    def memory_gib(self) -> float | None:
        return None if self.memory_mib is None else self.memory_mib / 1024


GPU_PRESETS: dict[str, GpuSpec] = {
    spec.key: spec
    for spec in (
        GpuSpec(
            "h100-80gb",
            ("NVIDIA H100 80GB HBM3",),
            81559,
            "nvidia-smi '0MiB / 81559MiB' on 8x H100 SXM, driver 550.54.15: github.com/NVIDIA/nccl/issues/1264; "
            "81559MiB listed for H100 in github.com/modal-labs/modal-client/pull/2797",
            aliases=("h100", "h100-sxm", "h100-80gb-hbm3"),
        ),
        GpuSpec(
            "h200",
            ("NVIDIA H200",),
            143771,
            "nvidia-smi '124585MiB / 143771MiB' on 8x H200, driver 550.144.03: "
            "github.com/sgl-project/sglang/issues/3196",
            aliases=("h200-sxm", "h200-141gb"),
        ),
        GpuSpec(
            "h200-nvl",
            ("NVIDIA H200 NVL",),
            143771,
            "public setup notes found with the code search record 'NVIDIA H200 NVL (143771 MiB, driver "
            "570.195.03)'; same 141 GB HBM3e as the SXM part. Secondary source: confirm with a capture.",
            aliases=("h200nvl",),
        ),
        GpuSpec(
            "rtx-pro-6000-server",
            ("NVIDIA RTX PRO 6000 Blackwell Server Edition",),
            97887,
            "public records found with the code search: 'RTX PRO 6000 Blackwell Server Edition, 97887 MiB, "
            "595.71.05 driver'; the RTX PRO 6000 guide rounds it to 95.6 GiB. "
            "Secondary source: confirm with a capture.",
            aliases=("rtx-pro-6000", "rtx-pro-6000-blackwell-server-edition", "rtx-pro-6000-se"),
        ),
        GpuSpec(
            "b200",
            ("NVIDIA B200",),
            183359,
            "nvidia-smi '166593MiB / 183359MiB' on 8x B200, driver 580.95.05: "
            "github.com/NVIDIA/TensorRT-LLM/issues/10278",
        ),
        GpuSpec(
            "cpu",
            (),
            None,
            "pseudo-GPU for vLLM's CPU backend: give its memory with --gpu-memory-gib (or a measured KV budget "
            "with --kv-cache-gib-per-gpu, VLLM_CPU_KVCACHE_SPACE)",
            is_cpu=True,
        ),
    )
}


def _normalise(name: str) -> str:
    return re.sub(r"[\s_]+", "-", name.strip().lower())


def find_gpu(value: str) -> GpuSpec:
    """A GPU preset by key, alias or the name nvidia-smi prints."""
    wanted = _normalise(value)
    for spec in GPU_PRESETS.values():
        names = (spec.key, *spec.aliases, *spec.driver_names)
        if wanted in {_normalise(name) for name in names}:
            return spec
    raise PlanInputError("--gpu", f"unknown GPU {value!r} (presets: {', '.join(GPU_PRESETS)})")


def gpu_preset_for_driver_name(name: str) -> GpuSpec | None:
    """The preset whose driver name equals what nvidia-smi printed, or None."""
    for spec in GPU_PRESETS.values():
        if name.strip() in spec.driver_names:
            return spec
    return None


# ---------------------------------------------------------------------------------------------------------
# Layout rules
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


def layout_problems(model: ModelSpec, tp: int, pp: int, dp: int, dcp: int, expert_parallel: bool) -> list[str]:
    """Layout rules vLLM enforces at start-up, as reasons the plan cannot run."""
    problems = []
    if tp % dcp:
        # vLLM: decode_context_parallel_size must divide tensor_parallel_size (DCP reuses the TP group).
        problems.append(f"DCP {dcp} does not divide TP {tp}: vLLM requires tp % dcp == 0")
    if model.num_attention_heads % tp:
        problems.append(
            f"TP {tp} does not divide the {model.num_attention_heads} attention heads: vLLM refuses the layout"
        )
    if pp > model.num_hidden_layers:
        problems.append(f"PP {pp} exceeds the {model.num_hidden_layers} layers of {model.name}")
    group = tp * dp
    if model.n_routed_experts and expert_parallel and group > model.n_routed_experts:
        problems.append(f"EP size {group} exceeds the {model.n_routed_experts} routed experts")
    if model.n_routed_experts:
        problems.extend(_moe_tp_shard_problems(model, tp, group, expert_parallel))
    return problems


def _moe_tp_shard_problems(model: ModelSpec, tp: int, group: int, expert_parallel: bool) -> list[str]:
    # Each routed expert's intermediate dimension is split over tp x dp ranks unless expert parallelism keeps the
    # experts whole; the shared expert's is always split over tp. A shard must be whole and hold whole
    # quantization blocks or groups, or vLLM's weight loader refuses it (block FP8: "not divisible by weight
    # quantization block").
    checks = [("shared expert's", "model.layers.1.mlp.shared_experts.down_proj", tp, "use a smaller TP")]
    if not expert_parallel:
        checks.insert(
            0,
            (
                "routed experts'",
                "model.layers.1.mlp.experts.0.down_proj",
                group,
                "use --enable-expert-parallel or a smaller TP x DP",
            ),
        )
    problems = []
    total = model.moe_intermediate_size
    for what, name, ranks, advice in checks:
        fmt = model.quantization.format_for(name)
        unit = fmt.block[1] if fmt.kind == "fp8_block" else fmt.group_size if fmt.kind == "int_group" else 1
        if total % ranks or (total // ranks) % unit:
            kind = "block" if fmt.kind == "fp8_block" else "group"
            detail = f", not a multiple of the {unit}-wide quantization {kind}" if unit > 1 else ""
            problems.append(
                f"{ranks} ranks would each hold {total / ranks:g} of the {what} {total} intermediate columns"
                f"{detail}; {advice}"
            )
    return problems


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

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp


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
    if inputs.kv_cache_gib_per_gpu is not None:
        kv_gib = inputs.kv_cache_gib_per_gpu  # measured budget replaces the computed one
    elif usable_gib is not None:
        kv_gib = usable_gib - weights_gib  # util x reported memory - reserve - weights, on this GPU
    else:
        kv_gib = 0.0
    per_token_on_gpu = len(layers) * kv_bytes_per_token_per_layer(model, inputs.kv_cache_dtype)
    tokens = tokens_in_budget(kv_gib * GIB, per_token_on_gpu, inputs.block_size, inputs.dcp)
    return {
        "stage": index,
        "layers": [layers.start, layers.stop],
        "num_layers": len(layers),
        "weights_gib_per_gpu": _round(weights_gib),
        "weights_breakdown_gib": {key: _round(_gib(value)) for key, value in breakdown.items()},
        "kv_cache_gib_per_gpu": _round(kv_gib),
        "kv_bytes_per_token_per_gpu": _per_gpu_bytes(per_token_on_gpu, inputs.dcp),
        "kv_tokens": tokens,
        "_kv_gib_exact": kv_gib,
        "_weights_gib_exact": weights_gib,
    }


def _per_gpu_bytes(per_token_on_gpu: int, dcp: int) -> int | float:
    # Under DCP each GPU stores 1/dcp of a sequence's tokens: its share of a token's KV is per_token / dcp.
    value = per_token_on_gpu / dcp
    return int(value) if value.is_integer() else round(value, 3)


def compute_plan(inputs: PlanInputs, *, with_suggestions: bool = True) -> dict[str, Any]:
    """The per-GPU plan: weights, KV budget and tokens per stage, the deployment's concurrency, and why it
    does or does not fit."""
    model = inputs.model
    layout = layout_problems(model, inputs.tp, inputs.pp, inputs.dp, inputs.dcp, inputs.enable_expert_parallel)
    reasons = layout + _gpu_count_problems(inputs)
    notes: list[str] = []
    usable_gib = None
    if inputs.gpu_memory_gib is not None:
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
    if not layout:
        # A broken layout (e.g. more stages than layers, leaving a stage empty) makes every memory figure derived
        # from it meaningless: report the layout alone.
        reasons += _memory_problems(inputs, stages, usable_gib)
        reasons += _sequence_problems(inputs, limiting)
    kv_tokens = limiting["kv_tokens"]
    per_replica = kv_tokens // inputs.max_model_len
    notes += _weight_notes(inputs)
    plan = {
        "mode": "per-gpu",
        "model": model.name,
        "model_source": model.source,
        "quantization": model.quantization.name,
        "gpu": inputs.gpu.key if inputs.gpu else None,
        "gpu_memory_gib": None if inputs.gpu_memory_gib is None else _round(inputs.gpu_memory_gib),
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


def _gpu_count_problems(inputs: PlanInputs) -> list[str]:
    if inputs.nodes is None:
        return []
    available = inputs.nodes * inputs.gpus_per_node
    if inputs.world_size == available:
        return []
    return [
        f"layout needs TP {inputs.tp} x PP {inputs.pp} x DP {inputs.dp} = {inputs.world_size} GPUs, "
        f"but {inputs.nodes} nodes x {inputs.gpus_per_node} GPUs = {available}"
    ]


def _memory_problems(inputs: PlanInputs, stages: list[dict[str, Any]], usable_gib: float | None) -> list[str]:
    problems = []
    for stage in stages:
        if inputs.kv_cache_gib_per_gpu is not None:
            if usable_gib is not None and stage["_weights_gib_exact"] > usable_gib:
                problems.append(
                    f"stage {stage['stage']}: weights need {stage['_weights_gib_exact']:.2f} GiB per GPU but only "
                    f"{usable_gib:.2f} GiB is usable"
                )
            continue
        if stage["_kv_gib_exact"] <= 0:
            problems.append(
                f"stage {stage['stage']}: weights {stage['_weights_gib_exact']:.2f} GiB + reserve "
                f"{inputs.reserve_gib:g} GiB exceed {inputs.gpu_memory_utilization:g} x "
                f"{inputs.gpu_memory_gib or 0:.2f} GiB = "
                f"{inputs.gpu_memory_utilization * (inputs.gpu_memory_gib or 0):.2f} GiB per GPU "
                f"(short by {-stage['_kv_gib_exact']:.2f} GiB)"
            )
    return problems


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
}
KV_CACHE_DTYPES = ("bf16", "fp8", "auto", "fp8_e4m3", "fp8_e5m2")


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


def _gpu_and_memory(options: dict[str, Any]) -> tuple[GpuSpec | None, float | None]:
    gpu = find_gpu(str(options["gpu"])) if options.get("gpu") else None
    memory = _number(options, "gpu_memory_gib", float, 0, strict=True)
    if memory is None and gpu is not None:
        memory = gpu.memory_gib
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
}


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
    weights_bytes = _checkpoint_weight_bytes(options)
    partition = _partition(options.get("pp_layer_partition"))
    model = find_model(str(options["model"]))
    gpu, memory = _gpu_and_memory(options)
    is_cpu = gpu is not None and gpu.is_cpu
    gpus_per_node = numbers["gpus_per_node"] or (1 if is_cpu else 8)
    tp, pp = numbers["tp"], numbers["pp"]
    dp = numbers["dp"] or 1  # vLLM's default; a mismatch with --nodes is a reason, not a guess
    max_model_len = numbers["max_model_len"] or model.max_position_embeddings
    if not max_model_len:
        raise PlanInputError("--max-model-len", "the model config has no max_position_embeddings: give it")
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
        kv_cache_dtype="bf16" if dtype == "auto" else dtype,
        max_model_len=max_model_len,
        block_size=numbers["block_size"] or (CPU_BLOCK_SIZE if is_cpu else DEFAULT_GPU_BLOCK_SIZE),
        weights_bytes=weights_bytes,
        pp_layer_partition=partition,
        language_model_only=bool(options["language_model_only"]),
    )


def plan_from_options(raw: dict[str, Any]) -> dict[str, Any]:
    """The plan (or, with pooled=True, the GreenNode guide's pooled arithmetic) for CLI-style options."""
    inputs = inputs_from_options(raw)
    if raw.get("pooled"):
        return pooled_plan(inputs)
    return compute_plan(inputs)


# ---------------------------------------------------------------------------------------------------------
# Text rendering
# ---------------------------------------------------------------------------------------------------------


def _row(label: str, value: str, width: int = 38) -> str:
    return f"{label:<{width}}: {value}"


def render_text(plan: dict[str, Any]) -> str:
    """A readable budget box (per GPU, or the labelled pooled box)."""
    if plan.get("mode") == "pooled":
        return _render_pooled(plan)
    where = plan["gpu"] or "GPUs"
    title = (
        f"PER-GPU MEMORY BUDGET - {plan['model']} on {plan['nodes']} node(s) x {plan['gpus_per_node']} {where} "
        f"(TP {plan['tp']}, PP {plan['pp']}, DP {plan['dp']}, DCP {plan['dcp']}, "
        f"EP {'on' if plan['enable_expert_parallel'] else 'off'})"
    )
    lines = [title]
    if plan["gpu_memory_gib"] is not None:
        lines.append(_row("GPU memory the driver reports", f"{plan['gpu_memory_gib']:.2f} GiB"))
        lines.append(
            _row(
                f"Usable ({plan['gpu_memory_utilization']:g} x memory - {plan['reserve_gib']:g} GiB)",
                f"{plan['usable_gib_per_gpu']:.2f} GiB",
            )
        )
    for stage in plan["stages"]:
        lines.extend(_render_stage(plan, stage))
    lines.append(
        _row(
            f"KV tokens per replica (blocks of {plan['block_size']})",
            f"{plan['kv_tokens']:,}  (stage {plan['limiting_stage']} decides)",
        )
    )
    lines.append(
        _row(
            f"At max-model-len {plan['max_model_len']:,}",
            f"{plan['kv_gib_per_sequence_per_gpu']:.2f} GiB per sequence per GPU; "
            f"{plan['sequences_per_replica']} per replica x {plan['replicas']} replica(s) = "
            f"{plan['max_concurrent_sequences']} concurrent sequences",
        )
    )
    lines.append(_row("Fits", "yes" if plan["fits"] else "NO"))
    lines.extend(f"  - {reason}" for reason in plan["reasons"])
    lines.extend(f"  note: {note}" for note in plan.get("notes", []))
    if plan.get("suggestions"):
        lines.append("Layout changes that would hold more:")
        lines.extend(f"  {item['change']:<24} {item['text']}" for item in plan["suggestions"])
    return "\n".join(lines)


def _render_stage(plan: dict[str, Any], stage: dict[str, Any]) -> list[str]:
    first, last = stage["layers"]
    count = stage["num_layers"]
    lines = [f"Stage {stage['stage']} (layers {first}-{last - 1}, {count} layer{'' if count == 1 else 's'}), per GPU:"]
    source = "even split of --weights-bytes" if plan["weights_source"] == "even-split" else plan["quantization"]
    lines.append(_row("  Weights", f"{stage['weights_gib_per_gpu']:.2f} GiB  ({source})"))
    if plan["weights_source"] != "even-split":
        for key, value in stage["weights_breakdown_gib"].items():
            lines.append(_row(f"    {key.replace('_', ' ')}", f"{value:.3f} GiB"))
    kind = "measured" if plan["kv_cache_source"] == "measured" else "usable - weights"
    lines.append(_row("  --> KV cache", f"{stage['kv_cache_gib_per_gpu']:.2f} GiB  ({kind})"))
    if plan["dcp"] > 1:
        replicated = f"split over DCP {plan['dcp']}"
    elif plan["tp"] > 1:
        replicated = f"replicated on all {plan['tp']} TP ranks"
    else:
        replicated = "one TP rank"
    lines.append(
        _row(
            "  KV per token on this GPU",
            f"{stage['kv_bytes_per_token_per_gpu']:,} B ({count} layer{'' if count == 1 else 's'} x "
            f"{plan['kv_values_per_token_per_layer']} values, {replicated})",
        )
    )
    lines.append(_row("  KV tokens this stage holds", f"{stage['kv_tokens']:,}"))
    return lines


def _render_pooled(plan: dict[str, Any]) -> str:
    lines = [
        plan["warning"],
        f"POOLED MEMORY BUDGET - {plan['model']} on {plan['gpus_total']} GPUs",
        _row("GPUs", f"{plan['total_gpu_gib']:,.1f} GiB"),
        _row("Usable (util x total - reserve x GPUs)", f"{plan['usable_gib']:,.1f} GiB"),
        _row("Weights", f"{plan['weights_gib']:,.1f} GiB"),
        _row("--> KV cache pool", f"{plan['kv_pool_gib']:,.1f} GiB"),
        _row("KV cost per token (all layers)", f"{plan['kv_bytes_per_token'] / 1024:.1f} KiB"),
        _row("Total KV tokens", f"{plan['kv_tokens']:,}  (sum across all concurrent seqs)"),
        _row(f"At max-model-len {plan['max_model_len']:,}", f"{plan['kv_gib_per_sequence']:.1f} GiB per sequence"),
        _row("  max concurrent", f"~{plan['max_concurrent_sequences']} full-length sequences"),
        "",
        "What vLLM actually allocates for this layout (per GPU):",
        render_text(plan["per_gpu_plan"]),
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------
# CLI (bin/kimi-plan)
# ---------------------------------------------------------------------------------------------------------


class _OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line naming the flag, exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_arg_parser(prog: str = "kimi-plan") -> argparse.ArgumentParser:
    parser = _OneLineParser(
        prog=prog,
        description="Per-GPU memory plan for vLLM serving a Kimi K2-family checkpoint. Exit 0: fits; "
        "1: does not fit; 2: bad flags.",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--model", help=f"preset ({', '.join(MODEL_PRESETS)}) or path to config.json")
    parser.add_argument("--weights-bytes", help="checkpoint bytes, spread evenly over the tp x pp GPUs")
    parser.add_argument("--params", help="parameter count (with --weight-bytes-per-param, --weight-overhead)")
    parser.add_argument("--weight-bytes-per-param", help="bytes per parameter for --params")
    parser.add_argument("--weight-overhead", help="multiplier for --params (default 1)")
    parser.add_argument("--gpu", help=f"GPU preset ({', '.join(GPU_PRESETS)})")
    parser.add_argument("--gpu-memory-gib", help="memory per GPU the driver reports, GiB (overrides --gpu's)")
    parser.add_argument("--gpus-per-node", help="GPUs per node (default 8, cpu: 1)")
    parser.add_argument("--nodes", help="nodes; when given, tp x pp x dp must equal nodes x gpus-per-node")
    parser.add_argument("--gpu-memory-utilization", help="vLLM's --gpu-memory-utilization (default 0.9)")
    parser.add_argument(
        "--reserve-gib",
        help="GiB per GPU kept back from the budget (default 0, as the roles; the RTX PRO 6000 guide keeps 3)",
    )
    parser.add_argument("--kv-cache-gib-per-gpu", help="measured KV budget per GPU, replaces the computed one")
    parser.add_argument("--tp", help="tensor parallel size (default 1)")
    parser.add_argument("--pp", help="pipeline parallel size (default 1)")
    parser.add_argument("--dp", help="data parallel size (default 1)")
    parser.add_argument("--dcp", help="decode context parallel size, divides tp (default 1)")
    parser.add_argument("--enable-expert-parallel", action="store_true", help="shard routed experts (EP = tp x dp)")
    parser.add_argument("--kv-cache-dtype", help="bf16 (default) or fp8")
    parser.add_argument("--max-model-len", help="tokens per sequence (default: the model's maximum)")
    parser.add_argument("--block-size", help="KV block size (default 16; cpu: 128)")
    parser.add_argument("--pp-layer-partition", help="layers per stage as VLLM_PP_LAYER_PARTITION, e.g. 31,30")
    parser.add_argument("--language-model-only", action="store_true", help="leave the vision encoder out")
    parser.add_argument(
        "--pooled", action="store_true", help="the GreenNode guide's pooled arithmetic (not what vLLM does)"
    )
    return parser


def cli_main(argv: Sequence[str] | None = None, prog: str = "kimi-plan") -> int:
    """Run the CLI; returns the exit status (0 fits, 1 does not fit, 2 bad flags)."""
    parser = build_arg_parser(prog)
    args = vars(parser.parse_args(argv))
    as_json = args.pop("json")
    options = {key: value for key, value in args.items() if value not in (None, False)}
    try:
        plan = plan_from_options(options)
    except PlanInputError as exc:
        sys.stderr.write(f"{prog}: error: argument {exc.flag}: {exc.message}\n")
        return 2
    if as_json:
        sys.stdout.write(json.dumps(plan, sort_keys=False) + "\n")
    else:
        sys.stdout.write(render_text(plan) + "\n")
    return 0 if plan["fits"] else 1
