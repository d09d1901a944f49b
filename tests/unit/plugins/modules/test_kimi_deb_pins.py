"""kimi_deb_pins as Ansible runs it, against this host's real dpkg: the preferences file written once, and what a
pinned set still needs read from dpkg-query in the same module run."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.unit.ansible_adhoc import run_module

pytestmark = pytest.mark.skipif(not shutil.which("dpkg-query"), reason="needs dpkg-query (Debian or Ubuntu)")
MODULE = "kimi.k2.kimi_deb_pins"


def installed_version(package: str) -> str:
    return subprocess.run(
        ["dpkg-query", "--show", "--showformat=${Version}", package], capture_output=True, text=True, check=True
    ).stdout


def test_a_package_at_its_pin_is_left_to_hold_and_an_unknown_one_to_install(tmp_path):
    pref = tmp_path / "kimi-test.pref"
    bash = installed_version("bash")
    packages = {"bash": bash, "kimi-no-such-package": "1.0-1"}
    args = {"path": str(pref), "content": "Package: bash\nPin: version 1\n", "packages": packages}
    ok, result = run_module(tmp_path, MODULE, args)
    assert ok, result
    assert result["changed"] is True and pref.read_text() == "Package: bash\nPin: version 1\n"
    assert result["install"] == ["kimi-no-such-package=1.0-1"]
    # bash is at its pin; whether it is held depends on this host, the unknown package always needs its hold.
    assert "kimi-no-such-package" in result["hold"]

    ok, again = run_module(tmp_path, MODULE, args)
    assert ok and again["changed"] is False and again["install"] == result["install"]


def test_check_mode_writes_no_preferences_but_still_reads_dpkg(tmp_path):
    pref = tmp_path / "kimi-check.pref"
    args = {"path": str(pref), "content": "x\n", "packages": {"bash": "0.0-not-this"}}
    ok, result = run_module(tmp_path, MODULE, args, check=True)
    assert ok and result["changed"] is True and not pref.exists()
    assert result["install"] == ["bash=0.0-not-this"] and result["hold"] == ["bash"]


def test_an_empty_set_is_refused_naming_the_file(tmp_path):
    ok, result = run_module(tmp_path, MODULE, {"path": str(tmp_path / "p.pref"), "content": "", "packages": {}})
    assert not ok and "packages is empty" in result["msg"] and "p.pref" in result["msg"]
