"""The DOCUMENTATION-vs-argument-spec check finds what it is there to find (tests/sanity/module_docs.py)."""

from __future__ import annotations

import importlib.util

from tests import paths

spec = importlib.util.spec_from_file_location("module_docs", paths.REPO_ROOT / "tests" / "sanity" / "module_docs.py")
module_docs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module_docs)

SPEC = {
    "name": {"type": "str", "required": True},
    "count": {"type": "int", "default": 2},
    "mode": {"type": "str", "choices": ["a", "b"], "default": "a"},
    "items": {"type": "list", "elements": "dict", "options": {"path": {"type": "path"}}},
}
DOC = {
    "name": {"type": "str", "required": True, "description": "x"},
    "count": {"type": "int", "default": 2, "description": "x"},
    "mode": {"type": "str", "choices": ["a", "b"], "default": "a", "description": "x"},
    "items": {"type": "list", "elements": "dict", "description": "x", "suboptions": {"path": {"type": "path"}}},
}
FULL = {"attributes": {"check_mode": {"support": "full"}, "diff_mode": {"support": "none"}}}


def test_matching_documentation_has_no_problem():
    assert module_docs.compare_options("option ", DOC, SPEC) == []
    assert module_docs.compare_attributes(FULL, {"supports_check_mode": True}) == []


def test_each_kind_of_mismatch_is_named():
    doc = {**DOC, "count": {"type": "str", "default": 2}, "extra": {"type": "str"}}
    doc["items"] = {**DOC["items"], "suboptions": {"path": {"type": "str"}}}
    spec = {**SPEC, "mode": {"type": "str", "choices": ["a"], "default": "a"}, "hidden": {"type": "bool"}}
    problems = module_docs.compare_options("option ", doc, spec)
    assert "option hidden: in the argument spec, not documented" in problems
    assert "option extra: documented, not in the argument spec" in problems
    assert "option count: type is 'str' in DOCUMENTATION but 'int' in the spec" in problems
    assert "option mode: choices is ['a', 'b'] in DOCUMENTATION but ['a'] in the spec" in problems
    assert "option items.path: type is 'str' in DOCUMENTATION but 'path' in the spec" in problems


def test_attributes_must_be_declared_and_agree_with_supports_check_mode():
    assert module_docs.compare_attributes({}, {"supports_check_mode": True}) == [
        "attribute check_mode: support is None, want one of full, partial, none, N/A",
        "attribute diff_mode: support is None, want one of full, partial, none, N/A",
    ]
    assert module_docs.compare_attributes(FULL, {}) == [
        "attribute check_mode: support is 'full' but supports_check_mode=False"
    ]


def test_every_module_of_the_collection_is_checked():
    names = sorted(p.stem for p in module_docs.MODULES.glob("*.py"))
    assert "kimi_plan" in names and len(names) >= 19
    kwargs = module_docs.argument_spec_of(module_docs.MODULES / "kimi_plan.py")
    assert kwargs["supports_check_mode"] is True and "model" in kwargs["argument_spec"]
