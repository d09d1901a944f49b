"""Where the tests find promtool: `make promtool` unpacks it from Debian's prometheus package into .cache/.

Without it a test is skipped with the command that gets it, except in CI (CI=true), where the rules must be
checked: there a missing promtool fails the test.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.paths import REPO_ROOT

PROMTOOL = REPO_ROOT / ".cache" / "promtool" / "usr" / "bin" / "promtool"


def promtool() -> Path:
    """The promtool `make promtool` unpacked; skips (fails in CI) when it is not there."""
    if PROMTOOL.is_file():
        return PROMTOOL
    message = f"promtool is missing ({PROMTOOL.relative_to(REPO_ROOT)}): run `make promtool`"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message}; CI must check the alert rules", pytrace=False)
    pytest.skip(message)
