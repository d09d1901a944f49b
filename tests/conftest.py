"""Shared pytest set-up.

The repository root and lab/ are importable (`module_utils.*`, `labctl`), and the repository's module_utils
directory is added to `ansible.module_utils`, so code that imports its siblings the way Ansible's module
packer needs (`from ansible.module_utils.kimi_node import ...`) runs unchanged under pytest.
"""

from __future__ import annotations

import sys
from pathlib import Path

import ansible.module_utils

REPO_ROOT = Path(__file__).resolve().parent.parent

for path in (REPO_ROOT, REPO_ROOT / "lab"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

if str(REPO_ROOT / "plugins" / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(REPO_ROOT / "plugins" / "module_utils"))
