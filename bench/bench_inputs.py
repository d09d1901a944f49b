"""How soon site.yml refuses a bad input: wall time from `ansible-playbook` start to the refusal, for inventories
of the GreenNode shape with 2, 8 and 32 nodes (TP 8 in each node, PP across them). The issue's bound is 60 s,
before any package or byte is fetched. Prints; asserts nothing. Needs no lab and no root.

Every node points at a closed loopback port, so nothing leaves this machine even if a node task ran.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
PLAYBOOK = str(REPO_ROOT / "site.yml")
GREENNODE_VARS = REPO_ROOT / "inventories" / "greennode" / "group_vars" / "all"
NODE_COUNTS = (2, 8, 32)
ROUNDS = 3
# A revision that is not a commit: refused by the input check (the checkpoint phase is the fourth to run).
BAD_INPUT = ["-e", "kimi_checkpoint_revision=main"]


def write_inventory(directory: Path, nodes: int) -> Path:
    """The GreenNode inventory's variables with `nodes` hosts on 127.0.0.1:9 and PP over all of them."""
    group_vars = directory / "group_vars" / "all"
    group_vars.mkdir(parents=True)
    for source in GREENNODE_VARS.glob("*.yml"):
        (group_vars / source.name).write_text(source.read_text())
    (group_vars / "zz-bench.yml").write_text(yaml.safe_dump({"kimi_pipeline_parallel_size": nodes}))
    hosts = {f"bench-node{index}": {"ansible_host": "127.0.0.1", "ansible_port": 9} for index in range(nodes)}
    (directory / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"kimi_nodes": {"hosts": hosts}}}}))
    return directory


def refusal_seconds(inventory: Path, reports: Path) -> float:
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"),
        "ANSIBLE_HOME": str(REPO_ROOT / ".ansible"),
        "KIMI_REPORT_DIR": str(reports),
    }
    started = time.monotonic()
    done = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), PLAYBOOK, "-i", str(inventory), *BAD_INPUT],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        cwd=REPO_ROOT,
    )
    elapsed = time.monotonic() - started
    if done.returncode == 0 or "kimi_checkpoint_revision is not a 40-hex commit sha" not in done.stdout:
        raise SystemExit(f"bench_inputs: the bad revision was not refused by the input check:\n{done.stdout[-2000:]}")
    if "UNREACHABLE" in done.stdout:
        raise SystemExit("bench_inputs: a node was contacted before the refusal")
    return elapsed


def main() -> int:
    for nodes in NODE_COUNTS:
        with tempfile.TemporaryDirectory(prefix="kimi-bench-inputs-") as scratch:
            inventory = write_inventory(Path(scratch) / "inventory", nodes)
            times = [refusal_seconds(inventory, Path(scratch) / "reports") for _ in range(ROUNDS)]
        print(
            f"bad input refused on {nodes} nodes: median {sorted(times)[len(times) // 2]:.1f} s after start "
            f"(bound 60 s; runs: {', '.join(f'{t:.1f}' for t in times)}), no node contacted"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
