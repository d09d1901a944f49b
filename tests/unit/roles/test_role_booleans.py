"""Values given with -e work as users type them.

`-e checkpoint_force_verify=true` hands the role the string 'true', and `-e checkpoint_progress_interval=10`
the string '10': role argument-spec validation checks such strings but does not convert the variables. So
every use of an option declared `type: bool` (or `int`/`float`) in a role's meta/argument_specs.yml must
convert it first, or ansible-core 2.19 refuses the conditional ("derived from value of type 'str'"), `not
'false'` is False, and `'10' > 5` fails.

(a) Static. Every Jinja expression in roles/*/{tasks,handlers,vars,defaults}/*.yml, roles/*/templates/*.j2,
playbooks/*.yml, site.yml and molecule/*/*.yml is parsed with Jinja's own parser (when/failed_when/
changed_when/until/that are raw expressions, other strings templates) and every reference to an option is
checked. A reference to a bool option is sound when it is

* filtered by `| bool`, possibly through `| default(...)` (as the subject or the fallback of default);
* tested with `is defined` / `is undefined` / `is none`;
* the whole value of a YAML string (`"{{ opt }}"`, optionally `| default(...)`) that is a module argument:
  the module's argument spec converts it (AnsibleModule's bool/int types accept the strings; the custom
  modules in plugins/modules/ coerce nested fields the same way, e.g. kimi_serve_args' BOOL_FIELDS). When the
  whole value is a variable definition instead (defaults/vars files, set_fact, `vars:`, role params), the
  defined variable inherits the option's type and its own uses are checked the same way (to a fixed point).

A reference to an int/float option is sound under `| int` / `| float`, under an `is defined`-style test, as
a whole-value passthrough (as above), or when it is only rendered as text (template output, `~`, `| string`,
`| quote`): '10' and 10 render the same. Anything else (conditions, `not`, `and`/`or`, inline if, ternary,
comparisons, arithmetic, filter/call arguments, list/dict literals) is reported with file, line and name.

(b) Dynamic. Every decision that mentions a bool option (a when/failed_when/changed_when/until/that
expression, an `{% if %}` or inline-if test, a ternary subject, an outermost and/or/not) is rebuilt from
its AST and evaluated with ansible-core's own Templar.evaluate_conditional (what a task's `when:` runs),
the option set to each of 'true', 'false', 'yes', 'no', '1', '0', 'True', 'False' and to the real booleans;
the other free variables are stubbed with real values chosen from how the expression uses them (booleans,
lists under `| length`, numbers next to a number), every combination up to 64. Each string must give
exactly what the boolean it means gives, never an error. Likewise each comparison or arithmetic on an
int/float option is evaluated with the number typed ('7', '0', '12.5') and real.

The self-checks at the end feed the scanner and the evaluator synthetic offenders so neither can pass by
finding nothing.
"""

from __future__ import annotations

import itertools
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import jinja2
import pytest
import yaml
from jinja2 import nodes

from tests import paths

REPO_ROOT = paths.REPO_ROOT
ROLES_DIR = REPO_ROOT / "roles"

CONDITIONAL_KEYS = {"when", "failed_when", "changed_when", "until", "that"}
SET_FACT = {"set_fact", "ansible.builtin.set_fact", "ansible.legacy.set_fact"}
# Filters that turn the typed string into the value it means, per declared type.
CONVERTERS = {"bool": {"bool"}, "int": {"int", "float"}, "float": {"float", "int"}}
SAFE_TESTS = {"defined", "undefined", "none"}
TEXT_FILTERS = {"string", "quote"}
DEFAULT_FILTERS = {"default", "d"}
ENV = jinja2.Environment()

BOOL_STRINGS = {"true": True, "false": False, "yes": True, "no": False, "1": True, "0": False}
BOOL_STRINGS |= {"True": True, "False": False}


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    name: str
    why: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.name} ({self.why})"


@dataclass
class Source:
    """One Jinja text found in a file: an expression (conditional keyword) or a template."""

    path: str
    line: int
    text: str
    kind: str  # "condition", "template" or "file" (a whole .j2 template)
    context: str  # "arg" (module argument/keyword), "var:<name>" (a definition), "condition", "file"
    end_line: int = 0
    file_text: str = field(default="", repr=False)


@dataclass
class Scan:
    findings: list[Finding] = field(default_factory=list)
    derived: dict[str, str] = field(default_factory=dict)
    conditions: list[tuple[Source, nodes.Node, set[str]]] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------------------
# Options and sources
# ---------------------------------------------------------------------------------------------------------


def typed_options() -> dict[str, str]:
    """Every option of type bool/int/float declared by any role (variables are play-wide, so one role's
    option used in another role's files is checked there too)."""
    found: dict[str, str] = {}
    for spec_path in sorted(ROLES_DIR.glob("*/meta/argument_specs.yml")):
        specs = (yaml.safe_load(spec_path.read_text()) or {}).get("argument_specs") or {}
        for entry in specs.values():
            for name, option in (entry.get("options") or {}).items():
                kind = option.get("type", "str")
                if kind in CONVERTERS:
                    found[name] = kind
    return found


def scanned_files() -> list[Path]:
    paths: list[Path] = []
    for sub in ("tasks", "handlers", "vars", "defaults"):
        paths += ROLES_DIR.glob(f"*/{sub}/*.yml")
    paths += ROLES_DIR.glob("*/templates/*.j2")
    paths += (REPO_ROOT / "playbooks").glob("*.yml")
    paths += [REPO_ROOT / "site.yml"]
    paths += (REPO_ROOT / "molecule").glob("*/*.yml")
    return sorted(p for p in paths if p.is_file())


def is_vars_file(path: Path) -> bool:
    return path.parent.name in ("vars", "defaults") and path.parent.parent.parent == ROLES_DIR


def has_jinja(text: str) -> bool:
    return "{{" in text or "{%" in text


def yaml_sources(rel: str, text: str, vars_file: bool) -> list[Source]:
    """Walk the YAML node tree (tags such as !unsafe do not matter to compose), keeping line numbers."""
    found: list[Source] = []

    def scalar(node: yaml.Node, kind: str, context: str) -> None:
        is_text = isinstance(node, yaml.ScalarNode) and isinstance(node.value, str)
        if is_text and (kind == "condition" or has_jinja(node.value)):
            start, end = node.start_mark.line + 1, node.end_mark.line + 1
            found.append(Source(rel, start, node.value, kind, context, end, text))

    def var_defs(node: yaml.Node) -> None:
        if not isinstance(node, yaml.MappingNode):
            walk(node)
            return
        for key, value in node.value:
            name = key.value if isinstance(key, yaml.ScalarNode) else ""
            if isinstance(value, yaml.ScalarNode):
                scalar(value, "template", f"var:{name}")
            else:
                walk(value)

    def walk(node: yaml.Node) -> None:
        if isinstance(node, yaml.ScalarNode):
            scalar(node, "template", "arg")
        elif isinstance(node, yaml.SequenceNode):
            for item in node.value:
                walk(item)
        elif isinstance(node, yaml.MappingNode):
            keys = {k.value for k, _ in node.value if isinstance(k, yaml.ScalarNode)}
            for key, value in node.value:
                name = key.value if isinstance(key, yaml.ScalarNode) else ""
                if name in CONDITIONAL_KEYS:
                    items = value.value if isinstance(value, yaml.SequenceNode) else [value]
                    for item in items:
                        scalar(item, "condition", "condition")
                elif name == "vars" or name in SET_FACT:
                    var_defs(value)
                elif "role" in keys and name != "role" and isinstance(value, yaml.ScalarNode):
                    scalar(value, "template", f"var:{name}")  # a role parameter is a variable
                else:
                    walk(value)

    for document in yaml.compose_all(text, Loader=yaml.SafeLoader):
        if document is None:
            continue
        if vars_file:
            var_defs(document)
        else:
            walk(document)
    return found


def sources_of(path: Path) -> list[Source]:
    rel = str(path.relative_to(REPO_ROOT))
    text = path.read_text()
    if path.suffix == ".j2":
        return [Source(rel, 1, text, "file", "file", text.count("\n") + 1, text)]
    return yaml_sources(rel, text, is_vars_file(path))


def parse(source: Source) -> nodes.Template:
    text = source.text
    if source.kind == "condition" and not has_jinja(text):
        text = "{{ " + text + " }}"
    with warnings.catch_warnings():  # a regex's '\\s' in a Jinja string literal
        warnings.simplefilter("ignore", DeprecationWarning)
        return ENV.parse(text)


# ---------------------------------------------------------------------------------------------------------
# Static analysis
# ---------------------------------------------------------------------------------------------------------


def parents_of(tree: nodes.Node) -> dict[int, nodes.Node]:
    parents: dict[int, nodes.Node] = {}
    stack = [tree]
    while stack:
        node = stack.pop()
        for child in node.iter_child_nodes():
            parents[id(child)] = node
            stack.append(child)
    return parents


def bound(target: nodes.Node) -> set[str]:
    return {n.name for n in target.find_all(nodes.Name)} | {getattr(target, "name", "")}


def shadowed(node: nodes.Node, name: str, parents: dict[int, nodes.Node]) -> bool:
    """The name is the template's own here: a for-loop target or macro argument around it, or a set."""
    child, parent = node, parents.get(id(node))
    while parent is not None:
        if isinstance(parent, nodes.For) and child is not parent.iter and name in bound(parent.target):
            return True
        if isinstance(parent, nodes.Macro) and name in {a.name for a in parent.args}:
            return True
        child, parent = parent, parents.get(id(parent))
    return any(name in bound(a.target) for a in child.find_all((nodes.Assign, nodes.AssignBlock)))


def references(
    tree: nodes.Node, tracked: dict[str, str], parents: dict[int, nodes.Node]
) -> list[tuple[nodes.Node, str]]:
    """(node, option) for each read of a tracked variable: a bare name, hostvars[h].name,
    hostvars[h]['name'], vars.name or vars['name']."""
    found = []
    for node in tree.find_all((nodes.Name, nodes.Getattr, nodes.Getitem)):
        if isinstance(node, nodes.Name):
            if node.ctx == "load" and node.name in tracked and not shadowed(node, node.name, parents):
                found.append((node, node.name))
            continue
        name = node.attr if isinstance(node, nodes.Getattr) else getattr(node.arg, "value", None)
        if not isinstance(name, str) or name not in tracked:
            continue
        base = node.node
        if (isinstance(base, nodes.Name) and base.name == "vars") or (
            isinstance(base, nodes.Getitem) and isinstance(base.node, nodes.Name) and base.node.name == "hostvars"
        ):
            found.append((node, name))
    return found


def climb_defaults(node: nodes.Node, parents: dict[int, nodes.Node]) -> nodes.Node:
    """Up through `| default(...)`, whether the reference is the subject or the fallback."""
    current = node
    while True:
        parent = parents.get(id(current))
        in_default = isinstance(parent, nodes.Filter) and parent.name in DEFAULT_FILTERS
        if in_default and (parent.node is current or current in parent.args):
            current = parent
            continue
        return current


def is_whole_value(tree: nodes.Template, node: nodes.Node) -> bool:
    body = tree.body
    return len(body) == 1 and isinstance(body[0], nodes.Output) and body[0].nodes == [node]


def verdict(tree: nodes.Template, parents: dict[int, nodes.Node], ref: nodes.Node, kind: str, source: Source):
    """None when the reference is sound, else why not. ("passthrough", None) marks a whole value."""
    top = climb_defaults(ref, parents)
    parent = parents.get(id(top))
    if isinstance(parent, nodes.Filter) and parent.node is top and parent.name in CONVERTERS[kind]:
        return None
    if isinstance(parent, nodes.Test) and parent.node is ref and parent.name in SAFE_TESTS:
        return None
    if source.kind == "template" and source.context != "condition" and is_whole_value(tree, top):
        return "passthrough"
    if kind != "bool":
        if isinstance(parent, nodes.Output | nodes.Concat):
            return None
        if isinstance(parent, nodes.Filter) and parent.node is top and parent.name in TEXT_FILTERS:
            return None
        return f"{kind} option used without | int/| float"
    if source.kind == "condition" and parents.get(id(top)) is tree.body[0] and is_whole_value(tree, top):
        return "bare conditional, needs | bool"
    return "used without | bool"


def line_of(source: Source, name: str, jinja_line: int) -> int:
    """The file line of a reference: the first line of the scalar, from the Jinja line on, naming it."""
    file_lines = source.file_text.splitlines()
    first = source.line + (jinja_line - 1 if source.kind == "file" else 0)
    last = max(source.end_line, first)
    pattern = re.compile(rf"\b{re.escape(name)}\b")
    for number in range(first, min(last, len(file_lines)) + 1):
        if pattern.search(file_lines[number - 1]):
            return number
    return first


def scan(sources: list[Source], options: dict[str, str]) -> Scan:
    """Check every reference, growing the tracked set with variables defined as an option's passthrough."""
    tracked = dict(options)
    parsed = [(source, parse(source)) for source in sources]
    while True:
        result = Scan(derived={k: v for k, v in tracked.items() if k not in options})
        grew = False
        for source, tree in parsed:
            parents = parents_of(tree)
            typed_refs = set()
            for ref, name in references(tree, tracked, parents):
                kind = tracked[name]
                why = verdict(tree, parents, ref, kind, source)
                typed_refs.add(name)
                if why == "passthrough":
                    defined = source.context.removeprefix("var:")
                    if source.context.startswith("var:") and defined not in tracked:
                        tracked[defined] = kind
                        grew = True
                    continue
                if why is not None:
                    line = line_of(source, name, ref.lineno)
                    result.findings.append(Finding(source.path, line, name, why))
            if typed_refs:
                result.conditions.append((source, tree, typed_refs))
        if not grew:
            return result


# ---------------------------------------------------------------------------------------------------------
# Dynamic check: rebuild each condition around a bool option and evaluate it with ansible-core
# ---------------------------------------------------------------------------------------------------------

BINARY = {
    nodes.Add: "+",
    nodes.Sub: "-",
    nodes.Mul: "*",
    nodes.Div: "/",
    nodes.FloorDiv: "//",
    nodes.Mod: "%",
    nodes.Pow: "**",
    nodes.And: "and",
    nodes.Or: "or",
}
COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "lteq": "<=", "gt": ">", "gteq": ">=", "in": "in", "notin": "not in"}


class UnsupportedError(Exception):
    pass


def unparse(node: nodes.Node) -> str:
    """Jinja source for an expression node (enough of the grammar for conditions)."""
    if isinstance(node, nodes.Name):
        return node.name
    if isinstance(node, nodes.Const):
        return repr(node.value)
    if isinstance(node, nodes.Getattr):
        return f"{unparse(node.node)}.{node.attr}"
    if isinstance(node, nodes.Getitem):
        return f"{unparse(node.node)}[{unparse(node.arg)}]"
    if isinstance(node, nodes.Not):
        return f"(not {unparse(node.node)})"
    if isinstance(node, nodes.Neg):
        return f"(-{unparse(node.node)})"
    if type(node) in BINARY:
        return f"({unparse(node.left)} {BINARY[type(node)]} {unparse(node.right)})"
    if isinstance(node, nodes.Concat):
        return "(" + " ~ ".join(unparse(n) for n in node.nodes) + ")"
    if isinstance(node, nodes.Compare):
        return "(" + unparse(node.expr) + "".join(f" {COMPARE[o.op]} {unparse(o.expr)}" for o in node.ops) + ")"
    if isinstance(node, nodes.CondExpr):
        tail = f" else {unparse(node.expr2)}" if node.expr2 is not None else ""
        return f"({unparse(node.expr1)} if {unparse(node.test)}{tail})"
    if isinstance(node, nodes.Filter | nodes.Test):
        args = [unparse(a) for a in node.args] + [f"{k.key}={unparse(k.value)}" for k in node.kwargs]
        if node.dyn_args is not None or node.dyn_kwargs is not None:
            raise UnsupportedError("*args")
        call = f"({', '.join(args)})" if args else ""
        if isinstance(node, nodes.Filter):
            return f"({unparse(node.node)} | {node.name}{call})"
        return f"({unparse(node.node)} is {node.name}{call})"
    if isinstance(node, nodes.List | nodes.Tuple):
        inner = ", ".join(unparse(n) for n in node.items)
        return f"[{inner}]" if isinstance(node, nodes.List) else f"({inner},)"
    if isinstance(node, nodes.Dict):
        return "{" + ", ".join(f"{unparse(p.key)}: {unparse(p.value)}" for p in node.items) + "}"
    if isinstance(node, nodes.Call):
        args = [unparse(a) for a in node.args] + [f"{k.key}={unparse(k.value)}" for k in node.kwargs]
        return f"{unparse(node.node)}({', '.join(args)})"
    raise UnsupportedError(type(node).__name__)


def conditions_in(tree: nodes.Template, source: Source, names: set[str]) -> list[nodes.Node]:
    """The boolean decisions of a source that mention a bool option: the whole expression of a conditional
    keyword, each {% if %} / inline-if test, each ternary subject, each outermost and/or/not."""
    found: list[nodes.Node] = []
    if source.kind == "condition" and len(tree.body) == 1 and isinstance(tree.body[0], nodes.Output):
        found += tree.body[0].nodes
    parents = parents_of(tree)
    for node in tree.find_all((nodes.If, nodes.CondExpr, nodes.Filter, nodes.And, nodes.Or, nodes.Not)):
        if isinstance(node, nodes.If | nodes.CondExpr):
            found.append(node.test)
        elif isinstance(node, nodes.Filter):
            if node.name == "ternary":
                found.append(node.node)
        elif not isinstance(parents.get(id(node)), nodes.And | nodes.Or | nodes.Not):
            found.append(node)  # the outermost and/or/not: a decision even where a value is built from it
    mentions, seen = [], set()
    for node in found:
        if id(node) in seen:
            continue
        seen.add(id(node))
        named = {n.name for n in node.find_all(nodes.Name)} | ({node.name} if isinstance(node, nodes.Name) else set())
        named |= {n.attr for n in node.find_all(nodes.Getattr)}
        if named & names:
            mentions.append(node)
    return mentions


LIST_FILTERS = {"length", "count", "first", "last", "list", "join", "select", "reject", "map", "unique", "sort"}
LIST_FILTERS |= {"selectattr", "rejectattr", "flatten", "difference", "union", "intersect", "min", "max", "sum"}


def stub_pool(node: nodes.Node, parents: dict[int, nodes.Node]) -> tuple:
    """Real values a stubbed variable may take, from how the expression uses it."""
    top = climb_defaults(node, parents)
    parent = parents.get(id(top))
    if isinstance(parent, nodes.Filter) and parent.node is top and parent.name in LIST_FILTERS:
        return ([], ["x"])
    if isinstance(parent, nodes.Test) and parent.name == "none":
        return (None, "x")
    if isinstance(parent, ARITHMETIC) or (isinstance(parent, nodes.Filter) and parent.name in ("int", "float")):
        return (1, 2)
    if isinstance(parent, nodes.Compare):
        others = [parent.expr, *(o.expr for o in parent.ops)]
        constants = [o.value for o in others if isinstance(o, nodes.Const) and o is not top]
        if any(isinstance(c, int) and not isinstance(c, bool) for c in constants):
            return (0, 1)
        if any(isinstance(c, str) for c in constants):
            return ("", "x")
    return (True, False)


def stub_shapes(node: nodes.Node, option_names: set[str]) -> dict[str, object]:
    """Free variables other than the options under test: a name is a leaf, name.a.b a nested dict; each
    leaf holds the values it may take."""
    wrapper = nodes.Output([node])
    parents = parents_of(wrapper)
    shapes: dict[str, object] = {}
    skipped = option_names | {"hostvars", "vars", "inventory_hostname", "groups"}
    chained = set()
    for chain in wrapper.find_all(nodes.Getattr):
        if isinstance(parents.get(id(chain)), nodes.Getattr):
            continue
        path = []
        current = chain
        while isinstance(current, nodes.Getattr):
            path.append(current.attr)
            current = current.node
        if not isinstance(current, nodes.Name) or current.name in skipped:
            continue
        chained.add(id(current))
        shape = shapes.get(current.name)
        if not isinstance(shape, dict):
            shape = shapes[current.name] = {}
        for part in reversed(path[1:]):
            if not isinstance(shape.get(part), dict):
                shape[part] = {}
            shape = shape[part]
        if not isinstance(shape.get(path[0]), dict):
            shape[path[0]] = stub_pool(chain, parents)
    for name_node in wrapper.find_all(nodes.Name):
        if name_node.name not in skipped and id(name_node) not in chained:
            shapes.setdefault(name_node.name, stub_pool(name_node, parents))
    return shapes


def leaves(shape: object, prefix: tuple = ()) -> list[tuple[tuple, tuple]]:
    if isinstance(shape, dict):
        return [leaf for key, sub in shape.items() for leaf in leaves(sub, (*prefix, key))]
    return [(prefix, shape)]


def build(shapes: dict[str, object], values: dict[tuple, object]) -> dict[str, object]:
    def fill(shape: object, prefix: tuple) -> object:
        if isinstance(shape, dict):
            return {key: fill(sub, (*prefix, key)) for key, sub in shape.items()}
        return values[prefix]

    return {name: fill(shape, (name,)) for name, shape in shapes.items()}


_TEMPLAR: list = []


def evaluate(expression: str, variables: dict, mode: str = "conditional") -> object:
    """The expression's value with ansible-core's Templar (as a task's `when:` when mode is "conditional"),
    or "error: ..." naming what it raised."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    if not _TEMPLAR:
        _TEMPLAR.append(Templar(loader=DataLoader(), variables={}))
    templar = _TEMPLAR[0]
    templar.available_variables = variables
    try:
        if mode == "value":
            return templar.template(trust_as_template("{{ " + expression + " }}"))
        return templar.evaluate_conditional(trust_as_template(expression))
    except Exception as error:  # the error is the answer being compared
        return f"error: {type(error).__name__}: {str(error).splitlines()[0][:160]}"


NUMBER_STRINGS = {"7": 7, "0": 0, "12.5": 12.5}


def mismatches(
    expression: str,
    option: str,
    others: dict[str, object],
    fixed: dict[str, object],
    typed_values: dict[str, object] = BOOL_STRINGS,
    mode: str = "conditional",
) -> list[str]:
    """Each typed string must give exactly what the value it means gives, for every stub combination."""
    problems = []
    found = [leaf for name, shape in others.items() for leaf in leaves(shape, (name,))]
    paths = [path for path, _ in found]
    combos = list(itertools.islice(itertools.product(*(pool for _, pool in found)), 64))
    for combo in combos:
        variables = {**fixed, **build(others, dict(zip(paths, combo, strict=True)))}
        reals = set(typed_values.values())
        expected = {value: evaluate(expression, {**variables, option: value}, mode) for value in reals}
        failed = [v for v in expected.values() if isinstance(v, str) and v.startswith("error: ")]
        if len(failed) == len(expected) or (failed and mode == "conditional"):
            problems.append(f"{expression!r} is not evaluable with {option} a real value: {expected}")
            break
        wrong = {}
        for typed, meaning in typed_values.items():
            got = evaluate(expression, {**variables, option: typed}, mode)
            if got != expected[meaning] or type(got) is not type(expected[meaning]):
                wrong[typed] = got
        if wrong:
            answers = "; ".join(f"{typed!r} -> {got!r}" for typed, got in wrong.items())
            problems.append(f"{expression!r} with {option} typed as {answers} (real values give {expected})")
            break
    return problems


ARITHMETIC = (nodes.Add, nodes.Sub, nodes.Mul, nodes.Div, nodes.FloorDiv, nodes.Mod, nodes.Pow, nodes.Neg)


def numeric_problems(result: Scan, number_names: set[str]) -> tuple[list[str], int]:
    """Every outermost comparison or arithmetic on an int/float option gives the same value whether the
    number was typed ('7') or real (7)."""
    problems: list[str] = []
    evaluated = 0
    fixed = {"hostvars": {}, "vars": {}, "inventory_hostname": "node1", "groups": {}}
    numeric = (nodes.Compare, *ARITHMETIC)
    for source, tree, names in result.conditions:
        parents = parents_of(tree)
        seen = set()
        for ref, option in references(tree, {n: "int" for n in names & number_names}, parents):
            node = climb_defaults(ref, parents)
            parent = parents.get(id(node))
            if isinstance(parent, nodes.Filter) and parent.node is node and parent.name in ("int", "float"):
                node = parent  # the converted number is what the operator sees
            if not isinstance(parents.get(id(node)), numeric):
                continue
            while isinstance(parents.get(id(node)), numeric):
                node = parents[id(node)]
            if (id(node), option) in seen:
                continue
            seen.add((id(node), option))
            try:
                expression = unparse(node)
            except UnsupportedError as error:
                problems.append(f"{source.path}:{source.line}: cannot rebuild an expression ({error})")
                continue
            evaluated += 1
            found = mismatches(expression, option, stub_shapes(node, {option}), fixed, NUMBER_STRINGS, "value")
            line = line_of(source, option, node.lineno)
            problems += [f"{source.path}:{line}: {p}" for p in found]
    return problems, evaluated


def dynamic_problems(result: Scan, bool_names: set[str]) -> tuple[list[str], int]:
    problems: list[str] = []
    evaluated = 0
    for source, tree, names in result.conditions:
        for condition in conditions_in(tree, source, names & bool_names):
            try:
                expression = unparse(condition)
            except UnsupportedError as error:
                problems.append(f"{source.path}:{source.line}: cannot rebuild a condition ({error})")
                continue
            mentioned = {n.name for n in condition.find_all(nodes.Name)} | (
                {condition.name} if isinstance(condition, nodes.Name) else set()
            )
            mentioned |= {n.attr for n in condition.find_all(nodes.Getattr)}
            for option in sorted(mentioned & names & bool_names):
                others = stub_shapes(condition, {option})
                fixed = {"hostvars": {}, "vars": {}, "inventory_hostname": "node1", "groups": {}}
                found = mismatches(expression, option, others, fixed)
                evaluated += 1
                line = line_of(source, option, condition.lineno)
                problems += [f"{source.path}:{line}: {p}" for p in found]
    return problems, evaluated


# ---------------------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def repo_scan() -> tuple[Scan, dict[str, str]]:
    options = typed_options()
    sources = [s for path in scanned_files() for s in sources_of(path)]
    return scan(sources, options), options


def test_options_are_found() -> None:
    options = typed_options()
    for name, kind in {
        "checkpoint_force_verify": "bool",
        "cuda_profile": "bool",
        "kimi_nvidia_driver_install": "bool",
        "kimi_enable_expert_parallel": "bool",
        "checkpoint_progress_interval": "int",
        "kimi_gpu_memory_utilization": "float",
    }.items():
        assert options.get(name) == kind, name


def test_every_bool_and_number_option_is_converted_where_used(repo_scan) -> None:
    result, _ = repo_scan
    assert not result.findings, "options used without conversion (-e gives strings):\n" + "\n".join(
        str(f) for f in sorted(result.findings, key=lambda f: (f.path, f.line))
    )


def test_conditions_on_bool_options_give_the_same_answer_for_typed_strings(repo_scan) -> None:
    result, options = repo_scan
    bool_names = {n for n, k in {**options, **result.derived}.items() if k == "bool"}
    problems, evaluated = dynamic_problems(result, bool_names)
    assert evaluated >= 20, f"only {evaluated} conditions evaluated: the scan lost track of the roles"
    assert not problems, "\n".join(problems)


def test_numbers_compared_or_computed_give_the_same_answer_for_typed_strings(repo_scan) -> None:
    result, options = repo_scan
    number_names = {n for n, k in {**options, **result.derived}.items() if k in ("int", "float")}
    problems, evaluated = numeric_problems(result, number_names)
    assert evaluated >= 10, f"only {evaluated} numeric expressions evaluated: the scan lost track of the roles"
    assert not problems, "\n".join(problems)


# Self-checks: the scanner and the evaluator catch what they are for.

SYNTHETIC_TASKS = """\
- name: Bare
  ansible.builtin.debug:
  when: flag_opt
- name: Or
  ansible.builtin.debug:
  when: flag_opt or not reg.matches
- name: Good
  ansible.builtin.debug:
  when:
    - flag_opt | bool
    - flag_opt | default(false) | bool
    - other | default(flag_opt) | bool
    - flag_opt is defined
- name: Inline if and ternary
  ansible.builtin.debug:
    msg: "{{ 'a' if flag_opt else 'b' }} {{ flag_opt | ternary('x', 'y') }} {{ hostvars[h].flag_opt }}"
- name: Module argument passthrough is fine
  some_module:
    flag: "{{ flag_opt }}"
- name: Passthrough into a fact makes the fact tracked
  ansible.builtin.set_fact:
    derived_flag: "{{ flag_opt | default(false) }}"
- name: Then the fact is bare
  ansible.builtin.debug:
  when: derived_flag
- name: Numbers
  ansible.builtin.debug:
    msg: "{{ count_opt + 1 }} {{ count_opt | int + 1 }} {{ 'n=' ~ count_opt }} {{ count_opt }}"
  when: count_opt > 3
- name: Silently wrong, no error
  ansible.builtin.set_fact:
    flipped: "{{ not flag_opt or name == 'a' }}"
"""

SYNTHETIC_TEMPLATE = """\
{% if flag_opt %}on{% endif %}
{% if flag_opt | bool %}on{% endif %}
{% for flag_opt in [1] %}{{ flag_opt }}{% endfor %}
timeout={{ count_opt }}
"""


def synthetic_scan() -> Scan:
    sources = yaml_sources("synthetic.yml", SYNTHETIC_TASKS, False)
    sources.append(Source("synthetic.j2", 1, SYNTHETIC_TEMPLATE, "file", "file", 4, SYNTHETIC_TEMPLATE))
    return scan(sources, {"flag_opt": "bool", "count_opt": "int"})


def test_self_check_scanner_reports_bare_uses() -> None:
    found = {(f.path, f.why, f.name) for f in synthetic_scan().findings}
    lines = sorted((f.path, f.line, f.name) for f in synthetic_scan().findings)
    assert ("synthetic.yml", "bare conditional, needs | bool", "flag_opt") in found
    assert ("synthetic.yml", "bare conditional, needs | bool", "derived_flag") in found
    assert lines == [
        ("synthetic.j2", 1, "flag_opt"),
        ("synthetic.yml", 3, "flag_opt"),
        ("synthetic.yml", 6, "flag_opt"),
        ("synthetic.yml", 16, "flag_opt"),  # inline if
        ("synthetic.yml", 16, "flag_opt"),  # ternary subject
        ("synthetic.yml", 16, "flag_opt"),  # hostvars[h].flag_opt rendered as text: 'no' is not 'False'
        ("synthetic.yml", 25, "derived_flag"),
        ("synthetic.yml", 28, "count_opt"),  # count_opt + 1
        ("synthetic.yml", 29, "count_opt"),  # count_opt > 3
        ("synthetic.yml", 32, "flag_opt"),
    ]


def test_self_check_evaluator_catches_string_truthiness() -> None:
    problems, evaluated = dynamic_problems(synthetic_scan(), {"flag_opt", "derived_flag"})
    assert evaluated >= 8
    by_line = {p.split(": ", 1)[0]: p for p in problems}
    assert set(by_line) == {f"synthetic.yml:{n}" for n in (3, 6, 16, 25, 32)} | {"synthetic.j2:1"}
    assert "Conditional result (True) was derived from value of type 'str'" in by_line["synthetic.yml:3"]
    # `not 'false'` is False: no error, the wrong answer.
    assert "'false' -> False" in by_line["synthetic.yml:32"]
    assert "not evaluable" not in "\n".join(problems)
    assert mismatches("flag_opt | bool", "flag_opt", {}, {}) == []
    assert mismatches("not flag_opt", "flag_opt", {}, {})
    numbers, evaluated = numeric_problems(synthetic_scan(), {"count_opt"})
    assert evaluated == 3  # count_opt + 1, count_opt | int + 1, count_opt > 3
    assert sorted(p.split(": ", 1)[0] for p in numbers) == ["synthetic.yml:28", "synthetic.yml:29"]
