"""Run one of this repository's modules with the venv's ``ansible`` against localhost and return its result.

Unit tests use it to exercise plugins/modules/*.py the way Ansible packs and runs them: called by FQCN
(kimi.k2.<name>, found through ansible.cfg's collections_path, whose kimi.k2 is this checkout), their module_utils
imported as ``ansible_collections.kimi.k2.plugins.module_utils.*``, with every temporary path under the test's
tmp_path.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def ansible_executable() -> str:
    """The ansible next to the running interpreter (the project's .venv), else the one on PATH."""
    beside = Path(sys.executable).parent / "ansible"
    found = str(beside) if beside.exists() else shutil.which("ansible")
    if not found:
        pytest.skip("ansible is not installed (make venv)")
    return found


def run_module(
    tmp_path: Path, module: str, args: dict[str, Any], *, check: bool = False, interpreter: str | None = None
) -> tuple[bool, dict]:
    """(succeeded, result) of ``ansible localhost -m MODULE -a ARGS`` with a connection to the local machine, run
    by `interpreter` (default: this venv's python; a node's bare /usr/bin/python3 for a module that runs there).
    A short name is one of this collection's modules (kimi_plan: kimi.k2.kimi_plan)."""
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"),
        "ANSIBLE_HOME": str(tmp_path / "ansible-home"),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-local"),
        "ANSIBLE_REMOTE_TEMP": str(tmp_path / "ansible-remote"),
        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.minimal",
        "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_DEPRECATION_WARNINGS": "0",
    }
    command = [
        ansible_executable(),
        "all",
        "-i",
        "localhost,",
        "-c",
        "local",
        "-m",
        module if "." in module else f"kimi.k2.{module}",
        "-a",
        json.dumps(args),
        "-e",
        f"ansible_python_interpreter={interpreter or sys.executable}",
    ]
    if check:
        command.append("--check")
    completed = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    marker = completed.stdout.find("=> ")
    if marker < 0:
        raise AssertionError(
            f"no result from ansible (rc {completed.returncode}):\n{completed.stdout}{completed.stderr}"
        )
    result = json.loads(completed.stdout[marker + 3 :])
    return completed.returncode == 0, result
