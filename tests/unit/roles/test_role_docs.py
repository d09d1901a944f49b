"""Every role documents itself: each variable in defaults/main.yml has a comment, appears in the role's
README table, and is declared in meta/argument_specs.yml (so a wrong type fails at the start, by name)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests import paths

ROLES = sorted(p for p in (paths.REPO_ROOT / "roles").iterdir() if p.is_dir())


def defaults_of(role: Path) -> dict:
    path = role / "defaults" / "main.yml"
    return yaml.safe_load(path.read_text()) or {} if path.exists() else {}


def commented_variables(role: Path) -> set[str]:
    """Top-level keys of defaults/main.yml under a comment: the comment may cover a group of keys written
    together (no blank line between them), e.g. a branch and its exact version."""
    path = role / "defaults" / "main.yml"
    if not path.exists():
        return set()
    lines = path.read_text().splitlines()
    found = set()
    for index, line in enumerate(lines):
        if not line or line.startswith((" ", "#", "-")) or ":" not in line:
            continue
        above = index - 1
        while above >= 0 and lines[above].strip() and not lines[above].startswith("#"):
            above -= 1
        if above >= 0 and lines[above].startswith("#") and not lines[above].startswith("# ----"):
            found.add(line.split(":", 1)[0])
    return found


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_every_default_is_commented(role):
    missing = set(defaults_of(role)) - commented_variables(role)
    assert not missing, f"{role.name}: variables without a comment in defaults/main.yml: {sorted(missing)}"


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_every_default_is_in_the_readme_table(role):
    readme = role / "README.md"
    assert readme.exists(), f"{role.name} has no README.md"
    text = readme.read_text()
    missing = [name for name in defaults_of(role) if f"`{name}`" not in text]
    assert not missing, f"{role.name}: README.md does not list {missing}"


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_every_default_is_in_the_argument_spec(role):
    spec_path = role / "meta" / "argument_specs.yml"
    assert spec_path.exists(), f"{role.name} has no meta/argument_specs.yml"
    specs = yaml.safe_load(spec_path.read_text())["argument_specs"]
    declared = {name for entry in specs.values() for name in (entry.get("options") or {})}
    missing = sorted(set(defaults_of(role)) - declared)
    assert not missing, f"{role.name}: not declared in meta/argument_specs.yml: {missing}"
