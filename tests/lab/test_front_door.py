"""The front door on the lab: two single-node replicas behind the router, TLS and keys, the firewall, rollouts.

One converge for the file: the lab's two nodes become replicas `a` (node1) and `b` (node2) of the same model,
node1 also runs the router (haproxy, HTTPS on 8443 with a certificate from a CA this test makes), and the
firewall closes vLLM's ports to everyone but the router, the monitoring host and the replica's own nodes. The
tests then talk to it from the lab host as a client would, and from the nodes as peers would.

It runs last (tests/lab/conftest.py, LAB_FILE_ORDER): it reshapes the lab, so the next `serving` converges the
two-node group again. Timings are printed (`-s`); the rollout's p99 and failure count are written to
artifacts/bench/rolling-upgrade.json, which `make bench` prints.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from tests.ansible_run import REPO_ROOT, run_playbook
from tests.lab.conftest import ensure_serving
from tests.lab_api import FrontDoor, connect_outcome

# Tier 2 (tests/tiers.py): make test-all, and CI while its time allows.
pytestmark = [pytest.mark.lab, pytest.mark.tier2("lab-front-door")]

SITE = REPO_ROOT / "site.yml"
ROLLING = REPO_ROOT / "playbooks" / "rolling.yml"
LAB_INVENTORY = REPO_ROOT / "inventories" / "lab"
BENCH_RECORD = REPO_ROOT / "artifacts" / "bench" / "rolling-upgrade.json"
NODE1, NODE2 = "198.18.0.11", "198.18.0.12"
ROUTER_PORT = 8443
CLIENT_KEYS = ["lab-client-key-1", "lab-client-key-2"]
# What two replicas behind a router change on the converged two-node lab (its stack, parity and checkpoint stay
# as they are: preflight and parity of the new shape are the local tests' and the Molecule scenarios').
RESHAPING_PHASES = "firewall,serve,router,monitoring,verify"
BACKEND_KEY = "lab-backend-key"
# The rollout's load: two streams at once through the router for the whole rollout, each client pausing a second
# between requests, bounded in count and in time. Light on purpose: the lab's two nodes share the host's two cores,
# and a replica saturated by the load starves the other one's restart (measured: a restart that never finished).
LOAD_CONCURRENCY = 2
LOAD_PAUSE_S = 1.0
LOAD_MAX_REQUESTS = 12000
LOAD_MAX_S = 1200
LOAD_MAX_TOKENS = 24
# The rollouts' flag change, as it shows in the units' ExecStart.
NEW_FLAG = "--shutdown-timeout 45"


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_ca_and_certificate(directory: Path) -> tuple[Path, str, str]:
    """A throwaway CA (the file the client trusts) and a certificate for the router's address, signed by it."""
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=kimi lab CA",
            "-keyout", "ca.key", "-out", "ca.pem", cwd=directory)  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=kimi lab router",
            "-keyout", "router.key", "-out", "router.csr", cwd=directory)  # fmt: skip
    (directory / "san.ext").write_text(f"subjectAltName=IP:{NODE1}\n")
    openssl("x509", "-req", "-in", "router.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-extfile", "san.ext", "-out", "router.pem", cwd=directory)  # fmt: skip
    return directory / "ca.pem", (directory / "router.pem").read_text(), (directory / "router.key").read_text()


def replicas_inventory(directory: Path, replica_a_vars: dict | None = None) -> Path:
    """The lab's inventory with node1 and node2 as replicas a and b, and node1 as the router."""
    directory.mkdir()
    shutil.copy(LAB_INVENTORY / "hosts.yml", directory / "hosts.yml")
    (directory / "group_vars").symlink_to(LAB_INVENTORY / "group_vars")
    front_door = {
        "all": {
            "children": {
                "kimi_nodes": {
                    "children": {
                        "kimi_replica_a": {"hosts": {"node1": {}}, "vars": replica_a_vars or {}},
                        "kimi_replica_b": {"hosts": {"node2": {}}},
                    }
                },
                "kimi_router": {"hosts": {"node1": {}}},
            }
        }
    }
    (directory / "replicas.yml").write_text(yaml.safe_dump(front_door, sort_keys=False))
    return directory


@pytest.fixture(scope="module")
def front_door(lab_controller, tmp_path_factory):
    # The session's converge (stack, checkpoint) is reused: only the phases the new shape changes run again.
    ensure_serving(lab_controller)
    workdir = tmp_path_factory.mktemp("front-door")
    ca_file, certificate, key = make_ca_and_certificate(workdir)
    inventory = replicas_inventory(workdir / "inventory")
    extravars = {
        "kimi_router_port": ROUTER_PORT,
        "kimi_router_api_keys": CLIENT_KEYS,
        "kimi_api_key": BACKEND_KEY,
        "router_tls_certificate": certificate,
        "router_tls_key": key,
        # Quick to take a hung replica out and to put it back (the defaults suit a GPU cluster).
        "router_health_interval": 2,
        "router_health_timeout": 10,
        "router_health_fall": 2,
        "router_health_rise": 1,
        # verify's front-door check trusts the lab's CA.
        "verify_router_ca_path": str(ca_file),
        # verify's own load test measures the backends, which the other lab files' converges already did; this
        # file measures load through the router.
        "verify_load_requests": 0,
    }
    started = time.monotonic()
    result = run_playbook(SITE, inventory, extravars=extravars, tags=RESHAPING_PHASES)
    print(f"front door: site.yml converge (two replicas, router, firewall) -> rc {result.rc} "
          f"in {time.monotonic() - started:.1f} s")  # fmt: skip
    assert result.rc == 0, result.failure_messages()
    # The lab is no longer the two-node group the other files share: the next `serving` converges it again.
    lab_controller.converged = None
    door = FrontDoor(NODE1, ROUTER_PORT, str(ca_file), CLIENT_KEYS[1])
    yield lab_controller, inventory, extravars, door
    lab_controller.converged = None


def router_state(lab, replica: str) -> dict:
    proc = lab.ssh("node1", f"kimi-haproxy-ctl show {replica}")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def wait_for_router_status(lab, replica: str, wanted: str, timeout: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if router_state(lab, replica).get("status", "").startswith(wanted):
            return time.monotonic() - started
        time.sleep(1)
    raise AssertionError(f"replica {replica} not {wanted} after {timeout} s: {router_state(lab, replica)}")


def test_verify_reports_each_replica_and_the_front_door(front_door):
    # The converge's verify phase ran once per replica, each report in its own directory, each with the check
    # through the router (TLS against the lab's CA, a client key: 200; no key: 401).
    for replica in ("a", "b"):
        report = json.loads((REPO_ROOT / "artifacts" / f"replica-{replica}" / "verify-latest.json").read_text())
        assert report["ok"], report["checks"]
        (check,) = [c for c in report["checks"] if c["name"].startswith("front_door")]
        assert check["status"] == "pass", check


def test_every_route_needs_tls_and_a_key_but_health_and_metrics_is_for_monitoring_only(front_door):
    _, _, _, door = front_door
    completion = {"model": "kimi-k2", "prompt": "ping", "max_tokens": 1}
    status, body = door.request("POST", "/v1/completions", completion)
    assert status == 200 and json.loads(body)["choices"], body
    # Either key works; a wrong one and none do not, on /v1 and on the routes vLLM itself leaves open.
    assert door.request("POST", "/v1/completions", completion, key=CLIENT_KEYS[0])[0] == 200
    for method, path, body in (("GET", "/v1/models", None), ("POST", "/tokenize", {"prompt": "hi"})):
        assert door.request(method, path, body, key=None)[0] == 401, path
        assert door.request(method, path, body, key="not-a-key")[0] == 401, path
    # The backend key is the router's own: sent by a client, it opens nothing.
    assert door.request("GET", "/v1/models", key=BACKEND_KEY)[0] == 401
    assert door.request("GET", "/health", key=None)[0] == 200
    # The lab host is no monitoring host: /metrics is refused even with a key.
    assert door.request("GET", "/metrics")[0] == 403


def test_the_firewall_refuses_the_lab_host_and_the_other_replica_and_admits_the_router(front_door):
    lab, _, _, _ = front_door
    # From the lab host (no router, no monitoring host): vLLM's API on both replicas is refused.
    assert connect_outcome(NODE1, 8000) == "refused"
    assert connect_outcome(NODE2, 8000) == "refused"
    # From node2 (replica b): replica a's master port is refused, and so is its API (node2 monitors nothing).
    probe = "python3 -c 'import socket,sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 5)' {} {}"
    refused = lab.ssh("node2", probe.format(NODE1, 29501))
    assert refused.returncode != 0 and "ConnectionRefusedError" in refused.stderr, refused.stderr
    assert "ConnectionRefusedError" in lab.ssh("node2", probe.format(NODE1, 8000)).stderr
    # From node1 (the router and the monitoring host): replica b's API is accepted.
    assert lab.ssh("node1", probe.format(NODE2, 8000)).returncode == 0
    # The rules are in the table the firewall role owns, and nftables.service loads them at boot.
    assert lab.ssh("node2", "systemctl is-enabled nftables.service").stdout.strip() == "enabled"
    assert "table inet kimi" in lab.ssh("node2", "nft list table inet kimi").stdout


def test_the_router_takes_a_hung_replica_out_and_puts_it_back(front_door):
    lab, _, _, door = front_door
    # Replica b hangs (its processes stopped, /health hangs too); its watchdog is held off for this test.
    assert lab.ssh("node2", "touch /etc/kimi/maintenance").returncode == 0
    # systemd signals every process of the unit (the API server, the engine core, the worker).
    stop = "systemctl kill --signal=SIGSTOP kimi-vllm.service"
    cont = "systemctl kill --signal=SIGCONT kimi-vllm.service"
    try:
        assert lab.ssh("node2", stop).returncode == 0
        print(f"replica b out of the router {wait_for_router_status(lab, 'b', 'DOWN', 90):.1f} s after it hung")
        # Every request now goes to replica a.
        one_token = {"model": "kimi-k2", "prompt": "hi", "max_tokens": 1}
        for _ in range(4):
            assert door.request("POST", "/v1/completions", one_token)[0] == 200
        assert door.request("GET", "/health", key=None)[0] == 200
    finally:
        lab.ssh("node2", cont)
        lab.ssh("node2", "rm -f /etc/kimi/maintenance")
    print(f"replica b back in the router {wait_for_router_status(lab, 'b', 'UP', 120):.1f} s after it resumed")


def run_load(door: FrontDoor, stop: threading.Event) -> tuple[list[float], list[str]]:
    """Streamed completions through the router until `stop` (bounded in count): latencies and failures."""
    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()
    budget = iter(range(LOAD_MAX_REQUESTS))
    deadline = time.monotonic() + LOAD_MAX_S

    def worker() -> None:
        while not stop.is_set() and time.monotonic() < deadline and next(budget, None) is not None:
            try:
                took = door.stream_completion(LOAD_MAX_TOKENS)
            except Exception as error:  # every failure counts, whatever its kind
                with lock:
                    failures.append(f"{time.strftime('%H:%M:%S')} {type(error).__name__}: {error}")
            else:
                with lock:
                    latencies.append(took)
            stop.wait(LOAD_PAUSE_S)

    with ThreadPoolExecutor(LOAD_CONCURRENCY) as pool:
        for _ in range(LOAD_CONCURRENCY):
            pool.submit(worker)
    return latencies, failures


def slowest_tasks(result, count: int = 8) -> str:
    """The tasks that took longest on any host (ansible-runner's event durations), for the printed timings."""
    took: dict[str, float] = {}
    for event in result.events:
        data = event.get("event_data", {})
        if event.get("event", "").startswith("runner_on_") and "duration" in data:
            name = f"{data.get('role', '')} : {data.get('task', '')}"
            took[name] = took.get(name, 0.0) + float(data["duration"])
    ranked = sorted(took.items(), key=lambda item: item[1], reverse=True)[:count]
    return "; ".join(f"{name} {seconds:.0f} s" for name, seconds in ranked)


def main_pid(lab, node: str) -> str:
    return lab.ssh(node, "systemctl show -p MainPID --value kimi-vllm.service").stdout.strip()


def exec_start(lab, node: str) -> str:
    return lab.ssh(node, "systemctl show -p ExecStart kimi-vllm.service").stdout


def snapshot(lab) -> dict:
    """Each replica's vLLM process, whether it runs with the new flag, and its state in the router."""
    return {
        node: {
            "pid": main_pid(lab, node),
            "new_flag": NEW_FLAG in exec_start(lab, node),
            "router": router_state(lab, replica),
        }
        for node, replica in (("node1", "a"), ("node2", "b"))
    }


def test_a_rollout_stops_at_a_replica_failing_verify_and_limited_rollouts_finish_it_failing_no_request(
    front_door, tmp_path
):
    lab, inventory, extravars, door = front_door
    # Replica a's verify is made to fail (it expects a tool-call parser the units do not run): the first rollout
    # restarts a, finds it failing, leaves it out of the router and stops before b.
    failing_a = replicas_inventory(tmp_path / "failing-a", {"verify_expected_tool_call_parser": "no_such_parser"})
    # A flag change on every replica (vLLM's drain grace, in its argv).
    rollout_vars = {**extravars, "kimi_shutdown_timeout": 45}
    states = {"before": snapshot(lab)}
    results, took = {}, {}
    steps = (
        ("stopped at a", failing_a, None),
        # a fixed and verified alone: it already runs the new flag, so it is not restarted, only put back.
        ("a alone", inventory, "kimi_replica_a"),
        # Then b alone, restarted with the flag while a serves.
        ("b alone", inventory, "kimi_replica_b"),
    )
    stop = threading.Event()
    outcome: dict = {}
    load = threading.Thread(
        target=lambda: outcome.update(zip(("latencies", "failures"), run_load(door, stop), strict=True))
    )
    load.start()
    try:
        time.sleep(5)  # the load is flowing before the rollout starts
        started = time.monotonic()
        for step, step_inventory, limit in steps:
            step_started = time.monotonic()
            results[step] = run_playbook(ROLLING, step_inventory, extravars=rollout_vars, limit=limit)
            took[step] = time.monotonic() - step_started
            states[step] = snapshot(lab)
            print(f"rolling.yml ({step}) -> rc {results[step].rc} in {took[step]:.1f} s; "
                  f"slowest tasks: {slowest_tasks(results[step])}")  # fmt: skip
            if step != "stopped at a" and results[step].rc != 0:
                break
        rollout_s = time.monotonic() - started
        time.sleep(5)
    finally:
        stop.set()
        load.join(timeout=300)

    # 1. The rollout stopped at a: a restarted with the flag, failed verify and stayed out of the router; b was
    #    never reached (same process, old flag) and served every request meanwhile.
    stopped = results["stopped at a"]
    assert stopped.rc != 0, "a rollout with a replica failing verify succeeded"
    assert any("verify failed" in m for m in stopped.failure_messages()), stopped.failure_messages()
    after_stop = states["stopped at a"]
    assert after_stop["node1"]["pid"] != states["before"]["node1"]["pid"] and after_stop["node1"]["new_flag"]
    assert after_stop["node1"]["router"]["admin"] == "maint", after_stop["node1"]["router"]
    assert after_stop["node2"]["pid"] == states["before"]["node2"]["pid"] and not after_stop["node2"]["new_flag"]
    assert after_stop["node2"]["router"]["status"].startswith("UP"), after_stop["node2"]["router"]
    # 2. `--limit kimi_replica_a`: only a ran; verified, it is back in the router without a restart.
    assert results["a alone"].rc == 0, results["a alone"].failure_messages()
    a_alone = states["a alone"]
    assert a_alone["node1"]["pid"] == after_stop["node1"]["pid"]
    assert a_alone["node1"]["router"]["admin"] == "ready", a_alone["node1"]["router"]
    assert a_alone["node2"]["pid"] == states["before"]["node2"]["pid"]
    # 3. `--limit kimi_replica_b`: b restarted with the flag, a untouched; both in the router.
    assert results["b alone"].rc == 0, results["b alone"].failure_messages()
    b_alone = states["b alone"]
    assert b_alone["node2"]["pid"] != states["before"]["node2"]["pid"] and b_alone["node2"]["new_flag"]
    assert b_alone["node1"]["pid"] == after_stop["node1"]["pid"]
    for replica in ("a", "b"):
        assert router_state(lab, replica)["status"].startswith("UP")

    latencies, failures = outcome["latencies"], outcome["failures"]
    p99 = statistics.quantiles(latencies, n=100)[98] if len(latencies) >= 2 else float("nan")
    record = {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "what": (
            "rolling.yml flag change on two single-node lab replicas behind the router, streamed load: a rollout "
            "stopped at replica a (failing verify), then a and b each with --limit"
        ),
        "rollout_s": round(rollout_s, 1),
        "steps_s": {step: round(seconds, 1) for step, seconds in took.items()},
        "requests": len(latencies) + len(failures),
        "failed": len(failures),
        "concurrency": LOAD_CONCURRENCY,
        "max_tokens": LOAD_MAX_TOKENS,
        "latency_p50_s": round(statistics.median(latencies), 3) if latencies else None,
        "latency_p99_s": round(p99, 3),
        "latency_max_s": round(max(latencies), 3) if latencies else None,
    }
    BENCH_RECORD.parent.mkdir(parents=True, exist_ok=True)
    BENCH_RECORD.write_text(json.dumps(record, indent=2) + "\n")
    print(f"rollout under load: {json.dumps(record)}")
    assert failures == [], failures[:10]
    assert len(latencies) > 10, "the load did not flow during the rollout"
    assert len(latencies) + len(failures) < LOAD_MAX_REQUESTS, "the load ran out before the rollout ended"
