"""The load test: percentiles on known inputs, SSE parsing and per-stream figures without a server, then real
streams from a fake server on 127.0.0.1 with injected delays and errors (measurement correctness, not speed)."""

from __future__ import annotations

import json
import random
import statistics

import pytest

from module_utils.kimi_loadtest import (
    LoadTestConfig,
    MalformedStreamError,
    RequestRecord,
    StreamMeasure,
    Thresholds,
    build_stream_request,
    check_thresholds,
    measure_stream,
    parse_sse_line,
    percentile,
    record_from_measure,
    run_load_test,
    summarize,
)
from tests.unit.ansible_adhoc import run_module
from tests.unit.fake_openai import FakeOpenAI, StreamPlan, closed_port_url

# Upper slack on a measured delay: the fake server sleeps at least the injected time; everything else on
# loopback takes milliseconds, so half a second only guards against a loaded test machine.
SLACK_MS = 500


# ------------------------------------------------------------------------------------------ percentiles


def test_percentile_interpolates_between_closest_ranks():
    one_to_ten = list(range(1, 11))
    assert percentile(one_to_ten, 50) == pytest.approx(5.5)
    assert percentile(one_to_ten, 90) == pytest.approx(9.1)
    assert percentile(one_to_ten, 99) == pytest.approx(9.91)
    assert percentile([4, 1, 3, 2], 50) == pytest.approx(2.5)  # input order does not matter
    assert percentile([10, 20], 25) == pytest.approx(12.5)
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None
    assert percentile([3, 1, 2], 0) == 1 and percentile([3, 1, 2], 100) == 3


def test_percentile_matches_the_inclusive_method_of_statistics():
    # statistics.quantiles(method="inclusive") is the same definition (type 7), implemented independently.
    generator = random.Random(7)
    for size in (2, 3, 11, 50, 101):
        values = [generator.uniform(0, 1000) for _ in range(size)]
        cuts = statistics.quantiles(values, n=100, method="inclusive")
        for p in (1, 50, 90, 99):
            assert percentile(values, p) == pytest.approx(cuts[p - 1])


def test_percentile_rejects_a_fraction_outside_0_to_100():
    with pytest.raises(ValueError):
        percentile([1, 2], 150)


# ------------------------------------------------------------------------------------------ SSE, pure


def test_sse_lines():
    assert parse_sse_line('data: {"a": 1}\n').payload == {"a": 1}
    assert parse_sse_line('data:{"a": 2}').payload == {"a": 2}  # the space after the colon is optional
    assert parse_sse_line("data: [DONE]\n").kind == "done"
    for ignored in ("\n", "", ": keep-alive\n", "event: message\n", "id: 3\n"):
        assert parse_sse_line(ignored) is None
    for broken in ("data: {not json\n", "data: [1, 2]\n", "garbage\n", "weird: field\n"):
        with pytest.raises(MalformedStreamError):
            parse_sse_line(broken)


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n"


def delta(**fields) -> str:
    return sse({"choices": [{"index": 0, "delta": fields}]})


def usage(tokens: int) -> str:
    return sse({"choices": [], "usage": {"completion_tokens": tokens}})


def test_first_token_is_the_first_chunk_with_text_not_the_role_chunk():
    lines = [
        (10.01, delta(role="assistant", content="")),
        (10.02, "\n"),
        (10.25, delta(content="Hello")),
        (10.35, delta(content=" world")),
        (10.36, usage(2)),
        (10.40, "data: [DONE]\n"),
    ]
    measure = measure_stream(lines, sent_at=10.0)
    assert measure.first_token_s == pytest.approx(0.25)
    assert measure.end_s == pytest.approx(0.40)
    assert (measure.text_chunks, measure.usage_tokens, measure.done, measure.error) == (2, 2, True, None)


def test_reasoning_counts_as_the_first_token():
    for key in ("reasoning_content", "reasoning"):
        lines = [(1.0, delta(role="assistant")), (1.5, delta(**{key: "hmm"})), (2.0, "data: [DONE]\n")]
        assert measure_stream(lines, sent_at=0.0).first_token_s == pytest.approx(1.5)


def test_stream_problems_are_reported():
    malformed = measure_stream([(1.0, delta(content="a")), (1.1, "data: {oops\n")], sent_at=0.0)
    assert malformed.error.startswith("malformed stream: data is not JSON")
    in_stream = measure_stream([(1.0, sse({"error": {"message": "out of KV cache", "code": 500}}))], sent_at=0.0)
    assert in_stream.error == "server error in stream: out of KV cache"
    truncated = measure_stream([(1.0, delta(content="a"))], sent_at=0.0)
    assert truncated.done is False and truncated.error is None


def test_record_figures_from_a_measure():
    measure = StreamMeasure(first_token_s=0.1, end_s=1.1, text_chunks=9, usage_tokens=11, done=True)
    record = record_from_measure(3, 0.5, measure, 200)
    assert record.ok and record.tokens_from == "usage" and record.output_tokens == 11
    assert record.ttft_ms == pytest.approx(100)
    assert record.e2e_ms == pytest.approx(1100)
    assert record.tpot_ms == pytest.approx(100)  # (1100 - 100) / (11 - 1)


def test_record_counts_chunks_without_usage_and_has_no_tpot_for_one_token():
    counted = record_from_measure(0, 0, StreamMeasure(0.1, 0.5, text_chunks=5, done=True), 200)
    assert (counted.output_tokens, counted.tokens_from) == (5, "chunks")
    assert counted.tpot_ms == pytest.approx(100)
    single = record_from_measure(0, 0, StreamMeasure(0.1, 0.1, text_chunks=1, usage_tokens=1, done=True), 200)
    assert single.ok and single.tpot_ms is None


def test_record_of_a_truncated_or_empty_stream_is_an_error():
    truncated = record_from_measure(0, 0, StreamMeasure(0.1, 0.5, text_chunks=3, done=False), 200)
    assert not truncated.ok and "ended before [DONE]" in truncated.error
    assert truncated.error_kind == "malformed stream"
    empty = record_from_measure(0, 0, StreamMeasure(None, 0.5, done=True), 200)
    assert not empty.ok and "no chunk carried any generated text" in empty.error


# ------------------------------------------------------------------------------------------ summary, thresholds


def ok_record(index, ttft, e2e, tokens=11):
    return RequestRecord(index, 0.0, True, ttft, e2e, (e2e - ttft) / (tokens - 1), tokens, "usage", 200)


def failed_record(index, kind="HTTP 500"):
    return RequestRecord(index, 0.0, False, error=f"{kind}: boom", error_kind=kind)


def test_summary_figures():
    config = LoadTestConfig("http://127.0.0.1:1", "kimi-k2", requests=6, concurrency=2, max_tokens=11)
    records = [ok_record(i, 100.0 * (i + 1), 1100.0 * (i + 1)) for i in range(4)] + [failed_record(4)]
    summary = summarize(records, config, wall_s=2.0)
    assert (summary["sent"], summary["ok"], summary["errors"], summary["not_sent"]) == (5, 4, 1, 1)
    assert summary["error_rate"] == pytest.approx(0.2)
    assert summary["errors_by_kind"] == {"HTTP 500": 1}
    assert summary["ttft_ms"]["p50"] == pytest.approx(250)
    assert summary["ttft_ms"]["p90"] == pytest.approx(370)
    assert summary["ttft_ms"]["count"] == 4
    assert summary["tpot_ms"]["min"] == pytest.approx(100)
    assert summary["output_tokens"] == 44
    assert summary["output_tokens_per_s"] == pytest.approx(22.0)  # 44 tokens / 2 s wall time
    # per request: 11 tokens over 1.1, 2.2, 3.3, 4.4 s
    assert summary["output_tokens_per_s_per_request"] == pytest.approx((10 + 5 + 10 / 3 + 2.5) / 4, abs=0.01)
    assert summary["short_outputs"] == 0


def summary_of(records, requests=None):
    config = LoadTestConfig("http://127.0.0.1:1", "kimi-k2", requests=requests or len(records), max_tokens=11)
    return summarize(records, config, wall_s=1.0)


def test_thresholds_breached_name_the_figure_the_limit_and_the_value():
    summary = summary_of([ok_record(i, 100.0 + i, 2000.0) for i in range(9)] + [failed_record(9)])
    breaches = check_thresholds(summary, Thresholds(ttft_p99_ms=100, e2e_p99_ms=5000, max_error_rate=0.05))
    assert [b["figure"] for b in breaches] == ["ttft_ms.p99", "error_rate"]
    assert breaches[0]["limit"] == 100 and breaches[0]["value"] == pytest.approx(107.92)
    assert breaches[0]["message"] == "TTFT p99 is 107.92 ms, over the limit 100 ms"
    assert breaches[1]["message"] == "error rate is 10.0% (1 of 10 sent), over the limit 5.0%"


def test_zero_or_missing_latency_limits_do_not_gate_but_a_zero_error_rate_does():
    summary = summary_of([ok_record(0, 100.0, 2000.0), failed_record(1)])
    assert check_thresholds(summary, Thresholds(ttft_p99_ms=0, tpot_p99_ms=None, e2e_p99_ms=0)) == []
    breaches = check_thresholds(summary, Thresholds(max_error_rate=0))
    assert [b["figure"] for b in breaches] == ["error_rate"]
    assert check_thresholds(summary_of([ok_record(0, 100.0, 2000.0)]), Thresholds(max_error_rate=0)) == []


def test_no_successful_request_is_always_a_breach():
    breaches = check_thresholds(summary_of([failed_record(0), failed_record(1, "timeout")]), Thresholds())
    assert [b["figure"] for b in breaches] == ["ok"]
    assert "no request succeeded" in breaches[0]["message"] and "timeout" in breaches[0]["message"]


def test_config_problems():
    bad = LoadTestConfig("http://127.0.0.1:1", "", requests=0, concurrency=0, timeout_s=0)
    problems = bad.problems()
    assert any(p.startswith("requests must be at least 1") for p in problems)
    assert any(p.startswith("concurrency") for p in problems) and "model is empty" in problems
    with pytest.raises(ValueError, match="timeout_s must be positive"):
        run_load_test(bad)


def test_request_body_fixes_the_output_length():
    body = build_stream_request(LoadTestConfig("http://x", "kimi-k2", max_tokens=64, prompt="hi"))
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == body["min_tokens"] == 64 and body["ignore_eos"] is True
    assert body["messages"] == [{"role": "user", "content": "hi"}]


# ------------------------------------------------------------------------------------------ against a server


def config_for(server, **overrides) -> LoadTestConfig:
    settings = {"requests": 1, "concurrency": 1, "max_tokens": 6, "timeout_s": 5.0, "budget_s": 30.0}
    settings.update(overrides)
    return LoadTestConfig(server.url, "kimi-k2", **settings)


def test_measured_ttft_tpot_and_e2e_follow_the_injected_delays():
    plan = StreamPlan(tokens=5, first_token_delay=0.2, token_delay=0.05)
    with FakeOpenAI(default_plan=plan) as server:
        outcome = run_load_test(config_for(server, api_key="sk-test"))
    record = outcome["records"][0]
    assert record["ok"], record
    # Lower bounds are guaranteed: the server sleeps before it sends. The client stamps a line when it reads it,
    # so a late read of the first token shortens E2E - TTFT; the TPOT window allows 100 ms of that.
    assert 200 <= record["ttft_ms"] < 200 + SLACK_MS
    assert 200 + 4 * 50 <= record["e2e_ms"] < 400 + SLACK_MS
    assert 25 <= record["tpot_ms"] < 50 + SLACK_MS / 4
    assert record["tpot_ms"] == pytest.approx((record["e2e_ms"] - record["ttft_ms"]) / 4)
    assert (record["output_tokens"], record["tokens_from"]) == (5, "usage")
    sent = server.requests[0]
    assert sent["path"] == "/v1/chat/completions"
    assert sent["headers"]["Authorization"] == "Bearer sk-test"
    assert sent["body"]["min_tokens"] == 6 and sent["body"]["ignore_eos"] is True
    assert outcome["summary"]["ttft_ms"]["p50"] == pytest.approx(record["ttft_ms"], abs=0.01)


def test_usage_chunk_wins_over_counted_chunks_and_chunks_are_the_fallback():
    with FakeOpenAI(plans=[StreamPlan(tokens=3, usage_tokens=7), StreamPlan(tokens=3, usage=False)]) as server:
        records = run_load_test(config_for(server, requests=2))["records"]
    assert [(r["output_tokens"], r["tokens_from"]) for r in records] == [(7, "usage"), (3, "chunks")]


def test_errors_are_recorded_per_request_and_counted_by_kind():
    plans = [
        StreamPlan(),
        StreamPlan(status=500),
        StreamPlan(tokens=4, malformed_after=2),
        StreamPlan(hang=3.0),
        StreamPlan(done=False),
        StreamPlan(),
    ]
    with FakeOpenAI(plans=plans) as server:
        outcome = run_load_test(config_for(server, requests=6, timeout_s=0.4))
    records, summary = outcome["records"], outcome["summary"]
    assert [r["ok"] for r in records] == [True, False, False, False, False, True]
    assert records[1]["error"] == "HTTP 500: engine exploded" and records[1]["http_status"] == 500
    assert records[2]["error"].startswith("malformed stream: data is not JSON")
    assert records[3]["error_kind"] == "timeout"
    assert records[4]["error"].startswith("malformed stream: it ended before [DONE]")
    assert summary["errors_by_kind"] == {"HTTP 500": 1, "malformed stream": 2, "timeout": 1}
    assert (summary["ok"], summary["errors"], summary["not_sent"]) == (2, 4, 0)
    assert summary["ttft_ms"]["count"] == 2  # figures over the successful requests only


def test_connection_refused():
    config = LoadTestConfig(closed_port_url(), "kimi-k2", requests=2, concurrency=2, timeout_s=2.0)
    outcome = run_load_test(config)
    assert [r["error_kind"] for r in outcome["records"]] == ["connection refused", "connection refused"]
    assert check_thresholds(outcome["summary"], Thresholds())[0]["figure"] == "ok"


def test_no_request_is_sent_after_the_time_budget():
    with FakeOpenAI(default_plan=StreamPlan(tokens=2, first_token_delay=0.15)) as server:
        outcome = run_load_test(config_for(server, requests=20, budget_s=0.4))
    summary = outcome["summary"]
    # Requests start at about 0, 0.15, 0.3 s; the budget runs out before a fifth could start.
    assert 1 <= summary["sent"] <= 4, summary
    assert summary["not_sent"] == 20 - summary["sent"]
    assert summary["ok"] == summary["sent"] and len(outcome["records"]) == summary["sent"]
    assert [r["index"] for r in outcome["records"]] == list(range(summary["sent"]))


def test_concurrency_is_a_ceiling_and_is_reached():
    # Each request stays in flight half a second, so the workers overlap even on a loaded machine
    # (0.1 s let a busy CI core run them one after another).
    with FakeOpenAI(default_plan=StreamPlan(tokens=2, first_token_delay=0.5)) as server:
        outcome = run_load_test(config_for(server, requests=9, concurrency=3))
        peak = server.max_in_flight
    assert outcome["summary"]["ok"] == 9
    assert 2 <= peak <= 3


# ------------------------------------------------------------------------------------------ the module


def module_args(server, **extra):
    args = {"base_url": server.url, "model": "kimi-k2", "requests": 3, "concurrency": 1, "max_tokens": 4}
    args.update(extra)
    return args


def test_module_fails_on_a_breach_and_still_returns_the_figures(tmp_path):
    plans = [StreamPlan(), StreamPlan(status=500), StreamPlan()]
    with FakeOpenAI(plans=plans) as server:
        ok, result = run_module(tmp_path, "kimi_loadtest", module_args(server, max_error_rate=0, api_key="sk-x"))
    assert not ok
    assert "error rate is 33.3% (1 of 3 sent), over the limit 0.0%" in result["msg"]
    assert result["summary"]["ok"] == 2 and len(result["records"]) == 3
    assert result["breaches"][0]["figure"] == "error_rate"
    assert result["changed"] is False


def test_module_can_skip_in_check_mode(tmp_path):
    with FakeOpenAI() as server:
        # skipped=true makes Ansible show the task as skipped (the role can test `is skipped`), with no JSON.
        with pytest.raises(AssertionError, match=r"localhost \| SKIPPED"):
            run_module(tmp_path, "kimi_loadtest", module_args(server, skip_in_check_mode=True), check=True)
        assert not server.requests
        ok, result = run_module(tmp_path, "kimi_loadtest", module_args(server, requests=1), check=True)
        assert ok and result["summary"]["ok"] == 1  # without skip_in_check_mode the test runs in check mode
