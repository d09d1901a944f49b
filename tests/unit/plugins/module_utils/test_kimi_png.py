"""The PNG writer, decoded back with zlib + struct (signature, IHDR, CRCs, pixels), the font and the chart."""

from __future__ import annotations

import struct
import zlib

import pytest

from module_utils.kimi_png import (
    AXIS,
    CHART_HEIGHT,
    CHART_WIDTH,
    E2E_COLOR,
    ERROR_COLOR,
    FONT,
    PLOT_BOTTOM,
    PLOT_LEFT,
    PLOT_RIGHT,
    PLOT_TOP,
    TTFT_COLOR,
    WHITE,
    Canvas,
    encode_png,
    format_number,
    latency_chart,
    nice_ceiling,
    text_width,
)


def decode_png(data: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB bytes); asserts the structure and every CRC on the way."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    position, chunks = 8, []
    while position < len(data):
        (length,) = struct.unpack(">I", data[position : position + 4])
        tag = data[position + 4 : position + 8]
        body = data[position + 8 : position + 8 + length]
        (crc,) = struct.unpack(">I", data[position + 8 + length : position + 12 + length])
        assert crc == zlib.crc32(tag + body) & 0xFFFFFFFF, f"bad CRC in {tag!r}"
        chunks.append((tag, body))
        position += 12 + length
    tags = [tag for tag, _ in chunks]
    assert tags[0] == b"IHDR" and tags[-1] == b"IEND" and b"IDAT" in tags
    width, height, depth, color_type, compression, filtering, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    assert (depth, color_type, compression, filtering, interlace) == (8, 2, 0, 0, 0)
    raw = zlib.decompress(b"".join(body for tag, body in chunks if tag == b"IDAT"))
    stride = 1 + width * 3
    assert len(raw) == height * stride
    rows = [raw[row * stride : (row + 1) * stride] for row in range(height)]
    assert all(row[0] == 0 for row in rows)  # filter type 0 (none) on every row
    return width, height, [row[1:] for row in rows]


def pixel(rows: list[bytes], x: int, y: int) -> tuple[int, int, int]:
    return tuple(rows[y][x * 3 : x * 3 + 3])


def count_color(rows: list[bytes], color: tuple[int, int, int], region=None) -> int:
    x0, y0, x1, y1 = region or (0, 0, len(rows[0]) // 3, len(rows))
    return sum(1 for y in range(y0, y1) for x in range(x0, x1) if pixel(rows, x, y) == color)


def test_encoded_image_decodes_to_the_same_pixels():
    canvas = Canvas(7, 3)
    canvas.fill_rect(1, 1, 2, 1, (10, 20, 30))
    canvas.fill_rect(6, 2, 5, 5, (200, 0, 0))  # clipped at the right and bottom edges
    width, height, rows = decode_png(canvas.png())
    assert (width, height) == (7, 3)
    assert pixel(rows, 1, 1) == pixel(rows, 2, 1) == (10, 20, 30)
    assert pixel(rows, 6, 2) == (200, 0, 0)
    assert pixel(rows, 0, 0) == WHITE and pixel(rows, 3, 1) == WHITE
    assert count_color(rows, WHITE) == 7 * 3 - 3


def test_encode_rejects_a_buffer_of_the_wrong_size():
    with pytest.raises(ValueError):
        encode_png(2, 2, b"\x00" * 11)


def test_font_glyphs_are_seven_rows_of_five_and_distinct():
    for char, glyph in FONT.items():
        rows = glyph.split()
        assert len(rows) == 7 and all(len(row) == 5 and set(row) <= {".", "#"} for row in rows), char
    drawn = [glyph for char, glyph in FONT.items() if char != " "]
    assert len(set(drawn)) == len(drawn)
    assert all(char in FONT for char in "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ.:-/%")


def test_text_draws_glyph_cells_at_the_scale():
    canvas = Canvas(40, 20)
    end = canvas.text(2, 3, "1", (0, 0, 0), scale=2)
    assert end == 2 + 6 * 2
    # "1" has its stem in the middle column: cells (2, 0..6) lit, at scale 2 that is x 6..7, y 3..16
    assert canvas.pixel(6, 3) == canvas.pixel(7, 16) == (0, 0, 0)
    assert canvas.pixel(2, 3) == WHITE  # the top-left cell of "1" is off
    lower = Canvas(40, 20)
    lower.text(2, 3, "a")
    upper = Canvas(40, 20)
    upper.text(2, 3, "A")
    assert lower.pixels == upper.pixels
    assert text_width("AB") == 22


def test_axis_helpers():
    assert nice_ceiling(9048) == (10000, 2000)
    assert nice_ceiling(3.2) == (4, 1)
    assert nice_ceiling(0) == (1.0, 0.25)
    assert [format_number(v) for v in (1234.4, 12.345, 0.5, 2.0, None)] == ["1234", "12.3", "0.5", "2", "-"]


def record(index, ttft, e2e, ok=True):
    if not ok:
        return {"index": index, "ok": False, "error_kind": "HTTP 500"}
    return {"index": index, "ok": True, "ttft_ms": ttft, "e2e_ms": e2e}


SUMMARY = {
    "requests": 4,
    "concurrency": 2,
    "max_tokens": 64,
    "ok": 3,
    "errors": 1,
    "not_sent": 0,
    "ttft_ms": {"p50": 200.0, "p90": 280.0, "p99": 298.0},
    "tpot_ms": {"p50": 20.0, "p90": 25.0, "p99": 26.0},
    "e2e_ms": {"p50": 1500.0, "p90": 1900.0, "p99": 1990.0},
    "output_tokens_per_s": 96.0,
    "output_tokens_per_s_per_request": 40.0,
}


def test_chart_draws_bars_errors_and_labels():
    records = [record(0, 100, 1000), record(1, 200, 2000), record(2, 0, 0, ok=False), record(3, 300, 1500)]
    width, height, rows = decode_png(latency_chart(records, SUMMARY, {"ttft_p99_ms": 250}))
    assert (width, height) == (CHART_WIDTH, CHART_HEIGHT)
    plot = (PLOT_LEFT + 1, PLOT_TOP, PLOT_RIGHT, PLOT_BOTTOM)
    column = (PLOT_RIGHT - PLOT_LEFT - 1) // 4
    # request 1 (the second bar) is the tallest E2E: its bar reaches the top of the scale (2000 of 2000)
    second_bar_x = PLOT_LEFT + 1 + column + column // 2
    assert pixel(rows, second_bar_x, PLOT_TOP + 8) == E2E_COLOR  # (the E2E p99 line runs at PLOT_TOP + 2)
    assert pixel(rows, second_bar_x, PLOT_BOTTOM - 2) == TTFT_COLOR
    first_bar_x = PLOT_LEFT + 1 + column // 2
    assert pixel(rows, first_bar_x, PLOT_TOP + 8) == WHITE  # 1000 ms reaches only half way
    assert pixel(rows, first_bar_x, (PLOT_TOP + PLOT_BOTTOM) // 2 + 5) == E2E_COLOR
    # the failed request (third) is marked red just under the axis, and only there
    third_bar_x = PLOT_LEFT + 1 + 2 * column + column // 2
    assert pixel(rows, third_bar_x, PLOT_BOTTOM + 4) == ERROR_COLOR
    assert pixel(rows, first_bar_x, PLOT_BOTTOM + 4) == WHITE
    assert count_color(rows, TTFT_COLOR, plot) > 100
    assert count_color(rows, AXIS) > 500  # axes, ticks and their labels
    assert count_color(rows, (0, 0, 0)) > 500  # the title and the figures underneath


def test_chart_is_deterministic_and_depends_on_the_data():
    records = [record(i, 50.0 + i, 500.0 + 10 * i) for i in range(30)]
    first = latency_chart(records, SUMMARY)
    assert first == latency_chart(records, SUMMARY)
    assert first != latency_chart(records[:-1], SUMMARY)


def test_chart_folds_more_requests_than_pixels_and_handles_no_data():
    many = [record(i, 10.0, 100.0 + i % 50) for i in range(3000)]
    decode_png(latency_chart(many, {**SUMMARY, "requests": 3000}))
    for records in ([], [record(0, 0, 0, ok=False)]):
        _, _, rows = decode_png(latency_chart(records, {"requests": 1}))
        middle = (PLOT_LEFT, (PLOT_TOP + PLOT_BOTTOM) // 2 - 5, PLOT_RIGHT, (PLOT_TOP + PLOT_BOTTOM) // 2 + 20)
        assert count_color(rows, ERROR_COLOR, middle) > 50  # "NO SUCCESSFUL REQUEST" / "NO REQUEST WAS SENT"
