"""Parity across nodes: recorded facts of three lab nodes (node2's libnccl2 and node3's NCCL wheel differ)."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ansible_collections.kimi.k2.plugins.module_utils.kimi_parity import (
    Pins,
    compare,
    render_table,
    report_json,
    summary_message,
)

from tests import paths

REPO = paths.REPO_ROOT
FACTS_DIR = REPO / "tests" / "fixtures" / "stack" / "facts"
PINS = {
    "debs": {"libnccl2": "2.30.7-1+cuda13.3", "libnccl-dev": "2.30.7-1+cuda13.3"},
    "wheels": {"vllm": "0.23.0", "torch": "2.11.0", "nvidia-nccl-cu13": "2.28.9"},
    "nccl_env": {"NCCL_SOCKET_IFNAME": "host0"},
}


def load(name: str) -> dict:
    return json.loads((FACTS_DIR / f"{name}.json").read_text())


@pytest.fixture
def cluster():
    return {name: load(name) for name in ("node1", "node2", "node3")}


def failure_keys(report):
    return sorted((entry["host"], entry["item"]) for entry in report["failures"])


def by_key(report, host, item):
    return next(e for e in report["failures"] if (e["host"], e["item"]) == (host, item))


def test_the_recorded_skews_are_found_with_node_item_and_both_versions(cluster):
    report = compare(cluster, Pins.from_dict(PINS))
    assert report["ok"] is False
    assert failure_keys(report) == [
        ("node2", "deb:libnccl2"),
        ("node2", "hold:libnccl2"),
        ("node3", "nccl:version"),
        ("node3", "wheel:nvidia-nccl-cu13"),
    ]
    deb = by_key(report, "node2", "deb:libnccl2")
    assert (deb["value"], deb["expected"]) == ("2.30.5-1+cuda13.3", "2.30.7-1+cuda13.3")
    assert deb["fix"] == (
        "on node2: apt-get install -y --allow-change-held-packages libnccl2=2.30.7-1+cuda13.3 && apt-mark hold libnccl2"
    )
    wheel = by_key(report, "node3", "wheel:nvidia-nccl-cu13")
    assert wheel["message"] == "node3: nvidia-nccl-cu13 (wheel) is 2.30.4, expected 2.28.9 (pinned)"
    assert wheel["fix"] == "on node3: /opt/vllm/0.23.0/bin/python -m pip install --no-deps 'nvidia-nccl-cu13==2.28.9'"
    loaded = by_key(report, "node3", "nccl:version")
    assert (loaded["value"], loaded["expected"]) == ("2.30.4", "2.28.9")


def test_without_pins_the_majority_is_the_reference(cluster):
    report = compare(cluster, Pins())
    deb = by_key(report, "node2", "deb:libnccl2")
    assert deb["expected"] == "2.30.7-1+cuda13.3"
    assert deb["expected_from"] == "consensus"
    assert "(on the other nodes)" in deb["message"]
    assert ("node3", "wheel:nvidia-nccl-cu13") in failure_keys(report)


def test_a_tie_goes_to_the_first_host(cluster):
    report = compare({"node3": cluster["node3"], "node1": cluster["node1"]}, Pins())
    assert ("node1", "wheel:nvidia-nccl-cu13") in failure_keys(report)
    assert by_key(report, "node1", "wheel:nvidia-nccl-cu13")["expected"] == "2.30.4"


def test_identical_nodes_pass(cluster):
    same = {name: copy.deepcopy(cluster["node1"]) for name in ("node1", "node2", "node3")}
    report = compare(same, Pins.from_dict(PINS))
    assert report["ok"] is True
    assert report["failures"] == []
    assert summary_message(report).startswith("parity OK:")


def test_fabric_manager_must_equal_the_driver_exactly(cluster):
    node = cluster["node2"]
    node["debs"]["nvidia-fabricmanager-590"] = {
        "installed": True,
        "version": "590.44.01-1",
        "held": False,
        "status": "install ok installed",
    }
    del node["debs"]["nvidia-fabricmanager-580"]
    node["fabric_manager"] = {
        "package": "nvidia-fabricmanager-590",
        "version": "590.44.01",
        "deb_version": "590.44.01-1",
    }
    report = compare(cluster, Pins())
    failure = by_key(report, "node2", "fabric_manager")
    assert (failure["value"], failure["expected"]) == ("590.44.01", "580.95.05")
    # The exact Debian version comes from a node that has the right one.
    assert failure["fix"] == (
        "on node2: apt-get install -y --allow-change-held-packages nvidia-fabricmanager-580=580.95.05-1 "
        "&& apt-mark hold nvidia-fabricmanager-580"
    )


def test_no_fabric_manager_is_fine_unless_required(cluster):
    for node in cluster.values():
        node["fabric_manager"] = {"package": None, "version": None}
        node["debs"].pop("nvidia-fabricmanager-580")
    assert "fabric_manager" not in {item for _, item in failure_keys(compare(cluster, Pins()))}
    required = compare(cluster, Pins(require_fabric_manager=True))
    assert ("node1", "fabric_manager") in failure_keys(required)


def test_an_interface_missing_on_one_node_is_reported_for_that_node(cluster):
    del cluster["node3"]["interfaces"]["host0"]
    report = compare(cluster, Pins.from_dict(PINS))
    failure = by_key(report, "node3", "iface:NCCL_SOCKET_IFNAME")
    assert failure["value"] == "missing host0"
    assert "host0 matches no interface (present: lo)" in failure["message"]
    assert "/etc/kimi/nccl.env" in failure["fix"]
    assert not any(e["host"] != "node3" for e in report["failures"] if e["item"].startswith("iface:"))


def test_an_interface_without_ipv4_or_down(cluster):
    cluster["node1"]["interfaces"]["host0"]["ipv4"] = []
    cluster["node2"]["interfaces"]["host0"].update(up=False, operstate="down")
    report = compare(cluster, Pins())
    assert by_key(report, "node1", "iface:NCCL_SOCKET_IFNAME")["value"] == "no IPv4 host0"
    assert by_key(report, "node2", "iface:GLOO_SOCKET_IFNAME")["value"] == "down host0"


def test_env_values_compare_except_per_host_keys(cluster):
    cluster["node2"]["nccl_env"]["values"]["NCCL_IB_HCA"] = "mlx5"
    report = compare(cluster, Pins.from_dict(PINS))
    failure = by_key(report, "node2", "env:NCCL_IB_HCA")
    assert failure["fix"] == "on node2: remove NCCL_IB_HCA from /etc/kimi/nccl.env"
    assert not any(item.startswith("env:VLLM_HOST_IP") for _, item in failure_keys(report))


def test_the_nccl_wheel_override_is_expected_and_labelled(cluster):
    pins = Pins.from_dict({**PINS, "wheel_overrides": {"nvidia_nccl_cu13": "2.30.4"}})
    report = compare(cluster, pins)
    keys = failure_keys(report)
    assert ("node1", "wheel:nvidia-nccl-cu13") in keys
    assert ("node3", "wheel:nvidia-nccl-cu13") not in keys
    failure = by_key(report, "node1", "nccl:version")
    assert failure["expected_from"] == "nvidia-nccl-cu13 override"
    assert "the recorded NCCL-wheel override" in failure["fix"]


def test_vllm_nccl_so_path_and_system_sources_get_their_own_fix(cluster):
    cluster["node3"]["nccl"].update(source="VLLM_NCCL_SO_PATH", path="/opt/nccl/libnccl.so.2")
    cluster["node2"]["nccl"].update(source="system", path="/usr/lib/x86_64-linux-gnu/libnccl.so.2", version="2.30.5")
    pins = Pins.from_dict({**PINS, "nccl_version": "2.30.7", "wheels": {}})
    report = compare(cluster, pins)
    assert (
        "VLLM_NCCL_SO_PATH=/opt/nccl/libnccl.so.2 in /etc/kimi/nccl.env"
        in by_key(report, "node3", "nccl:version")["fix"]
    )
    assert by_key(report, "node2", "nccl:version")["fix"] == (
        "on node2: apt-get install -y --allow-change-held-packages libnccl2=2.30.7-1+cuda13.3 && apt-mark hold libnccl2"
    )


def test_an_unreadable_library_is_a_difference(cluster):
    cluster["node1"]["nccl"].update(version=None, code=None, error="cannot open shared object file")
    report = compare(cluster, Pins.from_dict(PINS))
    assert by_key(report, "node1", "nccl:version")["value"] == "error: cannot open shared object file"


def test_kernel_skew_is_a_warning_not_a_failure(cluster):
    same = {name: copy.deepcopy(cluster["node1"]) for name in ("node1", "node2")}
    same["node2"]["kernel"] = "6.1.0-38-amd64"
    report = compare(same, Pins())
    assert report["ok"] is True
    assert [(w["host"], w["item"]) for w in report["warnings"]] == [("node2", "kernel")]
    assert "6.1.0-38-amd64 ~" in render_table(report)


def test_a_host_without_facts_fails(cluster):
    cluster["node4"] = None
    report = compare(cluster, Pins.from_dict(PINS))
    assert ("node4", "facts") in failure_keys(report)
    assert report["hosts_without_facts"] == ["node4"]


def test_unknown_pin_fields_are_refused():
    with pytest.raises(ValueError, match="unknown pin fields: libnccl"):
        Pins.from_dict({"libnccl": "2.30.7"})


def test_table_marks_mismatches_and_folds_many_hosts(cluster):
    report = compare(cluster, Pins.from_dict(PINS))
    table = render_table(report)
    header, _, *rows = table.splitlines()
    assert header.split() == ["item", "expected", "node1", "node2", "node3"]
    libnccl_row = next(row for row in rows if row.startswith("libnccl2 (deb)"))
    pinned, node1, node2, mark, node3 = (
        "2.30.7-1+cuda13.3",
        "2.30.7-1+cuda13.3",
        "2.30.5-1+cuda13.3",
        "!",
        "2.30.7-1+cuda13.3",
    )
    assert libnccl_row.split() == ["libnccl2", "(deb)", pinned, node1, node2, mark, node3]
    many = {f"n{i:02d}": copy.deepcopy(cluster["node1"]) for i in range(20)}
    many["n17"] = cluster["node3"]
    folded = render_table(compare(many, Pins.from_dict(PINS)), max_hosts=4)
    folded_header = folded.splitlines()[0].split()
    assert folded_header[2:] == ["n00", "n01", "n02", "n17", "+16", "hosts"]


def test_report_is_json_and_deterministic(cluster):
    pins = Pins.from_dict(PINS)
    first, second = report_json(compare(cluster, pins)), report_json(compare(cluster, pins))
    assert first == second
    data = json.loads(first)
    row = next(r for r in data["rows"] if r["item"] == "deb:libnccl2")
    assert row["values"] == {"node1": "2.30.7-1+cuda13.3", "node2": "2.30.5-1+cuda13.3", "node3": "2.30.7-1+cuda13.3"}
    assert row["ok"] == {"node1": True, "node2": False, "node3": True}


def test_256_hosts_compare_in_well_under_a_second():
    spec = importlib.util.spec_from_file_location("bench_parity", REPO / "bench" / "bench_parity.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    cluster = bench.make_cluster(256)
    pins = Pins.from_dict(PINS)
    start = time.perf_counter()
    report = compare(cluster, pins)
    render_table(report)
    report_json(report)
    elapsed = time.perf_counter() - start
    assert report["summary"]["hosts"] == 256
    assert {e["host"] for e in report["failures"]} == {"node002", "node003", "node004"}
    assert elapsed < 1.0, f"parity over 256 hosts took {elapsed:.2f} s"


# ---------------------------------------------------------------- the module, through Ansible itself


def run_module(args: dict, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_CALLBACK_RESULT_FORMAT": "json"}
    command = [
        str(Path(sys.executable).parent / "ansible"),
        "localhost",
        "-i",
        "localhost,",
        "-c",
        "local",
        "-e",
        f"ansible_python_interpreter={sys.executable}",
        "-m",
        "kimi.k2.kimi_parity",
        "-a",
        json.dumps(args),
        *extra,
    ]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)


def module_args(facts_dir: Path, report: Path) -> dict:
    return {
        "facts_dir": str(facts_dir),
        "hosts": ["node1", "node2", "node3"],
        "deb_pins": PINS["debs"],
        "wheel_pins": PINS["wheels"],
        "nccl_env": PINS["nccl_env"],
        "report_path": str(report),
    }


def test_module_end_to_end_fails_naming_node_item_and_versions_then_passes_after_reconverge(tmp_path):
    facts_dir = tmp_path / "facts"
    facts_dir.mkdir()
    for name in ("node1", "node2", "node3"):
        (facts_dir / f"{name}.json").write_text((FACTS_DIR / f"{name}.json").read_text())
    report = tmp_path / "parity.json"

    checked = run_module(module_args(facts_dir, report), "--check")
    assert checked.returncode == 2, checked.stdout + checked.stderr
    assert not report.exists()  # check mode compares but writes nothing

    failed = run_module(module_args(facts_dir, report))
    output = failed.stdout + failed.stderr
    assert failed.returncode == 2, output
    assert "node2: libnccl2 (deb) is 2.30.5-1+cuda13.3, expected 2.30.7-1+cuda13.3" in output
    assert "node3: nvidia-nccl-cu13 (wheel) is 2.30.4, expected 2.28.9" in output
    assert "libnccl2=2.30.7-1+cuda13.3 && apt-mark hold libnccl2" in output
    written = json.loads(report.read_text())
    assert written["ok"] is False
    assert {(e["host"], e["item"]) for e in written["failures"]} >= {
        ("node2", "deb:libnccl2"),
        ("node3", "wheel:nvidia-nccl-cu13"),
    }

    # Re-converged: every node now has node1's stack.
    for name in ("node2", "node3"):
        (facts_dir / f"{name}.json").write_text((FACTS_DIR / "node1.json").read_text())
    passed = run_module(module_args(facts_dir, report))
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert json.loads(report.read_text())["ok"] is True
    again = run_module(module_args(facts_dir, report))
    assert '"changed": false' in again.stdout  # same report, nothing rewritten
