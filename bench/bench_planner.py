"""The planner against published vLLM start-up logs (tests/fixtures/planner/startup_logs.json): per case the
predicted and logged KV budget and tokens, the relative error, and the median absolute error. Prints; asserts
nothing (the unit test test_kimi_plan_calibration.py holds the tolerance). Stdlib only, like bin/kimi-plan.

Run: .venv/bin/python bench/bench_planner.py
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "plugins"))

from module_utils.kimi_plan_options import plan_from_options  # noqa: E402

TABLE = REPO / "tests" / "fixtures" / "planner" / "startup_logs.json"


def case_options(case: dict) -> dict:
    """The case's planner options, with a repository path made absolute."""
    options = dict(case["options"])
    model_path = REPO / str(options["model"])
    if model_path.exists():
        options["model"] = str(model_path)
    return options


def relative_error(predicted: float, logged: float) -> float:
    return (predicted - logged) / logged


def main() -> None:
    cases = json.loads(TABLE.read_text(encoding="utf-8"))["cases"]
    budget_errors, token_errors = [], []
    print(f"{'case':<28} {'budget GiB pred/logged':>24} {'err':>7}   {'tokens pred/logged':>24} {'err':>7}")
    for case in cases:
        plan = plan_from_options(case_options(case))
        logged = case["logged"]
        budget = plan["kv_cache_gib_per_gpu"]
        budget_error = relative_error(budget, logged["available_kv_cache_gib"])
        token_error = relative_error(plan["kv_tokens"], logged["gpu_kv_cache_tokens"])
        budget_errors.append(abs(budget_error))
        token_errors.append(abs(token_error))
        print(
            f"{case['id']:<28} {budget:>11.2f} / {logged['available_kv_cache_gib']:<10.2f} {budget_error:>+7.2%}   "
            f"{plan['kv_tokens']:>11,} / {logged['gpu_kv_cache_tokens']:<11,} {token_error:>+7.2%}"
        )
    print(
        f"median absolute error: budget {statistics.median(budget_errors):.2%}, "
        f"tokens {statistics.median(token_errors):.2%} ({len(cases)} cases)"
    )


if __name__ == "__main__":
    main()
