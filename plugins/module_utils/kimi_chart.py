"""The verify phase's latency chart as SVG, written by hand from a string template.

Why by hand: the report is written on the controller, which may have no plotting library (and the collection
asks for none), and SVG is text, so the standard library is enough. The output is deterministic - elements in a
fixed order, coordinates rounded to one decimal - so the same load test gives the same bytes and an unchanged
report does not look changed. A browser opens it as it is, and GitHub renders it where the Markdown report
links it.

Every piece of text goes through xml_text (the title comes from user input); characters XML cannot carry are
replaced.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

CHART_WIDTH, CHART_HEIGHT = 960, 600
PLOT_LEFT, PLOT_RIGHT, PLOT_TOP, PLOT_BOTTOM = 96, 930, 70, 410
PLOT_COLUMNS = PLOT_RIGHT - PLOT_LEFT - 1  # the most bars drawn: one per px of the plot's width

GRID = "#e1e1e1"
AXIS = "#5a5a5a"
E2E_COLOR = "#96b9eb"
TTFT_COLOR = "#194ba0"
ERROR_COLOR = "#d72828"
ERROR_BACKGROUND = "#fad7d7"
LIMIT_COLOR = "#d72828"

FONT_SIZE = 13
CHAR_WIDTH = 0.6 * FONT_SIZE  # a sans-serif character's width, on average: for laying out the legend
LABEL_STEP = 15  # px between stacked labels of the dashed lines

SVG_TEMPLATE = """<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" \
font-family="sans-serif" font-size="{font_size}" role="img">
<title>{title}</title>
<rect width="{width}" height="{height}" fill="#ffffff"/>
{body}
</svg>
"""

_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


# ------------------------------------------------------------------------------------------ SVG text


def xml_text(text: object) -> str:
    """Text safe in an XML element or a double-quoted attribute: & < > " ' escaped, and characters XML 1.0
    cannot carry (control characters, lone surrogates) replaced by U+FFFD."""
    cleaned = _NOT_XML.sub("\ufffd", str(text))
    return (
        cleaned.replace("&", "&amp;")
        .replace("<", "&lt;")
        .replace(">", "&gt;")
        .replace('"', "&quot;")
        .replace("'", "&apos;")
    )


def coordinate(value: float) -> str:
    """A coordinate rounded to one decimal, without a trailing .0: 12.0 -> 12, 3.14159 -> 3.1."""
    text = f"{round(value, 1):.1f}".removesuffix(".0")
    return "0" if text == "-0" else text


def _attribute(value: object) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return coordinate(value)
    return xml_text(value)


def element(name: str, attributes: Mapping[str, object], text: str | None = None, children: Iterable[str] = ()) -> str:
    """One element: attributes in the order given, then the escaped text, then children (markup already)."""
    attrs = "".join(f' {key}="{_attribute(value)}"' for key, value in attributes.items())
    inner = (xml_text(text) if text is not None else "") + "".join(children)
    return f"<{name}{attrs}>{inner}</{name}>" if inner else f"<{name}{attrs}/>"


def group(attributes: Mapping[str, object], children: Iterable[str]) -> str:
    return element("g", attributes, children=["\n", *(f"{child}\n" for child in children)])


# ------------------------------------------------------------------------------------------ numbers


def nice_ceiling(value: float) -> tuple[float, float]:
    """(top, step) for an axis from 0 that holds value in 4 to 5 steps of 1, 2 or 5 x 10^k."""
    if value <= 0:
        return 1.0, 0.25
    raw_step = value / 5
    magnitude = 10 ** math.floor(math.log10(raw_step))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw_step)
    return step * math.ceil(value / step - 1e-9), step


def format_number(value: float | None) -> str:
    """Short axis/label text: 1234 -> 1234, 12.345 -> 12.3, 0.5 -> 0.5."""
    if value is None:
        return "-"
    if abs(value) >= 100 or value == int(value):
        return str(round(value))
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}".rstrip("0").rstrip(".")


def positive(value: Any) -> float:
    """value as a float when it is a finite number above 0, else 0.0 (missing, None, text, NaN, inf)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0.0
    number = float(value)
    return number if math.isfinite(number) and number > 0 else 0.0


# ------------------------------------------------------------------------------------------ the chart


def _columns(records: Sequence[Mapping[str, Any]], width: int) -> list[dict[str, Any]]:
    """One bar per request in send order; when there are more requests than px, a bar per group showing
    the group's largest E2E and TTFT, red when any request in it failed. first/last: 1-based positions."""
    count = len(records)
    groups = max(1, min(count, width))
    columns = []
    for index in range(groups):
        start, end = index * count // groups, (index + 1) * count // groups
        members = records[start:end]
        ok = [r for r in members if r.get("ok")]
        columns.append(
            {
                "e2e": max((positive(r.get("e2el_ms")) for r in ok), default=0.0),
                "ttft": max((positive(r.get("ttft_ms")) for r in ok), default=0.0),
                "error": len(ok) < len(members),
                "failed": len(members) - len(ok),
                "first": start + 1,
                "last": end,
            }
        )
    return columns


def _y_of(value: float, top: float) -> float:
    return PLOT_BOTTOM - (PLOT_BOTTOM - PLOT_TOP) * min(value, top) / top


def _text(x: float, y: float, text: str, css_class: str | None = None, **attributes: object) -> str:
    """A text element with its baseline starting at (x, y); keyword attributes with _ for - (text_anchor=)."""
    head: dict[str, object] = {"class": css_class} if css_class else {}
    extra = {key.replace("_", "-"): value for key, value in attributes.items()}
    return element("text", {**head, "x": x, "y": y, **extra}, text)


def _axes(top: float, step: float) -> str:
    parts = []
    for tick in range(round(top / step) + 1):
        value = tick * step
        y = _y_of(value, top)
        parts.append(element("line", {"x1": PLOT_LEFT + 1, "x2": PLOT_RIGHT, "y1": y, "y2": y, "stroke": GRID}))
        parts.append(_text(PLOT_LEFT - 8, y + 4, format_number(value), text_anchor="end", fill=AXIS))
    parts.append(element("line", {"x1": PLOT_LEFT, "x2": PLOT_LEFT, "y1": PLOT_TOP, "y2": PLOT_BOTTOM, "stroke": AXIS}))
    parts.append(
        element("line", {"x1": PLOT_LEFT, "x2": PLOT_RIGHT, "y1": PLOT_BOTTOM, "y2": PLOT_BOTTOM, "stroke": AXIS})
    )
    parts.append(_text(PLOT_LEFT - 8, PLOT_TOP - 14, "ms", text_anchor="end", fill=AXIS))
    return group({"class": "axes"}, parts)


def _column_title(column: Mapping[str, Any]) -> str:
    """The tooltip of a bar: which request(s), and their figures."""
    ttft, e2e = format_number(column["ttft"]), format_number(column["e2e"])
    if column["first"] == column["last"]:
        failed = column["error"]
        return f"request {column['first']}: " + ("failed" if failed else f"TTFT {ttft} ms, E2EL {e2e} ms")
    text = f"requests {column['first']}-{column['last']}: largest TTFT {ttft} ms, largest E2EL {e2e} ms"
    return text + (f", {column['failed']} failed" if column["failed"] else "")


def _rect(css_class: str, x: float, y: float, width: float, height: float, fill: str) -> str:
    return element("rect", {"class": css_class, "x": x, "y": y, "width": width, "height": height, "fill": fill})


def _bars(columns: list[dict[str, Any]], top: float) -> str:
    """Per column: a light red background when it failed with no E2E, the E2E bar, the TTFT bar over it, and a
    red mark under the axis when a request in it failed; each column in a group with a tooltip."""
    width = PLOT_COLUMNS / len(columns)
    gap = 1 if width >= 4 else 0
    parts = []
    for index, column in enumerate(columns):
        left = PLOT_LEFT + 1 + index * width
        children = [element("title", {}, _column_title(column))]
        if column["error"] and not column["e2e"]:
            children.append(
                _rect("failed-column", left, PLOT_TOP, width - gap, PLOT_BOTTOM - PLOT_TOP, ERROR_BACKGROUND)
            )
        for key, color in (("e2e", E2E_COLOR), ("ttft", TTFT_COLOR)):
            if column[key]:
                y = _y_of(column[key], top)
                children.append(_rect(key, left, y, width - gap, PLOT_BOTTOM - y, color))
        if column["error"]:
            children.append(_rect("error", left, PLOT_BOTTOM + 2, width - gap, 5, ERROR_COLOR))
        parts.append(element("g", {"class": "column"}, children=children))
    return group({"class": "bars", "shape-rendering": "crispEdges"}, parts)


def label_positions(ys: Sequence[float], floor: float, ceiling: float, step: float = LABEL_STEP) -> list[float]:
    """Baselines for labels of lines at ys (sorted from the lowest line up, i.e. decreasing y): each just above
    its line, at least step apart, none below floor; if that pushes the top one above ceiling, they are
    pushed back down, keeping the spacing."""
    positions: list[float] = []
    lowest_allowed = floor
    for y in ys:
        position = min(y - 4, lowest_allowed)
        positions.append(position)
        lowest_allowed = position - step
    highest_allowed = ceiling
    for index in range(len(positions) - 1, -1, -1):
        positions[index] = max(positions[index], highest_allowed)
        highest_allowed = positions[index] + step
    return positions


def _marks(marks: list[tuple[str, float, str]], top: float) -> str:
    """Dashed horizontal lines (p99s, limits), each labelled at the right end with a white halo; the labels are
    stacked so close values stay readable."""
    ordered = sorted(marks, key=lambda mark: mark[1])
    ys = [_y_of(value, top) for _, value, _ in ordered]
    positions = label_positions(ys, PLOT_BOTTOM - 4, PLOT_TOP - 4 - LABEL_STEP)
    parts = []
    for (label, value, color), y, text_y in zip(ordered, ys, positions, strict=True):
        line = {"x1": PLOT_LEFT + 1, "x2": PLOT_RIGHT, "y1": y, "y2": y, "stroke": color, "stroke-dasharray": "6 6"}
        parts.append(element("line", {"class": "mark", **line}))
        parts.append(
            _text(
                PLOT_RIGHT,
                text_y,
                f"{label} {format_number(value)} ms",
                "mark-label",
                text_anchor="end",
                fill=color,
                font_size=12,
                stroke="#ffffff",
                stroke_width=4,
                paint_order="stroke",
            )
        )
    return group({"class": "marks"}, parts)


def _legend(y: float) -> str:
    parts = []
    x: float = PLOT_LEFT
    for label, color in (("E2EL", E2E_COLOR), ("TTFT", TTFT_COLOR), ("failed request", ERROR_COLOR)):
        parts.append(element("rect", {"x": x, "y": y, "width": 14, "height": 14, "fill": color}))
        parts.append(_text(x + 20, y + 12, label))
        x += 20 + len(label) * CHAR_WIDTH + 24
    return group({"class": "legend"}, parts)


def figure_rows(summary: Mapping[str, Any]) -> list[list[str]]:
    """[label, p50, value, p90, value, p99, value] for TTFT, TPOT and E2EL (vLLM's names)."""
    rows = []
    for key, label in (("ttft_ms", "TTFT ms"), ("tpot_ms", "TPOT ms"), ("e2el_ms", "E2EL ms")):
        figures = summary.get(key) or {}
        row = [label]
        for p in (50, 90, 99):
            row += [f"p{p}", format_number(figures.get(f"p{p}"))]
        rows.append(row)
    return rows


def throughput_line(summary: Mapping[str, Any]) -> str:
    return (
        f"output_throughput {format_number(summary.get('output_throughput'))} tok/s, "
        f"request_throughput {format_number(summary.get('request_throughput'))} req/s"
    )


def _figures(summary: Mapping[str, Any], y: float) -> str:
    """A row per metric, its p50/p90/p99 in columns (labels left-aligned, values right-aligned), then
    the throughput."""
    parts = []
    for number, row in enumerate(figure_rows(summary)):
        spans = [element("tspan", {"x": PLOT_LEFT}, row[0])]
        for column in range(3):
            left = PLOT_LEFT + 90 + column * 150
            spans.append(element("tspan", {"x": left, "fill": AXIS}, row[1 + 2 * column]))
            spans.append(element("tspan", {"x": left + 100, "text-anchor": "end"}, row[2 + 2 * column]))
        parts.append(element("text", {"class": "figures", "y": y + number * 24}, children=spans))
    parts.append(_text(PLOT_LEFT, y + 3 * 24, throughput_line(summary), "throughput"))
    return group({"class": "figures"}, parts)


def _subtitle(records: Sequence[Mapping[str, Any]], summary: Mapping[str, Any]) -> str:
    """The run in one line; counts the summary lacks are taken from the records."""
    prompts = summary.get("num_prompts", len(records))
    completed = summary.get("completed", sum(1 for r in records if r.get("ok")))
    failed = summary.get("failed", sum(1 for r in records if not r.get("ok")))
    return (
        f"{prompts} prompt{'' if prompts == 1 else 's'}, max concurrency {summary.get('max_concurrency', '-')}, "
        f"output {summary.get('output_len', '-')} tokens: {completed} completed, {failed} failed"
    )


def _mark_values(summary: Mapping[str, Any], thresholds: Mapping[str, Any]) -> list[tuple[str, float, str]]:
    """The dashed lines to draw: (label, ms, colour) for each p99 and limit that is set and above 0."""
    candidates = (
        ("E2EL p99", (summary.get("e2el_ms") or {}).get("p99"), AXIS),
        ("TTFT p99", (summary.get("ttft_ms") or {}).get("p99"), TTFT_COLOR),
        ("E2EL limit", thresholds.get("e2el_p99_ms"), LIMIT_COLOR),
        ("TTFT limit", thresholds.get("ttft_p99_ms"), LIMIT_COLOR),
    )
    return [(label, positive(value), color) for label, value, color in candidates if positive(value)]


def latency_chart(
    records: Sequence[Mapping[str, Any]],
    summary: Mapping[str, Any],
    thresholds: Mapping[str, Any] | None = None,
    title: str = "Verify load test",
) -> bytes:
    """UTF-8 SVG: per-request E2EL (light) and TTFT (dark) bars in send order, failed requests marked red under
    the axis, dashed p99 lines and the TTFT/E2EL limits, a legend, and the p50/p90/p99 figures underneath."""
    title = " ".join(str(title).split())
    ordered = sorted(records, key=lambda record: record.get("index", 0))
    marks = _mark_values(summary, thresholds or {})
    highest = max([positive(r.get("e2el_ms")) for r in ordered] + [mark[1] for mark in marks] + [0.0])
    top, step = nice_ceiling(highest)
    parts = [
        _text(PLOT_LEFT, 28, title, "title", font_size=16, font_weight="bold"),
        _text(PLOT_LEFT, 50, _subtitle(ordered, summary), "subtitle", fill=AXIS),
        _axes(top, step),
    ]
    if ordered:
        parts.append(_bars(_columns(ordered, PLOT_COLUMNS), top))
        parts.append(_marks(marks, top))
        parts.append(_text(PLOT_LEFT, PLOT_BOTTOM + 22, "1", fill=AXIS))
        parts.append(_text(PLOT_RIGHT, PLOT_BOTTOM + 22, str(len(ordered)), text_anchor="end", fill=AXIS))
    if not any(record.get("ok") for record in ordered):
        message = "No successful request" if ordered else "No request was sent"
        middle = ((PLOT_LEFT + PLOT_RIGHT) / 2, (PLOT_TOP + PLOT_BOTTOM) / 2)
        parts.append(_text(*middle, message, "message", text_anchor="middle", fill=ERROR_COLOR, font_size=18))
    parts.append(_text((PLOT_LEFT + PLOT_RIGHT) / 2, PLOT_BOTTOM + 22, "request, in send order", text_anchor="middle"))
    parts.append(_legend(PLOT_BOTTOM + 40))
    parts.append(_figures(summary, PLOT_BOTTOM + 92))
    svg = SVG_TEMPLATE.format(
        width=CHART_WIDTH,
        height=CHART_HEIGHT,
        font_size=FONT_SIZE,
        title=xml_text(title),
        body="\n".join(parts),
    )
    return svg.encode("utf-8")
