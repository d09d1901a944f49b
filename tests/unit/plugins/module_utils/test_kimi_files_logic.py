"""The decisions kimi_files makes before it touches a node."""

from __future__ import annotations

import pytest
from ansible_collections.kimi.k2.plugins.module_utils.kimi_files import (
    DIFF_MAX_BYTES,
    content_diff,
    content_differs,
    distinct_directories,
    duplicate_paths,
    validate_argv,
    wanted_file,
)


def test_validate_replaces_every_percent_s_and_keeps_quoted_arguments():
    argv = validate_argv("nft -c -f %s --comment 'a b'", "/etc/.cand", "/etc/nftables.conf")
    assert argv == ["nft", "-c", "-f", "/etc/.cand", "--comment", "a b"]


def test_validate_without_the_candidate_is_refused_naming_the_file():
    with pytest.raises(ValueError, match=r"/etc/x\.yml must contain %s"):
        validate_argv("promtool check config", "/tmp/c", "/etc/x.yml")


def test_a_missing_file_differs_and_equal_bytes_do_not():
    assert content_differs(None, b"")
    assert not content_differs(b"a\n", b"a\n")
    assert content_differs(b"a\n", b"a")


def test_the_diff_of_an_absent_file_has_no_before_header_and_large_or_binary_content_is_hidden():
    diff = content_diff("/etc/f", None, b"new\n")
    assert diff == {"after_header": "/etc/f", "before": "", "after": "new\n"}
    assert content_diff("/etc/f", b"old\n", b"new\n")["before_header"] == "/etc/f"
    large = content_diff("/etc/f", b"\0bin", b"x" * (DIFF_MAX_BYTES + 1))
    assert large["before"] == "(4 bytes, not shown)\n"
    assert large["after"] == f"({DIFF_MAX_BYTES + 1} bytes, not shown)\n"


def test_a_path_named_twice_is_found_whatever_its_trailing_slash():
    found = duplicate_paths([{"path": "/etc/kimi/"}, {"path": "/etc/a"}], [{"dest": "/etc/kimi"}, {"dest": "/etc/b"}])
    assert found == ["/etc/kimi"]
    assert duplicate_paths([], [{"dest": "/a"}, {"dest": "/b"}]) == []


def test_content_is_taken_as_utf8_bytes():
    wanted = wanted_file({"dest": "/etc/f", "content": "é\n", "validate": None})
    assert wanted.content == "é\n".encode() and wanted.validate is None


def test_the_same_directory_twice_is_one_but_with_other_attributes_it_is_refused():
    same = [{"path": "/etc/kimi", "mode": "0755"}, {"path": "/etc/kimi", "mode": "0755"}]
    assert distinct_directories(same) == [{"path": "/etc/kimi", "mode": "0755"}]
    assert duplicate_paths(same, []) == []
    assert duplicate_paths([{"path": "/etc/kimi", "mode": "0755"}, {"path": "/etc/kimi", "mode": "0700"}], []) == [
        "/etc/kimi"
    ]
