"""Where a running lab keeps things (under KIMI_LAB_STATE) and the small record `up` writes about itself."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class StatePaths:
    root: Path

    @property
    def record(self) -> Path:
        return self.root / "lab.json"

    @property
    def ssh_dir(self) -> Path:
        return self.root / "ssh"

    @property
    def client_key(self) -> Path:
        return self.ssh_dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.ssh_dir / "known_hosts"

    @property
    def serve_dir(self) -> Path:
        return self.root / "serve"

    @property
    def docroot(self) -> Path:
        return self.serve_dir / "docroot"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def node_dir(self, name: str) -> Path:
        return self.root / "nodes" / name

    def node_root(self, name: str) -> Path:
        """The node's overlay mount point: what systemd-nspawn boots."""
        return self.node_dir(name) / "root"

    def node_upper(self, name: str) -> Path:
        return self.node_dir(name) / "upper"

    def node_work(self, name: str) -> Path:
        return self.node_dir(name) / "work"

    def node_data(self, name: str) -> Path:
        """The node's sized tmpfs, bind-mounted into it as /data."""
        return self.node_dir(name) / "data"

    def node_host_key(self, name: str) -> Path:
        return self.node_dir(name) / "ssh_host_ed25519_key"

    def node_pid_file(self, name: str) -> Path:
        return self.node_dir(name) / "nspawn.pid"

    def node_console_log(self, name: str) -> Path:
        return self.node_dir(name) / "console.log"

    def pid_files(self) -> list[Path]:
        return sorted(self.root.rglob("*.pid")) if self.root.is_dir() else []


@dataclass
class LabRecord:
    """What `up` decided; later commands (status, start, data-size, down) read it back."""

    node_count: int
    data_size_bytes: int
    http_port: int
    hf_port: int
    base_rootfs: str
    mirror_urls: dict[str, str] = field(default_factory=dict)
    checkpoint: dict[str, object] = field(default_factory=dict)
    data_sizes: dict[str, int] = field(default_factory=dict)
    ready: bool = False

    def save(self, paths: StatePaths) -> None:
        tmp = paths.record.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2, sort_keys=True) + "\n")
        tmp.replace(paths.record)

    @classmethod
    def load(cls, paths: StatePaths) -> LabRecord | None:
        try:
            return cls(**json.loads(paths.record.read_text()))
        except (OSError, ValueError, TypeError):
            return None
