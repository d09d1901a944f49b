"""`kimi.k2.deb_pin_work`: what a pinned set still needs on a node (install at the pin, hold), from dpkg-query.

roles/nvidia_repo/tasks/pinned_packages.yml reads each set with one dpkg-query and runs apt and the holds only for
what this returns (plugins/module_utils/kimi_debs.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

try:  # the kimi.k2 collection: installed, or this checkout through ansible.cfg's collections_path
    from ansible_collections.kimi.k2.plugins.module_utils.kimi_debs import pin_work
except ImportError:  # pytest, with the repository root on sys.path (tests/conftest.py)
    from module_utils.kimi_debs import pin_work


def deb_pin_work(dpkg_query_stdout: str | None, pinned: Mapping[str, str]) -> dict[str, list[str]]:
    """`stdout | kimi.k2.deb_pin_work(pinned)`: {install: [name=version...], hold: [name...]}."""
    return pin_work(dpkg_query_stdout or "", pinned)


class FilterModule:
    """Ansible's entry point for the filters of this file."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"deb_pin_work": deb_pin_work}
