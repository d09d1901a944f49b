#!/usr/bin/python
"""Ansible module: a coding agent's multi-turn session through a router, and its prefix-cache hit rate."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kimi_prefix_probe
short_description: Send one multi-turn agent session through a router and report its prefix-cache hit rate
description:
  - Sends I(turns) completions to I(url)C(/v1/completions), one after the other, each carrying the same
    I(session_header) value and a prompt made of the previous prompt, the model's answer to it and new text, as a
    coding agent does. A router with session affinity keeps them on one replica, where vLLM serves the repeated
    prefix from its cache.
  - The hit rate is vLLM's own count in each answer (C(usage.prompt_tokens_details.cached_tokens), which vLLM
    gives with C(--enable-prompt-tokens-details)) over the prompt tokens of every turn after the first, so other
    traffic on the replica does not change it.
  - The session's name is new on every run and begins its first prompt, so no earlier run's cache matches it.
    Its text is generated (plugins/module_utils/kimi_prefix_probe.py); no dataset is read.
  - Returns the verdict as C(check) (pass at I(min_hit_rate) or above; skip when I(prefix_caching) is false).
    Fails only when I(fail_on_problem) is true and the check did not pass, or when the router does not answer
    200.
options:
  url:
    description: The router's root URL (https://address:port).
    type: str
    required: true
  api_key:
    description: A client key the router accepts (sent as a bearer token; never logged).
    type: str
    default: ""
  session_header:
    description: The header that names the session (the router's kimi_router_session_header).
    type: str
    required: true
  model:
    description: The served model name.
    type: str
    required: true
  turns:
    description: Requests in the session (at least 2; the first one has nothing of its own to meet).
    type: int
    default: 3
  first_words:
    description: Words of the first prompt (more than a few KV blocks, or there is little to cache).
    type: int
    default: 800
  new_words:
    description: Words each later turn adds after the answer.
    type: int
    default: 40
  max_tokens:
    description: Tokens per answer.
    type: int
    default: 16
  max_model_len:
    description: >-
      The served context (kimi_max_model_len): I(first_words) and I(new_words) shrink together so that the last
      turn fits, at two tokens per word. 0 - no limit.
    type: int
    default: 0
  min_hit_rate:
    description: The smallest share of the later turns' prompt tokens that must come from the cache (0 to 1).
    type: float
    default: 0.5
  prefix_caching:
    description: Whether the service runs with prefix caching (false - the check is skipped, nothing is sent).
    type: bool
    default: true
  ca_path:
    description: A CA bundle to check the router's certificate against (empty - the system's).
    type: path
  validate_certs:
    description: Check the router's certificate.
    type: bool
    default: true
  timeout:
    description: Seconds each request may take.
    type: int
    default: 120
  fail_on_problem:
    description: Fail when the check does not pass (false - return it in C(check) for the report).
    type: bool
    default: true
notes:
  - Generates I(turns) short answers on a replica; it changes no state, so it runs in check mode too.
author:
  - Kimi K2 deployment collection
extends_documentation_fragment:
  - kimi.k2.attributes
  - kimi.k2.attributes.reads_only
"""

EXAMPLES = r"""
- name: One agent session of three turns through the router
  kimi.k2.kimi_prefix_probe:
    url: https://198.18.0.11:8443
    api_key: "{{ kimi_router_api_keys | first }}"
    session_header: "{{ kimi_router_session_header }}"
    model: "{{ kimi_served_model_name }}"
    ca_path: /etc/ssl/certs/site-ca.pem
    fail_on_problem: false
  delegate_to: localhost
  register: probe
"""

RETURN = r"""
check:
  description: >-
    The report's check - name (C(prefix_cache) and the URL), status, detail, and data (hit_rate, and each turn's
    prompt_tokens, cached_tokens and seconds).
  returned: always
  type: dict
  sample:
    name: prefix_cache https://198.18.0.11:8443
    status: pass
    detail: "turns 2-3 of one session (its header kept): 1920 of 2105 prompt tokens from the prefix cache (91%; ...)"
    data: {hit_rate: 0.9121, turns: [{prompt_tokens: 913, cached_tokens: 0, seconds: 0.41}]}
hit_rate:
  description: Cached over prompt tokens of the turns after the first (null when skipped or not counted).
  returned: always
  type: float
session:
  description: The session name sent in I(session_header).
  returned: always
  type: str
"""

import json
import time
import uuid

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import fetch_url
from ansible_collections.kimi.k2.plugins.module_utils.kimi_prefix_probe import (
    ProbeAnswerError,
    run_session,
    unanswered,
    verdict,
    words_within,
)


class RouterAnswerError(Exception):
    """The router did not answer 200 with JSON."""


def _asker(module: AnsibleModule, session: str):
    params = module.params
    url = params["url"].rstrip("/") + "/v1/completions"
    headers = {"Content-Type": "application/json", params["session_header"]: session}
    if params["api_key"]:
        headers["Authorization"] = f"Bearer {params['api_key']}"

    def ask(prompt: str) -> tuple[dict, float]:
        body = {"model": params["model"], "prompt": prompt, "max_tokens": params["max_tokens"], "temperature": 0}
        started = time.monotonic()
        response, info = fetch_url(
            module,
            url,
            data=json.dumps(body),
            headers=headers,
            method="POST",
            timeout=params["timeout"],
            ca_path=params["ca_path"],
        )
        status = int(info.get("status", -1))
        if status != 200 or response is None:
            raise RouterAnswerError(f"POST {url}: {status if status > 0 else info.get('msg', 'no answer')}")
        try:
            answer = json.loads(response.read())
        except ValueError as error:
            raise RouterAnswerError(f"POST {url}: not JSON ({error})") from None
        return answer, round(time.monotonic() - started, 3)

    return ask


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "api_key": {"type": "str", "default": "", "no_log": True},
            "session_header": {"type": "str", "required": True},
            "model": {"type": "str", "required": True},
            "turns": {"type": "int", "default": 3},
            "first_words": {"type": "int", "default": 800},
            "new_words": {"type": "int", "default": 40},
            "max_tokens": {"type": "int", "default": 16},
            "max_model_len": {"type": "int", "default": 0},
            "min_hit_rate": {"type": "float", "default": 0.5},
            "prefix_caching": {"type": "bool", "default": True},
            "ca_path": {"type": "path"},
            "validate_certs": {"type": "bool", "default": True},
            "timeout": {"type": "int", "default": 120},
            "fail_on_problem": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    params = module.params
    if params["turns"] < 2:
        module.fail_json(msg=f"turns is {params['turns']}: a session needs 2 or more (the first has nothing to meet)")
    if not 0 <= params["min_hit_rate"] <= 1:
        module.fail_json(msg=f"min_hit_rate is {params['min_hit_rate']}: a share, from 0 to 1")
    if not params["session_header"].strip():
        module.fail_json(msg="session_header is empty: the router keeps no session without it")
    session = f"kimi-verify-{uuid.uuid4().hex[:16]}"
    where = params["url"].rstrip("/")
    turns = []
    if params["prefix_caching"]:
        try:
            first_words, new_words = words_within(
                params["max_model_len"], params["turns"], params["first_words"], params["new_words"],
                params["max_tokens"],
            )  # fmt: skip
            turns = run_session(_asker(module, session), session, params["turns"], first_words, new_words)
        except (RouterAnswerError, ProbeAnswerError) as error:
            _finish(module, unanswered(where, str(error)), session)
    _finish(module, verdict(where, turns, params["min_hit_rate"], params["prefix_caching"]), session)


def _finish(module: AnsibleModule, check: dict, session: str) -> None:
    hit_rate = check["data"].get("hit_rate")
    if check["status"] == "fail" and module.params["fail_on_problem"]:
        module.fail_json(msg=check["detail"], check=check, hit_rate=hit_rate, session=session)
    module.exit_json(changed=False, check=check, hit_rate=hit_rate, session=session)


if __name__ == "__main__":
    main()
