#!/usr/bin/python
"""Ansible module: write one report file on the controller through the one report writer (kimi_report)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kimi_report_file
short_description: Write one report file on the controller, atomically, never as a change
description:
  - Writes I(json) (a mapping or a list, as sorted JSON with an indent of 2 and a final newline) or I(text) (as
    given) to I(path), through the report writer every check shares (plugins/module_utils/kimi_report.py) - a
    temporary file beside I(path), flushed, then renamed over it, so a reader sees the old report or the new
    one, never half of one. The directory is created when missing.
  - For the reports that have no module of their own (plan.json, serve.json, nccl_tests.json and
    nccl_tests.log); the checks that do (M(kimi_preflight), M(kimi_parity), M(kimi_drift_report),
    M(kimi_verify_report)) write theirs through the same writer.
  - A report is output on the controller, not managed state, so the module never reports a change; a file that
    already holds these bytes is left alone.
options:
  path:
    description: The report file on the controller.
    type: path
    required: true
  json:
    description:
      - The report as a value (a mapping or a list), written as JSON with sorted keys.
      - Give the value itself, not its C(to_json) text. Exactly one of I(json) and I(text).
    type: raw
  text:
    description: The report as text, written as given (say the final newline yourself).
    type: str
notes:
  - Runs on the controller (C(delegate_to localhost), C(become false)).
author:
  - Kimi K2 deployment collection
extends_documentation_fragment:
  - kimi.k2.attributes
attributes:
  check_mode:
    support: full
    details: >-
      In check mode nothing is written and no directory is made (a check-mode run such as drift's leaves the
      controller as it found it); the result says so with C(written=false).
  diff_mode:
    support: none
    details: A report is output; its content is in the file, not in a diff.
"""

EXAMPLES = r"""
- name: Save the plan as JSON on the controller
  kimi_report_file:
    path: "{{ kimi_report_dir }}/plan.json"
    json: "{{ kimi_plan_result.plan }}"
  delegate_to: localhost
  run_once: true

- name: Save the raw output on the controller
  kimi_report_file:
    path: "{{ kimi_report_dir }}/nccl_tests.log"
    text: "{{ nccl_tests_run.stdout }}\n"
  delegate_to: localhost
  become: false
  run_once: true
"""

RETURN = r"""
path:
  description: The report file.
  returned: always
  type: str
  sample: /srv/kimi/artifacts/plan.json
written:
  description: >-
    Whether the file was written; false when it already held these bytes, and in check mode.
  returned: always
  type: bool
"""

from pathlib import Path
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kimi.k2.plugins.module_utils.kimi_report import report_json, write_report_file


def report_text(value: Any, text: str | None) -> str:
    """The file's content: the text as given, or the value as JSON. A string given as JSON is refused, since
    writing it would quote the whole report into one JSON string."""
    if text is not None:
        return text
    if not isinstance(value, (dict, list)):
        raise ValueError(
            f"json must be a mapping or a list (got {type(value).__name__}): give the value itself, not its to_json "
            "text, or use text"
        )
    return report_json(value)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "json": {"type": "raw"},
            "text": {"type": "str"},
        },
        mutually_exclusive=[("json", "text")],
        required_one_of=[("json", "text")],
        supports_check_mode=True,
    )
    path = Path(module.params["path"])
    try:
        content = report_text(module.params["json"], module.params["text"])
    except ValueError as error:
        module.fail_json(msg=str(error), path=str(path), written=False)
    written = False
    if not module.check_mode:
        try:
            written = write_report_file(path, content)
        except OSError as error:
            module.fail_json(msg=f"could not write the report {path}: {error}", path=str(path), written=False)
    # A report is output on the controller, not managed state: never a change (a second converge stays at 0).
    module.exit_json(changed=False, path=str(path), written=written)


if __name__ == "__main__":
    main()
