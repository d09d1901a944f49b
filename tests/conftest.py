"""Shared pytest set-up: the repository root is importable, so tests use `module_utils.*` and `lab/labctl`."""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

for path in (REPO_ROOT, REPO_ROOT / "lab"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
