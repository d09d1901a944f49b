"""Shared pytest set-up.

Tests import the collection's code the one way modules, filters and action plugins do,
`ansible_collections.kimi.k2.plugins.module_utils.<name>`: the checkout's collections/ directory (whose
ansible_collections/kimi/k2/{plugins,meta} are links into this checkout) comes first on sys.path, so that name
is this checkout's code, never an installed copy of kimi.k2. lab/ is importable (`labctl`), and so is
contrib/kimi_tools (`kimi_tools`, the bundle builder and the other checkout tools).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

for path in (REPO_ROOT / "collections", REPO_ROOT / "lab", REPO_ROOT / "contrib" / "kimi_tools"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


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
