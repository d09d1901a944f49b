"""What `pinned_debs` (roles/kimi) still has to do on a node, from one `dpkg-query` of its packages.

Each converge reads every pinned set's packages with one `dpkg-query --show` per set and installs or holds only what
differs: on a node that already has every package at its pin and held (every converge after the first), apt and
dpkg_selections are skipped instead of each checking on its own (about 1.5 s per set on the lab's two nodes).
Stdlib only: the kimi_deb_pins module runs it on the node, beside its preferences file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# `dpkg-query --show --showformat` of the lines parsed below: name, version, selection (want), status.
DPKG_QUERY_FORMAT = "${Package}\\t${Version}\\t${db:Status-Want}\\t${db:Status-Status}\\n"


@dataclass(frozen=True)
class DebState:
    version: str
    selection: str  # install, hold, deinstall, purge, unknown
    status: str  # installed, config-files, not-installed, half-installed, ...


def parse_dpkg_query(text: str) -> dict[str, DebState]:
    """{package: state} from dpkg-query's lines; a package dpkg-query does not know has no line (and no entry)."""
    states: dict[str, DebState] = {}
    for line in text.splitlines():
        fields = line.split("\t")
        if len(fields) != 4 or not fields[0]:
            continue
        name, version, selection, status = fields
        states[name] = DebState(version=version, selection=selection, status=status)
    return states


def pin_work(dpkg_query_stdout: str, pinned: Mapping[str, str]) -> dict[str, list[str]]:
    """What is left to do for `pinned` ({package: exact version}): `install` (name=version of every package not
    installed at its pin) and `hold` (every package not held now, or installed just now)."""
    states = parse_dpkg_query(dpkg_query_stdout)
    install, hold = [], []
    for package, version in pinned.items():
        state = states.get(package)
        at_pin = state is not None and state.status == "installed" and state.version == str(version)
        if not at_pin:
            install.append(f"{package}={version}")
        if not at_pin or state is None or state.selection != "hold":
            hold.append(package)
    return {"install": install, "hold": hold}
