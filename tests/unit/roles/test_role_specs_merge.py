"""The kimi role checks every phase's inputs with one validate_argument_spec per host whose spec is the phase roles'
options merged (roles/kimi/tasks/inputs.yml, `combine(recursive=True)`). That merge is only sound while an option
that several roles declare means the same thing in each: the same type, element type, choices and suboptions. It
may differ in description and in `required` (the merge keeps `required: true` from whichever role declares it).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import yaml

ROLES_DIR = Path(__file__).resolve().parents[3] / "roles"
# What an option's spec may say differently in two roles without changing what validation accepts.
MAY_DIFFER = {"description", "required", "version_added"}


def phase_roles() -> list[str]:
    phases = yaml.safe_load((ROLES_DIR / "kimi" / "vars" / "main.yml").read_text())["kimi_phase_roles"]
    return sorted({role for roles in phases.values() for role in roles})


def options_of(role: str) -> dict:
    spec = yaml.safe_load((ROLES_DIR / role / "meta" / "argument_specs.yml").read_text())
    return spec["argument_specs"]["main"].get("options") or {}


def meaning(option: dict) -> dict:
    return {key: value for key, value in option.items() if key not in MAY_DIFFER}


def disagreements(options_by_role: dict[str, dict]) -> list[str]:
    declared: dict[str, list[tuple[str, dict]]] = defaultdict(list)
    for role, options in options_by_role.items():
        for name, option in options.items():
            declared[name].append((role, meaning(option)))
    found = []
    for name, specs in sorted(declared.items()):
        first_role, first = specs[0]
        found += [f"{name}: {first_role} says {first}, {role} says {spec}" for role, spec in specs[1:] if spec != first]
    return found


def test_every_phase_role_has_a_main_spec():
    for role in phase_roles():
        assert options_of(role), f"roles/{role}/meta/argument_specs.yml declares no options for main"


def test_options_several_phase_roles_declare_agree_on_what_they_accept():
    # The kimi role is in the merge too: its options are what every phase reads.
    assert disagreements({role: options_of(role) for role in [*phase_roles(), "kimi"]}) == []


def test_the_check_finds_a_disagreement():
    # Self-check: a type that differs is reported with both roles; a description or `required` that differs is not.
    specs = {
        "a": {"kimi_x": {"type": "int"}, "kimi_y": {"type": "str", "required": True}},
        "b": {"kimi_x": {"type": "str", "description": "d"}, "kimi_y": {"type": "str", "description": "e"}},
    }
    assert disagreements(specs) == ["kimi_x: a says {'type': 'int'}, b says {'type': 'str'}"]
