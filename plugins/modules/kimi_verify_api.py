#!/usr/bin/python
"""Ansible module: the verify phase's API checks against rank 0 (health, model name, launch flags, a structured
tool call, reasoning split from the answer)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kimi_verify_api
short_description: Check that vLLM serves Kimi K2 with structured tool calls and the right parser flags
description:
  - Runs on node rank 0 (or anywhere that reaches I(base_url)) and runs every check, in this order, whatever
    the earlier ones returned, so that one run lists every problem.
  - C(health) - C(GET /health) answers 200 (vLLM answers once every rank has joined and the engine is up).
  - C(models) - C(GET /v1/models) lists I(served_model_name).
  - C(served_flags) - the rank-0 process's argv (I(served_argv), or read from C(/proc/<served_pid>/cmdline))
    carries C(--tool-call-parser) I(expected_tool_call_parser), C(--reasoning-parser)
    I(expected_reasoning_parser) (when not empty) and C(--enable-auto-tool-choice) (when
    I(expected_auto_tool_choice)). Both C(--flag value) and C(--flag=value) are read. Skipped when neither
    I(served_argv) nor I(served_pid) is given.
  - C(tool_call) - a chat completion offering two tools (C(get_weather), C(get_time)) with I(tool_choice) must
    come back with C(choices[0].message.tool_calls) naming an offered tool, with JSON-object arguments. A call
    returned as text (Kimi's C(<|tool_call_begin|>) markers, C(functions.NAME:0), a JSON name/arguments object)
    fails with "tool calls emitted as text" and the flags rank 0 needs; so does vLLM's HTTP 400 for C(auto)
    without C(--enable-auto-tool-choice)/C(--tool-call-parser).
  - C(reasoning) - when I(reasoning) is true, a chat completion must return non-empty C(reasoning_content)
    (or C(reasoning)) separate from C(content), and C(content) must not carry C(<think>) markers. Skipped with
    I(reasoning_skip_reason) otherwise.
  - With I(generate_skip_reason) set, C(tool_call) and C(reasoning) are skipped with that reason and nothing is
    generated (the verify role's no-op converge of a service that already passed a full verify).
  - Fails with one message listing every failed check unless I(fail_on_error) is false. Skipped checks do not
    fail.
  - Only reads (two small completions are generated); it changes nothing, so it runs in check mode too.
options:
  base_url:
    description: The server root, e.g. C(http://127.0.0.1:8000); a trailing C(/v1) is accepted.
    type: str
    required: true
  api_key:
    description: Bearer token when vLLM runs with C(--api-key).
    type: str
  served_model_name:
    description: The name vLLM serves the model under (C(--served-model-name)).
    type: str
    required: true
  tool_choice:
    description:
      - C(auto) (the default, and the only choice that goes through vLLM's tool-call parser, so the one that
        proves the launch flags), C(required), or the name of an offered function (C(get_weather) or
        C(get_time)). vLLM constrains C(required) and a named function with structured output, so those return
        C(tool_calls) even without the parser flags.
    type: str
    default: auto
  require_json_arguments:
    description: A tool call's arguments must parse as a JSON object. Set false only for models that cannot
      produce them (the lab's random weights).
    type: bool
    default: true
  reasoning:
    description: Run the reasoning check (thinking models - Kimi-K2-Thinking, Kimi-K2.5, Kimi-K2.6, Kimi-K2.7-Code).
    type: bool
    default: false
  reasoning_skip_reason:
    description: Why the reasoning check does not run; shown in the report.
    type: str
    default: ""
  reasoning_chat_template_kwargs:
    description: >-
      Passed as C(chat_template_kwargs) with the reasoning request, e.g. C({"thinking": true}) for a chat
      template that switches thinking on that way.
    type: dict
    default: {}
  served_argv:
    description: The rank-0 process's argv (e.g. C(/proc/PID/cmdline) split on NUL).
    type: list
    elements: str
  served_pid:
    description: PID of the rank-0 process (e.g. the unit's C(MainPID)); its argv is read from C(/proc) when
      I(served_argv) is not given. C(0) (a stopped unit) fails the check.
    type: int
  expected_tool_call_parser:
    description: The C(--tool-call-parser) value rank 0 must run with; empty skips that flag.
    type: str
    default: kimi_k2
  expected_reasoning_parser:
    description: The C(--reasoning-parser) value rank 0 must run with; empty (the default) skips that flag.
    type: str
    default: ""
  expected_auto_tool_choice:
    description: Rank 0 must run with C(--enable-auto-tool-choice).
    type: bool
    default: true
  max_tokens:
    description: max_tokens of the tool-call and reasoning requests (room for a thinking model to reason first).
    type: int
    default: 1024
  timeout:
    description: Seconds each request may take.
    type: float
    default: 120
  generate_skip_reason:
    description: When not empty, the checks that generate tokens (C(tool_call), C(reasoning)) are skipped with
      this reason.
    type: str
    default: ""
  fail_on_error:
    description: Fail when any check failed. With false, the result carries C(ok=false) and the checks.
    type: bool
    default: true
notes:
  - Stdlib only on the node (urllib); no third-party Python packages needed.
author:
  - Kimi K2 deployment collection
extends_documentation_fragment:
  - kimi.k2.attributes
  - kimi.k2.attributes.reads_only
"""

EXAMPLES = r"""
- name: Read the rank-0 unit's main PID
  ansible.builtin.command: systemctl show --property MainPID --value kimi-vllm.service
  register: rank0_pid
  changed_when: false

- name: Check the API on rank 0
  kimi_verify_api:
    base_url: "http://127.0.0.1:{{ kimi_api_port }}"
    served_model_name: kimi-k2
    served_pid: "{{ rank0_pid.stdout | int }}"
    expected_tool_call_parser: kimi_k2
    expected_reasoning_parser: "{{ kimi_reasoning_parser }}"
    reasoning: false
    reasoning_skip_reason: Kimi-K2-Instruct is not a thinking model
    fail_on_error: false
  register: verify_api
"""

RETURN = r"""
ok:
  description: No check failed (skipped checks do not count).
  returned: always
  type: bool
checks:
  description: One per check - name, status (pass, fail, skip), passed, skipped, detail, data (the evidence).
  returned: always
  type: list
  elements: dict
  sample:
    - name: tool_call
      status: fail
      passed: false
      skipped: false
      detail: >-
        tool calls emitted as text: tool_calls is empty and the call came back in the message text
        (<|tool_call_begin|>; functions.get_weather); rank 0 needs --enable-auto-tool-choice
        --tool-call-parser kimi_k2
      data: {finish_reason: stop}
served_argv:
  description: The argv the served_flags check read (from served_argv or /proc).
  returned: when served_argv or served_pid is given
  type: list
  elements: str
"""

from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kimi.k2.plugins.module_utils.kimi_verify import (
    ApiCheckOptions,
    argv_from_cmdline,
    failure_summary,
    run_api_checks,
)


def read_argv(pid: int) -> list[str]:
    """[] when the process is gone or unreadable: the served_flags check then fails with that."""
    try:
        return argv_from_cmdline(Path(f"/proc/{pid}/cmdline").read_bytes())
    except OSError:
        return []


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "base_url": {"type": "str", "required": True},
            "api_key": {"type": "str", "no_log": True},
            "served_model_name": {"type": "str", "required": True},
            "tool_choice": {"type": "str", "default": "auto"},
            "require_json_arguments": {"type": "bool", "default": True},
            "reasoning": {"type": "bool", "default": False},
            "reasoning_skip_reason": {"type": "str", "default": ""},
            # Free-form: passed to the chat template as given.
            "reasoning_chat_template_kwargs": {"type": "dict", "default": {}},
            "served_argv": {"type": "list", "elements": "str"},
            "served_pid": {"type": "int"},
            "expected_tool_call_parser": {"type": "str", "default": "kimi_k2"},
            "expected_reasoning_parser": {"type": "str", "default": ""},
            "expected_auto_tool_choice": {"type": "bool", "default": True},
            "max_tokens": {"type": "int", "default": 1024},
            "timeout": {"type": "float", "default": 120},
            "generate_skip_reason": {"type": "str", "default": ""},
            "fail_on_error": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    params = module.params
    argv = params["served_argv"]
    if argv is None and params["served_pid"] is not None:
        # MainPID is 0 for a stopped unit: /proc/0 does not exist, so the flags check fails rather than skips.
        argv = read_argv(params["served_pid"])
    options = ApiCheckOptions(
        base_url=params["base_url"],
        served_model_name=params["served_model_name"],
        api_key=params["api_key"],
        tool_choice=params["tool_choice"],
        require_json_arguments=params["require_json_arguments"],
        reasoning=params["reasoning"],
        reasoning_skip_reason=params["reasoning_skip_reason"],
        reasoning_chat_template_kwargs=params["reasoning_chat_template_kwargs"],
        served_argv=argv,
        expected_flags={
            "tool_call_parser": params["expected_tool_call_parser"],
            "reasoning_parser": params["expected_reasoning_parser"],
            "enable_auto_tool_choice": params["expected_auto_tool_choice"],
        },
        max_tokens=params["max_tokens"],
        timeout=params["timeout"],
        generate_skip_reason=params["generate_skip_reason"],
    )
    try:
        results = run_api_checks(options)
    except ValueError as error:  # a tool_choice that names no offered function
        module.fail_json(msg=str(error))
    checks = [result.as_dict() for result in results]
    ok = not any(result.is_failure for result in results)
    result = {"changed": False, "ok": ok, "checks": checks}
    if argv is not None:
        result["served_argv"] = argv
    if not ok and params["fail_on_error"]:
        module.fail_json(msg=failure_summary(results), **result)
    summary = ", ".join(f"{check['name']} {check['status']}" for check in checks)
    module.exit_json(msg=summary, **result)


if __name__ == "__main__":
    main()
