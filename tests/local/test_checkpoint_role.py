"""The checkpoint role run for real through ansible-runner on this host (local connection) against the lab's
olah mirror, started here on loopback behind a small throttling proxy (so a download can be made slow enough
to show progress lines, and to be killed mid-way).

Needs root (the role chowns) and the lab's Hugging Face mirror and wheelhouse built in the lab cache; skipped,
saying so, otherwise. olah and the proxy are this test's own processes, stopped by PID.
"""

from __future__ import annotations

import http.client
import http.server
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
from pathlib import Path

import pytest
import yaml
from labctl import mirrors_hf

from tests.ansible_run import REPO_ROOT, run_playbook

LAB_CACHE = Path(os.environ.get("KIMI_LAB_CACHE", "/var/cache/kimi-lab"))
PLAYBOOK = REPO_ROOT / "playbooks" / "checkpoint.yml"
TOKEN = "hf_kimiTestTokenNeverPrinted0123456789"
PROGRESS = re.compile(r"\(\d+\.\d%\), .*ETA")

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the role sets ownership: run as root")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Throttle:
    """Bytes per second the proxy passes file bodies at; None: unthrottled."""

    rate: float | None = None


def proxy_handler(upstream_port: int, throttle: Throttle) -> type[http.server.BaseHTTPRequestHandler]:
    class Forward(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet
            pass

        def forward(self, body: bool) -> None:
            connection = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=60)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
            try:
                connection.request(self.command, self.path, headers=headers)
                answer = connection.getresponse()
            except OSError:
                self.send_error(502)
                return
            payload = answer.read()
            self.send_response(answer.status)
            for name, value in answer.getheaders():
                if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(name, value)
            length = answer.getheader("content-length") if not body else str(len(payload))
            self.send_header("Content-Length", length or str(len(payload)))
            self.end_headers()
            if body:
                for start in range(0, len(payload), 65536):
                    if throttle.rate:
                        time.sleep(65536 / throttle.rate)
                    self.wfile.write(payload[start : start + 65536])
            connection.close()

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
            except urllib.error.HTTPError:
                break  # any HTTP answer from olah through the proxy means both are up
            except OSError:
                assert olah.poll() is None and time.monotonic() < deadline, "olah did not come up"
                time.sleep(0.5)
        yield url, throttle
    finally:
        proxy.shutdown()
        os.killpg(olah.pid, signal.SIGTERM)
        try:
            olah.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(olah.pid, signal.SIGKILL)
        log.close()


@pytest.fixture(scope="module")
def hf_venv_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kimi-hf")


@pytest.fixture
def cluster(tmp_path, mirror, wheelhouse, endpoint, hf_venv_root):
    url, throttle = endpoint
    throttle.rate = None
    layout = {
        "ansible_connection": "local",
        "ansible_python_interpreter": str(REPO_ROOT / ".venv" / "bin" / "python"),
        "kimi_model": "lab-mini",
        "checkpoint_repo_id": mirror["repo_id"],
        "checkpoint_revision": mirror["revision"],
        "checkpoint_hf_endpoint": url,
        "checkpoint_dir": str(tmp_path / "data" / "models" / "mini"),
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
    inventory = {"all": {"children": {"kimi_nodes": {"hosts": {"n1": {}}, "vars": layout}}}}
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(inventory, sort_keys=False))

    def run(**extravars):
        return run_playbook(PLAYBOOK, path, extravars=extravars, timeout=600)

    return {"run": run, "dir": Path(layout["checkpoint_dir"]), "state": tmp_path / "state", "throttle": throttle}


def all_output(result) -> str:
    return "\n".join(str(e.get("stdout", "")) + str(e.get("event_data", {}).get("res", "")) for e in result.events)


def test_downloads_verifies_marks_and_a_second_run_changes_nothing(cluster, mirror):
    first = cluster["run"]()
    assert first.rc == 0, first.failure_messages()
    for name, size in mirror["files"].items():
        assert (cluster["dir"] / name).stat().st_size == size
    marker = yaml.safe_load((cluster["dir"] / ".kimi-checkpoint.json").read_text())
    assert marker["revision"] == mirror["revision"] and marker["file_count"] == len(mirror["files"])
    assert marker["total_bytes"] == mirror["total_bytes"]
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


def test_corrupt_file_is_named_and_the_next_run_repairs_it(cluster, mirror):
    assert cluster["run"]().rc == 0
    target = cluster["dir"] / "config.json"
    good = target.read_bytes()
    target.write_bytes(good.upper())  # same size, other content
    failed = cluster["run"](checkpoint_force_verify=True)
    assert failed.rc != 0
    assert any("config.json: git blob id differs" in f["msg"] for f in failed.failures), failed.failure_messages()
    assert not (cluster["dir"] / ".kimi-checkpoint.json").exists()
    repaired = cluster["run"]()
    assert repaired.rc == 0, repaired.failure_messages()
    assert target.read_bytes() == good


def test_unknown_revision_with_a_token_is_a_clear_error_without_the_token(cluster):
    result = cluster["run"](checkpoint_revision="0" * 40, checkpoint_hf_token=TOKEN)
    assert result.rc != 0
    assert any("does not exist, or it is private/gated" in f["msg"] for f in result.failures), result.failure_messages()
    assert TOKEN not in all_output(result)


def test_branch_refused_unless_allowed(cluster, mirror):
    refused = cluster["run"](checkpoint_revision="main")
    assert any("not a 40-hex commit sha" in f["msg"] for f in refused.failures), refused.failure_messages()
    allowed = cluster["run"](checkpoint_revision="main", checkpoint_allow_branch=True)
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
