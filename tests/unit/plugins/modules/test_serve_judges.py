"""The three serve judgements run as Ansible runs them: kimi_serve_startup, kimi_ray_status, kimi_serve_group.

The parsing and the restart rules are tested in tests/unit/plugins/module_utils/test_kimi_serve.py; these tests
pin each module's options, its pass and fail answers, and that it changes nothing.
"""

from __future__ import annotations

from tests.unit.ansible_adhoc import run_module

CPU_LOG = "INFO [kv_cache_utils.py:2327] CPU KV cache size: 466,032 tokens, Maximum concurrency for 2,048 tokens"
RAY_TWO_NODES = """\
======== Autoscaler status: 2026-12-02 01:00:00 ========
Node status
---------------------------------------------------------------
Active:
 1 node_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa
 1 node_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb
Pending:
 (no pending nodes)
Recent failures:
 (no failures)

Resources
---------------------------------------------------------------
Usage:
 0.0/4.0 CPU
 0.0/16.0 GPU
"""


def test_startup_passes_a_matching_kv_figure_and_fails_a_different_one_when_required(tmp_path):
    ok, result = run_module(tmp_path, "kimi_serve_startup", {"text": CPU_LOG, "predicted_kv_tokens": 466032})
    assert ok, result
    assert result["changed"] is False and result["kv"]["match"] is True
    assert result["logged"]["kv_tokens"] == 466032

    ok, result = run_module(
        tmp_path, "kimi_serve_startup", {"text": CPU_LOG, "predicted_kv_tokens": 400000, "require_match": True}
    )
    assert not ok
    assert result["kv"]["match"] is False and result["msg"] == result["kv"]["summary"]


def test_startup_without_require_match_reports_a_difference_and_passes(tmp_path):
    ok, result = run_module(tmp_path, "kimi_serve_startup", {"text": CPU_LOG, "predicted_kv_tokens": 400000})
    assert ok and result["kv"]["match"] is False


def test_ray_status_passes_every_node_and_gpu_and_names_a_missing_node(tmp_path):
    ok, result = run_module(tmp_path, "kimi_ray_status", {"text": RAY_TWO_NODES, "nodes": 2, "gpus_per_node": 8})
    assert ok, result
    assert result["changed"] is False and result["ray"]["active_nodes"] == 2

    ok, result = run_module(tmp_path, "kimi_ray_status", {"text": RAY_TWO_NODES, "nodes": 3, "gpus_per_node": 8})
    assert not ok
    assert "3" in result["msg"] and result["ray"]["active_nodes"] == 2


def test_ray_status_needs_the_node_count(tmp_path):
    ok, result = run_module(tmp_path, "kimi_ray_status", {"text": RAY_TWO_NODES})
    assert not ok and "nodes" in result["msg"]


def test_group_leaves_a_healthy_group_and_restarts_one_with_a_rank_down(tmp_path):
    healthy = [
        {"host": "node1", "unit": "kimi-vllm.service", "serves_api": True, "changed": False,
         "active_state": "active", "started_at": "@1795997000"},
        {"host": "node2", "unit": "kimi-vllm-headless.service", "serves_api": False, "changed": False,
         "active_state": "active", "started_at": "@1795996990"},
    ]  # fmt: skip
    ok, result = run_module(tmp_path, "kimi_serve_group", {"group": healthy, "probe_ok": True}, check=True)
    assert ok, result
    assert result == {**result, "changed": False, "restart": False, "reasons": [], "msg": "no restart"}

    down = [healthy[0], {**healthy[1], "active_state": "failed"}]
    ok, result = run_module(tmp_path, "kimi_serve_group", {"group": down, "probe_ok": True})
    assert ok and result["restart"] is True
    assert any("node2" in reason and "kimi-vllm-headless.service" in reason for reason in result["reasons"])
