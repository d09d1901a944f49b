"""verify's load test over vLLM's serving benchmark: the command line, the result read back under vLLM's names,
per-request records, the gates, and the process bound. A result file vLLM 0.32.0's `vllm bench serve` wrote
(tests/fixtures/vllm/bench/, recorded as its README says) keeps the reader honest about the real format."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from ansible_collections.kimi.k2.plugins.module_utils.kimi_bench import (
    BenchConfig,
    Gates,
    bench_argv,
    bench_environment,
    check_gates,
    error_kind,
    goodput_args,
    judge,
    read_result,
    records,
    run_bench,
    server_root,
    summarize,
)

from tests import paths

FIXTURES = paths.REPO_ROOT / "tests" / "fixtures" / "vllm" / "bench"


def config(**changes) -> BenchConfig:
    values = {
        "vllm": "/opt/vllm/current/bin/vllm",
        "base_url": "http://127.0.0.1:8000",
        "model": "kimi-k2",
        "tokenizer": "/data/models/kimi",
        "num_prompts": 4,
        "max_concurrency": 2,
        "input_len": 16,
        "output_len": 8,
    }
    return BenchConfig(**{**values, **changes})


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


# ------------------------------------------------------------------------------------------ the command line


def test_argv_asks_vllm_for_a_chat_benchmark_with_detailed_results():
    argv = bench_argv(config(), "/tmp/out", "run-0.json")
    assert argv[:3] == ["/opt/vllm/current/bin/vllm", "bench", "serve"]
    assert flag(argv, "--backend") == "openai-chat"
    assert flag(argv, "--endpoint") == "/v1/chat/completions"
    assert flag(argv, "--served-model-name") == "kimi-k2"
    assert flag(argv, "--tokenizer") == flag(argv, "--model") == "/data/models/kimi"
    assert flag(argv, "--dataset-name") == "random"  # prompts from the model's tokenizer, never a hub dataset
    assert (flag(argv, "--random-input-len"), flag(argv, "--random-output-len")) == ("16", "8")
    assert (flag(argv, "--num-prompts"), flag(argv, "--max-concurrency")) == ("4", "2")
    assert flag(argv, "--request-rate") == "inf"
    assert flag(argv, "--percentile-metrics") == "ttft,tpot,itl,e2el"
    assert flag(argv, "--metric-percentiles") == "50,90,99"
    assert {"--ignore-eos", "--save-result", "--save-detailed", "--trust-remote-code"} <= set(argv)
    assert (flag(argv, "--result-dir"), flag(argv, "--result-filename")) == ("/tmp/out", "run-0.json")
    assert "--goodput" not in argv


def test_base_url_is_the_server_root_and_a_rate_is_passed():
    argv = bench_argv(config(base_url="http://10.0.0.1:8000/v1/", request_rate=2.5), "/o", "r.json")
    assert flag(argv, "--base-url") == "http://10.0.0.1:8000"
    assert flag(argv, "--request-rate") == "2.5"
    assert server_root("https://front.example:443") == "https://front.example:443"


def test_goodput_slos_come_from_the_latency_gates_vllm_knows():
    gates = Gates(ttft_p99_ms=2000, tpot_p99_ms=50.5, itl_p99_ms=80, e2el_p99_ms=0)
    # vLLM's --goodput accepts ttft, tpot and e2el only; the ITL gate stays ours.
    assert goodput_args(gates) == ["--goodput", "ttft:2000", "tpot:50.5"]
    argv = bench_argv(config(gates=gates, trust_remote_code=False), "/o", "r.json")
    assert argv[-3:] == ["--goodput", "ttft:2000", "tpot:50.5"]
    assert "--trust-remote-code" not in argv


def test_the_key_travels_in_the_environment_and_nothing_reaches_a_hub():
    env = bench_environment({"PATH": "/usr/bin", "OPENAI_API_KEY": "stale"}, "s3cret")
    assert env["OPENAI_API_KEY"] == "s3cret"
    assert env["HF_HUB_OFFLINE"] == "1" and env["PATH"] == "/usr/bin"
    assert "OPENAI_API_KEY" not in bench_environment({"OPENAI_API_KEY": "stale"}, None)
    assert all("s3cret" not in word for word in bench_argv(config(), "/o", "r.json"))


def test_bad_options_are_named():
    problems = config(num_prompts=0, max_concurrency=0, request_rate=0.0, base_url="127.0.0.1:8000").problems()
    text = "; ".join(problems)
    for name in ("num_prompts", "max_concurrency", "request_rates", "base_url"):
        assert name in text
    assert config().problems() == []


# ------------------------------------------------------------------------------------------ the result


def synthetic_result(**changes) -> dict:
    """The shape vLLM 0.32.0 writes with --save-result --save-detailed (vllm/benchmarks/serve.py)."""
    result = {
        "duration": 2.0,
        "completed": 3,
        "failed": 1,
        "total_input_tokens": 48,
        "total_output_tokens": 24,
        "request_throughput": 1.5,
        "request_goodput": 1.0,
        "output_throughput": 12.0,
        "total_token_throughput": 36.0,
        "input_lens": [16, 16, 16, 16],
        "output_lens": [8, 8, 8, 0],
        "ttfts": [0.1, 0.2, 0.3, 0.0],
        "itls": [[0.01] * 7, [0.02] * 7, [0.03] * 7, []],
        "latencies": [0.17, 0.34, 0.51, 0.0],
        "start_times": [100.0, 100.0, 100.5, 100.6],
        "errors": ["", "", "", "Traceback (most recent call last):\n  ...\naiohttp.ClientConnectorError: refused"],
    }
    for metric, base in (("ttft", 200.0), ("tpot", 20.0), ("itl", 20.0), ("e2el", 340.0)):
        result.update({f"mean_{metric}_ms": base, f"median_{metric}_ms": base, f"std_{metric}_ms": 1.0})
        result.update({f"p50_{metric}_ms": base, f"p90_{metric}_ms": base * 1.4, f"p99_{metric}_ms": base * 1.5})
    return {**result, **changes}


def test_records_follow_send_order_with_vllm_tpot_and_the_error_kind():
    rows = records(synthetic_result())
    assert [row["index"] for row in rows] == [0, 1, 2, 3]
    assert [row["started_s"] for row in rows] == [0.0, 0.0, 0.5, 0.6]
    assert rows[0]["ttft_ms"] == 100.0 and rows[0]["e2el_ms"] == 170.0
    assert rows[0]["tpot_ms"] == pytest.approx(10.0)  # (170 - 100) / (8 - 1)
    assert rows[3]["ok"] is False and rows[3]["ttft_ms"] is None
    assert rows[3]["error_kind"] == "ClientConnectorError"
    assert "refused" in rows[3]["error"]


def test_per_request_seconds_keep_their_precision_in_ms():
    # Seen in the lab: rounding seconds to three decimals first turned every TTFT into whole milliseconds.
    result = synthetic_result(ttfts=[0.0712345, 0.2, 0.3, 0.0], start_times=[5.0000004, 5.0, 5.5, 5.6])
    rows = records(result)
    assert rows[0]["ttft_ms"] == 71.235 and rows[0]["tpot_ms"] == pytest.approx((170 - 71.235) / 7, abs=0.001)
    assert [row["started_s"] for row in rows] == [0.0, 0.0, 0.5, 0.6]
    assert str(rows[0]["started_s"]) == "0.0"  # not -0.0


def test_records_of_vllm_0_23_take_latency_from_ttft_and_the_gaps():
    # vLLM 0.23.0 (the production pin) writes no "latencies" in its detailed result.
    legacy = {key: value for key, value in synthetic_result().items() if key != "latencies"}
    rows = records(legacy)
    assert rows[0]["e2el_ms"] == pytest.approx(170.0) and rows[2]["e2el_ms"] == pytest.approx(510.0)
    assert rows[1]["tpot_ms"] == pytest.approx(20.0)


def test_summary_keeps_vllm_names_and_figures():
    summary = summarize(synthetic_result(), config(), records(synthetic_result()))
    assert summary["ttft_ms"] == {"mean": 200.0, "median": 200.0, "std": 1.0, "p50": 200.0, "p90": 280.0, "p99": 300.0}
    assert summary["e2el_ms"]["p99"] == 510.0 and summary["itl_ms"]["p50"] == 20.0
    assert (summary["completed"], summary["failed"], summary["error_rate"]) == (3, 1, 0.25)
    assert summary["errors_by_kind"] == {"ClientConnectorError": 1}
    assert summary["request_throughput"] == 1.5 and summary["output_throughput"] == 12.0
    assert summary["goodput_share"] == 0.5  # 1 request/s over 2 s of 4 prompts
    assert summary["request_rate"] == "inf" and summary["short_outputs"] == 0


def test_gates_name_each_breach():
    summary = summarize(synthetic_result(), config(), records(synthetic_result()))
    gates = Gates(ttft_p99_ms=250, tpot_p99_ms=40, itl_p99_ms=25, e2el_p99_ms=600, max_error_rate=0.1)
    breaches = {b["figure"]: b for b in check_gates(summary, gates)}
    assert set(breaches) == {"ttft_ms.p99", "itl_ms.p99", "error_rate"}
    assert breaches["ttft_ms.p99"]["message"] == "TTFT p99 is 300 ms, over the limit 250 ms"
    assert "25.0% (1 of 4)" in breaches["error_rate"]["message"]
    assert check_gates(summary, Gates(min_goodput_share=0.75))[0]["figure"] == "goodput_share"
    assert check_gates(summary, Gates(ttft_p99_ms=0, max_error_rate=0.25)) == []


def test_no_completed_request_is_always_a_breach():
    result = synthetic_result(completed=0, failed=4, errors=["Bad Request"] * 4, ttfts=[0.0] * 4)
    breaches = judge(result, config())["breaches"]
    assert breaches[0]["figure"] == "completed"
    assert "Bad Request" in breaches[0]["message"]


def test_error_kinds():
    assert error_kind("Traceback ...\nasyncio.exceptions.TimeoutError") == "TimeoutError"
    assert error_kind("Bad Request") == "Bad Request"
    assert error_kind("Never received a valid chunk to calculate TTFT.") == "Never received a valid"


def test_result_file_problems_are_named(tmp_path):
    with pytest.raises(ValueError, match="wrote no result file"):
        read_result(str(tmp_path / "missing.json"))
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ValueError, match="is not JSON"):
        read_result(str(tmp_path / "broken.json"))


@pytest.mark.parametrize("fixture", sorted(FIXTURES.glob("*.json")), ids=lambda p: p.name)
def test_a_result_vllm_wrote_reads_back_whole(fixture):
    result = json.loads(fixture.read_text())
    outcome = judge(result, config(num_prompts=result["num_prompts"], output_len=max(result["output_lens"])))
    summary, rows = outcome["summary"], outcome["records"]
    assert summary["completed"] == result["completed"] > 0
    assert len(rows) == result["num_prompts"]
    for metric in ("ttft", "tpot", "itl", "e2el"):
        assert summary[f"{metric}_ms"]["p99"] == pytest.approx(result[f"p99_{metric}_ms"], abs=0.001)
    ok = [row for row in rows if row["ok"]]
    assert all(row["e2el_ms"] >= row["ttft_ms"] > 0 for row in ok)


# ------------------------------------------------------------------------------------------ the process


def test_a_run_past_its_bound_is_killed_with_its_children(tmp_path):
    marker = tmp_path / "child.pid"
    script = (
        "import subprocess, sys, time\n"
        f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(marker)!r}, 'w').write(str(child.pid))\n"
        "print('started', flush=True)\n"
        "time.sleep(60)\n"
    )
    started = time.monotonic()
    outcome = run_bench([sys.executable, "-c", script], {"PATH": "/usr/bin:/bin"}, 2)
    assert outcome.returncode is None and "started" in outcome.output_tail
    assert time.monotonic() - started < 30
    child = int(marker.read_text())
    deadline = time.monotonic() + 5
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        state = Path(f"/proc/{child}/stat").read_text().split()[2] if Path(f"/proc/{child}/stat").exists() else "X"
        if state == "Z":  # killed, waiting for its (also killed) parent's reaper
            break
        time.sleep(0.1)
    stat = Path(f"/proc/{child}/stat")
    assert not stat.exists() or stat.read_text().split()[2] == "Z"


def test_a_finished_run_returns_its_code_and_output():
    outcome = run_bench([sys.executable, "-c", "print('hello'); raise SystemExit(3)"], {}, 30)
    assert outcome.returncode == 3 and outcome.output_tail.strip() == "hello"
