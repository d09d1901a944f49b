"""The monitoring role's alert rules template and Grafana files, read as they are shipped: every alert is
labelled and explained with a link to its section of docs/monitoring.md, the dashboard loads and every panel
queries something, the provisioning files point where the dashboard goes.

Rendering and promtool are tests/local/test_monitoring_rules.py's; metric names against vLLM's pages are
tests/unit/plugins/module_utils/test_kimi_metrics.py's.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml
from ansible_collections.kimi.k2.plugins.module_utils.kimi_metrics import dashboard_expressions, strip_jinja

from tests.paths import REPO_ROOT

ROLE = REPO_ROOT / "roles" / "monitoring"
RULES = ROLE / "templates" / "kimi-alerts.rules.yml.j2"
GRAFANA = ROLE / "files" / "grafana"
DASHBOARDS = sorted(GRAFANA.glob("*.json"))
DOC = REPO_ROOT / "docs" / "monitoring.md"


def _groups() -> list[dict]:
    return yaml.safe_load(strip_jinja(RULES.read_text()))["groups"]


def _alerts() -> list[dict]:
    return [rule for group in _groups() for rule in group["rules"]]


def _doc_anchors() -> set[str]:
    """GitHub's anchors of the headings: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+\s+(.+)$", DOC.read_text(), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading).strip().lower().replace(" ", "-") for heading in headings}


def test_the_groups_are_kimi_s_and_hold_only_alerts():
    assert all(group["name"].startswith("kimi-") for group in _groups())
    assert all("alert" in rule for rule in _alerts())


@pytest.mark.parametrize("rule", _alerts(), ids=lambda rule: rule["alert"])
def test_every_alert_has_a_severity_a_summary_and_a_description_linking_its_section(rule):
    assert rule["labels"]["severity"] in ("critical", "warning")
    annotations = rule["annotations"]
    assert annotations["summary"].strip()
    links = re.findall(r"docs/monitoring\.md#([\w-]+)", annotations["description"])
    assert links == [rule["alert"].lower()], annotations["description"]
    assert links[0] in _doc_anchors(), f"docs/monitoring.md has no section {rule['alert']}"


def test_every_alert_names_the_node_it_is_about():
    text = RULES.read_text()
    for rule in _alerts():
        block = text[text.index(f"alert: {rule['alert']}") :]
        summary = block[block.index("summary:") : block.index("description:")]
        assert "label_node" in summary, f"{rule['alert']}: the summary does not name the node"


def test_the_doc_s_alert_table_lists_exactly_the_rules():
    listed = set(re.findall(r"^\| \[(Kimi\w+)\]", DOC.read_text(), re.MULTILINE))
    assert listed == {rule["alert"] for rule in _alerts()}


def test_the_dashboards_load_with_unique_uids_and_a_prometheus_datasource_variable():
    dashboards = [json.loads(path.read_text()) for path in DASHBOARDS]
    assert [path.name for path in DASHBOARDS] == ["kimi-vllm.json"]
    uids = [dashboard["uid"] for dashboard in dashboards]
    assert len(uids) == len(set(uids)) and all(uids)
    for dashboard in dashboards:
        variables = {item["name"]: item for item in dashboard["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda path: path.name)
def test_every_panel_has_a_target_with_an_expression_on_the_datasource_variable(path):
    dashboard = json.loads(path.read_text())
    panels = dashboard["panels"]
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert any(target.get("expr") for target in panel.get("targets", [])), f"{panel['title']} has no expr"
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
    assert len(dashboard_expressions(dashboard)) >= len(panels)


def test_the_dashboard_shows_what_the_issue_asks_for():
    titles = {panel["title"] for panel in json.loads((GRAFANA / "kimi-vllm.json").read_text())["panels"]}
    assert titles >= {
        "Request rate",
        "Running and waiting requests",
        "Tokens per second",
        "Time to first token",
        "Time per output token",
        "End-to-end latency",
        "KV cache usage",
        "Preemptions",
        "API up",
        "Watchdog restarts",
        "Drift, parity and checkpoint verdicts",
        "Free space on the data file system",
    }


def test_the_provisioning_files_load_and_point_at_the_dashboards_and_prometheus():
    provider = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "kimi.yml").read_text())
    assert provider["apiVersion"] == 1
    assert provider["providers"][0]["type"] == "file" and provider["providers"][0]["options"]["path"]
    source = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "kimi-prometheus.yml").read_text())
    assert source["datasources"][0]["type"] == "prometheus"
    assert source["datasources"][0]["url"] == "${KIMI_PROMETHEUS_URL}"
