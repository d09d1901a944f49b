"""playbooks/offline_mirror.yml on this host: bad inputs are refused by name, with the host, before anything
changes; a directory that holds no bundle is refused before anything is copied; in check mode a bundle on the
mirror host is verified where it is (a tampered one refused, naming the file) and nothing is written; and an
inventory without a kimi_offline_mirror host runs nothing at all (site.yml imports the playbook first).

The mirror host is this machine over a local connection; nothing here gets as far as installing or writing (the
role's whole run needs a Debian host of its own: molecule/offline_mirror). The serving node in the inventory is a
closed loopback port: a task that reached it by mistake would show as UNREACHABLE.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import yaml

from tests.ansible_run import REPO_ROOT, run_playbook
from tests.local.test_kimi_bundle_verify_module import WHEEL, build_bundle, make_key, sign

# Tier 2 (tests/tiers.py, group local-bundle): make test-all, and CI while its time allows, or when its code changed.
pytestmark = pytest.mark.tier2("local-bundle")

PLAYBOOK = REPO_ROOT / "playbooks" / "offline_mirror.yml"
CHECK = "Refuse bad inputs before anything changes (on the controller)"
FINGERPRINT = "2EF5 B607 163A 85FE C8C8  F7BD 01E2 C050 E168 3E6D"


def inventory(tmp_path: Path, mirror: bool = True, **mirror_vars: object) -> Path:
    hosts: dict = {"kimi_nodes": {"hosts": {"node1": {"ansible_host": "127.0.0.1", "ansible_port": 9}}}}
    if mirror:
        local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
        # The kimi role's cluster address of a host that is no node: kimi_host_ip (this host has no ib0).
        hosts["kimi_offline_mirror"] = {"hosts": {"mirror1": {**local, "kimi_host_ip": "127.0.0.1", **mirror_vars}}}
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(hosts))
    return path


def refused(result) -> tuple[str, str]:
    assert result.rc != 0
    assert result.changed == 0, "something changed before the refusal"
    assert not result.unreachable_hosts
    (failure,) = result.failures
    assert failure["host"] == "mirror1"
    return failure["task"], failure["msg"]


def test_missing_inputs_are_refused_naming_each_variable_and_the_host(tmp_path):
    task, message = refused(run_playbook(PLAYBOOK, inventory(tmp_path), timeout=300))
    assert task == CHECK
    assert message.startswith("2 inputs refused before any node was changed (phases checked: offline_mirror):")
    assert "- mirror1: offline_mirror_bundle_path and offline_mirror_bundle_src are both empty (needed by the " in (
        message
    )
    assert "- mirror1: offline_mirror_fingerprint is not the signing key's fingerprint, 40 hex digits (got '')" in (
        message
    )


def test_both_bundle_sources_and_a_key_id_are_refused(tmp_path):
    hosts = inventory(
        tmp_path,
        offline_mirror_bundle_path="/media/bundle",
        offline_mirror_bundle_src=str(tmp_path),
        offline_mirror_fingerprint="01E2C050E1683E6D",
    )
    task, message = refused(run_playbook(PLAYBOOK, hosts, timeout=300))
    assert task == CHECK
    assert f"mirror1: offline_mirror_bundle_path (/media/bundle) and offline_mirror_bundle_src ({tmp_path}) are " in (
        message
    )
    assert "offline_mirror_fingerprint is not the signing key's fingerprint, 40 hex digits (got '01E2C" in message


def test_a_port_given_with_e_is_judged_as_a_number(tmp_path):
    hosts = inventory(tmp_path, offline_mirror_bundle_path="/media/bundle", offline_mirror_fingerprint=FINGERPRINT)
    task, message = refused(run_playbook(PLAYBOOK, hosts, extravars={"kimi_offline_mirror_port": "70000"}, timeout=300))
    assert task == CHECK
    assert "mirror1: kimi_offline_mirror_port must be a port number 1-65535 (got '70000')" in message


def test_a_directory_without_manifest_is_refused_before_anything_is_copied(tmp_path):
    empty = tmp_path / "not-a-bundle"
    empty.mkdir()
    hosts = inventory(tmp_path, offline_mirror_bundle_path=str(empty), offline_mirror_fingerprint=FINGERPRINT)
    task, message = refused(run_playbook(PLAYBOOK, hosts, timeout=300))
    assert task == "Refuse a directory that holds no bundle"
    assert message == (
        f"{empty} (offline_mirror_bundle_path, on mirror1) holds no kimi-bundle.json: not a bundle "
        "(bin/kimi-bundle build -o DIR writes one)."
    )


def test_without_a_mirror_host_the_play_runs_nothing(tmp_path):
    result = run_playbook(PLAYBOOK, inventory(tmp_path, mirror=False), timeout=120)
    assert result.rc == 0, result.failure_messages()
    tasks = [e for e in result.events if e.get("event") == "runner_on_start"]
    assert tasks == []


@pytest.fixture(scope="module")
def signing_key(tmp_path_factory):
    if shutil.which("gpg") is None or shutil.which("gpgv") is None:
        pytest.skip("no gpg or gpgv (apt-get install gnupg)")
    from kimi_tools import kimi_bundle_apt as kba

    home = tmp_path_factory.mktemp("gnupg")
    try:
        yield make_key(home, "site")
    finally:
        kba.stop_gpg_agent(home)


def test_check_mode_verifies_a_bundle_where_it_is_and_writes_nothing(tmp_path, signing_key):
    bundle = build_bundle(tmp_path / "bundle", signing_key)
    sign(signing_key, bundle)
    data = bytearray((bundle / WHEEL).read_bytes())
    data[3] ^= 1
    (bundle / WHEEL).write_bytes(bytes(data))
    root = tmp_path / "srv"
    hosts = inventory(
        tmp_path,
        offline_mirror_bundle_path=str(bundle),
        offline_mirror_fingerprint=signing_key.key_id,
        offline_mirror_root=str(root),
    )
    result = run_playbook(PLAYBOOK, hosts, check=True, timeout=300)
    assert result.rc != 0
    # The module's failure (rescued), then the role's own words.
    verified, failure = result.failures
    assert verified["task"].startswith("Verify the new release")
    assert failure["task"] == "Say why the bundle is refused"
    assert f"{bundle}: 1 file differs from the signed manifest: {WHEEL}: sha256 " in failure["msg"]
    assert "The mirror serves no bundle yet." in failure["msg"]
    assert not root.exists()
