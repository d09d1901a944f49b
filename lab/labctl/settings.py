"""The lab's fixed names and addresses (docs/architecture.md) and the few knobs read from the environment."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

BRIDGE = "br-lab"
SUBNET_PREFIX = "198.18.0"
PREFIX_LENGTH = 24
HOST_ADDRESS = f"{SUBNET_PREFIX}.1"
MAX_NODES = 8
DEFAULT_DATA_SIZE = "4G"
# The filter-table chain that keeps node traffic on the bridge; FORWARD jumps to it while the lab is up.
IPTABLES_CHAIN = "KIMI-LAB"
# The filter-table chain INPUT jumps to while the lab is air-gapped (`lab/lab airgap on`): the nodes open no
# connection to the host (its apt, wheel and Hugging Face mirrors), so only their own nodes serve them.
AIRGAP_CHAIN = "KIMI-LAB-AIRGAP"
# Top-level cgroup (in the unified and the name=systemd hierarchies) holding one cgroup per node.
CGROUP_NAME = "kimi-lab"
CGROUP_ROOTS = (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup/systemd"))
# The repository root: lab/labctl/settings.py -> three levels up.
REPO_ROOT = Path(__file__).resolve().parents[2]

_NODE_NAME = re.compile(r"^node([1-8])$")


def node_name(index: int) -> str:
    return f"node{index}"


def node_address(index: int) -> str:
    return f"{SUBNET_PREFIX}.{10 + index}"


def node_veth(name: str) -> str:
    """Host side of a node's veth, as systemd-nspawn --network-bridge names it ("vb-" + machine name)."""
    return f"vb-{name}"


def node_index(name: str) -> int:
    """1..8 for "node1".."node8"; ValueError for anything else."""
    match = _NODE_NAME.match(name)
    if not match:
        raise ValueError(f"not a lab node name: {name!r} (expected node1..node{MAX_NODES})")
    return int(match.group(1))


@dataclass(frozen=True)
class Settings:
    cache: Path
    state: Path
    http_port: int
    hf_port: int
    debian_mirror: str
    boot_timeout_s: float

    @property
    def http_url(self) -> str:
        return f"http://{HOST_ADDRESS}:{self.http_port}"

    @property
    def hf_url(self) -> str:
        return f"http://{HOST_ADDRESS}:{self.hf_port}"


def _port_from_env(env: dict[str, str], key: str, default: int) -> int:
    raw = env.get(key, str(default))
    if not raw.isdigit() or not 1 <= int(raw) <= 65535:
        raise ValueError(f"{key}={raw!r} is not a TCP port (1..65535)")
    return int(raw)


def load_settings(env: dict[str, str] | None = None) -> Settings:
    env = dict(os.environ) if env is None else env
    http_port = _port_from_env(env, "KIMI_LAB_HTTP_PORT", 8080)
    hf_port = _port_from_env(env, "KIMI_LAB_HF_PORT", 8090)
    if http_port == hf_port:
        raise ValueError(f"KIMI_LAB_HTTP_PORT and KIMI_LAB_HF_PORT are both {http_port}")
    timeout_raw = env.get("KIMI_LAB_BOOT_TIMEOUT", "90")
    try:
        boot_timeout_s = float(timeout_raw)
    except ValueError:
        raise ValueError(f"KIMI_LAB_BOOT_TIMEOUT={timeout_raw!r} is not a number of seconds") from None
    return Settings(
        cache=Path(env.get("KIMI_LAB_CACHE", "/var/cache/kimi-lab")),
        state=Path(env.get("KIMI_LAB_STATE", "/var/lib/kimi-lab")),
        http_port=http_port,
        hf_port=hf_port,
        debian_mirror=env.get("KIMI_LAB_DEBIAN_MIRROR", "http://deb.debian.org/debian"),
        boot_timeout_s=boot_timeout_s,
    )


_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?$", re.IGNORECASE)
_UNIT = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def parse_size(text: str) -> int:
    """Bytes for "4G", "512M", "1.5GiB", "1048576" (binary units, as tmpfs and df use)."""
    match = _SIZE.match(text.strip())
    if not match:
        raise ValueError(f"not a size: {text!r} (examples: 4G, 512M, 1073741824)")
    number, unit = match.groups()
    size = int(float(number) * _UNIT[unit.upper()])
    if size < 1024**2:
        raise ValueError(f"size {text!r} is below 1M")
    return size
