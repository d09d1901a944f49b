"""Throwaway network namespaces for tests that load nftables rules or open TCP connections: each is held by a
sleeping process and vanishes with it (its tables, addresses and links too), so nothing reaches this host's own
ruleset or interfaces.

Every command runs through `nsenter --net=/proc/<pid>/ns/net`, and only after checking that the holder's
namespace is not this process's own: a namespace that is not (yet) separate is refused, never used.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

TOOLS = ("unshare", "nsenter", "nft", "ip")

# Listens on every port given (on the address given), accepts and closes; prints "ready" once all are bound.
LISTENER = """
import selectors, socket, sys
address, ports = sys.argv[1], [int(p) for p in sys.argv[2:]]
selector = selectors.DefaultSelector()
for port in ports:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((address, port))
    server.listen(16)
    selector.register(server, selectors.EVENT_READ)
print("ready", flush=True)
while True:
    for key, _ in selector.select():
        connection, _ = key.fileobj.accept()
        connection.close()
"""

# One TCP connection from a source address: accepted, refused or timeout, and how long it took.
CONNECT = """
import socket, sys, time
source, target, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
client = socket.socket()
client.settimeout(float(sys.argv[4]))
client.bind((source, 0))
started = time.monotonic()
try:
    client.connect((target, port))
    outcome = "accepted"
except ConnectionRefusedError:
    outcome = "refused"
except TimeoutError:
    outcome = "timeout"
print(outcome, round(time.monotonic() - started, 3))
"""


def _own_namespace() -> str:
    return str(Path("/proc/self/ns/net").readlink())


def unavailable() -> str | None:
    """Why throwaway namespaces cannot be used here (None: they can)."""
    if sys.platform != "linux":
        return "network namespaces are Linux's"
    if os.geteuid() != 0:
        return "creating network namespaces and loading nftables rules needs root"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists()]
    if missing:
        return f"missing {', '.join(missing)} (util-linux, nftables, iproute2)"
    try:
        with Netns():
            pass
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        return f"no throwaway network namespace here: {error}"
    return None


class Netns:
    """A network namespace of its own with loopback up, for as long as the `with` block (or close())."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            ["unshare", "--net", "--", "sleep", "3600"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        self.pid = self.process.pid
        own, deadline = _own_namespace(), time.monotonic() + 10
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"unshare --net exited {self.process.returncode}: {self.process.stderr.read()}")
            try:
                if str(Path(f"/proc/{self.pid}/ns/net").readlink()) != own:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError("unshare --net did not enter a namespace of its own within 10 s")
            time.sleep(0.02)
        self.run("ip", "link", "set", "lo", "up")

    def __enter__(self) -> Netns:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)

    def argv(self, *command: str) -> list[str]:
        """The command, run inside this namespace; refused unless the namespace is still a separate one."""
        if self.process.poll() is not None or str(Path(f"/proc/{self.pid}/ns/net").readlink()) == _own_namespace():
            raise RuntimeError("the throwaway namespace is gone: refusing to run in this host's own")
        return ["nsenter", f"--net=/proc/{self.pid}/ns/net", "--", *command]

    def run(
        self, *command: str, check: bool = True, timeout: float = 60, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            self.argv(*command), capture_output=True, text=True, timeout=timeout, check=False, env=env
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} (exit {done.returncode}): {done.stderr.strip()}")
        return done

    def nft(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run("nft", *args, check=check)

    def listen(self, address: str, ports: list[int]) -> subprocess.Popen[str]:
        """A listener on these ports at this address (kill it when done); returns once every port is bound."""
        listener = subprocess.Popen(
            self.argv(sys.executable, "-c", LISTENER, address, *map(str, ports)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = listener.stdout.readline()
        if line.strip() != "ready":
            listener.kill()
            raise RuntimeError(f"the listener did not start: {listener.stderr.read()}")
        return listener

    def connect(self, source: str, target: str, port: int, timeout: float = 3) -> tuple[str, float]:
        """('accepted' | 'refused' | 'timeout', seconds) of one TCP connection from source to target:port."""
        done = self.run(sys.executable, "-c", CONNECT, source, target, str(port), str(timeout), timeout=timeout + 30)
        outcome, seconds = done.stdout.split()
        return outcome, float(seconds)


def link(server: Netns, client: Netns, server_addresses: list[str], client_addresses: list[str]) -> None:
    """A veth pair between two namespaces (made inside the server's, its peer moved straight into the client's),
    with these /24 addresses on either end."""
    server.run("ip", "link", "add", "kimi-s", "type", "veth", "peer", "name", "kimi-c", "netns", str(client.pid))
    for namespace, device, addresses in ((server, "kimi-s", server_addresses), (client, "kimi-c", client_addresses)):
        for address in addresses:
            namespace.run("ip", "address", "add", f"{address}/24", "dev", device)
        namespace.run("ip", "link", "set", device, "up")
