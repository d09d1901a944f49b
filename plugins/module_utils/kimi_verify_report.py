"""The verify phase's report: one JSON document (checks, load test summary and per-request records, thresholds
and breaches, inputs, cluster facts, timestamps), a Markdown summary, a fixed-width table for the end of the
play, and the latency chart as SVG (plugins/module_utils/kimi_chart.py).

Files: <basename>.json, .md and .svg in the report directory, each written atomically (a temporary file in
the same directory, then rename), then byte-for-byte copies under <latest>.json/.md/.svg (default
verify-latest), also written atomically. Copies rather than symlinks: the artifacts directory is often
archived or uploaded by CI, where symlinks are dropped or dangle, and a reader of verify-latest.md follows
its chart link to the dated SVG, which stays next to it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import kimi_report
from .kimi_bench import GATE_FIGURES
from .kimi_chart import latency_chart

REPORT_KIND = "kimi-verify"
REPORT_VERSION = 1
LATEST_BASENAME = "verify-latest"
TABLE_WIDTH = 110
# vLLM's benchmark's metrics, under its names (plugins/module_utils/kimi_bench.py).
METRICS = (("ttft_ms", "TTFT (ms)"), ("tpot_ms", "TPOT (ms)"), ("itl_ms", "ITL (ms)"), ("e2el_ms", "E2EL (ms)"))
STATS = ("mean", "median", "p50", "p90", "p99")
# The check kimi_rank_join's result becomes (rank_join_check).
RANKS_CHECK = "ranks_joined"


def utc_timestamp(now: datetime) -> str:
    """2025-01-31T12:00:00Z"""
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def default_basename(now: datetime) -> str:
    """verify-20250131T120000Z: sorts by time, no characters a shell or a URL needs quoted."""
    return "verify-" + now.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")


# ------------------------------------------------------------------------------------------ the document


def check_status(check: Mapping[str, Any]) -> str:
    """pass / fail / skip, from status when given, else from passed and skipped."""
    status = check.get("status")
    if status in ("pass", "fail", "skip"):
        return str(status)
    if check.get("skipped"):
        return "skip"
    return "pass" if check.get("passed") else "fail"


def normalise_check(check: Mapping[str, Any]) -> dict[str, Any]:
    status = check_status(check)
    return {
        "name": str(check.get("name") or "unnamed"),
        "status": status,
        "passed": status == "pass",
        "skipped": status == "skip",
        "detail": str(check.get("detail") or ""),
        "data": dict(check.get("data") or {}),
    }


def rank_join_check(result: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The ranks_joined check from kimi_rank_join's registered result (ok, summary, problems, ranks, nccl);
    None when that task did not run, so a skipped rank check is left out of the report rather than shown."""
    if not result or result.get("skipped"):
        return None
    ok = bool(result.get("ok"))
    lines = [result.get("summary"), *(result.get("problems") or [])]
    return {
        "name": RANKS_CHECK,
        "status": "pass" if ok else "fail",
        "passed": ok,
        "skipped": False,
        "detail": "; ".join(str(line) for line in lines),
        "data": {"ranks": result.get("ranks"), "nccl": result.get("nccl")},
    }


def build_report(
    checks: Sequence[Mapping[str, Any]],
    loadtest: Mapping[str, Any] | None,
    *,
    thresholds: Mapping[str, Any] | None = None,
    inputs: Mapping[str, Any] | None = None,
    facts: Mapping[str, Any] | None = None,
    generated_at: str,
    started_at: str | None = None,
) -> dict[str, Any]:
    """The whole report. loadtest: {summary, records, breaches, sweep} as plugins/modules/kimi_vllm_bench.py
    returns them, or None when no load test ran. ok: no check failed and no threshold was breached."""
    normalised = [normalise_check(check) for check in checks]
    counts = {status: sum(1 for c in normalised if c["status"] == status) for status in ("pass", "fail", "skip")}
    load = None
    if loadtest:
        load = {
            "summary": dict(loadtest.get("summary") or {}),
            "records": [dict(record) for record in loadtest.get("records") or []],
            "breaches": [dict(breach) for breach in loadtest.get("breaches") or []],
            "sweep": [dict(entry) for entry in loadtest.get("sweep") or []],
            "thresholds": dict(thresholds or {}),
        }
    breaches = load["breaches"] if load else []
    return {
        "kind": REPORT_KIND,
        "version": REPORT_VERSION,
        "generated_at": generated_at,
        "started_at": started_at,
        "ok": counts["fail"] == 0 and not breaches,
        "checks_summary": {"passed": counts["pass"], "failed": counts["fail"], "skipped": counts["skip"]},
        "checks": normalised,
        "loadtest": load,
        "inputs": dict(inputs or {}),
        "facts": dict(facts or {}),
    }


def verdict(report: Mapping[str, Any]) -> str:
    """PASS, or FAIL with what failed: "FAIL (1 check failed, 2 thresholds breached)"."""
    if report["ok"]:
        return "PASS"
    failed = report["checks_summary"]["failed"]
    breaches = len(report["loadtest"]["breaches"]) if report["loadtest"] else 0
    parts = []
    if failed:
        parts.append(f"{failed} check{'s' if failed != 1 else ''} failed")
    if breaches:
        parts.append(f"{breaches} threshold{'s' if breaches != 1 else ''} breached")
    return f"FAIL ({', '.join(parts)})"


def report_json(report: Mapping[str, Any]) -> str:
    return kimi_report.report_json(report)


# ------------------------------------------------------------------------------------------ Markdown


def _cell(value: Any) -> str:
    text = " ".join(str(value).split())
    return text.replace("|", "\\|") or " "


def _figure(value: Any) -> str:
    return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def _markdown_checks(report: Mapping[str, Any]) -> list[str]:
    lines = ["## Checks", "", "| check | result | detail |", "|---|---|---|"]
    lines += [f"| {_cell(c['name'])} | {c['status']} | {_cell(c['detail'])} |" for c in report["checks"]]
    if not report["checks"]:
        lines.append("| (none run) | | |")
    return lines


def _run_line(summary: Mapping[str, Any]) -> str:
    """The run in words: prompts, concurrency, rate, lengths, outcome, duration."""
    return (
        f"{summary.get('num_prompts')} prompts of {summary.get('input_len')} tokens, {summary.get('output_len')} "
        f"output tokens each, at most {summary.get('max_concurrency')} in flight, request rate "
        f"{summary.get('request_rate')}: {summary.get('completed')} completed, {summary.get('failed')} failed, "
        f"in {_figure(summary.get('duration'))} s"
    )


def _throughput_line(summary: Mapping[str, Any]) -> str:
    goodput = summary.get("request_goodput")
    return (
        f"request_throughput {_figure(summary.get('request_throughput'))} req/s, output_throughput "
        f"{_figure(summary.get('output_throughput'))} tok/s, total_token_throughput "
        f"{_figure(summary.get('total_token_throughput'))} tok/s"
        + (
            f", request_goodput {_figure(goodput)} req/s ({_share(summary.get('goodput_share'))} of the prompts)"
            if goodput is not None
            else ""
        )
    )


def _share(value: Any) -> str:
    return "-" if not isinstance(value, (int, float)) else f"{value:.0%}"


def _markdown_loadtest(load: Mapping[str, Any], chart_name: str | None) -> list[str]:
    summary = load["summary"]
    if not summary:
        lines = ["## Load test (vllm bench serve)", "", "The benchmark did not produce a result."]
        return lines + _markdown_thresholds(load)
    lines = [
        "## Load test (vllm bench serve)",
        "",
        _run_line(summary) + ".",
        "",
        "| metric | " + " | ".join(STATS) + " |",
        "|---|" + "---|" * len(STATS),
    ]
    for key, label in METRICS:
        figures = summary.get(key) or {}
        lines.append(f"| {label} | " + " | ".join(_figure(figures.get(stat)) for stat in STATS) + " |")
    lines += ["", _throughput_line(summary) + "."]
    lines += _markdown_sweep(load)
    lines += _markdown_thresholds(load)
    lines += _markdown_errors(load)
    if chart_name:
        lines += ["", f"![TTFT and E2EL per request]({chart_name})"]
    return lines


def _markdown_sweep(load: Mapping[str, Any]) -> list[str]:
    if not load.get("sweep"):
        return []
    lines = [
        "",
        "### Request-rate sweep",
        "",
        "| request rate (req/s) | completed | failed | TTFT p99 (ms) | TPOT p99 (ms) | E2EL p99 (ms) | output tok/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for entry in load["sweep"]:
        summary = entry.get("summary") or {}
        p99 = [_figure((summary.get(key) or {}).get("p99")) for key in ("ttft_ms", "tpot_ms", "e2el_ms")]
        lines.append(
            f"| {_figure(entry.get('request_rate'))} | {_figure(summary.get('completed'))} | "
            f"{_figure(summary.get('failed'))} | "
            + " | ".join(p99)
            + f" | {_figure(summary.get('output_throughput'))} |"
        )
    return lines


def is_gate(key: str, value: Any) -> bool:
    """Limits of 0 or None are no gate; max_error_rate 0 is one (no error allowed)."""
    return value is not None and (key == "max_error_rate" or value != 0)


def _markdown_thresholds(load: Mapping[str, Any]) -> list[str]:
    gates = {key: value for key, value in load["thresholds"].items() if is_gate(key, value)}
    lines = ["", "### Thresholds", ""]
    if not gates and not load["breaches"]:
        return [*lines, "No thresholds set."]
    breached = {breach["figure"] for breach in load["breaches"]}
    lines += ["| threshold | limit | result |", "|---|---|---|"]
    for key, value in sorted(gates.items()):
        figure = GATE_FIGURES.get(key, key)
        lines.append(f"| {key} | {_figure(value)} | {'breached' if figure in breached else 'met'} |")
    lines += ["", *[f"- {_cell(breach['message'])}" for breach in load["breaches"]]] if load["breaches"] else []
    return lines


def _markdown_errors(load: Mapping[str, Any]) -> list[str]:
    failed = [record for record in load["records"] if not record.get("ok")]
    if not failed:
        return ["", "### Errors", "", "None."]
    examples: dict[str, dict[str, Any]] = {}
    for record in failed:
        examples.setdefault(str(record.get("error_kind") or "error"), record)
    counts = load["summary"].get("errors_by_kind") or {}
    lines = ["", "### Errors", "", "| kind | count | first (request, error) |", "|---|---|---|"]
    for kind, record in sorted(examples.items()):
        count = counts.get(kind, sum(1 for r in failed if (r.get("error_kind") or "error") == kind))
        lines.append(f"| {_cell(kind)} | {count} | #{record.get('index')}: {_cell(record.get('error') or '')} |")
    return lines


def render_markdown(report: Mapping[str, Any], chart_name: str | None = None) -> str:
    name = report["inputs"].get("served_model_name", "")
    lines = [
        f"# Verify report{': ' + name if name else ''}",
        "",
        f"Result: **{verdict(report)}**, generated {report['generated_at']}"
        + (f" (started {report['started_at']})" if report.get("started_at") else "")
        + ".",
        "",
    ]
    lines += _markdown_checks(report)
    if report["loadtest"]:
        lines += ["", *_markdown_loadtest(report["loadtest"], chart_name)]
    else:
        lines += ["", "## Load test", "", "Not run."]
    if report["facts"]:
        lines += ["", "## Cluster", "", "| fact | value |", "|---|---|"]
        lines += [f"| {_cell(key)} | {_cell(_fact_text(value))} |" for key, value in sorted(report["facts"].items())]
    return "\n".join(lines) + "\n"


def _fact_text(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


# ------------------------------------------------------------------------------------------ text table


def _clip(text: str, width: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."


def render_table(report: Mapping[str, Any], width: int = TABLE_WIDTH) -> list[str]:
    """Fixed-width lines for the end of the play: verdict, a row per check, the latency figures, breaches."""
    name = report["inputs"].get("served_model_name", "")
    lines = [f"verify{' ' + name if name else ''}: {verdict(report)}"]
    name_width = max([len("check")] + [len(check["name"]) for check in report["checks"]])
    lines.append(f"{'check':<{name_width}}  result  detail")
    for check in report["checks"]:
        detail = _clip(check["detail"], max(20, width - name_width - 10))
        lines.append(f"{check['name']:<{name_width}}  {check['status']:<6}  {detail}")
    load = report["loadtest"]
    if not load:
        return [*lines, "load test: not run"]
    summary = load["summary"]
    if not summary:
        lines.append("load test (vllm bench serve): no result")
    else:
        lines.append(_clip("load test (vllm bench serve): " + _run_line(summary), width))
        lines.append(f"{'metric':<12}" + "".join(f"{stat:>10}" for stat in STATS))
        for key, label in METRICS:
            figures = summary.get(key) or {}
            lines.append(f"{label:<12}" + "".join(f"{_figure(figures.get(stat)):>10}" for stat in STATS))
        lines.append(_clip(_throughput_line(summary), width))
        if summary.get("errors_by_kind"):
            kinds = ", ".join(f"{kind} x{count}" for kind, count in summary["errors_by_kind"].items())
            lines.append(_clip("errors: " + kinds, width))
    lines += [_clip(f"breach: {breach['message']}", width) for breach in load["breaches"]]
    return lines


# ------------------------------------------------------------------------------------------ files


def report_contents(report: Mapping[str, Any], basename: str, chart: bool = True) -> dict[str, bytes]:
    """File suffix to content. The chart is drawn only when a load test ran."""
    load = report["loadtest"]
    draw = chart and bool(load)
    chart_name = f"{basename}.svg" if draw else None
    document = {**report, "files": {"json": f"{basename}.json", "markdown": f"{basename}.md", "chart": chart_name}}
    contents = {
        ".json": report_json(document).encode(),
        ".md": render_markdown(report, chart_name).encode(),
    }
    if draw:
        name = str(report["inputs"].get("served_model_name", "")).strip()
        title = f"Verify load test: {name}" if name else "Verify load test"
        contents[".svg"] = latency_chart(load["records"], load["summary"], load["thresholds"], title)
    return contents


def write_report(
    report: Mapping[str, Any],
    directory: Path,
    basename: str,
    latest_basename: str | None = LATEST_BASENAME,
    chart: bool = True,
) -> dict[str, str]:
    """Write the dated files, then the latest copies; returns {json, markdown, chart, latest_json, ...} paths."""
    keys = {".json": "json", ".md": "markdown", ".svg": "chart"}
    contents = report_contents(report, basename, chart)
    # An older run's chart (and a PNG of the releases before the SVG chart) must not sit next to a report
    # without a load test.
    written = kimi_report.write_report_files(
        directory, basename, contents, latest_basename or None, suffixes_of_latest=(".svg", ".png")
    )
    paths = {keys[suffix]: str(path) for suffix, path in written.items() if suffix in keys}
    paths.update({f"latest_{keys[key[6:]]}": str(path) for key, path in written.items() if key.startswith("latest")})
    return paths
