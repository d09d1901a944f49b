"""nvidia-smi parsing (plugins/module_utils/kimi_gpu.py) on recorded outputs, and kimi_gpu_info end to end."""

from __future__ import annotations

import shlex
import stat

import pytest
from ansible_collections.kimi.k2.plugins.module_utils import kimi_gpu as kg
from ansible_collections.kimi.k2.plugins.module_utils import kimi_presets as presets

from tests import paths
from tests.unit.ansible_adhoc import run_module

FIXTURES = paths.FIXTURES / "nvidia-smi"


def fixture(case: str, query: str) -> str:
    return (FIXTURES / f"{case}.query-{query}.csv").read_text()


def facts(case: str) -> dict:
    return kg.gpu_facts(fixture(case, "gpu"), fixture(case, "compute-apps"))


def test_h100_node_idle():
    result = facts("h100-80gb-hbm3-x8")
    assert result["gpu_count"] == 8
    assert result["gpu_names"] == ["NVIDIA H100 80GB HBM3"]
    assert result["driver_versions"] == ["550.54.15"]
    assert result["memory_total_mib_min"] == 81559
    assert result["memory_total_mib_sum"] == 8 * 81559
    assert result["compute_processes"] == []
    assert result["busy_gpus"] == []
    first = result["gpus"][0]
    assert first["index"] == 0
    assert first["pci_bus_id"] == "00000000:18:00.0"
    assert first["uuid"].startswith("GPU-")
    assert first["memory_total_gib"] == pytest.approx(79.647, abs=1e-3)


def test_h100_memory_matches_the_planner_preset():
    for gpu in facts("h100-80gb-hbm3-x8")["gpus"]:
        preset = presets.gpu_preset_for_driver_name(gpu["name"])
        assert preset is not None and preset.memory_mib == gpu["memory_total_mib"]


def test_h200_node_matches_the_planner_preset():
    result = facts("h200-x8")
    assert [gpu["index"] for gpu in result["gpus"]] == list(range(8))
    assert {gpu["memory_total_mib"] for gpu in result["gpus"]} == {presets.GPU_PRESETS["h200"].memory_mib}
    assert presets.gpu_preset_for_driver_name(result["gpu_names"][0]).key == "h200"


def test_busy_gpus_name_the_pids():
    result = facts("h100-80gb-hbm3-x8-busy")
    assert result["busy_gpus"] == [
        {"index": 0, "uuid": result["gpus"][0]["uuid"], "pids": [48213, 51977]},
        {"index": 3, "uuid": result["gpus"][3]["uuid"], "pids": [2291]},
    ]
    lines = kg.describe_busy(result)
    assert lines[0] == "PID 48213 (/usr/bin/python3) holds 71234 MiB on GPU 0"
    assert "PID 2291" in lines[2] and "GPU 3" in lines[2]
    assert result["gpus"][0]["memory_used_mib"] == 75444


def test_header_and_units_are_understood():
    with_units = facts("h200-x8-with-units")
    plain = facts("h200-x8")
    assert [gpu["memory_total_mib"] for gpu in with_units["gpus"]] == [143771] * 8
    assert [gpu["uuid"] for gpu in with_units["gpus"]] == [gpu["uuid"] for gpu in plain["gpus"]]
    procs = with_units["compute_processes"]
    assert [(p["pid"], p["process_name"], p["used_memory_mib"]) for p in procs] == [
        (7731, "VLLM::Worker_TP0", 128450),
        (7732, "VLLM::Worker_TP1", None),
    ]
    assert kg.describe_busy(with_units)[1] == "PID 7732 (VLLM::Worker_TP1) holds unknown memory on GPU 1"


def test_unavailable_fields_become_none():
    gpus = kg.parse_gpus(fixture("unavailable-fields", "gpu"))
    assert gpus[0]["memory_total_mib"] == 81559
    assert gpus[0]["memory_used_mib"] is None
    assert gpus[1]["memory_total_mib"] is None
    assert gpus[1]["memory_total_gib"] is None
    assert gpus[1]["memory_used_mib"] is None
    assert kg.gpu_facts(fixture("unavailable-fields", "gpu"))["memory_total_mib_min"] == 81559


@pytest.mark.parametrize(
    ("text", "mib"),
    [("81559", 81559), ("81559 MiB", 81559), ("81559MiB", 81559), ("2 GiB", 2048), ("[N/A]", None), ("N/A", None)],
)
def test_parse_mib(text, mib):
    assert kg.parse_mib(text) == mib


def test_no_running_processes_message():
    assert kg.parse_compute_apps("No running processes found\n") == []
    assert kg.parse_compute_apps("") == []


@pytest.mark.parametrize(
    "text",
    [
        "No devices were found\n",
        "0, NVIDIA H200, GPU-1, 143771\n",
        "x, NVIDIA H200, GPU-1, 143771, 0, 550.144.03, 00000000:03:00.0\n",
        "0, NVIDIA H200, GPU-1, lots, 0, 550.144.03, 00000000:03:00.0\n",
    ],
)
def test_garbage_is_refused_with_the_line(text):
    with pytest.raises(kg.NvidiaSmiParseError):
        kg.parse_gpus(text)


def test_query_arguments_are_the_documented_ones():
    assert " ".join(kg.GPU_QUERY_ARGS) == (
        "--query-gpu=index,name,uuid,memory.total,memory.used,driver_version,pci.bus_id --format=csv,noheader,nounits"
    )
    assert " ".join(kg.APPS_QUERY_ARGS) == (
        "--query-compute-apps=pid,process_name,used_memory,gpu_uuid --format=csv,noheader,nounits"
    )


# --- the module, run by ansible against localhost with a stand-in nvidia-smi ----------------------------------------


def fake_nvidia_smi(tmp_path, case: str, *, gpu_rc: int = 0) -> str:
    script = tmp_path / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        f"  --query-gpu=*) cat {shlex.quote(str(FIXTURES / f'{case}.query-gpu.csv'))}; exit {gpu_rc} ;;\n"
        f"  --query-compute-apps=*) cat {shlex.quote(str(FIXTURES / f'{case}.query-compute-apps.csv'))} ;;\n"
        "  *) echo unexpected arguments >&2; exit 9 ;;\n"
        "esac\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_module_reports_busy_gpus(tmp_path):
    ok, result = run_module(
        tmp_path, "kimi_gpu_info", {"nvidia_smi": fake_nvidia_smi(tmp_path, "h100-80gb-hbm3-x8-busy")}
    )
    assert ok, result
    assert result["nvidia_smi_found"] is True
    assert result["gpu_count"] == 8
    assert [gpu["pids"] for gpu in result["busy_gpus"]] == [[48213, 51977], [2291]]
    assert result["gpus"][0]["preset"] == "h100-80gb"
    assert result["gpus"][0]["memory_matches_preset"] is True
    assert result["busy_descriptions"][2].startswith("PID 2291")


def test_module_fails_on_nvidia_smi_error(tmp_path):
    ok, result = run_module(tmp_path, "kimi_gpu_info", {"nvidia_smi": fake_nvidia_smi(tmp_path, "h200-x8", gpu_rc=6)})
    assert not ok
    assert "exit status 6" in result["msg"]


def test_module_missing_nvidia_smi(tmp_path):
    missing = str(tmp_path / "no-such-nvidia-smi")
    ok, result = run_module(tmp_path, "kimi_gpu_info", {"nvidia_smi": missing})
    assert not ok and "nvidia-smi not found" in result["msg"]
    ok, result = run_module(tmp_path, "kimi_gpu_info", {"nvidia_smi": missing, "missing_ok": True})
    assert ok and result["nvidia_smi_found"] is False and result["gpu_count"] == 0
