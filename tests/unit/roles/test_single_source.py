"""Values several roles read are defined once, in the kimi role, and derived everywhere else (issue: a path
copied into six role defaults drifts the day one of them changes)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from module_utils.kimi_serve import API_UNIT, HEADLESS_UNIT
from tests import paths

ROLES = paths.REPO_ROOT / "roles"
KIMI_DEFAULTS = yaml.safe_load((ROLES / "kimi" / "defaults" / "main.yml").read_text())
KIMI_VARS = yaml.safe_load((ROLES / "kimi" / "vars" / "main.yml").read_text())
# literal -> the kimi variable that holds it
SHARED_LITERALS = {
    KIMI_DEFAULTS["kimi_nccl_env_file"]: "kimi_nccl_env_file",
    KIMI_DEFAULTS["kimi_checkpoint_marker_name"]: "kimi_checkpoint_marker_name",
    API_UNIT: "kimi_vllm_api_unit",
    HEADLESS_UNIT: "kimi_vllm_headless_unit",
}
# The announced-IP rule (kimi_announced_ip): its distinctive part.
ANNOUNCED_IP = re.compile(r"\['ansible_' ~ \(kimi_network_interface")


def role_yaml_files() -> list[Path]:
    """Every role's defaults, vars and tasks except the kimi role's own."""
    found = []
    for folder in ("defaults", "vars", "tasks"):
        found += [p for p in ROLES.glob(f"*/{folder}/*.yml") if p.parts[-3] != "kimi"]
    return sorted(found)


def test_the_unit_names_equal_the_ones_the_argv_module_renders():
    assert (KIMI_VARS["kimi_vllm_api_unit"], KIMI_VARS["kimi_vllm_headless_unit"]) == (API_UNIT, HEADLESS_UNIT)


@pytest.mark.parametrize("path", role_yaml_files(), ids=lambda p: str(p.relative_to(ROLES)))
def test_no_role_copies_a_value_the_kimi_role_defines(path):
    # Comments may name the value; only YAML content counts.
    content = "\n".join(
        line.split(" #")[0] for line in path.read_text().splitlines() if not line.lstrip().startswith("#")
    )
    # A file named after a unit (kimi-vllm.service.j2) is not the unit's name written out.
    copied = {
        literal: name
        for literal, name in SHARED_LITERALS.items()
        if re.search(re.escape(literal) + r"(?![\w.])", content)
    }
    assert not copied, f"{path.relative_to(ROLES)} writes {sorted(copied)}: use {sorted(copied.values())}"
    assert not ANNOUNCED_IP.search(content), (
        f"{path.relative_to(ROLES)} derives the announced IP: use kimi_announced_ip"
    )
