"""Download once per site, on four lab nodes: the checkpoint phase (playbooks/checkpoint.yml) with a generated
checkpoint of BULK_GIB GiB (`lab/lab bulk-checkpoint`, served by the lab's olah like the miniature; never from a
hub). It measures the phase's wall time on 1, 2 and 4 nodes spreading from node to node, and on 4 nodes each
downloading from the mirror (checkpoint_spread false); olah's access log shows how often each file came from the
mirror. Then: a second run changes nothing; a node power-cut while it fetches from its peers resumes from what it
held and verifies; a file that every peer serves corrupt is fetched from the mirror instead, with a warning.
The figures go to artifacts/bench/checkpoint-spread.json, which `make bench` prints (bench/bench_spread.py).

The lab's nodes share one 2-core host, its disk and its page cache, and the mirror is on the same host: the times
show the rounds' shape and the bytes, not a real site's speeds (docs/checkpoint.md gives the estimate for one).
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.ansible_run import REPO_ROOT, run_playbook
from tests.lab_olah import resolve_counts

# Tier 2 (tests/tiers.py): make test-all, and CI while its time allows.
pytestmark = [pytest.mark.lab, pytest.mark.tier2("lab-checkpoint-spread")]

CHECKPOINT = REPO_ROOT / "playbooks" / "checkpoint.yml"
LAB_INVENTORY = REPO_ROOT / "inventories" / "lab"
RECORD = REPO_ROOT / "artifacts" / "bench" / "checkpoint-spread.json"
NODES = ["node1", "node2", "node3", "node4"]
BULK_GIB = "2"
DIR = "/data/bulk"
STATE = "/var/lib/kimi-checkpoint"
PEER_LOG = f"{STATE}/peer/access.log"
PEER_PORT = 29700
# The throttle on the host's side of node4's link for the power cut: 2 GiB at 160 Mbit/s take about 110 s.
THROTTLE = "160mbit"
# nginx's combined log: $remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent ...
PEER_LINE = re.compile(
    r'^(?P<client>\S+) \S+ \S+ \[[^]]+\] "(?P<method>\S+) (?P<path>\S+) [^"]*" (?P<status>\d{3}) (?P<bytes>\d+)'
)


@pytest.fixture(scope="module")
def bulk(lab_controller):
    lab_controller.ensure_up(4)
    started = time.monotonic()
    proc = lab_controller.run("bulk-checkpoint", "--gib", BULK_GIB, timeout=1200)
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads(proc.stdout)
    manifest["build_s"] = round(time.monotonic() - started, 1)
    return manifest


def extravars(bulk: dict, **more) -> dict:
    return {
        "kimi_checkpoint_repo_id": bulk["repo_id"],
        "kimi_checkpoint_revision": bulk["revision"],
        "kimi_checkpoint_dir": DIR,
        "kimi_checkpoint_bytes": bulk["total_bytes"],
        **more,
    }


def on_node(lab, node: str, command: str, timeout: float = 120) -> str:
    proc = lab.ssh(node, command, timeout=timeout)
    assert proc.returncode == 0, f"{node}: {command}: {proc.stderr}"
    return proc.stdout


def wipe(lab, nodes=NODES) -> None:
    for node in nodes:
        on_node(lab, node, f"rm -rf {DIR} {STATE}/peer/access.log")


def olah_log(lab) -> Path:
    return lab.paths.logs / "olah.log"


def peer_bytes(lab) -> dict[str, dict[str, int]]:
    """{serving node: {client address: body bytes sent}} from each node's peer access log."""
    served: dict[str, dict[str, int]] = {}
    for node in NODES:
        text = lab.ssh(node, f"cat {PEER_LOG} 2>/dev/null").stdout
        for line in text.splitlines():
            if match := PEER_LINE.match(line):
                by_client = served.setdefault(node, {})
                by_client[match["client"]] = by_client.get(match["client"], 0) + int(match["bytes"])
    return served


def statuses(lab, node: str) -> list[str]:
    text = lab.ssh(node, f"cat {PEER_LOG} 2>/dev/null").stdout
    return [m["status"] for m in map(PEER_LINE.match, text.splitlines()) if m]


def run_phase(lab, bulk: dict, nodes: list[str], **more):
    """The checkpoint phase on `nodes`; returns the result, its seconds and how often olah gave each file."""
    log = olah_log(lab)
    offset = log.stat().st_size
    started = time.monotonic()
    result = run_playbook(CHECKPOINT, LAB_INVENTORY, limit=",".join(nodes), extravars=extravars(bulk, **more))
    seconds = round(time.monotonic() - started, 1)
    with log.open("rb") as stream:
        stream.seek(offset)
        fetched = resolve_counts(stream.read().decode(errors="replace"), bulk["repo_id"])
    print(f"checkpoint phase on {len(nodes)} node(s) {more}: rc {result.rc} in {seconds} s; from olah {fetched}")
    return result, seconds, fetched


def assert_marked_and_closed(lab, bulk: dict, nodes: list[str]) -> None:
    for node in nodes:
        marker = json.loads(on_node(lab, node, f"cat {DIR}/.kimi-checkpoint.json"))
        assert marker["revision"] == bulk["revision"] and marker["total_bytes"] == bulk["total_bytes"], node
        listening = on_node(lab, node, "ss -Htln")
        assert f":{PEER_PORT} " not in listening, f"{node} still serves the checkpoint after the phase:\n{listening}"


VERIFY_TASK = "Verify every file (size, and sha256 or git blob id where the Hub gives one)"


def assert_read_once(result, nodes, from_mirror=()):
    """Each node that took the checkpoint from its peers: the fetch program checked every file as it came, and the
    role's verification hashed only the files that came from elsewhere (`from_mirror`), not the same bytes again."""
    verified = result.results_of(VERIFY_TASK)
    for node in nodes:
        got = verified[node]
        assert got.get("ok"), (node, got.get("problems"))
        expected = (len(from_mirror), len(got.get("files", {})) - len(from_mirror))
        assert (got.get("hashed"), got.get("checked_on_arrival")) == expected, (node, got.get("hashed"))


def test_the_checkpoint_comes_from_the_mirror_once_and_spreads_in_rounds(lab_controller, bulk):
    lab = lab_controller
    figures: dict[str, dict] = {}
    for count in (1, 2, 4):
        wipe(lab)
        result, seconds, fetched = run_phase(lab, bulk, NODES[:count])
        assert result.rc == 0, result.failure_messages()
        assert fetched == dict.fromkeys(bulk["files"], 1), f"{count} node(s): files from the mirror {fetched}"
        assert_marked_and_closed(lab, bulk, NODES[:count])
        served = peer_bytes(lab)
        figures[f"spread_{count}"] = {
            "nodes": count,
            "seconds": seconds,
            "mirror_bytes": sum(bulk["files"][name] * n for name, n in fetched.items()),
            "peer_bytes": {node: sum(by.values()) for node, by in served.items()},
        }
        # Each node but the seed got every byte from a peer, once, and read it once.
        assert sum(figures[f"spread_{count}"]["peer_bytes"].values()) == (count - 1) * bulk["total_bytes"]
        assert_read_once(result, NODES[1:count])
    # Four nodes: node2 from node1 in round 1, node3 and node4 from one holder each in round 2.
    assert set(figures["spread_4"]["peer_bytes"]) == {"node1", "node2"}, figures["spread_4"]

    again, _, fetched = run_phase(lab, bulk, NODES)
    assert again.rc == 0 and again.changed == 0 and fetched == {}, f"a second run changed {again.changed}"

    wipe(lab)
    result, seconds, fetched = run_phase(lab, bulk, NODES, checkpoint_spread=False)
    assert result.rc == 0, result.failure_messages()
    assert fetched == dict.fromkeys(bulk["files"], 4), fetched
    figures["mirror_4"] = {
        "nodes": 4,
        "seconds": seconds,
        "mirror_bytes": 4 * bulk["total_bytes"],
        "peer_bytes": {},
    }
    RECORD.parent.mkdir(parents=True, exist_ok=True)
    RECORD.write_text(
        json.dumps(
            {
                "measured_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "what": f"{bulk['repo_id']}: {len(bulk['files'])} files, {bulk['total_bytes']} bytes, lab nodes",
                "build_s": bulk["build_s"],
                **figures,
            },
            indent=2,
        )
        + "\n"
    )


def test_a_node_cut_off_mid_transfer_resumes_from_what_it_holds(lab_controller, bulk):
    """node4 fetches from its peers through a throttled link and is power-cut half-way; the next run (the three
    others hold the checkpoint, so no byte comes from the mirror) continues its partial file with a Range request
    and verifies it."""
    lab = lab_controller
    wipe(lab, ["node4"])
    for node in NODES[:3]:
        on_node(lab, node, f"rm -f {PEER_LOG}")
    subprocess.run(
        [
            "tc",
            "qdisc",
            "add",
            "dev",
            "vb-node4",
            "root",
            "tbf",
            "rate",
            THROTTLE,
            "burst",
            "256kb",
            "latency",
            "100ms",
        ],
        check=True,
    )
    outcome: dict = {}
    phase = threading.Thread(target=lambda: outcome.update(run=run_phase(lab, bulk, NODES)))
    phase.start()
    crashed = False
    try:
        partial = 0
        deadline = time.monotonic() + 300
        while partial < bulk["total_bytes"] // 3:
            assert phase.is_alive() and time.monotonic() < deadline, f"node4 held {partial} bytes"
            time.sleep(2)
            held = lab.ssh("node4", f"du -sb --apparent-size {DIR} 2>/dev/null | cut -f1").stdout.strip()
            partial = int(held or 0)
        crashed = lab.run("crash", "node4").returncode == 0
        assert crashed
    finally:
        phase.join(timeout=900)
        if crashed:
            assert lab.run("start", "node4").returncode == 0
        else:
            subprocess.run(["tc", "qdisc", "del", "dev", "vb-node4", "root"], check=False)
    result, _, fetched = outcome["run"]
    assert result.rc != 0 and "node4" in result.unreachable_hosts + list(result.stats.get("failures", {}))
    kept = int(on_node(lab, "node4", f"du -sb --apparent-size {DIR} | cut -f1"))
    assert kept >= bulk["total_bytes"] // 3, f"node4 kept {kept} bytes after the power cut"

    for node in NODES[:3]:
        on_node(lab, node, f"rm -f {PEER_LOG}")
    result, seconds, fetched = run_phase(lab, bulk, NODES)
    assert result.rc == 0, result.failure_messages()
    assert fetched == {}, f"the resumed node went to the mirror: {fetched}"
    assert_marked_and_closed(lab, bulk, NODES)
    served = sum(sum(by.values()) for by in peer_bytes(lab).values())
    assert served <= bulk["total_bytes"] - kept + 64 * 1024**2, f"peers sent {served} bytes; node4 held {kept}"
    assert any("206" in statuses(lab, node) for node in NODES[:3]), "no Range request resumed a partial file"
    print(f"node4 held {kept} bytes after the cut; the resumed fetch took {served} bytes from peers in {seconds} s")


def test_a_file_every_peer_serves_corrupt_comes_from_the_mirror_with_a_warning(lab_controller, bulk):
    """The three holders' copy of the first shard is changed in place at its size and its stat put back, so their
    markers still match and they serve it; node4 finds every copy's checksum wrong, says so and takes that file
    from the mirror, and only it."""
    lab = lab_controller
    first = sorted(name for name in bulk["files"] if name.endswith(".safetensors"))[0]
    corrupt = (
        "import os; p = '{path}'; s = os.stat(p); f = os.open(p, os.O_WRONLY); os.pwrite(f, b'corrupt!' * 4, 4096); "
        "os.close(f); os.utime(p, ns=(s.st_atime_ns, s.st_mtime_ns))"
    ).format(path=f"{DIR}/{first}")
    for node in NODES[:3]:
        on_node(lab, node, f'python3 -c "{corrupt}"')
    wipe(lab, ["node4"])
    result, _, fetched = run_phase(lab, bulk, NODES)
    assert result.rc == 0, result.failure_messages()
    assert fetched == {first: 1}, fetched
    warnings = [
        str(r.get("msg", "")) for r in result.results_of("Say why this node leaves its peers for the Hub").values()
    ]
    assert any(w.startswith("WARNING node4: every peer failed") and first in w for w in warnings), warnings
    assert_read_once(result, ["node4"], from_mirror=[first])
    assert_marked_and_closed(lab, bulk, ["node4"])
    wipe(lab)
