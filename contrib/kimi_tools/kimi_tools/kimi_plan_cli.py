"""bin/kimi-plan: the command line over the planner's options (exit 0 fits, 1 does not fit, 2 bad flags)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from ansible_collections.kimi.k2.plugins.module_utils.kimi_overhead import ALL2ALL_BACKENDS, PINNED_VLLM_VERSION
from ansible_collections.kimi.k2.plugins.module_utils.kimi_plan_options import plan_from_options
from ansible_collections.kimi.k2.plugins.module_utils.kimi_plan_render import render_text
from ansible_collections.kimi.k2.plugins.module_utils.kimi_presets import GPU_PRESETS, MODEL_PRESETS, PlanInputError

from .kimi_plan_check import calibration_case, check_log, render_check

# ---------------------------------------------------------------------------------------------------------
# CLI (bin/kimi-plan)
# ---------------------------------------------------------------------------------------------------------


class _OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line naming the flag, exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_arg_parser(prog: str = "kimi-plan") -> argparse.ArgumentParser:
    parser = _OneLineParser(
        prog=prog,
        description="Per-GPU memory plan for vLLM serving a Kimi K2-family checkpoint. Exit 0: fits; "
        "1: does not fit; 2: bad flags.",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--model", help=f"preset ({', '.join(MODEL_PRESETS)}) or path to config.json")
    parser.add_argument("--weights-bytes", help="checkpoint bytes, spread evenly over the tp x pp GPUs")
    parser.add_argument("--params", help="parameter count (with --weight-bytes-per-param, --weight-overhead)")
    parser.add_argument("--weight-bytes-per-param", help="bytes per parameter for --params")
    parser.add_argument("--weight-overhead", help="multiplier for --params (default 1)")
    parser.add_argument("--gpu", help=f"GPU preset ({', '.join(GPU_PRESETS)})")
    parser.add_argument("--gpu-memory-gib", help="memory per GPU the driver reports, GiB (overrides --gpu's)")
    parser.add_argument("--gpus-per-node", help="GPUs per node (default 8, cpu: 1)")
    parser.add_argument("--nodes", help="nodes; when given, tp x pp x dp must equal nodes x gpus-per-node")
    parser.add_argument("--gpu-memory-utilization", help="vLLM's --gpu-memory-utilization (default 0.9)")
    parser.add_argument(
        "--reserve-gib",
        help="extra GiB per GPU kept back on top of the modelled overhead (default 0, as the roles)",
    )
    parser.add_argument("--kv-cache-gib-per-gpu", help="measured KV budget per GPU, replaces the computed one")
    parser.add_argument("--tp", help="tensor parallel size (default 1)")
    parser.add_argument("--pp", help="pipeline parallel size (default 1)")
    parser.add_argument("--dp", help="data parallel size (default 1)")
    parser.add_argument("--dcp", help="decode context parallel size, divides tp (default 1)")
    parser.add_argument("--enable-expert-parallel", action="store_true", help="shard routed experts (EP = tp x dp)")
    parser.add_argument("--kv-cache-dtype", help="bf16 (default) or fp8")
    parser.add_argument("--max-model-len", help="tokens per sequence (default: the model's maximum)")
    parser.add_argument(
        "--block-size", help="KV block size (default: the attention backend's for the GPU and cache dtype; cpu: 128)"
    )
    parser.add_argument("--pp-layer-partition", help="layers per stage as VLLM_PP_LAYER_PARTITION, e.g. 31,30")
    parser.add_argument("--language-model-only", action="store_true", help="leave the vision encoder out")
    parser.add_argument(
        "--vllm-version", help=f"vLLM release whose rules apply (default {PINNED_VLLM_VERSION}, the pin)"
    )
    parser.add_argument("--max-num-seqs", help="vLLM's --max-num-seqs (default: vLLM's for the GPU, 1024 on H100+)")
    parser.add_argument(
        "--max-num-batched-tokens", help="vLLM's --max-num-batched-tokens (default: vLLM's, 8192 on H100+)"
    )
    parser.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs (no graph memory estimate)")
    parser.add_argument("--all2all-backend", help=f"expert-parallel all2all backend ({', '.join(ALL2ALL_BACKENDS)})")
    parser.add_argument(
        "--overhead-model",
        help="vllm (default): subtract the modelled per-stage overhead from util x the CUDA-visible total; "
        "none: the guides' rule, util x the driver's total - reserve - weights",
    )
    parser.add_argument(
        "--pooled", action="store_true", help="the GreenNode guide's pooled arithmetic (not what vLLM does)"
    )
    parser.add_argument(
        "--check-log",
        metavar="FILE",
        help="a vLLM start-up log ('-': stdin) that sized its own KV cache: plan with its settings and version, "
        "print the planner's error against it and (with --json) its calibration case; exit 0 within 2 %% and not "
        "above it by more than 1 %%, 1 otherwise",
    )
    parser.add_argument("--case-source", help="with --check-log: where the log comes from, for the calibration case")
    return parser


def _bad_input(prog: str, flag: str, message: str) -> int:
    """argparse's own form for every refusal, so a wrapper reads one shape; 2 is argparse's status too."""
    sys.stderr.write(f"{prog}: error: argument {flag}: {message}\n")
    return 2


def _warn(prog: str, plan: dict) -> None:
    for warning in plan.get("warnings", []):
        sys.stderr.write(f"{prog}: warning: {warning}\n")


def cli_main(argv: Sequence[str] | None = None, prog: str = "kimi-plan") -> int:
    """Run the CLI; returns the exit status (0 fits, 1 does not fit, 2 bad flags)."""
    parser = build_arg_parser(prog)
    args = vars(parser.parse_args(argv))
    as_json = args.pop("json")
    log_path, case_source = args.pop("check_log"), args.pop("case_source")
    options = {key: value for key, value in args.items() if value not in (None, False)}
    if log_path is not None:
        return _check_log_main(log_path, case_source, options, as_json, prog)
    if case_source is not None:
        return _bad_input(prog, "--case-source", "only with --check-log")
    try:
        plan = plan_from_options(options)
    except PlanInputError as exc:
        return _bad_input(prog, exc.flag, exc.message)
    _warn(prog, plan)
    if as_json:
        sys.stdout.write(json.dumps(plan, sort_keys=False) + "\n")
    else:
        sys.stdout.write(render_text(plan) + "\n")
    return 0 if plan["fits"] else 1


def _check_log_main(log_path: str, case_source: str | None, options: dict, as_json: bool, prog: str) -> int:
    """--check-log: 0 the plan is within the calibration tolerance of the log, 1 it is not, 2 bad flags or log."""
    try:
        text = sys.stdin.read() if log_path == "-" else Path(log_path).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return _bad_input(prog, "--check-log", f"cannot read {log_path}: {exc.strerror}")
    try:
        check = check_log(text, options)
    except PlanInputError as exc:
        return _bad_input(prog, exc.flag, exc.message)
    _warn(prog, check.plan)
    name = "stdin" if log_path == "-" else log_path
    if as_json:
        report = {
            "budget_error": check.budget_error,
            "tokens_error": check.tokens_error,
            "within_tolerance": check.within_tolerance,
            "above_log": check.above_log,
            "case": calibration_case(check, case_source or name),
            "plan": check.plan,
        }
        sys.stdout.write(json.dumps(report) + "\n")
    else:
        sys.stdout.write(render_check(check, name) + "\n")
    return 0 if check.passes else 1
