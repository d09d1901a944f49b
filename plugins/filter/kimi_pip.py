"""Filters for pip names and the vllm role's venv: `kimi.k2.pep503_name` and `kimi.k2.venv_differences`.

Jinja calls these where it used to spell PEP 503 by hand (`lower | regex_replace('[-_.]+', '-')`) and to do
set algebra over the resolved set and the venv; the logic lives in plugins/module_utils with unit tests.
Filters run on the controller, whose Python has packaging (ansible-core depends on it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ansible_collections.kimi.k2.plugins.module_utils.kimi_pinset import normalize_name
from ansible_collections.kimi.k2.plugins.module_utils.kimi_venv_diff import venv_differences


def pep503_name(name: str) -> str:
    """A distribution name as pip compares it: 'Flash_Attn' -> 'flash-attn'."""
    return normalize_name(str(name))


class FilterModule:
    """Ansible's entry point for the filters of this file."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        # `vllm_pinset | kimi.k2.venv_differences(installed, removed=..., aliases=...)` is kimi_venv_diff's
        # function itself: its signature and docstring are the filter's.
        return {"pep503_name": pep503_name, "venv_differences": venv_differences}
