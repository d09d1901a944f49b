"""The checkout as the kimi.k2 collection: built with ansible-galaxy, installed from the tarball into a
temporary collections path, and used by a playbook of a user's own (a role and a module by FQCN, check mode)
in a project that has none of this repository's ansible.cfg or collections path.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.ansible_run import PlayResult, run_playbook
from tests.paths import REPO_ROOT

BIN = Path(sys.executable).parent
GALAXY = yaml.safe_load((REPO_ROOT / "galaxy.yml").read_text())
FQCN = f"{GALAXY['namespace']}.{GALAXY['name']}"
# Any task that reached a node would fail at once against a closed loopback port.
NOWHERE = {"ansible_host": "127.0.0.1", "ansible_port": 9}

USER_PLAYBOOK = f"""\
---
- name: My site's inputs, judged with the {FQCN} collection
  hosts: kimi_nodes
  gather_facts: false
  vars:
    kimi_phase: inputs
    kimi_run_phases: [preflight, stack, parity, checkpoint, serve, verify]
  roles:
    - role: {FQCN}.kimi
  tasks:
    - name: Plan the lab layout with the collection's planner module
      {FQCN}.kimi_plan:
        model: lab-mini
        gpu: cpu
        kv_cache_gib_per_gpu: 1
        pp: 2
        nodes: 2
        max_model_len: 2048
      run_once: true
      delegate_to: localhost
      register: lab_plan
"""


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """This process's environment without any ANSIBLE_* setting (the Makefile exports the checkout's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    return {**env, "ANSIBLE_HOME": str(home), "ANSIBLE_NOCOLOR": "1", **extra}


def run(command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The collections path holding kimi.k2 installed from the tarball that was just built."""
    root = tmp_path_factory.mktemp("collection")
    env = clean_env(root / "home")
    built = run(
        [str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(root), str(REPO_ROOT)], root, env
    )
    assert built.returncode == 0, built.stderr
    (tarball,) = root.glob(f"{GALAXY['namespace']}-{GALAXY['name']}-{GALAXY['version']}.tar.gz")
    path = root / "collections"
    command = [str(BIN / "ansible-galaxy"), "collection", "install", "--offline", "-p", str(path), str(tarball)]
    done = run(command, root, env)
    assert done.returncode == 0, done.stderr
    return path


@pytest.fixture
def project(installed, tmp_path) -> Path:
    """A user's project: their ansible.cfg (the collections path only), an inventory, their playbook."""
    (tmp_path / "ansible.cfg").write_text(f"[defaults]\ncollections_path = {installed}\n")
    shutil.copytree(
        installed / "ansible_collections" / "kimi" / "k2" / "inventories" / "greennode", tmp_path / "inventory"
    )
    (tmp_path / "play.yml").write_text(USER_PLAYBOOK)
    return tmp_path


def play(project: Path, **extravars: str) -> PlayResult:
    """The user's playbook in check mode, with their ansible.cfg and none of this checkout's plugin paths."""
    return run_playbook(
        project / "play.yml",
        project / "inventory",
        extravars={**NOWHERE, **extravars},
        check=True,
        project_dir=project,
        envvars={
            "ANSIBLE_CONFIG": str(project / "ansible.cfg"),
            "ANSIBLE_HOME": str(project / "home"),
            # The plan task runs on localhost, where remote_tmp (default ~/.ansible/tmp) is this machine's home.
            "ANSIBLE_REMOTE_TEMP": str(project / "remote-tmp"),
            "ANSIBLE_CALLBACK_PLUGINS": "",
            "KIMI_REPORT_DIR": str(project / "reports"),
        },
        timeout=600,
    )


def test_the_tarball_holds_the_collection_and_not_the_test_bed(installed):
    root = installed / "ansible_collections" / "kimi" / "k2"
    manifest = json.loads((root / "MANIFEST.json").read_text())
    assert manifest["collection_info"]["name"] == GALAXY["name"]
    for wanted in (
        "plugins/modules/kimi_plan.py",
        "plugins/module_utils/kimi_plan.py",
        "roles/kimi/tasks/main.yml",
        "plugins/callback/kimi_phase_failures.py",
        "plugins/action/kimi_checkpoint_job.py",
        "plugins/doc_fragments/attributes.py",
        "plugins/filter/kimi_pip.py",
        "plugins/filter/kimi_systemd.py",
        "meta/runtime.yml",
        "site.yml",
    ):
        assert (root / wanted).is_file(), wanted
    for absent in ("lab", "tests", "molecule", ".venv", "library", "module_utils", "collections", "contrib", "bin"):
        assert not (root / absent).exists(), absent


FILTERS_PLAYBOOK = """\
---
- name: The filters the collection's roles call, by FQCN, from the installed collection
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Check each filter's answer
      ansible.builtin.assert:
        that:
          - "('Nvidia_NCCL.cu13' | kimi.k2.pep503_name) == 'nvidia-nccl-cu13'"
          - "(pinset | kimi.k2.venv_differences({}, removed=['TorchVision'])).expected_resolved == {'torch': '1'}"
          - "('ActiveState=active' | kimi.k2.systemctl_show).ActiveState == 'active'"
      vars:
        pinset: {resolved: {torch: '1', torchvision: '2'}, wheel_overrides: {}}
"""


def test_the_roles_filters_resolve_by_fqcn_from_the_installed_collection(project):
    (project / "filters.yml").write_text(FILTERS_PLAYBOOK)
    result = run_playbook(
        project / "filters.yml",
        project / "inventory",
        project_dir=project,
        envvars={
            "ANSIBLE_CONFIG": str(project / "ansible.cfg"),
            "ANSIBLE_HOME": str(project / "home"),
            "ANSIBLE_CALLBACK_PLUGINS": "",
        },
        timeout=600,
    )
    assert result.rc == 0, result.failure_messages()


def test_a_users_playbook_runs_the_role_and_a_module_by_fqcn_in_check_mode(project):
    result = play(project)
    assert result.rc == 0, result.failure_messages()
    assert not result.unreachable_hosts and result.changed == 0
    judged = result.results_of("Judge this host's inputs for those phases (on the controller)")
    assert sorted(judged) == ["gn-h100-node1", "gn-h100-node2"]
    assert all(
        r["phases"] == ["preflight", "stack", "parity", "checkpoint", "serve", "verify"] for r in judged.values()
    )
    (planned,) = result.results_of("Plan the lab layout with the collection's planner module").values()
    assert planned["fits"] is True
    modules = {e["event_data"].get("resolved_action") for e in result.events if e.get("event") == "runner_on_ok"}
    assert f"{FQCN}.kimi_plan" in modules and f"{FQCN}.kimi_inputs" in modules, modules


def test_the_installed_role_refuses_bad_input_naming_host_and_variable(project):
    result = play(project, kimi_checkpoint_revision="main")
    assert result.rc != 0
    assert any(
        "kimi_checkpoint_revision" in m and "is not a 40-hex commit sha in lower case" in m
        for m in result.failure_messages()
    ), result.failure_messages()
