"""Render the serve phase's units for the example inventories (nothing is started) and compare them with the
golden files; each guide's launch command (docs/sources.md) is reproduced flag for flag; every flag is one the
target vLLM version knows; every unit passes `systemd-analyze verify`.

Regenerate the golden files after a deliberate change: KIMI_UPDATE_GOLDEN=1 pytest tests/local/test_serve_render.py
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.kimi.k2.plugins.module_utils.kimi_serve import PRELOAD_UNIT

from tests.ansible_run import REPO_ROOT, run_playbook

# Tier 2 (tests/tiers.py, group local-serve): make test-all, and CI while its time allows, or when its code changed.
pytestmark = pytest.mark.tier2("local-serve")

FIXTURES = REPO_ROOT / "tests" / "fixtures"
GOLDEN = FIXTURES / "serve" / "golden"
PRODUCTION_FLAGS = FIXTURES / "vllm" / "serve-flags-0.23.0.txt"
LAB_FLAGS = FIXTURES / "vllm" / "serve-flags-0.32.0.txt"
# `vllm preload`'s own flags beyond EngineArgs (whose flags the serve list holds): the weight-cache daemon's unit.
PRELOAD_FLAGS = FIXTURES / "vllm" / "preload-flags-0.32.0.txt"
VLLM_BIN = "/opt/vllm/current/bin/vllm"

# case -> (inventory, extra variables, the vLLM version's recorded flags)
CASES = {
    "greennode-mp": (REPO_ROOT / "inventories" / "greennode", {}, PRODUCTION_FLAGS),
    "greennode-ray": (
        REPO_ROOT / "inventories" / "greennode",
        {"kimi_serve_layout": "ray", "kimi_tensor_parallel_size": 16, "kimi_pipeline_parallel_size": 1},
        PRODUCTION_FLAGS,
    ),
    "h200-dp-ep": (REPO_ROOT / "inventories" / "h200-dp-ep", {}, PRODUCTION_FLAGS),
    # The weight cache (kimi_weight_cache): a `vllm preload` unit on both nodes, --load-format ipc_cache on
    # both ranks. Its flags are checked against vLLM 0.32.0's CLI, the first release with the daemon and the
    # newest one recorded here.
    "h200-dp-ep-weight-cache": (REPO_ROOT / "inventories" / "h200-dp-ep", {"kimi_weight_cache": True}, LAB_FLAGS),
    "rtx-pro-6000": (REPO_ROOT / "inventories" / "rtx-pro-6000", {}, PRODUCTION_FLAGS),
    # The lab's nodes are Debian 12: systemd 252, no RestartSteps.
    "lab-mp": (
        FIXTURES / "serve" / "inventories" / "lab-mp",
        {"kimi_api_key": "lab-secret", "vllm_serve_systemd_version": 252},
        LAB_FLAGS,
    ),
}


def render_vars(root: Path) -> dict:
    """serve.yml rendered on this host: local connection, services unmanaged, each host's files under root."""
    per_host = str(root) + "/{{ inventory_hostname }}"
    return {
        "ansible_connection": "local",
        "ansible_become": False,
        "ansible_python_interpreter": sys.executable,
        "kimi_host_ip": "{{ ansible_host }}",
        "kimi_report_dir": str(root / "reports"),
        "vllm_serve_manage_services": False,
        "ray_cluster_manage_services": False,
        "vllm_serve_systemd_version": 255,
        "vllm_serve_destdir": per_host,
        "ray_cluster_unit_dir": per_host + "/etc/systemd/system",
    }


# The watchdog's script on a node is a verbatim copy of plugins/module_utils files (test_watchdog_render.py
# compares them), not a rendering: a golden copy would only repeat the source.
WATCHDOG_LIB = ("usr", "local", "lib", "kimi-watchdog")


def _rendered_files(root: Path) -> dict[str, str]:
    files = {}
    for path in sorted(root.rglob("*")):
        copied = path.relative_to(root).parts[1:5] == WATCHDOG_LIB
        if path.is_file() and "reports" not in path.parts and not copied:
            # Paths inside the files point at the temporary directory; the golden files name it <render>.
            files[str(path.relative_to(root))] = path.read_text().replace(str(root), "<render>")
    return files


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, dict[str, str]]:
    results = {}
    for case, (inventory, extra, _) in CASES.items():
        root = tmp_path_factory.mktemp(case)
        outcome = run_playbook(
            REPO_ROOT / "playbooks" / "serve.yml", inventory, extravars={**render_vars(root), **extra}, timeout=600
        )
        assert outcome.rc == 0, f"{case}: {outcome.failure_messages()}"
        results[case] = _rendered_files(root)
        if case in SECOND_RUN_CASES:
            results[case + "/second-run-changed"] = {"count": str(_second_run_changed(inventory, root, extra))}
    return results


def _second_run_changed(inventory: Path, root: Path, extra: dict) -> int:
    again = run_playbook(
        REPO_ROOT / "playbooks" / "serve.yml", inventory, extravars={**render_vars(root), **extra}, timeout=600
    )
    assert again.rc == 0, again.failure_messages()
    return again.changed


@pytest.mark.parametrize("case", CASES)
def test_rendered_files_equal_the_golden_files(rendered, case):
    golden_dir = GOLDEN / case
    files = rendered[case]
    if os.environ.get("KIMI_UPDATE_GOLDEN") == "1":
        shutil.rmtree(golden_dir, ignore_errors=True)
        for name, text in files.items():
            (golden_dir / name).parent.mkdir(parents=True, exist_ok=True)
            (golden_dir / name).write_text(text)
    golden = {str(p.relative_to(golden_dir)): p.read_text() for p in sorted(golden_dir.rglob("*")) if p.is_file()}
    assert sorted(files) == sorted(golden), f"{case}: rendered file set differs from {golden_dir}"
    for name, text in files.items():
        assert text == golden[name], f"{case}: {name} differs from the golden file"


# The mp layout's second run is the lab's (tests/lab/test_site_on_lab.py, on real nodes) and the vllm_serve Molecule
# scenario's idempotence step; here the layouts the lab never serves.
SECOND_RUN_CASES = ("greennode-ray", "h200-dp-ep", "h200-dp-ep-weight-cache", "rtx-pro-6000")


@pytest.mark.parametrize("case", SECOND_RUN_CASES)
def test_a_second_run_changes_nothing(rendered, case):
    assert rendered[case + "/second-run-changed"]["count"] == "0"


# ---------------------------------------------------------------------------------------------- the argv


def exec_start_argv(unit_text: str) -> list[str]:
    """ExecStart= of a rendered unit as the argv systemd runs (continuations joined, %% and $$ undone)."""
    lines = unit_text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("ExecStart="))
    text = lines[start][len("ExecStart=") :]
    index = start
    while text.endswith("\\"):
        index += 1
        text = text[:-1] + " " + lines[index].strip()
    return [word.replace("%%", "%").replace("$$", "$") for word in shlex.split(text)]


ALIASES = {"-tp": "--tensor-parallel-size", "-pp": "--pipeline-parallel-size", "-dcp": "--decode-context-parallel-size"}


def flag_map(argv: list[str]) -> dict[str, str | None]:
    """--flag -> value (None for a switch); the positional model path is dropped."""
    flags: dict[str, str | None] = {}
    words = [ALIASES.get(word, word) for word in argv]
    for index, word in enumerate(words):
        if word.startswith("-"):
            following = words[index + 1] if index + 1 < len(words) else None
            flags[word] = None if following is None or following.startswith("-") else following
    return flags


def units_of(files: dict[str, str]) -> dict[str, str]:
    return {name: text for name, text in files.items() if name.endswith(".service") and "kimi-vllm" in name}


# The guides' launch commands (docs/sources.md), word for word (the model path and $NODE1_IP / $MASTER_IP / $PORT
# substituted).
GREENNODE_NODE1 = (
    "vllm serve MODEL --served-model-name kimi-k2 -tp 8 -pp 2 --trust-remote-code --tool-call-parser kimi_k2 "
    "--reasoning-parser kimi_k2 --enable-auto-tool-choice --enable-expert-parallel --mm-encoder-tp-mode data "
    "--master-addr 10.20.0.11 --nnodes 2 --node-rank 0"
)
GREENNODE_NODE2 = GREENNODE_NODE1.replace("--node-rank 0", "--node-rank 1 --headless")
RECIPE_COMMON = (
    "--port 8000 --served-model-name kimi-k2 --trust-remote-code --data-parallel-size 16 "
    "--data-parallel-size-local 8 --data-parallel-address 10.30.0.10 --data-parallel-rpc-port 13345 "
    "--enable-expert-parallel --max-num-batched-tokens 8192 --max-num-seqs 256 --gpu-memory-utilization 0.85 "
    "--enable-auto-tool-choice --tool-call-parser kimi_k2"
)
RECIPE_NODE0 = "vllm serve MODEL " + RECIPE_COMMON
RECIPE_NODE1 = "vllm serve MODEL --headless --data-parallel-start-rank 8 " + RECIPE_COMMON
RECIPE_RAY = (
    "vllm serve MODEL --port 8000 --served-model-name kimi-k2 --trust-remote-code --tensor-parallel-size 16 "
    "--distributed-executor-backend ray --enable-auto-tool-choice --tool-call-parser kimi_k2"
)
RTX_PRO_6000 = (
    "vllm serve MODEL --tensor-parallel-size 8 --tool-call-parser kimi_k2 --enable-auto-tool-choice "
    "--reasoning-parser kimi_k2 --language-model-only --decode-context-parallel-size 8"
)

GUIDE_COMMANDS = {
    "GreenNode node 1": ("greennode-mp", "gn-h100-node1/etc/systemd/system/kimi-vllm.service", GREENNODE_NODE1),
    "GreenNode node 2": (
        "greennode-mp",
        "gn-h100-node2/etc/systemd/system/kimi-vllm-headless.service",
        GREENNODE_NODE2,
    ),
    "vLLM recipe DP+EP 0": ("h200-dp-ep", "h200-node0/etc/systemd/system/kimi-vllm.service", RECIPE_NODE0),
    "vLLM recipe DP+EP 1": ("h200-dp-ep", "h200-node1/etc/systemd/system/kimi-vllm-headless.service", RECIPE_NODE1),
    "vLLM recipe TP16 on Ray": ("greennode-ray", "gn-h100-node1/etc/systemd/system/kimi-vllm.service", RECIPE_RAY),
    "RTX PRO 6000 TP8 + DCP8": ("rtx-pro-6000", "rtx6000-node1/etc/systemd/system/kimi-vllm.service", RTX_PRO_6000),
}


@pytest.mark.parametrize("guide", GUIDE_COMMANDS)
def test_each_guide_command_is_reproduced_flag_for_flag(rendered, guide):
    case, unit, command = GUIDE_COMMANDS[guide]
    ours = flag_map(exec_start_argv(rendered[case][unit])[1:])
    theirs = flag_map(shlex.split(command)[2:])
    missing = {flag: value for flag, value in theirs.items() if flag not in ours}
    different = {flag: (value, ours[flag]) for flag, value in theirs.items() if flag in ours and ours[flag] != value}
    assert not missing, f"{guide}: flags of the guide the unit lacks: {missing}"
    assert not different, f"{guide}: (guide, unit) values differ: {different}"


def test_the_ray_workers_run_no_vllm_unit(rendered):
    files = rendered["greennode-ray"]
    assert "gn-h100-node2/etc/systemd/system/kimi-ray-worker.service" in files
    assert not [name for name in files if name.startswith("gn-h100-node2/etc/systemd/system/kimi-vllm")]


def test_the_lab_unit_loads_the_env_files_and_keeps_the_key_out_of_argv(rendered):
    files = rendered["lab-mp"]
    unit = files["node1/etc/systemd/system/kimi-vllm.service"]
    assert "EnvironmentFile=/etc/kimi/nccl.env" in unit
    assert "lab-secret" not in unit
    assert "VLLM_API_KEY=lab-secret" in files["node1/etc/kimi/vllm-secrets.env"]
    assert "node2/etc/kimi/vllm-secrets.env" not in files
    assert "VLLM_HOST_IP=198.18.0.12" in files["node2/etc/kimi/vllm.env"]
    assert "VLLM_CPU_KVCACHE_SPACE=1" in files["node2/etc/kimi/vllm.env"]
    argv = exec_start_argv(unit)
    assert argv[argv.index("--default-chat-template-kwargs") + 1] == '{"thinking": false}'


WEIGHT_CACHE_UNITS = "{host}/etc/systemd/system/"


def test_the_weight_cache_runs_a_daemon_on_every_node_and_binds_each_rank_to_it(rendered):
    files, plain = rendered["h200-dp-ep-weight-cache"], rendered["h200-dp-ep"]
    assert not [name for name in plain if name.endswith(PRELOAD_UNIT)]
    for host, unit, start_rank in (
        ("h200-node0", "kimi-vllm.service", None),
        ("h200-node1", "kimi-vllm-headless.service", "8"),
    ):
        folder = WEIGHT_CACHE_UNITS.format(host=host)
        preload = exec_start_argv(files[folder + PRELOAD_UNIT])
        flags = flag_map(preload[1:])
        assert flags["--weight-cache-master-port"] == "29600"
        assert flags["--data-parallel-address"] == "10.30.0.10"
        assert flags.get("--data-parallel-start-rank") == start_rank
        assert "--data-parallel-rpc-port" not in flags and "--headless" not in flags
        rank = files[folder + unit]
        assert f"BindsTo={PRELOAD_UNIT}" in rank and f"After={PRELOAD_UNIT}" in rank
        argv = exec_start_argv(rank)
        assert argv[argv.index("--load-format") + 1] == "ipc_cache"
        assert preload[1:4] == ["preload", "--model", argv[2]]
        # Everything else of the rank's command is the plain layout's.
        index = argv.index("--load-format")
        assert argv[:index] + argv[index + 4 :] == exec_start_argv(plain[folder + unit])
        assert "RuntimeDirectory=kimi-vllm-weight-cache" in files[folder + PRELOAD_UNIT]


def _known_flags(path: Path) -> set[str]:
    return {line.strip() for line in path.read_text().splitlines() if line.startswith("-")}


@pytest.mark.parametrize("case", CASES)
def test_every_flag_is_known_to_the_target_vllm_version(rendered, case):
    for name, text in units_of(rendered[case]).items():
        known = _known_flags(CASES[case][2])
        if name.endswith(PRELOAD_UNIT):
            known |= _known_flags(PRELOAD_FLAGS)
        unknown = [word for word in exec_start_argv(text) if word.startswith("--") and word not in known]
        assert not unknown, f"{case}: {name} passes flags {CASES[case][2].name} does not know: {unknown}"


def test_the_flag_check_catches_a_flag_the_production_pin_lacks():
    # A flag only the lab's newer vLLM knows must not pass the production check.
    newer_only = _known_flags(LAB_FLAGS) - _known_flags(PRODUCTION_FLAGS)
    assert newer_only, "the recorded versions should differ"
    assert not (newer_only & _known_flags(PRODUCTION_FLAGS))


# ---------------------------------------------------------------------------------------------- systemd


@pytest.mark.parametrize("case", CASES)
def test_every_unit_passes_systemd_analyze_verify(rendered, case, tmp_path):
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed (apt-get install -y systemd)")
    stub = tmp_path / "bin"
    stub.mkdir()
    for name in ("vllm", "ray"):
        (stub / name).write_text("#!/bin/sh\n")
        (stub / name).chmod(0o755)
    units = {n: t for n, t in rendered[case].items() if n.endswith(".service")}
    assert units
    local_systemd = int(
        subprocess.run(["systemd-analyze", "--version"], capture_output=True, text=True, check=False).stdout.split()[1]
    )
    for name, text in units.items():
        if local_systemd < 254:
            # Written only for nodes with systemd >= 254 (vllm_serve_systemd_version); this verifier predates them.
            text = "\n".join(
                line for line in text.splitlines() if not line.startswith(("RestartSteps=", "RestartMaxDelaySec="))
            )
        # verify checks that ExecStart's binary exists: point it at a stub of the same name.
        path = tmp_path / Path(name).name
        path.write_text(text.replace("/opt/vllm/current/bin/", f"{stub}/"))
        done = subprocess.run(
            ["systemd-analyze", "verify", "--man=no", str(path)], capture_output=True, text=True, check=False
        )
        complaints = [line for line in done.stderr.splitlines() if str(path) in line or "Unknown" in line]
        assert done.returncode == 0 and not complaints, f"{case}: {name}: {done.stderr}"


def test_check_mode_with_diff_writes_nothing(tmp_path):
    inventory, extra, _ = CASES["lab-mp"]
    outcome = run_playbook(
        REPO_ROOT / "playbooks" / "serve.yml",
        inventory,
        extravars={**render_vars(tmp_path), **extra},
        check=True,
        diff=True,
        timeout=600,
    )
    assert outcome.rc == 0, outcome.failure_messages()
    assert outcome.changed > 0
    assert not [path for path in tmp_path.rglob("*") if path.is_file()]
