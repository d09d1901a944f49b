"""Checkpoint download throughput: the checkpoint role (hf download, detached, with progress polling and
verification) against a plain `curl` of the same files from the same mirror.

The lab's miniature checkpoint is 8.6 MB, too small to measure a transfer (Ansible's and hf's fixed costs
would be the whole figure). So this builds its own repository in a temporary directory, shaped like a sharded
checkpoint: a config, an index and KIMI_BENCH_CHECKPOINT_MB megabytes (default 2048) of random, so
incompressible, weights split over shards of at most 512 MB, stored as Git LFS objects the way the Hub stores
safetensors (olah serves LFS objects from `.git/lfs/objects`, and lists their sha256, which the role then
verifies as it would in production). olah, from the lab's tools venv, serves it on loopback (this process's own
child, stopped by PID); the role runs with a local connection and its production defaults (progress interval
included), except for paths. The target compares the whole play with a sequential `curl` of every file; curl
fetching up to 8 files at once (hf's default workers) is printed for reference, and so is the role's fixed
cost (its Ansible tasks around the download, verification included), which does not grow with the checkpoint.

Prints the figures only (no target is asserted); skips, saying why, without root, curl, the lab's tools venv
(olah) or the wheelhouse with the hf CLI.

Run: .venv/bin/python bench/bench_checkpoint.py   (KIMI_BENCH_CHECKPOINT_MB=512 for a quicker look)
"""

from __future__ import annotations

import hashlib
import json
import math
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
CHECKPOINT_MB = int(os.environ.get("KIMI_BENCH_CHECKPOINT_MB", "2048"))
# Real checkpoints are split into shards of a few GB; 512 MB keeps olah, which holds a whole file in memory
# while serving it, within a small machine's memory while still giving hf several files to fetch at once.
SHARD_MB = 512
BENCH_ORG, BENCH_NAME = "kimi-bench", "Kimi-K2-bench"
TARGET = 0.9
HF_WORKERS = 8  # the role's checkpoint_hf_max_workers default
DOWNLOAD_TASK = "Report progress until the download ends"
VERIFY_TASK = "Verify every file (size, and sha256 or git blob id where the Hub gives one)"
WRITE_BLOCK = 16 << 20


def skip(reason: str) -> None:
    print(f"bench_checkpoint: skipped: {reason}")
    sys.exit(0)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def lfs_pointer(oid: str, size: int) -> str:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {size}\n"


def build_repository(mirrors: Path, total_mb: int) -> dict:
    """A git repository of a sharded checkpoint under `mirrors` (olah's MIRRORS/models/ORG/REPO layout).

    The shards are LFS objects written straight into `.git/lfs/objects` next to their pointer files, so no
    git-lfs is needed; git itself only stores the small files and the pointers.
    """
    repo = mirrors / "models" / BENCH_ORG / BENCH_NAME
    objects = repo / ".git" / "lfs" / "objects"
    repo.mkdir(parents=True)
    total = total_mb * 1_000_000
    count = max(1, math.ceil(total_mb / SHARD_MB))
    sizes = [total // count + (1 if i < total % count else 0) for i in range(count)]
    weight_map, shards = {}, {}
    for index, size in enumerate(sizes, start=1):
        name = f"model-{index:05d}-of-{count:05d}.safetensors"
        shards[name] = size
        weight_map[f"model.layers.{index - 1}.weight"] = name
        digest = hashlib.sha256()
        staging = repo / f".{name}.tmp"
        with staging.open("wb") as handle:
            left = size
            while left:
                block = os.urandom(min(WRITE_BLOCK, left))
                digest.update(block)
                handle.write(block)
                left -= len(block)
        oid = digest.hexdigest()
        (objects / oid[:2] / oid[2:4]).mkdir(parents=True, exist_ok=True)
        staging.rename(objects / oid[:2] / oid[2:4] / oid)
        (repo / name).write_text(lfs_pointer(oid, size))
    (repo / "config.json").write_text(json.dumps({"model_type": "kimi_k2", "bench": True}, indent=2) + "\n")
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (repo / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    (repo / ".gitattributes").write_text("*.safetensors filter=lfs diff=lfs merge=lfs -text\n")
    revision = mirrors_hf.commit_repository(repo)
    files = {p.name: p.stat().st_size for p in sorted(repo.iterdir()) if p.is_file()}
    files.update(shards)  # the content's size, not the pointer's
    return {"repo_id": f"{BENCH_ORG}/{BENCH_NAME}", "revision": revision, "files": files}


def start_olah(olah_python: Path, mirrors: Path, workdir: Path, repo_id: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    (workdir / "olah.toml").write_text(mirrors_hf.olah_config(mirrors, "127.0.0.1", port, workdir / "olah-repos"))
    olah = subprocess.Popen(
        [str(olah_python), "-m", "olah.server", "--config", str(workdir / "olah.toml"), "--log-path", str(workdir)],
        cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{url}/api/models/{repo_id}/revision/main", timeout=5)
            return olah, url
        except urllib.error.HTTPError:
            return olah, url
        except OSError:
            time.sleep(0.5)
    os.killpg(olah.pid, signal.SIGTERM)
    raise SystemExit("olah did not come up")


def curl_all(url: str, checkpoint: dict, target: Path, parallel: bool = False) -> float:
    """Seconds for a plain `curl` of every file: one after the other (what one would type without the role),
    or all at once, up to as many as hf's default workers (the most the mirror gives)."""
    target.mkdir(parents=True)
    sources = [
        (target / name, f"{url}/{checkpoint['repo_id']}/resolve/{checkpoint['revision']}/{name}")
        for name in checkpoint["files"]
    ]
    started = time.monotonic()
    if parallel:
        pairs = [arg for path, source in sources for arg in ("-o", str(path), source)]
        # curl 7.88 draws its parallel progress meter even with -s.
        command = ["curl", "-sSfL", "--no-progress-meter", "--parallel", "--parallel-max", str(HF_WORKERS), *pairs]
        subprocess.run(command, check=True)
    else:
        for path, source in sources:
            subprocess.run(["curl", "-sSfL", "-o", str(path), source], check=True)
    seconds = time.monotonic() - started
    for name, size in checkpoint["files"].items():
        if (target / name).stat().st_size != size:
            raise SystemExit(f"curl fetched {name} at {(target / name).stat().st_size} bytes, listed {size}")
    shutil.rmtree(target)
    return seconds


def task_seconds(result: object, task: str) -> float:
    for event in result.events:
        data = event.get("event_data", {})
        if event.get("event") == "runner_on_ok" and data.get("task") == task:
            return (datetime.fromisoformat(data["end"]) - datetime.fromisoformat(data["start"])).total_seconds()
    return float("nan")


def role_run(url: str, checkpoint: dict, workdir: Path, name: str, wheelhouse: Path, **extra: object) -> dict:
    """Seconds of one fresh download through the role: whole play, the download task, the verify task."""
    layout = {
        "ansible_connection": "local",
        "ansible_python_interpreter": str(REPO / ".venv" / "bin" / "python"),
        "kimi_model": "lab-mini",
        "kimi_checkpoint_repo_id": checkpoint["repo_id"],
        "kimi_checkpoint_revision": checkpoint["revision"],
        "checkpoint_hf_endpoint": url,
        "kimi_checkpoint_dir": str(workdir / name / "data"),
        "checkpoint_state_dir": str(workdir / name / "state"),
        "checkpoint_hf_venv_root": str(workdir / "kimi-hf"),
        "checkpoint_python": "/usr/bin/python3",
        "checkpoint_os_packages": [],
        "checkpoint_pip_find_links": [str(wheelhouse)],
        "checkpoint_pip_no_index": True,
        "checkpoint_margin_bytes": 1_000_000,
        "checkpoint_launcher": "nohup",
        **extra,
    }
    inventory = workdir / f"{name}.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {"kimi_nodes": {"hosts": {"n1": {}}, "vars": layout}}}}))
    started = time.monotonic()
    result = run_playbook(REPO / "playbooks" / "checkpoint.yml", inventory, timeout=1800)
    whole = time.monotonic() - started
    if result.rc != 0:
        raise SystemExit(f"role run failed: {result.failure_messages()}")
    shutil.rmtree(workdir / name)
    return {
        "whole": whole,
        "download": task_seconds(result, DOWNLOAD_TASK),
        "verify": task_seconds(result, VERIFY_TASK),
    }


def rate(total: int, seconds: float) -> str:
    return f"{seconds:7.2f} s  {total / seconds / 1e6:8.1f} MB/s"


def main() -> None:
    if os.geteuid() != 0:
        skip("needs root (the role sets ownership)")
    if shutil.which("curl") is None:
        skip("curl is not installed")
    olah_python = mirrors_hf.existing_tools_python(LAB_CACHE)
    if olah_python is None:
        skip(f"the lab's tools venv (olah) is not built under {LAB_CACHE} (lab/lab build all)")
    wheels = sorted(LAB_CACHE.glob("wheels/*/huggingface_hub-2.4.0-py3-none-any.whl"))
    if not wheels:
        skip("no wheelhouse with huggingface_hub 2.4.0 in the lab cache")
    wheelhouse = wheels[0].parent
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-checkpoint-") as tmp:
        workdir = Path(tmp)
        started = time.monotonic()
        checkpoint = build_repository(workdir / "mirrors", CHECKPOINT_MB)
        built = time.monotonic() - started
        total = sum(checkpoint["files"].values())
        olah, url = start_olah(olah_python, workdir / "mirrors", workdir, checkpoint["repo_id"])
        try:
            # Installs the hf venv once (a single small file), so no timed run pays for pip.
            role_run(url, checkpoint, workdir, "warmup", wheelhouse, kimi_checkpoint_include=["config.json"])
            curls, parallel_curls, roles = [], [], []
            for attempt in range(2):  # interleaved, so a slower phase of the machine hits all alike
                curls.append(curl_all(url, checkpoint, workdir / f"curl{attempt}"))
                roles.append(role_run(url, checkpoint, workdir, f"role{attempt}", wheelhouse))
                parallel_curls.append(curl_all(url, checkpoint, workdir / f"pcurl{attempt}", parallel=True))
        finally:
            os.killpg(olah.pid, signal.SIGTERM)
            try:
                olah.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(olah.pid, signal.SIGKILL)
    load_after = os.getloadavg()[0]
    curl_s = min(curls)
    parallel_s = min(parallel_curls)
    whole = min(r["whole"] for r in roles)
    download = min(r["download"] for r in roles)
    verify = min(r["verify"] for r in roles)
    fixed = min(r["whole"] - r["download"] for r in roles)
    ratio = curl_s / whole
    print(
        f"checkpoint {checkpoint['repo_id']}@{checkpoint['revision'][:12]}: {len(checkpoint['files'])} files, "
        f"{total} bytes ({total / 1e6:.0f} MB; built in {built:.0f} s)"
    )
    print(f"  curl, sequential (best of 2):       {rate(total, curl_s)}")
    print(f"  curl, {HF_WORKERS} at once (best of 2):        {rate(total, parallel_s)}  (for reference)")
    print(f"  role, whole play (best of 2):       {rate(total, whole)}  ratio {ratio:.2f}x of curl")
    print(f"  role, download task (best of 2):    {rate(total, download)}  ratio {curl_s / download:.2f}x of curl")
    print(f"  role, verify task (best of 2):      {verify:7.2f} s  (sha256 of every shard)")
    print(
        f"  role, fixed cost (whole - download): {fixed:6.2f} s  (Ansible's tasks before and after the "
        f"download, verify included)"
    )
    # olah serves in Python, so every figure is CPU-bound: other work on this host moves them all.
    print(f"  host: {os.cpu_count()} CPUs, load average {load_before:.1f} at the start, {load_after:.1f} at the end")
    verdict = "meets" if ratio >= TARGET else "is below"
    print(
        f"  whole play {ratio:.2f}x of sequential curl {verdict} the {TARGET}x target "
        f"({parallel_s / whole:.2f}x of curl {HF_WORKERS} at once)"
    )


if __name__ == "__main__":
    main()
