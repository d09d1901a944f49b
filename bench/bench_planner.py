"""The planner against published vLLM start-up logs (tests/fixtures/planner/startup_logs.json): per case the
predicted and logged KV budget and tokens, the relative and absolute error, the weights against "Model loading took"
where a log prints it, and the median absolute errors (all cases, and the GPU cases no constant was fitted to).
Prints; asserts nothing (the unit test test_kimi_plan_calibration.py holds the tolerances). Stdlib only, like
bin/kimi-plan.

Run: .venv/bin/python bench/bench_planner.py
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# The collection's code is this checkout's, through collections/ (as under pytest).
sys.path.insert(0, str(REPO / "collections"))
sys.path.insert(0, str(REPO / "contrib" / "kimi_tools"))

from ansible_collections.kimi.k2.plugins.module_utils.kimi_plan_options import plan_from_options  # noqa: E402
from kimi_tools.kimi_plan_check import measured_weights_bytes, relative_error  # noqa: E402

TABLE = REPO / "tests" / "fixtures" / "planner" / "startup_logs.json"


def case_options(case: dict, *, measured_weights: bool = True) -> dict:
    """The case's planner options, with a repository path made absolute and, where the log prints "Model loading
    took", the measured per-GPU weights fed as --weights-bytes (exact for a TP-only layout)."""
    options = dict(case["options"])
    model_path = REPO / str(options["model"])
    if model_path.exists():
        options["model"] = str(model_path)
    measured = measured_weights_bytes(options, case.get("weights_gib_per_gpu_logged"))
    if measured_weights and measured is not None:
        options["weights_bytes"] = measured
    return options


def is_independent_gpu_case(case: dict) -> bool:
    return case["fits_constant"] is False and case["options"].get("gpu") not in (None, "cpu")


def _tokens(plan: dict, logged: int | None) -> tuple[str, float | None]:
    if logged is None:
        return f"{plan['kv_tokens']:>11,} / {'-':<11} {'-':>7}", None
    error = relative_error(plan["kv_tokens"], logged)
    return f"{plan['kv_tokens']:>11,} / {logged:<11,} {error:>+7.2%}", error


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.2%}" if values else "-"


def main() -> None:
    cases = json.loads(TABLE.read_text(encoding="utf-8"))["cases"]
    budget_errors, budget_gib_errors, token_errors, independent = [], [], [], []
    print(f"{'case':<44} {'budget GiB pred/logged':>22} {'err':>8} {'GiB':>6}   {'tokens pred/logged':>24} {'err':>7}")
    for case in cases:
        plan = plan_from_options(case_options(case))
        logged = case["logged"]
        budget = plan["kv_cache_gib_per_gpu"]
        budget_error = relative_error(budget, logged["available_kv_cache_gib"])
        gib_error = budget - logged["available_kv_cache_gib"]
        tokens_text, token_error = _tokens(plan, logged["gpu_kv_cache_tokens"])
        budget_errors.append(abs(budget_error))
        budget_gib_errors.append(abs(gib_error))
        if token_error is not None:
            token_errors.append(abs(token_error))
        if is_independent_gpu_case(case):
            # A near-empty budget makes the relative error explode: read the miss against what vLLM requested.
            independent.append((abs(gib_error), abs(gib_error) / plan["usable_gib_per_gpu"]))
        print(
            f"{case['id']:<44} {budget:>9.2f} / {logged['available_kv_cache_gib']:<9.2f} {budget_error:>+8.2%} "
            f"{gib_error:>+6.2f}   {tokens_text}"
        )
        measured = case.get("weights_gib_per_gpu_logged")
        if measured is not None:
            breakdown = plan_from_options(case_options(case, measured_weights=False))["weights_gib_per_gpu"]
            print(
                f"{'':<44} weights: component breakdown {breakdown:.2f} GiB / logged {measured:.2f} GiB "
                f"{relative_error(breakdown, measured):+.2%} (the budget above uses the logged weights)"
            )
    print(
        f"median absolute error: budget {_median(budget_errors)} ({statistics.median(budget_gib_errors):.2f} GiB), "
        f"tokens {_median(token_errors)} ({len(cases)} cases, {len(token_errors)} with printed tokens)"
    )
    if independent:
        gib = statistics.median(error for error, _ in independent)
        share = statistics.median(share for _, share in independent)
        print(
            f"independent GPU cases (no fitted constant): median absolute budget error {gib:.2f} GiB, "
            f"{share:.2%} of the requested util x total ({len(independent)} cases)"
        )


if __name__ == "__main__":
    main()
