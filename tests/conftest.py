"""Shared pytest set-up.

The repository root and lab/ are importable (`module_utils.*`, `labctl`), and the repository's module_utils
directory is added to `ansible.module_utils`, so code that imports its siblings the way Ansible's module
packer needs (`from ansible.module_utils.kimi_node import ...`) runs unchanged under pytest.
"""

from __future__ import annotations

import sys
from pathlib import Path

import ansible.module_utils
import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

for path in (REPO_ROOT, REPO_ROOT / "lab"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

if str(REPO_ROOT / "plugins" / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(REPO_ROOT / "plugins" / "module_utils"))


def pytest_addoption(parser):
    parser.addoption(
        "--tier2-group",
        action="append",
        default=[],
        metavar="NAME",
        help="run only the tests marked tier2(NAME) (tests/tiers.py names the groups; make test leaves them out)",
    )


def pytest_collection_modifyitems(config, items):
    """With --tier2-group, keep only the tests of those tier-2 groups; a name no group has is refused."""
    groups = config.getoption("--tier2-group")
    if not groups:
        return
    from tests.tiers import GROUP_NAMES

    unknown = sorted(set(groups) - set(GROUP_NAMES))
    if unknown:
        raise pytest.UsageError(
            f"--tier2-group: no group {', '.join(unknown)} (tests/tiers.py: {', '.join(GROUP_NAMES)})"
        )
    kept, dropped = [], []
    for item in items:
        marker = item.get_closest_marker("tier2")
        (kept if marker is not None and marker.args and marker.args[0] in groups else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = kept
