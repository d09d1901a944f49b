"""plugins/module_utils/kimi_nftables.py on what nft 1.0.6 really prints (tests/fixtures/firewall/nft, recorded by
tests/fixtures/firewall/record.py in throwaway network namespaces): the normalised table compares equal across
handles and traffic counts, and every hand edit (a rule deleted, added or moved, a set element added, a chain's
policy changed) is named in words an operator reads; the record of an apply survives a round trip and a foreign
or damaged record is no record."""

from __future__ import annotations

import copy
import json

import pytest
from ansible_collections.kimi.k2.plugins.module_utils.kimi_nftables import (
    compare,
    element_text,
    file_sha256,
    flushes_ruleset,
    judge,
    load_state,
    normalise,
    rule_lines,
    rule_texts,
    split_table,
    state_document,
    state_text,
    table_absent,
    table_text,
)

from tests.paths import FIXTURES

NFT = FIXTURES / "firewall" / "nft"
RULES = [
    'iif "lo" accept',
    "ct state established,related accept",
    "ct state invalid drop",
    "meta l4proto { icmp, ipv6-icmp } accept",
    "udp sport 67 udp dport 68 accept",
    "udp sport 547 udp dport 546 accept",
    "ip saddr @replica_peers accept",
    "tcp dport @ssh_ports ip saddr @admin_networks accept",
    "tcp dport @ssh_ports ip6 saddr @admin_networks6 accept",
    "tcp dport @api_ports ip saddr @api_clients accept",
    "tcp dport @exporter_ports ip saddr @monitoring_hosts accept",
    "tcp dport @monitoring_ports ip saddr @admin_networks accept",
    "tcp dport @monitoring_ports ip6 saddr @admin_networks6 accept",
    "tcp dport @checkpoint_peer_ports ip saddr @checkpoint_peers accept",
    "meta l4proto tcp reject with tcp reset",
]
SETS = [
    "replica_peers",
    "api_clients",
    "monitoring_hosts",
    "checkpoint_peers",
    "checkpoint_peer_ports",
    "admin_networks",
    "admin_networks6",
    "ssh_ports",
    "api_ports",
    "exporter_ports",
    "monitoring_ports",
]


def document(case: str) -> dict:
    return json.loads((NFT / f"{case}.json").read_text())


def table(case: str) -> list[dict[str, str]]:
    return normalise(document(case), (NFT / f"{case}.txt").read_text())


def test_the_applied_table_reads_as_its_sets_its_chain_and_nfts_own_rule_text():
    entries = table("applied")
    assert [(e["kind"], e["name"]) for e in entries] == [
        *[("set", name) for name in SETS],
        ("chain", "input"),
        *[("rule", "input")] * len(RULES),
    ]
    assert [e["line"] for e in entries if e["kind"] == "rule"] == RULES
    lines = {e["name"]: e["line"] for e in entries if e["kind"] != "rule"}
    # Elements in address and port order, each with the host or the service it is: node1's API clients are the
    # router and the monitoring host (node1 itself); its replica (node1, node2) reaches every port.
    assert lines["api_clients"] == (
        'set api_clients { type ipv4_addr; elements = { 10.99.0.5 comment "router1", 10.99.0.11 comment "node1" } }'
    )
    assert lines["replica_peers"] == (
        'set replica_peers { type ipv4_addr; elements = { 10.99.0.11 comment "node1", 10.99.0.12 comment "node2" } }'
    )
    assert lines["admin_networks"] == "set admin_networks { type ipv4_addr; flags interval; elements = { 10.99.0.1 } }"
    assert lines["exporter_ports"].startswith("set exporter_ports { type inet_service; elements = { 9100 comment")
    assert lines["input"] == "chain input { type filter hook input priority 0; policy drop; }"
    assert all('"handle"' not in e["key"] for e in entries)


def test_the_same_rules_under_other_handles_are_the_same_table():
    # The last rule was deleted and added again: it is back at the end under a new handle.
    assert '"handle": 25' in (NFT / "applied.json").read_text()
    assert "# handle 26" in (NFT / "readded.txt").read_text()
    assert compare(table("applied"), table("readded")) == []
    assert table("applied") == table("readded")


def test_each_hand_edit_is_named():
    assert compare(table("applied"), table("drifted")) == [
        "set changed by hand: api_clients: element 10.99.0.99 added",
        "rule missing: ip saddr @replica_peers accept (chain input)",
        "rule added by hand: tcp dport 2222 counter accept (chain input)",
    ]
    # Undoing is the other way round.
    assert compare(table("drifted"), table("applied")) == [
        "set changed by hand: api_clients: element 10.99.0.99 removed",
        "rule missing: tcp dport 2222 counter accept (chain input)",
        "rule added by hand: ip saddr @replica_peers accept (chain input)",
    ]


def test_rules_moved_within_their_chain_are_a_change():
    assert compare(table("applied"), table("reordered")) == ["rules reordered by hand (chain input)"]


def test_a_chain_changed_by_hand_shows_both_versions():
    assert compare(table("applied"), table("policy")) == [
        "chain changed by hand: chain input { type filter hook input priority 0; policy accept; } "
        "(recorded: chain input { type filter hook input priority 0; policy drop; })"
    ]


def test_objects_and_chains_deleted_or_added_by_hand():
    applied = table("applied")
    without_chain = [e for e in applied if e["kind"] == "set"]
    assert compare(applied, without_chain) == [
        "chain missing: chain input { type filter hook input priority 0; policy drop; }",
        *[f"rule missing: {rule} (chain input)" for rule in RULES],
    ]
    assert compare(without_chain, applied)[0] == (
        "chain added by hand: chain input { type filter hook input priority 0; policy drop; }"
    )


def test_traffic_counts_are_not_a_change():
    busy = copy.deepcopy(document("drifted"))
    counted = [i["rule"] for i in busy["nftables"] if "rule" in i and "counter" in json.dumps(i["rule"])]
    assert len(counted) == 1
    for expression in counted[0]["expr"]:
        if "counter" in expression:
            expression["counter"] = {"packets": 1234, "bytes": 98765}
    listing = (NFT / "drifted.txt").read_text().replace("packets 0 bytes 0", "packets 1234 bytes 98765")
    assert normalise(busy, listing) == table("drifted")


def test_rule_text_comes_from_the_listing_joined_across_wrapped_lines():
    listing = (
        "table inet kimi { # handle 2\n"
        "\tchain input { # handle 1\n"
        "\t\ttype filter hook input priority filter; policy accept;\n"
        "\t\tip saddr { 10.0.0.1, 10.0.0.2,\n"
        "\t\t\t     10.0.0.3 } tcp dport 9 counter packets 7 bytes 420 accept # handle 4\n"
        "\t}\n}\n"
    )
    assert rule_texts(listing) == {4: "ip saddr { 10.0.0.1, 10.0.0.2, 10.0.0.3 } tcp dport 9 counter accept"}
    # Without the listing a rule still has a line: its expression as JSON.
    bare = normalise(document("applied"))
    assert (
        bare[len(SETS) + 1]["line"]
        == '[{"match":{"left":{"meta":{"key":"iif"}},"op":"==","right":"lo"}},{"accept":null}]'
    )
    assert [e["key"] for e in bare] == [e["key"] for e in table("applied")]


@pytest.mark.parametrize(
    ("element", "text"),
    [
        ("10.0.0.1", "10.0.0.1"),
        (8000, "8000"),
        ({"prefix": {"addr": "10.0.0.0", "len": 8}}, "10.0.0.0/8"),
        ({"range": [1000, 2000]}, "1000-2000"),
        ({"concat": ["10.0.0.1", 22]}, "10.0.0.1 . 22"),
        (["10.0.0.1", "accept"], "10.0.0.1 : accept"),
        ({"elem": {"val": "10.0.0.1", "timeout": 30, "comment": "node1"}}, '10.0.0.1 timeout 30 comment "node1"'),
    ],
)
def test_set_elements_read_as_nft_writes_them(element, text):
    assert element_text(element) == text


def test_the_verdict_names_every_reason_to_load_again():
    applied, sha = table("applied"), file_sha256((NFT / "node1.nft").read_bytes())
    recorded = state_document("inet kimi", "/etc/nftables.d/kimi.nft", sha, applied)
    assert judge(sha, recorded, table("readded")) == []
    assert judge(sha, recorded, None) == ["table absent"]
    assert judge(sha, None, None) == ["table absent", "rules file changed (no record of an earlier apply)"]
    assert judge(sha, None, applied) == ["rules file changed (no record of an earlier apply)"]
    assert judge("0" * 64, recorded, applied) == ["rules file changed"]
    assert judge(sha, recorded, table("drifted"))[1] == ("rule missing: ip saddr @replica_peers accept (chain input)")


def test_the_record_round_trips_and_a_foreign_or_damaged_one_is_no_record():
    applied = table("applied")
    text = state_text(state_document("inet kimi", "/etc/nftables.d/kimi.nft", "ab" * 32, applied))
    loaded = load_state(text, "inet kimi")
    assert loaded["entries"] == applied and loaded["rules_sha256"] == "ab" * 32
    assert load_state(text, "inet other") is None
    assert load_state(text.replace('"format": 1', '"format": 2'), "inet kimi") is None
    assert load_state(text[: len(text) // 2], "inet kimi") is None
    assert load_state('{"format": 1, "table": "inet kimi", "entries": [{"kind": "rule"}]}', "inet kimi") is None


def test_the_diff_text_puts_each_chains_rules_under_it():
    text = table_text("inet kimi", table("applied"))
    lines = text.splitlines()
    assert lines[0] == "table inet kimi"
    assert lines[len(SETS) + 1] == "  chain input { type filter hook input priority 0; policy drop; }"
    assert lines[len(SETS) + 2 :] == [f"    {rule}" for rule in RULES]
    assert table_text("inet kimi", None) == ""
    assert rule_lines(table("applied"))[-1] == "meta l4proto tcp reject with tcp reset (chain input)"


def test_table_names_absent_tables_and_flushes():
    assert split_table("inet kimi") == ("inet", "kimi")
    for wrong in ("kimi", "inet", "inet kimi extra", "ipx kimi", "inet 9kimi"):
        with pytest.raises(ValueError, match="table must be '<family> <name>'"):
            split_table(wrong)
    assert table_absent((NFT / "absent.stderr.txt").read_text())
    assert not table_absent("Error: Could not process rule: Operation not permitted")
    assert flushes_ruleset("#!/usr/sbin/nft -f\nflush ruleset\ntable inet kimi {}\n")
    assert flushes_ruleset("  flush   ruleset\n")
    assert not flushes_ruleset((NFT / "node1.nft").read_text())
    assert not flushes_ruleset("# never flush ruleset here\nflush table inet kimi\n")
