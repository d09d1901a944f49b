"""Checkpoint download throughput: the checkpoint role (hf download, detached, with progress polling and
verification) against a plain `curl` of the same files from the same mirror.

Uses the lab's olah mirror, started here on loopback (this process's own child, stopped by PID), and runs the
role with a local connection into a temporary directory. Prints the figures; skips, saying why, without root,
curl, the built mirror or the wheelhouse. The miniature checkpoint is 8.6 MB, so fixed costs (Ansible, hf's
start-up, the Hub API calls) dominate; the download-task figure isolates the transfer as well as Ansible can.

Run: .venv/bin/python bench/bench_checkpoint.py
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "lab"))

import yaml  # noqa: E402
from labctl import mirrors_hf  # noqa: E402

from tests.ansible_run import run_playbook  # noqa: E402

LAB_CACHE = Path(os.environ.get("KIMI_LAB_CACHE", "/var/cache/kimi-lab"))
DOWNLOAD_TASK = "Report progress until the download ends"


def skip(reason: str) -> None:
    print(f"bench_checkpoint: skipped: {reason}")
    sys.exit(0)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_olah(mirror: dict, workdir: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    (workdir / "olah.toml").write_text(
        mirrors_hf.olah_config(mirror["mirrors_path"], "127.0.0.1", port, workdir / "repos")
    )
    olah = subprocess.Popen(
        [str(mirror["olah_python"]), "-m", "olah.server", "--config", str(workdir / "olah.toml"),
         "--log-path", str(workdir)],
        cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{url}/api/models/{mirror['repo_id']}/revision/main", timeout=5)
            return olah, url
        except urllib.error.HTTPError:
            return olah, url
        except OSError:
            time.sleep(0.5)
    raise SystemExit("olah did not come up")


def curl_all(url: str, mirror: dict, target: Path) -> float:
    target.mkdir(parents=True)
    started = time.monotonic()
    for name in mirror["files"]:
        source = f"{url}/{mirror['repo_id']}/resolve/{mirror['revision']}/{name}"
        subprocess.run(["curl", "-sSfL", "-o", str(target / name), source], check=True)
    return time.monotonic() - started


def role_run(url: str, mirror: dict, workdir: Path, name: str, wheelhouse: Path) -> tuple[float, float]:
    """(whole play, download task) seconds for one fresh download through the role."""
    layout = {
        "ansible_connection": "local",
        "ansible_python_interpreter": str(REPO / ".venv" / "bin" / "python"),
        "kimi_model": "lab-mini",
        "checkpoint_repo_id": mirror["repo_id"],
        "checkpoint_revision": mirror["revision"],
        "checkpoint_hf_endpoint": url,
        "checkpoint_dir": str(workdir / name / "data"),
        "checkpoint_state_dir": str(workdir / name / "state"),
        "checkpoint_hf_venv_root": str(workdir / "kimi-hf"),
        "checkpoint_python": "/usr/bin/python3",
        "checkpoint_pip_find_links": [str(wheelhouse)],
        "checkpoint_pip_no_index": True,
        "checkpoint_margin_bytes": 1_000_000,
        "checkpoint_progress_interval": 1,
        "checkpoint_launcher": "nohup",
    }
    inventory = workdir / f"{name}.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {"kimi_nodes": {"hosts": {"n1": {}}, "vars": layout}}}}))
    started = time.monotonic()
    result = run_playbook(REPO / "playbooks" / "checkpoint.yml", inventory, timeout=900)
    whole = time.monotonic() - started
    if result.rc != 0:
        raise SystemExit(f"role run failed: {result.failure_messages()}")
    task = 0.0
    for event in result.events:
        data = event.get("event_data", {})
        if event.get("event") == "runner_on_ok" and data.get("task") == DOWNLOAD_TASK:
            task = (datetime.fromisoformat(data["end"]) - datetime.fromisoformat(data["start"])).total_seconds()
    return whole, task


def main() -> None:
    if os.geteuid() != 0:
        skip("needs root (the role sets ownership)")
    if shutil.which("curl") is None:
        skip("curl is not installed")
    mirror = mirrors_hf.existing(LAB_CACHE)
    if mirror is None:
        skip(f"the lab's Hugging Face mirror is not built under {LAB_CACHE}")
    wheels = sorted(LAB_CACHE.glob("wheels/*/huggingface_hub-2.4.0-py3-none-any.whl"))
    if not wheels:
        skip("no wheelhouse with huggingface_hub 2.4.0 in the lab cache")
    total = mirror["total_bytes"]
    with tempfile.TemporaryDirectory(prefix="bench-checkpoint-") as tmp:
        workdir = Path(tmp)
        olah, url = start_olah(mirror, workdir)
        try:
            curl_all(url, mirror, workdir / "warm")  # olah's first answers build its cache: keep them out
            curl_s = min(curl_all(url, mirror, workdir / f"curl{i}") for i in range(3))
            role_run(url, mirror, workdir, "warmup", wheels[0].parent)  # installs the hf venv once
            runs = [role_run(url, mirror, workdir, f"role{i}", wheels[0].parent) for i in range(2)]
        finally:
            os.killpg(olah.pid, signal.SIGTERM)
            olah.wait(timeout=15)
    whole = min(r[0] for r in runs)
    task = min(r[1] for r in runs)
    print(f"checkpoint {mirror['repo_id']}@{mirror['revision'][:12]}: {len(mirror['files'])} files, {total} bytes")
    print(f"  curl (sequential, best of 3):      {curl_s:7.2f} s  {total / curl_s / 1e6:8.1f} MB/s")
    print(f"  role download task (best of 2):    {task:7.2f} s  {total / task / 1e6:8.1f} MB/s  "
          f"ratio {curl_s / task:.2f}x of curl")  # fmt: skip
    print(f"  role whole play (best of 2):       {whole:7.2f} s  {total / whole / 1e6:8.1f} MB/s  "
          f"ratio {curl_s / whole:.2f}x of curl")  # fmt: skip


if __name__ == "__main__":
    main()
