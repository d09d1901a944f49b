"""The SVG latency chart, parsed back with ElementTree: bars per request, failure marks, the dashed p99 and limit
lines and their labels, the figures, folding of long runs, the no-data messages, escaping and determinism."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest
from ansible_collections.kimi.k2.plugins.module_utils.kimi_chart import (
    CHART_HEIGHT,
    CHART_WIDTH,
    E2E_COLOR,
    ERROR_COLOR,
    LABEL_STEP,
    LIMIT_COLOR,
    PLOT_BOTTOM,
    PLOT_COLUMNS,
    PLOT_LEFT,
    PLOT_RIGHT,
    PLOT_TOP,
    TTFT_COLOR,
    coordinate,
    format_number,
    label_positions,
    latency_chart,
    nice_ceiling,
    positive,
    xml_text,
)

SVG = "{http://www.w3.org/2000/svg}"


def parse(data: bytes) -> ET.Element:
    assert data.startswith(b'<?xml version="1.0" encoding="UTF-8"?>\n<svg ')
    root = ET.fromstring(data)
    assert root.tag == f"{SVG}svg"
    return root


def find(root: ET.Element, tag: str, css_class: str | None = None) -> list[ET.Element]:
    return [e for e in root.iter(f"{SVG}{tag}") if css_class is None or e.get("class") == css_class]


def text_of(element: ET.Element) -> str:
    return "".join(element.itertext())


def number(element: ET.Element, name: str) -> float:
    return float(element.get(name))


def record(index, ttft, e2e, ok=True):
    if not ok:
        return {"index": index, "ok": False, "error_kind": "HTTP 500"}
    return {"index": index, "ok": True, "ttft_ms": ttft, "e2el_ms": e2e}


SUMMARY = {
    "num_prompts": 6,
    "max_concurrency": 2,
    "output_len": 64,
    "completed": 5,
    "failed": 1,
    "ttft_ms": {"p50": 200.0, "p90": 280.0, "p99": 298.0},
    "tpot_ms": {"p50": 20.0, "p90": 25.0, "p99": 26.5},
    "e2el_ms": {"p50": 1500.0, "p90": 1900.0, "p99": 1990.0},
    "output_throughput": 96.0,
    "request_throughput": 1.25,
}
# sent in this order; listed out of order to show the chart sorts by index
RECORDS = [
    record(3, 300, 1500),
    record(0, 100, 1000),
    record(1, 200, 2000),
    record(2, 0, 0, ok=False),
    record(4, 150, 1200),
    record(5, 250, 1800),
]


def y_of(value: float, top: float) -> float:
    return PLOT_BOTTOM - (PLOT_BOTTOM - PLOT_TOP) * value / top


# ------------------------------------------------------------------------------------------ helpers


def test_xml_text_escapes_and_replaces_what_xml_cannot_carry():
    assert xml_text("a<b>&\"c\"'d'") == "a&lt;b&gt;&amp;&quot;c&quot;&apos;d&apos;"
    assert xml_text("bell\x07 nul\x00 tab\t") == "bell\ufffd nul\ufffd tab\t"
    assert xml_text("lone \udc80 surrogate") == "lone \ufffd surrogate"
    assert xml_text(12) == "12"


def test_coordinates_round_to_one_decimal():
    assert [coordinate(v) for v in (12.0, 3.14159, 296.66666, -0.04, 7, 0.25)] == [
        "12",
        "3.1",
        "296.7",
        "0",
        "7",
        "0.2",
    ]


def test_axis_helpers():
    assert nice_ceiling(9048) == (10000, 2000)
    assert nice_ceiling(3.2) == (4, 1)
    assert nice_ceiling(0) == (1.0, 0.25)
    assert [format_number(v) for v in (1234.4, 12.345, 0.5, 2.0, None)] == ["1234", "12.3", "0.5", "2", "-"]
    assert [positive(v) for v in (12, 0.5, 0, -3, None, "7", float("nan"), float("inf"), True)] == [
        12.0,
        0.5,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0,
    ]


def test_labels_stack_upwards_and_are_pushed_back_under_the_ceiling():
    # three lines close together near the bottom: each label 4 px above its line or LABEL_STEP above the last
    assert label_positions([400, 398, 397], floor=406, ceiling=50) == [396, 396 - LABEL_STEP, 396 - 2 * LABEL_STEP]
    # the lowest label never goes under the floor
    assert label_positions([409], floor=400, ceiling=50) == [400]
    # three lines at the very top: pushed down from the ceiling, still LABEL_STEP apart
    assert label_positions([72, 71, 70], floor=406, ceiling=60) == [60 + 2 * LABEL_STEP, 60 + LABEL_STEP, 60]


# ------------------------------------------------------------------------------------------ the chart


def test_chart_has_a_bar_pair_per_request_in_send_order_and_marks_the_failed_one():
    root = parse(latency_chart(RECORDS, SUMMARY))
    assert (root.get("width"), root.get("height")) == (str(CHART_WIDTH), str(CHART_HEIGHT))
    assert root.get("viewBox") == f"0 0 {CHART_WIDTH} {CHART_HEIGHT}" and root.get("font-family") == "sans-serif"
    columns = find(root, "g", "column")
    assert len(columns) == 6
    e2e, ttft = find(root, "rect", "e2e"), find(root, "rect", "ttft")
    assert len(e2e) == len(ttft) == 5  # one pair per successful request
    assert all(r.get("fill") == E2E_COLOR for r in e2e) and all(r.get("fill") == TTFT_COLOR for r in ttft)
    width = PLOT_COLUMNS / 6
    xs = [number(column.find(f"{SVG}rect"), "x") for column in columns]
    assert xs == [round(PLOT_LEFT + 1 + i * width, 1) for i in range(6)]
    assert [text_of(column.find(f"{SVG}title")) for column in columns] == [
        "request 1: TTFT 100 ms, E2EL 1000 ms",
        "request 2: TTFT 200 ms, E2EL 2000 ms",
        "request 3: failed",
        "request 4: TTFT 300 ms, E2EL 1500 ms",
        "request 5: TTFT 150 ms, E2EL 1200 ms",
        "request 6: TTFT 250 ms, E2EL 1800 ms",
    ]
    # the scale tops at 2000: request 2's E2E bar reaches the top, request 1's half way, TTFT from the axis up
    first_e2e, second_e2e = (column.find(f"{SVG}rect[@class='e2e']") for column in columns[:2])
    assert number(second_e2e, "y") == PLOT_TOP and number(second_e2e, "height") == PLOT_BOTTOM - PLOT_TOP
    assert number(first_e2e, "y") == y_of(1000, 2000) and number(first_e2e, "height") == PLOT_BOTTOM - y_of(1000, 2000)
    first_ttft = columns[0].find(f"{SVG}rect[@class='ttft']")
    assert number(first_ttft, "y") == y_of(100, 2000) and number(first_ttft, "y") + number(first_ttft, "height") == 410
    assert number(first_ttft, "width") == number(first_e2e, "width") == round(width - 1, 1)
    # the failed request: a red mark under the axis and a light red column, no bars
    errors = find(root, "rect", "error")
    assert len(errors) == 1 and errors[0].get("fill") == ERROR_COLOR
    assert number(errors[0], "x") == xs[2] and number(errors[0], "y") > PLOT_BOTTOM
    assert [e.get("class") for e in columns[2].iter(f"{SVG}rect")] == ["failed-column", "error"]
    # the x axis runs from request 1 to request 6; the y axis in ms with nice ticks
    texts = [text_of(t) for t in find(root, "text")]
    assert "request, in send order" in texts and "ms" in texts
    assert {"0", "500", "1000", "1500", "2000"} <= set(texts)
    assert "E2EL" in texts and "TTFT" in texts and "failed request" in texts  # the legend


def test_dashed_lines_for_the_p99s_and_the_limits_with_their_labels():
    thresholds = {"ttft_p99_ms": 250, "e2el_p99_ms": 2200, "tpot_p99_ms": 30, "max_error_rate": 0.1}
    root = parse(latency_chart(RECORDS, SUMMARY, thresholds))
    lines = find(root, "line", "mark")
    labels = find(root, "text", "mark-label")
    assert len(lines) == len(labels) == 4
    assert all(line.get("stroke-dasharray") for line in lines)
    top = nice_ceiling(2200)[0]  # the highest limit is above every bar: the scale holds it
    assert top == 2500
    by_label = {text_of(label): (line, label) for line, label in zip(lines, labels, strict=True)}
    assert set(by_label) == {"E2EL p99 1990 ms", "TTFT p99 298 ms", "E2EL limit 2200 ms", "TTFT limit 250 ms"}
    for text, value in (("E2EL p99 1990 ms", 1990), ("TTFT p99 298 ms", 298), ("TTFT limit 250 ms", 250)):
        line, _ = by_label[text]
        assert number(line, "y1") == number(line, "y2") == round(y_of(value, top), 1)
        assert number(line, "x1") == PLOT_LEFT + 1 and number(line, "x2") == PLOT_RIGHT
    assert by_label["TTFT limit 250 ms"][0].get("stroke") == LIMIT_COLOR
    assert by_label["TTFT p99 298 ms"][0].get("stroke") == TTFT_COLOR
    # TTFT limit 250 and TTFT p99 298 are 6.5 px apart: their labels are stacked, not drawn over each other
    low, high = (number(by_label[t][1], "y") for t in ("TTFT limit 250 ms", "TTFT p99 298 ms"))
    assert low - high >= LABEL_STEP
    assert low < number(by_label["TTFT limit 250 ms"][0], "y1")  # above its line
    # no thresholds: only the two p99 lines
    plain = parse(latency_chart(RECORDS, SUMMARY, {"ttft_p99_ms": 0, "e2el_p99_ms": None}))
    assert sorted(text_of(t) for t in find(plain, "text", "mark-label")) == ["E2EL p99 1990 ms", "TTFT p99 298 ms"]


def test_the_figures_and_the_throughput_are_written_under_the_chart():
    root = parse(latency_chart(RECORDS, SUMMARY, title="Verify load test: kimi-k2"))
    rows = [[span.text for span in row.iter(f"{SVG}tspan")] for row in find(root, "text", "figures")]
    assert rows == [
        ["TTFT ms", "p50", "200", "p90", "280", "p99", "298"],
        ["TPOT ms", "p50", "20", "p90", "25", "p99", "26.5"],
        ["E2EL ms", "p50", "1500", "p90", "1900", "p99", "1990"],
    ]
    assert all(number(row, "y") > PLOT_BOTTOM for row in find(root, "text", "figures"))
    (throughput,) = find(root, "text", "throughput")
    assert text_of(throughput) == "output_throughput 96 tok/s, request_throughput 1.25 req/s"
    (title,) = find(root, "text", "title")
    assert text_of(title) == "Verify load test: kimi-k2" == root.find(f"{SVG}title").text
    (subtitle,) = find(root, "text", "subtitle")
    assert text_of(subtitle) == "6 prompts, max concurrency 2, output 64 tokens: 5 completed, 1 failed"
    assert not find(root, "text", "message")


def test_more_requests_than_px_are_folded_into_at_most_the_plot_width():
    many = [record(i, 10.0 + i % 7, 100.0 + i % 50) for i in range(2000)]
    many[1000] = record(1000, 0, 0, ok=False)
    root = parse(latency_chart(many, {**SUMMARY, "num_prompts": 2000}))
    columns = find(root, "g", "column")
    assert len(columns) == PLOT_COLUMNS < 2000
    assert len(find(root, "rect", "e2e")) == len(find(root, "rect", "ttft")) == PLOT_COLUMNS
    rects = find(root, "rect", "e2e")
    assert all(number(r, "x") > PLOT_LEFT and number(r, "x") + number(r, "width") <= PLOT_RIGHT + 0.1 for r in rects)
    assert all(number(r, "width") > 0 for r in rects)
    # the group holding request 1001 shows its largest values, and that one request in it failed
    assert len(find(root, "rect", "error")) == 1
    failed = next(c for c in columns if c.find(f"{SVG}rect[@class='error']") is not None)
    assert re.fullmatch(r"requests \d+-\d+: largest TTFT [\d.]+ ms, largest E2EL [\d.]+ ms, 1 failed", text_of(failed))
    assert not find(root, "rect", "failed-column")  # the group has E2E from its other requests
    assert "2000" in [text_of(t) for t in find(root, "text")]  # the x axis ends at the last request


@pytest.mark.parametrize(
    ("records", "message"),
    [([], "No request was sent"), ([record(0, 0, 0, ok=False)], "No successful request")],
)
def test_no_data_messages(records, message):
    root = parse(latency_chart(records, {"num_prompts": len(records)}))
    (shown,) = find(root, "text", "message")
    assert text_of(shown) == message and shown.get("fill") == ERROR_COLOR
    assert not find(root, "rect", "e2e") and not find(root, "rect", "ttft")
    assert len(find(root, "rect", "failed-column")) == len(records)
    assert [row[0].text for row in find(root, "text", "figures")] == ["TTFT ms", "TPOT ms", "E2EL ms"]
    (subtitle,) = find(root, "text", "subtitle")  # counts the summary lacks come from the records
    assert text_of(subtitle).startswith(f"{len(records)} prompt{'' if len(records) == 1 else 's'}, max concurrency -")
    assert text_of(subtitle).endswith(f": 0 completed, {len(records)} failed")


def test_the_title_is_escaped():
    title = "kimi <b>&</b> \"quoted\" 'k2'\x01"
    data = latency_chart(RECORDS, SUMMARY, title=title)
    assert b"<b>" not in data and b"kimi &lt;b&gt;&amp;&lt;/b&gt; &quot;quoted&quot; &apos;k2&apos;\xef\xbf\xbd" in data
    root = parse(data)
    expected = "kimi <b>&</b> \"quoted\" 'k2'\ufffd"
    assert root.find(f"{SVG}title").text == expected
    assert text_of(find(root, "text", "title")[0]) == expected


def test_the_chart_is_deterministic_and_depends_on_the_data():
    records = [record(i, 50.0 + i / 3, 500.0 + 10 * i / 7) for i in range(30)]
    first = latency_chart(records, SUMMARY, {"ttft_p99_ms": 80})
    assert first == latency_chart(records, SUMMARY, {"ttft_p99_ms": 80})
    assert first != latency_chart(records[:-1], SUMMARY, {"ttft_p99_ms": 80})
    assert first != latency_chart(records, SUMMARY, {"ttft_p99_ms": 90})
    # every coordinate is rounded: no number with more than one decimal
    numbers = re.findall(rb' (?:x|y|x1|x2|y1|y2|width|height)="([^"]*)"', first)
    assert numbers and all(re.fullmatch(rb"-?\d+(\.\d)?", value) for value in numbers)
