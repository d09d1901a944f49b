"""`systemctl show` output, read one way for every caller: drift (several units by Id), the serve role's group
decision and the verify role (one unit's properties, through the `kimi.k2.systemctl_show` filter), and the
start times `--timestamp=unix` prints ('@1795997000').

Pure stdlib and free of package-relative imports: kimi_drift_rules and kimi_serve import it, a module built on them may
run on a node's own Python, and the vllm_serve role copies this file beside the node's watchdog
(roles/vllm_serve/files/kimi_watchdog.py), which imports it as a plain module.
"""

from __future__ import annotations

import re

# systemctl separates the units of one `show` by an empty line.
_BLOCK_SEPARATOR = re.compile(r"\n\s*\n")


def parse_blocks(text: str) -> list[dict[str, str]]:
    """Each unit's KEY=VALUE lines as a dict, in the order systemctl printed them.

    Only the first '=' separates: a value may hold more ('ExecStart={ path=/usr/bin/x ; argv[]=... }').
    A value may be empty ('ExecMainStartTimestamp=' for a unit that never ran); it stays ''.
    """
    blocks = []
    for block in _BLOCK_SEPARATOR.split((text or "").strip()):
        values = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if values:
            blocks.append(values)
    return blocks


def parse_unit(text: str) -> dict[str, str]:
    """One unit's properties (`systemctl show -p ActiveState -p MainPID UNIT`); {} when nothing was printed."""
    blocks = parse_blocks(text)
    return blocks[0] if blocks else {}


def parse_systemctl_show(text: str) -> dict[str, dict[str, str]]:
    """Several units (`systemctl show -p Id,LoadState,... A B`) keyed by their Id; a block without Id is dropped,
    since nothing could say which unit it describes."""
    return {values["Id"]: values for values in parse_blocks(text) if values.get("Id")}


def unix_timestamp(value: str | None) -> float | None:
    """A `--timestamp=unix` value ('@1795997000') as seconds since the epoch; None for a unit that never
    started ('', '@0', 'n/a') or anything else that is not a number."""
    stamp = str(value or "").strip().lstrip("@")
    try:
        seconds = float(stamp)
    except ValueError:
        return None
    return seconds if seconds > 0 else None
