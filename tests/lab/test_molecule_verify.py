"""Tier 1's share of Molecule: every scenario whose converge site.yml repeats runs its own verify.yml against the
lab layer's shared converge, on the same kind of nodes with the same group_vars.

The scenarios' full create, converge, idempotence and verify run in tier 2 (tests/tiers.py: molecule-stack and
molecule-services). Here each role's verify still reads what the role made (packages at their pins and held, the
venv, the checkpoint, the units, the monitoring stack), so a role that breaks its own scenario's verify fails tier 1
too. The one-node scenarios (cuda, nccl, nvidia_driver) are checked on both nodes. Not here: preflight (its verify
proves preflight wrote nothing to /data, which a converge's checkpoint phase then fills), firewall and router (their
scenarios put a router on a node, which this converge has not) and offline_mirror (no mirror host).
"""

from __future__ import annotations

import pytest

from tests.ansible_run import REPO_ROOT, run_playbook

pytestmark = pytest.mark.lab

LAB_INVENTORY = REPO_ROOT / "inventories" / "lab"
SCENARIOS = ("cuda", "nccl", "nvidia_driver", "vllm", "checkpoint", "vllm_serve", "monitoring")
# What Molecule's provisioner hands every scenario's playbooks (.config/molecule/config.yml).
MOLECULE_ENV = {
    "MOLECULE_PROJECT_DIRECTORY": str(REPO_ROOT),
    "KIMI_REPORT_DIR": str(REPO_ROOT / "artifacts"),
}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_scenarios_own_verify_passes_on_the_shared_converge_and_changes_nothing(serving, scenario):
    result = run_playbook(REPO_ROOT / "molecule" / scenario / "verify.yml", LAB_INVENTORY, envvars=MOLECULE_ENV)
    assert result.rc == 0, result.failure_messages()
    assert result.changed == 0, result.stats.get("changed")
    assert result.count("ok") > 0, "the verify checked nothing"
