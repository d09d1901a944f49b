"""Every shipped inventory through every phase's input check on the controller (no node is contacted), bad
input refused before anything runs on a node, --tags/--skip-tags honoured, and the README's `bin/kimi-plan`
invocation printing the plan the play writes.

site.yml runs here point every node at a closed loopback port: a node task that ran by mistake would show up as
UNREACHABLE against 127.0.0.1, never as a packet to the inventories' example addresses.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time

import pytest

from tests.ansible_run import REPO_ROOT, run_playbook

INVENTORIES = REPO_ROOT / "inventories"
# The lab's inventories need a running lab (lab-offline is an overlay on lab, with no nodes of its own).
SHIPPED = sorted(p.name for p in INVENTORIES.iterdir() if p.is_dir() and p.name not in ("lab", "lab-offline"))
INPUTS = REPO_ROOT / "playbooks" / "inputs.yml"
SITE = REPO_ROOT / "site.yml"
JUDGE = "Judge this host's inputs for those phases (on the controller)"
# Any node task fails at once (connection refused on loopback) instead of reaching an example address.
NOWHERE = {"ansible_host": "127.0.0.1", "ansible_port": 9}
VALIDATE = "Validate what the inventory and -e set for each phase's roles against the role's argument spec"
# The kimi role's own argument spec, checked when the role starts in every play (its values, the serve layout among
# them, are refused there first, whatever the phase).
KIMI_SPEC = "Validating arguments against arg spec 'main' - Cluster-wide defaults and their validation"
# What an operator's Vault file holds for the shipped inventories that have a router (greennode): stand-ins, as
# the input check judges only that they are set.
VAULT = {
    "vault_kimi_router_api_keys": ["a-client-key"],
    "vault_kimi_api_key": "a-backend-key",
    "vault_router_tls_certificate": "-----BEGIN CERTIFICATE-----",
    "vault_router_tls_key": "-----BEGIN PRIVATE KEY-----",
}


def messages(result) -> str:
    """Every failure message, loop items' included (a loop's own message only says an item failed)."""
    found = []
    for failure in result.failures:
        found.append(failure["msg"])
        found += [item.get("msg", "") for item in failure["result"].get("results", []) if item.get("failed")]
    return "\n".join(found)


def run_inputs(inventory: str, tmp_path, vault: bool = True, **extravars):
    """playbooks/inputs.yml on a shipped inventory, with an operator's Vault values (VAULT) unless vault=False."""
    extravars = {**(VAULT if vault else {}), **extravars}
    return run_playbook(
        INPUTS, INVENTORIES / inventory, extravars=extravars, envvars={"KIMI_REPORT_DIR": str(tmp_path)}, timeout=300
    )


@pytest.mark.parametrize("inventory", SHIPPED)
def test_every_shipped_inventory_passes_every_phases_input_check(inventory, tmp_path):
    result = run_inputs(inventory, tmp_path)
    assert result.rc == 0, result.failure_messages()
    assert not result.unreachable_hosts
    judged = next(iter(result.results_of(JUDGE).values()))
    assert judged["phases"] == ["preflight", "stack", "firewall", "parity", "checkpoint", "serve", "router", "verify"]
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["fits"], plan["reasons"]


def test_greennode_serves_through_its_router_and_refuses_to_run_without_its_vault(tmp_path):
    result = run_inputs("greennode", tmp_path, vault=False)
    assert result.rc != 0
    text = messages(result)
    for variable in ("kimi_router_api_keys", "router_tls_certificate", "router_tls_key"):
        assert variable in text, text
    # With its Vault, the API is served through the router only: kimi_api_public stays off.
    public = run_inputs("greennode", tmp_path, kimi_api_public=True)
    assert "kimi_api_public is true but the inventory has a router" in messages(public)


def test_the_shipped_inventories_are_the_production_ones():
    assert {"greennode", "h200-dp-ep", "rtx-pro-6000"} <= set(SHIPPED)


def test_a_missing_revision_is_refused_naming_variable_host_and_phase(tmp_path):
    result = run_inputs("greennode", tmp_path, kimi_checkpoint_revision="")
    assert result.rc != 0
    messages = {f["host"]: f["msg"] for f in result.failures}
    assert set(messages) == {"gn-h100-node1", "gn-h100-node2"}
    for host, message in messages.items():
        assert f"{host}: kimi_checkpoint_revision is not set (needed by the checkpoint phase)" in message
        assert "--skip-tags checkpoint" in message


def test_check_mode_judges_the_inputs_and_writes_no_plan(tmp_path):
    # drift's converge runs the kimi role under --check: the plan is made and judged, no report is written and
    # nothing counts as a change.
    result = run_playbook(
        INPUTS, INVENTORIES / "greennode", check=True, extravars=VAULT, envvars={"KIMI_REPORT_DIR": str(tmp_path)}
    )
    assert result.rc == 0, result.failure_messages()
    assert result.changed == 0
    saves = result.results_of("Save the plan as JSON on the controller (artifacts/plan.json)").values()
    writers = [save for save in saves if save and not save.get("skipped")]  # one writer per replica: its rank 0
    assert len(writers) == 1, list(saves)
    (saved,) = writers
    assert saved["written"] is False
    assert not (tmp_path / "plan.json").exists()


def test_a_bad_checkpoint_pin_is_named_by_the_one_variable_the_inventory_sets(tmp_path):
    # The shipped inventories pin the checkpoint with the kimi role's names, the ones the checkpoint role reads.
    cluster = (INVENTORIES / "greennode" / "group_vars" / "all" / "cluster.yml").read_text()
    assert re.search(r"^kimi_checkpoint_revision:", cluster, re.M)
    result = run_inputs("greennode", tmp_path, kimi_checkpoint_revision="main")
    assert result.rc != 0
    assert {f["task"] for f in result.failures} == {JUDGE}, result.failure_messages()
    assert "kimi_checkpoint_revision is not a 40-hex commit sha" in result.failures[0]["msg"]
    assert "(or " not in result.failures[0]["msg"]


def refused_by_site(tmp_path, **kwargs):
    extravars = {**NOWHERE, **VAULT, **kwargs.pop("extravars", {})}
    started = time.monotonic()
    result = run_playbook(
        SITE,
        INVENTORIES / "greennode",
        extravars=extravars,
        envvars={"KIMI_REPORT_DIR": str(tmp_path)},
        timeout=300,
        **kwargs,
    )
    return result, time.monotonic() - started


def test_site_refuses_bad_input_before_any_node_is_contacted(tmp_path):
    result, _ = refused_by_site(
        tmp_path, extravars={"kimi_checkpoint_revision": "main", "kimi_vllm_pip_pins": {"vllm": ">=0.23"}}
    )
    assert result.rc != 0
    assert not result.unreachable_hosts, "a node was contacted before the inputs were judged"
    tasks = {f["task"] for f in result.failures}
    assert tasks == {JUDGE}, result.failure_messages()
    message = result.failures[0]["msg"]
    assert "kimi_checkpoint_revision is not a 40-hex commit sha" in message
    assert "kimi_vllm_pip_pins vllm must be pinned to one exact version" in message
    assert not (tmp_path / "preflight.json").exists()


def test_a_type_error_in_a_later_phase_is_refused_in_the_first(tmp_path):
    # As typed on the command line: a string where the checkpoint role's spec wants an int.
    result, _ = refused_by_site(tmp_path, extravars={"checkpoint_margin_bytes": "ten gigabytes"})
    assert result.rc != 0 and not result.unreachable_hosts
    assert "argument 'checkpoint_margin_bytes' is of type str and we were unable to convert to int" in messages(result)
    assert {f["task"] for f in result.failures} == {VALIDATE}


def test_skipped_phases_are_not_judged(tmp_path):
    # With the checkpoint phase skipped its revision does not matter: the run gets past the inputs and stops
    # at the first node task (the closed loopback port).
    result, _ = refused_by_site(tmp_path, extravars={"kimi_checkpoint_revision": "main"}, skip_tags="checkpoint")
    assert JUDGE not in {f["task"] for f in result.failures}
    assert result.unreachable_hosts == ["gn-h100-node1", "gn-h100-node2"]
    result, _ = refused_by_site(tmp_path, extravars={"kimi_checkpoint_revision": "main"}, tags="serve")
    assert JUDGE not in {f["task"] for f in result.failures}
    result, _ = refused_by_site(tmp_path, extravars={"kimi_serve_layout": "k8s"}, tags="serve")
    assert {f["task"] for f in result.failures} == {KIMI_SPEC} and not result.unreachable_hosts
    assert "value of kimi_serve_layout must be one of: mp, ray, dp_ep, single, got: k8s" in messages(result)
    # A serve-phase role's own option is still validated in the run's first play when only the serve phase runs.
    result, _ = refused_by_site(tmp_path, extravars={"vllm_serve_health_timeout": "soon"}, tags="serve")
    assert {f["task"] for f in result.failures} == {VALIDATE} and not result.unreachable_hosts
    assert "argument 'vllm_serve_health_timeout' is of type str and we were unable to convert to int" in messages(
        result
    )


def test_an_inventory_with_a_retired_name_is_refused_naming_the_kimi_one(tmp_path):
    # The h200-dp-ep inventory once set vllm_serve_layout: dp_ep; a copy still setting it would be ignored without
    # a word (vllm_serve reads kimi_serve_layout), so the input check refuses it before any node is contacted.
    result = run_inputs("h200-dp-ep", tmp_path, vllm_serve_layout="dp_ep", nvidia_driver_install=True)
    assert result.rc != 0 and not result.unreachable_hosts
    text = messages(result)
    assert "vllm_serve_layout is no longer read: the value is the kimi role's kimi_serve_layout" in text, text
    assert "set kimi_serve_layout instead (same value)" in text
    assert "nvidia_driver_install is no longer read: the value is the kimi role's kimi_nvidia_driver_install" in text
    # So is the checkpoint role's old name for the pin the shipped inventories once set.
    result = run_inputs("greennode", tmp_path, checkpoint_revision="74797c9c62378b951a1f6fcf5c4631024e9b8bef")
    assert result.rc != 0 and not result.unreachable_hosts
    text = messages(result)
    assert "checkpoint_revision is no longer read: the value is the kimi role's kimi_checkpoint_revision" in text, text


def test_an_inventory_with_a_retired_key_or_address_is_refused_by_name_without_its_value(tmp_path):
    # A retired key name reaches the check by name only (tasks/inputs.yml): refused, the secret never printed.
    result = run_inputs("h200-dp-ep", tmp_path, vllm_serve_api_key="old-secret-value", vllm_serve_host_ip="10.20.0.99")
    assert result.rc != 0 and not result.unreachable_hosts
    text = messages(result)
    assert "vllm_serve_api_key is no longer read: the value is the kimi role's kimi_api_key" in text, text
    assert "vllm_serve_host_ip is no longer read: the value is the kimi role's derived kimi_announced_ip" in text
    assert "set kimi_host_ip instead" in text
    assert "old-secret-value" not in json.dumps(result.events)


def readme_plan_command() -> list[str]:
    text = (REPO_ROOT / "README.md").read_text()
    match = re.search(r"`(bin/kimi-plan [^`]+)`", text)
    assert match, "README.md shows no bin/kimi-plan invocation"
    return shlex.split(match.group(1).replace("\n", " "))


def test_the_readmes_plan_command_prints_the_plan_the_play_writes(tmp_path):
    result = run_inputs("greennode", tmp_path)
    assert result.rc == 0, result.failure_messages()
    played = json.loads((tmp_path / "plan.json").read_text())
    command = readme_plan_command()
    printed = subprocess.run(
        [sys.executable, str(REPO_ROOT / command[0]), *command[1:], "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(printed.stdout) == played
