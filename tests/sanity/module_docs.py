"""Every module's DOCUMENTATION against the argument spec it gives AnsibleModule: what ansible-test's
validate-modules checks, without ansible-test.

`ansible-test sanity` in its default mode fetches a pip bootstrap script from outside the package registries
and writes under ~/.ansible/test; this needs neither. The documentation comes from `ansible-doc --json`
(so doc fragments are resolved the way users see them), through a temporary collections path in which
kimi.k2 is this checkout; the argument spec comes from running each module's main() with AnsibleModule
replaced by a recorder that stops at the constructor.

Checked per option (recursively through suboptions): present in both, type, required, default, choices,
elements, aliases; per module: the check_mode and diff_mode attributes are declared, and check_mode's
support agrees with supports_check_mode. Exit status 1 with one line per problem, naming the module.

    python tests/sanity/module_docs.py            # every module in plugins/modules
    python tests/sanity/module_docs.py kimi_plan  # some of them
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
MODULES = REPO_ROOT / "plugins" / "modules"
COLLECTION = "kimi.k2"
SUPPORT_LEVELS = ("full", "partial", "none", "N/A")


class ConstructorReached(Exception):  # noqa: N818 - a signal, not an error
    """Raised by the recorder in place of AnsibleModule.__init__, carrying its keyword arguments."""

    def __init__(self, kwargs: dict[str, Any]) -> None:
        super().__init__("AnsibleModule constructed")
        self.kwargs = kwargs


def argument_spec_of(path: Path) -> dict[str, Any]:
    """The keyword arguments the module gives AnsibleModule (argument_spec, supports_check_mode, ...)."""
    from ansible.module_utils import basic

    # Modules import their helpers as ansible_collections.kimi.k2.plugins.module_utils.*: this checkout's, through
    # collections/ (links to plugins/) ahead of any installed copy, as ansible.cfg's collections_path does.
    collections = str(REPO_ROOT / "collections")
    if collections not in sys.path:
        sys.path.insert(0, collections)

    def record(self: object, *args: Any, **kwargs: Any) -> None:
        if args:
            kwargs["argument_spec"] = args[0]
        raise ConstructorReached(kwargs)

    spec = importlib.util.spec_from_file_location(f"kimi_module_docs_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    original = basic.AnsibleModule.__init__
    basic.AnsibleModule.__init__ = record
    try:
        module.main()
    except ConstructorReached as reached:
        return reached.kwargs
    finally:
        basic.AnsibleModule.__init__ = original
    raise AssertionError(f"{path.stem}: main() returned without constructing AnsibleModule")


def documentation(names: list[str]) -> dict[str, dict[str, Any]]:
    """ansible-doc's JSON for each module, keyed by short name."""
    with tempfile.TemporaryDirectory(prefix="kimi-module-docs-") as tmp:
        collection = Path(tmp) / "ansible_collections" / "kimi"
        collection.mkdir(parents=True)
        (collection / "k2").symlink_to(REPO_ROOT)
        env = {
            **os.environ,
            "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"),
            "ANSIBLE_COLLECTIONS_PATH": tmp,
            "ANSIBLE_HOME": str(Path(tmp) / "home"),
            "ANSIBLE_LOCAL_TEMP": str(Path(tmp) / "local"),
            "ANSIBLE_DEPRECATION_WARNINGS": "0",
        }
        ansible_doc = Path(sys.executable).parent / "ansible-doc"
        command = [str(ansible_doc), "-t", "module", "--json", *(f"{COLLECTION}.{n}" for n in names)]
        proc = subprocess.run(command, capture_output=True, text=True, env=env, check=False, cwd=tmp)
    if proc.returncode != 0:
        raise SystemExit(f"ansible-doc failed ({proc.returncode}):\n{proc.stderr}")
    parsed = json.loads(proc.stdout)
    missing = [n for n in names if f"{COLLECTION}.{n}" not in parsed]
    if missing:
        raise SystemExit(f"ansible-doc returned no documentation for {missing}:\n{proc.stderr}")
    return {n: parsed[f"{COLLECTION}.{n}"]["doc"] for n in names}


def normalized_default(value: Any) -> Any:
    return None if value in ({}, []) else value


def compare_options(where: str, doc: dict[str, Any], spec: dict[str, Any]) -> list[str]:
    """Problems between documented options and an argument spec at one level, then their suboptions."""
    problems = [f"{where}{name}: in the argument spec, not documented" for name in sorted(spec.keys() - doc.keys())]
    problems += [f"{where}{name}: documented, not in the argument spec" for name in sorted(doc.keys() - spec.keys())]
    for name in sorted(doc.keys() & spec.keys()):
        documented, specified = doc[name], spec[name]
        label = f"{where}{name}"
        pairs = {
            "type": (documented.get("type", "str"), specified.get("type", "str")),
            "required": (bool(documented.get("required", False)), bool(specified.get("required", False))),
            "default": (normalized_default(documented.get("default")), normalized_default(specified.get("default"))),
            "choices": (list(documented.get("choices") or []), list(specified.get("choices") or [])),
            "aliases": (sorted(documented.get("aliases") or []), sorted(specified.get("aliases") or [])),
        }
        if pairs["type"][1] == "list":
            pairs["elements"] = (documented.get("elements"), specified.get("elements"))
        for field, (in_doc, in_spec) in pairs.items():
            if in_doc != in_spec:
                problems.append(f"{label}: {field} is {in_doc!r} in DOCUMENTATION but {in_spec!r} in the spec")
        sub_doc, sub_spec = documented.get("suboptions"), specified.get("options")
        if sub_doc or sub_spec:
            problems += compare_options(f"{label}.", sub_doc or {}, sub_spec or {})
    return problems


def compare_attributes(doc: dict[str, Any], kwargs: dict[str, Any]) -> list[str]:
    attributes = doc.get("attributes") or {}
    problems = []
    for name in ("check_mode", "diff_mode"):
        support = (attributes.get(name) or {}).get("support")
        if support not in SUPPORT_LEVELS:
            problems.append(f"attribute {name}: support is {support!r}, want one of {', '.join(SUPPORT_LEVELS)}")
    check_mode = (attributes.get("check_mode") or {}).get("support")
    supports = bool(kwargs.get("supports_check_mode", False))
    if check_mode in SUPPORT_LEVELS and (check_mode != "none") != supports:
        problems.append(f"attribute check_mode: support is {check_mode!r} but supports_check_mode={supports}")
    return problems


def problems_of(name: str, doc: dict[str, Any]) -> list[str]:
    kwargs = argument_spec_of(MODULES / f"{name}.py")
    found = compare_options("option ", doc.get("options") or {}, kwargs.get("argument_spec") or {})
    found += compare_attributes(doc, kwargs)
    return [f"{name}: {problem}" for problem in found]


def main(argv: list[str]) -> int:
    names = argv or sorted(p.stem for p in MODULES.glob("*.py"))
    docs = documentation(names)
    problems = [problem for name in names for problem in problems_of(name, docs[name])]
    for problem in problems:
        print(problem)
    print(f"module docs: {len(names)} module(s), {len(problems)} problem(s)", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
