"""Pure checkpoint logic: file selection, planning, the disk rule, progress lines, verification, the marker."""

from __future__ import annotations

import hashlib
import json
import os

import pytest
from ansible_collections.kimi.k2.plugins.module_utils import kimi_checkpoint as ck

SHA = "60877af7bde655c71406a1843bcc395afa52fb57"


def blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def test_tree_entries_keep_files_and_take_lfs_sha256_and_size():
    entries = [
        {"type": "directory", "path": "sub", "oid": "x", "size": 0},
        {"type": "file", "path": "config.json", "oid": "a" * 40, "size": 10},
        {
            "type": "file",
            "path": "model.safetensors",
            "oid": "p" * 40,
            "size": 134,
            "lfs": {"oid": "f" * 64, "size": 999},
        },
    ]
    files = ck.files_from_tree(entries)
    assert [f.path for f in files] == ["config.json", "model.safetensors"]
    assert files[0] == ck.RepoFile("config.json", 10, None, "a" * 40)
    # The pointer's blob id would never match the content: only the LFS sha256 is kept.
    assert files[1] == ck.RepoFile("model.safetensors", 999, "f" * 64, None)


def test_include_and_exclude_select_like_hf():
    files = [ck.RepoFile(p, 1) for p in ("a.json", "b.safetensors", "c.safetensors", "README.md")]
    chosen = ck.select_files(files, include=["*.safetensors", "*.json"], exclude=["c.*"])
    assert [f.path for f in chosen] == ["a.json", "b.safetensors"]
    assert len(ck.select_files(files, [], [])) == 4


def test_plan_counts_wrong_size_files_as_missing_in_full():
    files = [ck.RepoFile("a", 100), ck.RepoFile("b", 50), ck.RepoFile("c", 7)]
    result = ck.plan(files, {"a": 100, "b": 20})
    assert result.missing == ["b", "c"]
    assert result.missing_bytes == 57
    assert result.present_bytes == 100
    assert result.wrong_size == ["b"]
    assert result.total_bytes == 157


def test_disk_rule_names_host_needed_and_available():
    assert ck.disk_shortfall("node1", "/data", 100, 10, 110) is None
    message = ck.disk_shortfall("node2", "/data", 100, 10, 109)
    assert message.startswith("node2: ")
    assert "needed 110 bytes" in message
    assert "available 109 bytes" in message


def test_existing_ancestor_climbs_to_a_real_directory(tmp_path):
    assert ck.existing_ancestor(str(tmp_path / "x" / "y")) == str(tmp_path)


@pytest.mark.parametrize(
    ("done", "total", "rate", "expected"),
    [
        (0, 1000, None, "n: 0 B of 1.0 KB (0.0%), rate unknown yet, ETA unknown"),
        (500_000_000, 2_000_000_000, 100_000_000, "n: 500.0 MB of 2.0 GB (25.0%), 100.0 MB/s, ETA 0:00:15"),
        (595_000_000_000, 595_000_000_000, 1e9, "n: 595.0 GB of 595.0 GB (100.0%), 1.0 GB/s, ETA 0:00:00"),
    ],
)
def test_progress_line(done, total, rate, expected):
    assert ck.progress_line("n", done, total, rate) == expected


def test_rate_needs_an_earlier_sample():
    assert ck.rate(None, (10.0, 100)) is None
    assert ck.rate((10.0, 100), (10.0, 200)) is None
    assert ck.rate((10.0, 100), (12.0, 300)) == 100.0


def test_stall_message_names_host_seconds_and_bytes_so_far():
    message = ck.stall_message("node2", 31.4, 153_196, 8_622_564, 30, 4242)
    assert message.startswith("node2: the download stalled: no new bytes on disk for 31 s")
    assert "(checkpoint_stall_timeout 30 s)" in message
    assert "153196 bytes (153.2 KB, 1.8%) of 8622564 on disk" in message
    assert "stopped the hf job (pid 4242)" in message
    assert "pid" not in ck.stall_message("n", 5, 0, 0, 5, None)


def test_error_line_is_the_last_line_that_states_an_error():
    traceback = [
        "2026-01-01T00:00:00Z start org/repo " + SHA,
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in <module>',
        "httpcore.ReadTimeout: timed out",
        "The above exception was the direct cause of the following exception:",
        "    raise mapped_exc(message) from exc",
        "httpx2.ReadTimeout: timed out",
        "2026-01-01T00:01:00Z hf download exited with 1",
    ]
    assert ck.error_line(traceback) == "httpx2.ReadTimeout: timed out"
    assert ck.error_line(["\x1b[31mError:\x1b[0m Repository not found", "done"]) == "Error: Repository not found"
    assert ck.error_line(["ErrorHandler started", "all good"]) is None


def test_verify_names_missing_short_and_corrupt_files(tmp_path):
    good, bad = b"hello", b"world"
    (tmp_path / "good").write_bytes(good)
    (tmp_path / "short").write_bytes(b"x")
    (tmp_path / "corrupt").write_bytes(b"WORLD")
    (tmp_path / "lfs").write_bytes(good)
    files = [
        ck.RepoFile("good", 5, git_oid=blob_id(good)),
        ck.RepoFile("short", 5),
        ck.RepoFile("corrupt", 5, git_oid=blob_id(bad)),
        ck.RepoFile("lfs", 5, sha256=hashlib.sha256(b"other").hexdigest()),
        ck.RepoFile("absent", 3),
    ]
    problems = ck.verify(tmp_path, files, checksums=True)
    assert ck.bad_paths(problems) == ["short", "corrupt", "lfs", "absent"]
    assert "corrupt: git blob id differs" in problems[1]
    # Sizes only: the same-size corruptions pass.
    assert ck.bad_paths(ck.verify(tmp_path, files, checksums=False)) == ["short", "absent"]


def test_marker_round_trip_and_matching():
    files = [ck.RepoFile("a", 3), ck.RepoFile("b", 4)]
    marker = ck.marker_for("org/repo", SHA, files, ["*.json"], [], "2026-01-01T00:00:00Z")
    data = ck.read_marker(ck.marker_json(marker))
    assert data["file_count"] == 2 and data["total_bytes"] == 7
    assert ck.marker_matches(data, "org/repo", SHA, ["*.json"], [])
    assert not ck.marker_matches(data, "org/repo", "f" * 40, ["*.json"], [])
    assert not ck.marker_matches(data, "org/other", SHA, ["*.json"], [])
    assert not ck.marker_matches(data, "org/repo", SHA, [], [])
    # A branch name never matches: it may have moved since.
    assert not ck.marker_matches({**data, "revision": "main"}, "org/repo", "main", ["*.json"], [])


@pytest.mark.parametrize("text", [None, "", "not json", json.dumps([1, 2])])
def test_unreadable_marker_means_not_done(text):
    assert ck.read_marker(text) is None


def test_commit_sha_rule():
    assert ck.is_commit_sha(SHA)
    assert not ck.is_commit_sha("main")
    assert not ck.is_commit_sha(SHA.upper())


# ------------------------------------------------------------------------------- file stats in the marker


def stats_of(directory, names) -> dict:
    return {name: ck.file_stat(directory / name) for name in names}


def test_verify_with_only_hashes_those_files_and_checks_every_size(tmp_path):
    (tmp_path / "a").write_bytes(b"AAAA")  # corrupt: not hashed unless named
    (tmp_path / "b").write_bytes(b"BBBB")
    (tmp_path / "c").write_bytes(b"CC")  # short: found whatever `only` says
    files = [
        ck.RepoFile("a", 4, git_oid=blob_id(b"aaaa")),
        ck.RepoFile("b", 4, git_oid=blob_id(b"bbbb")),
        ck.RepoFile("c", 4, git_oid=blob_id(b"cccc")),
    ]
    assert ck.bad_paths(ck.verify(tmp_path, files, checksums=True, only=["b"])) == ["b", "c"]
    assert ck.bad_paths(ck.verify(tmp_path, files, checksums=True, only=[])) == ["c"]
    assert ck.bad_paths(ck.verify(tmp_path, files, checksums=True)) == ["a", "b", "c"]


def test_marker_files_record_the_hub_checksum_and_the_stat(tmp_path):
    (tmp_path / "w").write_bytes(b"weights")
    files = [ck.RepoFile("w", 7, sha256="s" * 64), ck.RepoFile("gone", 3, git_oid="g" * 40)]
    entries = ck.marker_files(files, stats_of(tmp_path, ["w", "gone"]))
    found = (tmp_path / "w").stat()
    assert entries == {
        "w": {"sha256": "s" * 64, "git_oid": None, "size": 7, "mtime_ns": found.st_mtime_ns, "ino": found.st_ino}
    }
    marker = ck.read_marker(ck.marker_json(ck.marker_for("org/r", SHA, files, [], [], "t", stats_of(tmp_path, ["w"]))))
    assert marker["version"] == 2 and marker["files"] == entries


def test_a_directory_or_a_missing_path_has_no_file_stat(tmp_path):
    (tmp_path / "d").mkdir()
    assert ck.file_stat(tmp_path / "d") is None
    assert ck.file_stat(tmp_path / "absent") is None


def test_stat_differences_name_overwritten_replaced_truncated_and_removed_files(tmp_path):
    names = ["inplace", "replaced", "truncated", "removed", "untouched"]
    for name in names:
        (tmp_path / name).write_bytes(b"0123456789" * 100)
    recorded = ck.marker_files([ck.RepoFile(n, 1000) for n in names], stats_of(tmp_path, names))
    before = (tmp_path / "inplace").stat().st_mtime_ns
    with (tmp_path / "inplace").open("r+b") as handle:  # dd conv=notrunc: same size, same inode
        handle.seek(500)
        handle.write(b"XXXX")
    os.utime(tmp_path / "inplace", ns=(before + 1_000_000_000, before + 1_000_000_000))  # coarse clocks
    (tmp_path / "new").write_bytes(b"0123456789" * 100)
    (tmp_path / "new").replace(tmp_path / "replaced")
    (tmp_path / "truncated").write_bytes(b"short")
    (tmp_path / "removed").unlink()
    problems = ck.stat_differences(recorded, stats_of(tmp_path, names))
    assert ck.bad_paths(problems) == ["inplace", "removed", "replaced", "truncated"]
    assert problems[0] == (
        f"inplace: changed since its verification (mtime_ns {before + 1_000_000_000}, recorded {before})"
    )
    assert problems[1] == "removed: missing"
    assert "ino " in problems[2] and "size 5, recorded 1000" in problems[3]


def test_a_restored_mtime_escapes_the_stat_but_not_the_content_check(tmp_path):
    data = b"weights" * 100
    path = tmp_path / "w"
    path.write_bytes(data)
    recorded = ck.marker_files([ck.RepoFile("w", len(data), sha256=hashlib.sha256(data).hexdigest())],
                               stats_of(tmp_path, ["w"]))  # fmt: skip
    mtime = path.stat().st_mtime_ns
    with path.open("r+b") as handle:
        handle.write(b"X")
    os.utime(path, ns=(mtime, mtime))  # touch -d: the attacker puts the mtime back
    assert ck.stat_differences(recorded, stats_of(tmp_path, ["w"])) == []
    hashed, problems = ck.sample_check(tmp_path, recorded, 1, 0, set())
    assert hashed == ["w"] and problems == [f"w: sha256 differs from the listed {recorded['w']['sha256']}"]


def test_the_sample_rotates_through_every_file_with_a_checksum():
    recorded = {name: {"git_oid": "g" * 40} for name in ("c", "a", "d", "b", "e")}
    recorded["nochecksum"] = {"sha256": None, "git_oid": None}
    assert ck.sample_files(recorded, 1, 0) == ["a"]
    assert [ck.sample_files(recorded, 1, day)[0] for day in range(5, 10)] == ["a", "b", "c", "d", "e"]
    assert ck.sample_files(recorded, 2, 0) == ["a", "b"]
    assert ck.sample_files(recorded, 2, 2) == ["e", "a"]  # wraps around
    covered = {name for day in range(3) for name in ck.sample_files(recorded, 2, day)}
    assert covered == {"a", "b", "c", "d", "e"}
    assert ck.sample_files(recorded, 9, 4) == ["a", "b", "c", "d", "e"]  # never more than there are
    assert ck.sample_files(recorded, 0, 3) == [] and ck.sample_files({}, 1, 3) == []


def test_the_sample_skips_files_already_found_changed_and_names_a_missing_one(tmp_path):
    recorded = {"a": {"git_oid": blob_id(b"a")}, "b": {"git_oid": blob_id(b"b")}}
    (tmp_path / "b").write_bytes(b"b")
    assert ck.sample_check(tmp_path, recorded, 2, 0, {"a"}) == (["b"], [])
    assert ck.sample_check(tmp_path, recorded, 1, 0, set()) == (["a"], ["a: missing"])


def test_a_version_1_marker_is_old_and_no_longer_matches():
    old = {"version": 1, "repo_id": "org/repo", "revision": SHA, "include": [], "exclude": []}
    assert ck.is_old_marker(old) and not ck.marker_matches(old, "org/repo", SHA, [], [])
    assert ck.pin_matches(old, "org/repo", SHA, [], [])
    current = {**old, "version": ck.MARKER_VERSION}
    assert not ck.is_old_marker(current) and ck.marker_matches(current, "org/repo", SHA, [], [])
    assert not ck.is_old_marker({**old, "version": 3}) and not ck.is_old_marker(None)
