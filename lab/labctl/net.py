"""The lab network: one bridge with the host at .1, a FORWARD chain that keeps node traffic on it, the INPUT
chain behind `airgap on` that keeps the nodes off the host, and the link switch behind `cut`/`heal`."""

from __future__ import annotations

import subprocess
from pathlib import Path

from .settings import AIRGAP_CHAIN, BRIDGE, HOST_ADDRESS, IPTABLES_CHAIN, PREFIX_LENGTH
from .system import LabError, run

_SYS_NET = Path("/sys/class/net")
IFF_UP = 0x1


def link_exists(name: str) -> bool:
    return (_SYS_NET / name).exists()


def link_is_up(name: str) -> bool:
    """The administrative UP flag (what `ip link set ... down` clears)."""
    try:
        flags = int((_SYS_NET / name / "flags").read_text(), 16)
    except OSError:
        return False
    return bool(flags & IFF_UP)


def lab_links() -> list[str]:
    """The bridge and every node veth present on the host."""
    if not _SYS_NET.is_dir():
        return []
    return sorted(p.name for p in _SYS_NET.iterdir() if p.name == BRIDGE or p.name.startswith("vb-node"))


def create_bridge() -> None:
    run(["ip", "link", "add", BRIDGE, "type", "bridge", "stp_state", "0", "forward_delay", "0"])
    run(["ip", "addr", "add", f"{HOST_ADDRESS}/{PREFIX_LENGTH}", "dev", BRIDGE])
    run(["ip", "link", "set", BRIDGE, "up"])


def delete_links() -> list[str]:
    """Delete node veths left behind (nspawn normally removes its own) and the bridge."""
    problems = []
    for name in sorted(lab_links(), key=lambda n: n == BRIDGE):
        proc = subprocess.run(["ip", "link", "del", name], capture_output=True, text=True, check=False)
        if proc.returncode != 0 and link_exists(name):
            problems.append(f"cannot delete link {name}: {proc.stderr.strip()}")
    return problems


def route_device(address: str) -> str | None:
    """The interface `ip route get` would send a packet to address through."""
    proc = subprocess.run(["ip", "route", "get", address], capture_output=True, text=True, check=False)
    words = proc.stdout.split()
    return words[words.index("dev") + 1] if "dev" in words else None


def is_local_address(address: str) -> bool:
    """Whether the kernel delivers packets for address to this host itself (`ip route get` says "local"):
    true for the bridge address while br-lab has it; without the bridge, 198.18.0.1 routes elsewhere."""
    proc = subprocess.run(["ip", "route", "get", address], capture_output=True, text=True, check=False)
    return proc.returncode == 0 and proc.stdout.split()[:1] == ["local"]


def require_bridge_route(address: str) -> None:
    """Refuse to send anything to a lab address the kernel would route elsewhere (e.g. the default route:
    198.18.0.0/15 is a real, unrouted-by-convention range and something upstream may answer)."""
    device = route_device(address)
    if device != BRIDGE:
        raise LabError(f"{address} routes via {device or 'nothing'}, not {BRIDGE}: refusing to contact it")


# --- iptables ---------------------------------------------------------------------------------------------


def chain_rules() -> list[list[str]]:
    """Rules of the lab chain: drop what is forwarded out of the bridge or into it from elsewhere.

    Bridged node-to-node traffic also passes FORWARD (br_netfilter is loaded here) with -i and -o both
    br-lab, so it is left alone."""
    return [
        ["-i", BRIDGE, "!", "-o", BRIDGE, "-j", "DROP"],
        ["-o", BRIDGE, "!", "-i", BRIDGE, "-j", "DROP"],
    ]


def _create(chain: str, hook: str, rules: list[list[str]]) -> None:
    """A filter-table chain with its rules, jumped to first from the built-in chain `hook`."""
    run(["iptables", "-w", "-N", chain])
    for rule in rules:
        run(["iptables", "-w", "-A", chain, *rule])
    run(["iptables", "-w", "-I", hook, "1", "-j", chain])


def _exists(chain: str) -> bool:
    proc = subprocess.run(["iptables", "-w", "-S", chain], capture_output=True, check=False)
    return proc.returncode == 0


def _jumps(hook: str, chain: str) -> int:
    proc = subprocess.run(["iptables", "-w", "-S", hook], capture_output=True, text=True, check=False)
    return sum(1 for line in proc.stdout.splitlines() if line.split()[-2:] == ["-j", chain])


def _delete(chain: str, hook: str) -> list[str]:
    """Every jump from `hook` to the chain, then the chain; returns what could not be removed."""
    problems = []
    for _ in range(_jumps(hook, chain)):
        subprocess.run(["iptables", "-w", "-D", hook, "-j", chain], capture_output=True, check=False)
    if _exists(chain):
        subprocess.run(["iptables", "-w", "-F", chain], capture_output=True, check=False)
        proc = subprocess.run(["iptables", "-w", "-X", chain], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            problems.append(f"cannot delete iptables chain {chain}: {proc.stderr.strip()}")
    return problems


def create_chain() -> None:
    _create(IPTABLES_CHAIN, "FORWARD", chain_rules())


def chain_exists() -> bool:
    return _exists(IPTABLES_CHAIN)


def forward_jumps() -> int:
    return _jumps("FORWARD", IPTABLES_CHAIN)


def delete_chain() -> list[str]:
    return _delete(IPTABLES_CHAIN, "FORWARD")


# --- air gap: the nodes reach nothing but each other ----------------------------------------------------


def airgap_rules() -> list[list[str]]:
    """Rules of the air-gap chain: a connection a node opens to the host is dropped (the host's mirrors, any
    port); replies to the host's own connections (Ansible's SSH) are established, so they pass. Node-to-node
    traffic is bridged and never reaches INPUT, and the lab chain already drops whatever would leave the bridge."""
    return [["-i", BRIDGE, "-m", "conntrack", "--ctstate", "NEW,INVALID", "-j", "DROP"]]


def create_airgap_chain() -> None:
    _create(AIRGAP_CHAIN, "INPUT", airgap_rules())


def airgap_chain_exists() -> bool:
    return _exists(AIRGAP_CHAIN)


def input_jumps() -> int:
    return _jumps("INPUT", AIRGAP_CHAIN)


def airgapped() -> bool:
    """The air gap is on only with both its chain and INPUT's jump to it."""
    return airgap_chain_exists() and input_jumps() > 0


def delete_airgap_chain() -> list[str]:
    return _delete(AIRGAP_CHAIN, "INPUT")


# --- ports ------------------------------------------------------------------------------------------------


def _decode_ipv4(hex_address: str) -> str:
    # /proc/net/tcp prints the address as a little-endian 32-bit word.
    raw = bytes.fromhex(hex_address)[::-1]
    return ".".join(str(b) for b in raw)


def listeners(port: int, proc_net_tcp: str, proc_net_tcp6: str) -> list[str]:
    """Local addresses listening on TCP port, from the text of /proc/net/tcp and /proc/net/tcp6."""
    found = []
    for text, family in ((proc_net_tcp, 4), (proc_net_tcp6, 6)):
        for line in text.splitlines()[1:]:
            fields = line.split()
            if len(fields) < 4 or fields[3] != "0A":  # 0A = TCP_LISTEN
                continue
            address_hex, port_hex = fields[1].split(":")
            if int(port_hex, 16) != port:
                continue
            if family == 4:
                found.append(_decode_ipv4(address_hex))
            elif address_hex == "0" * 32:
                found.append("::")
            elif address_hex.startswith("0000000000000000FFFF0000"):
                found.append(_decode_ipv4(address_hex[24:]))
            else:
                found.append("ipv6-specific")
    return found


def port_conflict(port: int, proc_net_tcp: str, proc_net_tcp6: str) -> str | None:
    """Which listener would stop a server binding HOST_ADDRESS:port, if any (a wildcard or the bridge
    address itself; a listener on loopback only does not conflict)."""
    for address in listeners(port, proc_net_tcp, proc_net_tcp6):
        if address in ("0.0.0.0", "::", HOST_ADDRESS):
            return address
    return None


def check_port_free(port: int, what: str) -> None:
    tcp = Path("/proc/net/tcp").read_text()
    tcp6_path = Path("/proc/net/tcp6")
    tcp6 = tcp6_path.read_text() if tcp6_path.exists() else ""
    holder = port_conflict(port, tcp, tcp6)
    if holder is not None:
        raise LabError(
            f"port {port} ({what}) is already taken: something listens on {holder}:{port}; "
            f"stop it or pick another port",
            exit_code=2,
        )
