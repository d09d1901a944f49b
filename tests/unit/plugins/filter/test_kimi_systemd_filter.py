"""`kimi.k2.systemctl_show` (plugins/filter/kimi_systemd.py): one unit's properties, as the serve and verify
roles read them."""

from __future__ import annotations

import importlib.util

from tests.paths import REPO_ROOT

spec = importlib.util.spec_from_file_location(
    "kimi_filter_systemd", REPO_ROOT / "plugins" / "filter" / "kimi_systemd.py"
)
systemd = importlib.util.module_from_spec(spec)
spec.loader.exec_module(systemd)


def test_the_file_offers_the_filter():
    assert set(systemd.FilterModule().filters()) == {"systemctl_show"}


def test_the_verify_roles_read_of_its_unit():
    state = systemd.systemctl_show("MainPID=4242\nInvocationID=0a1b2c\nActiveState=active\n")
    assert state == {"MainPID": "4242", "InvocationID": "0a1b2c", "ActiveState": "active"}


def test_a_unit_that_never_started_and_a_failed_read():
    assert systemd.systemctl_show("ActiveState=inactive\nExecMainStartTimestamp=\n") == {
        "ActiveState": "inactive",
        "ExecMainStartTimestamp": "",
    }
    # The serve role reads with failed_when: false; a failed systemctl printed nothing.
    assert systemd.systemctl_show("") == {} and systemd.systemctl_show(None) == {}
