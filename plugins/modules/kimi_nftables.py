#!/usr/bin/python
"""Ansible module: keep one nftables table equal to a rules file, and say what differs when it is not."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kimi_nftables
short_description: Keep one nftables table equal to its rules file, reporting rules changed by hand
description:
  - Loads I(path) with C(nft -f) when the table I(table) may differ from it, and records what it loaded; touches
    no other table. I(path) must replace the table as a whole when loaded (C(table inet kimi),
    C(delete table inet kimi), then the table's definition), so a load is one atomic transaction; a file with
    C(flush ruleset) is refused, since loading it would empty every table of the host.
  - The live table is read with C(nft -j list table) and normalised (plugins/module_utils/kimi_nftables.py),
    so handles, expiry times and traffic counts are dropped, set elements sorted, rules kept in their order, and
    each rule carries nft's own text of it.
  - It changes the table when the table is not loaded, when the rules file is not the one recorded at the last
    apply (its sha256), or when the live table differs from the table recorded after the last apply (a rule
    deleted or added by hand with C(nft), a set edited). After a load it reads the table again and records it
    with the file's sha256 in I(state_path).
  - In check mode nothing is loaded or recorded and the result says what would change, so a check-mode run
    (the drift playbook's) reports a rule removed by hand as a change.
options:
  path:
    description: The rules file (for example /etc/nftables.d/kimi.nft), as C(nft -f) loads it.
    type: path
    required: true
  state_path:
    description:
      - Where the table recorded after the last apply (normalised) and the rules file's sha256 are kept, as
        JSON. Its directory is created (0700) when missing. Without it the next run applies again.
    type: path
    default: /var/lib/kimi/firewall/kimi-table.json
  table:
    description: The table the rules file defines, as C(<family> <name>).
    type: str
    default: inet kimi
notes:
  - Needs C(nft) (Debian's nftables package) and root (C(become)).
  - A table changed by hand is put back by loading the file again; nothing else of the host's ruleset is read
    or changed.
author:
  - Kimi K2 deployment collection
extends_documentation_fragment:
  - kimi.k2.attributes
attributes:
  check_mode:
    support: full
    details: >-
      Reads the table, the file and the record only; the result's C(changed) and C(differences) say whether and
      why a real run would load the file.
  diff_mode:
    support: full
    details: >-
      Before: the live table, one line per set, chain and rule. After: the table after the load (in check mode
      the recorded table when only hand edits are undone, else the rules file's text).
"""

EXAMPLES = r"""
- name: Keep table inet kimi equal to its rules file
  kimi_nftables:
    path: /etc/nftables.d/kimi.nft

- name: Ask whether the table drifted, changing nothing
  kimi_nftables:
    path: /etc/nftables.d/kimi.nft
    state_path: /var/lib/kimi/firewall/kimi-table.json
    table: inet kimi
  check_mode: true
  register: kimi_firewall_drift
"""

RETURN = r"""
msg:
  description: The differences joined with "; " (what drift's report shows), or that the table is as the file says.
  returned: always
  type: str
  sample: "rule missing: tcp dport @group_ports reject with tcp reset (chain input)"
differences:
  description:
    - Why the table is (or would be) loaded again, one line each; empty when nothing changes.
    - "C(table absent); C(rules file changed), with C(no record of an earlier apply) after it on a first run."
    - >-
      What was changed by hand since the last apply, for example C(rule missing: <rule> [chain]),
      C(rule added by hand: <rule> [chain]), C(rules reordered by hand [chain]), C(set changed by hand: <set>:
      element <e> added), C(chain changed by hand: ...) or C(<kind> missing: ...), where [chain] names the rule's
      chain as "(chain input)".
  returned: always
  type: list
  elements: str
  sample: ["rule missing: tcp dport @group_ports ip saddr @group_peers accept (chain input)"]
rules:
  description: The table as loaded when the module ends, one line per set, chain and rule (rules name their chain).
  returned: always
  type: list
  elements: str
  sample: ['chain input { type filter hook input priority 0; policy accept; }', 'iif "lo" accept (chain input)']
rules_sha256:
  description: The sha256 of the rules file (empty when check mode found no file).
  returned: always
  type: str
table:
  description: The table, as C(<family> <name>).
  returned: always
  type: str
  sample: inet kimi
"""

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kimi.k2.plugins.module_utils.kimi_nftables import (
    file_sha256,
    flushes_ruleset,
    judge,
    load_state,
    normalise,
    rule_lines,
    split_table,
    state_document,
    state_text,
    table_absent,
    table_text,
)


def list_table(module: AnsibleModule, nft: str, option: str, family: str, name: str) -> str | None:
    """`nft <option> list table`'s output; None when the table is not loaded."""
    rc, out, err = module.run_command([nft, option, "list", "table", family, name])
    if rc == 0:
        return out
    if not table_absent(err):
        module.fail_json(msg=f"nft {option} list table {family} {name} failed (exit {rc}): {err.strip()}")
    return None


def read_table(module: AnsibleModule, nft: str, family: str, name: str) -> list[dict[str, str]] | None:
    """The live table, normalised; None when it is not loaded. The JSON form carries the structure, the text form
    (-a) nft's own wording of each rule, which is what a finding names."""
    document = list_table(module, nft, "-j", family, name)
    listing = list_table(module, nft, "-a", family, name) if document is not None else None
    if document is None or listing is None:
        return None
    try:
        return normalise(json.loads(document), listing)
    except ValueError as error:
        module.fail_json(msg=f"nft -j list table {family} {name} printed no JSON: {error}")
    return None  # not reached


def record(path: Path, document: dict[str, Any]) -> None:
    """Write the record beside itself and rename it over the old one (a reader sees one or the other)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "w") as stream:
            stream.write(state_text(document))
            stream.flush()
            os.fsync(stream.fileno())
        Path(temporary).chmod(0o600)
        Path(temporary).replace(path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "state_path": {"type": "path", "default": "/var/lib/kimi/firewall/kimi-table.json"},
            "table": {"type": "str", "default": "inet kimi"},
        },
        supports_check_mode=True,
    )
    path, state_path = Path(module.params["path"]), Path(module.params["state_path"])
    try:
        family, name = split_table(module.params["table"])
    except ValueError as error:
        module.fail_json(msg=str(error))
    table = f"{family} {name}"
    result: dict[str, Any] = {"changed": False, "table": table, "differences": [], "rules": [], "rules_sha256": ""}

    nft = module.get_bin_path("nft", opt_dirs=["/usr/sbin", "/sbin"])
    if nft is None:
        if not module.check_mode:
            module.fail_json(msg="nft is not installed (Debian's nftables package)", **result)
        # Check mode before the first run: the task installing nftables did not install it either.
        module.exit_json(**{**result, "changed": True, "differences": ["nft is not installed", "table absent"]})
    live = read_table(module, nft, family, name)
    if not path.is_file():
        if not module.check_mode:
            module.fail_json(msg=f"the rules file {path} does not exist", **result)
        # Check mode before the first run: the task writing the file did not write it either.
        differences = ["table absent"] if live is None else []
        differences.append(f"rules file {path} not written yet")
        result.update(changed=True, differences=differences, rules=rule_lines(live or []))
        module.exit_json(**result)
    content = path.read_bytes()
    text = content.decode("utf-8", errors="replace")
    if flushes_ruleset(text):
        module.fail_json(msg=f"{path} has 'flush ruleset': loading it would empty every table of the host", **result)
    sha256 = file_sha256(content)
    recorded = None
    if state_path.is_file():
        recorded = load_state(state_path.read_text(errors="replace"), table)

    differences = judge(sha256, recorded, live)
    before = table_text(table, live)
    after, after_header = before, f"table {table}"
    final = live
    if differences and not module.check_mode:
        rc, _, err = module.run_command([nft, "-f", str(path)])
        if rc != 0:
            module.fail_json(msg=f"nft -f {path} failed (exit {rc}): {err.strip()}", differences=differences)
        final = read_table(module, nft, family, name)
        if final is None:
            module.fail_json(msg=f"{path} loaded, but table {table} is not there: the file must define it")
        try:
            record(state_path, state_document(table, str(path), sha256, final))
        except OSError as error:
            module.fail_json(msg=f"loaded {path}, but could not record it in {state_path}: {error}")
        after = table_text(table, final)
    elif differences and recorded is not None and recorded.get("rules_sha256") == sha256:
        after = table_text(table, recorded["entries"])  # check mode: loading undoes the hand edits
    elif differences:
        after, after_header = text, f"{path} (not loaded in check mode)"

    result.update(
        changed=bool(differences),
        differences=differences,
        # One line for reports (drift shows a changed task's msg): what differs from the recorded table.
        msg="; ".join(differences) if differences else f"table {table} is as {path} says",
        rules=rule_lines(final or []),
        rules_sha256=sha256,
        diff={"before": before, "after": after, "before_header": f"table {table}", "after_header": after_header},
    )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
