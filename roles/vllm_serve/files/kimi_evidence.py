"""Evidence of a fault, taken by the serve watchdog (kimi_watchdog.py) on its node right before it restarts the node's
vLLM unit: what the restart is about to destroy.

Why it exists: a restart ends the process that showed the fault. The Python stacks of a hung rank, the journal
around the fault, the sockets the rank held, the last /metrics and the GPU's error counters are gone with it, and
faults come back to the same hardware (a GPU's Xids, one IB port). docs/self-healing.md#evidence describes one
incident's files; playbooks/evidence.yml brings the last incidents of every node to the controller.

Bounded, so it never holds the heal up for long: every capture runs at once, in parallel, against one deadline
(timeout_s, at most MAX_TIMEOUT_S), and a command still running then is killed and noted; each file is cut to
FILE_MAX_BYTES (a journal keeps its end, the rest their start); the directory keeps at most `keep` incidents and
`max_bytes` in all, the oldest removed first. An incident is written under a hidden name and renamed when complete,
so a reader (the playbook) never sees half of one.

Written by hand because no tool does this part: py-spy, journalctl, ss and nvidia-smi do the capturing; this file
only finds the unit's processes, runs them within one bound and keeps the result. Standard library only, Python >=
3.10: it runs with the node's /usr/bin/python3 from the watchdog's directory (roles/vllm_serve/tasks/watchdog.yml).
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

# The bound: the heal waits at most this long for its evidence.
MAX_TIMEOUT_S = 20
# One file's cap: a journal tail of a few hundred lines is ~100 kB, a /metrics page of a large deployment a few
# hundred kB; more is noise, and cut with a note.
FILE_MAX_BYTES = 1024 * 1024
# A unit with more processes than this is not vLLM's; the stacks of the first ones are enough.
MAX_PROCESSES = 32
# Where a unit's cgroup lists its processes: the unified hierarchy (cgroup v2, Ubuntu 22.04 and later, Debian 12),
# its mount beside the v1 controllers on a hybrid host, and systemd's own v1 hierarchy on a legacy one (the lab's
# nodes run on a hybrid host).
CGROUP_HIERARCHIES = ("sys/fs/cgroup", "sys/fs/cgroup/unified", "sys/fs/cgroup/systemd")
# Incident directories: <UTC time>-<reason>; anything else in the directory is not ours and is left alone.
INCIDENT_NAME = re.compile(r"^\d{8}T\d{6}Z-[a-z0-9_]+(-\d+)?$")
PARTIAL_PREFIX = ".partial-"
# A partial incident older than this belongs to a check that died; the next capture removes it.
PARTIAL_MAX_AGE_S = 3600
# nvidia-smi's sections that hold a GPU's error state (ECC counts, retired pages, remapped rows, the reasons its
# clocks are held down, its temperature); sections a GPU lacks print N/A, so one list serves every model.
NVIDIA_SMI_SECTIONS = "ECC,PAGE_RETIREMENT,ROW_REMAPPER,PERFORMANCE,TEMPERATURE"
CUT_NOTE = "\n[... cut by kimi_evidence: {dropped} bytes not kept ...]\n"


@dataclass(frozen=True)
class Request:
    """What to capture for one restart (the watchdog's config and decision)."""

    directory: str  # the node's evidence directory (kimi_evidence_dir)
    unit: str  # the vLLM unit about to be restarted
    reason: str  # the restart's reason (kimi_watchdog_restarts_total's label)
    why: str  # the watchdog's sentence
    units: Sequence[str] = ()  # every unit of the group on this node whose journal tail is kept (the vLLM unit first)
    journal_lines: int = 300
    metrics_url: str = ""  # rank 0's /metrics ("" on a headless rank: it serves none)
    metrics_cache: str = ""  # the last /metrics a check read (rank 0)
    py_spy: str = ""  # py-spy in the service's venv ("" or missing: no stacks, noted)
    timeout_s: float = MAX_TIMEOUT_S
    keep: int = 20
    max_bytes: int = 512 * 1024 * 1024
    invocation_id: str = ""


@dataclass(frozen=True)
class Job:
    """One capture: a command whose output becomes `name`, or (url set) an HTTP GET."""

    name: str
    argv: tuple[str, ...] = ()
    url: str = ""
    keep_end: bool = False  # a journal: when cut, its last bytes are the ones that matter
    # Exit codes that are an answer, not a failure: journalctl -g exits 1 when nothing matched.
    quiet_codes: tuple[int, ...] = ()


@dataclass(frozen=True)
class Outcome:
    name: str
    seconds: float
    code: int | None = None  # the exit code; None when it did not finish or did not run
    error: str = ""  # why there is no output: a missing tool, a timeout, a refused connection
    output: str = ""
    timed_out: bool = False


@dataclass(frozen=True)
class Process:
    pid: int
    state: str  # /proc/PID/stat's state: R, S, D (uninterruptible, e.g. stuck in a driver call), T (stopped), Z
    wchan: str  # where in the kernel it sleeps
    exe: str
    cmdline: str

    @property
    def is_python(self) -> bool:
        return Path(self.exe).name.startswith("python")


Runner = Callable[[Sequence[str], float], tuple[int | None, str, str, bool]]
Fetcher = Callable[[str, float], tuple[int | None, str, str]]


@dataclass(frozen=True)
class Tools:
    """The capture's reach into the node; tests hand in fakes. `root` prefixes /proc and /sys/fs/cgroup."""

    run: Runner = field(default_factory=lambda: run_bounded)
    fetch: Fetcher = field(default_factory=lambda: fetch_bounded)
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    root: str = "/"
    hostname: Callable[[], str] = socket.gethostname
    which: Callable[[str], str | None] = shutil.which


@dataclass(frozen=True)
class Result:
    path: str  # the incident's directory ("" when none could be written)
    seconds: float
    problems: tuple[str, ...] = ()  # what is missing from it, one phrase each


# ------------------------------------------------------------------------------------------ what to run


def incident_name(wall: float, reason: str) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(wall))
    return f"{stamp}-{re.sub(r'[^a-z0-9_]', '_', reason.lower()) or 'restart'}"


def jobs_for(request: Request, processes: Sequence[Process], tools: Tools) -> list[Job]:
    """Every capture for this restart, in the order its files are listed."""
    jobs: list[Job] = []
    if request.py_spy and tools.which(request.py_spy):
        # --nonblocking reads the stacks without pausing the process: a stopped or hung rank is read as it is,
        # and a busy one is not held up for the dump.
        jobs += [
            Job(f"stacks-{p.pid}.txt", (request.py_spy, "dump", "--nonblocking", "--pid", str(p.pid)))
            for p in processes
            if p.is_python
        ]
    for unit in request.units:
        argv = ("journalctl", "-u", unit, "-n", str(request.journal_lines), "--no-pager", "-o", "short-iso-precise")
        jobs.append(Job(f"journal-{unit}.txt", argv, keep_end=True))
    # The kernel's GPU errors (Xid) of the last hour; nothing on nodes without the NVIDIA driver.
    xids = ("journalctl", "-k", "-g", "NVRM: Xid", "--since", "-1h", "--no-pager")
    jobs.append(Job("kernel.txt", xids, keep_end=True, quiet_codes=(1,)))
    jobs.append(Job("sockets.txt", ("ss", "-Htanp")))
    if request.metrics_url:
        jobs.append(Job("metrics.txt", url=request.metrics_url))
    if tools.which("nvidia-smi"):
        jobs.append(Job("gpu.txt", ("nvidia-smi", "-q", "-d", NVIDIA_SMI_SECTIONS)))
    return jobs


# ------------------------------------------------------------------------------------------ the unit's processes


def unit_processes(request: Request, tools: Tools) -> tuple[list[Process], str]:
    """The processes of the unit's cgroup (cgroup v2), and a problem when they cannot be read."""
    code, out, err, _ = tools.run(["systemctl", "show", "-p", "ControlGroup", "--value", request.unit], 5.0)
    group = out.strip()
    if code != 0 or not group:
        return [], f"no cgroup for {request.unit} ({(err or out).strip() or 'not running'})"
    tried = []
    for hierarchy in CGROUP_HIERARCHIES:
        procs = Path(tools.root, hierarchy, group.lstrip("/"), "cgroup.procs")
        try:
            pids = [int(line) for line in procs.read_text(encoding="ascii").split()]
        except (OSError, ValueError) as error:
            tried.append(f"{procs}: {error.strerror if isinstance(error, OSError) else error}")
            continue
        return [read_process(pid, tools.root) for pid in sorted(pids)[:MAX_PROCESSES]], ""
    return [], f"cannot read the processes of {request.unit} ({'; '.join(tried)})"


def read_process(pid: int, root: str = "/") -> Process:
    base = Path(root, "proc", str(pid))
    stat = _read(base / "stat")
    # The state follows the command name, which is in parentheses and may hold spaces or parentheses itself.
    state = stat[stat.rfind(")") + 2 :].split(" ", 1)[0] if ")" in stat else "?"
    try:
        exe = str((base / "exe").readlink())
    except OSError:
        exe = ""
    cmdline = _read(base / "cmdline").replace("\0", " ").strip()
    return Process(pid, state or "?", _read(base / "wchan").strip(), exe, cmdline)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def processes_text(processes: Sequence[Process]) -> str:
    lines = ["PID\tSTATE\tWCHAN\tEXE\tCMDLINE"]
    lines += [f"{p.pid}\t{p.state}\t{p.wchan or '-'}\t{p.exe or '-'}\t{p.cmdline}" for p in processes]
    return "\n".join(lines) + "\n"


def sockets_of(ss_output: str, pids: Sequence[int]) -> str:
    """The lines of `ss -Htanp` whose users are the unit's processes."""
    wanted = {f"pid={pid}," for pid in pids}
    return "".join(line + "\n" for line in ss_output.splitlines() if any(w in line for w in wanted))


# ------------------------------------------------------------------------------------------ running, bounded


def run_bounded(argv: Sequence[str], timeout: float) -> tuple[int | None, str, str, bool]:
    """(code, stdout, stderr, timed_out). subprocess.run kills the command when the timeout passes."""
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, errors="replace", timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as expired:
        out = expired.stdout.decode("utf-8", "replace") if isinstance(expired.stdout, bytes) else expired.stdout or ""
        return None, out, f"killed after {timeout:.1f} s", True
    except OSError as error:
        return None, "", str(error), False
    return done.returncode, done.stdout, done.stderr, False


def fetch_bounded(url: str, timeout: float) -> tuple[int | None, str, str]:
    """(HTTP status, body, error). No proxy: the URL is rank 0's own."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as response:
            return response.status, response.read(FILE_MAX_BYTES + 1).decode("utf-8", "replace"), ""
    except urllib.error.HTTPError as error:
        return error.code, "", f"HTTP {error.code}"
    except (urllib.error.URLError, OSError) as error:
        return None, "", str(getattr(error, "reason", error))


def run_jobs(jobs: Sequence[Job], deadline: float, tools: Tools) -> list[Outcome]:
    """Every job at once, each with what is left until the deadline."""
    if not jobs:
        return []
    with ThreadPoolExecutor(max_workers=min(len(jobs), 16), thread_name_prefix="evidence") as pool:
        return list(pool.map(lambda job: _run_one(job, deadline, tools), jobs))


def _run_one(job: Job, deadline: float, tools: Tools) -> Outcome:
    started = tools.clock()
    left = deadline - started
    if left <= 0:
        return Outcome(job.name, 0.0, error="no time left", timed_out=True)
    if job.url:
        status, body, error = tools.fetch(job.url, left)
        timed_out = "timed out" in error
        return Outcome(job.name, tools.clock() - started, status, error, body, timed_out)
    code, out, err, timed_out = tools.run(job.argv, left)
    error = "" if code == 0 or code in job.quiet_codes else err.strip() or f"exit code {code}"
    return Outcome(job.name, tools.clock() - started, code, error, out, timed_out)


# ------------------------------------------------------------------------------------------ keeping it


def cut(text: str, keep_end: bool) -> tuple[str, int]:
    """The text within FILE_MAX_BYTES (its end for a journal, its start otherwise) and the bytes dropped."""
    data = text.encode("utf-8", "replace")
    if len(data) <= FILE_MAX_BYTES:
        return text, 0
    dropped = len(data) - FILE_MAX_BYTES
    kept = data[dropped:] if keep_end else data[:FILE_MAX_BYTES]
    note = CUT_NOTE.format(dropped=dropped)
    body = kept.decode("utf-8", "ignore")
    return (note + body if keep_end else body + note), dropped


def bound_s(request: Request) -> float:
    """The capture's deadline in seconds: the request's, within 1 and MAX_TIMEOUT_S."""
    return max(1.0, min(float(request.timeout_s), MAX_TIMEOUT_S))


def capture(request: Request, tools: Tools | None = None) -> Result:
    """Write one incident into request.directory and prune the old ones; never raises for what the node lacks."""
    tools = tools or Tools()
    started = tools.clock()
    deadline = started + bound_s(request)
    base = Path(request.directory)
    name = incident_name(tools.wall(), request.reason)
    try:
        base.mkdir(mode=0o750, parents=True, exist_ok=True)
        partial = Path(base, PARTIAL_PREFIX + name)
        partial.mkdir(mode=0o750)
    except OSError as error:
        return Result("", tools.clock() - started, (f"cannot write {base}: {error}",))
    processes, problem = unit_processes(request, tools)
    problems = [problem] if problem else []
    if request.py_spy and not tools.which(request.py_spy):
        problems.append(f"no stacks: {request.py_spy} is missing")
    outcomes = run_jobs(jobs_for(request, processes, tools), deadline, tools)
    files = _write_files(partial, request, processes, outcomes)
    problems += [f"{o.name}: {o.error}" for o in outcomes if o.error or o.timed_out]
    final = _free_name(base, name)
    summary = _summary(request, tools, processes, outcomes, files, problems, tools.clock() - started)
    _write(partial / "incident.json", json.dumps({"incident": final.name, **summary}, indent=2, sort_keys=True) + "\n")
    partial.rename(final)
    prune(base, request.keep, request.max_bytes, keep_name=final.name, now=tools.wall())
    return Result(str(final), tools.clock() - started, tuple(problems))


def _write_files(
    directory: Path, request: Request, processes: Sequence[Process], outcomes: Sequence[Outcome]
) -> dict[str, int]:
    """Each capture's file (the sockets filtered to the unit's processes, the stacks in one file), with the bytes
    each one dropped."""
    dropped: dict[str, int] = {}
    stacks = [o for o in outcomes if o.name.startswith("stacks-")]
    texts: dict[str, tuple[str, bool]] = {"processes.txt": (processes_text(processes), False)}
    if stacks:
        texts["stacks.txt"] = ("".join(_stack_block(o, processes) for o in stacks), False)
    for outcome in outcomes:
        if outcome.name.startswith("stacks-"):
            continue
        text = outcome.output
        if outcome.name == "sockets.txt":
            text = sockets_of(text, [p.pid for p in processes])
        texts[outcome.name] = (text, outcome.name.startswith(("journal-", "kernel")))
    if request.metrics_cache:
        cached = _read(Path(request.metrics_cache))
        if cached:
            texts["metrics-last.txt"] = (cached, False)
    for name, (text, keep_end) in texts.items():
        kept, lost = cut(text, keep_end)
        _write(directory / name, kept)
        dropped[name] = lost
    return dropped


def _stack_block(outcome: Outcome, processes: Sequence[Process]) -> str:
    pid = int(outcome.name.removeprefix("stacks-").removesuffix(".txt"))
    process = next((p for p in processes if p.pid == pid), None)
    title = f"=== PID {pid} ({process.state if process else '?'}): {process.cmdline if process else ''}"
    body = outcome.output if outcome.output.strip() else f"(no stacks: {outcome.error or 'empty'})\n"
    return f"{title}\n{body}\n"


def _summary(
    request: Request,
    tools: Tools,
    processes: Sequence[Process],
    outcomes: Sequence[Outcome],
    dropped: Mapping[str, int],
    problems: Sequence[str],
    seconds: float,
) -> dict[str, object]:
    metrics_age = None
    if request.metrics_cache:
        try:
            metrics_age = round(tools.wall() - Path(request.metrics_cache).stat().st_mtime, 1)
        except OSError:
            metrics_age = None
    return {
        "version": 1,
        "node": tools.hostname(),
        "at": tools.wall(),
        "unit": request.unit,
        "invocation_id": request.invocation_id,
        "reason": request.reason,
        "why": request.why,
        "seconds": round(seconds, 3),
        "timeout_s": bound_s(request),
        "processes": [asdict(p) for p in processes],
        "captures": [
            {
                "name": o.name,
                "seconds": round(o.seconds, 3),
                "code": o.code,
                "timed_out": o.timed_out,
                "error": o.error[:500],
            }
            for o in outcomes
        ],
        "metrics_last_age_s": metrics_age,
        "bytes_cut": {name: lost for name, lost in dropped.items() if lost},
        "problems": list(problems),
    }


def _write(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")
    path.chmod(0o640)


def _free_name(base: Path, name: str) -> Path:
    candidate, number = Path(base, name), 1
    while candidate.exists():
        number += 1
        candidate = Path(base, f"{name}-{number}")
    return candidate


def incidents(base: Path) -> list[Path]:
    """The incident directories, oldest first (their names start with the UTC time)."""
    try:
        return sorted(p for p in base.iterdir() if p.is_dir() and INCIDENT_NAME.match(p.name))
    except OSError:
        return []


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def prune(base: Path, keep: int, max_bytes: int, *, keep_name: str = "", now: float | None = None) -> list[str]:
    """Remove the oldest incidents beyond `keep` or `max_bytes` in all (never `keep_name`, the one just written),
    and partial ones a dead check left. Returns the names removed."""
    removed: list[str] = []
    found = incidents(base)
    sizes = {p.name: _size(p) for p in found}
    total = sum(sizes.values())
    for path in found:
        if path.name == keep_name:
            continue
        if len(found) - len(removed) <= keep and total <= max_bytes:
            break
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path.name)
        total -= sizes[path.name]
    now = time.time() if now is None else now
    for stale in base.glob(PARTIAL_PREFIX + "*"):
        try:
            old = now - stale.stat().st_mtime > PARTIAL_MAX_AGE_S
        except OSError:
            continue
        if old:
            shutil.rmtree(stale, ignore_errors=True)
            removed.append(stale.name)
    return removed
