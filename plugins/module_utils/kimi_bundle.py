"""The manifest of an air-gapped bundle (bin/kimi-bundle): what the bundle was built for, what it holds, and the
checks the mirror host and preflight run on it before anything is served or installed.

A bundle is a directory: the apt repository, the wheelhouse and optionally the checkpoint laid out as a Hub
mirror, plus MANIFEST_NAME (the document this module writes) and its detached signature SIGNATURE_NAME. The
manifest records every file's size and sha256 and the inputs the bundle was built for (distribution, Python,
pip platforms, the apt and pip pins, the checkpoint, the inventory), so that

- the mirror host checks sizes, then checksums, before serving anything (verify_tree);
- preflight refuses a bundle built for other inputs, naming each difference (compare_inputs; match_manifest
  against the manifest the mirror serves);
- the bundle's apt index and wheelhouse are checked against its pins (apt_index_problems, wheelhouse_problems);
- building again after a pin bump fetches only what changed, and an interrupted build resumes (plan_fetches).

Stdlib and `packaging` only, free of Ansible imports; the only I/O is reading the tree a caller names. The tree
walk, the files' checks and the document's shape are kimi_bundle_tree.py's (stdlib only: the mirror host runs
them), re-exported here.
Imported as ``ansible_collections.kimi.k2.plugins.module_utils.kimi_bundle`` everywhere, the tests included.
"""

from __future__ import annotations

import hashlib
import json
import operator
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import PurePosixPath
from typing import Any, TypeVar

from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from .kimi_bundle_tree import (
    MANIFEST_KIND,
    MANIFEST_NAME,
    OWN_FILES,
    SCHEMA_VERSION,
    SHA256_HEX,
    BundleError,
    ManifestError,
    checked_entries,
    read_document,
    totals,
)

# The rest of the manifest's stdlib-only part (kimi_bundle_tree.py, which the mirror host runs), re-exported: the
# builder, preflight and the tests read every manifest name here.
from .kimi_bundle_tree import SIGNATURE_NAME as SIGNATURE_NAME
from .kimi_bundle_tree import BundleTreeError as BundleTreeError
from .kimi_bundle_tree import TreeItem as TreeItem
from .kimi_bundle_tree import hash_file as hash_file
from .kimi_bundle_tree import manifest_entries as manifest_entries
from .kimi_bundle_tree import manifest_text as manifest_text
from .kimi_bundle_tree import safe_path as _safe_path  # its name here before it moved (kimi_bundle_hf imports it)
from .kimi_bundle_tree import tree_items as tree_items
from .kimi_bundle_tree import verify_tree as verify_tree
from .kimi_inputs import DEBIAN_VERSION, HEX_COMMIT, REPO_ID, as_bool
from .kimi_pinset import expand_platforms

# The inventory variables a bundle is built from (resolved values, as an Ansible task passes them).
INVENTORY_NAME = "kimi_bundle_inventory_name"
DISTRIBUTION = "kimi_bundle_distribution"
CODENAME = "kimi_bundle_codename"
ARCHITECTURE = "kimi_bundle_architecture"
PYTHON_VERSION = "vllm_python_version"
PLATFORMS = "vllm_platforms"
DEB_PINS = "kimi_deb_pins"
# Roles that pin their debs per release ({bookworm: {nftables: ...}}); only those the caller passes are read.
RELEASE_DEB_PINS = ("firewall_deb_pins", "monitoring_deb_pins", "router_deb_pins", "offline_mirror_deb_pins")
# The roles' own pins that hold for every release: the driver and its fabric manager at the driver's version
# (roles/nvidia_driver), NVIDIA's DCGM exporter and its core (roles/monitoring), from NVIDIA's repository.
ROLE_DEB_PINS = ("nvidia_driver_pins", "monitoring_dcgm_pins")
APT_PACKAGES = "kimi_bundle_apt_packages"
PIP_PINS = "kimi_vllm_pip_pins"
PIP_OVERRIDES = "kimi_vllm_pip_overrides"
WITH_CHECKPOINT = "kimi_bundle_checkpoint"
CHECKPOINT_REPO_ID = "kimi_checkpoint_repo_id"
CHECKPOINT_REVISION = "kimi_checkpoint_revision"
CHECKPOINT_INCLUDE = "kimi_checkpoint_include"
CHECKPOINT_EXCLUDE = "kimi_checkpoint_exclude"
# roles/checkpoint installs the hf CLI as huggingface_hub at this version, from the bundle's wheelhouse.
HF_VERSION = "checkpoint_hf_version"
HF_DISTRIBUTION = "huggingface-hub"
# Every variable inputs_from_variables reads, for whoever resolves them from an inventory
# (playbooks/bundle_inputs.yml; a unit test keeps its list equal to this one).
INPUT_VARIABLES = (
    INVENTORY_NAME,
    DISTRIBUTION,
    CODENAME,
    ARCHITECTURE,
    PYTHON_VERSION,
    PLATFORMS,
    DEB_PINS,
    *RELEASE_DEB_PINS,
    *ROLE_DEB_PINS,
    APT_PACKAGES,
    PIP_PINS,
    PIP_OVERRIDES,
    HF_VERSION,
    WITH_CHECKPOINT,
    CHECKPOINT_REPO_ID,
    CHECKPOINT_REVISION,
    CHECKPOINT_INCLUDE,
    CHECKPOINT_EXCLUDE,
)

# "debian-12", "ubuntu-24.04": the distribution's lower-case name and the version apt sources are made for
# (Debian's major version, Ubuntu's release), as preflight builds it from a node's facts.
DISTRIBUTION_ID = re.compile(r"[a-z][a-z0-9]*-[0-9]+(?:\.[0-9]+)?")
CODENAME_ID = re.compile(r"[a-z][a-z0-9-]*")
# Releases whose codename is known, to catch a mismatched pair; other distributions are taken as given.
KNOWN_CODENAMES = {
    "debian-11": "bullseye",
    "debian-12": "bookworm",
    "debian-13": "trixie",
    "ubuntu-22.04": "jammy",
    "ubuntu-24.04": "noble",
}
# Debian's architecture name -> the machine name wheel platform tags end with.
WHEEL_MACHINES = {"amd64": "x86_64", "arm64": "aarch64", "ppc64el": "ppc64le", "s390x": "s390x"}
PYTHON_MINOR = re.compile(r"3\.[0-9]{1,2}")
PLATFORM_TAG = re.compile(r"(?:(?:manylinux|musllinux)_[0-9]+_[0-9]+|manylinux(?:1|2010|2014)|linux)_(\w+)")
INVENTORY_NAME_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
DEBIAN_PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.-]+")
PIP_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")

T = TypeVar("T")


class BundleInputError(BundleError):
    """Inputs a bundle cannot be built for; `problems` holds (variable, message) pairs, every one named."""

    def __init__(self, problems: Sequence[tuple[str, str]]) -> None:
        self.problems = list(problems)
        self.variables = [variable for variable, _ in self.problems]
        super().__init__("; ".join(f"{variable} {message}" for variable, message in self.problems))


class _BadValueError(Exception):
    """One bad value, raised by a field parser and collected, so that one run names every bad variable."""

    def __init__(self, variable: str, message: str) -> None:
        super().__init__(f"{variable} {message}")
        self.variable = variable
        self.message = message


class _Collector:
    def __init__(self) -> None:
        self.problems: list[tuple[str, str]] = []

    def take(self, parse: Callable[..., T], *args: Any) -> T | None:
        try:
            return parse(*args)
        except _BadValueError as bad:
            self.problems.append((bad.variable, bad.message))
            return None


# ------------------------------------------------------------------------------------------ build inputs


@dataclass(frozen=True)
class Checkpoint:
    """The checkpoint a bundle carries: a repository at one commit, with the role's file filters."""

    repo_id: str
    revision: str
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    def describe(self) -> str:
        return f"{self.repo_id} at {self.revision}"


@dataclass(frozen=True)
class BuildInputs:
    """What a bundle was built for. Names are PEP 503-normalised, versions of pip pins PEP 440-normalised."""

    inventory_name: str
    distribution: str
    codename: str
    architecture: str
    python_version: str
    platforms: tuple[str, ...]
    apt_pins: dict[str, str]
    pip_pins: dict[str, str]
    pip_overrides: dict[str, str] = field(default_factory=dict)
    # Debs the converge installs at the release's version (python3-venv, g++): only their presence is checked.
    apt_packages: tuple[str, ...] = ()
    checkpoint: Checkpoint | None = None
    # The hf CLI's huggingface_hub version (roles/checkpoint's venv); None: the bundle carries no hf CLI.
    hf_version: str | None = None
    # Which variable each apt pin came from, for messages only: not part of what the bundle was built for.
    apt_pin_sources: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    def matters(self) -> dict[str, Any]:
        """Every input that decides the bundle's contents (all but the inventory's name), JSON-ready."""
        checkpoint = None
        if self.checkpoint is not None:
            checkpoint = {
                "repo_id": self.checkpoint.repo_id,
                "revision": self.checkpoint.revision,
                "include": list(self.checkpoint.include),
                "exclude": list(self.checkpoint.exclude),
            }
        return {
            "distribution": self.distribution,
            "codename": self.codename,
            "architecture": self.architecture,
            "python_version": self.python_version,
            "platforms": list(self.platforms),
            "apt_pins": dict(sorted(self.apt_pins.items())),
            "apt_packages": list(self.apt_packages),
            "pip_pins": dict(sorted(self.pip_pins.items())),
            "pip_overrides": dict(sorted(self.pip_overrides.items())),
            "checkpoint": checkpoint,
            "hf_version": self.hf_version,
        }

    def inputs_sha256(self) -> str:
        return hashlib.sha256(canonical_json(self.matters()).encode()).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        return {"inventory": {"name": self.inventory_name, "sha256": self.inputs_sha256()}, **self.matters()}


def canonical_json(value: Any) -> str:
    """One byte sequence per value (sorted keys, no spaces, ASCII), so equal inputs hash equally everywhere."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _text(value: Any, variable: str, pattern: re.Pattern[str], expected: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value.strip()):
        raise _BadValueError(variable, f"must be {expected} (got {value!r})")
    return value.strip()


def _python_version(value: Any, variable: str) -> str:
    if isinstance(value, float):
        # YAML reads an unquoted 3.10 as the number 3.1: refuse every number rather than guess.
        raise _BadValueError(variable, f'must be a quoted string such as "3.11" (got the number {value!r})')
    return _text(value, variable, PYTHON_MINOR, 'the nodes\' Python as MAJOR.MINOR, e.g. "3.11"')


def _string_list(value: Any, variable: str, pattern: re.Pattern[str] | None = None) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise _BadValueError(variable, f"must be a list (got {value!r})")
    for item in value:
        if not isinstance(item, str) or (pattern is not None and not pattern.fullmatch(item)):
            raise _BadValueError(variable, f"has an entry that is not a valid name: {item!r}")
    return tuple(sorted(set(value)))


def _platforms(value: Any, variable: str, architecture: str | None) -> tuple[str, ...]:
    platforms = _string_list(value, variable)
    if not platforms:
        raise _BadValueError(variable, "must name at least one platform tag, e.g. manylinux_2_36_x86_64")
    machine = WHEEL_MACHINES.get(architecture or "")
    for platform in platforms:
        found = PLATFORM_TAG.fullmatch(platform)
        if not found:
            raise _BadValueError(
                variable, f"has {platform!r}, which is not a Linux platform tag (manylinux_2_36_x86_64)"
            )
        if machine and found.group(1) != machine:
            raise _BadValueError(variable, f"has {platform!r}, not for {machine} ({ARCHITECTURE} is {architecture})")
    return platforms


def _architecture(value: Any, variable: str) -> str:
    if value not in WHEEL_MACHINES:
        raise _BadValueError(variable, f"must be one of {', '.join(sorted(WHEEL_MACHINES))} (got {value!r})")
    return str(value)


def _codename(value: Any, variable: str, distribution: str | None) -> str:
    codename = _text(value, variable, CODENAME_ID, 'the release\'s codename, e.g. "bookworm"')
    known = KNOWN_CODENAMES.get(distribution or "")
    if known and codename != known:
        raise _BadValueError(variable, f"is {codename!r}, but {distribution} is {known!r}")
    return codename


def _deb_pins(value: Any, variable: str) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise _BadValueError(variable, f"must be a mapping of Debian package to exact version (got {value!r})")
    pins = {}
    for package, version in value.items():
        if not isinstance(package, str) or not DEBIAN_PACKAGE.fullmatch(package):
            raise _BadValueError(variable, f"has {package!r}, which is not a Debian package name")
        if not isinstance(version, str) or not DEBIAN_VERSION.fullmatch(version.strip()):
            raise _BadValueError(variable, f"pins {package} to {version!r}, not one exact Debian version")
        pins[package] = version.strip()
    return pins


def _release_deb_pins(value: Any, variable: str, codename: str | None) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise _BadValueError(variable, f"must be a mapping of release to pins (got {value!r})")
    if codename is not None and codename not in value:
        raise _BadValueError(variable, f"has no entry for {codename} (it has {', '.join(sorted(map(str, value)))})")
    return _deb_pins(value.get(codename, {}), f"{variable}.{codename}")


def _merge_apt_pins(sources: Mapping[str, Mapping[str, str]]) -> tuple[dict[str, str], dict[str, str]]:
    """All pins as one mapping and where each came from; one package pinned twice must agree."""
    pins: dict[str, str] = {}
    origin: dict[str, str] = {}
    for variable, variable_pins in sources.items():
        for package, version in variable_pins.items():
            if package in pins and pins[package] != version:
                raise _BadValueError(
                    variable, f"pins {package} to {version}, {origin[package]} to {pins[package]}: make them agree"
                )
            pins[package], origin[package] = version, variable
    return dict(sorted(pins.items())), origin


def _exact_pip_version(package: str, version: Any, variable: str) -> str:
    text = version.strip() if isinstance(version, str) else ""
    try:
        return str(Version(text))
    except InvalidVersion:
        raise _BadValueError(variable, f"pins {package} to {version!r}, not one exact PEP 440 version") from None


def _pip_pins(value: Any, variable: str, required: bool) -> dict[str, str]:
    if value is None and not required:
        return {}
    if not isinstance(value, Mapping) or (required and not value):
        raise _BadValueError(
            variable, f'must be a mapping of package to version, e.g. {{vllm: "0.23.0"}} (got {value!r})'
        )
    pins: dict[str, str] = {}
    spelled: dict[str, str] = {}
    for package, version in value.items():
        if not isinstance(package, str) or not PIP_NAME.fullmatch(package):
            raise _BadValueError(variable, f"has {package!r}, which is not a Python package name")
        name = canonicalize_name(package)
        if name in pins:
            raise _BadValueError(variable, f"pins {spelled[name]} and {package}, one package (PEP 503): keep one")
        pins[name], spelled[name] = _exact_pip_version(package, version, variable), package
    return dict(sorted(pins.items()))


def _checkpoint(variables: Mapping[str, Any], names: Mapping[str, str]) -> Checkpoint:
    repo_id = _text(variables.get(names["repo_id"]), names["repo_id"], REPO_ID, "a Hub repository id org/name")
    # A bundle is frozen: a branch would name whatever the Hub has on the day of the build.
    revision = _text(variables.get(names["revision"]), names["revision"], HEX_COMMIT, "a 40-hex commit")
    include = _string_list(variables.get(names["include"]) or [], names["include"])
    exclude = _string_list(variables.get(names["exclude"]) or [], names["exclude"])
    return Checkpoint(repo_id, revision, include, exclude)


def _hf_version(value: Any, variable: str) -> str | None:
    return None if value is None else _exact_pip_version(HF_DISTRIBUTION, value, variable)


def _wants_checkpoint(value: Any, variable: str) -> bool:
    wanted = as_bool(False if value is None else value)
    if wanted is None:
        raise _BadValueError(variable, f"must be true or false (got {value!r})")
    return wanted


def _release_pins(variables: Mapping[str, Any], codename: str | None, collect: _Collector) -> dict[str, dict]:
    sources = {DEB_PINS: collect.take(_deb_pins, variables.get(DEB_PINS), DEB_PINS) or {}}
    for variable in RELEASE_DEB_PINS:
        if variable in variables and codename is not None:
            sources[variable] = collect.take(_release_deb_pins, variables[variable], variable, codename) or {}
    for variable in ROLE_DEB_PINS:
        if variable in variables:
            sources[variable] = collect.take(_deb_pins, variables[variable], variable) or {}
    return sources


def inputs_from_variables(variables: Mapping[str, Any]) -> BuildInputs:
    """BuildInputs from an inventory's resolved variables; BundleInputError names every bad variable."""
    collect = _Collector()
    name = collect.take(_text, variables.get(INVENTORY_NAME), INVENTORY_NAME, INVENTORY_NAME_ID, "a name")
    distribution = collect.take(
        _text, variables.get(DISTRIBUTION), DISTRIBUTION, DISTRIBUTION_ID, 'NAME-VERSION, e.g. "debian-12"'
    )
    codename = collect.take(_codename, variables.get(CODENAME), CODENAME, distribution)
    # amd64 unless set: the collection's NVIDIA repository (nvidia_repo_url) is the x86_64 one.
    architecture = collect.take(_architecture, variables.get(ARCHITECTURE, "amd64"), ARCHITECTURE)
    python = collect.take(_python_version, variables.get(PYTHON_VERSION), PYTHON_VERSION)
    platforms = collect.take(_platforms, variables.get(PLATFORMS), PLATFORMS, architecture)
    sources = _release_pins(variables, codename, collect)
    merged = collect.take(_merge_apt_pins, sources) or ({}, {})
    apt_packages = collect.take(_string_list, variables.get(APT_PACKAGES) or [], APT_PACKAGES, DEBIAN_PACKAGE)
    pip_pins = collect.take(_pip_pins, variables.get(PIP_PINS), PIP_PINS, True)
    overrides = collect.take(_pip_pins, variables.get(PIP_OVERRIDES), PIP_OVERRIDES, False)
    hf_version = collect.take(_hf_version, variables.get(HF_VERSION), HF_VERSION)
    checkpoint = None
    if collect.take(_wants_checkpoint, variables.get(WITH_CHECKPOINT), WITH_CHECKPOINT):
        names = {
            "repo_id": CHECKPOINT_REPO_ID,
            "revision": CHECKPOINT_REVISION,
            "include": CHECKPOINT_INCLUDE,
            "exclude": CHECKPOINT_EXCLUDE,
        }
        checkpoint = collect.take(_checkpoint, variables, names)
    if collect.problems:
        raise BundleInputError(collect.problems)
    return BuildInputs(
        inventory_name=name or "",
        distribution=distribution or "",
        codename=codename or "",
        architecture=architecture or "",
        python_version=python or "",
        platforms=platforms or (),
        apt_pins=merged[0],
        pip_pins=pip_pins or {},
        pip_overrides=overrides or {},
        apt_packages=apt_packages or (),
        checkpoint=checkpoint,
        hf_version=hf_version,
        apt_pin_sources=merged[1],
    )


def inputs_from_dict(data: Any, where: str = "built_for") -> BuildInputs:
    """BuildInputs back from to_dict()'s form (a manifest's built_for); BundleInputError names the key."""
    if not isinstance(data, Mapping):
        raise BundleInputError([(where, f"must be a mapping (got {data!r})")])
    inventory = data.get("inventory") if isinstance(data.get("inventory"), Mapping) else {}
    flat = {
        INVENTORY_NAME: inventory.get("name"),
        DISTRIBUTION: data.get("distribution"),
        CODENAME: data.get("codename"),
        ARCHITECTURE: data.get("architecture"),
        PYTHON_VERSION: data.get("python_version"),
        PLATFORMS: data.get("platforms"),
        DEB_PINS: data.get("apt_pins"),
        APT_PACKAGES: data.get("apt_packages"),
        PIP_PINS: data.get("pip_pins"),
        PIP_OVERRIDES: data.get("pip_overrides"),
        HF_VERSION: data.get("hf_version"),
    }
    checkpoint = data.get("checkpoint")
    if isinstance(checkpoint, Mapping):
        flat[WITH_CHECKPOINT] = True
        flat.update({f"kimi_checkpoint_{key}": value for key, value in checkpoint.items()})
    elif checkpoint is not None:
        raise BundleInputError([(f"{where}.checkpoint", f"must be a mapping or null (got {checkpoint!r})")])
    try:
        inputs = inputs_from_variables(flat)
    except BundleInputError as error:
        raise BundleInputError(
            [(_dict_key(variable, where), message) for variable, message in error.problems]
        ) from None
    return replace(inputs, apt_pin_sources={package: f"{where}.apt_pins" for package in inputs.apt_pins})


# The variable each to_dict() key is read through, so a problem in a manifest names the manifest's key.
DICT_KEYS = {
    INVENTORY_NAME: "inventory.name",
    DISTRIBUTION: "distribution",
    CODENAME: "codename",
    ARCHITECTURE: "architecture",
    PYTHON_VERSION: "python_version",
    PLATFORMS: "platforms",
    DEB_PINS: "apt_pins",
    APT_PACKAGES: "apt_packages",
    PIP_PINS: "pip_pins",
    PIP_OVERRIDES: "pip_overrides",
    HF_VERSION: "hf_version",
    CHECKPOINT_REPO_ID: "checkpoint.repo_id",
    CHECKPOINT_REVISION: "checkpoint.revision",
    CHECKPOINT_INCLUDE: "checkpoint.include",
    CHECKPOINT_EXCLUDE: "checkpoint.exclude",
}


def _dict_key(variable: str, where: str) -> str:
    return f"{where}.{DICT_KEYS.get(variable, variable)}"


# ------------------------------------------------------------------------------------ comparing inputs

# The variable behind each compared field, so that what preflight prints says what to change.
FIELD_VARIABLES = {
    "inventory_name": INVENTORY_NAME,
    "distribution": DISTRIBUTION,
    "codename": CODENAME,
    "architecture": ARCHITECTURE,
    "python_version": PYTHON_VERSION,
    "platforms": PLATFORMS,
    "apt_packages": APT_PACKAGES,
    "hf_version": HF_VERSION,
}


def _show(value: Any) -> str:
    if value is None:
        return "none"
    return (", ".join(value) or "none") if isinstance(value, tuple) else str(value)


def _field_difference(name: str, bundle: Any, wanted: Any) -> list[str]:
    if bundle == wanted:
        return []
    return [f"{name} ({FIELD_VARIABLES[name]}): the bundle has {_show(bundle)}, the inventory wants {_show(wanted)}"]


def _same_pip_version(have: str, want: str) -> bool:
    """PEP 440 equality, as pip's == compares: 0.23 is 0.23.0."""
    return Version(have) == Version(want)


def _apt_source(inputs: BuildInputs) -> Callable[[str], str]:
    return lambda package: inputs.apt_pin_sources.get(package, DEB_PINS)


def _pin_differences(
    kind: str,
    bundle: Mapping[str, str],
    wanted: Mapping[str, str],
    source: Callable[[str], str],
    same: Callable[[str, str], bool] = operator.eq,
) -> list[str]:
    lines = []
    for package in sorted(set(bundle) | set(wanted)):
        have, want = bundle.get(package), wanted.get(package)
        label = f"{kind} {package} ({source(package)})"
        if have is None:
            lines.append(f"{label}: the inventory pins {want}, the bundle has no {package}")
        elif want is None:
            lines.append(f"{label}: the bundle pins {have}, the inventory does not pin {package}")
        elif not same(have, want):
            lines.append(f"{label}: the bundle has {have}, the inventory pins {want}")
    return lines


def _checkpoint_differences(bundle: Checkpoint | None, wanted: Checkpoint | None) -> list[str]:
    label = f"checkpoint ({WITH_CHECKPOINT})"
    if bundle is None and wanted is None:
        return []
    if bundle is None or wanted is None:
        have = bundle.describe() if bundle else "none"
        want = wanted.describe() if wanted else "none"
        return [f"{label}: the bundle has {have}, the inventory wants {want}"]
    lines = []
    for name, variable in (
        ("repo_id", CHECKPOINT_REPO_ID),
        ("revision", CHECKPOINT_REVISION),
        ("include", CHECKPOINT_INCLUDE),
        ("exclude", CHECKPOINT_EXCLUDE),
    ):
        have, want = getattr(bundle, name), getattr(wanted, name)
        if have != want:
            lines.append(
                f"checkpoint {name} ({variable}): the bundle has {_show(have)}, the inventory wants {_show(want)}"
            )
    return lines


def compare_inputs(bundle: BuildInputs, wanted: BuildInputs) -> list[str]:
    """Every way the bundle's inputs differ from the inventory's, each naming the field, the variable and
    both values; empty when the bundle was built for exactly these inputs."""
    lines = []
    for name in ("inventory_name", "distribution", "codename", "architecture", "python_version", "platforms"):
        lines += _field_difference(name, getattr(bundle, name), getattr(wanted, name))
    lines += _pin_differences("apt package", bundle.apt_pins, wanted.apt_pins, _apt_source(wanted))
    lines += _field_difference("apt_packages", bundle.apt_packages, wanted.apt_packages)
    lines += _pin_differences("pip package", bundle.pip_pins, wanted.pip_pins, lambda _: PIP_PINS, _same_pip_version)
    lines += _pin_differences(
        "pip override", bundle.pip_overrides, wanted.pip_overrides, lambda _: PIP_OVERRIDES, _same_pip_version
    )
    lines += _field_difference("hf_version", bundle.hf_version, wanted.hf_version)
    lines += _checkpoint_differences(bundle.checkpoint, wanted.checkpoint)
    return lines


# ------------------------------------------------------------------------------------------ the document


def _timestamp(created_at: datetime) -> str:
    if created_at.tzinfo is None:
        raise ValueError("created_at must carry a time zone (datetime.now(UTC))")
    return created_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def manifest_document(inputs: BuildInputs, entries: Sequence[Mapping[str, Any]], created_at: datetime) -> dict:
    """The manifest: schema, when, what the bundle was built for, every file, and totals to read at a glance."""
    files = checked_entries(list(entries))
    return {
        "schema": SCHEMA_VERSION,
        "kind": MANIFEST_KIND,
        "created_at": _timestamp(created_at),
        "built_for": inputs.to_dict(),
        "files": files,
        "totals": totals(files),
    }


def read_manifest(text: str) -> dict[str, Any]:
    """A manifest's document after every check that needs no tree: kimi_bundle_tree.read_document's (schema,
    kind, files, totals), then built_for's inputs against the sha256 recorded with them. ManifestError names the
    key that fails."""
    document = read_document(text)
    inputs = manifest_inputs(document)
    recorded = document["built_for"].get("inventory", {}).get("sha256")
    if recorded != inputs.inputs_sha256():
        raise ManifestError(
            f"{MANIFEST_NAME}: built_for.inventory.sha256 is {recorded}, its inputs hash to {inputs.inputs_sha256()} "
            "(edited after the build?)"
        )
    return document


def manifest_inputs(document: Mapping[str, Any]) -> BuildInputs:
    try:
        return inputs_from_dict(document.get("built_for"))
    except BundleInputError as error:
        raise ManifestError(f"{MANIFEST_NAME}: {error}") from None


# ------------------------------------------------------------------------- the served bundle against a node


@dataclass(frozen=True)
class BundleMatch:
    """A served bundle against one node: the inputs digest its manifest records, and every difference between
    what it was built for and the node's inputs (compare_inputs' lines; none: built for exactly these inputs)."""

    inputs_sha256: str
    differences: list[str]


def match_manifest(text: str, variables: Mapping[str, Any]) -> BundleMatch:
    """The manifest `text` (as the mirror serves it) against one node's resolved `variables` (INPUT_VARIABLES).

    The manifest goes through read_manifest first, so a built_for edited after the build never counts as what the
    bundle holds (ManifestError); the node's values are judged as a build judges them (BundleInputError names each
    bad variable), so a value no bundle could be built for is named as such, not as a difference."""
    bundle = manifest_inputs(read_manifest(text))
    return BundleMatch(bundle.inputs_sha256(), compare_inputs(bundle, inputs_from_variables(variables)))


def mismatch_message(host: str, source: str, differences: Sequence[str]) -> str:
    """The refusal of a bundle built for other inputs: the node, the manifest's address, every difference (each
    names the variable and both values), and the two ways out."""
    count = f"{len(differences)} difference{'s' if len(differences) != 1 else ''}"
    return (
        f"{host}: the bundle at {source} was built for other inputs than this node's ({count}), so nothing is "
        f"installed from it: {'; '.join(differences)}. Build and serve a bundle for this inventory "
        "(bin/kimi-bundle build -i INVENTORY), or set these variables as the bundle has them."
    )


def bad_node_inputs_message(host: str, error: BundleInputError) -> str:
    """The refusal of a node whose own values no bundle could be built for (bin/kimi-bundle build refuses them
    too), each bad variable named."""
    problems = "; ".join(f"{variable} {message}" for variable, message in error.problems)
    return f"{host}: the bundle cannot be matched against this node's values, which no bundle is built for: {problems}"


def bad_manifest_message(host: str, source: str, error: BundleError) -> str:
    """The refusal of a manifest this collection cannot read or trust (not JSON, another schema, edited)."""
    return f"{host}: {source} is not a bundle manifest this collection can use, nothing is installed from it: {error}"


# ------------------------------------------------------------------------------- the bundle's contents


def parse_deb822(text: str, where: str = "Packages") -> list[dict[str, str]]:
    """The stanzas of a Debian control-format file (an apt Packages index): field -> value, continuation
    lines joined with newlines."""
    stanzas: list[dict[str, str]] = []
    current: dict[str, str] = {}
    last = ""
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            if current:
                stanzas.append(current)
            current, last = {}, ""
        elif line[0] in " \t" and last:
            current[last] += "\n" + line[1:]
        elif ":" in line and line[0] not in " \t#":
            last, value = (part.strip() for part in line.split(":", 1))
            current[last] = value
        else:
            raise BundleError(f"{where} line {number}: not a 'Field: value' line: {line!r}")
    if current:
        stanzas.append(current)
    return stanzas


def _index_versions(stanzas: Iterable[Mapping[str, str]], architecture: str, where: str) -> tuple[dict, list[str]]:
    """{package: versions the nodes can install} and the index's files built for another architecture."""
    versions: dict[str, set[str]] = {}
    foreign = []
    for stanza in stanzas:
        arch = stanza.get("Architecture", "")
        if arch not in (architecture, "all"):
            foreign.append(
                f"{stanza.get('Filename', stanza.get('Package'))} ({where}): built for {arch}, "
                f"the nodes are {architecture}"
            )
            continue
        versions.setdefault(stanza.get("Package", ""), set()).add(stanza.get("Version", ""))
    return versions, foreign


def apt_index_problems(packages_text: str, inputs: BuildInputs, where: str = "Packages") -> list[str]:
    """What the bundle's apt index lacks for `inputs`: every pinned package at its version, every unpinned one
    at some version, nothing for another architecture; each line names the package and the variable."""
    versions, problems = _index_versions(parse_deb822(packages_text, where), inputs.architecture, where)
    source = _apt_source(inputs)
    for package, version in inputs.apt_pins.items():
        have = versions.get(package, set())
        if version not in have:
            it_has = f" (it has {', '.join(sorted(have))})" if have else ""
            problems.append(f"apt package {package} {version} ({source(package)}): not in the bundle's {where}{it_has}")
    for package in inputs.apt_packages:
        if package not in versions:
            problems.append(f"apt package {package} ({APT_PACKAGES}): not in the bundle's {where}")
    return problems


def supported_tags(python_version: str, platforms: Iterable[str]) -> set[Tag]:
    """Every wheel tag CPython `python_version` on `platforms` installs, as pip on the node would accept them."""
    minor = int(python_version.split(".")[1])
    expanded = expand_platforms(platforms)
    # pip on a node also accepts wheels built locally (linux_<machine>), which --platform tags leave out.
    expanded += sorted({f"linux_{found.group(1)}" for found in map(PLATFORM_TAG.fullmatch, expanded) if found})
    version = (3, minor)
    tags = set(cpython_tags(python_version=version, platforms=expanded))
    return tags | set(compatible_tags(python_version=version, interpreter=f"cp3{minor}", platforms=expanded))


def wheelhouse_problems(wheel_paths: Iterable[str], inputs: BuildInputs) -> list[str]:
    """Wheels the nodes cannot install (named by file) and pins without an installable wheel (named by
    variable), for the bundle's Python and platforms."""
    supported = supported_tags(inputs.python_version, inputs.platforms)
    target = f"Python {inputs.python_version} on {', '.join(inputs.platforms)}"
    installable: dict[str, list[Version]] = {}
    problems = []
    for path in sorted(wheel_paths):
        try:
            name, version, _, tags = parse_wheel_filename(PurePosixPath(path).name)
        except InvalidWheelFilename as error:
            problems.append(f"{path}: not a wheel file name ({error})")
            continue
        if tags & supported:
            installable.setdefault(name, []).append(version)
        else:
            problems.append(
                f"{path}: cannot be installed with {target} (its tags: {', '.join(sorted(map(str, tags)))})"
            )
    hf_pin = {HF_DISTRIBUTION: inputs.hf_version} if inputs.hf_version else {}
    for variable, pins in ((PIP_PINS, inputs.pip_pins), (PIP_OVERRIDES, inputs.pip_overrides), (HF_VERSION, hf_pin)):
        for name, version in pins.items():
            have = installable.get(name, [])
            if Version(version) not in have:
                it_has = f" (it has {', '.join(sorted(map(str, have)))})" if have else ""
                problems.append(
                    f"pip package {name} {version} ({variable}): no wheel for {target} in the bundle{it_has}"
                )
    return problems


# -------------------------------------------------------------------------------------------- rebuilding


@dataclass(frozen=True)
class Artifact:
    """One file the new build needs, where it goes in the bundle, and its size and sha256 when the source
    publishes them in advance (apt's Packages, pip's report, the Hub's LFS entries)."""

    path: str
    size: int | None = None
    sha256: str | None = None


@dataclass(frozen=True)
class FetchPlan:
    """reuse: (new path, old path holding the same bytes); fetch: (artifact, why); drop: old paths not needed.

    A builder links or copies the reused files first, then fetches, then removes the dropped ones.
    """

    reuse: list[tuple[str, str]]
    fetch: list[tuple[Artifact, str]]
    drop: list[str]

    def fetch_bytes(self) -> int | None:
        """Bytes to download; None when some artifact's size is not known in advance."""
        sizes = [artifact.size for artifact, _ in self.fetch]
        return None if None in sizes else sum(sizes)


def _checked_artifacts(wanted: Iterable[Artifact]) -> list[Artifact]:
    artifacts = list(wanted)
    seen: set[str] = set()
    for artifact in artifacts:
        if not _safe_path(artifact.path) or artifact.path in OWN_FILES or artifact.path in seen:
            raise BundleError(f"artifact {artifact.path!r}: needs a unique relative path inside the bundle")
        if artifact.size is not None and (isinstance(artifact.size, bool) or artifact.size < 0):
            raise BundleError(f"artifact {artifact.path}: size must be a whole number of bytes or None")
        if artifact.sha256 is not None and not SHA256_HEX.fullmatch(artifact.sha256):
            raise BundleError(f"artifact {artifact.path}: sha256 must be 64 lower-case hex digits or None")
        seen.add(artifact.path)
    return artifacts


def _reuse_source(artifact: Artifact, have: Mapping[str, Mapping], by_sha256: Mapping[str, list[str]]) -> str | None:
    """The old path holding exactly the artifact's bytes (its own path first), or None."""
    candidates = by_sha256.get(artifact.sha256 or "", [])
    for path in sorted(candidates, key=lambda p: p != artifact.path):
        if artifact.size is None or have[path]["size"] == artifact.size:
            return path
    return None


def _fetch_reason(artifact: Artifact, have: Mapping[str, Mapping]) -> str:
    if artifact.sha256 is None:
        return "its sha256 is not known before the download"
    if artifact.path not in have:
        return "not in the previous build"
    before = have[artifact.path]
    if "sha256" not in before:
        return "a symlink in the previous build"
    if before["sha256"] == artifact.sha256:
        return f"its published size {artifact.size} differs from the previous build's {before['size']} bytes"
    return f"changed (sha256 {before['sha256']} before, {artifact.sha256} now)"


def plan_fetches(have: Sequence[Mapping[str, Any]], wanted: Iterable[Artifact]) -> FetchPlan:
    """What a build can reuse from files it already has (a previous manifest's files, or manifest_entries of
    an interrupted build's tree) and what it must fetch. Reuse is by sha256 only, so a file reached under a
    new path (a checkpoint blob at another revision) is reused too; one without a known sha256 is fetched."""
    entries = {entry["path"]: entry for entry in checked_entries(list(have), "previous files")}
    by_sha256: dict[str, list[str]] = {}
    for path, entry in entries.items():
        if "sha256" in entry:
            by_sha256.setdefault(entry["sha256"], []).append(path)
    reuse, fetch = [], []
    artifacts = _checked_artifacts(wanted)
    for artifact in artifacts:
        source = _reuse_source(artifact, entries, by_sha256)
        if source is None:
            fetch.append((artifact, _fetch_reason(artifact, entries)))
        else:
            reuse.append((artifact.path, source))
    wanted_paths = {artifact.path for artifact in artifacts}
    return FetchPlan(reuse, fetch, sorted(set(entries) - wanted_paths))


def changed_since(old_document: Mapping[str, Any], wanted: Iterable[Artifact]) -> FetchPlan:
    """plan_fetches against the previous bundle's manifest (read with read_manifest)."""
    return plan_fetches(checked_entries(old_document.get("files")), wanted)
