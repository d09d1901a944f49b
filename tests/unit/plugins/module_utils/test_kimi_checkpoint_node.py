"""plugins/module_utils/kimi_checkpoint_node.py: the plan and its repair on a real directory, and the detached
download job (a stand-in script with the real one's pid/rc protocol) started, attached to, watched and stopped."""

from __future__ import annotations

import json
import os
import signal
import textwrap
import time
from pathlib import Path

import pytest
from ansible_collections.kimi.k2.plugins.module_utils import kimi_checkpoint_node as node

JOB_SCRIPT = """\
#!/bin/bash
# The download script's protocol: pid first, exit status last, output to the log.
state={state}
exec >>"$state/download.log" 2>&1
echo $$ >"$state/download.pid"
{body}
rc=$?
echo "$rc" >"$state/download.rc"
exit "$rc"
"""


def files(*entries: tuple[str, int]) -> list[node.RepoFile]:
    return node.repo_files([{"path": path, "size": size} for path, size in entries])


def job_script(tmp_path: Path, body: str) -> tuple[Path, Path]:
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    script = tmp_path / "kimi-checkpoint-download.sh"
    script.write_text(JOB_SCRIPT.format(state=state, body=textwrap.dedent(body)))
    script.chmod(0o700)
    return state, script


@pytest.fixture
def started_jobs():
    """Stops every job a test started (by its own pid), also when the test fails.

    On a node the job is not the module's child for long: the module exits and init reaps the job. Here pytest
    started it, so its exit would leave a zombie whose process group still answers; the kernel reaps children
    itself while SIGCHLD is ignored.
    """
    previous = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    started: list[tuple[Path, Path]] = []
    yield started
    signal.signal(signal.SIGCHLD, previous)
    for state, script in started:
        pid = node.job_pid(state, str(script))
        if pid is not None:
            node.stop_job(pid, state, str(script), grace=1)


def test_the_plan_counts_missing_and_wrong_size_files_and_names_a_shortfall(tmp_path):
    (tmp_path / "a").write_bytes(b"x" * 10)
    (tmp_path / "b").write_bytes(b"x" * 3)  # interrupted: hf starts it again from zero
    listed = files(("a", 10), ("b", 20), ("c", 30))

    roomy = node.download_plan(tmp_path, listed, "node1", margin_bytes=0)
    assert roomy["missing"] == ["b", "c"] and roomy["missing_bytes"] == 50 and roomy["shortfall"] is None
    assert roomy["present_bytes"] == 10 and roomy["removed"] == [] and roomy["changed"] is False

    # A margin a tebibyte past what was free: other tests freeing disk between the two reads cannot make it fit.
    tight = node.download_plan(tmp_path, listed, "node1", margin_bytes=roomy["free_bytes"] + 2**40)
    assert tight["shortfall"].startswith("node1: ") and str(tmp_path) in tight["shortfall"]


def test_repair_deletes_wrong_size_and_recorded_bad_files_but_not_in_check_mode(tmp_path):
    data, state = tmp_path / "data", tmp_path / "state"
    data.mkdir()
    state.mkdir()
    (data / "good").write_bytes(b"x" * 4)
    (data / "bad").write_bytes(b"y" * 4)  # right size, wrong content: only the verification knows
    (data / "short").write_bytes(b"z")
    (state / node.BAD_FILE).write_text(json.dumps(["bad"]))
    listed = files(("good", 4), ("bad", 4), ("short", 4))

    looked = node.download_plan(data, listed, "n", 0, state_dir=state, repair=True, check_mode=True)
    assert looked["removed"] == ["bad", "short"] and looked["missing"] == ["bad", "short"]
    assert looked["missing_bytes"] == 8 and (data / "bad").exists() and (state / node.BAD_FILE).exists()

    repaired = node.download_plan(data, listed, "n", 0, state_dir=state, repair=True)
    assert repaired["changed"] is True and repaired["removed"] == ["bad", "short"]
    assert sorted(p.name for p in data.iterdir()) == ["good"] and not (state / node.BAD_FILE).exists()
    assert repaired["missing"] == ["bad", "short"] and repaired["missing_bytes"] == 8


def test_verification_records_the_bad_files_for_the_repair_unless_in_check_mode(tmp_path):
    data, state = tmp_path / "data", tmp_path / "state"
    data.mkdir()
    (data / "a").write_bytes(b"x" * 4)
    listed = files(("a", 4), ("b", 4))

    node.run_verification(data, listed, checksums=False, only=None, state_dir=state, check_mode=True)
    assert not (state / node.BAD_FILE).exists()
    verdict = node.run_verification(data, listed, checksums=False, only=None, state_dir=state)
    assert verdict["ok"] is False and verdict["bad"] == ["b"] and verdict["hashed"] == 0
    assert json.loads((state / node.BAD_FILE).read_text()) == ["b"]
    assert set(verdict["files"]) == {"a"}


def test_progress_counts_finished_files_at_most_their_size_plus_hf_partial_files(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (tmp_path / "a").write_bytes(b"x" * 10)
    partial = tmp_path / node.HF_PARTIAL_DIR / "b.incomplete"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(b"x" * 5)
    (state / node.RC_FILE).write_text("0\n")

    seen = node.progress(tmp_path, state, files(("a", 10), ("b", 20)), None, "node1")
    assert seen["bytes_on_disk"] == 15 and seen["total_bytes"] == 30
    assert seen["running"] is False and seen["exit_status"] == 0 and seen["line"].startswith("node1: ")


def test_a_started_job_is_attached_to_watched_to_its_end_and_its_error_line_read(tmp_path, started_jobs):
    state, script = job_script(tmp_path, 'sleep 1\necho "OSError: [Errno 28] No space left on device"\nfalse')
    started_jobs.append((state, script))

    first = node.start_job(state, str(script), launcher="nohup")
    assert first["changed"] is True and first["attached"] is False and first["running"] is True
    again = node.start_job(state, str(script), launcher="nohup")
    assert again == {"changed": False, "attached": True, "running": True, "pid": first["pid"]}

    began = time.monotonic()
    ended = node.progress(tmp_path, state, [], str(script), "node1", wait=30)
    assert time.monotonic() - began < 20, "the blocking poll must return when the job ends"
    assert ended["running"] is False and ended["exit_status"] == 1
    assert ended["log_error"] == "OSError: [Errno 28] No space left on device"


def test_check_mode_starts_nothing(tmp_path):
    state, script = job_script(tmp_path, "true")
    assert node.start_job(state, str(script), launcher="nohup", check_mode=True)["changed"] is True
    time.sleep(0.3)
    assert not (state / node.PID_FILE).exists()


def test_a_stalled_job_is_stopped_with_its_children_and_the_log_says_why(tmp_path, started_jobs):
    state, script = job_script(tmp_path, "sleep 300 &\nwait")
    started_jobs.append((state, script))
    job = node.start_job(state, str(script), launcher="nohup")
    assert job["running"] is True

    stopped = node.stop_stalled(tmp_path, state, files(("a", 100)), str(script), "node2", 61.0, 60.0)
    assert stopped["stopped"] is True and stopped["pid"] == job["pid"]
    assert stopped["stall_message"].startswith("node2: ")
    assert node.job_pid(state, str(script)) is None and not node.group_alive(job["pid"])
    assert "stopped by the role: node2: " in (state / node.LOG_FILE).read_text()


def test_a_pid_file_naming_another_process_is_not_our_job(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / node.PID_FILE).write_text(f"{os.getpid()}\n")  # alive, but it is pytest, not the script
    assert node.job_pid(state, str(tmp_path / "kimi-checkpoint-download.sh")) is None


def test_a_failing_systemd_run_is_an_error_naming_what_it_said(tmp_path):
    state, script = job_script(tmp_path, "true")

    class Answer:
        returncode, stderr = 1, "Failed to start transient service unit: Unit kimi-checkpoint-download exists.\n"

    with pytest.raises(node.JobError, match="systemd-run failed: Failed to start transient service unit"):
        node.start_job(state, str(script), launcher="systemd", run=lambda *a, **k: Answer())
