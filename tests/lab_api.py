"""Talking to the lab's served model from the host, the way a user's client does."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass

RANK0_ADDRESS = "198.18.0.11"
NODE2_ADDRESS = "198.18.0.12"
RANK0_API = f"http://{RANK0_ADDRESS}:8000"
SERVED_MODEL = "kimi-k2"
# inventories/lab's kimi_api_key: the lab serves its API directly (kimi_api_public), and a public API has a key.
LAB_API_KEY = "lab-api-key"


def generates_a_token(timeout: float = 30) -> bool:
    """Rank 0 answers a one-token completion (a group whose headless rank is gone still answers /health)."""
    route = subprocess.run(["ip", "route", "get", RANK0_ADDRESS], capture_output=True, text=True, check=True)
    assert "dev br-lab" in route.stdout, f"{RANK0_ADDRESS} does not route via the lab bridge: {route.stdout}"
    body = json.dumps({"model": SERVED_MODEL, "prompt": "ping", "max_tokens": 1}).encode()
    request = urllib.request.Request(
        f"{RANK0_API}/v1/completions",
        data=body,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {LAB_API_KEY}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status == 200 and bool(json.load(reply)["choices"])
    except OSError:
        return False


def assert_routes_via_lab_bridge(address: str) -> None:
    """Tests send only to the lab's own nodes: the address must route through br-lab."""
    route = subprocess.run(["ip", "route", "get", address], capture_output=True, text=True, check=True)
    assert "dev br-lab" in route.stdout, f"{address} does not route via the lab bridge: {route.stdout}"


def connect_outcome(address: str, port: int, timeout: float = 5) -> str:
    """'accepted', 'refused' (a TCP reset) or 'timeout' for one TCP connection from the lab host."""
    assert_routes_via_lab_bridge(address)
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return "accepted"
    except ConnectionRefusedError:
        return "refused"
    except TimeoutError:
        return "timeout"


@dataclass
class FrontDoor:
    """The router's HTTPS endpoint as a client sees it: its address and port, the CA the lab made, a key."""

    address: str
    port: int
    ca_file: str
    key: str

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.ca_file)

    def request(
        self, method: str, path: str, body: dict | None = None, key: str | None = "", timeout: float = 60
    ) -> tuple[int, bytes]:
        """(status, body) of one request; key "" sends this front door's key, None sends no Authorization."""
        assert_routes_via_lab_bridge(self.address)
        headers = {"Content-Type": "application/json"}
        token = self.key if key == "" else key
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        connection = http.client.HTTPSConnection(self.address, self.port, context=self.context(), timeout=timeout)
        try:
            connection.request(method, path, body=json.dumps(body).encode() if body else None, headers=headers)
            reply = connection.getresponse()
            return reply.status, reply.read()
        finally:
            connection.close()

    def stream_completion(self, max_tokens: int, timeout: float = 120) -> float:
        """Seconds one streamed completion took, start to `[DONE]`; raises on any failure (status, cut stream)."""
        assert_routes_via_lab_bridge(self.address)
        body = {"model": SERVED_MODEL, "prompt": "Count slowly:", "max_tokens": max_tokens, "stream": True}
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {self.key}"}
        started = time.monotonic()
        connection = http.client.HTTPSConnection(self.address, self.port, context=self.context(), timeout=timeout)
        try:
            connection.request("POST", "/v1/completions", body=json.dumps(body).encode(), headers=headers)
            reply = connection.getresponse()
            if reply.status != 200:
                raise RuntimeError(f"status {reply.status}: {reply.read()[:200]!r}")
            if not reply.read().rstrip().endswith(b"data: [DONE]"):
                raise RuntimeError("the stream ended without [DONE]")
        finally:
            connection.close()
        return time.monotonic() - started


def fetch_status(url: str) -> str:
    """A node's shell command printing the HTTP status of a GET (bare nodes have python3, not curl)."""
    script = "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=3).status, end='')"
    return f'python3 -c "{script}" {url}'


# A node's own view of what listens, from `ss` (not from a list a test keeps): every TCP listener that is not on
# the loopback, as "address port" lines with the address as ss prints it (* and [::] for every address).
LISTENERS = "ss -Htln"
# One TCP connection per "address:port" argument from a node: {"address:port": "accepted|refused|timeout|error"}.
CONNECT_SCRIPT = (
    "import json, socket, sys\n"
    "found = {}\n"
    "for target in sys.argv[1:]:\n"
    "    address, port = target.rsplit(':', 1)\n"
    "    try:\n"
    "        socket.create_connection((address, int(port)), 3).close()\n"
    "        found[target] = 'accepted'\n"
    "    except ConnectionRefusedError:\n"
    "        found[target] = 'refused'\n"
    "    except TimeoutError:\n"
    "        found[target] = 'timeout'\n"
    "    except OSError:\n"
    "        found[target] = 'error'\n"
    "print(json.dumps(found))\n"
)


def reachable_ports(ss_output: str, cluster_address: str) -> list[int]:
    """The TCP ports a node listens on that another host could reach at its cluster address: every listener on
    all addresses (0.0.0.0, *, [::]) or on that address; loopback-only listeners are left out."""
    ports = set()
    for line in ss_output.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        address, _, port = fields[3].rpartition(":")
        address = address.strip("[]").split("%")[0].removeprefix("::ffff:")
        if address in ("0.0.0.0", "*", "::", cluster_address):
            ports.add(int(port))
    return sorted(ports)


def connect_from_node_command(targets: list[str]) -> str:
    """The shell command that tries each "address:port" from a node and prints CONNECT_SCRIPT's JSON."""
    script = CONNECT_SCRIPT.replace("'", "'\"'\"'")
    return f"python3 -c '{script}' {' '.join(targets)}"
