"""plugins/module_utils/kimi_report.py: the one report writer (atomic files, unchanged bytes left alone, latest
copies, a stale latest file removed)."""

from __future__ import annotations

import json

import pytest
from ansible_collections.kimi.k2.plugins.module_utils.kimi_report import (
    report_json,
    write_atomic,
    write_report_file,
    write_report_files,
)


def test_json_is_sorted_and_ends_with_a_newline_compact_or_not():
    assert report_json({"b": 1, "a": [1, 2]}) == '{\n  "a": [\n    1,\n    2\n  ],\n  "b": 1\n}\n'
    assert report_json({"b": 1, "a": 2}, compact=True) == '{"a":2,"b":1}\n'


def test_atomic_write_replaces_and_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "a.json"
    target.write_text("old")
    assert write_atomic(target, b"new") is True
    assert target.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["a.json"]
    with pytest.raises(OSError):
        write_atomic(tmp_path / "missing-dir" / "b.json", b"x")
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_the_same_bytes_are_not_written_again(tmp_path):
    target = tmp_path / "parity.json"
    assert write_atomic(target, "{}\n") is True
    before = target.stat().st_mtime_ns
    assert write_atomic(target, "{}\n") is False
    assert target.stat().st_mtime_ns == before


def test_one_report_file_makes_its_directory_and_leaves_the_same_bytes_alone(tmp_path):
    target = tmp_path / "artifacts" / "plan.json"
    assert write_report_file(target, report_json({"fits": True})) is True
    assert target.read_text() == '{\n  "fits": true\n}\n'
    assert write_report_file(target, report_json({"fits": True})) is False
    assert report_json([{"b": 1, "a": 2}], compact=True) == '[{"a":2,"b":1}]\n'


def test_dated_files_then_latest_copies_and_a_stale_latest_chart_removed(tmp_path):
    (tmp_path / "verify-latest.svg").write_text("<svg/>")
    (tmp_path / "verify-latest.png").write_bytes(b"\x89PNG")
    contents = {".json": report_json({"ok": True}), ".md": "# ok\n"}
    paths = write_report_files(tmp_path, "verify-1", contents, "verify-latest", suffixes_of_latest=(".svg", ".png"))
    assert set(paths) == {".json", ".md", "latest.json", "latest.md"}
    assert json.loads(paths["latest.json"].read_text()) == {"ok": True}
    assert paths[".md"].read_text() == paths["latest.md"].read_text() == "# ok\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "verify-1.json",
        "verify-1.md",
        "verify-latest.json",
        "verify-latest.md",
    ]


@pytest.mark.parametrize(("basename", "latest"), [("", None), ("a/b", None), (".hidden", None), ("same", "same")])
def test_names_that_are_not_plain_or_collide_are_refused(tmp_path, basename, latest):
    with pytest.raises(ValueError):
        write_report_files(tmp_path, basename, {".json": "{}"}, latest)
