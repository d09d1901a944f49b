"""`kimi.k2.systemctl_show`: one unit's `systemctl show -p A -p B UNIT` output as {property: value}.

The serve and verify roles read unit state through it, drift through the same parser in
plugins/module_utils/kimi_systemd.py, so the three agree on what systemctl printed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ansible_collections.kimi.k2.plugins.module_utils.kimi_systemd import parse_unit


def systemctl_show(text: str | None) -> dict[str, str]:
    """`stdout | kimi.k2.systemctl_show`: the unit's properties, {} when systemctl printed nothing."""
    return parse_unit(text or "")


class FilterModule:
    """Ansible's entry point for the filters of this file."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"systemctl_show": systemctl_show}
