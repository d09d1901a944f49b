"""plugins/module_utils/kimi_layout.py: each layout rule passing and failing, the messages naming the variables and
their values, and the inventory check (topology), the planner and the serve argv giving the same message for
the same bad layout."""

from __future__ import annotations

from dataclasses import replace

import pytest
from ansible_collections.kimi.k2.plugins.module_utils import kimi_layout as kl
from ansible_collections.kimi.k2.plugins.module_utils.kimi_layout import (
    Layout,
    LayoutError,
    layout_from_values,
    layout_problems,
)
from ansible_collections.kimi.k2.plugins.module_utils.kimi_plan_options import plan_from_options
from ansible_collections.kimi.k2.plugins.module_utils.kimi_presets import find_model
from ansible_collections.kimi.k2.plugins.module_utils.kimi_serve import ServeInputError, ServeSpec, validate
from ansible_collections.kimi.k2.plugins.module_utils.kimi_topology import TopologyError, resolve_topology

K2 = find_model("Kimi-K2.7-Code")  # 64 heads, 61 layers, 384 routed experts, INT4 groups of 32
LAB = find_model("lab-mini")  # 4 layers


def messages(problems: list[kl.LayoutProblem]) -> list[str]:
    return [str(problem) for problem in problems]


def rules(problems: list[kl.LayoutProblem]) -> list[str]:
    return [problem.rule for problem in problems]


# ------------------------------------------------------------------------------------------ reading the values


def test_values_from_the_inventory_become_a_layout():
    layout = layout_from_values({"tensor_parallel_size": "8", "pipeline_parallel_size": 2})
    assert layout == Layout(8, 2, 1, 1, False)
    assert layout.world_size == 16


@pytest.mark.parametrize("value", ["eight", 1.5, True, None])
def test_a_size_that_is_not_an_integer_names_the_variable(value):
    with pytest.raises(LayoutError, match=f"kimi_data_parallel_size must be an integer, got {value!r}"):
        layout_from_values({"tensor_parallel_size": 8, "data_parallel_size": value})


def test_expert_parallel_must_be_a_boolean():
    with pytest.raises(LayoutError, match="kimi_enable_expert_parallel must be true or false, got 'yes'"):
        layout_from_values({"tensor_parallel_size": 8, "enable_expert_parallel": "yes"})


# ------------------------------------------------------------------------------------------ sizes and DCP


def test_sizes_of_at_least_one_pass():
    assert layout_problems(Layout(1), gpus_per_node=1) == []


def test_each_size_below_one_is_named_and_reported_alone():
    problems = layout_problems(Layout(8, 0, 1, 3), nodes=2, gpus_per_node=0, model=K2, serve_layout="mp")
    assert messages(problems) == [
        "kimi_pipeline_parallel_size must be at least 1, got 0",
        "kimi_gpus_per_node must be at least 1, got 0",
    ]
    assert [problem.variables for problem in problems] == [
        ("kimi_pipeline_parallel_size",),
        ("kimi_gpus_per_node",),
    ]


@pytest.mark.parametrize(("tp", "dcp"), [(8, 1), (8, 2), (8, 8), (4, 4)])
def test_dcp_dividing_tp_passes(tp, dcp):
    assert layout_problems(Layout(tp, decode_context_parallel_size=dcp)) == []


def test_dcp_not_dividing_tp_names_both():
    problems = layout_problems(Layout(8, decode_context_parallel_size=3))
    assert messages(problems) == [
        "kimi_decode_context_parallel_size=3 must divide kimi_tensor_parallel_size=8 "
        "(vLLM splits each TP group into DCP ranks)"
    ]
    assert problems[0].variables == ("kimi_decode_context_parallel_size", "kimi_tensor_parallel_size")


# ------------------------------------------------------------------------------------------ the GPU count


@pytest.mark.parametrize(
    ("layout", "nodes", "per_node"),
    [(Layout(8, 2), 2, 8), (Layout(1, 1, 16, 1, True), 2, 8), (Layout(1, 4), 4, 1), (Layout(8), 1, 8)],
)
def test_a_layout_covering_every_gpu_passes(layout, nodes, per_node):
    assert layout_problems(layout, nodes=nodes, gpus_per_node=per_node) == []


def test_a_layout_not_covering_the_gpus_names_every_number():
    problems = layout_problems(Layout(8, 1, 1), nodes=2, gpus_per_node=8)
    assert messages(problems) == [
        "layout needs 8 GPUs (kimi_tensor_parallel_size 8 x kimi_pipeline_parallel_size 1 x "
        "kimi_data_parallel_size 1) but kimi_nodes has 2 node(s) x kimi_gpus_per_node 8 = 16"
    ]
    assert problems[0].variables[0] == "kimi_tensor_parallel_size"


def test_the_gpu_count_needs_both_nodes_and_gpus_per_node():
    assert layout_problems(Layout(8), gpus_per_node=8) == []
    assert layout_problems(Layout(8), nodes=2) == []


# ------------------------------------------------------------------------------------------ the model


def test_the_greennode_layout_passes_the_model_rules():
    assert layout_problems(Layout(8, 2), model=K2) == []
    assert layout_problems(Layout(8, 1, 2, 1, True), model=K2) == []


def test_tp_must_divide_the_attention_heads():
    problems = layout_problems(Layout(3, 1, 1, 1, True), model=K2)
    assert rules(problems)[0] == kl.HEADS
    assert str(problems[0]) == (
        "kimi_tensor_parallel_size=3 must divide the 64 attention heads of Kimi-K2.7-Code "
        "(vLLM splits the heads over the TP ranks)"
    )


@pytest.mark.parametrize("pp", [1, 2, 4])
def test_pp_up_to_the_layers_passes(pp):
    assert kl.LAYERS not in rules(layout_problems(Layout(1, pp), model=LAB))


def test_pp_beyond_the_layers_keeps_the_labs_wording():
    assert messages(layout_problems(Layout(1, 5), model=LAB)) == [
        "PP 5 exceeds the 4 layers of lab-mini (kimi_pipeline_parallel_size=5 leaves a pipeline stage without layers)"
    ]


def test_ep_size_beyond_the_routed_experts():
    assert kl.EXPERTS not in rules(layout_problems(Layout(8, 1, 48, 1, True), model=K2))
    problems = [p for p in layout_problems(Layout(64, 1, 8, 1, True), model=K2) if p.rule == kl.EXPERTS]
    assert messages(problems) == [
        "EP size 512 (kimi_tensor_parallel_size 64 x kimi_data_parallel_size 8, with kimi_enable_expert_parallel) "
        "exceeds the 384 routed experts of Kimi-K2.7-Code: some ranks would hold no expert"
    ]


def test_routed_expert_shards_must_hold_whole_quantization_groups():
    # 2048 columns over 8 x 16 = 128 ranks: 16 each, not a multiple of the INT4 group of 32.
    problems = [p for p in layout_problems(Layout(8, 1, 16), model=K2) if p.rule == kl.MOE_SHARDS]
    assert messages(problems) == [
        "kimi_tensor_parallel_size 8 x kimi_data_parallel_size 16 = 128 ranks would each hold 16 of the routed "
        "experts' 2048 intermediate columns, not a multiple of the 32-wide quantization group; set "
        "kimi_enable_expert_parallel or use a smaller TP x DP"
    ]
    assert problems[0].variables == (
        "kimi_tensor_parallel_size",
        "kimi_data_parallel_size",
        "kimi_enable_expert_parallel",
    )
    # Expert parallelism keeps the routed experts whole.
    assert kl.MOE_SHARDS not in rules(layout_problems(Layout(8, 1, 16, 1, True), model=K2))


def test_shared_expert_shards_must_be_whole():
    problems = [p for p in layout_problems(Layout(3, 1, 1, 1, True), model=K2) if p.rule == kl.MOE_SHARDS]
    assert messages(problems) == [
        "kimi_tensor_parallel_size=3: 3 ranks would each hold 682.667 of the shared expert's 2048 intermediate "
        "columns; use a smaller kimi_tensor_parallel_size"
    ]


# ------------------------------------------------------------------------------------------ serving layouts


@pytest.mark.parametrize(
    ("serve_layout", "layout", "nodes"),
    [
        ("mp", Layout(8, 2), 2),
        ("ray", Layout(16), 2),
        ("single", Layout(8), 1),
        ("dp_ep", Layout(1, 1, 16, 1, True), 2),
        ("dp_ep", Layout(2, 1, 8, 1, True), 2),
    ],
)
def test_each_serving_layout_passes_its_shape(serve_layout, layout, nodes):
    assert layout_problems(layout, nodes=nodes, gpus_per_node=8, serve_layout=serve_layout) == []


def test_an_unknown_serving_layout_is_reported_alone():
    problems = layout_problems(Layout(0), nodes=2, gpus_per_node=8, serve_layout="k8s")
    assert messages(problems) == ["kimi_serve_layout is not one of mp, ray, dp_ep, single (got 'k8s')"]


def test_single_runs_on_one_node():
    problems = layout_problems(Layout(8, 2), nodes=2, gpus_per_node=8, serve_layout="single")
    assert messages(problems) == ["kimi_serve_layout single runs on one node, but kimi_nodes has 2"]
    assert problems[0].variables == ("kimi_serve_layout", "kimi_nodes")


@pytest.mark.parametrize("serve_layout", ["mp", "ray"])
def test_only_dp_ep_takes_data_parallel(serve_layout):
    problems = layout_problems(Layout(8, 1, 2), nodes=2, gpus_per_node=8, serve_layout=serve_layout)
    assert messages(problems) == [
        f"kimi_data_parallel_size must be 1 for kimi_serve_layout {serve_layout}, got 2 (use dp_ep for data parallel)"
    ]


def test_dp_ep_keeps_each_data_parallel_rank_inside_a_node():
    problems = layout_problems(Layout(16, 1, 2), nodes=4, gpus_per_node=8, serve_layout="dp_ep")
    assert messages(problems) == [
        "kimi_serve_layout dp_ep keeps each data-parallel rank inside one node: kimi_tensor_parallel_size 16 x "
        "kimi_pipeline_parallel_size 1 = 16 must divide kimi_gpus_per_node 8"
    ]


def test_dp_ep_needs_two_data_parallel_ranks():
    problems = layout_problems(Layout(8), nodes=1, gpus_per_node=8, serve_layout="dp_ep")
    assert messages(problems) == ["kimi_serve_layout dp_ep needs kimi_data_parallel_size of at least 2, got 1"]


# ------------------------------------------------------------------------------------------ one wording everywhere

SERVE = ServeSpec(
    layout="mp",
    model_path="/data/m",
    hosts_by_rank=("n1", "n2"),
    host_ips={"n1": "10.0.0.1", "n2": "10.0.0.2"},
    gpus_per_node=8,
    tensor_parallel_size=8,
    pipeline_parallel_size=2,
)


def _topology_message(tp: int, pp: int, dcp: int) -> str:
    values = {"tensor_parallel_size": tp, "pipeline_parallel_size": pp, "decode_context_parallel_size": dcp}
    try:
        topology = resolve_topology(["n1", "n2"], {}, 8, values)
    except TopologyError as error:
        return str(error)
    (problem,) = topology.problems
    return problem


def _plan_message(tp: int, pp: int, dcp: int) -> str:
    plan = plan_from_options(
        {"model": "Kimi-K2.7-Code", "gpu": "h200", "nodes": 2, "gpus_per_node": 8, "tp": tp, "pp": pp, "dcp": dcp}
    )
    return plan["reasons"][0]


def _serve_message(tp: int, pp: int, dcp: int) -> str:
    spec = replace(SERVE, tensor_parallel_size=tp, pipeline_parallel_size=pp, decode_context_parallel_size=dcp)
    (problem,) = validate(spec)
    assert isinstance(problem, ServeInputError)
    assert str(problem) == problem.message
    return problem.message


@pytest.mark.parametrize(
    ("tp", "pp", "dcp", "expected"),
    [
        (
            8,
            1,
            1,
            "layout needs 8 GPUs (kimi_tensor_parallel_size 8 x kimi_pipeline_parallel_size 1 x "
            "kimi_data_parallel_size 1) but kimi_nodes has 2 node(s) x kimi_gpus_per_node 8 = 16",
        ),
        (
            8,
            2,
            3,
            "kimi_decode_context_parallel_size=3 must divide kimi_tensor_parallel_size=8 "
            "(vLLM splits each TP group into DCP ranks)",
        ),
    ],
)
def test_topology_plan_and_serve_give_the_same_message(tp, pp, dcp, expected):
    assert _topology_message(tp, pp, dcp) == _plan_message(tp, pp, dcp) == _serve_message(tp, pp, dcp) == expected


def test_serve_names_the_first_variable_of_a_layout_problem():
    (problem,) = validate(replace(SERVE, tensor_parallel_size=4))
    assert problem.variable == "kimi_tensor_parallel_size"
