"""A drift report as people and programs read it: the short table (one row per host, per replica when there are
several), the Markdown report and the JSON file.

Separate from kimi_drift_rules because it reads only the finished report (plain data, the dict build_report
returns) and decides nothing: changing how drift looks never touches what counts as drift. It imports neither
kimi_drift_record nor kimi_drift_rules.
"""

from __future__ import annotations

import re
from typing import Any

from . import kimi_report

TABLE_COLUMNS = (
    ("host", None),
    ("rank", None),
    ("edited", ("edited",)),
    ("converge", ("converge", "converge_failed")),
    ("versions", ("version",)),
    ("holds", ("hold",)),
    ("parity", ("parity",)),
    ("checkpoint", ("checkpoint",)),
    ("service", ("service",)),
    ("health", ("health",)),
    ("verdict", None),
)
# The table's column naming each host's replica, after `host`; only when the report has several groups.
REPLICA_COLUMN = ("replica", None)


def grouped(report: dict[str, Any]) -> bool:
    """Whether the report shows its hosts per replica: only with several groups, so that a one-replica
    inventory's table and Markdown stay as they were before replicas."""
    return len(report.get("replicas") or []) > 1


def replica_label(name: str | None) -> str:
    return "no replica" if name is None else name


def _columns(report: dict[str, Any]) -> tuple[tuple[str, tuple[str, ...] | None], ...]:
    if not grouped(report):
        return TABLE_COLUMNS
    return (TABLE_COLUMNS[0], REPLICA_COLUMN, *TABLE_COLUMNS[1:])


def _cell(row: dict[str, Any], column: str, kinds: tuple[str, ...] | None) -> str:
    if column == "host":
        return row["host"]
    if column == "replica":
        return replica_label(row.get("replica"))
    if column == "rank":
        return "-" if row["rank"] is None else str(row["rank"])
    if column == "verdict":
        return "DRIFT" if row["drifted"] else "ok"
    count = sum(row["counts"].get(kind, 0) for kind in kinds or ())
    if column in ("checkpoint", "service", "health"):
        state = row["states"].get(column, "-")
        return f"{state} !" if count else state
    return f"{count} !" if count else "ok"


def render_table(report: dict[str, Any]) -> str:
    """The short table the play prints: a row per host, a column per check, `!` where it drifted (and a
    column naming each host's replica when there are several)."""
    columns = _columns(report)
    header = [name for name, _ in columns]
    lines = [header]
    for row in report["hosts"]:
        lines.append([_cell(row, name, kinds) for name, kinds in columns])
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip() for line in lines]
    text.insert(1, "  ".join("-" * width for width in widths))
    summary = report["summary"]
    cluster = report["cluster_findings"]
    if report["drifted"]:
        verdict = f"DRIFT: {summary['findings']} finding(s)"
        if summary["hosts_drifted"]:
            verdict += f" on {', '.join(summary['hosts_drifted'])}"
        if grouped(report) and summary.get("replicas_drifted"):
            verdict += f" (replica {', '.join(summary['replicas_drifted'])})"
        if cluster:
            verdict += f"; {len(cluster)} about the cluster or the converge run"
    else:
        verdict = f"no drift on {summary['hosts']} host(s)"
        if grouped(report):
            verdict += f" in {summary['replicas']} replica(s)"
    if summary.get("ignored"):
        verdict += f" ({summary['ignored']} ignored by drift_ignore)"
    return "\n".join([verdict, "", *text])


def _fence(text: str) -> str:
    """A Markdown code fence longer than any run of backticks inside the text."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def _finding_markdown(finding: dict[str, Any]) -> list[str]:
    lines = [f"- **{finding['kind']}**: {finding['title']}"]
    if finding.get("detail"):
        lines.append(f"  - {finding['detail']}".replace("\n", "\n    "))
    if finding.get("fix"):
        lines.append(f"  - fix: `{finding['fix']}`")
    if finding.get("diff"):
        fence = _fence(finding["diff"])
        language = "diff" if finding["diff"].startswith("---") else "text"
        lines += ["", f"  {fence}{language}"]
        lines += [f"  {line}" if line else "" for line in finding["diff"].splitlines()]
        lines += [f"  {fence}", ""]
    return lines


def _host_markdown(row: dict[str, Any], level: str) -> list[str]:
    """A host's findings under its own heading; nothing for a host without any."""
    if not row["findings"]:
        return []
    rank = "" if row["rank"] is None else f" (node rank {row['rank']})"
    lines = [f"{level} {row['host']}{rank}", ""]
    for finding in row["findings"]:
        lines += _finding_markdown(finding)
    lines.append("")
    return lines


def _replica_markdown(group: dict[str, Any], host_rows: list[dict[str, Any]]) -> list[str]:
    """A replica's heading with its verdict, hosts and counts, then its hosts' findings one level below."""
    verdict = "DRIFT" if group["drifted"] else "no drift"
    heading = "In no replica" if group["name"] is None else f"Replica {group['name']}"
    facts = f"hosts {', '.join(group['hosts'])}"
    if group["drifted"]:
        facts += f"; {group['findings']} finding(s) on {', '.join(group['hosts_drifted'])}"
    lines = [f"## {heading}: {verdict}", "", facts, ""]
    for row in host_rows:
        if row["host"] in group["hosts"]:
            lines += _host_markdown(row, "###")
    return lines


def render_markdown(report: dict[str, Any]) -> str:
    """The report for people: the verdict, the table, then every finding per host with its diff and fix
    (under a heading per replica, with its verdict, when there are several)."""
    context = report.get("context") or {}
    title = "drift: DRIFT" if report["drifted"] else "drift: no drift"
    lines = [f"# Kimi K2 cluster {title}", ""]
    facts = [f"generated {report.get('generated_at') or '-'}"]
    if context.get("inventory"):
        facts.append(f"inventory {', '.join(context['inventory'])}")
    converge = report.get("converge") or {}
    if converge.get("ran"):
        facts.append(f"check-mode converge exit {converge.get('rc')}, {converge.get('changes', 0)} change(s)")
    lines += ["; ".join(facts), "", "```text", render_table(report), "```", ""]
    if report["cluster_findings"]:
        lines += ["## Cluster and converge run", ""]
        for finding in report["cluster_findings"]:
            lines += _finding_markdown(finding)
        lines.append("")
    if grouped(report):
        for group in report["replicas"]:
            lines += _replica_markdown(group, report["hosts"])
    else:
        for row in report["hosts"]:
            lines += _host_markdown(row, "##")
    if report["notes"]:
        lines += ["## Notes (not drift)", ""]
        lines += [f"- {note}" for note in report["notes"]]
        lines.append("")
    if report["ignored"]:
        lines += ["## Ignored (drift_ignore)", ""]
        lines += [f"- {f['host'] or 'cluster'}: {f['kind']}: {f['title']}" for f in report["ignored"]]
        lines.append("")
    while lines and lines[-1] == "":
        lines.pop()
    return "\n".join(lines) + "\n"


def report_json(report: dict[str, Any]) -> str:
    return kimi_report.report_json(report)
