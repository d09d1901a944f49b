#!/usr/bin/python
"""Ansible module: the drift report (JSON and Markdown) from what drift.yml gathered, and its verdict."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kimi_drift_report
short_description: Write the cluster's drift report and say whether anything drifted
description:
  - Runs once, on the controller, after playbooks/drift.yml gathered everything. It does not contact the nodes.
  - Reads the JSON lines the kimi_drift_changes callback wrote during the check-mode converge (every change it
    would make, with its diff), and turns them, kimi_parity's result, each node's checkpoint marker, the
    stat of the files it records (and the sample hashed), the state of its vLLM units and rank 0's /health
    answer into findings per host, and sums them up per serving replica.
  - Writes C(drift-<stamp>.json) and C(drift-<stamp>.md) into I(report_dir), copies them to
    C(drift-latest.json) and C(drift-latest.md), and keeps the newest I(keep) timestamped reports (with
    their C(.converge.jsonl) records).
  - The reports are output, not managed state, so they are written in check mode as well and the module
    never reports a change.
  - It does not fail on drift; it returns C(drifted) and one message per finding, and the play decides.
options:
  hosts:
    description: The nodes in node order (rank 0 first); findings and table rows follow it.
    type: list
    elements: str
    required: true
  ranks:
    description: Host to node rank (decides which vLLM unit a node must run).
    type: dict
    default: {}
  replicas:
    description:
      - The serving replicas, replica name to its hosts, as C(groups | kimi.k2.replicas) gives them. The report
        says per replica which hosts drifted and how many findings it has; the Markdown groups the hosts'
        findings under a heading per replica and the table names each host's replica, when there are several.
      - A host of I(hosts) in none of them is reported as in no replica. Not given - every host is the one
        replica C(default).
    type: dict
  layout:
    description: The serve layout (mp, ray, dp_ep, single); with C(ray) the other ranks run no vLLM unit.
    type: str
    default: mp
  changes_file:
    description: The callback's JSON-lines file from the check-mode converge. Absent means no record.
    type: path
  run_id:
    description: The id the converge's record must carry (so an older file is never read as this run's).
    type: str
    default: ""
  converge:
    description:
      - The converge command's outcome - rc, stdout_tail and stderr_tail (lists of lines), error (the
        command task itself failed, e.g. it timed out) and skipped (the converge was not run).
    type: dict
    default: {}
  parity:
    description: kimi_parity's result (with fail_on_mismatch false).
    type: dict
  nodes:
    description:
      - Host to what was read there - unreachable (bool) and msg, stack_error (why kimi_stack_facts failed),
        marker (the slurp result of the checkpoint marker), checkpoint_files (kimi_checkpoint_info -
        the recorded files whose size, mtime or inode changed, and the rotating sample hashed),
        units (the result of systemctl show for the vLLM units), health (the uri result, rank 0).
    type: dict
    default: {}
  checkpoint:
    description: The pinned checkpoint - repo_id, revision, include, exclude, allow_branch, marker_path.
    type: dict
    default: {}
  checks:
    description: Which checks ran (each true when left out).
    type: dict
    default: {}
    suboptions:
      converge:
        description: The check-mode converge ran (its record is read).
        type: bool
        default: true
      checkpoint:
        description: Each node's checkpoint marker and files were read.
        type: bool
        default: true
      service:
        description: Each node's vLLM units were read.
        type: bool
        default: true
      health:
        description: Rank 0's /health was asked.
        type: bool
        default: true
  problems:
    description: Things drift could not establish (e.g. the pin set did not resolve); each is a finding.
    type: list
    elements: str
    default: []
  ignore:
    description: Python regular expressions; a finding whose "<kind> <host> <title>" matches one is not drift.
    type: list
    elements: str
    default: []
  context:
    description: Shown in the report's header (inventory sources, pins).
    type: dict
    default: {}
  report_dir:
    description: The controller directory the reports go to (created if missing).
    type: path
    required: true
  stamp:
    description: The run's UTC timestamp (YYYYMMDDTHHMMSSZ); it names the report files.
    type: str
    required: true
  keep:
    description: Timestamped reports kept in report_dir (older ones are removed); 0 keeps all.
    type: int
    default: 30
notes:
  - Runs on the controller (C(delegate_to localhost), C(run_once)).
author:
  - Kimi K2 deployment collection
extends_documentation_fragment:
  - kimi.k2.attributes
  - kimi.k2.attributes.writes_reports
"""

EXAMPLES = r"""
- name: Write the drift report
  kimi_drift_report:
    hosts: "{{ groups.kimi_nodes }}"
    ranks: {node1: 0, node2: 1}
    replicas: "{{ groups | kimi.k2.replicas }}"
    changes_file: "{{ kimi_report_dir }}/drift-20260101T000000Z.converge.jsonl"
    run_id: 20260101T000000Z-1234
    converge: {rc: 0, stdout_tail: [], stderr_tail: []}
    parity: "{{ drift_parity }}"
    report_dir: "{{ kimi_report_dir }}"
    stamp: 20260101T000000Z
  delegate_to: localhost
  run_once: true
  register: drift_report
"""

RETURN = r"""
drifted:
  description: Whether anything drifted (any finding not matched by I(ignore)).
  returned: always
  type: bool
summary:
  description: hosts, hosts_drifted, replicas (how many), replicas_drifted (their names), findings, by_kind, ignored.
  returned: always
  type: dict
replicas:
  description: >-
    Per replica, sorted by name - name, hosts, drifted, hosts_drifted, findings (its hosts' finding count) and
    by_kind; hosts in no replica last, as an entry whose name is null.
  returned: always
  type: list
  elements: dict
  sample: [{"name": "a", "hosts": ["node1"], "drifted": false, "hosts_drifted": [], "findings": 0, "by_kind": {}}]
messages:
  description: >-
    One line per finding, C(<host>: <kind>: <title>) (C(cluster) for the converge run itself).
  returned: always
  type: list
  elements: str
  sample: ["node2: edited: edited by hand: /etc/kimi/nccl.env (environment file)"]
table:
  description: The short per-host table (a column per check, ! where it drifted) with the verdict above it.
  returned: always
  type: str
report_paths:
  description: json, markdown, latest_json, latest_markdown, changes (the converge's record).
  returned: always
  type: dict
"""

import re
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kimi.k2.plugins.module_utils.kimi_drift_record import parse_changes
from ansible_collections.kimi.k2.plugins.module_utils.kimi_drift_render import (
    render_markdown,
    render_table,
    report_json,
)
from ansible_collections.kimi.k2.plugins.module_utils.kimi_drift_rules import build_report
from ansible_collections.kimi.k2.plugins.module_utils.kimi_replicas import replica_by_host
from ansible_collections.kimi.k2.plugins.module_utils.kimi_report import write_report_files

STAMP = re.compile(r"^\d{8}T\d{6}Z$")
STAMPED = re.compile(r"^drift-(\d{8}T\d{6}Z)(\.json|\.md|\.converge\.jsonl)$")


def prune(directory: Path, keep: int) -> list[str]:
    """Remove the timestamped files of all but the newest `keep` runs (the latest copies stay)."""
    if keep <= 0:
        return []
    stamps = sorted({m.group(1) for p in directory.iterdir() if (m := STAMPED.match(p.name))}, reverse=True)
    old = set(stamps[keep:])
    removed = []
    for path in sorted(directory.iterdir()):
        match = STAMPED.match(path.name)
        if match and match.group(1) in old:
            path.unlink()
            removed.append(path.name)
    return removed


# Which checks ran; build_report's own default for each is true too.
CHECKS_OPTIONS = {name: {"type": "bool", "default": True} for name in ("converge", "checkpoint", "service", "health")}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "hosts": {"type": "list", "elements": "str", "required": True},
            # Free-form: keyed by inventory hostname or replica name.
            "ranks": {"type": "dict", "default": {}},
            "replicas": {"type": "dict"},
            "layout": {"type": "str", "default": "mp"},
            "changes_file": {"type": "path"},
            "run_id": {"type": "str", "default": ""},
            # Left as given: `converge` may be {} (no converge: falsy) and `checkpoint` is read with .get(), where
            # suboptions would fill every key left out with None; `parity` is another module's result and `nodes`
            # is keyed by hostname. build_report judges their shape.
            "converge": {"type": "dict", "default": {}},
            "parity": {"type": "dict"},
            "nodes": {"type": "dict", "default": {}},
            "checkpoint": {"type": "dict", "default": {}},
            "checks": {"type": "dict", "default": {}, "options": CHECKS_OPTIONS},
            "problems": {"type": "list", "elements": "str", "default": []},
            "ignore": {"type": "list", "elements": "str", "default": []},
            # Shown in the report's header as given (free-form).
            "context": {"type": "dict", "default": {}},
            "report_dir": {"type": "path", "required": True},
            "stamp": {"type": "str", "required": True},
            "keep": {"type": "int", "default": 30},
        },
        supports_check_mode=True,
    )
    params = module.params
    if not STAMP.match(params["stamp"]):
        module.fail_json(msg=f"stamp must look like 20260101T000000Z, got {params['stamp']!r}")
    for pattern in params["ignore"]:
        try:
            re.compile(pattern)
        except re.error as error:
            module.fail_json(msg=f"drift_ignore pattern {pattern!r} is not a regular expression: {error}")

    records, bad_lines = [], 0
    changes = Path(params["changes_file"]) if params["changes_file"] else None
    if changes is not None and changes.is_file():
        records, bad_lines = parse_changes(changes.read_text(encoding="utf-8", errors="replace"))
    try:
        ranks = {host: int(rank) for host, rank in params["ranks"].items()}
    except (TypeError, ValueError) as error:
        module.fail_json(msg=f"ranks must map hosts to integers: {error}")
    replicas = params["replicas"]
    if replicas is not None and not all(isinstance(members, list) for members in replicas.values()):
        module.fail_json(msg="replicas must map each replica name to its list of hosts (groups | kimi.k2.replicas)")
    stamp = params["stamp"]
    report = build_report(
        hosts=params["hosts"],
        ranks=ranks,
        replica_of=None if replicas is None else replica_by_host(replicas),
        layout=params["layout"],
        records=records,
        bad_lines=bad_lines,
        run=params["converge"] or None,
        run_id=params["run_id"],
        parity=params["parity"],
        nodes=params["nodes"],
        checkpoint=params["checkpoint"],
        checks={key: bool(value) for key, value in params["checks"].items()},
        problems=params["problems"],
        ignore=params["ignore"],
        generated_at=f"{stamp[0:4]}-{stamp[4:6]}-{stamp[6:8]}T{stamp[9:11]}:{stamp[11:13]}:{stamp[13:15]}Z",
        context=params["context"],
    )
    table = render_table(report)
    directory = Path(params["report_dir"])
    paths = {
        "json": directory / f"drift-{stamp}.json",
        "markdown": directory / f"drift-{stamp}.md",
        "latest_json": directory / "drift-latest.json",
        "latest_markdown": directory / "drift-latest.md",
    }
    # The reports are what this play is for: written in check mode too, and never a change to managed state.
    try:
        contents = {".json": report_json(report), ".md": render_markdown(report)}
        write_report_files(directory, f"drift-{stamp}", contents, "drift-latest")
        removed = prune(directory, params["keep"])
    except OSError as error:
        module.fail_json(msg=f"could not write the drift report in {directory}: {error}", table=table)
    result_paths = {key: str(path) for key, path in paths.items()}
    if changes is not None:
        result_paths["changes"] = str(changes)
    module.exit_json(
        changed=False,
        drifted=report["drifted"],
        summary=report["summary"],
        replicas=report["replicas"],
        messages=report["messages"],
        table=table,
        report_paths=result_paths,
        pruned=removed,
    )


if __name__ == "__main__":
    main()
