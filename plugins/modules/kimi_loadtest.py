#!/usr/bin/python
"""Ansible module: a bounded streamed load test against vLLM (TTFT, TPOT, E2E percentiles, throughput)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kimi_loadtest
short_description: Measure TTFT, TPOT and end-to-end latency of vLLM at a fixed concurrency
description:
  - Sends I(requests) streamed chat completions to C(/v1/chat/completions), at most I(concurrency) at a time
    (each worker sends its next request when its previous one ends). Every request asks for exactly
    I(max_tokens) tokens (C(ignore_eos) and C(min_tokens), vLLM's sampling extras), with
    C(stream_options.include_usage) so the server reports the token count.
  - Per request - TTFT (send to the first chunk carrying content or reasoning), E2E (send to C([DONE])), output
    tokens (the usage chunk, else one per text chunk), TPOT = (E2E - TTFT) / (output tokens - 1), or the error
    (HTTP status, timeout, connection refused, malformed stream).
  - Summary - ok, errors (by kind), not_sent, p50/p90/p99 (linear interpolation between closest ranks) of
    TTFT, TPOT and E2E in milliseconds over the successful requests, output tokens/s overall (all output
    tokens / wall time) and per request (mean of tokens / E2E).
  - No request is sent after I(time_budget) seconds; the rest count as C(not_sent). Requests in flight finish,
    so the module takes at most I(time_budget) + I(request_timeout) seconds.
  - A breach per threshold exceeded; fails when there is one and I(fail_on_breach) is true, still returning
    the summary, records and breaches. A test where every request failed is always a breach.
  - Check mode - the test still runs (it only sends inference requests and changes no state), unless
    I(skip_in_check_mode) is true; then it returns C(skipped=true) and nothing else.
options:
  base_url:
    description: The server root, e.g. C(http://127.0.0.1:8000); a trailing C(/v1) is accepted.
    type: str
    required: true
  api_key:
    description: Bearer token when vLLM runs with C(--api-key).
    type: str
  model:
    description: The served model name.
    type: str
    required: true
  requests:
    description: How many requests to send.
    type: int
    default: 32
  concurrency:
    description: Requests in flight at once; set it to the concurrency the SLO is for (e.g. C(--max-num-seqs)).
    type: int
    default: 8
  max_tokens:
    description: Output tokens per request (fixed with C(ignore_eos) and C(min_tokens)).
    type: int
    default: 256
  prompt:
    description: The user message of every request.
    type: str
  request_timeout:
    description: Seconds one request may take, from send to the end of its stream.
    type: float
    default: 120
  time_budget:
    description: Seconds after the start past which no new request is sent.
    type: float
    default: 600
  ttft_p99_ms:
    description: Limit on TTFT p99 in milliseconds; 0 or unset is no limit.
    type: float
  tpot_p99_ms:
    description: Limit on TPOT p99 in milliseconds; 0 or unset is no limit.
    type: float
  e2e_p99_ms:
    description: Limit on E2E p99 in milliseconds; 0 or unset is no limit.
    type: float
  max_error_rate:
    description: Highest share of sent requests that may fail (0.01 is 1%). Unset is no limit; 0 allows no error.
    type: float
  fail_on_breach:
    description: Fail when a threshold is breached.
    type: bool
    default: true
  skip_in_check_mode:
    description: Do not run the test in check mode.
    type: bool
    default: false
notes:
  - Stdlib only on the node (urllib and threads); no third-party Python packages needed.
author:
  - Kimi K2 deployment collection
extends_documentation_fragment:
  - kimi.k2.attributes
  - kimi.k2.attributes.reads_only
"""

EXAMPLES = r"""
- name: Load test rank 0 at the configured concurrency
  kimi_loadtest:
    base_url: "http://127.0.0.1:{{ kimi_api_port }}"
    model: kimi-k2
    requests: 64
    concurrency: "{{ vllm_serve_max_num_seqs }}"
    max_tokens: 256
    time_budget: 300
    ttft_p99_ms: 2000
    max_error_rate: 0
    fail_on_breach: false
  register: verify_load
"""

RETURN = r"""
summary:
  description: >-
    requests, concurrency, max_tokens, timeout_s, budget_s, sent, ok, errors, not_sent, error_rate (of those
    sent), errors_by_kind, short_outputs (ok requests with fewer than max_tokens tokens), wall_s, ttft_ms,
    tpot_ms and e2e_ms (each p50, p90, p99, mean, min, max, count), output_tokens, output_tokens_per_s,
    output_tokens_per_s_per_request.
  returned: unless skipped
  type: dict
records:
  description: >-
    One per request sent, in send order - index, started_s, ok, ttft_ms, e2e_ms, tpot_ms, output_tokens,
    tokens_from (usage or chunks), http_status, error, error_kind.
  returned: unless skipped
  type: list
  elements: dict
breaches:
  description: One per threshold exceeded - figure, limit, value, message.
  returned: unless skipped
  type: list
  elements: dict
thresholds:
  description: The limits applied (null is no limit).
  returned: unless skipped
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

try:  # a checkout (ansible.cfg: module_utils = plugins/module_utils): its code, never an installed copy's
    from ansible.module_utils.kimi_loadtest import (
        DEFAULT_PROMPT,
        LoadTestConfig,
        Thresholds,
        check_thresholds,
        run_load_test,
        summary_line,
    )
except ImportError:  # installed as the kimi.k2 collection
    from ansible_collections.kimi.k2.plugins.module_utils.kimi_loadtest import (
        DEFAULT_PROMPT,
        LoadTestConfig,
        Thresholds,
        check_thresholds,
        run_load_test,
        summary_line,
    )


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "base_url": {"type": "str", "required": True},
            "api_key": {"type": "str", "no_log": True},
            "model": {"type": "str", "required": True},
            "requests": {"type": "int", "default": 32},
            "concurrency": {"type": "int", "default": 8},
            "max_tokens": {"type": "int", "default": 256},
            "prompt": {"type": "str"},
            "request_timeout": {"type": "float", "default": 120},
            "time_budget": {"type": "float", "default": 600},
            "ttft_p99_ms": {"type": "float"},
            "tpot_p99_ms": {"type": "float"},
            "e2e_p99_ms": {"type": "float"},
            "max_error_rate": {"type": "float"},
            "fail_on_breach": {"type": "bool", "default": True},
            "skip_in_check_mode": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    params = module.params
    if module.check_mode and params["skip_in_check_mode"]:
        module.exit_json(changed=False, skipped=True, msg="load test skipped in check mode (skip_in_check_mode)")
    config = LoadTestConfig(
        base_url=params["base_url"],
        model=params["model"],
        requests=params["requests"],
        concurrency=params["concurrency"],
        max_tokens=params["max_tokens"],
        prompt=params["prompt"] or DEFAULT_PROMPT,
        api_key=params["api_key"],
        timeout_s=params["request_timeout"],
        budget_s=params["time_budget"],
    )
    problems = config.problems()
    if problems:
        module.fail_json(msg="; ".join(problems))
    thresholds = Thresholds(
        ttft_p99_ms=params["ttft_p99_ms"],
        tpot_p99_ms=params["tpot_p99_ms"],
        e2e_p99_ms=params["e2e_p99_ms"],
        max_error_rate=params["max_error_rate"],
    )
    outcome = run_load_test(config)
    breaches = check_thresholds(outcome["summary"], thresholds)
    result = {
        "changed": False,
        "summary": outcome["summary"],
        "records": outcome["records"],
        "breaches": breaches,
        "thresholds": thresholds.as_dict(),
    }
    line = summary_line(outcome["summary"])
    if breaches and params["fail_on_breach"]:
        module.fail_json(msg=line + "\n" + "\n".join(f"- {breach['message']}" for breach in breaches), **result)
    module.exit_json(msg=line, **result)


if __name__ == "__main__":
    main()
