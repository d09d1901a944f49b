"""playbooks/nccl_tests.yml on this host (local connection, the greennode inventory's two nodes both local).

In check mode: the mpirun command is rendered and shown for 2 nodes x 8 GPUs, the build and the run are skipped
with their reasons, nothing is written. For real, with a stand-in torchrun that prints a recorded output
(tests/fixtures/nccl_tests/) on node rank 0: the run, the verdict on the controller and both reports, and a
socket fallback failing the play with the interface named. No GPU, package or network is needed.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.ansible_run import REPO_ROOT, run_playbook

# Tier 2 (tests/tiers.py, group local-serve): make test-all, and CI while its time allows, or when its code changed.
pytestmark = pytest.mark.tier2("local-serve")

PLAYBOOK = REPO_ROOT / "playbooks" / "nccl_tests.yml"
INVENTORY = REPO_ROOT / "inventories" / "greennode"
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "nccl_tests"


def local_vars(tmp_path: Path) -> dict:
    return {
        "ansible_connection": "local",
        "ansible_become": False,
        "ansible_python_interpreter": sys.executable,
        "kimi_host_ip": "{{ ansible_host }}",
        "kimi_report_dir": str(tmp_path / "reports"),
        "nccl_tests_manage_packages": False,
    }


def messages(result, task: str) -> list:
    return [res.get("msg") for res in result.results_of(task).values()]


def test_check_mode_renders_the_command_and_skips_build_and_run(tmp_path):
    result = run_playbook(PLAYBOOK, INVENTORY, extravars=local_vars(tmp_path), check=True, timeout=600)
    assert result.rc == 0, result.failure_messages()
    assert result.changed == 0
    (shown,) = messages(result, "Show the command")
    assert shown[0] == "16 processes (16 GPUs), as root:"
    line = shown[1]
    assert line.startswith("gn-h100-node1: timeout --kill-after=30 1800 /usr/bin/mpirun --allow-run-as-root -np 16")
    assert "-H 10.20.0.11:8,10.20.0.12:8" in line
    assert "--mca btl_tcp_if_include ib0 --mca oob_tcp_if_include ib0" in line
    assert "-x NCCL_DEBUG=INFO -x NCCL_DEBUG_SUBSYS=INIT,NET" in line
    assert line.endswith(
        "build-nccl2.30.7-1+cuda13.3/all_reduce_perf -b 1M -e 4G -f 2 -g 1 -n 20 -w 5 -c 1"
        " -J /var/lib/kimi-nccl-tests/all_reduce_perf.json"
    )
    built = messages(result, "Check mode - nothing is downloaded or built")
    assert len(built) == 2 and all(
        m.startswith("Check mode: nccl-tests 2.19.6 is not downloaded or built") for m in built
    )
    assert "make -j8 MPI=1" in built[0]
    (skipped,) = messages(result, "Check mode - the test is not run")
    assert skipped.startswith("Check mode: nccl-tests is not run")
    assert not (tmp_path / "reports").exists()


def fake_torchrun(tmp_path: Path, recorded: str) -> Path:
    """Prints the recorded run on node rank 0 and one NCCL line elsewhere, like torchrun's children would."""
    script = tmp_path / "torchrun"
    script.write_text(
        "#!/bin/sh\n"
        'case " $* " in\n'
        f'  *" --node-rank 0 "*) cat {FIXTURES / recorded} ;;\n'
        '  *) echo "gn-h100-node2:9:9 [0] NCCL INFO Using network IB" ;;\n'
        "esac\n"
    )
    script.chmod(0o755)
    return script


def real_run_vars(tmp_path: Path, recorded: str) -> dict:
    env_file = tmp_path / "nccl.env"
    env_file.write_text("NCCL_SOCKET_IFNAME=ib0\nGLOO_SOCKET_IFNAME=ib0\nNCCL_IB_HCA=mlx5\n")
    return {
        **local_vars(tmp_path),
        "nccl_tests_launcher": "torchrun",
        "nccl_tests_torchrun": str(fake_torchrun(tmp_path, recorded)),
        "nccl_tests_install_dir": str(tmp_path / "opt"),
        "kimi_nccl_env_file": str(env_file),
        "nccl_tests_require_transport": "IB",
        "nccl_tests_expected_nccl_version": "2.30.7-1+cuda13.3",
        "nccl_tests_min_busbw_gbs": 250,
        "nccl_tests_timeout": 120,
        # This host's own units are not the cluster's.
        "nccl_tests_require_idle": False,
    }


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the role installs its files owned by root")


@needs_root
def test_a_good_run_is_judged_and_reported(tmp_path):
    result = run_playbook(PLAYBOOK, INVENTORY, extravars=real_run_vars(tmp_path, "ib-2x8-h100-gdrdma.log"), timeout=600)
    assert result.rc == 0, result.failure_messages()
    report = json.loads((tmp_path / "reports" / "nccl_tests.json").read_text())
    assert report["passed"] is True and report["problems"] == []
    assert report["summary"]["transport"] == "IB" and report["summary"]["avg_busbw"] == 275.615
    assert report["gates"]["expected_ranks"] == 16
    assert report["env"]["NCCL_SOCKET_IFNAME"] == "ib0" and "GLOO_SOCKET_IFNAME" not in report["env"]
    assert "--node-rank 1" in report["commands"]["gn-h100-node2"]
    raw = (tmp_path / "reports" / "nccl_tests.log").read_text()
    assert "# Avg bus bandwidth    : 275.615" in raw and "==== gn-h100-node2 (exit status 0):" in raw
    (verdict,) = messages(result, "Show the verdict")
    assert verdict[-1] == "passed (min avg busbw 250 GB/s)"
    assert (tmp_path / "opt" / "kimi_allreduce_bench.py").exists()


@needs_root
def test_a_socket_fallback_fails_the_play_after_writing_the_reports(tmp_path):
    result = run_playbook(
        PLAYBOOK, INVENTORY, extravars=real_run_vars(tmp_path, "socket-fallback-2x8-h100.log"), timeout=600
    )
    assert result.rc != 0
    (failure,) = [f for f in result.failures if f["task"] == "Fail with every problem found"]
    assert "avg bus bandwidth 9.01 GB/s is below nccl_tests_min_busbw_gbs 250" in failure["msg"]
    assert "NCCL used Socket (eth0), not IB" in failure["msg"]
    report = json.loads((tmp_path / "reports" / "nccl_tests.json").read_text())
    assert report["passed"] is False and len(report["problems"]) == 2
