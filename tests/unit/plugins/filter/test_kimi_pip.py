"""The pip filters (plugins/filter/kimi_pip.py) as Python, and the roles' FQCN spelling of them resolved by
Ansible in this checkout (ansible.cfg's collections_path reaches plugins/ through collections/)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.paths import REPO_ROOT


def load(name: str):
    spec = importlib.util.spec_from_file_location(
        f"kimi_filter_{name}", REPO_ROOT / "plugins" / "filter" / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pip = load("kimi_pip")


def test_the_file_offers_both_filters():
    assert set(pip.FilterModule().filters()) == {"pep503_name", "venv_differences"}


def test_names_are_normalised_as_pip_compares_them():
    assert pip.pep503_name("Flash_Attn") == pip.pep503_name("flash.attn") == "flash-attn"
    assert pip.pep503_name("Nvidia_NCCL.cu13") == "nvidia-nccl-cu13"


def test_venv_differences_takes_the_roles_keywords():
    diff = pip.venv_differences(
        {"resolved": {"torch": "2.11.0", "torchvision": "0.26.0"}, "wheel_overrides": {}},
        {"torchvision": "0.26.0"},
        removed=["TorchVision"],
        aliases={"vllm": "0.32.0+cpu"},
    )
    assert diff["drift_resolved"] == ["torch==2.11.0"] and diff["present_removed"] == ["torchvision"]
    assert diff["parity_wheels"] == {"torch": "2.11.0", "vllm": "0.32.0+cpu"}


PLAYBOOK = """\
- name: The collection's filters by FQCN, as the roles call them
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Check each filter's answer
      ansible.builtin.assert:
        that:
          - "(['Flash_Attn', 'torch'] | map('kimi.k2.pep503_name') | list) == ['flash-attn', 'torch']"
          - "(pinset | kimi.k2.venv_differences(installed, removed=['Torch_Vision'])).drift_resolved == ['a==2']"
          - "(unit | kimi.k2.systemctl_show).MainPID == '7'"
      vars:
        pinset: {resolved: {a: '2', torch: '1', torch-vision: '3'}, wheel_overrides: {}}
        installed: {torch: '1'}
        unit: "ActiveState=active\\nMainPID=7\\n"
"""


def test_the_checkout_resolves_the_roles_fqcn_filters(tmp_path):
    (tmp_path / "play.yml").write_text(textwrap.dedent(PLAYBOOK))
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"),
        "ANSIBLE_HOME": str(tmp_path / "home"),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "local"),
        "ANSIBLE_NOCOLOR": "1",
    }
    playbook = Path(sys.executable).parent / "ansible-playbook"
    command = [str(playbook), "-i", "localhost,", "-c", "local", str(tmp_path / "play.yml")]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
