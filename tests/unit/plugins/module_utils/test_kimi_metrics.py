"""Metric names: the exposition's, the PromQL expressions', and the ones an exposition lacks (kimi_metrics)."""

from __future__ import annotations

import json

import pytest
from ansible_collections.kimi.k2.plugins.module_utils.kimi_metrics import (
    Expression,
    MetricUse,
    dashboard_expressions,
    dashboard_queries,
    describe_missing,
    grafana_query,
    metric_uses,
    missing_metrics,
    parse_exposition,
    promql_metric_names,
    rule_expressions,
    strip_jinja,
)

from tests.paths import FIXTURES, REPO_ROOT

RULES = REPO_ROOT / "roles" / "monitoring" / "templates" / "kimi-alerts.rules.yml.j2"
DASHBOARD = REPO_ROOT / "roles" / "monitoring" / "files" / "grafana" / "kimi-vllm.json"
PAGES = sorted((FIXTURES / "vllm").glob("metrics-*.txt"))

# prometheus_client's 0.0.4 text: a counter's TYPE line already names the _total series, _created is a family of
# its own, histograms declare the bare family.
TEXT_004 = """\
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="kimi-k2"} 0.0
# TYPE vllm:num_preemptions_created gauge
vllm:num_preemptions_created{engine="0",model_name="kimi-k2"} 1.7e+09
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="kimi-k2"} 0.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="kimi-k2"} 0.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="kimi-k2"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="kimi-k2"} 0.25
process_cpu_seconds_total 6.47
"""

# OpenMetrics: the counter family is declared without _total; a labelled family may have no sample yet.
OPENMETRICS = """\
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0"} 3
# TYPE vllm:request_latency summary
# TYPE vllm:lora_requests_info gauge
# EOF
"""


# ---------------------------------------------------------------------------------------------- the exposition


def test_an_004_page_offers_its_samples_and_each_family_s_series():
    names = parse_exposition(TEXT_004).series_names()
    assert {"vllm:num_preemptions_total", "vllm:num_preemptions_created", "vllm:kv_cache_usage_perc"} <= names
    assert {f"vllm:time_to_first_token_seconds_{suffix}" for suffix in ("bucket", "sum", "count")} <= names
    assert "process_cpu_seconds_total" in names


def test_a_counter_s_bare_name_and_a_histogram_s_family_name_are_not_series():
    names = parse_exposition(TEXT_004).series_names()
    assert "vllm:num_preemptions" not in names
    assert "vllm:time_to_first_token_seconds" not in names


def test_an_openmetrics_page_gives_the_total_series_of_a_bare_counter_family_and_families_without_samples():
    exposition = parse_exposition(OPENMETRICS)
    names = exposition.series_names()
    assert "vllm:num_preemptions_total" in names and "vllm:num_preemptions" not in names
    assert {"vllm:request_latency", "vllm:request_latency_sum", "vllm:request_latency_count"} <= names
    assert "vllm:lora_requests_info" in names  # declared, no sample yet: its series appear with the first
    assert exposition.families["vllm:num_preemptions"] == "counter"


def test_an_error_page_offers_nothing():
    assert parse_exposition("<html><body>502 Bad Gateway</body></html>\n").series_names() == frozenset()


def test_lines_that_are_no_samples_are_not_read_as_names():
    text = 'Unauthorized\nerror: bad gateway\nvllm:x{a="b c"} NaN\nvllm:y +Inf 1700000000000\n'
    assert parse_exposition(text).samples == frozenset({"vllm:x", "vllm:y"})


# ---------------------------------------------------------------------------------------------- PromQL


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('up{job="kimi-vllm"} == 0', {"up"}),
        (
            "histogram_quantile(0.99, sum by (job, le) (rate(vllm:time_to_first_token_seconds_bucket[5m]))) > 2",
            {"vllm:time_to_first_token_seconds_bucket"},
        ),
        ("sum without (engine, instance) (vllm:num_requests_running)", {"vllm:num_requests_running"}),
        ("max(vllm:kv_cache_usage_perc) by (node) > 0.9", {"vllm:kv_cache_usage_perc"}),
        (
            "a_total / on (node) group_left (mountpoint) b_bytes and ignoring (le) c unless d or bool e",
            {"a_total", "b_bytes", "c", "d", "e"},
        ),
        ("x_total offset 15m > 1e3 and y > Inf and z != NaN", {"x_total", "y", "z"}),
        ('label_replace(up, "dst", "$1", "src", "(.*)")', {"up"}),
        ('count_values("version", build_info{version=~"by|on"})', {"build_info"}),
        ("min_over_time((waiting + running)[3m:1m]) > 0", {"waiting", "running"}),
        ('{__name__="vllm:generation_tokens_total", job="x"}', {"vllm:generation_tokens_total"}),
        ("time() - drift_ts > 129600  # comment naming not_a_metric", {"drift_ts"}),
        ("topk(5, rate(http_requests_total[$__rate_interval])) * ${scale}", {"http_requests_total"}),
        ('node_free{mountpoint="$data_mountpoint", node=~"$node"} < .1', {"node_free"}),
        ("vector(1) + scalar(absent(up)) + time()", {"up"}),
    ],
)
def test_promql_metric_names(expr, names):
    assert promql_metric_names(expr) == names


def test_jinja_in_an_expression_is_no_metric_name():
    expr = 'increase(vllm:num_preemptions_total{job="{{ job }}"}[{{ window }}]) > {{ monitoring_alert_preemptions }}'
    assert promql_metric_names(expr) == {"vllm:num_preemptions_total"}
    assert promql_metric_names("{{ some_variable }} > 0") == set()


def test_strip_jinja_keeps_raw_bodies_and_both_branches_and_drops_macros():
    template = """{# a comment #}
{%- macro seconds(d) -%}
{{ d | int }}
{%- endmacro %}
a: {{ value }}
{% if flag %}
b: {% raw %}{{ $labels.node }}{% endraw %}
{% else %}
c: 2
{% endif %}
"""
    assert strip_jinja(template) == "a: 0\nb: {{ $labels.node }}\nc: 2\n"


# ---------------------------------------------------------------------------------------------- rules and dashboards


def test_the_rules_template_s_expressions_name_each_alert_and_its_group():
    expressions = rule_expressions(RULES.read_text(), "rules")
    where = {item.where for item in expressions}
    assert "alert KimiVllmApiDown (group kimi-vllm)" in where
    assert "alert KimiVllmTtftP99High (group kimi-vllm)" in where  # both branches of its {% if %}
    names = {use.name for use in metric_uses(expressions)}
    assert "vllm:generation_tokens_total" in names and "vllm:num_preemptions_total" in names
    assert "sum" not in names and "by" not in names and "le" not in names


def test_recording_rules_are_read_too():
    text = "groups:\n  - name: g\n    rules:\n      - record: job:up:sum\n        expr: sum(up)\n"
    assert rule_expressions(text, "f") == [Expression("f", "record job:up:sum (group g)", "sum(up)")]


def test_dashboard_expressions_include_panels_inside_rows_and_skip_targets_without_expr():
    dashboard = {
        "panels": [
            {"id": 1, "title": "A", "targets": [{"refId": "A", "expr": "up"}, {"refId": "B"}]},
            {"id": 2, "type": "row", "panels": [{"id": 3, "title": "C", "targets": [{"refId": "A", "expr": "x"}]}]},
        ]
    }
    found = dashboard_expressions(dashboard, "d.json")
    assert [item.where for item in found] == ["panel 'A' (id 1) target A", "panel 'C' (id 3) target A"]


def test_grafana_query_replaces_grafana_s_intervals_and_the_dashboard_s_variables():
    expr = 'rate(x{node=~"$node", m="${mount:raw}", j="[[job]]"}[$__rate_interval])'
    variables = {"node": ".*", "mount": "/data", "job": "node"}
    assert grafana_query(expr, variables) == 'rate(x{node=~".*", m="/data", j="node"}[1m])'
    assert grafana_query('up{a="$unknown"}') == 'up{a="$unknown"}'


def test_every_shipped_panel_query_has_its_variables_replaced():
    queries = dashboard_queries(json.loads(DASHBOARD.read_text()))
    assert queries, "the dashboard has no panel expression"
    for item, query in queries:
        assert "$" not in query, f"{item.where}: {query}"
    assert any('mountpoint="/data"' in query for _, query in queries)


# ---------------------------------------------------------------------------------------------- missing names


def _page(version: str):
    return parse_exposition((FIXTURES / "vllm" / f"metrics-{version}.txt").read_text())


@pytest.mark.parametrize("version", ["0.23.0", "0.32.0"])
def test_the_names_older_rules_used_are_missing_on_the_pinned_releases(version):
    """gpu_cache_usage_perc is gone since 0.12.0; a counter has no series without _total; iteration_tokens_total
    is a histogram family; time_per_output_token_seconds is gone too."""
    uses = [
        MetricUse(name, "old.rules.yml", "alert Old")
        for name in (
            "vllm:gpu_cache_usage_perc",
            "vllm:num_preemptions",
            "vllm:iteration_tokens_total",
            "vllm:time_per_output_token_seconds_bucket",
            "vllm:kv_cache_usage_perc",
            "vllm:num_preemptions_total",
        )
    ]
    missing = {use.name for use in missing_metrics(uses, _page(version))}
    assert missing == {
        "vllm:gpu_cache_usage_perc",
        "vllm:num_preemptions",
        "vllm:iteration_tokens_total",
        "vllm:time_per_output_token_seconds_bucket",
    }


def test_only_names_with_the_prefix_are_judged():
    uses = [MetricUse("kimi_drift_ok", "r", "alert A"), MetricUse("vllm:nope", "r", "alert B")]
    assert [use.name for use in missing_metrics(uses, _page("0.23.0"))] == ["vllm:nope"]
    assert [use.name for use in missing_metrics(uses, _page("0.23.0"), prefix="kimi_")] == ["kimi_drift_ok"]


def test_a_missing_name_is_described_with_its_file_and_rule():
    missing = [MetricUse("vllm:gpu_cache_usage_perc", "rules.yml", "alert KvCache (group g)")]
    assert describe_missing(missing) == [
        "vllm:gpu_cache_usage_perc: not exported, used by alert KvCache (group g) in rules.yml"
    ]


def test_every_pinned_release_has_a_page_whose_first_line_says_what_and_how():
    assert [page.name for page in PAGES] == ["metrics-0.23.0.txt", "metrics-0.32.0.txt"]
    for page in PAGES:
        version = page.stem.removeprefix("metrics-")
        first = page.read_text().splitlines()[0]
        assert first.startswith(f"# /metrics of vllm {version}, "), first


@pytest.mark.parametrize("page", PAGES, ids=lambda path: path.stem)
def test_the_shipped_rules_and_dashboard_only_use_names_each_pinned_release_exports(page):
    expressions = rule_expressions(RULES.read_text(), str(RULES.name))
    expressions += dashboard_expressions(json.loads(DASHBOARD.read_text()), DASHBOARD.name)
    uses = metric_uses(expressions)
    assert len({use.name for use in uses if use.name.startswith("vllm:")}) >= 10
    assert describe_missing(missing_metrics(uses, parse_exposition(page.read_text()))) == []
