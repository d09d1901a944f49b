"""Action plugin for kimi_inputs: the module's judgement made in the controller's process.

Why a plugin: plugins/plugin_utils/kimi_in_process.py.
"""

from __future__ import annotations

from typing import Any

from ansible_collections.kimi.k2.plugins.module_utils.kimi_inputs import ARGUMENT_SPEC, inputs_answer
from ansible_collections.kimi.k2.plugins.plugin_utils.kimi_in_process import InProcessAction


class ActionModule(InProcessAction):
    ARGUMENT_SPEC = ARGUMENT_SPEC

    def answer(self, params: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        return inputs_answer(params)
