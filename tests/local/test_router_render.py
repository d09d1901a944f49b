"""The router role on this host, for real where it can be: its tasks (main.yml with router_manage_services false:
every file, no package, no systemd) write the certificate, the client keys and haproxy.cfg into a temporary
directory, each checked by Debian's own haproxy (`haproxy -c`) as on a router host; a second run changes nothing;
no key ever appears in the runs' events, --check --diff included; bad inputs are refused by name before anything
is written. Then the rendered configuration runs: haproxy (as the package runs it: root, chrooted, then user
haproxy) on loopback in front of two stand-in replicas (tiny HTTP servers, one failing its health check), and a
client over TLS that trusts only the test's own certificate proves the front door's contract, and drain.yml and
ready.yml move a replica out (waiting for its request in flight) and back.

Needs root (haproxy chroots and drops to user haproxy, the files are root:haproxy), Debian 12's haproxy
(`apt-get install haproxy`; CI's host packages must include it) and openssl; skips without them.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import shutil
import socket
import ssl
import stat
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from tests.ansible_run import REPO_ROOT, PlayResult, run_playbook
from tests.node_programs import haproxy_ctl

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
OPENSSL = shutil.which("openssl")
pytestmark = [
    pytest.mark.skipif(not Path(HAPROXY).exists(), reason="no haproxy (apt-get install haproxy)"),
    pytest.mark.skipif(OPENSSL is None, reason="no openssl"),
    pytest.mark.skipif(os.geteuid() != 0, reason="haproxy chroots and drops to user haproxy: needs root"),
]

CLIENT_KEYS = ["client-key-0123456789", "second.client+key/=~_-"]
BACKEND_KEY = "backend-key-9876543210"
SECRETS = [*CLIENT_KEYS, BACKEND_KEY]
MODEL = "kimi-k2"
# Two replicas of two nodes each; each rank 0 has its own loopback address (the same API port, as on a cluster).
REPLICAS = {"r1": ["node1", "node2"], "r2": ["node3", "node4"]}
ADDRESSES = {"node1": "127.0.0.11", "node2": "127.0.0.12", "node3": "127.0.0.13", "node4": "127.0.0.14"}
CLIENT_MARK = "client request"
RANGES_TASK = (
    "Refuse a body limit, rate limit, TLS version or session setting out of range (before anything is installed)"
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def tls_pair(directory: Path) -> tuple[str, str, Path]:
    """A throwaway self-signed certificate for 127.0.0.1: (certificate PEM, key PEM, certificate file)."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    request = "req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=kimi-router-test -addext subjectAltName=IP:127.0.0.1"
    subprocess.run(
        [OPENSSL, *request.split(), "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert.read_text(), key.read_text(), cert


# ---------------------------------------------------------------------------------------------------------
# The role's tasks on this host
# ---------------------------------------------------------------------------------------------------------

PLAYBOOK = """\
---
- name: The router role's {entry} on this host
  hosts: {hosts}
  gather_facts: {facts}
  gather_subset: [min]
  vars_files:
    - {repo}/roles/kimi/defaults/main.yml
    - {repo}/roles/kimi/vars/main.yml
  tasks:
    - name: Run the router role's {entry}
      ansible.builtin.include_role:
        name: router
        tasks_from: {entry}
"""


@dataclass
class Site:
    """Everything the role's runs need: the directory, the inventory, the paths and the variables."""

    root: Path
    port: int
    certificate: str
    key: str
    cert_file: Path
    inventory: Path = field(init=False)

    def __post_init__(self) -> None:
        local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
        nodes = {name: {"ansible_host": "127.0.0.1", "kimi_cluster_address": a} for name, a in ADDRESSES.items()}
        inventory = {
            "all": {
                "children": {
                    "kimi_router": {"hosts": {"router1": local}},
                    "kimi_nodes": {"hosts": nodes},
                }
            }
        }
        self.inventory = self.root / "hosts.yml"
        self.inventory.write_text(yaml.safe_dump(inventory))

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def config(self) -> Path:
        return self.etc / "haproxy.cfg"

    @property
    def socket(self) -> Path:
        return self.root / "admin.sock"

    def ctl(self) -> list[str]:
        script = REPO_ROOT / "roles" / "router" / "files" / "kimi-haproxy-ctl"
        return [sys.executable, str(script), "--socket", str(self.socket), "--backend", "kimi_replicas"]

    def variables(self, **extra: object) -> dict[str, object]:
        return {
            "kimi_replicas": REPLICAS,
            "kimi_api_port": self.port + 1,
            "kimi_served_model_name": MODEL,
            "kimi_api_key": BACKEND_KEY,
            "kimi_router_port": self.port,
            "kimi_router_api_keys": CLIENT_KEYS,
            "router_tls_certificate": self.certificate,
            "router_tls_key": self.key,
            "router_bind_address": "127.0.0.1",
            "router_health_interval": 1,
            "router_health_timeout": 1,
            "router_health_fall": 2,
            "router_health_rise": 1,
            "router_drain_timeout": 20,
            "router_ready_timeout": 20,
            "router_manage_services": False,
            "router_admin_socket": str(self.socket),
            # The role's own paths (vars/main.yml), moved into the test's directory.
            "router_config_file": str(self.config),
            "router_pem_file": str(self.etc / "kimi-router.pem"),
            "router_api_keys_file": str(self.etc / "kimi-api-keys.lst"),
            "router_server_state_file": str(self.root / "server-state"),
            "router_ctl": str(self.root / "kimi-haproxy-ctl"),
            "router_ctl_command": self.ctl(),
            "router_poll_interval": 1,
            **extra,
        }

    def run(self, entry: str = "main", *, check: bool = False, diff: bool = False, **extra: object) -> PlayResult:
        hosts, facts = ("kimi_router", "true") if entry == "main" else ("router1", "false")
        playbook = self.root / f"{entry}.yml"
        playbook.write_text(PLAYBOOK.format(entry=entry, hosts=hosts, facts=facts, repo=REPO_ROOT))
        return run_playbook(
            playbook, self.inventory, extravars=self.variables(**extra), check=check, diff=diff, timeout=300
        )


def leaked(outcome: PlayResult) -> list[str]:
    text = json.dumps(outcome.events)
    return [secret for secret in SECRETS if secret in text]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Site:
    root = tmp_path_factory.mktemp("router")
    root.chmod(0o755)  # haproxy's user reads nothing here, but the chroot check walks the path
    (root / "etc").mkdir()
    certificate, key, cert_file = tls_pair(root)
    return Site(root=root, port=free_port(), certificate=certificate, key=key, cert_file=cert_file)


@pytest.fixture(scope="module")
def written(site) -> tuple[PlayResult, PlayResult]:
    first = site.run()
    assert first.rc == 0, first.failure_messages()
    return first, site.run()


def test_the_files_are_written_with_their_modes_and_owners(site, written):
    import grp

    haproxy_gid = grp.getgrnam("haproxy").gr_gid
    expected = {
        site.etc / "kimi-router.pem": (0o600, 0),
        site.etc / "kimi-api-keys.lst": (0o640, haproxy_gid),
        site.config: (0o640, haproxy_gid),
        site.root / "kimi-haproxy-ctl": (0o755, 0),
        site.root / "server-state": (0o644, 0),
    }
    for path, (mode, gid) in expected.items():
        info = path.stat()
        assert (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid) == (mode, 0, gid), path
    assert (site.etc / "kimi-api-keys.lst").read_text() == "".join(f"Bearer {key}\n" for key in CLIENT_KEYS)
    pem = (site.etc / "kimi-router.pem").read_text()
    assert pem == f"{site.certificate.strip()}\n{site.key.strip()}\n"
    shipped = REPO_ROOT / "roles" / "router" / "files" / "kimi-haproxy-ctl"
    assert (site.root / "kimi-haproxy-ctl").read_bytes() == shipped.read_bytes()


def test_a_second_run_changes_nothing(written):
    _, again = written
    assert again.rc == 0 and again.changed == 0


def test_the_configuration_passes_haproxy_check_without_a_warning(site, written):
    checked = subprocess.run([HAPROXY, "-c", "-f", str(site.config)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stderr
    assert "WARNING" not in checked.stderr and "ALERT" not in checked.stderr, checked.stderr


def test_the_servers_come_from_kimi_replicas_and_each_rank_0s_address(site, written):
    config = site.config.read_text()
    assert f"server r1 127.0.0.11:{site.port + 1}\n" in config
    assert f"server r2 127.0.0.13:{site.port + 1}\n" in config
    # No monitoring group: the first replica's rank 0 is the monitoring host (kimi_monitoring_hosts).
    assert "acl kimi_from_monitoring src 127.0.0.11\n" in config
    check = next(line for line in config.splitlines() if "http-check send" in line)
    assert "meth POST uri /v1/completions" in check
    assert f"""body '{{"model": "{MODEL}", "prompt": "ping", "max_tokens": 1}}'""" in check
    assert "default-server check inter 1s fall 2 rise 1" in config
    assert "timeout server 3600s" in config and "timeout client 3600s" in config


def test_no_key_appears_in_any_run_or_check_mode_diff(site, written):
    first, again = written
    assert leaked(first) == [] and leaked(again) == []
    # Different keys and certificate: every secret task would change, so --diff has something to show.
    _, other_key, _ = tls_pair(site.root / "etc")
    rotated = site.run(
        check=True,
        diff=True,
        kimi_router_api_keys=["rotated-client-key"],
        kimi_api_key="rotated-backend-key",
        router_tls_key=other_key,
    )
    assert rotated.rc == 0, rotated.failure_messages()
    assert rotated.changed >= 3
    text = json.dumps(rotated.events)
    for secret in ["rotated-client-key", "rotated-backend-key", *SECRETS, other_key.splitlines()[1]]:
        assert secret not in text
    assert (site.etc / "kimi-api-keys.lst").read_text().count("Bearer client-key-0123456789") == 1


@pytest.mark.parametrize(
    ("extra", "task", "words"),
    [
        (
            {"router_tls_certificate": ""},
            "Refuse an empty or non-PEM certificate (before anything is installed)",
            ["router_tls_certificate is empty on router1"],
        ),
        (
            {"router_tls_key": "not a key"},
            "Refuse an empty or non-PEM private key (before anything is installed)",
            ["router_tls_key is not PEM text on router1"],
        ),
        (
            {"kimi_router_api_keys": ["good-key", "bad key with spaces", "newline-after-it\n"]},
            "Refuse missing or unusable API keys (before anything is installed)",
            ["On router1: kimi_router_api_keys", "2 of its 3 keys hold other characters"],
        ),
        (
            {"kimi_router_api_keys": []},
            "Refuse missing or unusable API keys (before anything is installed)",
            ["kimi_router_api_keys must be a list of at least one key"],
        ),
        (
            {"router_deb_pins": {"trixie": {"haproxy": "3.0"}}},
            "Refuse a distribution release without a haproxy pin (before anything is installed)",
            ["router_deb_pins has no entry for bookworm on router1"],
        ),
        (
            {"kimi_replicas": {"r1": ["node1"], "r9": ["node9"]}},
            "Refuse replicas haproxy cannot name or reach (before anything is installed)",
            ["No address for r9 (rank 0: node9)"],
        ),
        (
            # As -e gives them: strings.
            {"router_max_body_bytes": "100", "router_rate_limit_window": "0", "router_rate_limit_requests": "-1"},
            RANGES_TASK,
            [
                "router1: router_max_body_bytes is 100: a number of bytes from 1024",
                "router_rate_limit_requests is -1",
                "router_rate_limit_window is 0: seconds from 1 to 86400",
            ],
        ),
        (
            {"kimi_router_session_header": "X Session", "router_session_balance_factor": "3"},
            RANGES_TASK,
            [
                "router1: kimi_router_session_header is 'X Session': an HTTP header name of letters, digits",
                "router1: router_session_balance_factor is 3.0: a number from 1.01 to 2.0",
            ],
        ),
        (
            {"router_tls_ciphers": ["ECDHE-RSA-AES128-GCM-SHA256 ssl-min-ver TLSv1.0"], "router_tls_curves": []},
            "Refuse a TLS profile haproxy could not read (before anything is installed)",
            ['not read as one word: "ECDHE-RSA-AES128-GCM-SHA256 ssl-min-ver TLSv1.0"', "router_tls_curves must not"],
        ),
        (
            {"router_tls_min_version": "TLSv1.1"},
            "Validating arguments against arg spec 'main'",  # then the spec's short description
            ["router_tls_min_version must be one of: TLSv1.2, TLSv1.3, got: TLSv1.1"],
        ),
    ],
    ids=[
        "empty-certificate",
        "not-pem-key",
        "key-characters",
        "no-key",
        "release",
        "replica-without-address",
        "abuse-limits",
        "session-affinity",
        "tls-names",
        "tls-version",
    ],
)
def test_bad_inputs_are_refused_by_name_before_anything_is_written(tmp_path, site, extra, task, words):
    fresh = Site(root=tmp_path, port=site.port, certificate=site.certificate, key=site.key, cert_file=site.cert_file)
    (tmp_path / "etc").mkdir()
    outcome = fresh.run(**extra)
    assert outcome.rc != 0
    (failure,) = outcome.failures
    assert failure["task"].startswith(task)
    for word in words:
        assert word in failure["msg"]
    events = json.dumps(outcome.events)
    assert "bad key with spaces" not in events and "newline-after-it" not in events
    assert list((tmp_path / "etc").iterdir()) == []


def test_a_key_that_does_not_match_the_certificate_is_refused_before_it_replaces_the_pem(tmp_path, site):
    _, other_key, _ = tls_pair(tmp_path)
    fresh = Site(root=tmp_path, port=site.port, certificate=site.certificate, key=other_key, cert_file=site.cert_file)
    (tmp_path / "etc").mkdir()
    outcome = fresh.run()
    assert outcome.rc != 0
    # The PEM task fails with its output hidden (no_log); its rescue says why.
    hidden, failure = outcome.failures
    assert hidden["task"] == "Write the certificate and its key as one PEM (haproxy loads it first)"
    assert failure["task"] == "Say which file haproxy refused (what it handles is not shown)"
    said = "router_tls_certificate and router_tls_key are not a certificate and its matching private key"
    assert said in failure["msg"]
    assert "inconsistencies between private key and certificate" in failure["msg"]
    assert other_key.splitlines()[1] not in json.dumps(outcome.events)
    assert list((tmp_path / "etc").iterdir()) == []


@pytest.mark.parametrize("entry", ["drain", "ready"])
def test_a_host_without_the_router_set_up_has_nothing_to_drain_or_put_back(site, written, entry):
    outcome = site.run(entry, router_server="r1", router_ctl=str(site.root / "not-installed"))
    assert outcome.rc == 0 and outcome.changed == 0, outcome.failure_messages()


# ---------------------------------------------------------------------------------------------------------
# The rendered configuration, running
# ---------------------------------------------------------------------------------------------------------


class QuietServer(ThreadingHTTPServer):
    """haproxy's health checks close their connection as soon as they have the status: not an error here."""

    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        pass


class Replica:
    """A stand-in for one replica's rank 0: /v1/completions answers `status` (settable), records what it got; a
    request whose prompt is "hold" waits until released, one whose prompt is "stream" sends a first event and
    waits until released before the last."""

    def __init__(self, address: str, port: int, status: int) -> None:
        self.status = status
        self.requests: list[dict[str, object]] = []
        self.release = threading.Event()
        self.holding = threading.Event()
        replica = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = json.loads(self.read_body() or b"{}")
                replica.requests.append({"auth": self.headers.get("Authorization"), "body": body})
                prompt = body.get("prompt")
                try:
                    if prompt == "stream":
                        self.stream()
                        return
                    if prompt == "hold":
                        replica.holding.set()
                        replica.release.wait(20)
                    self.answer(replica.status, {"choices": [{"text": "pong"}], "served_by": address})
                except (BrokenPipeError, ConnectionResetError):  # haproxy's checks close after the status
                    pass

            def read_body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() != "chunked":
                    return self.rfile.read(int(self.headers.get("Content-Length", 0)))
                data = b""
                while size := int(self.rfile.readline().split(b";")[0], 16):
                    data += self.rfile.read(size)
                    self.rfile.readline()
                self.rfile.readline()  # the empty line after the last chunk (no trailers here)
                return data

            def answer(self, status: int, document: dict) -> None:
                data = json.dumps(document).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def stream(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for event in (b"data: first\n\n", None, b"data: [DONE]\n\n", b""):
                    if event is None:
                        replica.release.wait(10)
                        continue
                    self.wfile.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
                    self.wfile.flush()

            def log_message(self, *args: object) -> None:
                pass

        self.server = QuietServer((address, port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def client_requests(self) -> list[dict[str, object]]:
        return [r for r in self.requests if r["body"].get("prompt") != "ping"]

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Router:
    site: Site
    process: subprocess.Popen
    replicas: dict[str, Replica]
    context: ssl.SSLContext

    def request(
        self,
        method: str,
        path: str,
        *,
        key: str | None = None,
        body: dict | None = None,
        source: str = "127.0.0.1",
        extra_headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:
        connection = http.client.HTTPSConnection(
            "127.0.0.1", self.site.port, context=self.context, timeout=30, source_address=(source, 0)
        )
        headers = {"Content-Type": "application/json", **(extra_headers or {})}
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        try:
            connection.request(method, path, body=json.dumps(body) if body else None, headers=headers)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def completion(
        self, prompt: str = CLIENT_MARK, key: str = CLIENT_KEYS[0], session: str | None = None
    ) -> tuple[int, dict]:
        headers = {"X-Session-ID": session} if session is not None else None
        body = {"model": MODEL, "prompt": prompt}
        status, data = self.request("POST", "/v1/completions", key=key, body=body, extra_headers=headers)
        return status, json.loads(data)

    def served_by(self, session: str | None = None) -> str:
        status, answer = self.completion(session=session)
        assert status == 200, answer
        return str(answer["served_by"])

    def raw(self, head: bytes, body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
        """One HTTP/1.1 request written byte for byte (a chunked body, a body cut short): the router may answer
        and close before it has read the whole body, so a write that fails is no error; the answer is read."""
        address = ("127.0.0.1", self.site.port)
        with (
            socket.create_connection(address, timeout=15) as plain,
            self.context.wrap_socket(plain, server_hostname="127.0.0.1") as tls,
        ):
            with contextlib.suppress(OSError):
                tls.sendall(head + body)
            response = http.client.HTTPResponse(tls)
            response.begin()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()

    def show(self, server: str) -> dict:
        done = subprocess.run([*self.site.ctl(), "show", server], capture_output=True, text=True, check=True)
        return json.loads(done.stdout)

    def admin(self, command: str) -> str:
        """One command on haproxy's admin socket, through kimi-haproxy-ctl's own call (in process)."""
        return haproxy_ctl().runtime_api(str(self.site.socket), command)

    def wait_idle(self, timeout: float = 5) -> None:
        """Until haproxy counts no request in flight on any replica (each server with its trackers, as
        kimi-haproxy-ctl reads them). The client has its answer a moment before haproxy frees the request's slot;
        consistent hashing's load bound counts that slot, so a request sent in that moment can be moved off its
        session's replica (with two replicas and bound 1.25, one request still counted on r1 leaves r1 one slot,
        and it is taken)."""
        deadline = time.monotonic() + timeout
        while True:
            in_flight = {name: haproxy_ctl().read_server(self.admin, "kimi_replicas", name).scur
                         for name in self.replicas}  # fmt: skip
            if not any(in_flight.values()):
                return
            assert time.monotonic() < deadline, in_flight
            time.sleep(0.02)

    def wait_status(self, server: str, wanted: str, timeout: float = 10) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            view = self.show(server)
            if view["status"] == wanted or time.monotonic() > deadline:
                assert view["status"] == wanted, view
                return view
            time.sleep(0.2)


@contextlib.contextmanager
def running_router(site: Site, statuses: dict[str, int]) -> Iterator[Router]:
    """haproxy on the site's rendered configuration, in front of a stand-in for each replica's rank 0."""
    api_port = site.port + 1
    replicas = {name: Replica(ADDRESSES[REPLICAS[name][0]], api_port, status) for name, status in statuses.items()}
    log = (site.root / "haproxy.log").open("w")
    # -db: in the foreground, without the systemd unit; otherwise as the package runs it (the same file).
    process = subprocess.Popen([HAPROXY, "-db", "-f", str(site.config)], stdout=log, stderr=subprocess.STDOUT)
    context = ssl.create_default_context(cafile=str(site.cert_file))
    started = Router(site=site, process=process, replicas=replicas, context=context)
    try:
        deadline = time.monotonic() + 10
        while not site.socket.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert process.poll() is None, (site.root / "haproxy.log").read_text()
        yield started
    finally:
        process.kill()  # only the haproxy this test started, by its PID
        process.wait(10)
        log.close()
        for replica in replicas.values():
            replica.stop()


@pytest.fixture(scope="module")
def router(site, written) -> Iterator[Router]:
    with running_router(site, {"r1": 200, "r2": 500}) as started:
        yield started


def test_the_router_proves_its_contract(router):
    site = router.site
    # The failing replica is taken out by its health check (a real completion answered 500).
    down = router.wait_status("r2", "DOWN")
    assert (down["check_status"], down["check_code"]) == ("L7STS", "500")
    assert router.wait_status("r1", "UP")["check_status"] == "L7OK"
    checks = [r for r in router.replicas["r1"].requests if r["body"].get("prompt") == "ping"]
    assert checks[0] == {"auth": f"Bearer {BACKEND_KEY}", "body": {"model": MODEL, "prompt": "ping", "max_tokens": 1}}

    # Keys: none or a wrong one is 401 with an OpenAI-shaped error; either configured key is served.
    for key in (None, "wrong-key", CLIENT_KEYS[0][:-1]):
        status, data = router.request("POST", "/v1/completions", key=key, body={"prompt": CLIENT_MARK})
        assert status == 401 and json.loads(data)["error"]["code"] == "invalid_api_key"
    assert router.request("GET", "/v1/models")[0] == 401
    for key in CLIENT_KEYS * 3:
        status, answer = router.completion(key=key)
        assert (status, answer["served_by"]) == (200, "127.0.0.11")
    # The replicas got the backend key, never a client's, and the failing one got no client request.
    sent = router.replicas["r1"].client_requests()
    assert len(sent) == 6 and {r["auth"] for r in sent} == {f"Bearer {BACKEND_KEY}"}
    assert router.replicas["r2"].client_requests() == []

    # /health needs no key; /metrics only from a monitoring host (127.0.0.11 is r1's rank 0), even with a key.
    assert router.request("GET", "/health")[0] == 200
    assert router.request("GET", "/metrics", key=CLIENT_KEYS[0])[0] == 403
    status, metrics = router.request("GET", "/metrics", source="127.0.0.11")
    assert status == 200 and b'haproxy_server_status{proxy="kimi_replicas",server="r1"' in metrics

    # A stream's first event arrives while the replica still holds the rest back (nothing buffers it).
    replica = router.replicas["r1"]
    connection = http.client.HTTPSConnection("127.0.0.1", site.port, context=router.context, timeout=5)
    connection.request(
        "POST",
        "/v1/completions",
        body=json.dumps({"prompt": "stream", "stream": True}),
        headers={"Authorization": f"Bearer {CLIENT_KEYS[0]}", "Content-Type": "application/json"},
    )
    response = connection.getresponse()
    assert response.status == 200
    assert response.readline() == b"data: first\n"
    replica.release.set()
    assert b"data: [DONE]" in response.read()
    connection.close()
    replica.release.clear()

    # The failed replica mends: its health check puts it back, and it gets requests again.
    router.replicas["r2"].status = 200
    router.wait_status("r2", "UP")
    served = {router.completion()[1]["served_by"] for _ in range(6)}
    assert served == {"127.0.0.11", "127.0.0.13"}


def test_drain_waits_for_the_request_in_flight_then_ready_puts_the_replica_back(router):
    site, r1 = router.site, router.replicas["r1"]
    router.replicas["r2"].status = 200
    router.wait_status("r2", "UP")
    assert router.wait_status("r1", "UP")

    # Check mode reports the change and changes nothing.
    dry = site.run("drain", check=True, router_server="r1")
    assert dry.rc == 0 and dry.changed > 0, dry.failure_messages()
    assert router.show("r1")["admin"] == "ready"

    # A request holds r1 while it is drained: drain.yml waits for it, then puts r1 in maintenance.
    held: dict[str, object] = {}
    holder = threading.Thread(target=lambda: held.update(answer=router.completion("hold")))
    r1.release.clear()
    holder.start()
    assert r1.holding.wait(5)
    draining: dict[str, PlayResult] = {}
    drainer = threading.Thread(target=lambda: draining.update(outcome=site.run("drain", router_server="r1")))
    drainer.start()
    view = router.wait_status("r1", "DRAIN")
    assert view["scur"] == 1 and view["admin"] == "drain"
    # New requests go to r2 only while r1 drains.
    assert {router.completion()[1]["served_by"] for _ in range(4)} == {"127.0.0.13"}
    time.sleep(1.5)
    assert drainer.is_alive(), "drain.yml did not wait for the request in flight"
    r1.release.set()
    holder.join(10)
    drainer.join(60)
    assert held["answer"][0] == 200
    outcome = draining["outcome"]
    assert outcome.rc == 0 and outcome.changed == 2, outcome.failure_messages()
    assert router.show("r1")["admin"] == "maint" and router.show("r1")["status"] == "MAINT"
    # Again: already out, nothing to do.
    again = site.run("drain", router_server="r1")
    assert again.rc == 0 and again.changed == 0, again.failure_messages()

    # The servers' states survive a reload: saved, then loaded by a new haproxy.
    saved = subprocess.run([*site.ctl(), "save-state", str(site.root / "server-state")], capture_output=True)
    assert saved.returncode == 0
    assert " r1 " in (site.root / "server-state").read_text()

    # With r1 out and r2 failing, no replica is up: /health says 503 and requests get a JSON 503.
    router.replicas["r2"].status = 500
    router.wait_status("r2", "DOWN")
    assert router.request("GET", "/health")[0] == 503
    status, answer = router.completion()
    assert status == 503 and answer["error"]["code"] == "service_unavailable"
    router.replicas["r2"].status = 200

    # ready.yml: check mode changes nothing; then r1 is checked in drain, set ready and UP; again changes nothing.
    dry = site.run("ready", check=True, router_server="r1")
    assert dry.rc == 0 and dry.changed > 0, dry.failure_messages()
    assert router.show("r1")["admin"] == "maint"
    ready = site.run("ready", router_server="r1")
    assert ready.rc == 0 and ready.changed == 2, ready.failure_messages()
    view = router.show("r1")
    assert (view["admin"], view["status"]) == ("ready", "UP")
    assert router.request("GET", "/health")[0] == 200
    again = site.run("ready", router_server="r1")
    assert again.rc == 0 and again.changed == 0, again.failure_messages()


def test_ready_fails_with_the_last_check_when_the_replica_stays_broken(router):
    router.replicas["r2"].status = 503
    router.wait_status("r2", "DOWN")
    outcome = router.site.run("ready", router_server="r2", router_ready_timeout=2)
    assert outcome.rc != 0
    (failure,) = outcome.failures
    assert "r2 did not pass its health check" in failure["msg"]
    assert "L7STS 503" in failure["msg"]
    router.replicas["r2"].status = 200


def test_an_unknown_replica_is_named_with_the_ones_the_router_has(router):
    outcome = router.site.run("drain", router_server="r7")
    assert outcome.rc != 0
    (failure,) = outcome.failures
    assert "no server 'r7' in backend 'kimi_replicas' (it has: r1, r2)" in failure["msg"]


def test_a_mismatched_key_is_refused_by_the_pem_check(site, written, tmp_path):
    _, other_key, _ = tls_pair(tmp_path)
    pem = tmp_path / "mismatch.pem"
    pem.write_text(site.certificate + other_key)
    assert haproxy_ctl().main(["check-pem", str(pem), "--haproxy", HAPROXY]) == 1
    good = tmp_path / "good.pem"
    good.write_text(site.certificate + site.key)
    assert haproxy_ctl().main(["check-pem", str(good), "--haproxy", HAPROXY]) == 0


# ---------------------------------------------------------------------------------------------------------
# A front door that holds under abuse (issue 26, item 5): the TLS profile, the body limit, the per-key rate,
# chat_template. The module's site renders the defaults; a second site renders small limits, given as -e gives
# them (strings), so that a burst stays short and the tests above never meet them.
# ---------------------------------------------------------------------------------------------------------

BURST_KEY = "burst-key-0123456789"
LIMITS = {
    "router_max_body_bytes": "4096",
    "router_rate_limit_requests": "5",
    "router_rate_limit_window": "10",
    "router_tls_curves": "X25519,prime256v1",
}
DEFAULT_MAX_BODY = 4194304
MOZILLA_INTERMEDIATE_CIPHERS = (
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:"
    "ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305"
)


def request_head(path: str, key: str, headers: dict[str, str | int]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Authorization: Bearer {key}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def chunked(data: bytes, size: int = 1000) -> bytes:
    pieces = [data[at : at + size] for at in range(0, len(data), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces) + b"0\r\n\r\n"


def completion_body(size: int) -> bytes:
    """A JSON completion request of exactly `size` bytes."""
    empty = json.dumps({"model": MODEL, "prompt": ""}).encode()
    return json.dumps({"model": MODEL, "prompt": "x" * (size - len(empty))}).encode()


def handshake(context: ssl.SSLContext, port: int) -> tuple[str, str] | str:
    """(version, cipher) of a TLS handshake with the router, or the reason OpenSSL gives for its failure."""
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=10) as plain,
            context.wrap_socket(plain, server_hostname="127.0.0.1") as tls,
        ):
            return tls.version(), tls.cipher()[0]
    except ssl.SSLError as error:
        return error.reason


def client_context(site: Site, version: ssl.TLSVersion, ciphers: str | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(site.cert_file))
    with warnings.catch_warnings():  # TLS 1.0 and 1.1 are deprecated in Python too: offering it is the point
        warnings.simplefilter("ignore", DeprecationWarning)
        context.minimum_version = context.maximum_version = version
    if ciphers:
        context.set_ciphers(ciphers)
    return context


def another_site(site: Site, tmp_path_factory, name: str) -> Site:
    """A second router site beside the module's own (its own directory and port, the same certificate)."""
    root = tmp_path_factory.mktemp(name)
    root.chmod(0o755)
    (root / "etc").mkdir()
    return Site(root=root, port=free_port(), certificate=site.certificate, key=site.key, cert_file=site.cert_file)


@pytest.fixture(scope="module")
def limited(site, written, tmp_path_factory) -> Iterator[Router]:
    other = another_site(site, tmp_path_factory, "router-limits")
    outcome = other.run(kimi_router_api_keys=[*CLIENT_KEYS, BURST_KEY], **LIMITS)
    assert outcome.rc == 0, outcome.failure_messages()
    with running_router(other, {"r1": 200, "r2": 200}) as started:
        yield started


def sent_counts(router: Router) -> dict[str, int]:
    return {name: len(replica.client_requests()) for name, replica in router.replicas.items()}


def sent_since(router: Router, counts: dict[str, int]) -> list[dict[str, object]]:
    """The client requests the replicas got since `counts` (sent_counts), replica by replica."""
    return [r for name, replica in router.replicas.items() for r in replica.client_requests()[counts[name] :]]


def test_the_tls_profile_and_the_limits_are_rendered_from_the_defaults(site, written):
    config = site.config.read_text()
    assert f"    ssl-default-bind-ciphers {MOZILLA_INTERMEDIATE_CIPHERS}\n" in config
    suites = "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256"
    assert f"    ssl-default-bind-ciphersuites {suites}\n" in config
    assert "    ssl-default-bind-curves X25519:prime256v1:secp384r1\n" in config
    assert "    ssl-default-bind-options prefer-client-ciphers ssl-min-ver TLSv1.2 no-tls-tickets\n" in config
    assert f"if {{ req.hdr_val(content-length) gt {DEFAULT_MAX_BODY} }}" in config
    assert "store gpc0_rate(60s)" in config and "if { sc_gpc0_rate(0) ge 600 }" in config
    assert "hdr Retry-After 60 " in config
    assert "http-request track-sc0 req.fhdr(authorization),sha2(256)\n" in config
    # The key check comes first: a request without a valid key is 401 before any limit is applied.
    rules = [line.split(" if ")[0] for line in config.splitlines() if line.startswith("    http-request ")]
    statuses = [rule.split("status ")[1][:3] for rule in rules if "return status" in rule]
    assert statuses == ["403", "401", "413", "413", "413", "400", "429"], statuses


def test_limits_given_as_strings_as_e_gives_them_are_numbers_and_lists(limited):
    config = limited.site.config.read_text()
    assert "if { req.hdr_val(content-length) gt 4096 }" in config and "if { sc_gpc0_rate(0) ge 5 }" in config
    assert "store gpc0_rate(10s)" in config and "expire 20s" in config and "hdr Retry-After 10 " in config
    assert "    ssl-default-bind-curves X25519:prime256v1\n" in config


def test_tls_is_mozillas_intermediate_profile(router):
    site = router.site
    # TLS 1.0 and 1.1: the router answers with a protocol_version alert (the client offered them).
    for old in (ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1):
        assert handshake(client_context(site, old, "DEFAULT:@SECLEVEL=0"), site.port) == "TLSV1_ALERT_PROTOCOL_VERSION"
    # TLS 1.2 with a cipher outside the profile (CBC, no AEAD): handshake_failure; with one of the profile: served.
    cbc = client_context(site, ssl.TLSVersion.TLSv1_2, "ECDHE-RSA-AES128-SHA256")
    assert handshake(cbc, site.port) == "SSLV3_ALERT_HANDSHAKE_FAILURE"
    no_forward_secrecy = client_context(site, ssl.TLSVersion.TLSv1_2, "AES128-GCM-SHA256")
    assert handshake(no_forward_secrecy, site.port) == "SSLV3_ALERT_HANDSHAKE_FAILURE"
    for cipher in ("ECDHE-RSA-AES128-GCM-SHA256", "ECDHE-RSA-CHACHA20-POLY1305"):
        assert handshake(client_context(site, ssl.TLSVersion.TLSv1_2, cipher), site.port) == ("TLSv1.2", cipher)
    # TLS 1.3: served, with one of its three suites.
    version, suite = handshake(client_context(site, ssl.TLSVersion.TLSv1_3), site.port)
    assert version == "TLSv1.3" and suite in {"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384",
                                                "TLS_CHACHA20_POLY1305_SHA256"}  # fmt: skip


def test_a_body_over_the_limit_is_refused_413_announced_or_chunked(router, limited):
    key = CLIENT_KEYS[0]
    before = sent_counts(limited)
    json_type = {"Content-Type": "application/json"}

    def refused(outcome: tuple[int, dict[str, str], bytes], words: str) -> bool:
        status, _, data = outcome
        error = json.loads(data)["error"]
        return status == 413 and error["code"] == "request_too_large" and words in error["message"]

    # Content-Length over router_max_body_bytes (4096 here): 413 on the headers, before the body is read.
    over = request_head("/v1/completions", key, {**json_type, "Content-Length": 4097})
    assert refused(limited.raw(over, b"x" * 100), "larger than 4096 bytes")
    # Under it: passed on whole.
    body = completion_body(4000)
    assert limited.raw(request_head("/v1/completions", key, {**json_type, "Content-Length": len(body)}), body)[0] == 200
    # Chunked (no Content-Length): a small body received whole is passed on; one over the limit is 413; one
    # bigger than haproxy holds is 413 whatever the limit, as is a small one behind 9 KiB of headers.
    head = request_head("/v1/completions", key, {**json_type, "Transfer-Encoding": "chunked"})
    assert limited.raw(head, chunked(completion_body(3000)))[0] == 200
    assert refused(limited.raw(head, chunked(completion_body(6000))), "larger than 4096 bytes")
    assert refused(limited.raw(head, chunked(completion_body(20000))), "without Content-Length")
    padded = request_head("/v1/completions", key, {**json_type, "Transfer-Encoding": "chunked", "X-Pad": "p" * 9000})
    assert refused(limited.raw(padded, chunked(completion_body(100))), "without Content-Length")
    assert sorted(len(json.dumps(r["body"])) for r in sent_since(limited, before)) == [3000, 4000]
    # A request without a body is not held to the unknown-length rule, however long its URL (the stand-in
    # answers GET with 501: it got there).
    long_url = "/v1/models?" + "q" * 9000
    get = ("GET " + long_url + f" HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n\r\n").encode()
    assert limited.raw(get)[0] == 501
    # With the defaults (4 MiB): the same rules.
    assert refused(router.raw(request_head("/v1/completions", key, {**json_type, "Content-Length": 4194305}),
                              b"x" * 100), f"larger than {DEFAULT_MAX_BODY} bytes")  # fmt: skip
    default_head = request_head("/v1/completions", key, {**json_type, "Transfer-Encoding": "chunked"})
    assert refused(router.raw(default_head, chunked(completion_body(20000))), "without Content-Length")


def test_chat_template_is_refused_400_however_it_is_spelled_and_chat_template_kwargs_pass(limited):
    key = CLIENT_KEYS[1]
    template = "{% for i in range(99999999) %}{{ i }}{% endfor %}"
    messages = [{"role": "user", "content": "hi"}]
    in_kwargs = {"chat_template": template}
    bodies = [
        json.dumps({"model": MODEL, "messages": messages, "chat_template": template}).encode(),
        json.dumps({"model": MODEL, "messages": messages, "chat_template_kwargs": in_kwargs}).encode(),
        # JSON escapes: the same key to vLLM's parser, with letters (and the underscore, hex in upper case) as \u.
        b'{"model": "kimi-k2", "\\u0063hat_templat\\u0065" : "x", "messages": []}',
        b'{"messages": [], "chat\\u005Ftemplate":"x"}',
    ]
    for body in bodies:
        assert json.loads(body).keys() & {"chat_template", "chat_template_kwargs"}  # what vLLM would read
        length = {"Content-Type": "application/json", "Content-Length": len(body)}
        head = request_head("/v1/chat/completions", key, length)
        status, _, data = limited.raw(head, body)
        error = json.loads(data)["error"]
        assert (status, error["code"], error["param"]) == (400, "chat_template_refused", "chat_template"), body
    # chat_template_kwargs without a template, and the words as text in a message, are passed on.
    before = sent_counts(limited)
    allowed = [
        {"model": MODEL, "messages": messages, "chat_template_kwargs": {"thinking": True}},
        {"model": MODEL, "messages": [{"role": "user", "content": 'what does "chat_template": do?'}]},
    ]
    for body in allowed:
        assert limited.request("POST", "/v1/chat/completions", key=key, body=body)[0] == 200
    passed = [r["body"] for r in sent_since(limited, before)]
    assert len(passed) == 2 and all(body in passed for body in allowed), passed


def test_a_burst_over_the_key_rate_is_refused_429_while_other_keys_are_served(limited):
    before = sent_counts(limited)
    # 8 requests at once from one key against 5 per 10 s: the first 5 are passed on, then 429 with Retry-After.
    answers = [limited.request("POST", "/v1/completions", key=BURST_KEY, body={"prompt": CLIENT_MARK})
               for _ in range(8)]  # fmt: skip
    statuses = [status for status, _ in answers]
    assert statuses[:5] == [200] * 5 and 429 in statuses[5:], statuses
    # haproxy's rate is a sliding average: a period that turns during the burst may let one more through.
    assert statuses.count(200) <= 6 and len(sent_since(limited, before)) == statuses.count(200)
    error = json.loads(next(data for status, data in answers if status == 429))["error"]
    assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limit_exceeded")
    head = request_head("/v1/completions", BURST_KEY, {"Content-Type": "application/json", "Content-Length": 2})
    status, headers, _ = limited.raw(head, b"{}")
    assert (status, headers.get("retry-after")) == (429, "10")
    # Another key is served meanwhile; a missing or wrong key is still 401 first.
    assert limited.request("POST", "/v1/completions", key=CLIENT_KEYS[0], body={"prompt": CLIENT_MARK})[0] == 200
    for key in (None, "wrong-key"):
        assert limited.request("POST", "/v1/completions", key=key, body={"prompt": CLIENT_MARK})[0] == 401
    # haproxy's table holds each key as its SHA-256, never in clear.
    table = limited.admin("show table kimi_api")
    assert hashlib.sha256(f"Bearer {BURST_KEY}".encode()).hexdigest().upper() in table, table
    assert not any(key in table for key in [BURST_KEY, *CLIENT_KEYS]), table


# ---------------------------------------------------------------------------------------------------------
# Session affinity (kimi_router_session_header, router_session_balance_factor; docs/front-door.md)
# ---------------------------------------------------------------------------------------------------------

SESSIONS = [f"agent-session-{number}" for number in range(40)]


@pytest.fixture(scope="module")
def affinity(site, written, tmp_path_factory) -> Iterator[Router]:
    """The router with the role's defaults (affinity on X-Session-ID, bound 1.25) over two healthy replicas."""
    other = another_site(site, tmp_path_factory, "router-affinity")
    outcome = other.run()
    assert outcome.rc == 0, outcome.failure_messages()
    with running_router(other, {"r1": 200, "r2": 200}) as started:
        started.wait_status("r1", "UP")
        started.wait_status("r2", "UP")
        yield started


def test_affinity_is_rendered_from_the_defaults_and_off_when_the_header_is_empty(site, written, tmp_path):
    config = site.config.read_text()
    assert "    use_backend kimi_replicas_by_session if { req.hdr(X-Session-ID) -m len gt 0 }\n" in config
    assert "    balance hdr(X-Session-ID)\n    hash-type consistent\n    hash-balance-factor 125\n" in config
    assert "    server r2 127.0.0.13:" in config and " track kimi_replicas/r2\n" in config
    off = Site(root=tmp_path, port=site.port, certificate=site.certificate, key=site.key, cert_file=site.cert_file)
    (tmp_path / "etc").mkdir()
    outcome = off.run(kimi_router_session_header="", router_session_balance_factor="1.5")
    assert outcome.rc == 0, outcome.failure_messages()
    assert "kimi_replicas_by_session" not in off.config.read_text()


def sessions_home(router: Router) -> dict[str, str]:
    """Where each session is served, each asked with nothing in flight: the load bound then cannot move it, and
    what is seen is the hash's choice alone."""
    homes = {}
    for session in SESSIONS:
        router.wait_idle()
        homes[session] = router.served_by(session)
    return homes


def test_a_session_stays_on_one_replica_and_requests_without_one_are_balanced_by_leastconn(affinity):
    first = sessions_home(affinity)
    assert set(first.values()) == {"127.0.0.11", "127.0.0.13"}, first  # both replicas hold sessions
    assert sessions_home(affinity) == first  # every session back where it was
    # Without the header, or with it empty: leastconn, which takes turns between idle replicas.
    assert {affinity.served_by() for _ in range(6)} == {"127.0.0.11", "127.0.0.13"}
    assert {affinity.served_by(session="") for _ in range(6)} == {"127.0.0.11", "127.0.0.13"}


def test_a_drained_replica_hands_its_sessions_over_and_gets_back_only_its_own(affinity):
    site = affinity.site
    before = sessions_home(affinity)
    drained = site.run("drain", router_server="r1")
    assert drained.rc == 0, drained.failure_messages()
    # The session backend's r1 follows its twin's maintenance.
    assert affinity.show("r1")["trackers"] == ["kimi_replicas_by_session/r1"]
    assert set(sessions_home(affinity).values()) == {"127.0.0.13"}
    ready = site.run("ready", router_server="r1")
    assert ready.rc == 0, ready.failure_messages()
    after = sessions_home(affinity)
    # Consistent hashing: r1's sessions come back to it, r2's never moved; no session changed places.
    assert after == before


def test_one_hot_session_cannot_hold_a_replica_past_the_load_bound(affinity):
    """Six requests of one session at once, each held by its replica: with the bound 1.25 over two replicas, the
    session's replica takes new ones only while it holds at most 1.25 x the average, then the other replica does."""
    replicas = affinity.replicas
    for replica in replicas.values():
        replica.release.clear()
    before = {name: len(replica.client_requests()) for name, replica in replicas.items()}

    def held() -> dict[str, int]:
        return {
            n: sum(1 for r in rep.requests[before[n] :] if r["body"].get("prompt") == "hold")
            for n, rep in replicas.items()
        }

    answers: list[tuple[int, dict]] = []
    threads = []
    for _ in range(6):
        thread = threading.Thread(target=lambda: answers.append(affinity.completion("hold", session="hot-session")))
        thread.start()
        threads.append(thread)
        # One at a time, so that each request is routed with the ones before it in flight.
        deadline = time.monotonic() + 10
        while sum(held().values()) < len(threads) and time.monotonic() < deadline:
            time.sleep(0.05)
    spread = held()
    for replica in replicas.values():
        replica.release.set()
    for thread in threads:
        thread.join(30)
    assert [status for status, _ in answers] == [200] * 6
    # haproxy's bound: a server takes a request while (its requests + 1) <= ceil((in flight + 1) x 1.25 / 2):
    # the session's replica holds 4 of the 6 at most, the other at least 2.
    assert sum(spread.values()) == 6 and min(spread.values()) >= 2, spread
