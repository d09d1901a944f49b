"""A tiny PNG writer (RGB, 8 bits per channel, zlib + struct) with a 5x7 bitmap font, and the verify phase's
latency chart. Pure Python and deterministic (same input, same bytes): the controller may have no plotting
library, and a report that does not change should not look changed.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
Color = tuple[int, int, int]

WHITE: Color = (255, 255, 255)
BLACK: Color = (0, 0, 0)
GRID: Color = (225, 225, 225)
AXIS: Color = (90, 90, 90)
E2E_COLOR: Color = (150, 185, 235)
TTFT_COLOR: Color = (25, 75, 160)
ERROR_COLOR: Color = (215, 40, 40)
LIMIT_COLOR: Color = (215, 40, 40)

# 5 x 7 glyphs, one string per glyph: seven rows of five cells, "#" lit. Lower case is drawn as upper case;
# anything else missing is drawn as "?".
GLYPH_WIDTH, GLYPH_HEIGHT = 5, 7
FONT: dict[str, str] = {
    " ": "..... ..... ..... ..... ..... ..... .....",
    "0": ".###. #...# #..## #.#.# ##..# #...# .###.",
    "1": "..#.. .##.. ..#.. ..#.. ..#.. ..#.. .###.",
    "2": ".###. #...# ....# ...#. ..#.. .#... #####",
    "3": "##### ...#. ..#.. ...#. ....# #...# .###.",
    "4": "...#. ..##. .#.#. #..#. ##### ...#. ...#.",
    "5": "##### #.... ####. ....# ....# #...# .###.",
    "6": "..##. .#... #.... ####. #...# #...# .###.",
    "7": "##### ....# ...#. ..#.. .#... .#... .#...",
    "8": ".###. #...# #...# .###. #...# #...# .###.",
    "9": ".###. #...# #...# .#### ....# ...#. .##..",
    "A": ".###. #...# #...# ##### #...# #...# #...#",
    "B": "####. #...# #...# ####. #...# #...# ####.",
    "C": ".###. #...# #.... #.... #.... #...# .###.",
    "D": "###.. #..#. #...# #...# #...# #..#. ###..",
    "E": "##### #.... #.... ####. #.... #.... #####",
    "F": "##### #.... #.... ####. #.... #.... #....",
    "G": ".###. #...# #.... #.### #...# #...# .####",
    "H": "#...# #...# #...# ##### #...# #...# #...#",
    "I": ".###. ..#.. ..#.. ..#.. ..#.. ..#.. .###.",
    "J": "..### ...#. ...#. ...#. ...#. #..#. .##..",
    "K": "#...# #..#. #.#.. ##... #.#.. #..#. #...#",
    "L": "#.... #.... #.... #.... #.... #.... #####",
    "M": "#...# ##.## #.#.# #.#.# #...# #...# #...#",
    "N": "#...# #...# ##..# #.#.# #..## #...# #...#",
    "O": ".###. #...# #...# #...# #...# #...# .###.",
    "P": "####. #...# #...# ####. #.... #.... #....",
    "Q": ".###. #...# #...# #...# #.#.# #..#. .##.#",
    "R": "####. #...# #...# ####. #.#.. #..#. #...#",
    "S": ".#### #.... #.... .###. ....# ....# ####.",
    "T": "##### ..#.. ..#.. ..#.. ..#.. ..#.. ..#..",
    "U": "#...# #...# #...# #...# #...# #...# .###.",
    "V": "#...# #...# #...# #...# #...# .#.#. ..#..",
    "W": "#...# #...# #...# #.#.# #.#.# #.#.# .#.#.",
    "X": "#...# #...# .#.#. ..#.. .#.#. #...# #...#",
    "Y": "#...# #...# .#.#. ..#.. ..#.. ..#.. ..#..",
    "Z": "##### ....# ...#. ..#.. .#... #.... #####",
    ".": "..... ..... ..... ..... ..... .##.. .##..",
    ",": "..... ..... ..... ..... .##.. ..#.. .#...",
    ":": "..... .##.. .##.. ..... .##.. .##.. .....",
    "-": "..... ..... ..... ##### ..... ..... .....",
    "/": "..... ....# ...#. ..#.. .#... #.... .....",
    "(": "...#. ..#.. .#... .#... .#... ..#.. ...#.",
    ")": ".#... ..#.. ...#. ...#. ...#. ..#.. .#...",
    "%": "##... ##..# ...#. ..#.. .#... #..## ...##",
    "=": "..... ..... ##### ..... ##### ..... .....",
    "+": "..... ..#.. ..#.. ##### ..#.. ..#.. .....",
    "_": "..... ..... ..... ..... ..... ..... #####",
    ">": ".#... ..#.. ...#. ....# ...#. ..#.. .#...",
    "<": "...#. ..#.. .#... #.... .#... ..#.. ...#.",
    "!": "..#.. ..#.. ..#.. ..#.. ..#.. ..... ..#..",
    "?": ".###. #...# ....# ...#. ..#.. ..... ..#..",
}


def glyph_rows(char: str) -> list[str]:
    return FONT.get(char.upper(), FONT["?"]).split()


# ------------------------------------------------------------------------------------------ PNG


def png_chunk(tag: bytes, data: bytes) -> bytes:
    """Length, type, data, and the CRC-32 of type + data (PNG spec, section 5.3)."""
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)


def encode_png(width: int, height: int, rgb: bytes | bytearray) -> bytes:
    """An RGB image (width x height x 3 bytes, rows top to bottom) as PNG: filter type 0 on every row."""
    if width < 1 or height < 1 or len(rgb) != width * height * 3:
        raise ValueError(f"{len(rgb)} bytes is not a {width} x {height} RGB image")
    stride = width * 3
    raw = b"".join(b"\x00" + bytes(rgb[row * stride : (row + 1) * stride]) for row in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB, deflate, no interlace
    return (
        PNG_SIGNATURE + png_chunk(b"IHDR", header) + png_chunk(b"IDAT", zlib.compress(raw, 9)) + png_chunk(b"IEND", b"")
    )


class Canvas:
    """An RGB pixel grid with the few drawing operations a chart needs; coordinates outside are clipped."""

    def __init__(self, width: int, height: int, background: Color = WHITE) -> None:
        self.width, self.height = width, height
        self.pixels = bytearray(bytes(background) * (width * height))

    def fill_rect(self, x: int, y: int, width: int, height: int, color: Color) -> None:
        left, top = max(0, x), max(0, y)
        right, bottom = min(self.width, x + width), min(self.height, y + height)
        if right <= left or bottom <= top:
            return
        row = bytes(color) * (right - left)
        for line in range(top, bottom):
            start = (line * self.width + left) * 3
            self.pixels[start : start + len(row)] = row

    def pixel(self, x: int, y: int) -> Color:
        start = (y * self.width + x) * 3
        return (self.pixels[start], self.pixels[start + 1], self.pixels[start + 2])

    def hline(self, x0: int, x1: int, y: int, color: Color, dash: int = 0) -> None:
        """A horizontal line; dash > 0 draws dash pixels on, dash pixels off."""
        if not dash:
            self.fill_rect(x0, y, x1 - x0 + 1, 1, color)
            return
        for x in range(x0, x1 + 1, dash * 2):
            self.fill_rect(x, y, min(dash, x1 - x + 1), 1, color)

    def vline(self, x: int, y0: int, y1: int, color: Color) -> None:
        self.fill_rect(x, y0, 1, y1 - y0 + 1, color)

    def text(self, x: int, y: int, text: str, color: Color = BLACK, scale: int = 2) -> int:
        """Draw text with its top-left corner at (x, y); returns the x after the last glyph."""
        for char in text:
            for row, cells in enumerate(glyph_rows(char)):
                for column, cell in enumerate(cells):
                    if cell == "#":
                        self.fill_rect(x + column * scale, y + row * scale, scale, scale, color)
            x += (GLYPH_WIDTH + 1) * scale
        return x

    def png(self) -> bytes:
        return encode_png(self.width, self.height, self.pixels)


def text_width(text: str, scale: int = 2) -> int:
    return len(text) * (GLYPH_WIDTH + 1) * scale - scale if text else 0


# ------------------------------------------------------------------------------------------ the chart


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


CHART_WIDTH, CHART_HEIGHT = 960, 600
PLOT_LEFT, PLOT_RIGHT, PLOT_TOP, PLOT_BOTTOM = 96, 930, 70, 410


def _columns(records: Sequence[Mapping[str, Any]], width: int) -> list[dict[str, Any]]:
    """One bar per request in send order; when there are more requests than pixels, a bar per group showing
    the group's largest E2E and TTFT, red when any request in it failed."""
    count = len(records)
    groups = max(1, min(count, width))
    columns = []
    for group in range(groups):
        members = records[group * count // groups : (group + 1) * count // groups]
        ok = [r for r in members if r.get("ok")]
        columns.append(
            {
                "e2e": max((r.get("e2e_ms") or 0.0 for r in ok), default=0.0),
                "ttft": max((r.get("ttft_ms") or 0.0 for r in ok), default=0.0),
                "error": len(ok) < len(members),
            }
        )
    return columns


def _y_of(value: float, top: float) -> int:
    return PLOT_BOTTOM - round((PLOT_BOTTOM - PLOT_TOP) * min(value, top) / top)


def _draw_axes(canvas: Canvas, top: float, step: float) -> None:
    ticks = round(top / step)
    for tick in range(ticks + 1):
        value = tick * step
        y = _y_of(value, top)
        canvas.hline(PLOT_LEFT + 1, PLOT_RIGHT, y, GRID)
        label = format_number(value)
        canvas.text(PLOT_LEFT - 8 - text_width(label), y - 7, label, AXIS)
    canvas.vline(PLOT_LEFT, PLOT_TOP, PLOT_BOTTOM, AXIS)
    canvas.hline(PLOT_LEFT, PLOT_RIGHT, PLOT_BOTTOM, AXIS)
    canvas.text(8, PLOT_TOP - 26, "MS", AXIS)


def _draw_bars(canvas: Canvas, columns: list[dict[str, Any]], top: float) -> None:
    width = (PLOT_RIGHT - PLOT_LEFT - 1) / len(columns)
    gap = 1 if width >= 4 else 0
    for index, column in enumerate(columns):
        left = PLOT_LEFT + 1 + math.floor(index * width)
        bar = max(1, math.floor((index + 1) * width) - math.floor(index * width) - gap)
        if column["error"] and not column["e2e"]:
            canvas.fill_rect(left, PLOT_TOP, bar, PLOT_BOTTOM - PLOT_TOP, (250, 215, 215))
        for key, color in (("e2e", E2E_COLOR), ("ttft", TTFT_COLOR)):
            y = _y_of(column[key], top)
            canvas.fill_rect(left, y, bar, PLOT_BOTTOM - y, color)
        if column["error"]:
            canvas.fill_rect(left, PLOT_BOTTOM + 2, bar, 5, ERROR_COLOR)


def _draw_marks(canvas: Canvas, marks: list[tuple[str, float, Color]], top: float) -> None:
    """Dashed horizontal lines (p99s, limits), each labelled at the right end on a white background. Labels
    sit just above their line and are stacked upwards from the lowest, so close values stay readable."""
    floor = PLOT_BOTTOM - 16
    for label, value, color in sorted(marks, key=lambda mark: mark[1]):
        y = _y_of(value, top)
        canvas.hline(PLOT_LEFT + 1, PLOT_RIGHT, y, color, dash=6)
        text_y = min(y - 16, floor)
        floor = text_y - 16
        text = f"{label} {format_number(value)}"
        left = PLOT_RIGHT - text_width(text)
        canvas.fill_rect(left - 3, text_y - 1, text_width(text) + 4, 16, WHITE)
        canvas.text(left, text_y, text, color)


def _legend(canvas: Canvas, y: int) -> None:
    x = PLOT_LEFT
    for label, color in (("E2E", E2E_COLOR), ("TTFT", TTFT_COLOR), ("FAILED REQUEST", ERROR_COLOR)):
        canvas.fill_rect(x, y, 14, 14, color)
        x = canvas.text(x + 20, y, label) + 24


def _figure_lines(summary: Mapping[str, Any]) -> list[str]:
    lines = []
    for key, label in (("ttft_ms", "TTFT MS"), ("tpot_ms", "TPOT MS"), ("e2e_ms", "E2E MS")):
        figures = summary.get(key) or {}
        values = "  ".join(f"P{p} {format_number(figures.get(f'p{p}')):>8}" for p in (50, 90, 99))
        lines.append(f"{label:<8} {values}")
    lines.append(
        f"OUTPUT TOKENS/S {format_number(summary.get('output_tokens_per_s'))} OVERALL, "
        f"{format_number(summary.get('output_tokens_per_s_per_request'))} PER REQUEST"
    )
    return lines


def latency_chart(
    records: Sequence[Mapping[str, Any]],
    summary: Mapping[str, Any],
    thresholds: Mapping[str, Any] | None = None,
    title: str = "VERIFY LOAD TEST",
) -> bytes:
    """PNG: per-request E2E (light) and TTFT (dark) bars in send order, failed requests marked red under the
    axis, dashed p99 lines and the TTFT/E2E limits, and the p50/p90/p99 figures underneath."""
    canvas = Canvas(CHART_WIDTH, CHART_HEIGHT)
    canvas.text(PLOT_LEFT, 12, title)
    canvas.text(
        PLOT_LEFT,
        36,
        f"{summary.get('requests', len(records))} REQUESTS  CONCURRENCY {summary.get('concurrency', '-')}  "
        f"MAX TOKENS {summary.get('max_tokens', '-')}  OK {summary.get('ok', 0)}  ERRORS {summary.get('errors', 0)}  "
        f"NOT SENT {summary.get('not_sent', 0)}",
        AXIS,
    )
    ordered = sorted(records, key=lambda record: record.get("index", 0))
    limits = thresholds or {}
    marks = [
        (label, float(value), color)
        for label, value, color in (
            ("E2E P99", (summary.get("e2e_ms") or {}).get("p99"), AXIS),
            ("TTFT P99", (summary.get("ttft_ms") or {}).get("p99"), TTFT_COLOR),
            ("E2E LIMIT", limits.get("e2e_p99_ms"), LIMIT_COLOR),
            ("TTFT LIMIT", limits.get("ttft_p99_ms"), LIMIT_COLOR),
        )
        if value
    ]
    highest = max([r.get("e2e_ms") or 0.0 for r in ordered] + [mark[1] for mark in marks] + [0.0])
    top, step = nice_ceiling(highest)
    _draw_axes(canvas, top, step)
    if ordered:
        _draw_bars(canvas, _columns(ordered, PLOT_RIGHT - PLOT_LEFT - 1), top)
        _draw_marks(canvas, marks, top)
        first, last = "1", str(len(ordered))
        canvas.text(PLOT_LEFT, PLOT_BOTTOM + 12, first, AXIS)
        canvas.text(PLOT_RIGHT - text_width(last), PLOT_BOTTOM + 12, last, AXIS)
    if not any(record.get("ok") for record in ordered):
        message = "NO SUCCESSFUL REQUEST" if ordered else "NO REQUEST WAS SENT"
        canvas.text(
            (PLOT_LEFT + PLOT_RIGHT - text_width(message)) // 2, (PLOT_TOP + PLOT_BOTTOM) // 2, message, ERROR_COLOR
        )
    label = "REQUEST, IN SEND ORDER"
    canvas.text((PLOT_LEFT + PLOT_RIGHT - text_width(label)) // 2, PLOT_BOTTOM + 12, label, AXIS)
    _legend(canvas, PLOT_BOTTOM + 40)
    for line_number, line in enumerate(_figure_lines(summary)):
        canvas.text(PLOT_LEFT, PLOT_BOTTOM + 76 + line_number * 26, line)
    return canvas.png()
