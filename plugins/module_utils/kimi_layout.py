"""The parallel layout's rules, in one place: the sizes (tp, pp, dp, dcp, expert parallel) against each other,
against the nodes and their GPUs, against the model (heads, layers, experts), and the shape each serving layout
(single, mp, ray, dp_ep) needs.

kimi_topology (the inventory check), kimi_plan (the planner) and kimi_serve (the vllm serve argv) all ask here,
so one bad layout reads the same wherever it is found; each adds only the checks that are its own (node ranks,
memory, announced addresses). Every message names the inventory variables involved (kimi_tensor_parallel_size,
...) with their values.

Stdlib only and free of Ansible imports: modules that run on the nodes bundle it through kimi_serve.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .kimi_presets import ModelSpec

# kimi_serve_layout: native multi-node (mp), Ray, data parallel with expert parallel (dp_ep), one node (single).
LAYOUTS = ("mp", "ray", "dp_ep", "single")

TP = "kimi_tensor_parallel_size"
PP = "kimi_pipeline_parallel_size"
DP = "kimi_data_parallel_size"
DCP = "kimi_decode_context_parallel_size"
EP = "kimi_enable_expert_parallel"
GPUS_PER_NODE = "kimi_gpus_per_node"
NODES = "kimi_nodes"
SERVE_LAYOUT = "kimi_serve_layout"

# Layout field -> the inventory variable that sets it.
SIZE_VARIABLES = {
    "tensor_parallel_size": TP,
    "pipeline_parallel_size": PP,
    "data_parallel_size": DP,
    "decode_context_parallel_size": DCP,
}

# The rules, as LayoutProblem.rule names them.
SIZES = "sizes"
DCP_DIVIDES_TP = "dcp_divides_tp"
HEADS = "heads"
LAYERS = "layers"
EXPERTS = "experts"
MOE_SHARDS = "moe_shards"
GPU_COUNT = "gpu_count"
SERVE_LAYOUT_NAME = "serve_layout_name"
SERVE_LAYOUT_SHAPE = "serve_layout_shape"


class LayoutError(ValueError):
    """A layout value that is not a number (or a boolean) at all; the message names the variable."""


@dataclass(frozen=True)
class Layout:
    """The parallel layout of one deployment, as vLLM's flags name it."""

    tensor_parallel_size: int
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    decode_context_parallel_size: int = 1
    enable_expert_parallel: bool = False

    @property
    def world_size(self) -> int:
        """GPUs (ranks) the whole deployment occupies."""
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.data_parallel_size


@dataclass(frozen=True)
class LayoutProblem:
    """Why a layout cannot run: the variables to change (the first is the one to look at first), the message
    (which names them and their values), and the rule it broke (one of the constants above)."""

    variables: tuple[str, ...]
    message: str
    rule: str

    def __str__(self) -> str:
        return self.message


# ------------------------------------------------------------------------------------------ reading the values


def as_int(value: Any, variable: str, host: str | None = None) -> int:
    """Accept ints and integer strings (inventory INI gives strings); refuse bools, floats and words."""
    where = f" on host {host}" if host else ""
    if isinstance(value, bool):
        raise LayoutError(f"{variable}{where} must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    raise LayoutError(f"{variable}{where} must be an integer, got {value!r}")


def layout_from_values(values: Mapping[str, Any]) -> Layout:
    """The layout from the Layout field names (tensor_parallel_size, ...), each an integer (1 when absent) and
    enable_expert_parallel a boolean. Sizes below 1 are for size_problems to name, not refused here."""
    sizes = {name: as_int(values.get(name, 1), variable) for name, variable in SIZE_VARIABLES.items()}
    expert_parallel = values.get("enable_expert_parallel", False)
    if not isinstance(expert_parallel, bool):
        raise LayoutError(f"{EP} must be true or false, got {expert_parallel!r}")
    return Layout(enable_expert_parallel=expert_parallel, **sizes)


# ------------------------------------------------------------------------------------------ the rules


def size_problems(layout: Layout, gpus_per_node: int | None = None) -> list[LayoutProblem]:
    """Every size (and the GPUs per node, when given) is at least 1."""
    sizes = [(SIZE_VARIABLES[name], getattr(layout, name)) for name in SIZE_VARIABLES]
    if gpus_per_node is not None:
        sizes.append((GPUS_PER_NODE, gpus_per_node))
    return [
        LayoutProblem((variable,), f"{variable} must be at least 1, got {value}", SIZES)
        for variable, value in sizes
        if value < 1
    ]


def dcp_problems(layout: Layout) -> list[LayoutProblem]:
    """vLLM: decode_context_parallel_size must divide tensor_parallel_size (DCP reuses the TP group)."""
    tp, dcp = layout.tensor_parallel_size, layout.decode_context_parallel_size
    if tp % dcp == 0:
        return []
    return [
        LayoutProblem(
            (DCP, TP), f"{DCP}={dcp} must divide {TP}={tp} (vLLM splits each TP group into DCP ranks)", DCP_DIVIDES_TP
        )
    ]


def gpu_count_problems(layout: Layout, nodes: int, gpus_per_node: int) -> list[LayoutProblem]:
    """tp x pp x dp is every GPU of every node: vLLM waits for ranks that never come, or leaves GPUs idle."""
    total = nodes * gpus_per_node
    if layout.world_size == total:
        return []
    message = (
        f"layout needs {layout.world_size} GPUs ({TP} {layout.tensor_parallel_size} x {PP} "
        f"{layout.pipeline_parallel_size} x {DP} {layout.data_parallel_size}) but {NODES} has {nodes} node(s) x "
        f"{GPUS_PER_NODE} {gpus_per_node} = {total}"
    )
    return [LayoutProblem((TP, PP, DP, NODES, GPUS_PER_NODE), message, GPU_COUNT)]


def model_problems(layout: Layout, model: ModelSpec) -> list[LayoutProblem]:
    """The rules vLLM enforces against the model's config.json when it starts."""
    tp, pp, dp = layout.tensor_parallel_size, layout.pipeline_parallel_size, layout.data_parallel_size
    problems = []
    if model.num_attention_heads % tp:
        # The attention layers split the heads over the TP ranks (vLLM refuses heads % tp != 0).
        problems.append(
            LayoutProblem(
                (TP,),
                f"{TP}={tp} must divide the {model.num_attention_heads} attention heads of {model.name} "
                "(vLLM splits the heads over the TP ranks)",
                HEADS,
            )
        )
    if pp > model.num_hidden_layers:
        problems.append(
            LayoutProblem(
                (PP,),
                f"PP {pp} exceeds the {model.num_hidden_layers} layers of {model.name} "
                f"({PP}={pp} leaves a pipeline stage without layers)",
                LAYERS,
            )
        )
    group = tp * dp
    if model.n_routed_experts and layout.enable_expert_parallel and group > model.n_routed_experts:
        problems.append(
            LayoutProblem(
                (TP, DP, EP),
                f"EP size {group} ({TP} {tp} x {DP} {dp}, with {EP}) exceeds the {model.n_routed_experts} routed "
                f"experts of {model.name}: some ranks would hold no expert",
                EXPERTS,
            )
        )
    if model.n_routed_experts:
        problems += _moe_shard_problems(layout, model)
    return problems


def _moe_shard_problems(layout: Layout, model: ModelSpec) -> list[LayoutProblem]:
    # Each routed expert's intermediate dimension is split over tp x dp ranks unless expert parallelism keeps the
    # experts whole; the shared expert's is always split over tp. A shard must be whole and hold whole
    # quantization blocks or groups, or vLLM's weight loader refuses it (block FP8: "not divisible by weight
    # quantization block").
    tp, dp = layout.tensor_parallel_size, layout.data_parallel_size
    checks = [
        (
            "shared expert's",
            "model.layers.1.mlp.shared_experts.down_proj",
            tp,
            (TP,),
            f"{TP}={tp}:",
            f"use a smaller {TP}",
        )
    ]
    if not layout.enable_expert_parallel:
        checks.insert(
            0,
            (
                "routed experts'",
                "model.layers.1.mlp.experts.0.down_proj",
                tp * dp,
                (TP, DP, EP),
                f"{TP} {tp} x {DP} {dp} =",
                f"set {EP} or use a smaller TP x DP",
            ),
        )
    problems = []
    total = model.moe_intermediate_size
    for what, name, ranks, variables, sizes, advice in checks:
        fmt = model.quantization.format_for(name)
        unit = fmt.block[1] if fmt.kind == "fp8_block" else fmt.group_size if fmt.kind == "int_group" else 1
        if total % ranks or (total // ranks) % unit:
            kind = "block" if fmt.kind == "fp8_block" else "group"
            detail = f", not a multiple of the {unit}-wide quantization {kind}" if unit > 1 else ""
            problems.append(
                LayoutProblem(
                    variables,
                    f"{sizes} {ranks} ranks would each hold {total / ranks:g} of the {what} {total} intermediate "
                    f"columns{detail}; {advice}",
                    MOE_SHARDS,
                )
            )
    return problems


def serve_layout_problems(serve_layout: str, layout: Layout, nodes: int, gpus_per_node: int) -> list[LayoutProblem]:
    """The shape each kimi_serve_layout needs (the GPU count is gpu_count_problems')."""
    if serve_layout not in LAYOUTS:
        return [
            LayoutProblem(
                (SERVE_LAYOUT,),
                f"{SERVE_LAYOUT} is not one of {', '.join(LAYOUTS)} (got {serve_layout!r})",
                SERVE_LAYOUT_NAME,
            )
        ]
    tp, pp, dp = layout.tensor_parallel_size, layout.pipeline_parallel_size, layout.data_parallel_size
    problems = []
    if serve_layout == "single" and nodes != 1:
        problems.append(
            LayoutProblem(
                (SERVE_LAYOUT, NODES),
                f"{SERVE_LAYOUT} single runs on one node, but {NODES} has {nodes}",
                SERVE_LAYOUT_SHAPE,
            )
        )
    # mp splits tp x pp evenly over the nodes: with dp 1 and tp x pp = nodes x GPUs per node (the GPU count)
    # that always holds, so it has no rule of its own.
    if serve_layout in ("mp", "ray", "single") and dp != 1:
        problems.append(
            LayoutProblem(
                (DP, SERVE_LAYOUT),
                f"{DP} must be 1 for {SERVE_LAYOUT} {serve_layout}, got {dp} (use dp_ep for data parallel)",
                SERVE_LAYOUT_SHAPE,
            )
        )
    if serve_layout == "dp_ep":
        if tp * pp > gpus_per_node or gpus_per_node % (tp * pp):
            problems.append(
                LayoutProblem(
                    (TP, PP, GPUS_PER_NODE),
                    f"{SERVE_LAYOUT} dp_ep keeps each data-parallel rank inside one node: {TP} {tp} x {PP} {pp} = "
                    f"{tp * pp} must divide {GPUS_PER_NODE} {gpus_per_node}",
                    SERVE_LAYOUT_SHAPE,
                )
            )
        if dp < 2:
            problems.append(
                LayoutProblem(
                    (DP, SERVE_LAYOUT),
                    f"{SERVE_LAYOUT} dp_ep needs {DP} of at least 2, got {dp}",
                    SERVE_LAYOUT_SHAPE,
                )
            )
    return problems


# ------------------------------------------------------------------------------------------ all of them


def layout_problems(
    layout: Layout,
    *,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    model: ModelSpec | None = None,
    serve_layout: str | None = None,
) -> list[LayoutProblem]:
    """Every rule the given context allows: the sizes and DCP always, the GPU count with nodes and GPUs per
    node, the model's limits with a model, a serving layout's shape with its name (and the nodes). A size
    below 1 or an unknown serving layout is reported alone: the other rules would divide by it or not apply."""
    if serve_layout is not None and serve_layout not in LAYOUTS:
        return serve_layout_problems(serve_layout, layout, nodes or 0, gpus_per_node or 0)
    problems = size_problems(layout, gpus_per_node)
    if problems:
        return problems
    problems = dcp_problems(layout)
    if model is not None:
        problems += model_problems(layout, model)
    if nodes is not None and gpus_per_node is not None:
        problems += gpu_count_problems(layout, nodes, gpus_per_node)
        if serve_layout is not None:
            problems += serve_layout_problems(serve_layout, layout, nodes, gpus_per_node)
    return problems
