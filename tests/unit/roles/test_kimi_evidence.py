"""roles/vllm_serve/files/kimi_evidence.py, the evidence the watchdog takes before a restart (imported as on a node):
what it runs for which processes, the bound in time (real commands killed at the deadline), the cuts, the
incident's files and the retention."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.node_programs import watchdog

watchdog()  # lays out the watchdog's directory, kimi_evidence.py included, on sys.path
from kimi_evidence import (  # noqa: E402
    FILE_MAX_BYTES,
    MAX_PROCESSES,
    Job,
    Process,
    Request,
    Tools,
    capture,
    cut,
    incident_name,
    jobs_for,
    processes_text,
    prune,
    read_process,
    run_bounded,
    run_jobs,
    sockets_of,
)

UNIT = "kimi-vllm.service"
PY_SPY = "/opt/vllm/current/bin/py-spy"
CGROUP = "/system.slice/kimi-vllm.service"
WALL = 1_800_000_000.0  # 2027-01-15T08:00:00Z
SS = (
    'ESTAB 0 0 198.18.0.11:29501 198.18.0.12:40000 users:(("python3",pid=101,fd=20))\n'
    'LISTEN 0 128 0.0.0.0:8000 0.0.0.0:* users:(("python3",pid=100,fd=7))\n'
    'ESTAB 0 0 127.0.0.1:22 127.0.0.1:5000 users:(("sshd",pid=55,fd=3))\n'
    'ESTAB 0 0 127.0.0.1:9100 127.0.0.1:5001 users:(("node_exporter",pid=1000,fd=3))\n'
)


def fake_proc(root: Path, pid: int, comm: str, state: str, exe: str, cmdline: str) -> None:
    base = root / "proc" / str(pid)
    base.mkdir(parents=True)
    (base / "stat").write_text(f"{pid} ({comm}) {state} 1 {pid} {pid} 0 -1 4194560 0 0\n")
    (base / "cmdline").write_text(cmdline.replace(" ", "\0") + "\0")
    (base / "wchan").write_text("futex_wait_queue" if state != "R" else "0")
    (base / "exe").symlink_to(exe)


class FakeNode:
    """A node's /proc and cgroup tree under tmp_path, and the commands' answers; records what was run."""

    def __init__(self, tmp_path: Path, tools_present=("py-spy", "nvidia-smi")) -> None:
        self.root = tmp_path / "root"
        group = self.root / "sys/fs/cgroup" / CGROUP.lstrip("/")
        group.mkdir(parents=True)
        (group / "cgroup.procs").write_text("100\n101\n102\n")
        fake_proc(self.root, 100, "vllm", "S", "/opt/vllm/0.32.0/bin/python3.11", "/opt/vllm/current/bin/vllm serve m")
        # The command name of a process may hold spaces and parentheses: the state is read after the last ")".
        fake_proc(self.root, 101, "VLLM::Eng (x)", "T", "/usr/bin/python3.11", "VLLM::EngineCore")
        fake_proc(self.root, 102, "sh", "S", "/usr/bin/dash", "sh -c true")
        self.present = tools_present
        self.ran: list[tuple[list[str], float]] = []
        self.answers = {
            "py-spy": (0, "Thread 0x1 (idle): MainThread\n    wait (threading.py:320)\n", "", False),
            "journalctl": (0, "2027-01-15T07:59:59 node1 vllm[100]: INFO serving\n", "", False),
            "ss": (0, SS, "", False),
            "nvidia-smi": (0, "==============NVSMI LOG==============\nECC Errors\n    Volatile\n", "", False),
        }
        self.clock_at = 100.0

    def run(self, argv, timeout):
        argv = list(argv)
        self.ran.append((argv, timeout))
        if argv[:2] == ["systemctl", "show"]:
            return 0, CGROUP + "\n", "", False
        name = Path(argv[0]).name
        return self.answers[name]

    def fetch(self, url, timeout):
        self.ran.append((["GET", url], timeout))
        return 200, "vllm:num_requests_running 3\n", ""

    def which(self, name):
        return name if Path(name).name in self.present else None

    def tools(self) -> Tools:
        return Tools(
            run=self.run,
            fetch=self.fetch,
            clock=lambda: self.clock_at,
            wall=lambda: WALL,
            root=str(self.root),
            hostname=lambda: "node1",
            which=self.which,
        )


def rank0_request(tmp_path: Path, **changes) -> Request:
    cache = tmp_path / "metrics-cache.txt"
    cache.write_text("vllm:generation_tokens_total 100\n")
    values = {
        "directory": str(tmp_path / "evidence"),
        "unit": UNIT,
        "reason": "rank0_stalled",
        "why": "/health 200 but the one-token request got timeout, 3 checks in a row",
        "units": (UNIT, "kimi-vllm-watchdog.service"),
        "metrics_url": "http://127.0.0.1:8000/metrics",
        "metrics_cache": str(cache),
        "py_spy": PY_SPY,
        "invocation_id": "inv-1",
        **changes,
    }
    return Request(**values)


def test_a_rank_0_incident_holds_stacks_journals_sockets_metrics_and_the_gpu(tmp_path):
    node = FakeNode(tmp_path)
    result = capture(rank0_request(tmp_path), node.tools())
    incident = Path(result.path)
    assert incident == tmp_path / "evidence" / "20270115T080000Z-rank0_stalled"
    assert result.problems == ()
    assert sorted(p.name for p in incident.iterdir()) == [
        "gpu.txt",
        "incident.json",
        "journal-kimi-vllm-watchdog.service.txt",
        "journal-kimi-vllm.service.txt",
        "kernel.txt",
        "metrics-last.txt",
        "metrics.txt",
        "processes.txt",
        "sockets.txt",
        "stacks.txt",
    ]
    # Stacks of the Python processes only (the shell is not Python), each under its PID, state and command line.
    spied = [argv for argv, _ in node.ran if argv[0] == PY_SPY]
    assert spied == [
        [PY_SPY, "dump", "--nonblocking", "--pid", "100"],
        [PY_SPY, "dump", "--nonblocking", "--pid", "101"],
    ]
    stacks = (incident / "stacks.txt").read_text()
    assert "=== PID 101 (T): VLLM::EngineCore\nThread 0x1 (idle): MainThread" in stacks
    # The sockets of the unit's processes, not the node's others.
    assert (incident / "sockets.txt").read_text() == "".join(SS.splitlines(keepends=True)[:2])
    assert (incident / "metrics-last.txt").read_text() == "vllm:generation_tokens_total 100\n"
    assert (incident / "metrics.txt").read_text() == "vllm:num_requests_running 3\n"
    processes = (incident / "processes.txt").read_text().splitlines()
    assert processes[2].startswith("101\tT\tfutex_wait_queue\t/usr/bin/python3.11\tVLLM::EngineCore")
    summary = json.loads((incident / "incident.json").read_text())
    assert summary["node"] == "node1" and summary["reason"] == "rank0_stalled" and summary["invocation_id"] == "inv-1"
    assert summary["incident"] == incident.name
    assert [p["pid"] for p in summary["processes"]] == [100, 101, 102]
    assert {c["name"] for c in summary["captures"]} >= {"stacks-100.txt", "gpu.txt", "kernel.txt", "metrics.txt"}
    assert summary["problems"] == [] and summary["bytes_cut"] == {}
    # Every command got what was left of the one deadline (20 s), nothing more.
    assert {timeout for argv, timeout in node.ran if argv[0] != "systemctl"} == {20.0}
    assert oct(incident.stat().st_mode & 0o777) == "0o750"
    assert oct((incident / "stacks.txt").stat().st_mode & 0o777) == "0o640"


def test_a_headless_rank_without_py_spy_nor_a_gpu_says_what_is_missing(tmp_path):
    node = FakeNode(tmp_path, tools_present=())
    request = rank0_request(tmp_path, reason="rendezvous_closed", metrics_url="", metrics_cache="", units=(UNIT,))
    result = capture(request, node.tools())
    names = {p.name for p in Path(result.path).iterdir()}
    assert names == {"incident.json", "journal-kimi-vllm.service.txt", "kernel.txt", "processes.txt", "sockets.txt"}
    assert result.problems == (f"no stacks: {PY_SPY} is missing",)
    assert not [argv for argv, _ in node.ran if argv[0] in (PY_SPY, "nvidia-smi", "GET")]


def test_a_unit_that_is_gone_still_leaves_its_journals(tmp_path):
    node = FakeNode(tmp_path)
    node.run_show = node.run

    def no_cgroup(argv, timeout):
        if list(argv[:2]) == ["systemctl", "show"]:
            return 0, "\n", "", False
        return node.run_show(argv, timeout)

    tools = Tools(**{**node.tools().__dict__, "run": no_cgroup})
    result = capture(rank0_request(tmp_path), tools)
    assert result.problems[0] == f"no cgroup for {UNIT} (not running)"
    assert (Path(result.path) / "journal-kimi-vllm.service.txt").read_text().endswith("INFO serving\n")
    assert not (Path(result.path) / "stacks.txt").exists()


def test_journalctl_finding_no_xid_is_an_answer_and_a_failing_command_a_problem(tmp_path):
    node = FakeNode(tmp_path)
    answers = dict(node.answers)

    def run(argv, timeout):
        if "-k" in argv:
            return 1, "-- No entries --\n", "", False
        if argv[0] == "ss":
            return 1, "", "Cannot open netlink socket: Operation not permitted\n", False
        return node.run(argv, timeout) if argv[0] == "systemctl" else answers[Path(argv[0]).name]

    result = capture(rank0_request(tmp_path), Tools(**{**node.tools().__dict__, "run": run}))
    assert result.problems == ("sockets.txt: Cannot open netlink socket: Operation not permitted",)


def test_many_processes_are_capped(tmp_path):
    node = FakeNode(tmp_path)
    group = node.root / "sys/fs/cgroup" / CGROUP.lstrip("/") / "cgroup.procs"
    group.write_text("\n".join(str(pid) for pid in range(1000, 1000 + MAX_PROCESSES + 8)))
    for pid in range(1000, 1000 + MAX_PROCESSES + 8):
        fake_proc(node.root, pid, "python3", "S", "/usr/bin/python3", "python3 worker")
    capture(rank0_request(tmp_path), node.tools())
    assert len([argv for argv, _ in node.ran if argv[0] == PY_SPY]) == MAX_PROCESSES


def test_the_deadline_kills_a_command_that_hangs_and_keeps_the_others():
    started = time.monotonic()
    jobs = [Job("hang.txt", ("sleep", "60")), Job("echo.txt", ("echo", "answered"))]
    hang, echo = run_jobs(jobs, started + 1.0, Tools())
    assert hang.timed_out and hang.code is None and hang.error == "killed after 1.0 s"
    assert echo.output == "answered\n" and echo.code == 0 and not echo.timed_out
    # Killed, not left behind: run_bounded waits for the child it killed.
    assert time.monotonic() - started < 30


def test_a_command_that_cannot_run_is_an_error_not_an_exception():
    code, out, err, timed_out = run_bounded(["/nonexistent/py-spy", "dump"], 5)
    assert code is None and out == "" and "No such file" in err and not timed_out


def test_no_time_left_runs_nothing():
    [outcome] = run_jobs([Job("late.txt", ("echo", "x"))], time.monotonic() - 1, Tools())
    assert outcome.timed_out and outcome.error == "no time left" and outcome.output == ""


def test_a_real_process_is_read_from_proc():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        os.kill(child.pid, 19)  # SIGSTOP: what a hung rank in the lab's test looks like
        for _ in range(100):
            process = read_process(child.pid)
            if process.state == "T":
                break
            time.sleep(0.05)
        assert process.state == "T" and process.is_python and "time.sleep(30)" in process.cmdline
    finally:
        child.kill()
        child.wait()


def test_cut_keeps_a_journals_end_and_the_start_of_the_rest():
    text = "a" * FILE_MAX_BYTES + "END"
    kept, dropped = cut(text, keep_end=True)
    assert dropped == 3 and kept.endswith("aEND") and "3 bytes not kept" in kept.splitlines()[1]
    kept, dropped = cut("START" + "b" * FILE_MAX_BYTES, keep_end=False)
    assert dropped == 5 and kept.startswith("STARTb") and kept.rstrip().endswith("5 bytes not kept ...]")
    assert cut("small", keep_end=True) == ("small", 0)


def test_a_cut_is_recorded_in_the_incident(tmp_path):
    node = FakeNode(tmp_path)
    node.answers["journalctl"] = (0, "x" * (FILE_MAX_BYTES + 10), "", False)
    result = capture(rank0_request(tmp_path), node.tools())
    summary = json.loads((Path(result.path) / "incident.json").read_text())
    assert summary["bytes_cut"]["journal-kimi-vllm.service.txt"] == 10
    assert (Path(result.path) / "journal-kimi-vllm.service.txt").stat().st_size <= FILE_MAX_BYTES + 100


def make_incident(base: Path, name: str, size: int) -> None:
    (base / name).mkdir(parents=True)
    (base / name / "stacks.txt").write_bytes(b"x" * size)


def test_prune_keeps_the_newest_within_the_count_and_the_bytes_and_leaves_foreign_files(tmp_path):
    for hour in range(5):
        make_incident(tmp_path, f"20270115T0{hour}0000Z-rank0_stalled", 1000)
    (tmp_path / "notes").mkdir()
    removed = prune(tmp_path, keep=3, max_bytes=10**9, now=WALL)
    assert removed == ["20270115T000000Z-rank0_stalled", "20270115T010000Z-rank0_stalled"]
    removed = prune(tmp_path, keep=10, max_bytes=1500, now=WALL)
    assert removed == ["20270115T020000Z-rank0_stalled", "20270115T030000Z-rank0_stalled"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["20270115T040000Z-rank0_stalled", "notes"]


def test_prune_never_removes_the_incident_just_written_and_clears_a_dead_checks_partial(tmp_path):
    make_incident(tmp_path, "20270115T000000Z-rank0_stalled", 5000)
    stale = tmp_path / ".partial-20270114T000000Z-rank0_lost"
    stale.mkdir()
    os.utime(stale, (WALL - 7200, WALL - 7200))
    fresh = tmp_path / ".partial-20270115T075959Z-rank0_lost"
    fresh.mkdir()
    os.utime(fresh, (WALL - 10, WALL - 10))
    removed = prune(tmp_path, keep=1, max_bytes=100, keep_name="20270115T000000Z-rank0_stalled", now=WALL)
    assert removed == [stale.name]
    assert (tmp_path / "20270115T000000Z-rank0_stalled").is_dir() and fresh.is_dir()


def test_capture_prunes_and_two_incidents_in_one_second_both_stay(tmp_path):
    node = FakeNode(tmp_path)
    first = capture(rank0_request(tmp_path, keep=2), node.tools())
    second = capture(rank0_request(tmp_path, keep=2), node.tools())
    assert Path(second.path).name == Path(first.path).name + "-2"
    capture(rank0_request(tmp_path, keep=2, reason="rank0_never_served"), node.tools())
    names = sorted(p.name for p in (tmp_path / "evidence").iterdir())
    assert names == ["20270115T080000Z-rank0_never_served", "20270115T080000Z-rank0_stalled-2"]


def test_an_unwritable_directory_is_a_result_not_an_exception(tmp_path):
    (tmp_path / "file").write_text("")
    result = capture(rank0_request(tmp_path, directory=str(tmp_path / "file" / "evidence")), FakeNode(tmp_path).tools())
    assert result.path == "" and result.problems[0].startswith(f"cannot write {tmp_path / 'file' / 'evidence'}")


def test_names_processes_and_sockets_helpers():
    assert incident_name(WALL, "Rank0 stalled!") == "20270115T080000Z-rank0_stalled_"
    assert processes_text([Process(7, "D", "", "", "x")]).splitlines()[1] == "7\tD\t-\t-\tx"
    assert sockets_of(SS, [55]) == SS.splitlines(keepends=True)[2]
    assert sockets_of(SS, [10]) == ""  # pid=10 is not pid=100


@pytest.mark.parametrize("present", [("nvidia-smi",), ()])
def test_jobs_follow_what_the_node_has(present, tmp_path):
    node = FakeNode(tmp_path, tools_present=present)
    names = [job.name for job in jobs_for(rank0_request(tmp_path, py_spy=""), [], node.tools())]
    assert ("gpu.txt" in names) == bool(present)
    assert not [n for n in names if n.startswith("stacks-")]


@pytest.mark.parametrize("hierarchy", ["sys/fs/cgroup/unified", "sys/fs/cgroup/systemd"])
def test_the_processes_are_found_on_a_hybrid_or_legacy_cgroup_host(tmp_path, hierarchy):
    node = FakeNode(tmp_path)
    v2 = node.root / "sys/fs/cgroup" / CGROUP.lstrip("/")
    other = node.root / hierarchy / CGROUP.lstrip("/")
    other.mkdir(parents=True)
    (v2 / "cgroup.procs").rename(other / "cgroup.procs")
    result = capture(rank0_request(tmp_path), node.tools())
    assert result.problems == ()
    assert "=== PID 101 (T)" in (Path(result.path) / "stacks.txt").read_text()


def test_a_cgroup_nowhere_to_be_read_says_where_it_looked(tmp_path):
    node = FakeNode(tmp_path)
    (node.root / "sys/fs/cgroup" / CGROUP.lstrip("/") / "cgroup.procs").unlink()
    result = capture(rank0_request(tmp_path), node.tools())
    [problem] = result.problems
    assert problem.startswith(f"cannot read the processes of {UNIT} (")
    assert problem.count("No such file or directory") == 3 and "/unified/" in problem and "/systemd/" in problem
