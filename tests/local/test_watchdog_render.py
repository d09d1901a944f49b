"""The serve phase's watchdog files, rendered for the lab's two nodes into a temporary root (nothing started):
each node's config says its role, unit and how it reaches rank 0 and loads as the watchdog's Config; the service
is a oneshot without Restart=, the timer fires every interval with 1 s accuracy; the script on the node is the
collection's module_utils file and runs under the node's python3 with nothing else (a fake systemctl on PATH);
the maintenance switch follows vllm_serve_watchdog_paused; vllm_serve_watchdog false removes everything; a second
run changes nothing; --check writes nothing.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ansible_run import REPO_ROOT, run_playbook
from tests.node_programs import watchdog

# Tier 2 (tests/tiers.py, group local-serve): make test-all, and CI while its time allows, or when its code changed.
pytestmark = pytest.mark.tier2("local-serve")

SERVE = REPO_ROOT / "playbooks" / "serve.yml"
INVENTORY = REPO_ROOT / "tests" / "fixtures" / "serve" / "inventories" / "lab-mp"
UNIT_DIR = "etc/systemd/system"
LIB_DIR = "usr/local/lib/kimi-watchdog"
NODE_PYTHON = Path("/usr/bin/python3")


def render_vars(root: Path, **extra) -> dict:
    return {
        "ansible_connection": "local",
        "ansible_become": False,
        "ansible_python_interpreter": sys.executable,
        "kimi_host_ip": "{{ ansible_host }}",
        "kimi_report_dir": str(root / "reports"),
        "vllm_serve_manage_services": False,
        "vllm_serve_systemd_version": 252,
        "vllm_serve_destdir": str(root) + "/{{ inventory_hostname }}",
        "kimi_api_key": "lab-secret",
        **extra,
    }


def serve(root: Path, *, check: bool = False, **extra):
    outcome = run_playbook(SERVE, INVENTORY, extravars=render_vars(root, **extra), check=check, diff=check, timeout=600)
    assert outcome.rc == 0, outcome.failure_messages()
    return outcome


def files_under(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> tuple[Path, int]:
    root = tmp_path_factory.mktemp("watchdog")
    serve(root)
    return root, serve(root).changed


def test_a_second_run_changes_nothing(rendered):
    _, changed_again = rendered
    assert changed_again == 0


def test_rank_0_judges_its_own_api_with_the_key_file_and_the_timings(rendered):
    root, _ = rendered
    config = json.loads((root / "node1/etc/kimi/watchdog.json").read_text())
    assert watchdog().config_from_mapping(config).role == "rank0"
    assert config["unit"] == "kimi-vllm.service"
    # The API binds to the cluster address (kimi_api_host), so rank 0 asks itself there.
    assert config["health_url"] == "http://198.18.0.11:8000/health"
    assert config["metrics_url"] == "http://198.18.0.11:8000/metrics"
    assert config["probe_url"] == "http://198.18.0.11:8000/v1/completions"
    assert config["served_model_name"] == "kimi-k2"
    assert (config["api_key_env"], config["api_key_env_file"]) == ("VLLM_API_KEY", "/etc/kimi/vllm-secrets.env")
    assert "lab-secret" not in json.dumps(config)
    assert config["load_timeout_s"] == 900 and config["stall_checks"] == 3 and config["max_restarts"] == 5
    assert config["textfile_dir"] == "/var/lib/prometheus/node-exporter"
    assert config["maintenance_file"] == "/etc/kimi/maintenance"
    assert config["marker_path"].endswith("/models/lab-mini/.kimi-checkpoint.json")
    # The hold outlives the play's two stops and its /health wait (120 s, 120 s, 1800 s), plus a margin.
    assert config["hold_max_age_s"] == 2 * 120 + 1800 + 300


def test_the_headless_rank_reaches_rank_0_on_its_announced_address(rendered):
    root, _ = rendered
    config = json.loads((root / "node2/etc/kimi/watchdog.json").read_text())
    assert watchdog().config_from_mapping(config).role == "headless"
    assert config["unit"] == "kimi-vllm-headless.service"
    assert config["health_url"] == "http://198.18.0.11:8000/health"
    assert config["rendezvous"] == "198.18.0.11:29501"
    assert "probe_url" not in config and "api_key_env_file" not in config


def test_the_service_is_a_oneshot_and_only_rank_0_loads_the_key(rendered):
    root, _ = rendered
    for node in ("node1", "node2"):
        service = (root / node / UNIT_DIR / "kimi-vllm-watchdog.service").read_text()
        assert "Type=oneshot" in service
        assert "Restart=" not in service.replace("# No Restart=", "")
        assert (
            "ExecStart=/usr/bin/python3 -B -E -s /usr/local/lib/kimi-watchdog/kimi_watchdog.py "
            "--config /etc/kimi/watchdog.json"
        ) in service
        assert ("EnvironmentFile=-/etc/kimi/vllm-secrets.env" in service) == (node == "node1")
        assert "StateDirectory=kimi-watchdog" in service


def test_the_timer_checks_every_interval_without_overlap(rendered):
    root, _ = rendered
    timer = (root / "node1" / UNIT_DIR / "kimi-vllm-watchdog.timer").read_text()
    for line in ("OnActiveSec=15", "OnUnitInactiveSec=15", "AccuracySec=1s", "WantedBy=timers.target"):
        assert line in timer.splitlines()


def test_the_script_on_the_node_is_the_roles_file_beside_the_collections_module_utils(rendered):
    root, _ = rendered
    assert sorted(path.name for path in (root / "node2" / LIB_DIR).iterdir()) == [
        "kimi_evidence.py",
        "kimi_rendezvous.py",
        "kimi_start_phases.py",
        "kimi_systemd.py",
        "kimi_watchdog.py",
    ]
    for name in ("kimi_watchdog.py", "kimi_evidence.py"):
        shipped = (root / "node2" / LIB_DIR / name).read_text()
        assert shipped == (REPO_ROOT / "roles" / "vllm_serve" / "files" / name).read_text()
    for name in ("kimi_systemd.py", "kimi_rendezvous.py", "kimi_start_phases.py"):
        shipped = (root / "node2" / LIB_DIR / name).read_text()
        assert shipped == (REPO_ROOT / "plugins" / "module_utils" / name).read_text()


def test_no_maintenance_switch_by_default(rendered):
    root, _ = rendered
    assert not (root / "node1/etc/kimi/maintenance").exists()


def run_on_node_python(script: Path, tmp_path: Path, commands: dict[str, str], *args: str):
    """The copied script under the node's interpreter alone, with `commands` (name: sh body) first on PATH."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    for name, body in commands.items():
        (fake_bin / name).write_text(f"#!/bin/sh\n{body}\n")
        (fake_bin / name).chmod(0o755)
    return subprocess.run(
        [str(NODE_PYTHON), "-B", "-E", "-s", str(script), *args],
        capture_output=True,
        text=True,
        env={"PATH": f"{fake_bin}:/usr/bin:/bin"},
        check=False,
        timeout=60,
    )


@pytest.mark.skipif(not NODE_PYTHON.exists(), reason="no /usr/bin/python3 (the node's interpreter)")
def test_the_copied_script_runs_under_the_nodes_python_alone(rendered, tmp_path):
    root, _ = rendered
    systemctl = "printf 'ActiveState=inactive\\nInvocationID=\\nExecMainStartTimestamp=\\n'"
    script, config = root / "node2" / LIB_DIR / "kimi_watchdog.py", root / "node2/etc/kimi/watchdog.json"
    done = run_on_node_python(script, tmp_path, {"systemctl": systemctl}, "--config", str(config), "--dry-run")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "(dry run) kimi-vllm-headless.service: stopped: kimi-vllm-headless.service is inactive: "
        "stopped by an operator, left stopped"
    )


@pytest.mark.skipif(not NODE_PYTHON.exists(), reason="no /usr/bin/python3 (the node's interpreter)")
def test_the_copied_script_takes_evidence_by_hand_under_the_nodes_python(rendered, tmp_path):
    """--evidence end to end with the node's interpreter and real commands run in parallel against the deadline (fake
    systemctl, journalctl and ss answer; the unit's cgroup is not on this host, so there are no stacks: the lab's
    heal test reads real ones)."""
    root, _ = rendered
    commands = {
        "systemctl": 'case "$*" in *ControlGroup*) echo /system.slice/none.service;; '
        "*) printf 'ActiveState=active\\nInvocationID=abc\\nExecMainStartTimestamp=\\n';; esac",
        "journalctl": 'echo "journal of $*"',
        "ss": "echo 'ESTAB 0 0 198.18.0.12:1 198.18.0.11:29501'",
    }
    config = json.loads((root / "node2/etc/kimi/watchdog.json").read_text())
    config.update(evidence_dir=str(tmp_path / "evidence"), evidence_timeout_s=5)
    (tmp_path / "watchdog.json").write_text(json.dumps(config))
    script = root / "node2" / LIB_DIR / "kimi_watchdog.py"
    done = run_on_node_python(script, tmp_path, commands, "--config", str(tmp_path / "watchdog.json"), "--evidence")
    assert done.returncode == 0, done.stderr
    [incident] = (tmp_path / "evidence").iterdir()
    assert done.stdout.splitlines()[0].startswith(f"{incident} (")
    assert incident.name.endswith("-manual")
    journal = (incident / "journal-kimi-vllm-headless.service.txt").read_text()
    assert journal == "journal of -u kimi-vllm-headless.service -n 300 --no-pager -o short-iso-precise\n"
    summary = json.loads((incident / "incident.json").read_text())
    assert summary["unit"] == "kimi-vllm-headless.service" and summary["invocation_id"] == "abc"
    # No such cgroup nor py-spy on this host: no processes and no stacks, both said.
    assert summary["problems"][0].startswith("cannot read ") and "py-spy is missing" in summary["problems"][1]


def test_every_watchdog_unit_passes_systemd_analyze_verify(rendered, tmp_path):
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed (apt-get install -y systemd)")
    root, _ = rendered
    for name in ("kimi-vllm-watchdog.service", "kimi-vllm-watchdog.timer"):
        (tmp_path / name).write_text((root / "node1" / UNIT_DIR / name).read_text())
    # verify checks that ExecStart's script exists where the unit says it is: it does not on this host.
    service = tmp_path / "kimi-vllm-watchdog.service"
    service.write_text(
        service.read_text().replace("/usr/local/lib/kimi-watchdog/", str(root / "node1" / LIB_DIR) + "/")
    )
    for name in ("kimi-vllm-watchdog.service", "kimi-vllm-watchdog.timer"):
        path = tmp_path / name
        done = subprocess.run(
            ["systemd-analyze", "verify", "--man=no", str(path)], capture_output=True, text=True, check=False
        )
        complaints = [line for line in done.stderr.splitlines() if str(path) in line or "Unknown" in line]
        assert done.returncode == 0 and not complaints, f"{name}: {done.stderr}"


def test_the_maintenance_switch_follows_the_variable_and_turning_the_watchdog_off_removes_it_all(rendered, tmp_path):
    # One converged root, two switches (as -e gives them: strings): three runs instead of five.
    root, _ = rendered
    shutil.copytree(root, tmp_path, dirs_exist_ok=True, symlinks=True)
    before = files_under(tmp_path)
    assert "node2/etc/systemd/system/kimi-vllm-watchdog.timer" in before
    serve(tmp_path, vllm_serve_watchdog_paused="true")
    for node in ("node1", "node2"):
        assert "paused" in (tmp_path / node / "etc/kimi/maintenance").read_text()
    serve(tmp_path, vllm_serve_watchdog="false")
    after = files_under(tmp_path)
    assert not [name for name in after if "watchdog" in name or name.endswith("maintenance")], sorted(after)
    assert {name for name in before if "watchdog" not in name} == set(after)
    assert serve(tmp_path, vllm_serve_watchdog="false").changed == 0


def test_check_mode_with_diff_writes_nothing(tmp_path):
    outcome = serve(tmp_path, check=True)
    assert outcome.changed > 0
    assert not [path for path in tmp_path.rglob("*") if path.is_file()]
