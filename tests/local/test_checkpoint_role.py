"""The checkpoint role run for real through ansible-runner on this host (local connection) against the lab's
olah mirror, started here on loopback behind a small throttling proxy (so a download can be made slow enough
to show progress lines, be killed mid-way, or be cut off like a network that stops passing packets).

Needs root (the role chowns) and the lab's Hugging Face mirror and wheelhouse built in the lab cache; skipped,
saying so, otherwise. olah and the proxy are this test's own processes, stopped by PID.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import http.server
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from labctl import mirrors_hf

from tests.ansible_run import REPO_ROOT, run_playbook
from tests.processes import stop_group

LAB_CACHE = Path(os.environ.get("KIMI_LAB_CACHE", "/var/cache/kimi-lab"))
PLAYBOOK = REPO_ROOT / "playbooks" / "checkpoint.yml"
TOKEN = "hf_kimiTestTokenNeverPrinted0123456789"
PROGRESS = re.compile(r"\(\d+\.\d%\), .*ETA")

# Tier 2 (tests/tiers.py, group local-slow): make test-all, and CI while its time allows, or when its code changed.
pytestmark = [
    pytest.mark.tier2("local-slow"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the role sets ownership: run as root"),
]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# How long the proxy holds a connection of a cut network at most (the tests heal it well before).
HOLD_SECONDS = 300


class Throttle:
    """How the proxy passes file bodies: at `rate` bytes per second (None: unthrottled) and, after stall(), like
    a cut network once `after_bytes` more body bytes have passed (over all connections): every connection stays
    open and gets nothing more, new requests get no answer, until heal(); then the held connections close."""

    def __init__(self) -> None:
        self.rate: float | None = None
        self.held = 0  # requests and bodies the cut has held (proof that it happened)
        self._limit: int | None = None
        self._passed = 0
        self._cut = False
        self._lock = threading.Lock()
        self._healed = threading.Event()
        self._healed.set()

    def stall(self, after_bytes: int) -> None:
        with self._lock:
            self._limit, self._passed, self._cut, self.held = after_bytes, 0, False, 0
            self._healed.clear()

    def heal(self) -> None:
        with self._lock:
            self._limit, self._cut = None, False
            self._healed.set()

    def passes(self, size: int) -> bool:
        """True when `size` more bytes may go; False, after holding until healed, once the network is cut."""
        with self._lock:
            if not self._cut and (self._limit is None or self._passed + size <= self._limit):
                self._passed += size
                return True
            self._cut = True
            self.held += 1
        self._healed.wait(timeout=HOLD_SECONDS)
        return False


def proxy_handler(upstream_port: int, throttle: Throttle) -> type[http.server.BaseHTTPRequestHandler]:
    class Forward(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet
            pass

        def forward(self, body: bool) -> None:
            if not throttle.passes(0):  # a request sent into a cut network: no answer, then gone
                self.close_connection = True
                return
            connection = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=60)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
            try:
                connection.request(self.command, self.path, headers=headers)
                answer = connection.getresponse()
            except OSError:
                self.send_error(502)
                return
            # The body is passed on as it comes, not read whole first: olah streams it chunked, taking about a
            # second for the mini checkpoint's 15.8 MB on a 2-core host, and a client with a one-second read
            # timeout (the hf-read-timeout case) must get its first bytes before the cut, not a timeout at the
            # headers.
            length = answer.getheader("content-length")
            chunked = body and length is None
            self.send_response(answer.status)
            for name, value in answer.getheaders():
                if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(name, value)
            self.send_header(*(("Transfer-Encoding", "chunked") if chunked else ("Content-Length", length or "0")))
            self.end_headers()
            with contextlib.closing(connection):
                if body:
                    self.pass_body(answer, chunked)

        def pass_body(self, answer: http.client.HTTPResponse, chunked: bool) -> None:
            while chunk := answer.read1(65536):
                if throttle.rate:
                    time.sleep(len(chunk) / throttle.rate)
                if not throttle.passes(len(chunk)):
                    self.close_connection = True  # cut mid-body: the rest never comes
                    return
                try:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
                except OSError:  # the client gave up (its job was stopped)
                    self.close_connection = True
                    return
            if chunked:
                self.wfile.write(b"0\r\n\r\n")

        def do_GET(self) -> None:
            self.forward(body=True)

        def do_HEAD(self) -> None:
            self.forward(body=False)

    return Forward


@pytest.fixture(scope="module")
def mirror() -> dict:
    built = mirrors_hf.existing(LAB_CACHE)
    if built is None:
        pytest.skip(f"the Hugging Face mirror is not built under {LAB_CACHE} (lab/lab build all)")
    return built


@pytest.fixture(scope="module")
def wheelhouse() -> Path:
    found = sorted(LAB_CACHE.glob("wheels/*/huggingface_hub-2.4.0-py3-none-any.whl"))
    if not found:
        pytest.skip(f"no wheelhouse with huggingface_hub 2.4.0 under {LAB_CACHE}/wheels")
    return found[0].parent


@pytest.fixture(scope="module")
def endpoint(mirror, tmp_path_factory) -> Iterator[tuple[str, Throttle]]:
    """olah on one port, the throttling proxy on another; olah hands out the proxy's address in its URLs."""
    workdir = tmp_path_factory.mktemp("olah")
    olah_port, proxy_port = free_port(), free_port()
    config = mirrors_hf.olah_config(mirror["mirrors_path"], "127.0.0.1", olah_port, workdir / "repos")
    config = config.replace(f'"127.0.0.1:{olah_port}"', f'"127.0.0.1:{proxy_port}"')
    (workdir / "olah.toml").write_text(config)
    log = (workdir / "olah.log").open("w")
    olah = subprocess.Popen(
        [str(mirror["olah_python"]), "-m", "olah.server", "--config", str(workdir / "olah.toml"),
         "--log-path", str(workdir)],
        cwd=workdir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    throttle = Throttle()
    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", proxy_port), proxy_handler(olah_port, throttle))
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{proxy_port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/models/{mirror['repo_id']}/revision/main", timeout=5)
                break
            except urllib.error.HTTPError as answer:
                if answer.code != 502:  # 502 is the proxy's own answer while olah does not listen yet
                    break  # any other HTTP answer from olah through the proxy means both are up
            except OSError:
                pass  # no answer yet (refused or timed out): wait as for the 502
            assert olah.poll() is None and time.monotonic() < deadline, "olah did not come up"
            time.sleep(0.5)
        yield url, throttle
    finally:
        throttle.heal()  # lets the held connections go
        proxy.shutdown()
        stop_group(olah, grace_s=15)
        log.close()


@pytest.fixture(scope="module")
def hf_venv_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kimi-hf")


@pytest.fixture
def cluster(tmp_path, mirror, wheelhouse, endpoint, hf_venv_root):
    url, throttle = endpoint
    throttle.rate = None
    throttle.heal()
    layout = {
        "ansible_connection": "local",
        "ansible_python_interpreter": str(REPO_ROOT / ".venv" / "bin" / "python"),
        "kimi_model": "lab-mini",
        "kimi_checkpoint_repo_id": mirror["repo_id"],
        "kimi_checkpoint_revision": mirror["revision"],
        "checkpoint_hf_endpoint": url,
        "kimi_checkpoint_dir": str(tmp_path / "data" / "models" / "mini"),
        "checkpoint_state_dir": str(tmp_path / "state"),
        "checkpoint_hf_venv_root": str(hf_venv_root),
        "checkpoint_python": "/usr/bin/python3",
        # The host running the tests brings python3-venv itself (Makefile host-deps); no apt here.
        "checkpoint_os_packages": [],
        "checkpoint_pip_find_links": [str(wheelhouse)],
        "checkpoint_pip_no_index": True,
        "checkpoint_margin_bytes": 1_000_000,
        "checkpoint_progress_interval": 1,
        "checkpoint_launcher": "nohup",
    }

    def inventory(name: str, hosts: dict[str, dict], **group_vars) -> Path:
        """An inventory of `hosts` (name -> host vars), all with the layout above plus `group_vars`."""
        data = {"all": {"children": {"kimi_nodes": {"hosts": hosts, "vars": {**layout, **group_vars}}}}}
        path = tmp_path / name
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    default = inventory("hosts.yml", {"n1": {}})

    def run(inventory: Path = default, envvars: dict[str, str] | None = None, **extravars):
        return run_playbook(PLAYBOOK, inventory, extravars=extravars, envvars=envvars, timeout=600)

    return {
        "run": run,
        "inventory": inventory,
        "dir": Path(layout["kimi_checkpoint_dir"]),
        "state": tmp_path / "state",
        "throttle": throttle,
        "tmp": tmp_path,
    }


def all_output(result) -> str:
    return "\n".join(str(e.get("stdout", "")) + str(e.get("event_data", {}).get("res", "")) for e in result.events)


def task_events(result, task: str) -> dict[str, dict]:
    """Each host's final event (ok, changed, failed or skipped) of the task with this name."""
    found = {}
    for event in result.events:
        data = event.get("event_data", {})
        if event.get("event", "").startswith("runner_on_") and data.get("task") == task:
            found[data["host"]] = event
    return found


def bytes_on_disk(directory: Path, mirror: dict) -> int:
    """What the role counts as downloaded: listed files (at most their listed size) plus hf's partial files."""
    finished = sum(min((directory / n).stat().st_size, size) for n, size in mirror["files"].items()
                   if (directory / n).is_file())  # fmt: skip
    partial_dir = directory / ".cache" / "huggingface" / "download"
    partial = sum(p.stat().st_size for p in partial_dir.rglob("*.incomplete")) if partial_dir.is_dir() else 0
    return finished + partial


def alive(pid: int) -> bool:
    """The process exists and is not a zombie waiting to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_downloads_verifies_marks_and_a_second_run_changes_nothing(cluster, mirror):
    first = cluster["run"]()
    assert first.rc == 0, first.failure_messages()
    for name, size in mirror["files"].items():
        assert (cluster["dir"] / name).stat().st_size == size
    marker = yaml.safe_load((cluster["dir"] / ".kimi-checkpoint.json").read_text())
    assert marker["revision"] == mirror["revision"] and marker["file_count"] == len(mirror["files"])
    assert marker["total_bytes"] == mirror["total_bytes"]
    for name, size in mirror["files"].items():
        found = (cluster["dir"] / name).stat()
        assert marker["files"][name]["size"] == size
        assert (marker["files"][name]["mtime_ns"], marker["files"][name]["ino"]) == (found.st_mtime_ns, found.st_ino)
    assert not (cluster["state"] / "download.env").exists(), "the token file outlived the download"
    second = cluster["run"]()
    assert second.rc == 0 and second.changed == 0, second.stats


def test_progress_lines_appear_while_a_slow_download_runs(cluster):
    cluster["throttle"].rate = 2_000_000  # ~4 s for the 8.6 MB checkpoint, lines every second
    result = cluster["run"]()
    assert result.rc == 0, result.failure_messages()
    lines = [e["stdout"] for e in result.events if PROGRESS.search(str(e.get("stdout", "")))]
    assert len(lines) >= 3, lines


def test_too_small_disk_is_refused_before_any_byte(cluster):
    result = cluster["run"](checkpoint_margin_bytes=10**18)
    assert result.rc != 0
    (failure,) = result.failures
    assert failure["msg"].startswith("n1: not enough free space"), failure["msg"]
    assert "needed " in failure["msg"] and "available " in failure["msg"]
    assert not cluster["dir"].exists() or not any(cluster["dir"].iterdir())


MARKER_NAME = ".kimi-checkpoint.json"
DELETE_TASK = "Delete the files that failed verification (they are fetched again below)"
REPAIRED_TASK = "Show what was repaired in this run"


def read_marker(cluster) -> dict:
    return json.loads((cluster["dir"] / MARKER_NAME).read_text())


def test_a_corrupt_file_found_by_a_forced_verification_is_repaired_in_the_same_run(cluster, mirror):
    assert cluster["run"]().rc == 0
    target = cluster["dir"] / "config.json"
    good = target.read_bytes()
    before = read_marker(cluster)
    target.write_bytes(good.upper())  # same size, other content
    repaired = cluster["run"](checkpoint_force_verify=True)
    assert repaired.rc == 0, repaired.failure_messages()
    (deleted,) = task_events(repaired, DELETE_TASK).values()
    assert deleted["event"] == "runner_on_ok" and deleted["event_data"]["res"]["changed"] is True
    assert deleted["event_data"]["res"]["removed"] == ["config.json"]
    (said,) = repaired.results_of(REPAIRED_TASK).values()
    assert said["msg"].startswith("n1: repaired in round 1 (deleted, fetched again, verified): config.json: git blob")
    assert target.read_bytes() == good
    (reverified,) = repaired.results_of("Verify the fetched files again").values()
    assert reverified["ok"] is True and reverified["hashed"] == 1
    after = read_marker(cluster)
    # Rewritten with the fetched file's own stat (a new file: deleted, then written again).
    assert after["files"]["config.json"]["ino"] != before["files"]["config.json"]["ino"]
    assert after["files"]["config.json"]["mtime_ns"] == target.stat().st_mtime_ns
    again = cluster["run"]()
    assert again.rc == 0 and again.changed == 0, again.stats


def test_with_no_repair_attempts_a_corrupt_file_is_named_and_the_next_run_repairs_it(cluster, mirror):
    assert cluster["run"]().rc == 0
    target = cluster["dir"] / "config.json"
    good = target.read_bytes()
    target.write_bytes(good.upper())  # same size, other content
    failed = cluster["run"](checkpoint_force_verify=True, checkpoint_repair_attempts=0)
    assert failed.rc != 0
    assert any("config.json: git blob id differs" in f["msg"] for f in failed.failures), failed.failure_messages()
    assert not task_events(failed, DELETE_TASK)
    assert not (cluster["dir"] / MARKER_NAME).exists()
    repaired = cluster["run"]()
    assert repaired.rc == 0, repaired.failure_messages()
    assert target.read_bytes() == good


def test_a_same_size_overwrite_after_the_marker_is_found_by_its_stat_and_repaired_without_forcing(cluster, mirror):
    assert cluster["run"]().rc == 0
    target = cluster["dir"] / "model.safetensors"
    good = hashlib.sha256(target.read_bytes()).hexdigest()
    with target.open("r+b") as weights:  # what dd conv=notrunc does: same size, same inode, a new mtime
        weights.seek(4096)
        weights.write(os.urandom(16))
    repaired = cluster["run"]()
    assert repaired.rc == 0, repaired.failure_messages()
    (read,) = repaired.results_of(READ_MARKER_TASK).values()
    assert read["matches"] is True and read["stale_paths"] == ["model.safetensors"], read["stale"]
    (verified,) = repaired.results_of(VERIFY_TASK).values()
    # Only the changed file is hashed; the others' sizes are checked.
    assert verified["hashed"] == 1 and verified["bad"] == ["model.safetensors"], verified["problems"]
    (deleted,) = repaired.results_of(DELETE_TASK).values()
    assert deleted["removed"] == ["model.safetensors"]
    assert hashlib.sha256(target.read_bytes()).hexdigest() == good
    assert read_marker(cluster)["files"]["model.safetensors"]["mtime_ns"] == target.stat().st_mtime_ns
    again = cluster["run"]()
    assert again.rc == 0 and again.changed == 0, again.stats


HF_VERIFY_TASK = "Run hf cache verify on the checkpoint directory"


def test_the_hf_cli_cross_check_agrees_then_catches_what_a_size_only_check_lets_through(cluster, mirror):
    # huggingface_hub's own `hf cache verify` against the same mirror: it agrees with a good download...
    first = cluster["run"](checkpoint_hf_cross_check=True)
    assert first.rc == 0, first.failure_messages()
    (agreed,) = first.results_of(HF_VERIFY_TASK).values()
    assert agreed["rc"] == 0 and f"Verified {len(mirror['files'])} file(s)" in agreed["stdout"], agreed
    # ...and, with our own check reduced to sizes, still finds a same-size overwrite by its checksum.
    target = cluster["dir"] / "config.json"
    text = target.read_bytes()
    target.write_bytes(text.replace(b"{", b"[", 1))
    caught = cluster["run"](checkpoint_hf_cross_check=True, checkpoint_verify_checksums=False)
    assert caught.rc != 0
    (failure,) = caught.failures
    assert failure["msg"].startswith(f"n1: hf cache verify of {mirror['repo_id']} at {mirror['revision']} in ")
    assert "config.json: expected" in failure["msg"], failure["msg"]
    assert not (cluster["dir"] / MARKER_NAME).exists(), "a checkpoint the hf CLI found bad kept its marker"


def test_a_version_1_marker_is_verified_and_rewritten_once(cluster, mirror):
    assert cluster["run"]().rc == 0
    old = read_marker(cluster)
    del old["files"]
    (cluster["dir"] / MARKER_NAME).write_text(json.dumps({**old, "version": 1}))
    upgraded = cluster["run"]()
    assert upgraded.rc == 0 and upgraded.changed > 0, upgraded.failure_messages()
    (verified,) = upgraded.results_of(VERIFY_TASK).values()
    assert verified["ok"] is True and verified["hashed"] == len(mirror["files"])
    marker = read_marker(cluster)
    assert marker["version"] == 2 and sorted(marker["files"]) == sorted(mirror["files"])
    again = cluster["run"]()
    assert again.rc == 0 and again.changed == 0, again.stats


def test_unknown_revision_with_a_token_is_a_clear_error_without_the_token(cluster):
    result = cluster["run"](kimi_checkpoint_revision="0" * 40, checkpoint_hf_token=TOKEN)
    assert result.rc != 0
    assert any("does not exist, or it is private/gated" in f["msg"] for f in result.failures), result.failure_messages()
    assert TOKEN not in all_output(result)


def test_branch_refused_unless_allowed(cluster, mirror):
    refused = cluster["run"](kimi_checkpoint_revision="main")
    assert any("not a 40-hex commit sha" in f["msg"] for f in refused.failures), refused.failure_messages()
    allowed = cluster["run"](kimi_checkpoint_revision="main", kimi_checkpoint_allow_branch=True)
    assert allowed.rc == 0, allowed.failure_messages()
    marker = yaml.safe_load((cluster["dir"] / ".kimi-checkpoint.json").read_text())
    assert marker["revision"] == mirror["revision"] and marker["resolved_from"] == "main"


def test_a_rerun_attaches_and_a_killed_download_is_finished_by_the_next_run(cluster, mirror):
    cluster["throttle"].rate = 150_000  # ~60 s: time to look at it mid-way
    watching = cluster["run"](checkpoint_wait_timeout=2)
    assert any("still running" in f["msg"] for f in watching.failures), watching.failure_messages()
    pid = int((cluster["state"] / "download.pid").read_text())
    again = cluster["run"](checkpoint_wait_timeout=1)
    (job,) = again.results_of("Start the download detached from this connection, or attach to the one running").values()
    assert job["attached"] is True and job["pid"] == pid
    assert not (cluster["dir"] / ".kimi-checkpoint.json").exists(), "marked done while incomplete"
    os.killpg(pid, signal.SIGKILL)  # the job's own session: the script and hf
    cluster["throttle"].rate = None
    finished = cluster["run"]()
    assert finished.rc == 0, finished.failure_messages()
    for name, size in mirror["files"].items():
        assert (cluster["dir"] / name).stat().st_size == size


def test_check_mode_with_diff_writes_no_checkpoint(cluster):
    result = run_playbook(PLAYBOOK, cluster["dir"].parents[2] / "hosts.yml", check=True, diff=True, timeout=600)
    assert result.rc == 0, result.failure_messages()
    assert not cluster["dir"].exists() or not any(cluster["dir"].iterdir())


START_TASK = "Start the download detached from this connection, or attach to the one running"
WAIT_TASK = "Wait for the downloading node's marker (shared storage)"
MARKER_TASK = "Write the marker (repository, commit, file count, bytes, verification time, per-file stats)"
VERIFY_TASK = "Verify every file (size, and sha256 or git blob id where the Hub gives one)"
READ_MARKER_TASK = "Read the marker (the checkpoint directory is not listed)"


PROGRESS_TASK = "Report progress until the download ends"


# linear (the playbook's): each task runs on every host before the next, so n2's wait comes after n1's marker
# task. free: n2 runs ahead and really waits while n1 downloads.
@pytest.mark.parametrize("strategy", ["linear", "free"])
def test_shared_storage_one_node_downloads_the_other_waits_for_its_marker_and_verifies(cluster, mirror, strategy):
    # Two nodes on one filesystem: the same kimi_checkpoint_dir (the tmp directory stands for the NFS mount), each
    # with its own node-local state directory.
    states = {name: cluster["tmp"] / f"state-{name}" for name in ("n1", "n2")}
    hosts = {name: {"checkpoint_state_dir": str(path)} for name, path in states.items()}
    # The kimi role checks that the parallel layout covers the nodes: one pipeline stage per node.
    shared = cluster["inventory"](
        "shared.yml", hosts, kimi_pipeline_parallel_size=2, checkpoint_shared_storage=True,
        checkpoint_shared_wait_timeout=120,
    )  # fmt: skip

    if strategy == "linear":
        # The downloading node fails: the other says so at once, not after waiting for a marker that cannot come.
        refused = cluster["run"](shared, checkpoint_margin_bytes=10**18)
        messages = {f["host"]: f["msg"] for f in refused.failures}
        assert set(messages) == {"n1", "n2"}, refused.failure_messages()
        assert messages["n1"].startswith("n1: not enough free space"), messages["n1"]
        assert messages["n2"].startswith("n2: n1 downloads the checkpoint into the shared"), messages["n2"]
    else:
        cluster["throttle"].rate = 2_000_000  # n1's download lasts seconds: n2 gets to its wait meanwhile

    first = cluster["run"](shared, envvars={"ANSIBLE_STRATEGY": strategy})
    assert first.rc == 0, first.failure_messages()
    # Exactly one hf download: n1 started it and watched it; n2 started none and has no job state at all.
    starts = task_events(first, START_TASK)
    assert {host: event["event"] for host, event in starts.items()} == {"n1": "runner_on_ok"}
    assert starts["n1"]["event_data"]["res"]["attached"] is False
    log = (states["n1"] / "download.log").read_text()
    assert log.count(" start ") == 1 and "hf download exited with 0" in log, log
    job_files = ("download.log", "download.pid", "download.rc", "kimi-checkpoint-download.sh", "download.env")
    assert not [name for name in job_files if (states["n2"] / name).exists()]
    lines = [str(e["stdout"]).strip() for e in first.events if PROGRESS.search(str(e.get("stdout", "")))]
    assert lines and all(line.startswith("n1: ") for line in lines), lines
    # n2 waited for the marker, and only after n1 had written it did it verify the shared files itself.
    waits, marks, verifies = (task_events(first, task) for task in (WAIT_TASK, MARKER_TASK, VERIFY_TASK))
    assert waits["n2"]["event"] == "runner_on_ok" and waits.get("n1", {}).get("event") != "runner_on_ok"
    assert marks["n1"]["event"] == "runner_on_ok" and marks.get("n2", {}).get("event") != "runner_on_ok"
    assert {host: (e["event"], e["event_data"]["res"]["ok"]) for host, e in verifies.items()} == {
        "n1": ("runner_on_ok", True),
        "n2": ("runner_on_ok", True),
    }

    def at(event: dict, edge: str) -> datetime:
        return datetime.fromisoformat(event["event_data"][edge])

    if strategy == "linear":
        assert at(marks["n1"], "end") <= at(waits["n2"], "start")
    else:
        (watched,) = task_events(first, PROGRESS_TASK).values()
        assert at(waits["n2"], "start") < at(watched, "end"), "n2 did not wait while n1 downloaded"
        assert at(marks["n1"], "end") <= at(waits["n2"], "end") and waits["n2"]["event_data"]["res"]["elapsed"] >= 1
    assert at(waits["n2"], "end") <= at(verifies["n2"], "start")
    for name, size in mirror["files"].items():
        assert (cluster["dir"] / name).stat().st_size == size
    marker = json.loads((cluster["dir"] / ".kimi-checkpoint.json").read_text())
    assert marker["revision"] == mirror["revision"] and marker["total_bytes"] == mirror["total_bytes"]

    second = cluster["run"](shared, envvars={"ANSIBLE_STRATEGY": strategy})
    assert second.rc == 0 and second.changed == 0, second.stats
    read = task_events(second, READ_MARKER_TASK)
    assert {host: e["event_data"]["res"]["matches"] for host, e in read.items()} == {"n1": True, "n2": True}


# hf's own bound on a cut: its read timeout (HF_HUB_DOWNLOAD_TIMEOUT, 10 s by default), retried 5 times while
# no byte comes. The role's bound: checkpoint_stall_timeout, for what hf's timeout does not end. Each case
# disables the other bound (hf's by a read timeout far beyond the test) so the one named is what ends it.
CUTS = [
    pytest.param(
        {"checkpoint_stall_timeout": 3, "checkpoint_hf_environment": {"HF_HUB_DOWNLOAD_TIMEOUT": "600"}},
        r"^n1: the download stalled: no new bytes on disk for (\d+) s \(checkpoint_stall_timeout 3 s\) with (\d+)"
        r" bytes .* on disk; stopped the hf job \(pid \d+\), nothing is marked done\. Check the network path to ",
        id="role-stall-timeout",
    ),
    pytest.param(
        {"checkpoint_stall_timeout": 0, "checkpoint_hf_environment": {"HF_HUB_DOWNLOAD_TIMEOUT": "1"}},
        # One line saying what happened, not hf's traceback.
        r"^n1: hf download of \S+ at [0-9a-f]{40} exited with 1: \S*Timeout: timed out \(its log: \S+/download\.log\)$",
        id="hf-read-timeout",
    ),
]


@pytest.mark.parametrize(("settings", "expected"), CUTS)
def test_a_network_cut_mid_download_fails_clearly_marks_nothing_and_once_healed_the_next_run_finishes(
    cluster, mirror, settings, expected
):
    throttle = cluster["throttle"]
    throttle.stall(after_bytes=2_000_000)  # inside model.safetensors (15.8 MB): the cut comes mid-body
    cut = cluster["run"](**settings)
    assert throttle.held > 0, f"the proxy never cut the download: {cut.failure_messages()}"
    (failure,) = cut.failures
    found = re.search(expected, failure["msg"])
    assert found, failure["msg"]
    if settings["checkpoint_stall_timeout"]:
        assert int(found.group(1)) >= 3
        assert int(found.group(2)) == bytes_on_disk(cluster["dir"], mirror), "the message misstates the bytes"
        assert "stopped by the role" in (cluster["state"] / "download.log").read_text()
    assert not alive(int((cluster["state"] / "download.pid").read_text())), "the job outlived the failed run"
    assert not (cluster["dir"] / ".kimi-checkpoint.json").exists(), "marked done after a cut"
    assert not (cluster["dir"] / "model.safetensors").exists(), "the cut file was finished anyway"

    throttle.heal()
    healed = cluster["run"]()
    assert healed.rc == 0, healed.failure_messages()
    (verified,) = healed.results_of(VERIFY_TASK).values()
    assert verified["ok"] is True and verified["problems"] == []
    for name, size in mirror["files"].items():
        assert (cluster["dir"] / name).stat().st_size == size
    assert (cluster["dir"] / ".kimi-checkpoint.json").exists()


def test_a_seed_outside_the_play_or_no_hub_access_without_a_holder_is_refused_before_any_byte(cluster):
    """Download once per site (checkpoint_spread) on two nodes: a seed that is not one of them, and a run without
    Hub access where no node holds the checkpoint, are refused on every node, naming the variable, before any file
    is written."""
    hosts = {name: {"checkpoint_state_dir": str(cluster["tmp"] / f"state-{name}"), "kimi_host_ip": address}
             for name, address in (("n1", "127.0.0.1"), ("n2", "127.0.0.2"))}  # fmt: skip
    two = cluster["inventory"]("two.yml", hosts, kimi_pipeline_parallel_size=2)

    outside = cluster["run"](two, checkpoint_seed_host="n9")
    messages = {f["host"]: f["msg"] for f in outside.failures}
    assert set(messages) == {"n1", "n2"}, outside.failure_messages()
    assert all(m.startswith('checkpoint_seed_host is "n9", which is not one of the nodes') for m in messages.values())

    no_hub = cluster["run"](two, checkpoint_hub_access="false")
    messages = {f["host"]: f["msg"] for f in no_hub.failures}
    assert set(messages) == {"n1", "n2"}, no_hub.failure_messages()
    assert all(m.startswith("checkpoint_hub_access is false and no node of this play holds") for m in messages.values())
    assert "n1 (the first node: checkpoint_seed_host is empty)" in messages["n1"]
    assert not cluster["dir"].exists(), "a file was written before the refusal"
