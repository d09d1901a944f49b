"""One nftables table as kimi_nftables compares it: the live table (`nft -j list table`), normalised into a form
that compares equal across reloads and reboots, one human-readable line per object and per rule, and what
changed between the table recorded after the last apply and the table loaded now.

`nft -j` numbers every table, set, chain and rule with a `handle` the kernel assigns afresh on each load, and
counters count; neither is the rules' meaning, so both are dropped. Set elements come back in the kernel's
order, so they are sorted. Rule order within a chain is meaning (the first verdict wins), so rules stay in
order. The human-readable line of a rule is nft's own text of it (`nft -a list table` ends each rule with
`# handle N`, which pairs the text with the JSON); an object's line is written from its JSON.

Stdlib only: plugins/modules/kimi_nftables.py runs it on the node, the unit tests import it directly.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

FAMILIES = ("ip", "ip6", "inet", "arp", "bridge", "netdev")
STATE_FORMAT = 1
# Keys that change on every load or with traffic, never with the rules.
VOLATILE_KEYS = frozenset({"handle", "expires"})
VOLATILE_COUNTS = {"counter": frozenset({"packets", "bytes"}), "quota": frozenset({"used"})}
# Keys that only repeat which table an object is in.
WHERE_KEYS = frozenset({"family", "table"})
# `nft -a list` text: a rule is one line ending with its handle; a block (set, chain) opens with `{ # handle N`.
HANDLE_LINE = re.compile(r"^\s*(?P<text>.*?\S)\s+# handle (?P<handle>\d+)\s*$")
# Traffic counts in nft's text of a rule (`counter packets 3 bytes 180`): left out of the line, as of the key.
COUNTS = re.compile(r"\b(counter|quota)((?: over| until)? \d+ \w+)? (?:packets \d+ bytes \d+|used \d+ \w+)")
FLUSH_RULESET = re.compile(r"^[ \t]*flush[ \t]+ruleset\b", re.MULTILINE)
ABSENT = "No such file or directory"


def split_table(table: str) -> tuple[str, str]:
    """('inet', 'kimi') from 'inet kimi'; ValueError naming what is wrong."""
    parts = table.split()
    if len(parts) != 2 or parts[0] not in FAMILIES or not re.fullmatch(r"[A-Za-z_][\w.-]*", parts[1]):
        raise ValueError(f"table must be '<family> <name>' with a family of {', '.join(FAMILIES)} (got {table!r})")
    return parts[0], parts[1]


def file_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def flushes_ruleset(text: str) -> bool:
    """Whether a rules file would empty every table of the host (`flush ruleset`), not only its own."""
    return FLUSH_RULESET.search(text) is not None


def table_absent(stderr: str) -> bool:
    """Whether `nft list table` failed because the table is not loaded (rather than for another reason)."""
    return ABSENT in stderr


# ---------------------------------------------------------------------------------------------------------
# Normalising
# ---------------------------------------------------------------------------------------------------------


def _stable(value: Any) -> Any:
    """The value without handles, expiry times and traffic counts, at any depth."""
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if key in VOLATILE_KEYS:
                continue
            if key in VOLATILE_COUNTS and isinstance(item, Mapping):
                item = {k: v for k, v in item.items() if k not in VOLATILE_COUNTS[key]}
            out[key] = _stable(item)
        return out
    if isinstance(value, list):
        return [_stable(item) for item in value]
    return value


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def rule_texts(listing: str) -> dict[int, str]:
    """handle -> nft's text of that rule, from `nft -a list table` output. nft wraps a long list of elements
    after a comma; such lines are joined to the line that ends with the handle."""
    found: dict[int, str] = {}
    pending: list[str] = []
    for line in listing.splitlines():
        match = HANDLE_LINE.match(line)
        if match and match.group("text").endswith("{"):
            pending = []
        elif match:
            text = " ".join([*pending, match.group("text")])
            found[int(match.group("handle"))] = COUNTS.sub(lambda m: m.group(1) + (m.group(2) or ""), text)
            pending = []
        elif line.strip().endswith(","):
            pending.append(line.strip())
        else:
            pending = []
    return found


def element_text(element: Any) -> str:
    """One set element as nft writes it (10.0.0.1, 10.0.0.0/8, 1000-2000, 10.0.0.1 comment "node1")."""
    if isinstance(element, Mapping):
        if "elem" in element and isinstance(element["elem"], Mapping):
            inner = element["elem"]
            text = element_text(inner.get("val"))
            extras = [f"{k} {inner[k]}" for k in ("timeout",) if k in inner]
            if "comment" in inner:
                extras.append(f'comment "{inner["comment"]}"')
            return " ".join([text, *extras])
        if "prefix" in element and isinstance(element["prefix"], Mapping):
            return f"{element_text(element['prefix'].get('addr'))}/{element['prefix'].get('len')}"
        if "range" in element and isinstance(element["range"], list):
            return "-".join(element_text(item) for item in element["range"])
        if "concat" in element and isinstance(element["concat"], list):
            return " . ".join(element_text(item) for item in element["concat"])
        return _key(element)
    if isinstance(element, list):  # a map's [key, value]
        return " : ".join(element_text(item) for item in element)
    return str(element)


def element_order(element: Any) -> tuple[int, int, str]:
    """Numbers (ports) in numeric order, then addresses in address order, then anything else by its text."""
    inner = element.get("elem") if isinstance(element, Mapping) else None
    value = inner.get("val") if isinstance(inner, Mapping) else element
    if isinstance(value, int) and not isinstance(value, bool):
        return (0, value, _key(element))
    if isinstance(value, str):
        try:
            return (1, int(ipaddress.ip_address(value)), _key(element))
        except ValueError:
            pass
    return (2, 0, element_text(element) + _key(element))


def _type_text(value: Any) -> str:
    return " . ".join(str(v) for v in value) if isinstance(value, list) else str(value)


def set_line(kind: str, body: Mapping[str, Any]) -> str:
    parts = [f"type {_type_text(body.get('type'))}"]
    if "map" in body:
        parts[0] += f" : {_type_text(body['map'])}"
    for name, value in body.items():
        if name in {"name", "type", "map", "elem"} | WHERE_KEYS | VOLATILE_KEYS:
            continue
        shown = ", ".join(str(v) for v in value) if isinstance(value, list) else value
        parts.append(f"{name} {shown}")
    elements = body.get("elem")
    if elements:
        parts.append("elements = { " + ", ".join(element_text(e) for e in elements) + " }")
    return f"{kind} {body.get('name')} {{ " + "; ".join(parts) + " }"


def chain_line(body: Mapping[str, Any]) -> str:
    if "hook" not in body:
        return f"chain {body.get('name')} {{ }}"
    device = f" device {body['dev']}" if "dev" in body else ""
    text = f"type {body.get('type')} hook {body.get('hook')}{device} priority {body.get('prio')};"
    if "policy" in body:
        text += f" policy {body['policy']};"
    return f"chain {body.get('name')} {{ {text} }}"


def _object_line(kind: str, body: Mapping[str, Any]) -> str:
    if kind in ("set", "map"):
        return set_line(kind, body)
    if kind == "chain":
        return chain_line(body)
    rest = {k: v for k, v in body.items() if k not in {"name"} | WHERE_KEYS}
    return f"{kind} {body.get('name')} {_key(rest)}"


def normalise(document: Mapping[str, Any], listing: str = "") -> list[dict[str, str]]:
    """The table of one `nft -j list table` document as entries in nft's order, each
    {kind, name, key, line}: name is the object's name, or a rule's chain; key compares (canonical JSON
    without handles and counts); line is for people. `listing` (`nft -a list table` of the same table) gives
    each rule nft's own text; without it a rule's line is its JSON."""
    texts = rule_texts(listing)
    entries = []
    for item in document.get("nftables", []):
        if not isinstance(item, Mapping) or len(item) != 1:
            continue
        ((kind, body),) = item.items()
        if kind in ("metainfo", "table") or not isinstance(body, Mapping):
            continue
        stable = {k: v for k, v in _stable(body).items() if k not in WHERE_KEYS}
        if kind == "rule":
            line = texts.get(body.get("handle"), _key(stable.get("expr")))
            entries.append({"kind": "rule", "name": str(body.get("chain")), "key": _key(stable), "line": line})
            continue
        if kind in ("set", "map") and isinstance(stable.get("elem"), list):
            stable["elem"] = sorted(stable["elem"], key=element_order)
        entries.append(
            {"kind": kind, "name": str(body.get("name")), "key": _key(stable), "line": _object_line(kind, stable)}
        )
    return entries


def table_text(table: str, entries: Sequence[Mapping[str, str]] | None) -> str:
    """The table for a --diff: its objects, then each chain with its rules in order under it."""
    if entries is None:
        return ""
    lines = [f"table {table}"]
    lines += [f"  {e['line']}" for e in entries if e["kind"] not in ("chain", "rule")]
    chains = [e for e in entries if e["kind"] == "chain"]
    for chain in chains:
        lines.append(f"  {chain['line']}")
        lines += [f"    {e['line']}" for e in entries if e["kind"] == "rule" and e["name"] == chain["name"]]
    orphans = [e for e in entries if e["kind"] == "rule" and e["name"] not in {c["name"] for c in chains}]
    lines += [f"  (chain {e['name']}) {e['line']}" for e in orphans]
    return "\n".join(lines) + "\n"


def rule_lines(entries: Iterable[Mapping[str, str]]) -> list[str]:
    """One line per object and rule, rules named with their chain (the module's `rules` result)."""
    return [f"{e['line']} (chain {e['name']})" if e["kind"] == "rule" else e["line"] for e in entries]


# ---------------------------------------------------------------------------------------------------------
# Comparing
# ---------------------------------------------------------------------------------------------------------


def compare(recorded: Sequence[Mapping[str, str]], live: Sequence[Mapping[str, str]]) -> list[str]:
    """What differs between the table recorded after the last apply and the live one, one line each:
    '<kind> missing: ...', '<kind> added by hand: ...', '<kind> changed by hand: ...', 'rule missing: ...
    (chain c)', 'rule added by hand: ... (chain c)', 'rules reordered by hand (chain c)'."""
    found: list[str] = []
    before = {(e["kind"], e["name"]): e for e in recorded if e["kind"] != "rule"}
    now = {(e["kind"], e["name"]): e for e in live if e["kind"] != "rule"}
    for where, entry in before.items():
        if where not in now:
            found.append(f"{entry['kind']} missing: {entry['line']}")
        elif now[where]["key"] != entry["key"]:
            found.append(f"{entry['kind']} changed by hand: {_change(entry, now[where])}")
    found += [f"{e['kind']} added by hand: {e['line']}" for where, e in now.items() if where not in before]
    chains = list(dict.fromkeys(e["name"] for e in [*recorded, *live] if e["kind"] == "rule"))
    for chain in chains:
        old = [e for e in recorded if e["kind"] == "rule" and e["name"] == chain]
        new = [e for e in live if e["kind"] == "rule" and e["name"] == chain]
        gone = Counter(e["key"] for e in old) - Counter(e["key"] for e in new)
        came = Counter(e["key"] for e in new) - Counter(e["key"] for e in old)
        for entry in old:
            if gone[entry["key"]] > 0:
                gone[entry["key"]] -= 1
                found.append(f"rule missing: {entry['line']} (chain {chain})")
        for entry in new:
            if came[entry["key"]] > 0:
                came[entry["key"]] -= 1
                found.append(f"rule added by hand: {entry['line']} (chain {chain})")
        same_rules = Counter(e["key"] for e in old) == Counter(e["key"] for e in new)
        if same_rules and [e["key"] for e in old] != [e["key"] for e in new]:
            found.append(f"rules reordered by hand (chain {chain})")
    return found


def _change(recorded: Mapping[str, str], live: Mapping[str, str]) -> str:
    """How one object differs: a set's elements added and removed when only they changed, else both lines."""
    old, new = json.loads(recorded["key"]), json.loads(live["key"])
    if isinstance(old, dict) and isinstance(new, dict) and "elem" in old.keys() | new.keys():
        rest_equal = {k: v for k, v in old.items() if k != "elem"} == {k: v for k, v in new.items() if k != "elem"}
        if rest_equal:
            before = {element_text(e) for e in old.get("elem") or []}
            after = {element_text(e) for e in new.get("elem") or []}
            parts = [f"element {e} added" for e in sorted(after - before)]
            parts += [f"element {e} removed" for e in sorted(before - after)]
            return f"{recorded['name']}: " + "; ".join(parts)
    return f"{live['line']} (recorded: {recorded['line']})"


def judge(sha256: str, recorded: Mapping[str, Any] | None, live: Sequence[Mapping[str, str]] | None) -> list[str]:
    """Every reason to load the rules file again (none: the table is as the last apply left it):
    'table absent', 'rules file changed' and what compare() finds between the recorded and the live table."""
    found = []
    if live is None:
        found.append("table absent")
    if recorded is None:
        found.append("rules file changed (no record of an earlier apply)")
    elif recorded.get("rules_sha256") != sha256:
        found.append("rules file changed")
    if recorded is not None and live is not None:
        found += compare(recorded.get("entries") or [], live)
    return found


# ---------------------------------------------------------------------------------------------------------
# The record of the last apply
# ---------------------------------------------------------------------------------------------------------


def state_document(table: str, path: str, sha256: str, entries: Sequence[Mapping[str, str]]) -> dict[str, Any]:
    return {"format": STATE_FORMAT, "table": table, "path": path, "rules_sha256": sha256, "entries": list(entries)}


def state_text(document: Mapping[str, Any]) -> str:
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


def load_state(text: str, table: str) -> dict[str, Any] | None:
    """The recorded apply of this table, or None when the text is not one (unreadable, another format, another
    table): the module then treats the table as never applied and applies it again."""
    try:
        document = json.loads(text)
    except ValueError:
        return None
    if not isinstance(document, dict) or document.get("format") != STATE_FORMAT or document.get("table") != table:
        return None
    entries = document.get("entries")
    wanted = {"kind", "name", "key", "line"}
    if not isinstance(entries, list) or not all(isinstance(e, dict) and wanted <= e.keys() for e in entries):
        return None
    return document
