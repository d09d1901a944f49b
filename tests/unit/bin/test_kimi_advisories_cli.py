"""bin/kimi-advisories as a user runs it: the thin script finds its logic (kimi_advisories_refresh.py) and refreshes a
data file from a fake OSV on loopback; its flags and exit statuses."""

from __future__ import annotations

import json
import subprocess
import sys

from ansible_collections.kimi.k2.plugins.module_utils import kimi_advisories as ka

from tests import paths
from tests.unit.contrib.test_kimi_advisories_refresh import curated, data_file, fake_osv, url

KIMI_ADVISORIES = paths.REPO_ROOT / "bin" / "kimi-advisories"
__all__ = ["data_file", "fake_osv"]  # the fixtures, shared with the logic's tests


def kimi_advisories(*argv):
    return subprocess.run(
        [sys.executable, str(KIMI_ADVISORIES), *map(str, argv)], capture_output=True, text=True, timeout=60, check=False
    )


def test_the_script_refreshes_a_data_file_from_osv(fake_osv, data_file):
    completed = kimi_advisories("--data", data_file, "--osv-url", url(fake_osv), "--package", "vllm")
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.splitlines()[-2] == "1 added, 1 changed, 0 kept, 0 unchanged"
    written = json.loads(data_file.read_text())
    assert [entry["id"] for entry in written["advisories"]] == ["GHSA-aaaa-bbbb-cccc", "GHSA-new0-new0-new0"]
    assert written["advisories"][0]["feature"] == curated()["feature"]
    ka.load(data_file)


def test_its_default_is_the_kimi_roles_snapshot_and_a_bad_flag_exits_2():
    shown = kimi_advisories("--help")
    assert shown.returncode == 0 and "roles/kimi/files/advisories.json" in " ".join(shown.stdout.split())
    assert kimi_advisories("--pip-audit", "a.json", "--osv-url", "http://127.0.0.1:9").returncode == 2
