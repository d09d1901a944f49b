"""The ports preflight asks rank 0's node to bind follow the serve phase's settings: the weight-cache daemons'
group port only when the weight cache is on (rank 0's kimi-vllm-preload.service binds it)."""

from __future__ import annotations

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from tests import paths

PREFLIGHT_DEFAULTS = yaml.safe_load((paths.REPO_ROOT / "roles" / "preflight" / "defaults" / "main.yml").read_text())
KIMI_DEFAULTS = yaml.safe_load((paths.REPO_ROOT / "roles" / "kimi" / "defaults" / "main.yml").read_text())


def rank0_ports(**variables: object) -> dict:
    names = ("kimi_api_port", "kimi_master_port", "kimi_weight_cache_port", "kimi_weight_cache")
    ports = {name: KIMI_DEFAULTS[name] for name in names}
    templar = Templar(loader=DataLoader(), variables={**ports, **variables})
    return templar.template(trust_as_template(PREFLIGHT_DEFAULTS["preflight_rank0_ports"]))


@pytest.mark.parametrize("weight_cache", [True, "true", "yes"])
def test_the_weight_cache_port_is_checked_when_the_weight_cache_is_on(weight_cache):
    assert rank0_ports(kimi_weight_cache=weight_cache) == {8000: "API", 29501: "master", 29600: "weight cache"}


@pytest.mark.parametrize("variables", [{}, {"kimi_weight_cache": False}, {"kimi_weight_cache": "false"}])
def test_without_the_weight_cache_only_the_api_and_master_ports(variables):
    assert rank0_ports(**variables) == {8000: "API", 29501: "master"}


def test_a_moved_weight_cache_port_is_the_one_checked():
    ports = rank0_ports(kimi_weight_cache=True, kimi_weight_cache_port="39600")
    assert ports == {8000: "API", 29501: "master", 39600: "weight cache"}
