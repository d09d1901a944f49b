"""kimi_gpu_facts' pieces: case names, the bounded runner, the -q reader, the output directory and promotion.

bin/kimi-gpu-facts end to end (fake nvidia-smi, fake torch and NCCL wheel) is in tests/unit/bin/.
"""

from __future__ import annotations

import ast
import json
import os
import sys
import time

import pytest
from ansible_collections.kimi.k2.plugins.module_utils import kimi_gpu, kimi_stack
from kimi_tools import kimi_gpu_facts
from kimi_tools.kimi_gpu_facts import (
    GpuFactsError,
    case_name,
    file_names,
    gpu_slug,
    parse_fb_memory,
    prepare_out,
    promote,
    run_bounded,
)

from tests import paths

NVIDIA_SMI_FIXTURES = paths.FIXTURES / "nvidia-smi"

# Constructed for this test in the layout `nvidia-smi -q` prints (section at 4 spaces, fields at 8); the
# figures are invented. A real recording replaces nothing here: it is the parser's input format that matters.
SMI_Q_TWO_GPUS = """
==============NVSMI LOG==============

Attached GPUs                             : 2
GPU 00000000:03:00.0
    Product Name                          : NVIDIA H200
    FB Memory Usage
        Total                             : 143771 MiB
        Reserved                          : 551 MiB
        Used                              : 0 MiB
        Free                              : 143220 MiB
    BAR1 Memory Usage
        Total                             : 262144 MiB
        Used                              : 1 MiB
        Free                              : 262143 MiB
    Conf Compute Protected Memory Usage
        Total                             : 0 MiB
GPU 00000000:23:00.0
    Product Name                          : NVIDIA H200
    FB Memory Usage
        Total                             : 143771 MiB
        Reserved                          : 551 MiB
        Used                              : 4 MiB
        Free                              : 143216 MiB
"""


# ---------------------------------------------------------------- names


@pytest.mark.parametrize(
    ("name", "slug"),
    [
        ("NVIDIA H200", "h200"),
        ("NVIDIA H100 80GB HBM3", "h100-80gb-hbm3"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtx-pro-6000-blackwell-server-edition"),
        ("NVIDIA B200", "b200"),
        ("  ", "gpu"),
    ],
)
def test_gpu_slug(name, slug):
    assert gpu_slug(name) == slug


@pytest.mark.parametrize("case", ["h200-x8", "h100-80gb-hbm3-x8"])
def test_the_case_name_of_a_reconstructed_fixture_is_its_own_file_name(case):
    """A recording of the same node would land on exactly these files (so it replaces them)."""
    gpus = kimi_gpu.parse_gpus((NVIDIA_SMI_FIXTURES / f"{case}.query-gpu.csv").read_text())
    assert case_name(gpus) == case
    names = file_names(case)
    assert (NVIDIA_SMI_FIXTURES / names["query-gpu"]).is_file()
    assert (NVIDIA_SMI_FIXTURES / names["query-compute-apps"]).is_file()
    assert (NVIDIA_SMI_FIXTURES / names["query-gpu-with-units"]).name == f"{case}-with-units.query-gpu.csv"


def test_case_name_of_mixed_and_missing_gpus():
    assert case_name([{"name": "NVIDIA H200"}, {"name": "NVIDIA H100 80GB HBM3"}]) == "mixed-x2"
    assert case_name([]) == "unknown-x0"
    assert case_name([{"name": None}]) == "unknown-x1"


def test_every_file_of_a_case_is_prefixed_with_it_and_distinct():
    names = file_names("h200-x1")
    assert len(set(names.values())) == len(names)
    assert all(name.startswith("h200-x1") for name in names.values())


# ---------------------------------------------------------------- the queries are the modules' own


def test_the_driver_query_is_the_one_parity_runs():
    calls = []

    def runner(argv):
        calls.append(argv)
        return 0, "NVIDIA H200, 580.95.05\n", ""

    kimi_stack.gather_driver(runner, {}, "/usr/bin/nvidia-smi", paths.REPO_ROOT / "absent")
    assert calls == [["/usr/bin/nvidia-smi", *kimi_gpu_facts.STACK_DRIVER_QUERY_ARGS]]


def test_the_with_units_queries_differ_from_the_modules_only_in_the_format():
    assert kimi_gpu.GPU_QUERY_ARGS[1] == "--format=csv,noheader,nounits"
    assert kimi_gpu_facts.WITH_UNITS_FORMAT == "--format=csv"


# ---------------------------------------------------------------- nvidia-smi -q


def test_fb_memory_blocks_per_gpu_and_no_other_section():
    assert parse_fb_memory(SMI_Q_TWO_GPUS) == [
        {"total_mib": 143771, "reserved_mib": 551, "used_mib": 0, "free_mib": 143220},
        {"total_mib": 143771, "reserved_mib": 551, "used_mib": 4, "free_mib": 143216},
    ]
    assert parse_fb_memory("") == []


# ---------------------------------------------------------------- where a wheel keeps libnccl.so.2


def test_the_wheel_library_comes_from_its_record_wherever_it_is(tmp_path):
    """A wheel that ships the library elsewhere is still found, and the recording says kimi_stack would miss it."""
    elsewhere = str(tmp_path / "nvidia" / "cu13" / "lib" / "libnccl.so.2")
    wheel = {"record_libraries": [elsewhere + ".sig", elsewhere], "site_dir": str(tmp_path)}
    assert kimi_gpu_facts._wheel_library(wheel) == elsewhere
    assert kimi_gpu_facts._relative(elsewhere, str(tmp_path)) == "nvidia/cu13/lib/libnccl.so.2"


def test_without_a_record_the_wheel_library_is_looked_up_where_kimi_stack_does(tmp_path):
    wheel = {"record_libraries": [], "site_dir": str(tmp_path)}
    assert kimi_gpu_facts._wheel_library(wheel) is None
    library = tmp_path / kimi_stack.NCCL_WHEEL_LIBRARY
    library.parent.mkdir(parents=True)
    library.write_bytes(b"")
    assert kimi_gpu_facts._wheel_library(wheel) == str(library)


# ---------------------------------------------------------------- the bounded runner


def test_run_bounded_returns_output_and_status():
    result = run_bounded(
        [sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"], 30
    )
    assert (result.exit_code, result.stdout, result.stderr, result.timed_out) == (3, "out\n", "err\n", False)


def test_run_bounded_kills_the_whole_group_on_timeout(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    # The shell starts a grandchild and waits: killing only the shell would leave the sleep running.
    script = f"sleep 300 & echo $! > {pid_file}; echo started; wait"
    result = run_bounded(["/bin/sh", "-c", script], 1)
    assert result.timed_out and result.exit_code is None
    assert result.stdout == "started\n"  # what it printed before the kill is kept
    grandchild = int(pid_file.read_text())
    assert not process_alive(grandchild)


def test_run_bounded_reports_a_command_that_cannot_start(tmp_path):
    result = run_bounded([str(tmp_path / "absent")], 5)
    assert result.exit_code is None and not result.timed_out and result.error


def process_alive(pid: int) -> bool:
    """Whether pid exists and is not a zombie (a killed grandchild is reaped by init, eventually)."""
    for _ in range(50):
        try:
            status = (paths.Path("/proc") / str(pid) / "stat").read_text().split(") ", 1)[1][0]
        except OSError:
            return False
        if status == "Z":
            return False
        time.sleep(0.1)
    return True


# ---------------------------------------------------------------- the output directory


def test_prepare_out_creates_and_refuses_foreign_files(tmp_path):
    out = tmp_path / "new" / "dir"
    prepare_out(out)
    assert out.is_dir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(GpuFactsError, match="not an earlier recording"):
        prepare_out(out)


def test_prepare_out_clears_an_earlier_recording_only(tmp_path):
    (tmp_path / "h200-x1.query-gpu.csv").write_text("old")
    (tmp_path / "kept.txt").write_text("not ours")
    manifest = {"steps": [{"file": "h200-x1.query-gpu.csv"}, {"file": None}], "files": {}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    prepare_out(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.txt"]


# ---------------------------------------------------------------- promotion


def write_recording(directory, *, complete=True, query_ok=True):
    directory.mkdir(parents=True, exist_ok=True)
    files = {
        "h200-x1.query-gpu.csv": "0, NVIDIA H200, GPU-x, 143771, 0, 580.95.05, 00000000:03:00.0\n",
        "h200-x1.query-compute-apps.csv": "",
        "h200-x1.nvidia-smi-q.txt": SMI_Q_TWO_GPUS,
        "h200-x1.failed.txt": "error",
    }
    steps = [
        {"step": "query-gpu", "file": "h200-x1.query-gpu.csv", "ok": query_ok},
        {"step": "query-compute-apps", "file": "h200-x1.query-compute-apps.csv", "ok": True},
        {"step": "nvidia-smi-q", "file": "h200-x1.nvidia-smi-q.txt", "ok": True},
        {"step": "nvidia-smi-topo-m", "file": "h200-x1.failed.txt", "ok": False},
    ]
    for name, text in files.items():
        (directory / name).write_text(text)
    manifest = {
        "complete": complete,
        "case": "h200-x1",
        "steps": steps,
        "files": {name: {"sha256": kimi_gpu_facts.sha256_file(directory / name)} for name in files},
    }
    (directory / "manifest.json").write_text(json.dumps(manifest))


def test_promote_copies_the_good_steps_over_the_fixtures(tmp_path):
    write_recording(tmp_path / "rec")
    fixtures = tmp_path / "fixtures"
    (fixtures / "gpu-facts" / "h200-x1").mkdir(parents=True)
    (fixtures / "gpu-facts" / "h200-x1" / "stale.txt").write_text("older recording")
    copied = promote(tmp_path / "rec", fixtures, lambda line: None)
    relative = sorted(str(path.relative_to(fixtures)) for path in copied)
    assert relative == [
        "gpu-facts/h200-x1/h200-x1.nvidia-smi-q.txt",
        "gpu-facts/h200-x1/h200-x1.query-compute-apps.csv",
        "gpu-facts/h200-x1/h200-x1.query-gpu.csv",
        "gpu-facts/h200-x1/manifest.json",
        "nvidia-smi/h200-x1.query-compute-apps.csv",
        "nvidia-smi/h200-x1.query-gpu.csv",
    ]
    assert not (fixtures / "gpu-facts" / "h200-x1" / "stale.txt").exists()


def test_promote_refuses_incomplete_failed_or_changed_recordings(tmp_path):
    write_recording(tmp_path / "incomplete", complete=False)
    with pytest.raises(GpuFactsError, match="incomplete"):
        promote(tmp_path / "incomplete", tmp_path / "fx", lambda line: None)
    write_recording(tmp_path / "failed", query_ok=False)
    with pytest.raises(GpuFactsError, match="GPU query did not succeed"):
        promote(tmp_path / "failed", tmp_path / "fx", lambda line: None)
    write_recording(tmp_path / "changed")
    (tmp_path / "changed" / "h200-x1.query-gpu.csv").write_text("edited by hand\n")
    with pytest.raises(GpuFactsError, match="sha256 differs"):
        promote(tmp_path / "changed", tmp_path / "fx", lambda line: None)
    with pytest.raises(GpuFactsError, match=r"no readable manifest\.json"):
        promote(tmp_path / "absent", tmp_path / "fx", lambda line: None)
    assert not (tmp_path / "fx").exists()


def test_the_module_is_stdlib_only():
    """It runs with a bare python3 on a lent GPU machine: only the standard library, its package and the
    collection's module_utils (found through the checkout's collections/, no Ansible needed)."""
    tree = ast.parse((paths.REPO_ROOT / "contrib" / "kimi_tools" / "kimi_tools" / "kimi_gpu_facts.py").read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and not node.module.startswith("ansible_collections.kimi.k2.plugins.module_utils.")
        ):
            imported.add(node.module.split(".")[0])
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported
    assert os.access(paths.REPO_ROOT / "bin" / "kimi-gpu-facts", os.X_OK)


def test_bad_flags_record_nothing(tmp_path, capsys):
    assert kimi_gpu_facts.main(["--out", str(tmp_path / "o"), "--pip-venv", str(tmp_path / "no-venv")]) == 2
    assert kimi_gpu_facts.main(["--out", str(tmp_path / "o"), "--timeout-s", "0"]) == 2
    assert kimi_gpu_facts.main(["--out", str(tmp_path / "o"), "--case", "../h200"]) == 2
    errors = capsys.readouterr().err
    assert "--timeout-s must be positive" in errors
    assert f"--pip-venv {tmp_path / 'no-venv'}: no bin/python there" in errors
    assert "--case '../h200': letters, digits" in errors
    assert not (tmp_path / "o").exists()
