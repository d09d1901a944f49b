"""Controller-only modules answered in the controller's own process.

kimi_topology and kimi_inputs read nothing but their options and run on the controller (`delegate_to:
localhost`) once per host of every run. As modules, each answer cost a Python start and an AnsiballZ payload,
about 0.5 s of a two-core controller per host: 3.9 s of a four-node converge that changes nothing. Their action
plugins hand the same options, validated against the same argument spec (the module's, kept in module_utils), to
the same function in module_utils, so the module and the plugin cannot answer differently.
"""

from __future__ import annotations

from typing import Any, ClassVar

from ansible.plugins.action import ActionBase


class InProcessAction(ActionBase):
    """An action plugin that answers for a module whose logic reads only its options (no node, no file)."""

    TRANSFERS_FILES = False
    _requires_connection = False
    ARGUMENT_SPEC: ClassVar[dict[str, dict[str, Any]]] = {}

    def answer(self, params: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        raise NotImplementedError

    def run(self, tmp: str | None = None, task_vars: dict | None = None) -> dict:
        result = super().run(tmp, task_vars)
        # Refuses options the spec does not know or cannot convert, as AnsibleModule would (AnsibleActionFail).
        _, params = self.validate_argument_spec(argument_spec=self.ARGUMENT_SPEC)
        fields, failure = self.answer(params)
        result.update(fields, changed=False)
        if failure:
            result.update(failed=True, msg=failure)
        return result
