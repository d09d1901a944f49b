"""The verify role's metric-name check (roles/verify/tasks/metrics.yml) on this host: when rank 0's /metrics does
not answer, the verdict is a failed `metric_names` check naming the URL, for the report, and the play goes on.
(The check against a real page is tests/unit/plugins/modules/test_kimi_metrics_check.py; against the lab's vLLM,
the lab's verify run.)"""

from __future__ import annotations

import sys

import yaml

from tests.ansible_run import run_playbook

PLAYBOOK = """
- name: Run the verify role's metric-name check against a port nothing listens on
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Include the check
      ansible.builtin.include_role:
        name: verify
        tasks_from: metrics
      vars:
        verify_api_url: http://127.0.0.1:1
        kimi_api_key: secret-key
        verify_check_timeout: 5

    - name: Show the verdict
      ansible.builtin.debug:
        var: verify_metrics.check
"""


def test_an_unanswered_metrics_page_is_a_failed_check_naming_the_url_and_the_key_stays_hidden(tmp_path):
    playbook = tmp_path / "verify-metrics.yml"
    playbook.write_text(PLAYBOOK)
    inventory = tmp_path / "hosts.yml"
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"localhost": local}}}))
    outcome = run_playbook(playbook, inventory, timeout=300)
    assert outcome.rc == 0, outcome.failure_messages()
    check = outcome.results_of("Show the verdict")["localhost"]["verify_metrics.check"]
    assert check["name"] == "metric_names"
    assert check["status"] == "fail"
    assert check["detail"].startswith("GET http://127.0.0.1:1/metrics: "), check["detail"]
    assert "Connection refused" in check["detail"]
    read = outcome.results_of(
        "Read rank 0's /metrics (vLLM guards only /v1 and the like; the key goes along when there is one)"
    )
    assert "secret-key" not in str(read), "the API key was shown"
