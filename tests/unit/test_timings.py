"""The end-of-run summary: layer times, the slowest tests from JUnit files, the slowest playbook tasks."""

from __future__ import annotations

import json

from tests import timings

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.lab.test_site_on_lab" name="test_converge" time="263.5"/>
<testcase classname="tests.lab.test_site_on_lab" name="test_refusal" time="12.0"/>
</testsuite></testsuites>
"""


def test_the_summary_lists_layers_slowest_tests_scenarios_and_tasks(tmp_path):
    (tmp_path / "layers.tsv").write_text("lint 45\nlab-test 1800\n")
    (tmp_path / "lab-test.xml").write_text(JUNIT)
    (tmp_path / "molecule.tsv").write_text("vllm 159\n")
    runs = [
        {"wall_s": 100, "slowest": [{"task": "Install", "role": "vllm", "seconds": 60.0}]},
        {
            "wall_s": 50,
            "slowest": [
                {"task": "Install", "role": "vllm", "seconds": 5.0},
                {"task": "Wait", "role": "vllm_serve", "seconds": 30.0},
            ],
        },
    ]
    (tmp_path / "playbooks.jsonl").write_text("".join(json.dumps(run) + "\n" for run in runs) + "not json\n")
    lines = timings.report(tmp_path, count=1)
    assert "  lint                          45 s  (0 min 45 s)" in lines
    assert "  total                       1845 s  (30 min 45 s)" in lines
    assert "the 1 slowest of 2 tests:" in lines
    assert "    263.5 s  [lab-test] tests.lab.test_site_on_lab::test_converge" in lines
    assert "      159 s  vllm" in lines
    assert "2 playbook runs, 150 s in all; the slowest tasks over all of them:" in lines
    assert "     65.0 s  vllm: Install" in lines


def test_an_empty_directory_says_so(tmp_path):
    assert timings.report(tmp_path, count=15) == [f"== where the time went ({tmp_path})", "  nothing recorded"]
