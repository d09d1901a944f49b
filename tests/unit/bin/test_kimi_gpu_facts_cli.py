"""bin/kimi-gpu-facts end to end, with stand-ins for the GPU machine.

A fake nvidia-smi on PATH prints the repository's own fixtures for exactly the argv kimi_gpu and kimi_stack run
(and exits 9 on any other), a throwaway venv carries a fake torch and fake nvidia-nccl-cu13 wheel whose
libnccl.so.2 is a real library built with gcc (so ctypes and ncclGetVersion run for real), and a fake
/proc/driver/nvidia/version. Then what the script wrote is read back with the parsers preflight and parity use.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from ansible_collections.kimi.k2.plugins.module_utils import kimi_gpu, kimi_preflight, kimi_stack
from kimi_tools import kimi_gpu_facts

from tests import paths

SCRIPT = paths.REPO_ROOT / "bin" / "kimi-gpu-facts"
NVIDIA_SMI = paths.FIXTURES / "nvidia-smi"
MIB = 1024**2

PROC_DRIVER = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  "
    "(dvs-builder@U16-I3-B03-4-3)  Tue Sep 23 09:55:41 UTC 2025\n"
)
# `nvidia-smi -q` and `topo -m` stand-ins: a few lines in their layout, invented figures (nothing parses topo).
SMI_Q = "==============NVSMI LOG==============\n" + "".join(
    f"GPU 00000000:{bus}:00.0\n    FB Memory Usage\n        Total                             : 143771 MiB\n"
    "        Reserved                          : 551 MiB\n        Used                              : 0 MiB\n"
    "        Free                              : 143220 MiB\n"
    for bus in ("03", "23", "43", "63", "83", "A3", "C3", "E3")
)
TOPO_M = "\tGPU0\tGPU1\nGPU0\t X \tNV18\nGPU1\tNV18\t X \n"
# The CUDA-visible total torch reports for each fake H200: a made-up figure below nvidia-smi's 143771 MiB.
TORCH_TOTAL_BYTES = 150_110_011_392

NCCL_STUB = """
int ncclGetVersion(int *version) { *version = NCCL_CODE; return 0; }
"""


def fake_nvidia_smi(directory: Path, case: str, hang: str | None = None, fail: str | None = None) -> Path:
    """nvidia-smi answering exactly the queries the script must run, from tests/fixtures/nvidia-smi/<case>.*.

    `hang`: a step whose command never returns (a grandchild sleeps; its pid goes to hung.pid); `fail`: one
    that exits 6, as nvidia-smi does when the driver is not loaded.
    """
    answers = {
        "query-gpu": (kimi_gpu.GPU_QUERY_ARGS, f"cat {NVIDIA_SMI / f'{case}.query-gpu.csv'}"),
        "query-compute-apps": (kimi_gpu.APPS_QUERY_ARGS, f"cat {NVIDIA_SMI / f'{case}.query-compute-apps.csv'}"),
        "query-gpu-with-units": (
            (kimi_gpu.GPU_QUERY_ARGS[0], "--format=csv"),
            f"cat {NVIDIA_SMI / 'h200-x8-with-units.query-gpu.csv'}",
        ),
        "query-compute-apps-with-units": (
            (kimi_gpu.APPS_QUERY_ARGS[0], "--format=csv"),
            f"cat {NVIDIA_SMI / 'h200-x8-with-units.query-compute-apps.csv'}",
        ),
        "query-gpu-name-driver": (
            ("--query-gpu=name,driver_version", "--format=csv,noheader"),
            "sed -n 's/^[0-9]*, \\([^,]*\\), [^,]*, [^,]*, [^,]*, \\([^,]*\\), .*/\\1, \\2/p' "
            + str(NVIDIA_SMI / f"{case}.query-gpu.csv"),
        ),
        "nvidia-smi-q": (("-q",), f"printf %s {shlex.quote(SMI_Q)}"),
        "nvidia-smi-topo-m": (("topo", "-m"), f"printf %s {shlex.quote(TOPO_M)}"),
    }
    lines = ["#!/bin/sh", 'case "$*" in']
    for step, (argv, action) in answers.items():
        if step == hang:
            action = f"sleep 300 & echo $! > {directory / 'hung.pid'}; wait"
        elif step == fail:
            action = "echo 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'; exit 6"
        lines.append(f"  {shlex.quote(' '.join(argv))}) {action} ;;")
    lines += ['  *) echo "fake nvidia-smi: unexpected arguments: $*" >&2; exit 9 ;;', "esac", ""]
    bin_dir = directory / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "nvidia-smi"
    script.write_text("\n".join(lines))
    script.chmod(0o755)
    return bin_dir


def fake_venv(directory: Path, *, torch: str | None = "ok", nccl_code: int | None = 22809) -> Path:
    """A venv (no pip) with a fake torch (`torch`: ok, no-cuda, or None for absent) and nccl-cu13 wheel."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(directory)
    site = Path(
        subprocess.run(
            [str(directory / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    if torch:
        available = torch == "ok"
        package = site / "torch"
        (package / "cuda").mkdir(parents=True)
        (package / "__init__.py").write_text("from . import cuda, version\n__version__ = '2.11.0+cu130'\n")
        (package / "version.py").write_text("cuda = '13.0'\n")
        (package / "cuda" / "__init__.py").write_text(
            "from types import SimpleNamespace\n"
            "from . import nccl\n"
            f"def is_available(): return {available}\n"
            "def device_count(): return 8\n"
            "def get_device_properties(i):\n"
            f"    return SimpleNamespace(name='NVIDIA H200', major=9, minor=0, total_memory={TORCH_TOTAL_BYTES})\n"
            f"def mem_get_info(i): return ({TORCH_TOTAL_BYTES - 600 * MIB}, {TORCH_TOTAL_BYTES})\n"
        )
        (package / "cuda" / "nccl.py").write_text("def version(): return (2, 28, 9)\n")
    if nccl_code is not None:
        if shutil.which("gcc") is None:
            pytest.skip("gcc is needed to build the stub libnccl.so.2")
        library = site / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
        library.parent.mkdir(parents=True)
        source = directory / "nccl.c"
        source.write_text(NCCL_STUB)
        subprocess.run(
            ["gcc", "-shared", "-fPIC", f"-DNCCL_CODE={nccl_code}", "-o", str(library), str(source)], check=True
        )
        dist_info = site / "nvidia_nccl_cu13-2.28.9.dist-info"
        dist_info.mkdir()
        (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: nvidia-nccl-cu13\nVersion: 2.28.9\n")
        (dist_info / "RECORD").write_text(
            "nvidia/nccl/lib/libnccl.so.2,,\n"
            "nvidia_nccl_cu13-2.28.9.dist-info/METADATA,,\nnvidia_nccl_cu13-2.28.9.dist-info/RECORD,,\n"
        )
    return directory


def run_script(tmp_path: Path, *args: str, smi_bin: Path, timeout: int = 120) -> subprocess.CompletedProcess:
    # PATH holds the fake nvidia-smi and the basics its shell needs (cat, sed, sleep), never a real nvidia-smi.
    env = {**os.environ, "PATH": os.pathsep.join([str(smi_bin), "/usr/bin", "/bin"])}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )


def manifest_of(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    """One full recording of the h200-x8 stand-in, shared by the tests that only read it."""
    tmp = tmp_path_factory.mktemp("gpu-facts")
    proc = tmp / "version"
    proc.write_text(PROC_DRIVER)
    out = tmp / "out"
    result = run_script(
        tmp,
        "--out",
        str(out),
        "--pip-venv",
        str(fake_venv(tmp / "venv")),
        "--proc-driver-version",
        str(proc),
        smi_bin=fake_nvidia_smi(tmp, "h200-x8"),
    )
    return result, out


def test_records_every_file_named_like_the_fixtures(recording):
    result, out = recording
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "h200-x8-with-units.query-compute-apps.csv",
        "h200-x8-with-units.query-gpu.csv",
        "h200-x8.nccl-wheel-version.json",
        "h200-x8.nvidia-smi-q.txt",
        "h200-x8.nvidia-smi-topo-m.txt",
        "h200-x8.proc-driver-nvidia-version.txt",
        "h200-x8.query-compute-apps.csv",
        "h200-x8.query-gpu-name-driver.csv",
        "h200-x8.query-gpu.csv",
        "h200-x8.torch-mem-get-info.json",
        "h200-x8.venv-probe.json",
        "manifest.json",
    ]
    # The pair that replaces the reconstructed fixture is byte for byte what nvidia-smi printed.
    for query in ("query-gpu", "query-compute-apps"):
        assert (out / f"h200-x8.{query}.csv").read_bytes() == (NVIDIA_SMI / f"h200-x8.{query}.csv").read_bytes()


def test_manifest_has_each_command_its_status_and_every_files_sha256(recording):
    _, out = recording
    manifest = manifest_of(out)
    assert manifest["complete"] is True and manifest["failures"] == [] and manifest["skipped"] == []
    assert manifest["case"] == "h200-x8"
    assert manifest["driver_version"] == "580.95.05"  # the kernel module's, as parity prefers it
    assert manifest["host"]["kernel"] and manifest["recorded_at"].endswith("Z")
    steps = {step["step"]: step for step in manifest["steps"]}
    assert steps["query-gpu"]["argv"][1:] == list(kimi_gpu.GPU_QUERY_ARGS)
    assert steps["query-compute-apps"]["argv"][1:] == list(kimi_gpu.APPS_QUERY_ARGS)
    assert steps["nvidia-smi-q"]["argv"][1:] == ["-q"]
    assert steps["torch-mem-get-info"]["argv"][1:] == ["-c", "<kimi_gpu_facts.TORCH_PROBE_SCRIPT>"]
    assert steps["ncclGetVersion nvidia-nccl-cu13"]["argv"][-1].endswith("nvidia/nccl/lib/libnccl.so.2")
    for step in manifest["steps"]:
        assert step["ok"] and step["exit_code"] == 0 and step["timed_out"] is False
        assert (step["duration_s"] >= 0 and step["timeout_s"] > 0) or step["step"] == "proc-driver-version"
    assert set(manifest["files"]) == {p.name for p in out.iterdir()} - {"manifest.json"}
    for name, entry in manifest["files"].items():
        assert entry["sha256"] == kimi_gpu_facts.sha256_file(out / name)
        assert entry["bytes"] == (out / name).stat().st_size


def test_the_recorded_files_parse_with_the_projects_own_parsers(recording):
    """What preflight and parity would make of this recording: a real machine's will be read the same way."""
    _, out = recording
    facts = kimi_gpu.gpu_facts(
        (out / "h200-x8.query-gpu.csv").read_text(), (out / "h200-x8.query-compute-apps.csv").read_text()
    )
    assert facts["gpu_count"] == 8 and facts["gpu_names"] == ["NVIDIA H200"]
    req = kimi_preflight.Requirements(accelerator="nvidia", gpus_per_node=8, gpu="h200", driver_version_prefix="550.")
    assert kimi_preflight.check_devices(req, {}, facts).status == "ok"
    assert kimi_preflight.check_driver(req, facts).status == "ok"
    node = {"processes": {}}
    assert kimi_preflight.check_device_processes(req, node, facts).status == "ok"
    with_units = kimi_gpu.gpu_facts(
        (out / "h200-x8-with-units.query-gpu.csv").read_text(),
        (out / "h200-x8-with-units.query-compute-apps.csv").read_text(),
    )
    assert with_units["gpu_count"] == 8 and len(with_units["compute_processes"]) == 2
    # Parity's driver facts: the query kimi_stack runs, and the kernel module's version file.
    smi = kimi_stack.parse_nvidia_smi_gpus((out / "h200-x8.query-gpu-name-driver.csv").read_text())
    assert smi == [{"name": "NVIDIA H200", "driver_version": "550.144.03"}] * 8
    assert kimi_stack.parse_proc_driver_version((out / "h200-x8.proc-driver-nvidia-version.txt").read_text()) == (
        "580.95.05"
    )
    # The NCCL wheel's library, read through ctypes by kimi_stack's own probe.
    nccl = json.loads((out / "h200-x8.nccl-wheel-version.json").read_text())
    cu13 = nccl["wheels"]["nvidia-nccl-cu13"]
    assert (cu13["wheel_version"], cu13["version"], cu13["code"], cu13["error"]) == ("2.28.9", "2.28.9", 22809, None)
    assert cu13["matches_wheel_version"] and cu13["at_kimi_stack_path"]
    assert nccl["wheels"]["nvidia-nccl-cu12"] is None
    assert nccl["kimi_stack_locate_nccl"]["source"] == "wheel"
    assert nccl["kimi_stack_locate_nccl"]["path"] == cu13["library"]
    # torch's CUDA-visible totals, per device, next to nvidia-smi's.
    torch = json.loads((out / "h200-x8.torch-mem-get-info.json").read_text())
    assert torch["torch"] == "2.11.0+cu130" and torch["torch_nccl"] == "2.28.9"
    assert [device["total_bytes"] for device in torch["devices"]] == [TORCH_TOTAL_BYTES] * 8
    parsed = manifest_of(out)["parsed"]
    assert parsed["kimi_gpu.gpu_facts"]["memory_total_mib_min"] == 143771
    assert parsed["kimi_presets.gpu_preset_for_driver_name"]["NVIDIA H200"]["preset"] == "h200"
    assert parsed["nvidia-smi -q FB Memory Usage"]["value"][0]["reserved_mib"] == 551
    first = parsed["torch vs nvidia-smi"]["value"][0]
    assert first["difference_mib"] == pytest.approx(143771 - TORCH_TOTAL_BYTES / MIB, abs=0.1)


def test_without_torch_or_an_nccl_wheel_the_manifest_says_so(tmp_path):
    out = tmp_path / "out"
    bare = fake_venv(tmp_path / "venv", torch=None, nccl_code=None)
    result = run_script(
        tmp_path,
        "--out",
        str(out),
        "--pip-venv",
        str(bare),
        "--proc-driver-version",
        str(tmp_path / "absent"),
        smi_bin=fake_nvidia_smi(tmp_path, "h100-80gb-hbm3-x8-busy"),
    )
    assert result.returncode == 0, result.stderr
    manifest = manifest_of(out)
    skipped = {entry["what"]: entry["why"] for entry in manifest["skipped"]}
    python = str(bare / "bin" / "python")
    assert skipped["torch-mem-get-info"] == f"torch is not installed for {python}"
    assert skipped["nccl-wheel-version"] == f"no nvidia-nccl-cu13 or nvidia-nccl-cu12 wheel for {python}"
    assert "cannot read" in skipped["proc-driver-version"]
    assert not list(out.glob("*.torch-mem-get-info.json")) and not list(out.glob("*.nccl-wheel-version.json"))
    assert manifest["case"] == "h100-80gb-hbm3-x8"
    assert manifest["driver_version"] == "550.54.15"  # from nvidia-smi when the kernel module's file is absent
    assert [gpu["pids"] for gpu in manifest["parsed"]["kimi_gpu.gpu_facts"]["busy_gpus"]] == [[48213, 51977], [2291]]


def test_a_torch_that_sees_no_gpu_is_a_failure(tmp_path):
    out = tmp_path / "out"
    result = run_script(
        tmp_path,
        "--out",
        str(out),
        "--pip-venv",
        str(fake_venv(tmp_path / "venv", torch="no-cuda", nccl_code=None)),
        smi_bin=fake_nvidia_smi(tmp_path, "h200-x8"),
    )
    assert result.returncode == 1
    assert manifest_of(out)["failures"] == [
        f"torch-mem-get-info: torch 2.11.0+cu130 in {tmp_path / 'venv' / 'bin' / 'python'} sees no CUDA device"
    ]
    assert "FAILED torch-mem-get-info" in result.stderr


def test_a_hung_nvidia_smi_is_killed_with_its_process_group_and_recorded(tmp_path):
    out = tmp_path / "out"
    result = run_script(
        tmp_path,
        "--out",
        str(out),
        "--command-timeout-s",
        "1",
        "--pip-venv",
        str(fake_venv(tmp_path / "venv", torch=None, nccl_code=None)),
        smi_bin=fake_nvidia_smi(tmp_path, "h200-x8", hang="nvidia-smi-q"),
    )
    assert result.returncode == 1
    manifest = manifest_of(out)
    hung = next(step for step in manifest["steps"] if step["step"] == "nvidia-smi-q")
    assert hung["timed_out"] is True and hung["exit_code"] is None and hung["ok"] is False
    assert hung["timeout_s"] == 1
    assert manifest["failures"] == ["nvidia-smi-q: timed out"]
    # The steps after it still ran, and the sleeping grandchild went down with the group.
    assert (out / "h200-x8.nvidia-smi-topo-m.txt").is_file() and manifest["complete"] is True
    grandchild = int((tmp_path / "hung.pid").read_text())
    assert not Path(f"/proc/{grandchild}").exists() or "Z" in Path(f"/proc/{grandchild}/stat").read_text()


def test_the_whole_run_bound_skips_what_is_left(tmp_path):
    out = tmp_path / "out"
    result = run_script(
        tmp_path,
        "--out",
        str(out),
        "--timeout-s",
        "2",
        "--pip-venv",
        str(fake_venv(tmp_path / "venv", torch=None, nccl_code=None)),
        smi_bin=fake_nvidia_smi(tmp_path, "h200-x8", hang="query-compute-apps"),
    )
    assert result.returncode == 1
    manifest = manifest_of(out)
    hung = next(step for step in manifest["steps"] if step["step"] == "query-compute-apps")
    assert hung["timed_out"] is True and hung["timeout_s"] <= 2
    skipped = {entry["what"]: entry["why"] for entry in manifest["skipped"]}
    assert skipped["nvidia-smi-topo-m"] == "the whole-run bound of 2 s was reached"
    assert "torch-mem-get-info" in skipped and "nvidia-smi-q" in skipped
    assert (out / "h200-x8.query-gpu.csv").is_file()  # what was recorded before the bound is kept


def test_a_failing_nvidia_smi_is_recorded_and_not_promotable(tmp_path):
    out = tmp_path / "out"
    result = run_script(
        tmp_path,
        "--out",
        str(out),
        "--pip-venv",
        str(fake_venv(tmp_path / "venv", torch=None, nccl_code=None)),
        smi_bin=fake_nvidia_smi(tmp_path, "h200-x8", fail="query-gpu"),
    )
    assert result.returncode == 1
    manifest = manifest_of(out)
    assert manifest["case"] == "unknown-x0"
    assert manifest["failures"][0] == "query-gpu: exit status 6"
    assert "could not communicate" in (out / "unknown-x0.query-gpu.csv").read_text()
    promoted = subprocess.run(
        [sys.executable, str(SCRIPT), "--promote", str(out), "--fixtures", str(tmp_path / "fixtures")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert promoted.returncode == 2 and "recorded no GPU" in promoted.stderr


def test_missing_nvidia_smi_is_a_clear_error_and_records_nothing(tmp_path):
    out = tmp_path / "out"
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    result = run_script(tmp_path, "--out", str(out), smi_bin=empty)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "kimi-gpu-facts: nvidia-smi not found on PATH: run this on a machine with the NVIDIA driver installed"
    )
    assert not out.exists()


def test_recording_again_replaces_the_earlier_recording_and_promote_copies_it(tmp_path):
    out = tmp_path / "out"
    bare = str(fake_venv(tmp_path / "venv", torch=None, nccl_code=None))
    first = run_script(tmp_path, "--out", str(out), "--pip-venv", bare, smi_bin=fake_nvidia_smi(tmp_path, "h200-x8"))
    assert first.returncode == 0, first.stderr
    second = run_script(
        tmp_path, "--out", str(out), "--pip-venv", bare, smi_bin=fake_nvidia_smi(tmp_path / "h100", "h100-80gb-hbm3-x8")
    )
    assert second.returncode == 0, second.stderr
    assert {p.name.split(".")[0] for p in out.iterdir()} == {
        "h100-80gb-hbm3-x8",
        "h100-80gb-hbm3-x8-with-units",
        "manifest",
    }
    fixtures = tmp_path / "fixtures"
    promoted = subprocess.run(
        [sys.executable, str(SCRIPT), "--promote", str(out), "--fixtures", str(fixtures)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert promoted.returncode == 0, promoted.stderr
    assert (fixtures / "nvidia-smi" / "h100-80gb-hbm3-x8.query-gpu.csv").read_bytes() == (
        NVIDIA_SMI / "h100-80gb-hbm3-x8.query-gpu.csv"
    ).read_bytes()
    assert (fixtures / "gpu-facts" / "h100-80gb-hbm3-x8" / "manifest.json").read_bytes() == (
        out / "manifest.json"
    ).read_bytes()


def test_make_gpu_facts_runs_the_script_with_a_bare_python3(tmp_path):
    """`make -n` only prints the recipe: the target needs no venv, and GPU_FACTS_OUT picks the directory."""
    result = subprocess.run(
        ["make", "--no-print-directory", "-n", "gpu-facts", f"GPU_FACTS_OUT={tmp_path}/rec"],
        cwd=paths.REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == f"python3 bin/kimi-gpu-facts --out {tmp_path}/rec"
    makefile = (paths.REPO_ROOT / "Makefile").read_text()
    phony = next(line for line in makefile.splitlines() if line.startswith(".PHONY:"))
    assert "gpu-facts" in phony.split()
    assert "/gpu-facts/" in (paths.REPO_ROOT / ".gitignore").read_text().splitlines()
