"""kimi_nftables as Ansible runs it, against a real kernel ruleset: each test gets a throwaway network namespace
(tests/netns.py) and runs `ansible localhost -m kimi.k2.kimi_nftables` inside it, so this host's own ruleset is never
read or changed.

The first run loads the firewall role's rules and records them; the second changes nothing; a rule deleted by
hand is a change in check mode (named, with a --diff that shows it coming back) and check mode changes nothing;
a real run puts it back; a new rules file is loaded; another table of the host is left exactly as it was; a
boot (Debian's /etc/nftables.conf with the role's include) brings back the very table recorded; a file that
would flush every table is refused.
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

from tests import netns
from tests.paths import FIXTURES, REPO_ROOT
from tests.unit.ansible_adhoc import ansible_executable

NFT = FIXTURES / "firewall" / "nft"
TABLE = ("inet", "kimi")
GROUP_ACCEPT = "ip saddr @replica_peers accept"
# Debian 12's /etc/nftables.conf as the nftables package ships it.
DEBIAN_NFTABLES_CONF = """#!/usr/sbin/nft -f

flush ruleset

table inet filter {
\tchain input {
\t\ttype filter hook input priority filter;
\t}
\tchain forward {
\t\ttype filter hook forward priority filter;
\t}
\tchain output {
\t\ttype filter hook output priority filter;
\t}
}
"""

UNAVAILABLE = netns.unavailable()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=str(UNAVAILABLE))


@pytest.fixture
def namespace():
    with netns.Netns() as held:
        yield held


@pytest.fixture
def paths(tmp_path) -> dict[str, Path]:
    rules = tmp_path / "nftables.d" / "kimi.nft"
    rules.parent.mkdir()
    shutil.copy(NFT / "node1.nft", rules)
    return {"path": rules, "state_path": tmp_path / "state" / "kimi-table.json"}


def run(namespace: netns.Netns, tmp_path: Path, args: dict, *, check: bool = False, diff: bool = False):
    """(succeeded, result, printed diff) of the module run inside the namespace."""
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"),
        "ANSIBLE_HOME": str(tmp_path / "ansible-home"),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-local"),
        "ANSIBLE_REMOTE_TEMP": str(tmp_path / "ansible-remote"),
        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.minimal",
        "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",
        "ANSIBLE_NOCOLOR": "1",
    }
    arguments = {k: str(v) for k, v in args.items()}
    command = [ansible_executable(), "all", "-i", "localhost,", "-c", "local", "-m", "kimi.k2.kimi_nftables"]
    command += ["-a", json.dumps(arguments), "-e", f"ansible_python_interpreter={sys.executable}"]
    command += ["--check"] * check + ["--diff"] * diff
    done = subprocess.run(
        namespace.argv(*command), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    marker = done.stdout.find("localhost | ")
    assert marker >= 0, done.stdout + done.stderr
    result = json.loads(done.stdout[done.stdout.index("=> ", marker) + 3 :])
    return done.returncode == 0, result, done.stdout[:marker]


def handle_of(namespace: netns.Netns, rule: str) -> str:
    listing = namespace.nft("-a", "list", "chain", *TABLE, "input").stdout
    (line,) = [line for line in listing.splitlines() if line.strip().startswith(rule + " # handle")]
    return line.split()[-1]


def live_rules(namespace: netns.Netns) -> list[str]:
    listing = namespace.nft("list", "chain", *TABLE, "input").stdout.splitlines()
    return [line.strip() for line in listing if line.startswith("\t\t") and "type filter" not in line]


def test_first_run_loads_and_records_and_the_second_changes_nothing(namespace, paths, tmp_path):
    ok, first, _ = run(namespace, tmp_path, paths)
    assert ok, first
    assert first["changed"] is True
    assert first["differences"] == ["table absent", "rules file changed (no record of an earlier apply)"]
    assert GROUP_ACCEPT in live_rules(namespace)
    record = json.loads(paths["state_path"].read_text())
    assert record["rules_sha256"] == first["rules_sha256"] and record["table"] == "inet kimi"
    assert oct(paths["state_path"].stat().st_mode & 0o777) == "0o600"
    assert oct(paths["state_path"].parent.stat().st_mode & 0o777) == "0o700"

    ok, second, _ = run(namespace, tmp_path, paths)
    assert ok and second["changed"] is False and second["differences"] == []
    assert second["rules"] == first["rules"]
    assert f"{GROUP_ACCEPT} (chain input)" in second["rules"]


def test_a_rule_deleted_by_hand_is_a_change_in_check_mode_and_a_real_run_puts_it_back(namespace, paths, tmp_path):
    assert run(namespace, tmp_path, paths)[0]
    recorded = paths["state_path"].read_bytes()
    namespace.nft("delete", "rule", *TABLE, "input", "handle", handle_of(namespace, GROUP_ACCEPT))

    ok, checked, diff = run(namespace, tmp_path, paths, check=True, diff=True)
    assert ok, checked
    assert checked["changed"] is True
    assert checked["differences"] == [f"rule missing: {GROUP_ACCEPT} (chain input)"]
    assert f"+    {GROUP_ACCEPT}" in diff.splitlines()
    # Check mode loaded nothing and recorded nothing.
    assert GROUP_ACCEPT not in live_rules(namespace)
    assert paths["state_path"].read_bytes() == recorded

    ok, fixed, _ = run(namespace, tmp_path, paths)
    assert ok and fixed["changed"] is True
    assert live_rules(namespace)[6] == GROUP_ACCEPT
    assert run(namespace, tmp_path, paths, check=True)[1]["changed"] is False


def test_a_rule_added_by_hand_is_named_and_removed(namespace, paths, tmp_path):
    assert run(namespace, tmp_path, paths)[0]
    namespace.nft("add", "rule", *TABLE, "input", "tcp", "dport", "8000", "accept")
    ok, checked, _ = run(namespace, tmp_path, paths, check=True)
    assert ok and checked["differences"] == ["rule added by hand: tcp dport 8000 accept (chain input)"]
    assert run(namespace, tmp_path, paths)[1]["changed"] is True
    assert "tcp dport 8000 accept" not in live_rules(namespace)


def test_a_new_rules_file_is_loaded_and_check_mode_shows_the_file(namespace, paths, tmp_path):
    assert run(namespace, tmp_path, paths)[0]
    paths["path"].write_text(paths["path"].read_text().replace("10.99.0.12 comment", "10.99.0.42 comment"))
    ok, checked, diff = run(namespace, tmp_path, paths, check=True, diff=True)
    assert ok and checked["differences"] == ["rules file changed"]
    assert "(not loaded in check mode)" in diff and "10.99.0.42" in diff
    ok, loaded, _ = run(namespace, tmp_path, paths)
    assert ok and loaded["changed"] is True
    assert "10.99.0.42" in namespace.nft("list", "set", *TABLE, "replica_peers").stdout
    assert run(namespace, tmp_path, paths)[1]["changed"] is False


def test_another_table_of_the_host_is_left_as_it_was(namespace, paths, tmp_path):
    operator = "table ip filter {\n\tchain input {\n\t\ttype filter hook input priority filter; policy accept;\n"
    operator += "\t\ttcp dport 2222 drop\n\t}\n}\n"
    (tmp_path / "operator.nft").write_text(operator)
    namespace.nft("-f", str(tmp_path / "operator.nft"))
    before = namespace.nft("list", "table", "ip", "filter").stdout
    assert run(namespace, tmp_path, paths)[0]
    namespace.nft("delete", "rule", *TABLE, "input", "handle", handle_of(namespace, GROUP_ACCEPT))
    assert run(namespace, tmp_path, paths)[1]["changed"] is True
    assert namespace.nft("list", "table", "ip", "filter").stdout == before
    assert namespace.nft("list", "tables").stdout.split("\n")[:2] == ["table ip filter", "table inet kimi"]


def test_a_boot_brings_back_the_recorded_table(namespace, paths, tmp_path):
    """What nftables.service runs at boot: Debian's nftables.conf, with the block the role adds at its end."""
    assert run(namespace, tmp_path, paths)[0]
    tasks = yaml.safe_load((REPO_ROOT / "roles" / "firewall" / "tasks" / "main.yml").read_text())
    (block,) = [t["ansible.builtin.blockinfile"]["block"] for t in tasks if "ansible.builtin.blockinfile" in t]
    conf = tmp_path / "nftables.conf"
    conf.write_text(DEBIAN_NFTABLES_CONF + block.replace("{{ firewall_rules_dir }}", str(paths["path"].parent)))
    namespace.nft("-c", "-f", str(conf))
    namespace.nft("flush", "ruleset")  # the machine went down
    namespace.nft("-f", str(conf))
    ok, result, _ = run(namespace, tmp_path, paths, check=True)
    assert ok and result["changed"] is False, result["differences"]
    # Loading the boot configuration again (nftables.service reloaded) gives the same table, not a second one.
    namespace.nft("-f", str(conf))
    assert run(namespace, tmp_path, paths, check=True)[1]["changed"] is False


def test_a_file_that_would_flush_every_table_is_refused(namespace, paths, tmp_path):
    paths["path"].write_text("flush ruleset\n" + paths["path"].read_text())
    ok, result, _ = run(namespace, tmp_path, paths)
    assert not ok
    assert result["msg"].endswith("has 'flush ruleset': loading it would empty every table of the host")
    assert namespace.nft("list", "tables").stdout == ""


def test_check_mode_before_the_file_exists_and_a_real_run_without_it(namespace, paths, tmp_path):
    missing = {**paths, "path": tmp_path / "absent.nft"}
    ok, checked, _ = run(namespace, tmp_path, missing, check=True)
    assert ok and checked["changed"] is True
    assert checked["differences"] == ["table absent", f"rules file {missing['path']} not written yet"]
    ok, failed, _ = run(namespace, tmp_path, missing)
    assert not ok and failed["msg"] == f"the rules file {missing['path']} does not exist"


def test_a_rules_file_nft_refuses_fails_naming_the_error(namespace, paths, tmp_path):
    paths["path"].write_text(paths["path"].read_text().replace("reject with tcp reset", "reject with nonsense", 1))
    ok, result, _ = run(namespace, tmp_path, paths)
    assert not ok
    assert result["msg"].startswith(f"nft -f {paths['path']} failed (exit 1): ")
    assert result["differences"] == ["table absent", "rules file changed (no record of an earlier apply)"]
    assert not paths["state_path"].exists()
