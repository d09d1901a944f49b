#!/usr/bin/python
"""Ansible module: vLLM's own serving benchmark (`vllm bench serve`) from the node's venv, judged against gates."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kimi_vllm_bench
short_description: Run vLLM's serving benchmark against the served model and judge it against latency gates
description:
  - Runs C(vllm bench serve) from I(vllm) (the node's pinned venv, so the benchmark is the service's own
    version) against C(/v1/chat/completions) with vLLM's C(random) dataset drawn from the checkpoint's
    tokenizer (no hub dataset), I(num_prompts) prompts of I(input_len) tokens, each answered with exactly
    I(output_len) tokens (C(--ignore-eos)), at most I(max_concurrency) in flight, and reads its detailed JSON.
  - Returns vLLM's figures under vLLM's names - ttft_ms, tpot_ms, itl_ms, e2el_ms (mean, median, std, p50, p90,
    p99), request_throughput, output_throughput, total_token_throughput, request_goodput - plus a record per
    request and a breach per gate exceeded.
  - The first run sends as fast as I(max_concurrency) allows; each of I(request_rates) is a further run at
    that Poisson rate (a sweep), reported in C(sweep).
  - The key goes to the benchmark as C(OPENAI_API_KEY) in its environment, never on its command line.
  - All runs together stop at I(time_budget) seconds; a run still going then is killed with its process group
    and reported as failed.
  - Check mode - the benchmark still runs (it only sends inference requests and changes no state), unless
    I(skip_in_check_mode) is true.
options:
  vllm:
    description: The venv's C(vllm) executable.
    type: path
    required: true
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
  tokenizer:
    description: The checkpoint directory; the random prompts are drawn from its tokenizer.
    type: path
    required: true
  trust_remote_code:
    description: Load the tokenizer's own code (Kimi K2's tokenizer is custom code in the checkpoint).
    type: bool
    default: true
  num_prompts:
    description: Requests per run.
    type: int
    default: 32
  max_concurrency:
    description: Requests in flight at once; set it to the concurrency the SLO is for (e.g. C(--max-num-seqs)).
    type: int
    default: 8
  input_len:
    description: Prompt tokens per request.
    type: int
    default: 128
  output_len:
    description: Output tokens per request.
    type: int
    default: 256
  request_rates:
    description: Further runs at these request rates (requests/s), after the first one; empty is no sweep.
    type: list
    elements: float
    default: []
  seed:
    description: The random dataset's seed.
    type: int
    default: 0
  ready_timeout:
    description: Seconds the benchmark waits for the endpoint to answer a first request.
    type: int
    default: 60
  time_budget:
    description: Seconds all runs together may take.
    type: float
    default: 600
  ttft_p99_ms:
    description: Limit on TTFT p99 in milliseconds; 0 or unset is no limit. Also a goodput SLO.
    type: float
  tpot_p99_ms:
    description: Limit on TPOT p99 in milliseconds; 0 or unset is no limit. Also a goodput SLO.
    type: float
  itl_p99_ms:
    description: Limit on ITL p99 in milliseconds; 0 or unset is no limit.
    type: float
  e2el_p99_ms:
    description: Limit on E2EL p99 in milliseconds; 0 or unset is no limit. Also a goodput SLO.
    type: float
  max_error_rate:
    description: Highest share of requests that may fail (0.01 is 1%). Unset is no limit; 0 allows no error.
    type: float
  min_goodput_share:
    description: Lowest share of the prompts that must meet every TTFT/TPOT/E2EL limit set; 0 or unset is none.
    type: float
  fail_on_breach:
    description: Fail when a gate is breached or a run fails.
    type: bool
    default: true
  skip_in_check_mode:
    description: Do not run the benchmark in check mode.
    type: bool
    default: false
notes:
  - The module itself is stdlib only; the benchmark needs the vLLM venv the vllm role installs.
author:
  - Kimi K2 deployment collection
extends_documentation_fragment:
  - kimi.k2.attributes
  - kimi.k2.attributes.reads_only
"""

EXAMPLES = r"""
- name: Benchmark rank 0 at the configured concurrency
  kimi_vllm_bench:
    vllm: /opt/vllm/current/bin/vllm
    base_url: "http://127.0.0.1:8000"
    model: kimi-k2
    tokenizer: /data/models/kimi-k2.7-code
    num_prompts: 64
    max_concurrency: 16
    output_len: 256
    ttft_p99_ms: 2000
    max_error_rate: 0
    fail_on_breach: false
  register: verify_load
"""

RETURN = r"""
summary:
  description: >-
    The first run - num_prompts, max_concurrency, request_rate, input_len, output_len, completed, failed,
    error_rate, errors_by_kind, short_outputs, duration, total_input_tokens, total_output_tokens,
    request_throughput, output_throughput, total_token_throughput, request_goodput, goodput_share, and
    ttft_ms, tpot_ms, itl_ms, e2el_ms (each mean, median, std, p50, p90, p99).
  returned: unless skipped
  type: dict
records:
  description: >-
    The first run, one per request in send order - index, started_s, ok, ttft_ms, tpot_ms, e2el_ms,
    output_tokens, error, error_kind.
  returned: unless skipped
  type: list
  elements: dict
breaches:
  description: One per gate exceeded, in any run - figure, limit, value, message.
  returned: unless skipped
  type: list
  elements: dict
sweep:
  description: One per further request rate - request_rate and its summary.
  returned: unless skipped
  type: list
  elements: dict
thresholds:
  description: The gates applied (null is no limit).
  returned: unless skipped
  type: dict
argv:
  description: The first run's command line (the key is not on it).
  returned: unless skipped
  type: list
  elements: str
"""

import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kimi.k2.plugins.module_utils.kimi_bench import (
    BenchConfig,
    Gates,
    bench_argv,
    bench_environment,
    judge,
    read_result,
    run_bench,
    summary_line,
)

GATE_OPTIONS = ("ttft_p99_ms", "tpot_p99_ms", "itl_p99_ms", "e2el_p99_ms", "max_error_rate", "min_goodput_share")


def one_run(config: BenchConfig, environment: dict, workdir: str, name: str, bound_s: float) -> dict:
    """Run once and judge it; a run that failed or was killed is a breach naming why, with its output tail."""
    argv = bench_argv(config, workdir, name)
    outcome = run_bench(argv, environment, bound_s)
    failure = None
    if outcome.returncode is None:
        failure = f"vllm bench serve was stopped at the time budget ({bound_s:.0f} s left of time_budget)"
    elif outcome.returncode != 0:
        failure = f"vllm bench serve exited {outcome.returncode}"
    else:
        try:
            return {"argv": argv, "wall_s": outcome.wall_s, **judge(read_result(str(Path(workdir) / name)), config)}
        except ValueError as error:
            failure = str(error)
    breach = _breach_run(f"{failure}: {outcome.output_tail[-600:].strip()}")
    return {"argv": argv, "wall_s": outcome.wall_s, "summary": None, "records": [], "breaches": [breach]}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "vllm": {"type": "path", "required": True},
            "base_url": {"type": "str", "required": True},
            "api_key": {"type": "str", "no_log": True},
            "model": {"type": "str", "required": True},
            "tokenizer": {"type": "path", "required": True},
            "trust_remote_code": {"type": "bool", "default": True},
            "num_prompts": {"type": "int", "default": 32},
            "max_concurrency": {"type": "int", "default": 8},
            "input_len": {"type": "int", "default": 128},
            "output_len": {"type": "int", "default": 256},
            "request_rates": {"type": "list", "elements": "float", "default": []},
            "seed": {"type": "int", "default": 0},
            "ready_timeout": {"type": "int", "default": 60},
            "time_budget": {"type": "float", "default": 600},
            **{name: {"type": "float"} for name in GATE_OPTIONS},
            "fail_on_breach": {"type": "bool", "default": True},
            "skip_in_check_mode": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    params = module.params
    if module.check_mode and params["skip_in_check_mode"]:
        module.exit_json(changed=False, skipped=True, msg="benchmark skipped in check mode (skip_in_check_mode)")
    gates = Gates(**{name: params[name] for name in GATE_OPTIONS})
    config = BenchConfig(
        vllm=params["vllm"],
        base_url=params["base_url"],
        model=params["model"],
        tokenizer=params["tokenizer"],
        num_prompts=params["num_prompts"],
        max_concurrency=params["max_concurrency"],
        input_len=params["input_len"],
        output_len=params["output_len"],
        seed=params["seed"],
        trust_remote_code=params["trust_remote_code"],
        ready_timeout_s=params["ready_timeout"],
        gates=gates,
    )
    configs = [config] + [replace(config, request_rate=rate) for rate in params["request_rates"]]
    problems = [problem for each in configs for problem in each.problems()]
    if not os.access(config.vllm, os.X_OK):
        problems.append(f"vllm: {config.vllm} is not an executable (is the vllm role's venv installed?)")
    if problems:
        module.fail_json(msg="; ".join(sorted(set(problems))))
    environment = bench_environment(os.environ, params["api_key"])
    deadline = time.monotonic() + params["time_budget"]
    runs = []
    with tempfile.TemporaryDirectory(prefix="kimi-bench-") as workdir:
        for number, each in enumerate(configs):
            left = deadline - time.monotonic()
            if left <= 1:
                message = f"no time left in time_budget for the run at {each.request_rate:g} requests/s"
                runs.append({"summary": None, "records": [], "breaches": [_breach_run(message)], "argv": []})
                continue
            runs.append(one_run(each, environment, workdir, f"run-{number}.json", left))
    first, further = runs[0], list(zip(runs[1:], configs[1:], strict=True))
    breaches = list(first["breaches"])
    for run, each in further:
        breaches += [{**b, "message": f"at {each.request_rate:g} requests/s: {b['message']}"} for b in run["breaches"]]
    result = {
        "changed": False,
        "summary": first["summary"],
        "records": first["records"],
        "breaches": breaches,
        "sweep": [{"request_rate": each.request_rate, "summary": run["summary"]} for run, each in further],
        "thresholds": gates.as_dict(),
        "argv": first["argv"],
    }
    line = summary_line(first["summary"]) if first["summary"] else first["breaches"][0]["message"]
    if breaches and params["fail_on_breach"]:
        module.fail_json(msg=f"{line}; " + "; ".join(b["message"] for b in breaches), **result)
    module.exit_json(msg=line, **result)


def _breach_run(message: str) -> dict:
    return {"figure": "run", "limit": 0, "value": 1, "message": message}


if __name__ == "__main__":
    main()
