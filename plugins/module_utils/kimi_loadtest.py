"""A bounded load test against vLLM's /v1/chat/completions: a fixed number of streamed requests at a fixed
concurrency, each producing exactly max_tokens tokens, within an overall time budget.

Per request: TTFT, end-to-end latency, output tokens and TPOT (definitions at measure_stream()). The summary
gives p50/p90/p99 of each (percentile() defines the method), throughput, and error counts; check_thresholds()
turns optional limits into breaches. Stdlib only (urllib + threads): plugins/modules/kimi_loadtest.py runs this with
the node's python3. SSE parsing is pure (parse_sse_line, measure_stream) and tested without a server.
"""

from __future__ import annotations

import http.client
import json
import math
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

DEFAULT_PROMPT = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle. Keep writing until you are "
    "told to stop."
)
PERCENTILES = (50, 90, 99)
ERROR_BODY_EXCERPT = 160
Clock = Callable[[], float]


class MalformedStreamError(ValueError):
    """A server-sent-events line that is not what an OpenAI-compatible stream sends."""


class StreamTimeoutError(Exception):
    """The request ran past its timeout while the stream was still open."""


# ------------------------------------------------------------------------------------------ inputs


@dataclass(frozen=True)
class LoadTestConfig:
    """What plugins/modules/kimi_loadtest.py passes in (its option names in the comments)."""

    base_url: str  # base_url: the server root (http://host:8000), a trailing /v1 is accepted
    model: str  # model: the served model name
    requests: int = 32  # requests
    concurrency: int = 8  # concurrency
    max_tokens: int = 256  # max_tokens
    prompt: str = DEFAULT_PROMPT  # prompt
    api_key: str | None = None  # api_key
    timeout_s: float = 120.0  # request_timeout: per request, from send to the end of the stream
    budget_s: float = 600.0  # time_budget: no request is sent after this many seconds

    def problems(self) -> list[str]:
        problems = []
        for name in ("requests", "concurrency", "max_tokens"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be at least 1 (got {getattr(self, name)})")
        for name in ("timeout_s", "budget_s"):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be positive (got {getattr(self, name)})")
        if not self.model:
            problems.append("model is empty")
        return problems


@dataclass(frozen=True)
class Thresholds:
    """Limits that make a breach. Latency limits: None or 0 means no gate (a 0 ms limit means nothing).
    max_error_rate: None means no gate, 0 means any failed request is a breach."""

    ttft_p99_ms: float | None = None
    tpot_p99_ms: float | None = None
    e2e_p99_ms: float | None = None
    max_error_rate: float | None = None

    def as_dict(self) -> dict[str, float | None]:
        return asdict(self)


def endpoint(base_url: str) -> str:
    root = base_url.rstrip("/")
    root = root[: -len("/v1")] if root.endswith("/v1") else root
    return f"{root}/v1/chat/completions"


def build_stream_request(config: LoadTestConfig) -> dict[str, Any]:
    """A streamed completion of exactly max_tokens tokens: ignore_eos and min_tokens (vLLM's sampling extras)
    keep the model from stopping early, so every request does the same amount of decoding."""
    return {
        "model": config.model,
        "messages": [{"role": "user", "content": config.prompt}],
        "max_tokens": config.max_tokens,
        "min_tokens": config.max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


# ------------------------------------------------------------------------------------------ SSE, pure


@dataclass(frozen=True)
class SseEvent:
    """One data line: kind "chunk" (payload set) or "done" ([DONE])."""

    kind: str
    payload: dict[str, Any] | None = None


def parse_sse_line(line: str) -> SseEvent | None:
    """One line of the stream. None for what carries no data (blank separators, ': comments', event:/id:
    fields); each data line is one JSON chunk, as vLLM sends them. Raises MalformedStreamError otherwise."""
    text = line.strip("\r\n")
    if not text.strip() or text.startswith(":"):
        return None
    field_name, colon, value = text.partition(":")
    if not colon:
        raise MalformedStreamError(f"not a server-sent-events line: {text[:ERROR_BODY_EXCERPT]!r}")
    if field_name in ("event", "id", "retry"):
        return None
    if field_name != "data":
        raise MalformedStreamError(f"unknown field {field_name!r}: {text[:ERROR_BODY_EXCERPT]!r}")
    value = value.removeprefix(" ")
    if value.strip() == "[DONE]":
        return SseEvent("done")
    try:
        payload = json.loads(value)
    except ValueError as error:
        raise MalformedStreamError(f"data is not JSON ({error.msg}): {value[:ERROR_BODY_EXCERPT]!r}") from None
    if not isinstance(payload, dict):
        raise MalformedStreamError(f"data is not a JSON object: {value[:ERROR_BODY_EXCERPT]!r}")
    return SseEvent("chunk", payload)


def chunk_text(payload: Mapping[str, Any]) -> str:
    """The generated text a chunk carries: delta content plus reasoning (reasoning_content, or reasoning in
    newer vLLM), which are tokens too."""
    pieces = []
    for choice in payload.get("choices") or []:
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if isinstance(delta, dict):
            pieces += [delta.get(key) for key in ("content", "reasoning_content", "reasoning")]
    return "".join(piece for piece in pieces if isinstance(piece, str))


def stream_error(payload: Mapping[str, Any]) -> str | None:
    """vLLM reports an error that happens after the response has started as a data chunk {"error": ...}."""
    error = payload.get("error")
    if not error:
        return None
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error)


@dataclass
class StreamMeasure:
    """What one stream showed; times are seconds after the request was sent."""

    first_token_s: float | None = None
    end_s: float | None = None
    text_chunks: int = 0
    usage_tokens: int | None = None
    done: bool = False
    error: str | None = None


def measure_stream(timed_lines: Iterable[tuple[float, str]], sent_at: float) -> StreamMeasure:
    """Walk (arrival time, line) pairs of one response.

    First token: the first chunk whose delta carries non-empty content or reasoning (vLLM's first chunk only
    announces the role, so it does not count). End: the [DONE] line (or the last line when it never came).
    usage_tokens: usage.completion_tokens of the usage chunk stream_options.include_usage adds at the end.
    Stops at the first malformed line or in-stream error, with error set.
    """
    measure = StreamMeasure()
    for arrived, line in timed_lines:
        try:
            event = parse_sse_line(line)
        except MalformedStreamError as error:
            measure.error = f"malformed stream: {error}"
            measure.end_s = arrived - sent_at
            return measure
        if event is None:
            continue
        measure.end_s = arrived - sent_at
        if event.kind == "done":
            measure.done = True
            return measure
        payload = event.payload or {}
        problem = stream_error(payload)
        if problem:
            measure.error = f"server error in stream: {problem}"
            return measure
        if chunk_text(payload):
            measure.text_chunks += 1
            if measure.first_token_s is None:
                measure.first_token_s = arrived - sent_at
        usage = payload.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            measure.usage_tokens = usage["completion_tokens"]
    return measure


# ------------------------------------------------------------------------------------------ one request


@dataclass
class RequestRecord:
    """One request's figures (milliseconds) or its error. started_s: seconds after the test began."""

    index: int
    started_s: float
    ok: bool
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    tpot_ms: float | None = None
    output_tokens: int | None = None
    tokens_from: str | None = None  # "usage" or "chunks" (no usage chunk came: one chunk counted per token)
    http_status: int | None = None
    error: str | None = None
    error_kind: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def record_from_measure(index: int, started_s: float, measure: StreamMeasure, status: int) -> RequestRecord:
    """TTFT = first token - send; E2E = end of stream - send; TPOT = (E2E - TTFT) / (output tokens - 1), the
    mean gap between output tokens after the first (undefined for a single token)."""
    record = RequestRecord(index, started_s, ok=False, http_status=status)
    if measure.error:
        return _with_error(record, measure.error)
    if not measure.done:
        return _with_error(record, f"malformed stream: it ended before [DONE] after {measure.text_chunks} chunks")
    if measure.first_token_s is None:
        return _with_error(record, "malformed stream: no chunk carried any generated text")
    tokens, source = (
        (measure.usage_tokens, "usage") if measure.usage_tokens is not None else (measure.text_chunks, "chunks")
    )
    e2e_s = measure.end_s if measure.end_s is not None else measure.first_token_s
    record.ok = True
    record.ttft_ms = measure.first_token_s * 1000
    record.e2e_ms = e2e_s * 1000
    record.output_tokens, record.tokens_from = tokens, source
    if tokens > 1:
        record.tpot_ms = (e2e_s - measure.first_token_s) * 1000 / (tokens - 1)
    return record


def _with_error(record: RequestRecord, error: str) -> RequestRecord:
    record.ok = False
    record.error = error
    record.error_kind = error_kind(error)
    return record


def error_kind(error: str) -> str:
    """The error's class for counting: "HTTP 500", "timeout", "connection refused", "malformed stream", ..."""
    head = error.split(":", 1)[0].strip()
    return head if head else "error"


def _timed_lines(response: Any, sent_at: float, timeout_s: float, clock: Clock) -> Iterator[tuple[float, str]]:
    # The socket timeout bounds each read; this bounds the whole response, for a server that trickles.
    for raw in response:
        now = clock()
        if now - sent_at > timeout_s:
            raise StreamTimeoutError
        yield now, raw.decode("utf-8", "replace")


def _http_error_text(error: urllib.error.HTTPError) -> str:
    try:
        body = error.read().decode("utf-8", "replace")
    except OSError:
        body = ""
    try:
        document = json.loads(body)
        inner = document.get("error") if isinstance(document, dict) else None
        message = inner.get("message") if isinstance(inner, dict) else document.get("message")
        body = str(message) if message else body
    except (ValueError, AttributeError):
        pass
    return " ".join(body.split())[:ERROR_BODY_EXCERPT] or error.reason or ""


def send_one(config: LoadTestConfig, index: int, test_start: float, clock: Clock = time.monotonic) -> RequestRecord:
    """Send one streamed request and measure it. Never raises for network, HTTP or stream problems."""
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if config.api_key:
        headers["Authorization"] = f"Bearer {config.api_key}"
    body = json.dumps(build_stream_request(config)).encode()
    request = urllib.request.Request(endpoint(config.base_url), data=body, headers=headers)
    sent_at = clock()
    started_s = sent_at - test_start
    try:
        with urllib.request.urlopen(request, timeout=config.timeout_s) as response:
            measure = measure_stream(_timed_lines(response, sent_at, config.timeout_s, clock), sent_at)
            return record_from_measure(index, started_s, measure, response.status)
    except urllib.error.HTTPError as error:
        record = RequestRecord(index, started_s, ok=False, http_status=error.code)
        return _with_error(record, f"HTTP {error.code}: {_http_error_text(error)}")
    except (StreamTimeoutError, TimeoutError):
        return _with_error(
            RequestRecord(index, started_s, ok=False), f"timeout: no complete answer in {config.timeout_s:g} s"
        )
    except urllib.error.URLError as error:
        reason = error.reason
        if isinstance(reason, TimeoutError):
            return _with_error(
                RequestRecord(index, started_s, ok=False), f"timeout: no answer in {config.timeout_s:g} s"
            )
        if isinstance(reason, ConnectionRefusedError):
            return _with_error(
                RequestRecord(index, started_s, ok=False), f"connection refused: {endpoint(config.base_url)}"
            )
        return _with_error(RequestRecord(index, started_s, ok=False), f"connection error: {reason}")
    except (OSError, ValueError, http.client.HTTPException) as error:
        # A reset connection or a broken chunked encoding (IncompleteRead) in the middle of the stream.
        return _with_error(RequestRecord(index, started_s, ok=False), f"connection error: {error}")


# ------------------------------------------------------------------------------------------ the test


Sender = Callable[[LoadTestConfig, int, float, Clock], RequestRecord]


def run_load_test(config: LoadTestConfig, clock: Clock = time.monotonic, send: Sender = send_one) -> dict[str, Any]:
    """Closed loop: `concurrency` workers each send their next request as soon as the previous one ends, until
    `requests` were sent or the time budget is spent. A request in flight when the budget runs out finishes
    (bounded by its timeout), so the wall time is at most budget + timeout. Returns {summary, records}."""
    problems = config.problems()
    if problems:
        raise ValueError("; ".join(problems))
    lock = threading.Lock()
    next_index = [0]
    records: list[RequestRecord] = []
    test_start = clock()

    def claim() -> int | None:
        with lock:
            if next_index[0] >= config.requests or clock() - test_start >= config.budget_s:
                return None
            next_index[0] += 1
            return next_index[0] - 1

    def worker() -> None:
        while (index := claim()) is not None:
            record = send(config, index, test_start, clock)
            with lock:
                records.append(record)

    workers = min(config.concurrency, config.requests)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kimi-loadtest") as pool:
        for future in [pool.submit(worker) for _ in range(workers)]:
            future.result()
    wall_s = clock() - test_start
    records.sort(key=lambda record: record.index)
    return {"summary": summarize(records, config, wall_s), "records": [record.as_dict() for record in records]}


# ------------------------------------------------------------------------------------------ figures


def percentile(values: Sequence[float], percent: float) -> float | None:
    """Linear interpolation between closest ranks (Hyndman-Fan type 7, numpy's default): sort the n values,
    take the position h = (n - 1) x percent / 100, and interpolate between the values at floor(h) and
    ceil(h). p50 of [1, 2, 3, 4] is 2.5; p90 of 1..10 is 9.1. None for no values."""
    if not values:
        return None
    if not 0 <= percent <= 100:
        raise ValueError(f"percent must be within 0..100, got {percent}")
    ordered = sorted(values)
    position = (len(ordered) - 1) * percent / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (position - low) * (ordered[high] - ordered[low])


def distribution(values: Sequence[float]) -> dict[str, float | int | None]:
    """p50/p90/p99, mean, min, max and the count, rounded to 0.01 (milliseconds)."""
    figures: dict[str, float | int | None] = {f"p{p}": _round(percentile(values, p)) for p in PERCENTILES}
    figures["mean"] = _round(sum(values) / len(values)) if values else None
    figures["min"] = _round(min(values)) if values else None
    figures["max"] = _round(max(values)) if values else None
    figures["count"] = len(values)
    return figures


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def summarize(records: Sequence[RequestRecord], config: LoadTestConfig, wall_s: float) -> dict[str, Any]:
    """Figures over the successful requests; errors counted by kind; requests never sent counted apart."""
    ok = [record for record in records if record.ok]
    errors = [record for record in records if not record.ok]
    tokens = [record.output_tokens or 0 for record in ok]
    rates = [
        (record.output_tokens or 0) / (record.e2e_ms / 1000) for record in ok if record.e2e_ms and record.e2e_ms > 0
    ]
    by_kind: dict[str, int] = {}
    for record in errors:
        by_kind[record.error_kind or "error"] = by_kind.get(record.error_kind or "error", 0) + 1
    return {
        "requests": config.requests,
        "concurrency": config.concurrency,
        "max_tokens": config.max_tokens,
        "timeout_s": config.timeout_s,
        "budget_s": config.budget_s,
        "sent": len(records),
        "ok": len(ok),
        "errors": len(errors),
        "not_sent": config.requests - len(records),
        "error_rate": round(len(errors) / len(records), 4) if records else None,
        "errors_by_kind": dict(sorted(by_kind.items())),
        "short_outputs": sum(1 for count in tokens if count < config.max_tokens),
        "wall_s": round(wall_s, 3),
        "ttft_ms": distribution([r.ttft_ms for r in ok if r.ttft_ms is not None]),
        "tpot_ms": distribution([r.tpot_ms for r in ok if r.tpot_ms is not None]),
        "e2e_ms": distribution([r.e2e_ms for r in ok if r.e2e_ms is not None]),
        "output_tokens": sum(tokens),
        "output_tokens_per_s": round(sum(tokens) / wall_s, 2) if wall_s > 0 else None,
        "output_tokens_per_s_per_request": round(sum(rates) / len(rates), 2) if rates else None,
    }


LATENCY_GATES = (
    ("ttft_p99_ms", "ttft_ms", "TTFT p99"),
    ("tpot_p99_ms", "tpot_ms", "TPOT p99"),
    ("e2e_p99_ms", "e2e_ms", "E2E p99"),
)


def check_thresholds(summary: Mapping[str, Any], thresholds: Thresholds) -> list[dict[str, Any]]:
    """A breach per limit exceeded: {figure, limit, value, message}. No successful request at all is always
    a breach (there is nothing to measure)."""
    breaches = []
    if summary["sent"] and not summary["ok"]:
        breaches.append(
            _breach("ok", 1, 0, f"no request succeeded ({summary['errors']} errors: {summary['errors_by_kind']})")
        )
    for option, key, label in LATENCY_GATES:
        limit = getattr(thresholds, option)
        if not limit:
            continue
        value = summary[key]["p99"]
        if value is not None and value > limit:
            breaches.append(
                _breach(f"{key}.p99", limit, value, f"{label} is {value:g} ms, over the limit {limit:g} ms")
            )
    if thresholds.max_error_rate is not None and summary["error_rate"] is not None:
        rate, limit = summary["error_rate"], thresholds.max_error_rate
        if rate > limit:
            breaches.append(
                _breach(
                    "error_rate",
                    limit,
                    rate,
                    f"error rate is {rate:.1%} ({summary['errors']} of {summary['sent']} sent), over the limit "
                    f"{limit:.1%}",
                )
            )
    return breaches


def _breach(figure: str, limit: float, value: float, message: str) -> dict[str, Any]:
    return {"figure": figure, "limit": limit, "value": value, "message": message}


def summary_line(summary: Mapping[str, Any]) -> str:
    """One line for a module's msg."""
    ttft, tpot = summary["ttft_ms"], summary["tpot_ms"]
    return (
        f"{summary['ok']}/{summary['requests']} ok, {summary['errors']} failed, {summary['not_sent']} not sent at "
        f"concurrency {summary['concurrency']}; TTFT p50/p99 {_ms(ttft['p50'])}/{_ms(ttft['p99'])} ms, "
        f"TPOT p50/p99 {_ms(tpot['p50'])}/{_ms(tpot['p99'])} ms, {summary['output_tokens_per_s']} output tokens/s"
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"
