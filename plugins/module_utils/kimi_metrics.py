"""Metric names: what a Prometheus text exposition offers, what the alert rules and the Grafana dashboard ask
for, and which of the asked-for names an exposition lacks.

A rule on a name the exporter does not have never fires and never errors: Prometheus just finds no series. So
the names are checked against what vLLM really exports (the recorded /metrics of each pinned version in
tests/fixtures/vllm/, and rank 0's live /metrics in the verify phase through kimi_metrics_check).

Pure functions over text; PyYAML (an ansible-core dependency) reads the rule files, so this runs on the
controller only.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import yaml

# ---------------------------------------------------------------------------------------------- the exposition

# Series names a family of each type puts on the wire, besides the family name itself where noted. The text
# format 0.0.4 writes a counter's TYPE line with its _total name already; OpenMetrics writes the bare family.
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
}
_TYPE_LINE = re.compile(r"^#\s+TYPE\s+(\S+)\s+(\S+)")
# A sample: the name, its labels, then a value (a float, NaN or +/-Inf); a line of anything else is no sample.
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{.*\})?\s+([^\s]+)")


@dataclass(frozen=True)
class Exposition:
    """What one /metrics answer declares (family -> type) and the sample names it carries."""

    families: dict[str, str]
    samples: frozenset[str]

    def series_names(self) -> frozenset[str]:
        """Every name a PromQL selector can match on this exposition.

        A family declared without samples yet (a labelled metric no code path has touched) still counts: its
        series appear with the first observation, so a rule on it is not dead.
        """
        names = set(self.samples)
        for family, kind in self.families.items():
            names |= _family_series(family, kind)
        return frozenset(names)


def _family_series(family: str, kind: str) -> set[str]:
    if kind == "counter" and family.endswith("_total"):
        # 0.0.4 text: the TYPE line names the sample (`# TYPE vllm:num_preemptions_total counter`).
        return {family, family[: -len("_total")] + "_created"}
    suffixes = _SUFFIXES.get(kind)
    if suffixes is None:  # gauge, untyped, unknown, stateset: the family name is the series name
        return {family}
    return {family + suffix for suffix in suffixes}


def _is_value(text: str) -> bool:
    try:
        float(text)  # also reads NaN, +Inf and -Inf
    except ValueError:
        return False
    return True


def parse_exposition(text: str) -> Exposition:
    """Read a Prometheus text exposition (0.0.4 or OpenMetrics): the TYPE lines and the sample names."""
    families: dict[str, str] = {}
    samples: set[str] = set()
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            declared = _TYPE_LINE.match(line)
            if declared:
                families[declared.group(1)] = declared.group(2).lower()
            continue
        sample = _SAMPLE.match(line)
        if sample and _is_value(sample.group(2)):
            samples.add(sample.group(1))
    return Exposition(families=families, samples=frozenset(samples))


# ---------------------------------------------------------------------------------------------- PromQL

# Aggregations and functions are recognised by the "(" that follows any name (a metric name is never called);
# these words are PromQL's own and are never metric names wherever they stand.
_KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan", "by", "without", "on", "ignoring"}
    | {"group_left", "group_right"}
)
# Their "(...)" holds label names, not an expression.
_LABEL_LIST_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
_IDENTIFIER = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_NUMBER = re.compile(r"(?:0x[0-9a-fA-F]+|[0-9][0-9a-zA-Z_.]*(?:[eE][+-]?[0-9]+)?)")
_NAME_MATCHER = re.compile(r"""__name__\s*=\s*(?:"([^"\\]*)"|'([^'\\]*)')""")
# Grafana's variable syntaxes: $name, ${name} (or ${name:format}) and the deprecated [[name]].
_GRAFANA_VARIABLE = re.compile(r"\$\{[^}]*\}|\$[a-zA-Z_][a-zA-Z0-9_]*|\[\[[^\]]*\]\]")


def _skip_string(text: str, start: int) -> int:
    """Index after the string literal opening at `start` (", ' or `; backslash escapes in the first two)."""
    quote = text[start]
    index = start + 1
    while index < len(text):
        char = text[index]
        if char == "\\" and quote != "`":
            index += 2
            continue
        if char == quote:
            return index + 1
        index += 1
    return index


def _skip_group(text: str, start: int, closing: str) -> tuple[int, str]:
    """Index after the bracket group opening at `start`, and its inside (strings inside may hold brackets)."""
    opening = text[start]
    depth, index = 0, start
    while index < len(text):
        char = text[index]
        if char in "\"'`":
            index = _skip_string(text, index)
            continue
        if char == opening:
            depth += 1
        elif char == closing:
            depth -= 1
            if depth == 0:
                return index + 1, text[start + 1 : index]
        index += 1
    return index, text[start + 1 :]


def _next_significant(text: str, index: int) -> str:
    while index < len(text) and text[index].isspace():
        index += 1
    return text[index] if index < len(text) else ""


def _aggregation_modifier_follows(text: str, index: int) -> bool:
    """Whether `by (` or `without (` follows: then the word before is an aggregation (`sum by (le) (...)`)."""
    following = re.match(r"\s*(by|without)\s*\(", text[index:], re.IGNORECASE)
    return following is not None


def _after_word(text: str, identifier: re.Match[str], names: set[str]) -> int:
    """Where reading goes on after a word; the word joins `names` when it is a metric name (not a function,
    an aggregation or a keyword), and a by/on/... label list after it is skipped."""
    word, index = identifier.group(0), identifier.end()
    follows = _next_significant(text, index)
    lowered = word.lower()
    if lowered in _LABEL_LIST_KEYWORDS and follows == "(":
        return _skip_group(text, text.index("(", index), ")")[0]
    if lowered not in _KEYWORDS and follows != "(" and not _aggregation_modifier_follows(text, index):
        names.add(word)
    return index


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects.

    Function and aggregation names (followed by "("), keywords, label names inside {...} and in by/on/...
    lists, durations inside [...], numbers, string literals, comments, Jinja blocks and Grafana variables are
    not metric names. A `{__name__="x"}` matcher names x.
    """
    text = _GRAFANA_VARIABLE.sub(" ", strip_jinja(expr))
    names: set[str] = set()
    index = 0
    while index < len(text):
        char = text[index]
        if char in "\"'`":
            index = _skip_string(text, index)
        elif char == "#":  # a comment runs to the end of the line
            newline = text.find("\n", index)
            index = len(text) if newline < 0 else newline
        elif char == "{":
            index, inside = _skip_group(text, index, "}")
            names |= {a or b for a, b in _NAME_MATCHER.findall(inside)}
        elif char == "[":
            index, _ = _skip_group(text, index, "]")
        elif char.isdigit() or (char == "." and text[index + 1 : index + 2].isdigit()):
            # A number or a duration (`0.99`, `5m`, `1e3`): never a name, even where letters follow digits.
            index = _NUMBER.match(text, index + (char == ".")).end()
        elif identifier := _IDENTIFIER.match(text, index):
            index = _after_word(text, identifier, names)
        else:
            index += 1
    return names


# ---------------------------------------------------------------------------------------------- Jinja

_JINJA_RAW = re.compile(r"{%-?\s*raw\s*-?%}(.*?){%-?\s*endraw\s*-?%}", re.DOTALL)
_JINJA_COMMENT_LINE = re.compile(r"^[ \t]*{#(?:(?!#}).)*#}[ \t]*\n", re.DOTALL | re.MULTILINE)
_JINJA_COMMENT = re.compile(r"{#.*?#}", re.DOTALL)
# A macro's body is output only where it is called (and that call is an expression block).
_JINJA_MACRO = re.compile(r"{%-?\s*macro\b.*?{%-?\s*endmacro\s*-?%}[ \t]*\n?", re.DOTALL)
# One statement each: a line holding only a statement goes with its line break.
_JINJA_STATEMENT_LINE = re.compile(r"^[ \t]*{%(?:(?!%}).)*%}[ \t]*\n", re.MULTILINE)
_JINJA_STATEMENT = re.compile(r"{%.*?%}", re.DOTALL)
_JINJA_EXPRESSION = re.compile(r"{{.*?}}", re.DOTALL)
# What an expression block becomes: a number keeps PromQL (`> {{ x }}`, `[{{ w }}]`) and YAML (`for: {{ w }}`)
# well formed, and is never a metric name.
JINJA_PLACEHOLDER = "0"


def strip_jinja(text: str) -> str:
    """A Jinja template's text with its Jinja taken out, so that YAML and PromQL readers see plain text.

    Comments, macro definitions and statements ({% if %}, {% set %}, ...) go (a line holding only a comment or
    a statement goes whole), so both branches of an if stay; {{ ... }} becomes JINJA_PLACEHOLDER; {% raw %}
    bodies stay as they are (there the braces are Prometheus's own `{{ $labels.node }}`).
    """
    raws: list[str] = []

    def keep_raw(match: re.Match[str]) -> str:
        raws.append(match.group(1))
        return f"\x00{len(raws) - 1}\x00"

    text = _JINJA_RAW.sub(keep_raw, text)
    text = _JINJA_COMMENT_LINE.sub("", text)
    text = _JINJA_COMMENT.sub("", text)
    text = _JINJA_MACRO.sub("", text)
    text = _JINJA_STATEMENT_LINE.sub("", text)
    text = _JINJA_STATEMENT.sub("", text)
    text = _JINJA_EXPRESSION.sub(JINJA_PLACEHOLDER, text)
    return re.sub(r"\x00(\d+)\x00", lambda match: raws[int(match.group(1))], text)


# ---------------------------------------------------------------------------------------------- rules and dashboards


@dataclass(frozen=True)
class Expression:
    """One PromQL expression and where it stands: the file, and the rule ('alert X', 'record y') or the panel
    ('panel "Title" (id 3) target A')."""

    source: str
    where: str
    expr: str


@dataclass(frozen=True)
class MetricUse:
    """One metric name one expression selects."""

    name: str
    source: str
    where: str


def rule_expressions(text: str, source: str) -> list[Expression]:
    """Every rule's expression in a Prometheus rule file (or its Jinja template, read with strip_jinja)."""
    document = yaml.safe_load(strip_jinja(text)) or {}
    found = []
    for group in document.get("groups") or []:
        for rule in group.get("rules") or []:
            kind = "alert" if "alert" in rule else "record"
            label = f"{kind} {rule.get(kind, '?')} (group {group.get('name', '?')})"
            found.append(Expression(source=source, where=label, expr=str(rule.get("expr", ""))))
    return found


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, those inside collapsed rows too."""
    found = []
    for panel in dashboard.get("panels") or []:
        found.append(panel)
        found.extend(panel.get("panels") or [])
    return found


def dashboard_expressions(dashboard: dict[str, Any], source: str = "") -> list[Expression]:
    """Every panel target's expression of a Grafana dashboard, in panel order (rows hold no targets)."""
    found = []
    for panel in _panels(dashboard):
        for target in panel.get("targets") or []:
            if target.get("expr"):
                where = (
                    f"panel {panel.get('title', '?')!r} (id {panel.get('id', '?')}) target {target.get('refId', '?')}"
                )
                found.append(Expression(source=source, where=where, expr=str(target["expr"])))
    return found


def dashboard_file_expressions(text: str, source: str) -> list[Expression]:
    """dashboard_expressions of a dashboard JSON file's text."""
    return dashboard_expressions(json.loads(text), source)


def grafana_query(expr: str, variables: dict[str, str] | None = None) -> str:
    """A panel expression as Prometheus's query API takes it: Grafana's $__rate_interval, $__interval and
    $__range (1m unless given) and the dashboard's own variables ($node, ${node}) replaced by `variables`."""
    values = {"__rate_interval": "1m", "__interval": "1m", "__range": "1h", **(variables or {})}

    def value_of(match: re.Match[str]) -> str:
        name = match.group(0).lstrip("$").strip("{}[]").split(":")[0]
        return values.get(name, match.group(0))

    return _GRAFANA_VARIABLE.sub(value_of, expr)


def dashboard_variables(dashboard: dict[str, Any]) -> dict[str, str]:
    """Each dashboard variable's current value as a query would hold it: "All" (or a query variable's allValue)
    as a regex matching everything, several values as an alternation, a textbox's own text."""
    values = {}
    for variable in (dashboard.get("templating") or {}).get("list") or []:
        current = (variable.get("current") or {}).get("value", variable.get("query", ""))
        chosen = current if isinstance(current, list) else [current]
        if "$__all" in chosen:
            values[variable["name"]] = variable.get("allValue") or ".*"
        elif all(isinstance(item, str) for item in chosen):
            values[variable["name"]] = "|".join(chosen)
    return values


def dashboard_queries(
    dashboard: dict[str, Any], variables: dict[str, str] | None = None
) -> list[tuple[Expression, str]]:
    """Every panel expression with the query Prometheus's API takes for it (the dashboard's variables at their
    current values unless `variables` says otherwise): what a test sends to a live Prometheus, panel by panel."""
    values = {**dashboard_variables(dashboard), **(variables or {})}
    return [(item, grafana_query(item.expr, values)) for item in dashboard_expressions(dashboard)]


def metric_uses(expressions: list[Expression]) -> list[MetricUse]:
    """The metric names each expression selects, sorted by name, then by file and place."""
    uses = {
        MetricUse(name=name, source=item.source, where=item.where)
        for item in expressions
        for name in promql_metric_names(item.expr)
    }
    return sorted(uses, key=lambda use: (use.name, use.source, use.where))


def missing_metrics(uses: list[MetricUse], exposition: Exposition, prefix: str = "vllm:") -> list[MetricUse]:
    """The uses of names starting with `prefix` that the exposition does not offer (a rule on them is dead)."""
    offered = exposition.series_names()
    return [use for use in uses if use.name.startswith(prefix) and use.name not in offered]


def describe_missing(missing: list[MetricUse]) -> list[str]:
    """One line per missing use: the name, the file and the rule or panel."""
    return [f"{use.name}: not exported, used by {use.where} in {use.source}" for use in missing]
