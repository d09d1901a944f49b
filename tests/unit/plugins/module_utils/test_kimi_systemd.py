"""One reader of `systemctl show`: several units by Id (drift's recorded output), one unit's properties (the
serve and verify roles), and `--timestamp=unix` start times (the serve role's group decision)."""

from __future__ import annotations

from ansible_collections.kimi.k2.plugins.module_utils.kimi_systemd import (
    parse_blocks,
    parse_systemctl_show,
    parse_unit,
    unix_timestamp,
)

from tests.paths import REPO_ROOT

SYSTEMCTL = REPO_ROOT / "tests" / "fixtures" / "drift" / "systemctl"
# `systemctl show -p ActiveState -p ExecMainStartTimestamp --timestamp=unix UNIT`, as the serve role runs it.
ONE_UNIT = "ActiveState=active\nExecMainStartTimestamp=@1795997000\n"


def test_several_units_are_keyed_by_their_id():
    units = parse_systemctl_show((SYSTEMCTL / "rank0-active.txt").read_text())
    assert sorted(units) == ["kimi-vllm-headless.service", "kimi-vllm.service"]
    assert units["kimi-vllm.service"]["ActiveState"] == "active"
    assert units["kimi-vllm-headless.service"]["LoadState"] == "not-found"
    # An empty value stays an empty string, not a missing key.
    assert units["kimi-vllm-headless.service"]["UnitFileState"] == ""


def test_a_block_without_id_names_no_unit_and_is_dropped():
    assert parse_systemctl_show("ActiveState=active\n\nId=a.service\nActiveState=failed\n") == {
        "a.service": {"Id": "a.service", "ActiveState": "failed"}
    }


def test_one_unit_without_id_reads_as_its_properties():
    assert parse_unit(ONE_UNIT) == {"ActiveState": "active", "ExecMainStartTimestamp": "@1795997000"}


def test_only_the_first_equals_sign_separates_and_lines_without_one_are_ignored():
    text = "ExecStart={ path=/usr/bin/vllm ; argv[]=vllm serve }\nnot a property\nMainPID=0\n"
    assert parse_unit(text) == {"ExecStart": "{ path=/usr/bin/vllm ; argv[]=vllm serve }", "MainPID": "0"}


def test_nothing_printed_is_no_unit():
    assert parse_unit("") == {}
    assert parse_unit(None) == {}
    assert parse_blocks("\n\n") == []
    assert parse_systemctl_show("") == {}


def test_blocks_keep_systemctls_order():
    blocks = parse_blocks("Id=b.service\n\nId=a.service\n")
    assert [block["Id"] for block in blocks] == ["b.service", "a.service"]


def test_unix_timestamps_and_the_values_of_a_unit_that_never_started():
    assert unix_timestamp("@1795997000") == 1795997000.0
    assert unix_timestamp(" @5 ") == 5.0
    for never in ("", None, "@0", "0", "n/a", "@"):
        assert unix_timestamp(never) is None, never
