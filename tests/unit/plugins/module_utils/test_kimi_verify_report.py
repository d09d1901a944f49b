"""The verify report: document and verdict, Markdown tables, the printed table, atomic files and latest copies,
and the module run as Ansible runs it (it writes in check mode too)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import fields
from datetime import UTC, datetime

import pytest
from ansible_collections.kimi.k2.plugins.module_utils.kimi_bench import Gates, check_gates
from ansible_collections.kimi.k2.plugins.module_utils.kimi_verify_report import (
    build_report,
    default_basename,
    rank_join_check,
    render_markdown,
    render_table,
    utc_timestamp,
    verdict,
    write_report,
)

from tests.unit.ansible_adhoc import run_module

SVG = "{http://www.w3.org/2000/svg}"
CHECKS = [
    {"name": "health", "status": "pass", "detail": "HTTP 200 in 3 ms"},
    {"name": "tool_call", "passed": False, "skipped": False, "detail": "tool calls emitted as text | markers"},
    {"name": "reasoning", "passed": False, "skipped": True, "detail": "not a thinking model"},
]
# What kimi_vllm_bench returns (vLLM's names).
SUMMARY = {
    "num_prompts": 4,
    "max_concurrency": 2,
    "request_rate": "inf",
    "input_len": 32,
    "output_len": 64,
    "completed": 3,
    "failed": 1,
    "error_rate": 0.25,
    "errors_by_kind": {"Internal Server Error": 1},
    "duration": 3.5,
    "ttft_ms": {"mean": 140.0, "median": 120.5, "std": 40.0, "p50": 120.5, "p90": 180.0, "p99": 198.0},
    "tpot_ms": {"mean": 21.5, "median": 21.0, "std": 2.0, "p50": 21.0, "p90": 24.0, "p99": 25.5},
    "itl_ms": {"mean": 21.0, "median": 20.0, "std": 3.0, "p50": 20.0, "p90": 26.0, "p99": 30.0},
    "e2el_ms": {"mean": 1560.0, "median": 1500.0, "std": 160.0, "p50": 1500.0, "p90": 1700.0, "p99": 1790.0},
    "total_output_tokens": 192,
    "request_throughput": 0.86,
    "output_throughput": 54.86,
    "total_token_throughput": 82.29,
    "request_goodput": None,
    "goodput_share": None,
}
RECORDS = [
    {"index": 0, "ok": True, "ttft_ms": 100.0, "e2el_ms": 1400.0},
    {"index": 1, "ok": False, "error": "Internal Server Error", "error_kind": "Internal Server Error"},
    {"index": 2, "ok": True, "ttft_ms": 120.5, "e2el_ms": 1500.0},
    {"index": 3, "ok": True, "ttft_ms": 200.0, "e2el_ms": 1800.0},
]
BREACH = {"figure": "ttft_ms.p99", "limit": 150, "value": 198.0, "message": "TTFT p99 is 198 ms, over the limit 150 ms"}
LOADTEST = {"summary": SUMMARY, "records": RECORDS, "breaches": [BREACH]}
THRESHOLDS = {"ttft_p99_ms": 150, "tpot_p99_ms": None, "e2el_p99_ms": 0, "max_error_rate": 0.5}


def report(checks=CHECKS, loadtest=LOADTEST, **extra):
    settings = {
        "thresholds": THRESHOLDS,
        "inputs": {"served_model_name": "kimi-k2"},
        "facts": {"nodes": 2, "layout": "mp", "ranks": ["node1", "node2"]},
        "generated_at": "2025-01-31T12:00:00Z",
    }
    settings.update(extra)
    return build_report(checks, loadtest, **settings)


def test_timestamps_and_basename_are_utc():
    moment = datetime(2025, 1, 31, 12, 0, 5, tzinfo=UTC)
    assert utc_timestamp(moment) == "2025-01-31T12:00:05Z"
    assert default_basename(moment) == "verify-20250131T120005Z"


def test_document_counts_checks_and_fails_on_a_failed_check_or_a_breach():
    document = report()
    assert document["checks_summary"] == {"passed": 1, "failed": 1, "skipped": 1}
    assert [c["status"] for c in document["checks"]] == ["pass", "fail", "skip"]
    assert document["ok"] is False
    assert verdict(document) == "FAIL (1 check failed, 1 threshold breached)"
    passing = [c for c in CHECKS if c["name"] != "tool_call"]
    assert verdict(report(passing, {**LOADTEST, "breaches": []})) == "PASS"
    assert verdict(report(passing)) == "FAIL (1 threshold breached)"
    assert report(passing, None)["ok"] is True  # a skipped check does not fail; no load test, no breach


def test_markdown_has_the_checks_latency_thresholds_and_errors_tables():
    markdown = render_markdown(report(), "verify-x.svg")
    assert markdown.startswith("# Verify report: kimi-k2\n\nResult: **FAIL (1 check failed, 1 threshold breached)**")
    assert "| check | result | detail |" in markdown
    assert "| tool_call | fail | tool calls emitted as text \\| markers |" in markdown  # the pipe is escaped
    assert "| reasoning | skip | not a thinking model |" in markdown
    assert "## Load test (vllm bench serve)" in markdown
    assert "4 prompts of 32 tokens, 64 output tokens each, at most 2 in flight, request rate inf" in markdown
    assert "| metric | mean | median | p50 | p90 | p99 |" in markdown
    assert "| TTFT (ms) | 140 | 120.5 | 120.5 | 180 | 198 |" in markdown
    assert "| TPOT (ms) | 21.5 | 21 | 21 | 24 | 25.5 |" in markdown
    assert "| ITL (ms) | 21 | 20 | 20 | 26 | 30 |" in markdown
    assert "| E2EL (ms) | 1560 | 1500 | 1500 | 1700 | 1790 |" in markdown
    assert "request_throughput 0.86 req/s, output_throughput 54.86 tok/s" in markdown
    assert "request_goodput" not in markdown  # no SLO was set, vLLM computed none
    # 0 and None latency limits are no gate and are not listed; the error-rate limit is
    assert "| ttft_p99_ms | 150 | breached |" in markdown and "| max_error_rate | 0.5 | met |" in markdown
    assert "e2el_p99_ms" not in markdown and "tpot_p99_ms" not in markdown
    assert "- TTFT p99 is 198 ms, over the limit 150 ms" in markdown
    assert "| Internal Server Error | 1 | #1: Internal Server Error |" in markdown
    assert "![TTFT and E2EL per request](verify-x.svg)" in markdown
    assert '| ranks | ["node1", "node2"] |' in markdown


# A limit for every gate that SUMMARY (with a goodput share) breaches.
BREACHING_LIMITS = {
    "ttft_p99_ms": 150,
    "tpot_p99_ms": 20,
    "itl_p99_ms": 25,
    "e2el_p99_ms": 1000,
    "max_error_rate": 0.1,
    "min_goodput_share": 0.9,
}


def test_the_report_marks_every_gate_kimi_bench_can_breach_as_breached():
    # Every gate kimi_bench has (a new Gates field without a limit here fails with its name), each breached by
    # kimi_bench itself: the report must find each breach under the gate's row, whatever figure name it carries.
    gates = Gates(**{gate.name: BREACHING_LIMITS[gate.name] for gate in fields(Gates)})
    breaches = check_gates({**SUMMARY, "goodput_share": 0.5}, gates)
    assert len(breaches) == len(fields(Gates)), breaches
    markdown = render_markdown(report(loadtest={**LOADTEST, "breaches": breaches}, thresholds=gates.as_dict()))
    for gate in fields(Gates):
        assert f"| {gate.name} | {BREACHING_LIMITS[gate.name]:g} | breached |" in markdown, gate.name


def test_markdown_without_a_load_test():
    markdown = render_markdown(report(loadtest=None))
    assert "## Load test\n\nNot run." in markdown and "![" not in markdown


def test_printed_table_is_fixed_width_and_clipped():
    long_detail = {"name": "models", "status": "fail", "detail": "x" * 300}
    lines = render_table(report([*CHECKS, long_detail]), width=100)
    assert lines[0] == "verify kimi-k2: FAIL (2 checks failed, 1 threshold breached)"
    assert lines[1] == "check      result  detail"
    assert lines[3] == "tool_call  fail    tool calls emitted as text | markers"
    assert all(len(line) <= 100 for line in lines)
    assert lines[5].endswith("...")
    assert "TTFT (ms)          140     120.5     120.5       180       198" in lines
    assert lines[lines.index("TTFT (ms)          140     120.5     120.5       180       198") - 2].startswith(
        "load test (vllm bench serve): 4 prompts of 32 tokens, 64 output tokens each, at most 2 in flight"
    )
    assert "errors: Internal Server Error x1" in lines
    assert lines[-1] == "breach: TTFT p99 is 198 ms, over the limit 150 ms"
    assert render_table(report(loadtest=None))[-1] == "load test: not run"


def test_written_files_and_latest_copies(tmp_path):
    paths = write_report(report(), tmp_path, "verify-20250131T120000Z")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "verify-20250131T120000Z.json",
        "verify-20250131T120000Z.md",
        "verify-20250131T120000Z.svg",
        "verify-latest.json",
        "verify-latest.md",
        "verify-latest.svg",
    ]  # no temporary files left behind
    written = json.loads((tmp_path / "verify-20250131T120000Z.json").read_text())
    assert written["loadtest"]["records"] == RECORDS and written["facts"]["nodes"] == 2
    assert written["files"]["chart"] == "verify-20250131T120000Z.svg" and "png" not in written["files"]
    for suffix in ("json", "md", "svg"):
        dated = tmp_path / f"verify-20250131T120000Z.{suffix}"
        latest = tmp_path / f"verify-latest.{suffix}"
        assert latest.read_bytes() == dated.read_bytes() and not latest.is_symlink()
    chart = ET.fromstring((tmp_path / "verify-latest.svg").read_bytes())
    assert chart.tag == f"{SVG}svg" and chart.find(f"{SVG}title").text == "Verify load test: kimi-k2"
    bars = [rect for rect in chart.iter(f"{SVG}rect") if rect.get("class") in ("e2e", "ttft", "error")]
    assert sorted(rect.get("class") for rect in bars) == ["e2e"] * 3 + ["error"] + ["ttft"] * 3  # 3 ok, 1 failed
    assert "TTFT limit 150 ms" in ["".join(text.itertext()) for text in chart.iter(f"{SVG}text")]
    assert paths["chart"] == str(tmp_path / "verify-20250131T120000Z.svg")
    assert paths["latest_chart"] == str(tmp_path / "verify-latest.svg")
    assert paths["latest_markdown"] == str(tmp_path / "verify-latest.md")


def test_a_report_without_a_load_test_removes_the_stale_latest_chart(tmp_path):
    write_report(report(), tmp_path, "verify-1")
    paths = write_report(report(loadtest=None), tmp_path, "verify-2")
    assert "chart" not in paths and not (tmp_path / "verify-latest.svg").exists()
    assert (tmp_path / "verify-1.svg").exists()  # older dated reports are kept
    assert json.loads((tmp_path / "verify-latest.json").read_text())["loadtest"] is None


def test_chart_false_draws_no_svg_and_the_module_takes_png_as_its_alias(tmp_path):
    paths = write_report(report(), tmp_path / "direct", "verify-1", chart=False)
    assert "chart" not in paths and not list((tmp_path / "direct").glob("*.svg"))
    assert json.loads((tmp_path / "direct" / "verify-1.json").read_text())["files"]["chart"] is None
    assert "![" not in (tmp_path / "direct" / "verify-1.md").read_text()
    args = {"checks": CHECKS, "loadtest": LOADTEST, "report_dir": str(tmp_path / "module"), "png": False}
    ok, result = run_module(tmp_path, "kimi_verify_report", args)
    assert ok and "chart" not in result["paths"] and not list((tmp_path / "module").glob("*.svg"))


def test_no_latest_copies_and_bad_names(tmp_path):
    write_report(report(), tmp_path, "verify-1", latest_basename="")
    assert not list(tmp_path.glob("verify-latest*"))
    for bad in ("", "../escape", ".hidden"):
        with pytest.raises(ValueError):
            write_report(report(), tmp_path, bad)
    with pytest.raises(ValueError):
        write_report(report(), tmp_path, "verify-latest")


def test_module_writes_even_in_check_mode_and_returns_the_table(tmp_path):
    args = {
        "checks": CHECKS,
        "loadtest": {**LOADTEST, "thresholds": THRESHOLDS},
        "inputs": {"served_model_name": "kimi-k2"},
        "facts": {"nodes": 2},
        "report_dir": str(tmp_path / "artifacts"),
        "basename": "verify-test",
    }
    ok, result = run_module(tmp_path, "kimi_verify_report", args, check=True)
    assert ok and result["changed"] is False  # a report is never a change
    assert result["ok"] is False and result["verdict"] == "FAIL (1 check failed, 1 threshold breached)"
    assert result["table"][0] == "verify kimi-k2: FAIL (1 check failed, 1 threshold breached)"
    assert result["table"][-1] == f"report: {tmp_path / 'artifacts' / 'verify-test.md'}"
    written = json.loads((tmp_path / "artifacts" / "verify-latest.json").read_text())
    assert written["loadtest"]["thresholds"] == THRESHOLDS  # taken from the load test result
    assert written["generated_at"].endswith("Z")
    assert set(result["paths"]) == {"json", "markdown", "chart", "latest_json", "latest_markdown", "latest_chart"}


# kimi_rank_join's registered result, as roles/verify registers it (verify_ranks).
RANKS = {
    "changed": False,
    "ok": False,
    "summary": "1 of 2 ranks joined",
    "problems": ["node2: no join line in its journal", "node2: no NCCL version"],
    "ranks": {"node1": {"joined": True}, "node2": {"joined": False}},
    "nccl": {"node1": "2.30.4"},
}


# What RANKS (node2 never joined) becomes.
FAILED_RANKS_CHECK = {
    "name": "ranks_joined",
    "status": "fail",
    "passed": False,
    "skipped": False,
    "detail": "1 of 2 ranks joined; node2: no join line in its journal; node2: no NCCL version",
    "data": {"ranks": RANKS["ranks"], "nccl": RANKS["nccl"]},
}


def test_the_rank_result_becomes_the_ranks_joined_check():
    assert rank_join_check(RANKS) == FAILED_RANKS_CHECK
    joined = rank_join_check({**RANKS, "ok": True, "summary": "2 of 2 ranks joined", "problems": []})
    assert joined["status"] == "pass" and joined["passed"] is True and joined["detail"] == "2 of 2 ranks joined"


def test_a_skipped_rank_check_adds_nothing():
    assert rank_join_check({"changed": False, "skipped": True, "skip_reason": "Conditional result was False"}) is None
    assert rank_join_check(None) is None


def test_the_module_appends_the_ranks_joined_check_after_the_others(tmp_path):
    args = {
        "checks": CHECKS,
        "rank_join": RANKS,
        "report_dir": str(tmp_path / "artifacts"),
        "basename": "verify-ranks",
        "latest_basename": "",
    }
    ok, result = run_module(tmp_path, "kimi_verify_report", args)
    assert ok, result
    written = json.loads((tmp_path / "artifacts" / "verify-ranks.json").read_text())
    assert [c["name"] for c in written["checks"]] == ["health", "tool_call", "reasoning", "ranks_joined"]
    assert written["checks"][-1] == FAILED_RANKS_CHECK
    skipped = {**args, "rank_join": {"skipped": True}, "basename": "verify-no-ranks"}
    ok, result = run_module(tmp_path, "kimi_verify_report", skipped)
    assert ok, result
    written = json.loads((tmp_path / "artifacts" / "verify-no-ranks.json").read_text())
    assert [c["name"] for c in written["checks"]] == ["health", "tool_call", "reasoning"]


def test_a_request_rate_sweep_and_goodput_are_reported():
    sweep = [{"request_rate": 2.0, "summary": {**SUMMARY, "request_rate": 2.0, "completed": 4, "failed": 0}}]
    with_goodput = {**SUMMARY, "request_goodput": 0.5, "goodput_share": 0.5}
    markdown = render_markdown(report(loadtest={**LOADTEST, "summary": with_goodput, "sweep": sweep}))
    assert "### Request-rate sweep" in markdown
    assert "| 2 | 4 | 0 | 198 | 25.5 | 1790 | 54.86 |" in markdown
    assert "request_goodput 0.5 req/s (50% of the prompts)" in markdown


def test_a_benchmark_without_a_result_shows_why():
    failed = {
        "summary": None,
        "records": [],
        "breaches": [{**BREACH, "figure": "run", "message": "vllm bench serve exited 1"}],
    }
    built = report(loadtest=failed)
    assert built["ok"] is False
    assert "The benchmark did not produce a result." in render_markdown(built)
    assert "load test (vllm bench serve): no result" in render_table(built)
