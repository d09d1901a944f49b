"""Record, on a machine with an NVIDIA GPU, the outputs preflight and parity parse, as fixtures (`make gpu-facts`).

What is recorded is exactly what the modules run or read on a node: the two nvidia-smi CSV queries of
kimi_gpu (GPU_QUERY_ARGS, APPS_QUERY_ARGS), the driver query and /proc/driver/nvidia/version that
kimi_stack.gather_driver reads, the NCCL version the nvidia-nccl-cu13 (and -cu12) wheel's libnccl.so.2 reports
through ncclGetVersion (kimi_stack's own child-process probe), and the venv probe parity runs. Next to them:
`nvidia-smi -q` and `nvidia-smi topo -m` (nothing parses them yet; the planner's CUDA-visible totals and the
NVLink layout are read off them by hand), and torch's `cuda.mem_get_info` per device, the total vLLM starts
from. docs/gpu-facts.md says how to run it and how a recording replaces the reconstructed fixtures.

Stdlib only, Python 3.10 or newer, no vLLM, no network: it must run with a bare `python3` on a freshly lent GPU
machine. Every command runs in its own process group with its own timeout inside one whole-run bound, so a
hung nvidia-smi or a torch that never returns costs seconds, not the machine's lease; on timeout only that
group is killed. The torch and NCCL probes run in a child interpreter (`--pip-venv`), so a library that
crashes on load takes the child down, not the recording. manifest.json is rewritten after every step: a run
killed from outside still says how far it got.

Exit status: 0 everything recorded and parsed, 1 recorded with failures (listed in the manifest and on
stderr), 2 nothing recorded (no nvidia-smi, bad flags, an output directory that is not a recording).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ansible_collections.kimi.k2.plugins.module_utils.kimi_checkpoint import file_sha256 as sha256_file
from ansible_collections.kimi.k2.plugins.module_utils.kimi_gpu import APPS_QUERY_ARGS, GPU_QUERY_ARGS, gpu_facts
from ansible_collections.kimi.k2.plugins.module_utils.kimi_stack import (
    _NCCL_PROBE_SCRIPT,
    NCCL_WHEEL_LIBRARY,
    PROC_DRIVER_VERSION,
    VENV_PROBE_SCRIPT,
    interpret_nccl_probe,
    locate_nccl,
    parse_nvidia_smi_gpus,
    parse_proc_driver_version,
)

from . import CHECKOUT

MANIFEST_SCHEMA = 1
MANIFEST = "manifest.json"
DEFAULT_OUT = "gpu-facts"  # under the checkout, ignored by git until --promote copies it into tests/fixtures/
DEFAULT_TIMEOUT_S = 480  # the whole run: 8 minutes, inside the 10-minute limit of one command on a lent machine
MIB = 1024**2
# The query kimi_stack.gather_driver runs for parity's driver facts (the header-less CSV, units kept).
STACK_DRIVER_QUERY_ARGS = ("--query-gpu=name,driver_version", "--format=csv,noheader")
# The same two queries as kimi_gpu's, the way people paste them (header line, units): the -with-units fixtures.
WITH_UNITS_FORMAT = "--format=csv"
NCCL_WHEELS = ("nvidia-nccl-cu13", "nvidia-nccl-cu12")
# What the manifest keeps of kimi_gpu.gpu_facts (the figures preflight checks).
GPU_FACTS_SUMMARY = ("gpu_count", "gpu_names", "driver_versions", "memory_total_mib_min", "busy_gpus")

# Each step's own bound (seconds); the whole-run deadline and --command-timeout-s can only shorten it. torch gets
# the most: importing it and creating a CUDA context on every GPU takes tens of seconds on an 8-GPU node.
STEP_TIMEOUT_S = {
    "nvidia-smi": 60,
    "nvidia-smi -q": 120,
    "probe": 60,
    "torch": 240,
}

# Run by the probed interpreter. "not installed" (a skip) is told apart from a torch that is there but broken
# (a failure), and every device's figures are read even when one of them fails.
TORCH_PROBE_SCRIPT = """
import json, os, platform, sys
out = {"python": platform.python_version(), "executable": sys.executable,
       "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
try:
    import torch
except ModuleNotFoundError as error:
    if error.name != "torch":
        raise
    out["skipped"] = "torch is not installed for " + sys.executable
    print(json.dumps(out))
    sys.exit(0)
out["torch"] = torch.__version__
out["torch_cuda"] = torch.version.cuda
out["cuda_available"] = bool(torch.cuda.is_available())
out["device_count"] = torch.cuda.device_count() if out["cuda_available"] else 0
devices = []
for index in range(out["device_count"]):
    device = {"index": index}
    try:
        props = torch.cuda.get_device_properties(index)
        free, total = torch.cuda.mem_get_info(index)
        device.update(name=props.name, capability="%d.%d" % (props.major, props.minor),
                      free_bytes=int(free), total_bytes=int(total),
                      properties_total_memory_bytes=int(props.total_memory))
    except Exception as error:
        device["error"] = "%s: %s" % (type(error).__name__, error)
    devices.append(device)
out["devices"] = devices
try:
    out["torch_nccl"] = ".".join(str(part) for part in torch.cuda.nccl.version())
except Exception as error:
    out["torch_nccl_error"] = "%s: %s" % (type(error).__name__, error)
print(json.dumps(out))
"""

# Run by the probed interpreter: each NCCL wheel's version and the libnccl.so.2 its RECORD lists (where the
# wheel really puts it; kimi_stack looks at nvidia/nccl/lib/, and the recording says whether that holds).
NCCL_WHEEL_SCRIPT = """
import importlib.metadata as md, json, platform, sys, sysconfig
paths = sysconfig.get_paths()
out = {"python": platform.python_version(), "executable": sys.executable,
       "site_dirs": sorted({paths["purelib"], paths["platlib"]}), "wheels": {}}
for name in sys.argv[1:]:
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        out["wheels"][name] = None
        continue
    libraries = sorted(str(dist.locate_file(f)) for f in (dist.files or []) if f.name.startswith("libnccl.so"))
    out["wheels"][name] = {"wheel_version": dist.version, "site_dir": str(dist.locate_file("")),
                           "record_libraries": libraries}
print(json.dumps(out))
"""


class GpuFactsError(Exception):
    """A reason to record nothing (exit status 2)."""


@dataclass
class CommandResult:
    argv: list[str]
    exit_code: int | None  # None: it did not finish (timed out, or could not start)
    stdout: str
    stderr: str
    duration_s: float
    timeout_s: float
    timed_out: bool = False
    error: str | None = None  # could not start (OSError)


def run_bounded(argv: list[str], timeout_s: float, env: dict[str, str] | None = None) -> CommandResult:
    """Run argv in a new process group; past timeout_s kill that group (and only it) and say so.

    Output goes to temporary files, not pipes: a grandchild that escaped the group and kept a pipe open would
    otherwise block the read after the kill.
    """
    started = time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env, start_new_session=True
            )
        except OSError as error:
            return CommandResult(argv, None, "", "", time.monotonic() - started, timeout_s, error=str(error))
        timed_out = False
        try:
            proc.wait(timeout=max(timeout_s, 0.001))
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            # Also on KeyboardInterrupt or the SIGTERM handler's exception: nothing of ours outlives the run.
            if proc.poll() is None:
                _kill_group(proc.pid)
                proc.wait()
        out.seek(0)
        err.seek(0)
        return CommandResult(
            argv,
            None if timed_out else proc.returncode,
            out.read().decode("utf-8", "replace"),
            err.read().decode("utf-8", "replace"),
            round(time.monotonic() - started, 3),
            timeout_s,
            timed_out=timed_out,
        )


def _kill_group(pgid: int) -> None:
    # ProcessLookupError: the group ended between the check and the kill.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def gpu_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100-80gb-hbm3', 'NVIDIA H200' -> 'h200': the fixtures' case prefix."""
    text = re.sub(r"^nvidia\s+", "", name.strip(), flags=re.IGNORECASE).lower()
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-") or "gpu"


def case_name(gpus: list[dict[str, Any]]) -> str:
    """`<gpu-slug>-x<N>`, the name the existing nvidia-smi fixtures use (h200-x8); 'mixed' for mixed models."""
    names = sorted({gpu["name"] for gpu in gpus if gpu.get("name")})
    slug = gpu_slug(names[0]) if len(names) == 1 else ("mixed" if names else "unknown")
    return f"{slug}-x{len(gpus)}"


def file_names(case: str) -> dict[str, str]:
    """Each step's file. The query pairs match tests/fixtures/nvidia-smi/ so a recording can replace them."""
    return {
        "query-gpu": f"{case}.query-gpu.csv",
        "query-compute-apps": f"{case}.query-compute-apps.csv",
        "query-gpu-with-units": f"{case}-with-units.query-gpu.csv",
        "query-compute-apps-with-units": f"{case}-with-units.query-compute-apps.csv",
        "query-gpu-name-driver": f"{case}.query-gpu-name-driver.csv",
        "proc-driver-version": f"{case}.proc-driver-nvidia-version.txt",
        "nvidia-smi-q": f"{case}.nvidia-smi-q.txt",
        "nvidia-smi-topo-m": f"{case}.nvidia-smi-topo-m.txt",
        "nccl-wheel-version": f"{case}.nccl-wheel-version.json",
        "torch-mem-get-info": f"{case}.torch-mem-get-info.json",
        "venv-probe": f"{case}.venv-probe.json",
    }


# Steps whose files --promote also copies into tests/fixtures/nvidia-smi/, where kimi_gpu's tests read the pairs. Not
# the with-units pair: the reconstructed `*-with-units` case exists for its busy GPUs and [N/A] cells, which an
# idle machine's recording would erase; it stays with the rest in tests/fixtures/gpu-facts/<case>/.
NVIDIA_SMI_FIXTURE_STEPS = ("query-gpu", "query-compute-apps")

_FB_SECTION = re.compile(r"^\s*FB Memory Usage\s*$")
_FB_FIELD = re.compile(r"^\s*(Total|Reserved|Used|Free)\s*:\s*(\d+)\s*MiB\s*$")


def parse_fb_memory(text: str) -> list[dict[str, int]]:
    """Each GPU's 'FB Memory Usage' block of `nvidia-smi -q` in MiB (Total, Reserved, Used, Free).

    Reserved is what the driver keeps for itself; the planner's CUDA-visible totals are read against it.
    """
    blocks: list[dict[str, int]] = []
    current: dict[str, int] | None = None
    for line in text.splitlines():
        if _FB_SECTION.match(line):
            current = {}
            blocks.append(current)
            continue
        if current is None:
            continue
        match = _FB_FIELD.match(line)
        if match:
            current[f"{match.group(1).lower()}_mib"] = int(match.group(2))
        elif line.strip() and not line.startswith(" " * 8):
            current = None  # the next section of the same GPU (less indented): this block has ended
    return blocks


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def _now_utc() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _tail(text: str, limit: int = 2000) -> str:
    return text if len(text) <= limit else "..." + text[-limit:]


def _os_release() -> dict[str, str]:
    try:
        text = Path("/etc/os-release").read_text()
    except OSError:
        return {}
    values = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {key: values[key].strip('"') for key in ("ID", "VERSION_ID", "PRETTY_NAME") if key in values}


@dataclass
class Recorder:
    """One recording into `out`: the steps' files and the manifest that describes them."""

    out: Path
    nvidia_smi: str
    python: str
    timeout_s: float
    command_timeout_s: float | None = None
    proc_driver_version: Path = PROC_DRIVER_VERSION
    case: str | None = None
    log: Callable[[str], None] = field(default=lambda line: _stderr(line))
    started: float = field(default_factory=time.monotonic)
    steps: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    parsed: dict[str, Any] = field(default_factory=dict)
    outputs: dict[str, str] = field(default_factory=dict)  # step -> text written, for the parse checks
    recorded_at: str = field(default_factory=_now_utc)

    # ------------------------------------------------------------ bookkeeping

    def remaining(self) -> float:
        return self.timeout_s - (time.monotonic() - self.started)

    def step_timeout(self, kind: str) -> float:
        bound = min(STEP_TIMEOUT_S[kind], self.remaining())
        return bound if self.command_timeout_s is None else min(bound, self.command_timeout_s)

    def names(self) -> dict[str, str]:
        return file_names(self.case or "unknown-x0")

    def write(self, step: str, text: str) -> str:
        name = self.names()[step]
        (self.out / name).write_text(text)
        self.outputs[step] = text
        return name

    def skip(self, what: str, why: str) -> None:
        self.skipped.append({"what": what, "why": why})
        self.log(f"kimi-gpu-facts: skipped {what}: {why}")
        self.write_manifest(complete=False)

    def out_of_time(self, what: str) -> bool:
        if self.remaining() >= 1:
            return False
        self.skip(what, f"the whole-run bound of {self.timeout_s:g} s was reached")
        return True

    def record_command(self, step: str, result: CommandResult, file: str | None, ok: bool, **extra: Any) -> None:
        entry: dict[str, Any] = {
            "step": step,
            "argv": result.argv,
            "exit_code": result.exit_code,
            "duration_s": round(result.duration_s, 3),
            "timeout_s": round(result.timeout_s, 3),
            "timed_out": result.timed_out,
            "file": file,
            "ok": ok,
        }
        if result.error:
            entry["error"] = result.error
        if result.stderr.strip():
            entry["stderr"] = _tail(result.stderr)
        entry.update(extra)
        self.steps.append(entry)
        state = "ok" if ok else ("timed out" if result.timed_out else f"exit {result.exit_code}")
        self.log(f"kimi-gpu-facts: {step}: {state} in {result.duration_s:.1f} s" + (f" -> {file}" if file else ""))
        self.write_manifest(complete=False)

    def failures(self) -> list[str]:
        found = [
            f"{step['step']}: "
            + ("timed out" if step["timed_out"] else step.get("error") or f"exit status {step['exit_code']}")
            for step in self.steps
            if not step["ok"]
        ]
        found += [f"parse {name}: {value['error']}" for name, value in self.parsed.items() if "error" in value]
        return found

    def write_manifest(self, complete: bool) -> dict[str, Any]:
        files = {}
        for step in self.steps:
            name = step.get("file")
            if name and (self.out / name).is_file():
                path = self.out / name
                files[name] = {"sha256": sha256_file(path), "bytes": path.stat().st_size, "step": step["step"]}
        driver = self.parsed.get("proc-driver-version", {}).get("version") or next(
            iter(self.parsed.get("kimi_gpu.gpu_facts", {}).get("driver_versions", [])), None
        )
        manifest = {
            "schema": MANIFEST_SCHEMA,
            "tool": "bin/kimi-gpu-facts",
            "complete": complete,
            "case": self.case,
            "recorded_at": self.recorded_at,
            "duration_s": round(time.monotonic() - self.started, 3),
            "timeout_s": self.timeout_s,
            "host": {
                "kernel": platform.release(),
                "machine": platform.machine(),
                "os": _os_release(),
                "python": platform.python_version(),
            },
            "driver_version": driver,
            "nvidia_smi": self.nvidia_smi,
            "probe_python": self.python,
            "steps": self.steps,
            "files": files,
            "skipped": self.skipped,
            "parsed": self.parsed,
            "failures": self.failures(),
        }
        tmp = self.out / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        tmp.replace(self.out / MANIFEST)
        return manifest

    # ------------------------------------------------------------ steps

    def smi(
        self,
        step: str,
        args: tuple[str, ...] | list[str],
        kind: str = "nvidia-smi",
        before_write: Callable[[CommandResult], None] | None = None,
    ) -> CommandResult | None:
        if self.out_of_time(step):
            return None
        result = run_bounded([self.nvidia_smi, *args], self.step_timeout(kind))
        if before_write:
            before_write(result)
        ok = result.exit_code == 0
        # A failed command's output is kept too (it is evidence), but --promote only takes steps marked ok.
        file = self.write(step, result.stdout) if (result.stdout or ok) else None
        self.record_command(step, result, file, ok)
        return result

    def query_gpus(self) -> None:
        """The GPU query first: its GPU names and count make the case name every file is prefixed with."""

        def name_case(result: CommandResult) -> None:
            gpus: list[dict[str, Any]] = []
            if result.exit_code == 0:
                # Unparsable output is recorded anyway; check_parsers reports the error, under kimi_gpu.gpu_facts.
                with contextlib.suppress(ValueError):
                    gpus = gpu_facts(result.stdout)["gpus"]
            if self.case is None:
                self.case = case_name(gpus)

        self.smi("query-gpu", GPU_QUERY_ARGS, before_write=name_case)
        if self.case is None:  # not even run (a whole-run bound under a second)
            self.case = case_name([])

    def parse(self, name: str, parse: Callable[[], Any], summary: Callable[[Any], Any] = lambda v: v) -> Any:
        """Run one of the project's parsers on what was recorded and keep summary(result) under `name`.

        A parse error is kept instead, and makes the run fail: the recording is not what the parsers expect.
        Returns the full result, or None after an error.
        """
        try:
            value = parse()
        except Exception as error:  # any parser error is a finding to record, not a crash of the recording
            self.parsed[name] = {"error": f"{type(error).__name__}: {error}"}
            return None
        kept = summary(value)
        self.parsed[name] = kept if isinstance(kept, dict) else {"value": kept}
        return value

    def read_proc_driver_version(self) -> None:
        path = self.proc_driver_version
        try:
            text = path.read_text()
        except OSError as error:
            self.skip("proc-driver-version", f"cannot read {path} ({error.strerror}): is the kernel module loaded?")
            return
        file = self.write("proc-driver-version", text)
        self.parsed["proc-driver-version"] = {"version": parse_proc_driver_version(text)}
        # A file read, not a command: kept in the same list so the manifest has one record per file.
        self.record_command("proc-driver-version", CommandResult(["read", str(path)], 0, text, "", 0.0, 0), file, True)

    def probe(
        self, step: str, script: str, script_name: str, args: list[str], kind: str = "probe"
    ) -> tuple[CommandResult, Any] | None:
        """Run a script in the probed interpreter; (result, its last JSON line or None).

        The manifest's argv names the script instead of carrying its text.
        """
        if self.out_of_time(step):
            return None
        result = run_bounded([self.python, "-c", script, *args], self.step_timeout(kind))
        result.argv = [self.python, "-c", f"<{script_name}>", *args]
        data = None
        if result.exit_code == 0:
            try:
                data = json.loads(result.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                data = None
        return result, data

    def torch(self) -> None:
        probed = self.probe(
            "torch-mem-get-info", TORCH_PROBE_SCRIPT, "kimi_gpu_facts.TORCH_PROBE_SCRIPT", [], kind="torch"
        )
        if probed is None:
            return
        result, data = probed
        if isinstance(data, dict) and "skipped" in data:
            self.record_command("torch-mem-get-info", result, None, True, skipped=True)
            self.skip("torch-mem-get-info", data["skipped"])
            return
        if not isinstance(data, dict):
            self.record_command("torch-mem-get-info", result, None, False)
            return
        file = self.write("torch-mem-get-info", _json_text(data))
        # A torch that sees no GPU (a CPU build, a wrong venv) or fails on one is a finding, not a recording.
        problem = None
        if not data.get("cuda_available") or not data.get("devices"):
            problem = f"torch {data.get('torch')} in {self.python} sees no CUDA device"
        elif any("error" in device for device in data["devices"]):
            problem = "; ".join(f"device {d['index']}: {d['error']}" for d in data["devices"] if "error" in d)
        extra = {"error": problem} if problem else {}
        self.record_command("torch-mem-get-info", result, file, problem is None, **extra)

    def nccl(self) -> None:
        probed = self.probe(
            "nccl-wheel-version", NCCL_WHEEL_SCRIPT, "kimi_gpu_facts.NCCL_WHEEL_SCRIPT", list(NCCL_WHEELS)
        )
        if probed is None:
            return
        result, data = probed
        if not isinstance(data, dict):
            self.record_command("nccl-wheel-version", result, None, False)
            return
        wheels: dict[str, Any] = data["wheels"]
        if not any(wheels.values()):
            self.record_command("nccl-wheel-version", result, None, True, skipped=True)
            self.skip("nccl-wheel-version", f"no {' or '.join(NCCL_WHEELS)} wheel for {self.python}")
            return
        ok = True
        for name, wheel in wheels.items():
            if wheel is None:
                continue
            library = _wheel_library(wheel)
            wheel["library"] = library
            wheel["library_in_site_dir"] = _relative(library, wheel["site_dir"]) if library else None
            wheel["at_kimi_stack_path"] = wheel["library_in_site_dir"] == str(NCCL_WHEEL_LIBRARY)
            if library is None:
                wheel.update(version=None, code=None, error="the wheel has no libnccl.so.2")
                ok = False
                continue
            step = f"ncclGetVersion {name}"
            probed_version = self.probe(step, _NCCL_PROBE_SCRIPT, "kimi_stack._NCCL_PROBE_SCRIPT", [library])
            if probed_version is None:
                wheel.update(version=None, code=None, error="not probed: the whole-run bound was reached")
                ok = False
                continue
            version_result, _ = probed_version
            wheel.update(_read_nccl_probe(version_result))
            wheel["matches_wheel_version"] = wheel["version"] == wheel["wheel_version"]
            self.record_command(step, version_result, None, wheel["error"] is None)
            ok = ok and wheel["error"] is None
        # Which copy parity's locate_nccl picks from this interpreter's site dirs (no env file, no ldconfig).
        data["kimi_stack_locate_nccl"] = locate_nccl({}, data["site_dirs"], {})
        file = self.write("nccl-wheel-version", _json_text(data))
        self.record_command("nccl-wheel-version", result, file, ok)

    def venv_probe(self) -> None:
        probed = self.probe("venv-probe", VENV_PROBE_SCRIPT, "kimi_stack.VENV_PROBE_SCRIPT", [])
        if probed is None:
            return
        result, data = probed
        file = self.write("venv-probe", result.stdout) if data is not None else None
        self.record_command("venv-probe", result, file, data is not None)

    # ------------------------------------------------------------ the parse checks

    def check_parsers(self) -> None:
        """Parse the recording with the parsers preflight and parity use, the way they call them."""
        texts = self.outputs
        facts = None
        if "query-gpu" in texts:
            facts = self.parse(
                "kimi_gpu.gpu_facts",
                lambda: gpu_facts(texts["query-gpu"], texts.get("query-compute-apps", "")),
                lambda value: {key: value[key] for key in GPU_FACTS_SUMMARY},
            )
        if facts:
            self.parse("kimi_presets.gpu_preset_for_driver_name", lambda: _preset_check(facts))
        if "query-gpu-with-units" in texts:
            self.parse(
                "kimi_gpu.gpu_facts (with units)",
                lambda: gpu_facts(texts["query-gpu-with-units"], texts.get("query-compute-apps-with-units", "")),
                lambda value: {key: value[key] for key in GPU_FACTS_SUMMARY},
            )
        if "query-gpu-name-driver" in texts:
            self.parse(
                "kimi_stack.parse_nvidia_smi_gpus", lambda: parse_nvidia_smi_gpus(texts["query-gpu-name-driver"])
            )
        if "nvidia-smi-q" in texts:
            self.parse("nvidia-smi -q FB Memory Usage", lambda: parse_fb_memory(texts["nvidia-smi-q"]))
        if "torch-mem-get-info" in texts and facts:
            self.parse("torch vs nvidia-smi", lambda: _torch_vs_smi(json.loads(texts["torch-mem-get-info"]), facts))

    # ------------------------------------------------------------ the run

    def run(self) -> int:
        self.write_manifest(complete=False)
        self.query_gpus()
        self.smi("query-compute-apps", APPS_QUERY_ARGS)
        self.read_proc_driver_version()
        self.smi("query-gpu-name-driver", STACK_DRIVER_QUERY_ARGS)
        self.smi("nvidia-smi-q", ["-q"], kind="nvidia-smi -q")
        self.nccl()
        self.torch()
        self.smi("query-gpu-with-units", [GPU_QUERY_ARGS[0], WITH_UNITS_FORMAT])
        self.smi("query-compute-apps-with-units", [APPS_QUERY_ARGS[0], WITH_UNITS_FORMAT])
        self.smi("nvidia-smi-topo-m", ["topo", "-m"])
        self.venv_probe()
        self.check_parsers()
        manifest = self.write_manifest(complete=True)
        for failure in manifest["failures"]:
            self.log(f"kimi-gpu-facts: FAILED {failure}")
        self.log(f"kimi-gpu-facts: {len(manifest['files'])} files in {self.out} (case {self.case}); {MANIFEST}")
        return 1 if manifest["failures"] else 0


def _read_nccl_probe(result: CommandResult) -> dict[str, Any]:
    """kimi_stack's own reading of its own probe's output: the recording shows what parity would report."""
    if result.timed_out:
        return {"version": None, "code": None, "error": f"probe timed out after {result.timeout_s:g} s"}
    if result.exit_code is None:
        return {"version": None, "code": None, "error": f"probe did not run: {result.error}"}
    return interpret_nccl_probe(result.exit_code, result.stdout, result.stderr)


def _json_text(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def _wheel_library(wheel: dict[str, Any]) -> str | None:
    """The wheel's libnccl.so.2 from its RECORD; without a RECORD, the path kimi_stack assumes."""
    listed = [path for path in wheel["record_libraries"] if Path(path).name == "libnccl.so.2"]
    if listed:
        return listed[0]
    fallback = Path(wheel["site_dir"]) / NCCL_WHEEL_LIBRARY
    return str(fallback) if fallback.exists() else None


def _relative(path: str, base: str) -> str:
    try:
        return str(Path(path).relative_to(base))
    except ValueError:
        return path


def _preset_check(facts: dict[str, Any]) -> dict[str, Any]:
    """Each recorded GPU name's planner preset and its memory against the smallest recorded memory.total."""
    # Imported here: the presets are the planner's, and a recording must not fail for want of them.
    from ansible_collections.kimi.k2.plugins.module_utils.kimi_presets import gpu_preset_for_driver_name

    found = {}
    for name in facts["gpu_names"]:
        preset = gpu_preset_for_driver_name(name)
        smallest = min(g["memory_total_mib"] or 0 for g in facts["gpus"] if g["name"] == name)
        found[name] = {
            "preset": preset.key if preset else None,
            "preset_memory_mib": preset.memory_mib if preset else None,
            "recorded_memory_mib": smallest,
        }
    return found


def _torch_vs_smi(torch_data: dict[str, Any], facts: dict[str, Any]) -> list[dict[str, Any]]:
    """Per device: torch's CUDA-visible total against nvidia-smi's memory.total, in MiB.

    Matched by position: both enumerate in PCI bus order when CUDA_DEVICE_ORDER=PCI_BUS_ID, which the probe
    does not set, so the names are kept to make a mismatch visible.
    """
    rows = []
    for device, gpu in zip(torch_data.get("devices", []), facts["gpus"], strict=False):
        total = device.get("total_bytes")
        rows.append(
            {
                "index": device["index"],
                "torch_name": device.get("name"),
                "nvidia_smi_name": gpu["name"],
                "torch_total_mib": None if total is None else round(total / MIB, 1),
                "nvidia_smi_total_mib": gpu["memory_total_mib"],
                "difference_mib": None
                if total is None or gpu["memory_total_mib"] is None
                else round(gpu["memory_total_mib"] - total / MIB, 1),
            }
        )
    return rows


# ---------------------------------------------------------------- the output directory and promotion


def prepare_out(out: Path) -> None:
    """An empty directory, or an earlier recording (its files are removed); anything else is refused."""
    if out.exists() and not out.is_dir():
        raise GpuFactsError(f"{out} is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    present = sorted(p.name for p in out.iterdir())
    if not present:
        return
    manifest = out / MANIFEST
    if not manifest.is_file():
        raise GpuFactsError(f"{out} holds files and no {MANIFEST}: not an earlier recording; choose an empty --out")
    try:
        old = json.loads(manifest.read_text())
    except ValueError as error:
        raise GpuFactsError(f"{manifest} is not JSON ({error}); remove {out} by hand") from error
    ours = {step.get("file") for step in old.get("steps", [])} | set(old.get("files", {}))
    for name in ours:
        if name and (out / name).is_file() and "/" not in name:
            (out / name).unlink()
    manifest.unlink()


def promote(recording: Path, fixtures: Path, log: Callable[[str], None]) -> list[Path]:
    """Copy a complete recording over the matching fixtures.

    The nvidia-smi query files go to fixtures/nvidia-smi/ under their case name (replacing a reconstructed pair
    of the same name); the whole recording, manifest included, to fixtures/gpu-facts/<case>/. Only steps that
    succeeded are copied, and only files whose sha256 still matches the manifest.
    """
    try:
        manifest = json.loads((recording / MANIFEST).read_text())
    except (OSError, ValueError) as error:
        raise GpuFactsError(f"no readable {MANIFEST} in {recording}: {error}") from error
    if not manifest.get("complete"):
        raise GpuFactsError(f"{recording} is an incomplete recording (the run did not finish); record again")
    case = manifest.get("case")
    if not case or case.startswith("unknown"):
        raise GpuFactsError(f"{recording} recorded no GPU (case {case!r}); nothing to promote")
    good = {step["file"]: step["step"] for step in manifest["steps"] if step.get("ok") and step.get("file")}
    if "query-gpu" not in good.values():
        raise GpuFactsError(f"{recording}: the GPU query did not succeed; nothing to promote")
    for name, entry in manifest["files"].items():
        if name in good and sha256_file(recording / name) != entry["sha256"]:
            raise GpuFactsError(f"{recording / name} changed since it was recorded (sha256 differs from {MANIFEST})")
    copied: list[Path] = []
    case_dir = fixtures / "gpu-facts" / case
    case_dir.mkdir(parents=True, exist_ok=True)
    for stale in case_dir.iterdir():
        if stale.is_file():
            stale.unlink()  # an older recording of the same case: the new manifest must describe the directory
    for name, step in sorted(good.items()):
        targets = [case_dir / name]
        if step in NVIDIA_SMI_FIXTURE_STEPS:
            targets.append(fixtures / "nvidia-smi" / name)
        for target in targets:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(recording / name, target)
            copied.append(target)
    shutil.copyfile(recording / MANIFEST, case_dir / MANIFEST)
    copied.append(case_dir / MANIFEST)
    for path in copied:
        log(f"kimi-gpu-facts: promoted {path}")
    log(
        "kimi-gpu-facts: now mark these as recorded in tests/fixtures/nvidia-smi/README.md and docs/gpu-facts.md,"
        " and run the unit tests"
    )
    return copied


# ---------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kimi-gpu-facts",
        description="Record nvidia-smi, torch and NCCL-wheel facts of this GPU machine as test fixtures "
        "(docs/gpu-facts.md). Needs no vLLM and no network.",
    )
    parser.add_argument("--out", default=str(CHECKOUT / DEFAULT_OUT), help="recording directory (default: %(default)s)")
    parser.add_argument(
        "--timeout-s", type=float, default=DEFAULT_TIMEOUT_S, help="bound on the whole run (default: %(default)s)"
    )
    parser.add_argument(
        "--command-timeout-s", type=float, default=None, help="shorten every command's own timeout to this"
    )
    parser.add_argument("--nvidia-smi", default="nvidia-smi", help="nvidia-smi to run (default: the one on PATH)")
    parser.add_argument(
        "--pip-venv", default=None, help="venv whose bin/python runs the torch/NCCL probes (default: this python3)"
    )
    parser.add_argument(
        "--proc-driver-version", default=str(PROC_DRIVER_VERSION), help="the driver's version file (for tests)"
    )
    parser.add_argument("--case", default=None, help="file prefix (default: <gpu>-x<count>, e.g. h200-x8)")
    parser.add_argument(
        "--promote",
        metavar="RECORDING",
        default=None,
        help="copy a finished recording over the matching fixtures in tests/fixtures instead of recording",
    )
    parser.add_argument(
        "--fixtures",
        default=str(CHECKOUT / "tests" / "fixtures"),
        help="fixtures directory --promote writes to (default: this checkout's)",
    )
    return parser


class _TerminatedError(Exception):
    """SIGTERM, turned into an exception so run_bounded's cleanup kills the running child's group."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise _TerminatedError(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    log = _stderr
    try:
        if args.promote:
            promote(Path(args.promote), Path(args.fixtures), log)
            return 0
        if args.timeout_s <= 0:
            raise GpuFactsError("--timeout-s must be positive")
        if args.case is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", args.case):
            raise GpuFactsError(f"--case {args.case!r}: letters, digits, '.', '_' and '-' only (it names files)")
        python = sys.executable
        if args.pip_venv:
            python = str(Path(args.pip_venv) / "bin" / "python")
            if not Path(python).is_file():
                raise GpuFactsError(f"--pip-venv {args.pip_venv}: no bin/python there")
        nvidia_smi = shutil.which(args.nvidia_smi)
        if nvidia_smi is None:
            raise GpuFactsError(
                f"{args.nvidia_smi} not found on PATH: run this on a machine with the NVIDIA driver installed"
            )
        out = Path(args.out)
        prepare_out(out)
    except GpuFactsError as error:
        print(f"kimi-gpu-facts: {error}", file=sys.stderr)
        return 2
    recorder = Recorder(
        out=out,
        nvidia_smi=nvidia_smi,
        python=python,
        timeout_s=args.timeout_s,
        command_timeout_s=args.command_timeout_s,
        proc_driver_version=Path(args.proc_driver_version),
        case=args.case,
        log=log,
    )
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return recorder.run()
    except (_TerminatedError, KeyboardInterrupt):
        recorder.write_manifest(complete=False)
        log("kimi-gpu-facts: interrupted; the manifest says how far it got")
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
