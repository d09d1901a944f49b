"""The built Hugging Face mirror, served by a real olah 0.5.4 on loopback, fetched by the real hf client.

Slow (a few seconds) and needs the mirror built in the lab cache; skipped, saying so, when it is not.
olah runs as this test's own process on 127.0.0.1 and a free port, and is stopped by its PID.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from labctl import mirrors_hf

LAB_CACHE = Path(os.environ.get("KIMI_LAB_CACHE", "/var/cache/kimi-lab"))
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mirror() -> dict:
    built = mirrors_hf.existing(LAB_CACHE)
    if built is None:
        pytest.skip(f"the Hugging Face mirror for the current recipe is not built under {LAB_CACHE} (lab/lab up)")
    return built


def free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for_http(url: str, process: subprocess.Popen, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"olah exited early with {process.returncode}")
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except urllib.error.HTTPError:
            return  # any HTTP answer means the server is up; the tests below check the real routes
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"olah did not answer on {url} within {timeout_s} s")


@pytest.fixture(scope="module")
def olah(mirror, tmp_path_factory) -> Iterator[str]:
    workdir = tmp_path_factory.mktemp("olah")
    port = free_loopback_port()
    config = workdir / "olah.toml"
    config.write_text(mirrors_hf.olah_config(mirror["mirrors_path"], "127.0.0.1", port, workdir / "repos"))
    log = (workdir / "olah.log").open("w")
    process = subprocess.Popen(
        [str(mirror["olah_python"]), "-m", "olah.server", "--config", str(config), "--log-path", str(workdir)],
        cwd=workdir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    endpoint = f"http://127.0.0.1:{port}"
    try:
        wait_for_http(f"{endpoint}/api/models/{mirror['repo_id']}", process)
        yield endpoint
    finally:
        os.killpg(process.pid, signal.SIGTERM)  # its own session: only olah and its children
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


def hf_env(endpoint: str, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT=endpoint, HF_HOME=str(home), HF_HUB_DISABLE_TELEMETRY="1")
    return env


def test_hf_download_fetches_the_checkpoint_at_its_commit(mirror, olah, tmp_path):
    hf = Path(mirror["olah_python"]).parent / "hf"
    target = tmp_path / "download"
    subprocess.run(
        [str(hf), "download", mirror["repo_id"], "--revision", mirror["revision"], "--local-dir", str(target)],
        check=True, capture_output=True, text=True, env=hf_env(olah, tmp_path / "hf-home"),
    )  # fmt: skip
    repo = mirrors_hf.repo_dir(mirror["mirrors_path"])
    for name, size in mirror["files"].items():
        fetched = target / name
        assert fetched.stat().st_size == size, name
        assert hashlib.sha256(fetched.read_bytes()).digest() == hashlib.sha256((repo / name).read_bytes()).digest()
    assert json.loads((target / "config.json").read_text())["model_type"] == "kimi_k2"


def test_list_repo_tree_reports_the_sizes(mirror, olah, tmp_path):
    script = (
        "import json, sys\n"
        "from huggingface_hub import HfApi\n"
        "entries = HfApi().list_repo_tree(sys.argv[1], revision=sys.argv[2], recursive=True)\n"
        "print(json.dumps({e.path: getattr(e, 'size', None) for e in entries}))\n"
    )
    result = subprocess.run(
        [str(mirror["olah_python"]), "-c", script, mirror["repo_id"], mirror["revision"]],
        check=True, capture_output=True, text=True, env=hf_env(olah, tmp_path / "hf-home"),
    )  # fmt: skip
    sizes = json.loads(result.stdout)
    assert sizes == mirror["files"]
    assert sum(sizes.values()) == mirror["total_bytes"]
