"""Where things are, for tests at any depth under tests/ (tests mirror the source tree, so depths vary)."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES = REPO_ROOT / "tests" / "fixtures"
