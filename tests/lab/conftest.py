"""The running lab for tests/lab: one controller per session that brings the lab to the shape a test needs
and always tears it down at the end, also when tests fail.

Tests ask for `lab` (2 nodes up, the usual case), for `serving` (those 2 nodes converged by site.yml and
serving), or call `lab_controller.ensure_up(n)` / `lab_controller.ensure_down()` themselves.
`lab_controller.run(...)` runs `lab/lab` with its output captured.

One converge for the whole session: a converge is the lab layer's most expensive step (about 4 minutes on 2
cores), so every file that needs a serving lab shares the one `serving` makes. A test that changes the nodes
puts them back before it ends (they all end on a site.yml run); when a test fails, or the group stops
generating tokens, the next `serving` converges again, so one failure does not cascade. The files run in
LAB_FILE_ORDER: the node/CLI tests first (they bring labs of other sizes up and down), then the converge and
every test that reuses it.

Mirrors: lab/lab up builds and serves the real mirrors. When the mirror builders are missing from the
checkout, or KIMI_LAB_TEST_STUB_MIRRORS=1 is set, `lab/lab` runs with small stand-ins instead (tiny
directories and an HTTP answer in olah's place), which is enough for the node/network/CLI tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from labctl import teardown
from labctl.settings import load_settings
from labctl.state import StatePaths

from tests.ansible_run import run_playbook
from tests.lab_api import generates_a_token

REPO_ROOT = Path(__file__).resolve().parents[2]
LAB = REPO_ROOT / "lab" / "lab"
SITE = REPO_ROOT / "site.yml"
LAB_INVENTORY = REPO_ROOT / "inventories" / "lab"
# Files not named here run after these, in pytest's usual order (tests outside tests/lab run before them).
LAB_FILE_ORDER = (
    "test_lab_cli.py",
    "test_mirrors_from_node.py",
    "test_site_on_lab.py",
    # Each role's Molecule verify against the converge as test_site_on_lab.py leaves it.
    "test_molecule_verify.py",
    "test_stack_parity.py",
    "test_site_then_drift.py",
    "test_site_then_lifecycle.py",
    "test_site_then_heal.py",
    # Reuses the converge, then leaves the nodes installing from node1's offline mirror.
    "test_site_offline.py",
    # Last: it reshapes the lab into two replicas behind a router.
    "test_front_door.py",
)
MIRROR_MODULES = ("mirrors_apt", "mirrors_wheels", "mirrors_hf")

STUB_OLAH = """\
import argparse, tomllib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

parser = argparse.ArgumentParser()
parser.add_argument("--config")
parser.add_argument("--log-path")
config = tomllib.loads(open(parser.parse_args().config).read())["basic"]


class Answer(BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"olah stand-in\\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


ThreadingHTTPServer((config["host"], config["port"]), Answer).serve_forever()
"""

STUB_LAUNCHER = """\
import sys, types
from pathlib import Path

STUB = Path({stub!r})
sys.path.insert(0, {lab_dir!r})


def module(name, **functions):
    stand_in = types.ModuleType(name)
    stand_in.__dict__.update(functions)
    sys.modules[name] = stand_in


module("labctl.mirrors_apt", build=lambda cache: {{"nvidia": STUB / "apt/nvidia", "debian": STUB / "apt/debian"}})
module("labctl.mirrors_wheels", build=lambda cache: {{"wheelhouse": STUB / "wheels"}})
module(
    "labctl.mirrors_hf",
    build=lambda cache: {{
        "mirrors_path": STUB / "hf",
        "repo_id": "kimi-lab/stand-in",
        "revision": "0" * 40,
        "files": {{"config.json": 2}},
        "total_bytes": 2,
        "olah_python": STUB / "olah-python",
    }},
    olah_config=lambda mirrors_path, host, port, repos_path: f'[basic]\\nhost = "{{host}}"\\nport = {{port}}\\n',
)
from labctl.cli import main

sys.exit(main())
"""


def use_stub_mirrors() -> bool:
    if os.environ.get("KIMI_LAB_TEST_STUB_MIRRORS") == "1":
        return True
    return not all((REPO_ROOT / "lab" / "labctl" / f"{name}.py").exists() for name in MIRROR_MODULES)


def write_stub_mirrors(directory: Path) -> Path:
    """Tiny mirror stand-ins and a launcher that runs lab/lab's main() with them; returns the launcher."""
    (directory / "apt/nvidia").mkdir(parents=True)
    (directory / "apt/debian").mkdir(parents=True)
    (directory / "apt/nvidia/Packages").write_text("")
    (directory / "apt/debian/Packages").write_text("Package: lab-stand-in\nVersion: 1\n")
    (directory / "wheels").mkdir()
    (directory / "hf").mkdir()
    (directory / "olah/olah").mkdir(parents=True)
    (directory / "olah/olah/__init__.py").write_text("")
    (directory / "olah/olah/server.py").write_text(STUB_OLAH)
    olah_python = directory / "olah-python"
    olah_python.write_text(f'#!/bin/sh\nPYTHONPATH={directory / "olah"} exec {sys.executable} "$@"\n')
    olah_python.chmod(0o755)
    launcher = directory / "lab-with-stub-mirrors.py"
    launcher.write_text(textwrap.dedent(STUB_LAUNCHER).format(stub=str(directory), lab_dir=str(REPO_ROOT / "lab")))
    return launcher


@dataclass
class LabController:
    command: list[str]
    paths: StatePaths
    node_count: int = 0
    log: list[str] = field(default_factory=list)
    # The first successful site.yml converge of the current lab (None until one ran, or after `down`).
    converged: object | None = None

    def run(self, *args: str, env: dict[str, str] | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [*self.command, *args],
            capture_output=True,
            text=True,
            env={**os.environ, **(env or {})},
            timeout=timeout,
            check=False,
            cwd=REPO_ROOT,
        )
        self.log.append(f"$ lab {' '.join(args)} -> {proc.returncode}\n{proc.stdout}{proc.stderr}")
        return proc

    def ensure_up(self, count: int) -> dict:
        if self.node_count != count:
            self.ensure_down()
            proc = self.run("up", str(count))
            assert proc.returncode == 0, proc.stderr
            self.node_count = count
        return self.status()

    def ensure_down(self) -> None:
        proc = self.run("down")
        assert proc.returncode == 0, proc.stderr
        self.node_count = 0
        self.converged = None

    def status(self) -> dict:
        proc = self.run("status", "--json")
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    def ssh(self, node: str, command: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return self.run("ssh", node, command, timeout=timeout)


def keep_lab() -> bool:
    """KIMI_LAB_KEEP=1 (tests/tiers.py and .ci/run set it between test sessions): a healthy 2-node lab an earlier
    session left is taken over, and this session leaves its lab up for the next; the last one takes it down."""
    return os.environ.get("KIMI_LAB_KEEP") == "1"


def adopt_running_lab(controller: LabController) -> bool:
    """Take over a healthy 2-node lab (as `lab/lab up 2` finds it: kept, exit 0). Its converge is not trusted: the
    first test that needs `serving` converges again (a run that changes nothing on a lab as it was left)."""
    nodes = controller.status().get("nodes") or []
    if len(nodes) != 2 or controller.run("up", "2").returncode != 0:
        return False
    controller.node_count = 2
    return True


@pytest.fixture(scope="session")
def lab_controller(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    command = [sys.executable, str(LAB)]
    if use_stub_mirrors():
        command = [sys.executable, str(write_stub_mirrors(tmp_path_factory.mktemp("stub-mirrors")))]
    controller = LabController(command=command, paths=StatePaths(load_settings().state))
    # Start from nothing (a lab left up by an earlier run would make every `up` refuse), unless told to take over.
    if not (keep_lab() and adopt_running_lab(controller)):
        controller.ensure_down()
    try:
        yield controller
    finally:
        if not (keep_lab() and controller.node_count == 2):
            controller.run("down")
            left = teardown.leftovers(controller.paths)
            assert not left, f"lab leftovers after the session: {left}"


@pytest.fixture
def lab(lab_controller):
    """A running 2-node lab (brought up once and reused while tests keep it that way)."""
    lab_controller.ensure_up(2)
    return lab_controller


def pytest_collection_modifyitems(items):
    """Run the lab files in LAB_FILE_ORDER (stable: tests keep their order inside a file)."""

    here = Path(__file__).parent

    def rank(item) -> int:
        path = Path(str(item.fspath))
        if path.parent != here:
            return -1
        return LAB_FILE_ORDER.index(path.name) if path.name in LAB_FILE_ORDER else len(LAB_FILE_ORDER)

    items.sort(key=rank)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the test, so `serving` knows whether the test before it failed."""
    report = yield
    setattr(item, f"lab_report_{report.when}", report)
    return report


def ensure_serving(lab_controller: LabController) -> LabController:
    """The 2-node lab converged by site.yml and generating tokens: the session's one converge, made when missing."""
    lab_controller.ensure_up(2)
    if lab_controller.converged is None or not generates_a_token():
        started = time.monotonic()
        result = run_playbook(SITE, LAB_INVENTORY)
        print(f"serving: site.yml converge -> rc {result.rc} in {time.monotonic() - started:.1f} s")
        assert result.rc == 0, result.failure_messages()
        assert generates_a_token(), "the lab does not generate a token after a converge"
        lab_controller.converged = result
    return lab_controller


@pytest.fixture
def serving(lab_controller, request):
    """The 2-node lab converged by site.yml and generating tokens, shared by every test that asks for it."""
    yield ensure_serving(lab_controller)
    call = getattr(request.node, "lab_report_call", None)
    if call is None or call.failed:
        # The test may have left the nodes half-changed: the next test that needs them converges again.
        lab_controller.converged = None
