"""The presets the planner and the input check read: model architectures and checkpoint formats (Kimi K2
family, the lab's miniature model, any config.json), GPUs (memory the driver reports), and the planner's
constants and input error.

Stdlib only and free of Ansible imports. Every number names its source.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GIB = 1024**3
BF16_BYTES = 2
FP32_BYTES = 4
DEFAULT_MODEL = "Kimi-K2.7-Code"
DEFAULT_GPU_BLOCK_SIZE = 16
# vLLM's CPU backend pages the KV cache in blocks of 128 tokens (vllm/platforms/cpu.py,
# CpuPlatform.check_and_update_config); the lab measured "CPU KV cache size: 465,920 tokens" for 1 GiB with
# the 2-layer miniature model, which is floor(2^30 / (2 x 576 x 2 B) / 128) x 128 (docs/lab-measurements.md).
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
    # Routed experts each token goes to (config.json num_experts_per_tok: 8 in every K2 and DeepSeek-V3 config).
    num_experts_per_tok: int = 8
    tie_word_embeddings: bool = False
    vision_params: int = 0
    checkpoint_bytes: int | None = None
    source: str = ""
    # The Hub repository the preset describes; the input check refuses a kimi_checkpoint_repo_id that differs.
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


def _k25_family(name: str, checkpoint_bytes: int, source: str) -> ModelSpec:
    """K2.5, K2.6 and K2.7-Code: one architecture (vLLM recipes, models/moonshotai/Kimi-K2.7-Code.yaml: "shares the
    same architecture as Kimi-K2.5 / Kimi-K2.6"): KimiK25ForConditionalGeneration, the DeepSeek-V3 text tower under
    text_config, MoonViT, native INT4 routed experts as K2-Thinking, 262,144 positions (each recipe's
    context_length). K2.5's and K2.6's checkpoint bytes are the 64 files' tensor payload, model.safetensors.index
    .json's total_size (595,148,192,736 for K2.6; an audit of the three checkpoints' headers gives the same payload
    for K2.5): the files are about 30 MB larger with their JSON headers (K2.7-Code's file sum), far inside
    preflight's disk margin."""
    return ModelSpec(
        name=name,
        repo_id=f"moonshotai/{name}",
        max_position_embeddings=262144,
        quantization=K2_INT4,
        vision_params=MOONVIT_PARAMS,
        checkpoint_bytes=checkpoint_bytes,
        source=source,
        **_kimi_k2_architecture(),
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
    "Kimi-K2.5": _k25_family(
        "Kimi-K2.5",
        595_148_192_736,
        "moonshotai/Kimi-K2.5 (K2.7-Code's architecture per the vLLM recipe; INT4 experts; 256K context)",
    ),
    "Kimi-K2.6": _k25_family(
        "Kimi-K2.6",
        595_148_192_736,
        "moonshotai/Kimi-K2.6 (K2.7-Code's architecture per the vLLM recipe; index total_size 595,148,192,736)",
    ),
    # The sum of the 64 safetensors files of moonshotai/Kimi-K2.7-Code, as the RTX PRO 6000 guide reports it.
    "Kimi-K2.7-Code": _k25_family(
        "Kimi-K2.7-Code",
        595_177_988_208,
        "moonshotai/Kimi-K2.7-Code (K2.5 architecture + MoonViT; INT4 experts as K2-Thinking; RTX PRO 6000 guide)",
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


# DeepSeek-V3.2's lightning indexer (DeepseekV32ForCausalLM): its config's index_* keys.
INDEXER_KEYS = ("index_topk", "index_n_heads", "index_head_dim")


def unmodelled_cache(text: dict[str, Any]) -> str | None:
    """Why the planner cannot plan this model's cache, or None. A model it does not model is refused, never
    planned as if it were plain MLA: its KV budget would be wrong in a direction nobody sees until the load."""
    indexer = [key for key in INDEXER_KEYS if key in text]
    if indexer:
        return (
            f"it has DeepSeek-V3.2's sparse-attention indexer ({', '.join(indexer)}), which keeps a cache of its own "
            "beside MLA's latent cache; the planner models the latent cache only and would overstate the tokens "
            "that fit"
        )
    if "kv_lora_rank" not in text and ("num_key_value_heads" in text or "head_dim" in text):
        heads = text.get("num_key_value_heads", text.get("num_attention_heads", "?"))
        return (
            f"it is a GQA/MHA model ({heads} KV heads, no kv_lora_rank): the planner models MLA's cache only "
            "(kv_lora_rank + qk_rope_head_dim per token and layer, one copy per TP rank)"
        )
    if "kv_lora_rank" in text and not text.get("n_routed_experts"):
        return (
            "it is a dense model (n_routed_experts is 0 or missing): the planner's weights model "
            "Kimi-K2/DeepSeek-V3-shaped MoE layers only"
        )
    return None


def model_from_config(config: dict[str, Any], name: str, source: str = "config.json") -> ModelSpec:
    """Read the architecture from a config dict; K2.5-style configs nest it under text_config. A model whose cache
    or layers the planner does not model is a ValueError saying what is missing (unmodelled_cache)."""
    text = config.get("text_config") or config
    why = unmodelled_cache(text)
    if why:
        raise ValueError(f"{source}: the planner cannot plan {name}: {why}")
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
            num_experts_per_tok=int(text.get("num_experts_per_tok") or 8),
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
        "num_experts_per_tok": 2,
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
    # What torch.cuda.mem_get_info reports as total, the figure vLLM's gpu_memory_utilization multiplies
    # (MemorySnapshot.total_memory); a little below nvidia-smi's memory.total. None: no published figure found, the
    # planner then uses the driver's.
    cuda_memory_gib: float | None = None
    cuda_memory_source: str = ""
    # Compute capability major (9 Hopper, 10 Blackwell datacenter, 12 Blackwell RTX): picks the attention backend
    # and with it the KV block size (kimi_overhead.default_block_size).
    compute_major: int | None = None

    @property
    def memory_gib(self) -> float | None:
        return None if self.memory_mib is None else self.memory_mib / 1024

    @property
    def vllm_total_gib(self) -> float | None:
        """The total vLLM sizes its budget from: the CUDA-visible figure when known, else the driver's."""
        return self.cuda_memory_gib if self.cuda_memory_gib is not None else self.memory_gib


# vLLM prints the CUDA-visible total in "Free memory on device (free/total GiB) on startup" (gpu_worker.py and
# v1/worker/utils.py request_memory); found in published start-up logs with the code search.
_VLLM_LOG_TOTAL = (
    "vLLM start-up log 'Free memory on device ({total} GiB)' ({gpu}), public logs found with the code search"
)

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
            cuda_memory_gib=79.19,
            cuda_memory_source=_VLLM_LOG_TOTAL.format(total="78.66/79.19", gpu="H100 80GB (vLLM 0.10.x logs)"),
            compute_major=9,
        ),
        GpuSpec(
            "h200",
            ("NVIDIA H200",),
            143771,
            "nvidia-smi '124585MiB / 143771MiB' on 8x H200, driver 550.144.03: "
            "github.com/sgl-project/sglang/issues/3196",
            aliases=("h200-sxm", "h200-141gb"),
            cuda_memory_gib=139.81,
            cuda_memory_source=_VLLM_LOG_TOTAL.format(total="139.21/139.81", gpu="H200, vLLM 0.10.2, TP 2"),
            compute_major=9,
        ),
        GpuSpec(
            "h200-nvl",
            ("NVIDIA H200 NVL",),
            143771,
            "public setup notes found with the code search record 'NVIDIA H200 NVL (143771 MiB, driver "
            "570.195.03)'; same 141 GB HBM3e as the SXM part. Secondary source: confirm with a capture.",
            aliases=("h200nvl",),
            compute_major=9,
        ),
        GpuSpec(
            "rtx-pro-6000-server",
            ("NVIDIA RTX PRO 6000 Blackwell Server Edition",),
            97887,
            "public records found with the code search: 'RTX PRO 6000 Blackwell Server Edition, 97887 MiB, "
            "595.71.05 driver'; the RTX PRO 6000 guide rounds it to 95.6 GiB. "
            "Secondary source: confirm with a capture.",
            aliases=("rtx-pro-6000", "rtx-pro-6000-blackwell-server-edition", "rtx-pro-6000-se"),
            compute_major=12,
        ),
        GpuSpec(
            "b200",
            ("NVIDIA B200",),
            183359,
            "nvidia-smi '166593MiB / 183359MiB' on 8x B200, driver 580.95.05: "
            "github.com/NVIDIA/TensorRT-LLM/issues/10278",
            cuda_memory_gib=178.35,
            cuda_memory_source=_VLLM_LOG_TOTAL.format(total="41.24/178.35", gpu="B200"),
            compute_major=10,
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
