"""kimi_vllm_bench as Ansible runs it, with a stand-in `vllm` executable that behaves as `vllm bench serve` does at
its edges: it writes its result where --result-dir/--result-filename say, reads the key from OPENAI_API_KEY,
exits non-zero with a traceback, or hangs. The real benchmark runs in the lab's verify phase (tests/lab)."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

from tests.unit.ansible_adhoc import run_module
from tests.unit.plugins.module_utils.test_kimi_bench import synthetic_result

STAND_IN = """\
import json, os, sys, time
argv = sys.argv[1:]
def flag(name):
    return argv[argv.index(name) + 1]
with open({log!r}, "a") as log:
    log.write(json.dumps({{"argv": argv, "key": os.environ.get("OPENAI_API_KEY")}}) + "\\n")
mode = {mode!r}
if mode == "crash":
    print("Traceback (most recent call last):\\nValueError: --random-input-len is too small", flush=True)
    sys.exit(1)
if mode == "hang":
    time.sleep(120)
result = json.loads({result!r})
result["num_prompts"] = int(flag("--num-prompts"))
with open(os.path.join(flag("--result-dir"), flag("--result-filename")), "w") as out:
    json.dump(result, out)
"""


def stand_in(tmp_path: Path, mode: str = "ok", **result_changes) -> tuple[Path, Path]:
    log = tmp_path / "calls.jsonl"
    script = tmp_path / "vllm"
    body = STAND_IN.format(log=str(log), mode=mode, result=json.dumps(synthetic_result(**result_changes)))
    script.write_text(f"#!{sys.executable}\n{body}")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, log


def args(script: Path, **changes) -> dict:
    return {
        "vllm": str(script),
        "base_url": "http://127.0.0.1:8000",
        "model": "kimi-k2",
        "tokenizer": "/data/models/kimi",
        "num_prompts": 4,
        "max_concurrency": 2,
        "output_len": 8,
        "fail_on_breach": False,
        **changes,
    }


def calls(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_runs_the_benchmark_with_the_key_in_its_environment_and_judges_it(tmp_path):
    script, log = stand_in(tmp_path)
    ok, result = run_module(tmp_path, "kimi_vllm_bench", args(script, api_key="s3cret", ttft_p99_ms=250))
    assert ok, result
    assert result["changed"] is False
    assert result["summary"]["ttft_ms"]["p99"] == 300.0 and result["summary"]["completed"] == 3
    assert [b["figure"] for b in result["breaches"]] == ["ttft_ms.p99"]
    assert len(result["records"]) == 4 and result["sweep"] == []
    (call,) = calls(log)
    assert call["key"] == "s3cret" and "s3cret" not in json.dumps(call["argv"]) + json.dumps(result)
    assert call["argv"][:2] == ["bench", "serve"] and "--goodput" in call["argv"]


def test_each_request_rate_is_a_further_run_and_a_breach_fails_when_asked(tmp_path):
    script, log = stand_in(tmp_path)
    ok, result = run_module(
        tmp_path, "kimi_vllm_bench", args(script, request_rates=[1, 2.5], max_error_rate=0, fail_on_breach=True)
    )
    assert not ok
    rates = [c["argv"][c["argv"].index("--request-rate") + 1] for c in calls(log)]
    assert rates == ["inf", "1", "2.5"]
    assert [entry["request_rate"] for entry in result["sweep"]] == [1.0, 2.5]
    messages = [b["message"] for b in result["breaches"]]
    assert messages[0].startswith("error rate is 25.0%") and messages[2].startswith("at 2.5 requests/s: error rate")
    assert "error rate is 25.0%" in result["msg"]


def test_a_failing_benchmark_is_a_breach_with_its_output(tmp_path):
    script, _ = stand_in(tmp_path, mode="crash")
    ok, result = run_module(tmp_path, "kimi_vllm_bench", args(script))
    assert ok and result["summary"] is None
    (breach,) = result["breaches"]
    assert breach["figure"] == "run"
    assert (
        breach["message"].startswith("vllm bench serve exited 1")
        and "random-input-len is too small" in (breach["message"])
    )


def test_the_time_budget_stops_a_hung_benchmark(tmp_path):
    script, _ = stand_in(tmp_path, mode="hang")
    ok, result = run_module(tmp_path, "kimi_vllm_bench", args(script, time_budget=3))
    assert ok
    assert "stopped at the time budget" in result["breaches"][0]["message"]


def test_a_missing_executable_and_bad_numbers_are_refused_by_name(tmp_path):
    ok, result = run_module(
        tmp_path, "kimi_vllm_bench", args(tmp_path / "nowhere" / "vllm", num_prompts=0, request_rates=[-1])
    )
    assert not ok
    for words in ("num_prompts must be at least 1", "request_rates must be above 0", "is not an executable"):
        assert words in result["msg"]


def test_check_mode_still_measures(tmp_path):
    # The benchmark only sends inference requests: a --check run of the verify phase still reports figures.
    script, log = stand_in(tmp_path)
    ok, result = run_module(tmp_path, "kimi_vllm_bench", args(script), check=True)
    assert ok and result["summary"]["completed"] == 3
    assert len(calls(log)) == 1
