"""router_session_balance_factor becomes haproxy's hash-balance-factor in one place, the router role's vars
(router_session_balance_percent); the input check only judges its range (kimi_inputs.balance_factor_ok)."""

from __future__ import annotations

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from tests import paths

ROUTER_VARS = yaml.safe_load((paths.REPO_ROOT / "roles" / "router" / "vars" / "main.yml").read_text())


@pytest.mark.parametrize(
    ("factor", "percent"), [("1.25", 125), (1.5, 150), ("2", 200), ("1.01", 101), ("1.15", 115), (1.25, 125)]
)
def test_the_balance_factor_is_haproxys_percentage(factor, percent):
    templar = Templar(loader=DataLoader(), variables={"router_session_balance_factor": factor})
    assert templar.template(trust_as_template(ROUTER_VARS["router_session_balance_percent"])) == percent
