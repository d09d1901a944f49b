#!/usr/bin/python3
"""kimi-haproxy-ctl: the router role's hands on haproxy's runtime API (its admin socket).

The router role (roles/router) copies this file to each router host as /usr/local/sbin/kimi-haproxy-ctl and
its tasks drain.yml and ready.yml run it with the host's own /usr/bin/python3: Debian 12's lab mirror has no
socat, so the socket is spoken to here. Standard library only, Python >= 3.10.

    kimi-haproxy-ctl show <server>                       # JSON: status, scur, qcur, check_status, admin, up, host
    kimi-haproxy-ctl state <server> ready|drain|maint    # JSON: changed, before, after (--dry-run: no change)
    kimi-haproxy-ctl save-state <file>                   # `show servers state` into <file> (before a reload)
    kimi-haproxy-ctl check-pem <file>                    # haproxy -c on a bind line using <file> as its crt

Global options: --socket (default /run/haproxy/admin.sock), --backend (default kimi_replicas).

What the commands send are haproxy's runtime API commands (`show stat <backend> 4 -1`, `show servers state
<backend>`, `set server <backend>/<server> state ready|drain|maint`); the socket is in non-interactive mode, so
haproxy answers one command and closes. Exit status: 0 done, 1 haproxy refused or answered what this cannot
read, 2 bad usage or no socket.

Layout: the parsers and the decision (pure, unit-tested in tests/unit/plugins/module_utils/test_kimi_router.py),
then the socket and `main`.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

DEFAULT_SOCKET = "/run/haproxy/admin.sock"
DEFAULT_BACKEND = "kimi_replicas"
STATES = ("ready", "drain", "maint")

# srv_admin_state of `show servers state` is a bit field (haproxy's management guide, "show servers state").
ADMIN_FMAINT = 0x01  # forced maintenance (the runtime API's `state maint`)
ADMIN_IMAINT = 0x02  # inherited from a tracked server
ADMIN_CMAINT = 0x04  # `disabled` in the configuration
ADMIN_FDRAIN = 0x08  # forced drain (the runtime API's `state drain`)
ADMIN_IDRAIN = 0x10  # inherited drain
ADMIN_RMAINT = 0x20  # DNS resolution failed
ADMIN_HMAINT = 0x40  # the server's FQDN was changed from the API
MAINT_BITS = ADMIN_FMAINT | ADMIN_IMAINT | ADMIN_CMAINT | ADMIN_RMAINT | ADMIN_HMAINT
DRAIN_BITS = ADMIN_FDRAIN | ADMIN_IDRAIN


class RuntimeApiError(Exception):
    """haproxy answered an error, or something this tool cannot read."""


@dataclass(frozen=True)
class ServerView:
    """One server of the backend as an operator (and drain.yml/ready.yml) needs it."""

    backend: str
    server: str
    status: str  # `show stat`'s status column: UP, DOWN, DRAIN, MAINT, "UP 1/3" (going down), "DOWN 1/2", ...
    scur: int  # current sessions on the server (a streaming generation holds one until it ends)
    qcur: int  # requests queued for this server
    check_status: str  # last health check: L7OK, L7STS (wrong status), L4CON (refused), L4TOUT, ...
    check_code: str  # the HTTP status the last check got ("" when none)
    lastchg: int  # seconds since the status last changed
    admin: str  # ready, drain or maint: the administrative state (srv_admin_state)
    admin_bits: int
    up: bool  # the health check reports it fully UP (status "UP", not going down, not drained)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


# ---------------------------------------------------------------------------------------------------------
# Parsers and decisions (no I/O)
# ---------------------------------------------------------------------------------------------------------


def parse_stat_csv(text: str) -> list[dict[str, str]]:
    """`show stat`'s CSV (first line "# pxname,svname,...") as one dict per row, keyed by the header's names."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or not lines[0].startswith("# "):
        raise RuntimeApiError(f"`show stat` answered no CSV header: {text.strip()[:200]!r}")
    header = lines[0][2:].rstrip(",").split(",")
    rows = []
    for values in csv.reader(io.StringIO("\n".join(lines[1:]))):
        rows.append(dict(zip(header, values, strict=False)))
    return rows


def parse_servers_state(text: str) -> list[dict[str, str]]:
    """`show servers state`'s answer (a version line "1", a "# be_id be_name ..." header, one line per server)."""
    lines = [line for line in text.splitlines() if line.strip()]
    headers = [line for line in lines if line.startswith("# ")]
    if not lines or lines[0].strip() != "1" or not headers:
        raise RuntimeApiError(f"`show servers state` answered no version 1 table: {text.strip()[:200]!r}")
    names = headers[0][2:].split()
    return [dict(zip(names, line.split(), strict=False)) for line in lines[1:] if not line.startswith("#")]


def admin_name(bits: int) -> str:
    """ready, drain or maint from srv_admin_state's bits (maintenance wins over drain)."""
    if bits & MAINT_BITS:
        return "maint"
    if bits & DRAIN_BITS:
        return "drain"
    return "ready"


def needs_change(bits: int, wanted: str) -> bool:
    """Whether `set server ... state <wanted>` would change the forced administrative state."""
    forced_maint, forced_drain = bool(bits & ADMIN_FMAINT), bool(bits & ADMIN_FDRAIN)
    if wanted == "ready":
        return forced_maint or forced_drain
    if wanted == "drain":
        return forced_maint or not forced_drain
    if wanted == "maint":
        return forced_drain or not forced_maint
    raise ValueError(f"unknown state {wanted!r}: one of {', '.join(STATES)}")


def _int(value: str | None) -> int:
    return int(value) if value and value.strip().lstrip("-").isdigit() else 0


def server_view(backend: str, server: str, stats: list[dict[str, str]], states: list[dict[str, str]]) -> ServerView:
    """The server's view from both tables; RuntimeApiError naming what exists when it is in neither."""
    stat = next((r for r in stats if r.get("pxname") == backend and r.get("svname") == server), None)
    state = next((r for r in states if r.get("be_name") == backend and r.get("srv_name") == server), None)
    if stat is None or state is None:
        known = sorted({r.get("svname", "") for r in stats if r.get("pxname") == backend} - {"BACKEND", "FRONTEND"})
        raise RuntimeApiError(
            f"haproxy has no server {server!r} in backend {backend!r} (it has: {', '.join(known) or 'none'})"
        )
    bits = _int(state.get("srv_admin_state"))
    status = stat.get("status", "")
    return ServerView(
        backend=backend,
        server=server,
        status=status,
        scur=_int(stat.get("scur")),
        qcur=_int(stat.get("qcur")),
        check_status=stat.get("check_status", ""),
        check_code=stat.get("check_code", ""),
        lastchg=_int(stat.get("lastchg")),
        admin=admin_name(bits),
        admin_bits=bits,
        up=status == "UP",
    )


# ---------------------------------------------------------------------------------------------------------
# The socket
# ---------------------------------------------------------------------------------------------------------


def runtime_api(socket_path: str, command: str, timeout: float = 10.0) -> str:
    """Send one command to haproxy's admin socket and return its whole answer (haproxy closes after it)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(socket_path)
        sock.sendall(command.encode() + b"\n")
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


Ask = Callable[[str], str]


def read_server(ask: Ask, backend: str, server: str) -> ServerView:
    stats = parse_stat_csv(ask(f"show stat {backend} 4 -1"))
    states = parse_servers_state(ask(f"show servers state {backend}"))
    return server_view(backend, server, stats, states)


def set_state(ask: Ask, backend: str, server: str, wanted: str, dry_run: bool = False) -> dict[str, object]:
    """Put the server in the wanted administrative state unless it is there already."""
    before = read_server(ask, backend, server)
    changed = needs_change(before.admin_bits, wanted)
    after = before
    if changed and not dry_run:
        answer = ask(f"set server {backend}/{server} state {wanted}").strip()
        if answer:
            raise RuntimeApiError(f"haproxy refused `set server {backend}/{server} state {wanted}`: {answer}")
        after = read_server(ask, backend, server)
    return {"changed": changed, "dry_run": dry_run, "before": before.as_dict(), "after": after.as_dict()}


def save_state(ask: Ask, path: Path) -> int:
    """Write `show servers state` (every backend) to path, atomically; the number of servers written."""
    text = ask("show servers state")
    servers = parse_servers_state(text)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as handle:
        handle.write(text if text.endswith("\n") else text + "\n")
    Path(handle.name).chmod(0o644)
    Path(handle.name).replace(path)
    return len(servers)


def pem_check_config(pem: str) -> str:
    """A configuration whose only use is to make `haproxy -c` load the PEM (certificate and matching key)."""
    return (
        "defaults\n  mode http\n  timeout connect 1s\n  timeout client 1s\n  timeout server 1s\n"
        f"frontend kimi_pem_check\n  bind 127.0.0.1:1 ssl crt {pem}\n  http-request deny\n"
    )


def check_pem(pem: Path, haproxy: str) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="kimi-pem-check-") as directory:
        config = Path(directory) / "check.cfg"
        config.write_text(pem_check_config(str(pem.resolve())))
        return subprocess.run([haproxy, "-c", "-f", str(config)], capture_output=True, text=True, check=False)


# ---------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="kimi-haproxy-ctl", description=__doc__.split("\n\n")[0])
    top.add_argument("--socket", default=DEFAULT_SOCKET, help="haproxy's admin socket (level admin)")
    top.add_argument("--backend", default=DEFAULT_BACKEND, help="the backend holding the replicas")
    top.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for haproxy's answer")
    commands = top.add_subparsers(dest="command", required=True)
    show = commands.add_parser("show", help="one server's status, sessions, last check and admin state (JSON)")
    show.add_argument("server")
    state = commands.add_parser("state", help="set one server's administrative state (JSON: changed, before, after)")
    state.add_argument("server")
    state.add_argument("wanted", choices=STATES)
    state.add_argument("--dry-run", action="store_true", help="report what would change, change nothing")
    save = commands.add_parser("save-state", help="write `show servers state` to a file (haproxy reloads it)")
    save.add_argument("file", type=Path)
    save.add_argument("--missing-ok", action="store_true", help="no socket (haproxy stopped): write nothing, exit 0")
    pem = commands.add_parser("check-pem", help="haproxy -c with the file as a bind line's certificate")
    pem.add_argument("file", type=Path)
    pem.add_argument("--haproxy", default=shutil.which("haproxy") or "/usr/sbin/haproxy")
    return top


def main(argv: Sequence[str] | None = None, ask: Ask | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "check-pem":
        done = check_pem(args.file, args.haproxy)
        if done.returncode != 0:
            # haproxy names the file and what is wrong with it; never the key's content.
            said = (done.stdout + done.stderr).strip().splitlines()
            alerts = [line for line in said if "[ALERT]" in line] or said
            print(f"{args.file}: not a certificate and matching key haproxy loads:", *alerts, sep="\n", file=sys.stderr)
        return 0 if done.returncode == 0 else 1

    if ask is None:
        if not os.path.exists(args.socket):  # noqa: PTH110 - a socket, not a file to open
            if args.command == "save-state" and args.missing_ok:
                print(json.dumps({"saved": 0, "reason": f"no socket {args.socket}"}))
                return 0
            print(
                f"kimi-haproxy-ctl on {socket.gethostname()}: no admin socket {args.socket}: is haproxy running?",
                file=sys.stderr,
            )
            return 2

        def ask(command: str) -> str:
            return runtime_api(args.socket, command, args.timeout)

    # The router's name, for messages: drain.yml and ready.yml may run delegated from a replica's node.
    host = socket.gethostname()
    try:
        if args.command == "show":
            result: dict[str, object] = read_server(ask, args.backend, args.server).as_dict()
        elif args.command == "state":
            result = set_state(ask, args.backend, args.server, args.wanted, args.dry_run)
        else:
            result = {"saved": save_state(ask, args.file), "file": str(args.file)}
    except (RuntimeApiError, OSError) as error:
        print(f"kimi-haproxy-ctl on {host}: {error}", file=sys.stderr)
        return 1
    print(json.dumps({**result, "host": host}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
