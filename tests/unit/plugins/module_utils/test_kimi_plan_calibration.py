"""The planner reproduces each published vLLM start-up log of tests/fixtures/planner/startup_logs.json within the
table's tolerance (2 % on the KV budget and on the tokens; tests/fixtures/planner/README.md)."""

from __future__ import annotations

import json

import pytest

from module_utils import kimi_plan_options as plan_options
from tests import paths

TABLE = json.loads((paths.FIXTURES / "planner" / "startup_logs.json").read_text(encoding="utf-8"))
TOLERANCE = TABLE["tolerance"]


def _options(case):
    options = dict(case["options"])
    model_path = paths.REPO_ROOT / str(options["model"])
    if model_path.exists():
        options["model"] = str(model_path)
    return options


def test_the_stated_tolerance_is_two_percent():
    assert TOLERANCE == {"budget_relative": 0.02, "tokens_relative": 0.02}


@pytest.mark.parametrize("case", TABLE["cases"], ids=[case["id"] for case in TABLE["cases"]])
def test_published_startup_log_is_reproduced(case):
    assert case["source"] and case["settings_known"] and case["fits_constant"]
    plan = plan_options.plan_from_options(_options(case))
    logged = case["logged"]
    assert plan["kv_cache_gib_per_gpu"] == pytest.approx(
        logged["available_kv_cache_gib"], rel=TOLERANCE["budget_relative"]
    )
    assert plan["kv_tokens"] == pytest.approx(logged["gpu_kv_cache_tokens"], rel=TOLERANCE["tokens_relative"])
