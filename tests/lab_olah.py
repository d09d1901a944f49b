"""The lab's olah (its cached Hugging Face mirror and tools venv) run on 127.0.0.1 for a test's duration: the
checkpoint source of tests/local/test_bundle_hf.py and tests/local/test_bundle_build.py. And resolve_counts, to
read from olah's log how often each file of a repository was fetched."""

from __future__ import annotations

import re
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote

import pytest

# uvicorn's access line, which olah 0.5.4 logs for every request (in the lab: $KIMI_LAB_STATE/logs/olah.log):
#   ... | INFO | stdout | INFO:     198.18.0.11:40112 - "GET /ORG/REPO/resolve/REV/FILE HTTP/1.1" 200 OK
ACCESS_LINE = re.compile(r'"(?P<method>[A-Z]+) (?P<path>/[^ "?]*)(?:\?[^ "]*)? HTTP/[0-9.]+" (?P<status>[0-9]{3})')
# A download that was answered: olah serves local mirrors with 200; a Hub redirects to its CDN with 302.
FETCHED_STATUSES = ("200", "302")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def lab_hf_or_skip() -> dict:
    """The lab's built Hugging Face mirror (repo_id, revision, files, mirrors_path, olah_python), else a skip."""
    from labctl import mirrors_hf, settings

    cache = settings.load_settings().cache
    found = mirrors_hf.existing(cache)
    if found is None:
        pytest.skip(f"no built lab Hugging Face mirror for this recipe under {cache}: lab/lab build")
    return found


@contextmanager
def running_olah(hf: dict, workdir: Path) -> Iterator[str]:
    """olah on 127.0.0.1 with the lab's olah_config and cached mirrors; stopped by its pid on the way out."""
    from labctl import mirrors_hf

    workdir.mkdir(parents=True)
    port = free_port()
    config = workdir / "olah.toml"
    config.write_text(mirrors_hf.olah_config(Path(hf["mirrors_path"]), "127.0.0.1", port, workdir / "repos"))
    log = workdir / "olah.log"
    command = [str(hf["olah_python"]), "-m", "olah.server", "--config", str(config), "--log-path", str(workdir)]
    with log.open("wb") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, cwd=workdir)
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                pytest.fail(f"olah exited with {process.returncode}: {log.read_text()[-2000:]}")
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline:
                pytest.fail(f"olah did not listen on 127.0.0.1:{port} within 60 s: {log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()  # SIGTERM to this pid only
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)


def resolve_counts(log_text: str, repo_id: str) -> dict[str, int]:
    """File name -> how many GET /REPO_ID/resolve/REVISION/FILE requests olah answered (200 or 302) in
    `log_text`; HEAD requests (the hf client's metadata probe before each download) are not counted.

    uvicorn writes the line when olah starts its answer, so a download cut off half-way (an hf read timeout,
    then a retry) counts too: a count above 1 means the file was fetched again. The revision must be one path
    segment (a commit sha or a branch name without "/"), as the lab uses.
    """
    # The Hub also accepts /models/ORG/REPO/resolve/...
    prefixes = (f"/{repo_id}/resolve/", f"/models/{repo_id}/resolve/")
    counts: Counter[str] = Counter()
    for line in ACCESS_LINE.finditer(log_text):
        if line["method"] != "GET" or line["status"] not in FETCHED_STATUSES:
            continue
        rest = next((line["path"][len(p) :] for p in prefixes if line["path"].startswith(p)), None)
        _revision, _, name = (rest or "").partition("/")
        if name:
            counts[unquote(name)] += 1
    return dict(counts)
