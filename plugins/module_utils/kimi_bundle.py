"""The manifest of an air-gapped bundle (bin/kimi-bundle): what the bundle was built for, what it holds, and the
checks the mirror host and preflight run on it before anything is served or installed.

A bundle is a directory: the apt repository, the wheelhouse and optionally the checkpoint laid out as a Hub
mirror, plus MANIFEST_NAME (the document this module writes) and its detached signature SIGNATURE_NAME. The
manifest records every file's size and sha256 and the inputs the bundle was built for (distribution, Python,
pip platforms, the apt and pip pins, the checkpoint, the inventory), so that

- the mirror host checks sizes, then checksums, before serving anything (verify_tree);
- preflight refuses a bundle built for other inputs, naming each difference (compare_inputs);
- the bundle's apt index and wheelhouse are checked against its pins (apt_index_problems, wheelhouse_problems);
- building again after a pin bump fetches only what changed, and an interrupted build resumes (plan_fetches).

Stdlib and `packaging` only, free of Ansible imports; the only I/O is reading the tree a caller names.
Plugins import it as ``ansible_collections.kimi.k2.plugins.module_utils.kimi_bundle``, the unit tests as
``module_utils.kimi_bundle``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import operator
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from .kimi_checkpoint import HASH_BLOCK
from .kimi_inputs import DEBIAN_VERSION, HEX_COMMIT, REPO_ID, as_bool
from .kimi_pinset import expand_platforms

# 1: files are {path, size, sha256} or {path, symlink}; built_for is BuildInputs.to_dict().
SCHEMA_VERSION = 1
MANIFEST_KIND = "kimi.k2 bundle manifest"
MANIFEST_NAME = "kimi-bundle.json"
SIGNATURE_NAME = "kimi-bundle.json.asc"
# The manifest cannot list itself, nor the signature made over it afterwards.
OWN_FILES = frozenset({MANIFEST_NAME, SIGNATURE_NAME})

# The inventory variables a bundle is built from (resolved values, as an Ansible task passes them).
INVENTORY_NAME = "kimi_bundle_inventory_name"
DISTRIBUTION = "kimi_bundle_distribution"
CODENAME = "kimi_bundle_codename"
ARCHITECTURE = "kimi_bundle_architecture"
PYTHON_VERSION = "vllm_python_version"
PLATFORMS = "vllm_platforms"
DEB_PINS = "kimi_deb_pins"
# Roles that pin their debs per release ({bookworm: {nftables: ...}}); only those the caller passes are read.
RELEASE_DEB_PINS = ("firewall_deb_pins", "monitoring_deb_pins", "router_deb_pins")
APT_PACKAGES = "kimi_bundle_apt_packages"
PIP_PINS = "kimi_vllm_pip_pins"
PIP_OVERRIDES = "kimi_vllm_pip_overrides"
WITH_CHECKPOINT = "kimi_bundle_checkpoint"
CHECKPOINT_REPO_ID = "kimi_checkpoint_repo_id"
CHECKPOINT_REVISION = "kimi_checkpoint_revision"
CHECKPOINT_INCLUDE = "kimi_checkpoint_include"
CHECKPOINT_EXCLUDE = "kimi_checkpoint_exclude"

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
SHA256_HEX = re.compile(r"[0-9a-f]{64}")

T = TypeVar("T")


class BundleError(ValueError):
    """A bundle, its manifest or the inputs it is built from cannot be used; the message names what and why."""


class BundleInputError(BundleError):
    """Inputs a bundle cannot be built for; `problems` holds (variable, message) pairs, every one named."""

    def __init__(self, problems: Sequence[tuple[str, str]]) -> None:
        self.problems = list(problems)
        self.variables = [variable for variable, _ in self.problems]
        super().__init__("; ".join(f"{variable} {message}" for variable, message in self.problems))


class ManifestError(BundleError):
    """A manifest this collection cannot read or trust (malformed, another schema, edited by hand)."""


class BundleTreeError(BundleError):
    """A bundle directory the manifest cannot describe (a symlink leaving it, a device file, a bad name)."""


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
}


def _show(value: Any) -> str:
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
    lines += _checkpoint_differences(bundle.checkpoint, wanted.checkpoint)
    return lines


# --------------------------------------------------------------------------------------- the bundle tree

FILE, SYMLINK, REFUSED = "file", "symlink", "refused"


@dataclass(frozen=True)
class TreeItem:
    """One thing under the bundle root, never followed: a regular file, a symlink inside it, or a refusal (reason)."""

    path: str
    kind: str
    size: int = 0
    target: str = ""
    reason: str = ""


def _symlink_item(root: Path, link: Path, relative: str) -> TreeItem:
    target = str(link.readlink())
    if Path(target).is_absolute():
        # Refused even inside the root: the bundle is copied to the mirror host, where the path means another thing.
        return TreeItem(relative, REFUSED, target=target, reason=f"is a symlink to the absolute path {target}")
    try:
        resolved = link.resolve(strict=True)
    except (OSError, RuntimeError):  # dangling, or a loop (RuntimeError before Python 3.13)
        return TreeItem(relative, REFUSED, target=target, reason=f"is a symlink to {target}, which does not exist")
    if not resolved.is_relative_to(root):
        return TreeItem(relative, REFUSED, target=target, reason=f"is a symlink to {target}, outside the bundle")
    return TreeItem(relative, SYMLINK, target=target)


def _tree_item(root: Path, entry: os.DirEntry) -> TreeItem | None:
    """The item for one directory entry; None for a directory (walked separately)."""
    relative = Path(entry.path).relative_to(root).as_posix()
    try:
        relative.encode("utf-8")
    except UnicodeEncodeError:
        return TreeItem(relative, REFUSED, reason="has a name that is not UTF-8 (a manifest is JSON text)")
    if entry.is_symlink():
        return _symlink_item(root, Path(entry.path), relative)
    if entry.is_dir(follow_symlinks=False):
        return None
    if entry.is_file(follow_symlinks=False):
        return TreeItem(relative, FILE, size=entry.stat(follow_symlinks=False).st_size)
    return TreeItem(relative, REFUSED, reason="is not a regular file, a directory or a symlink")


def tree_items(root: Path) -> list[TreeItem]:
    """Everything under `root` but directories and the manifest's own files, sorted by path; nothing is
    followed, so a symlinked directory is one item and the walk never leaves the root."""
    real_root = Path(root).resolve(strict=True)
    items: list[TreeItem] = []
    pending = [real_root]
    while pending:
        with os.scandir(pending.pop()) as listing:
            for entry in listing:
                item = _tree_item(real_root, entry)
                if item is None:
                    pending.append(Path(entry.path))
                elif item.path not in OWN_FILES:
                    items.append(item)
    return sorted(items, key=lambda item: item.path)


def hash_file(path: Path) -> tuple[int, str]:
    """(bytes read, sha256) in one streaming pass: the size is of the very bytes hashed."""
    digest, size = hashlib.sha256(), 0
    with path.open("rb") as handle:
        while block := handle.read(HASH_BLOCK):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()


def manifest_entries(root: Path) -> list[dict[str, Any]]:
    """Every regular file under `root` ({path, size, sha256}) and every symlink inside it ({path, symlink}),
    sorted by path; BundleTreeError names every symlink that leaves the root and every special file."""
    items = tree_items(root)
    refused = [f"{item.path} {item.reason}" for item in items if item.kind == REFUSED]
    if refused:
        raise BundleTreeError(f"{root}: " + "; ".join(refused))
    real_root = Path(root).resolve()
    entries: list[dict[str, Any]] = []
    for item in items:
        if item.kind == SYMLINK:
            entries.append({"path": item.path, "symlink": item.target})
            continue
        size, sha256 = hash_file(real_root / item.path)
        entries.append({"path": item.path, "size": size, "sha256": sha256})
    return entries


# ------------------------------------------------------------------------------------------ the document


def _safe_path(path: Any) -> bool:
    """A relative POSIX path in canonical form that cannot leave the root ('a/b', never '../a', '/a', 'a//b')."""
    if not isinstance(path, str) or not path or "\0" in path:
        return False
    parts = PurePosixPath(path).parts
    return not path.startswith("/") and "/".join(parts) == path and not {".", ".."} & set(parts)


def _check_entry(entry: Any, where: str) -> str | None:
    """Why one files[] entry is malformed, or None."""
    if not isinstance(entry, Mapping) or not _safe_path(entry.get("path")):
        return f"{where}: needs a relative path inside the bundle (got {entry!r})"
    if entry["path"] in OWN_FILES:
        return f"{where}: lists {entry['path']}, which the manifest cannot describe"
    if set(entry) == {"path", "symlink"}:
        target = entry["symlink"]
        ok = isinstance(target, str) and target and not target.startswith("/")
        return None if ok else f"{where} ({entry['path']}): symlink must be a relative target"
    if set(entry) != {"path", "size", "sha256"}:
        return f"{where} ({entry['path']}): needs exactly path, size and sha256 (got {sorted(entry)})"
    size = entry["size"]
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        return f"{where} ({entry['path']}): size must be a whole number of bytes (got {size!r})"
    if not isinstance(entry["sha256"], str) or not SHA256_HEX.fullmatch(entry["sha256"]):
        return f"{where} ({entry['path']}): sha256 must be 64 lower-case hex digits (got {entry['sha256']!r})"
    return None


def checked_entries(entries: Any, where: str = "files") -> list[dict[str, Any]]:
    """The entries, each well-formed, sorted by path with no path twice; ManifestError names the first bad one."""
    if not isinstance(entries, list):
        raise ManifestError(f"{where} must be a list (got {type(entries).__name__})")
    for index, entry in enumerate(entries):
        problem = _check_entry(entry, f"{where}[{index}]")
        if problem:
            raise ManifestError(problem)
    paths = [entry["path"] for entry in entries]
    for earlier, later in itertools.pairwise(paths):
        if later <= earlier:
            raise ManifestError(f"{where}: {later} is listed after {earlier} (paths must be sorted and unique)")
    return [dict(entry) for entry in entries]


def _timestamp(created_at: datetime) -> str:
    if created_at.tzinfo is None:
        raise ValueError("created_at must carry a time zone (datetime.now(UTC))")
    return created_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _totals(entries: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    files = [entry for entry in entries if "sha256" in entry]
    return {"files": len(files), "symlinks": len(entries) - len(files), "bytes": sum(e["size"] for e in files)}


def manifest_document(inputs: BuildInputs, entries: Sequence[Mapping[str, Any]], created_at: datetime) -> dict:
    """The manifest: schema, when, what the bundle was built for, every file, and totals to read at a glance."""
    files = checked_entries(list(entries))
    return {
        "schema": SCHEMA_VERSION,
        "kind": MANIFEST_KIND,
        "created_at": _timestamp(created_at),
        "built_for": inputs.to_dict(),
        "files": files,
        "totals": _totals(files),
    }


def manifest_text(document: Mapping[str, Any]) -> str:
    """The bytes that are signed: sorted keys, two-space indent, ASCII, one trailing newline."""
    return json.dumps(document, sort_keys=True, indent=2, ensure_ascii=True) + "\n"


def read_manifest(text: str) -> dict[str, Any]:
    """A manifest's document after every check that needs no tree: schema, kind, built_for (and its recorded
    sha256 against the inputs it lists), files and totals. ManifestError names the key that fails."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise ManifestError(f"{MANIFEST_NAME} is not JSON: {error}") from None
    if not isinstance(document, dict):
        raise ManifestError(f"{MANIFEST_NAME} must hold a JSON object")
    if document.get("schema") != SCHEMA_VERSION or document.get("kind") != MANIFEST_KIND:
        raise ManifestError(
            f"{MANIFEST_NAME}: schema {document.get('schema')!r} of kind {document.get('kind')!r} is not one this "
            f"collection reads (schema {SCHEMA_VERSION}, {MANIFEST_KIND!r}): build the bundle with this collection"
        )
    if not isinstance(document.get("created_at"), str):
        raise ManifestError(f"{MANIFEST_NAME}: created_at must be a timestamp string")
    inputs = manifest_inputs(document)
    recorded = document["built_for"].get("inventory", {}).get("sha256")
    if recorded != inputs.inputs_sha256():
        raise ManifestError(
            f"{MANIFEST_NAME}: built_for.inventory.sha256 is {recorded}, its inputs hash to {inputs.inputs_sha256()} "
            "(edited after the build?)"
        )
    files = checked_entries(document.get("files"))
    if document.get("totals") != _totals(files):
        raise ManifestError(
            f"{MANIFEST_NAME}: totals {document.get('totals')} do not add up to files ({_totals(files)})"
        )
    return document


def manifest_inputs(document: Mapping[str, Any]) -> BuildInputs:
    try:
        return inputs_from_dict(document.get("built_for"))
    except BundleInputError as error:
        raise ManifestError(f"{MANIFEST_NAME}: {error}") from None


# ------------------------------------------------------------------------------------------- verification


def _listed_kind(entry: Mapping[str, Any]) -> str:
    return SYMLINK if "symlink" in entry else FILE


def _shape_problem(entry: Mapping[str, Any], item: TreeItem | None) -> str | None:
    """What a stat shows to be wrong (missing, wrong kind, wrong size, wrong link), without reading content."""
    if item is None:
        listed = f"a symlink to {entry['symlink']}" if "symlink" in entry else f"{entry['size']} bytes"
        return f"missing (the manifest lists {listed})"
    if item.kind == REFUSED:
        return item.reason
    if item.kind != _listed_kind(entry):
        return f"is a {item.kind}, the manifest lists a {_listed_kind(entry)}"
    if item.kind == SYMLINK and item.target != entry["symlink"]:
        return f"points to {item.target}, the manifest says {entry['symlink']}"
    if item.kind == FILE and item.size != entry["size"]:
        return f"size {item.size} bytes, the manifest says {entry['size']} bytes"
    return None


def _content_problem(root: Path, entry: Mapping[str, Any]) -> str | None:
    size, sha256 = hash_file(root / entry["path"])
    if size != entry["size"]:  # changed while it was being read
        return f"size {size} bytes, the manifest says {entry['size']} bytes"
    return None if sha256 == entry["sha256"] else f"sha256 {sha256}, the manifest says {entry['sha256']}"


def verify_tree(root: Path, document: Mapping[str, Any], checksums: bool = True) -> list[str]:
    """Every way the tree under `root` differs from the manifest, each naming the file; empty when it matches.

    Every file is stat'ed before any is hashed, so a truncated or missing file is named at once rather than
    after hours of hashing the files before it. checksums=False stops there (a quick look).
    """
    files = checked_entries(document.get("files"))
    real_root = Path(root).resolve(strict=True)
    on_disk = {item.path: item for item in tree_items(real_root)}
    problems: dict[str, str] = {}
    to_hash = []
    for entry in files:
        problem = _shape_problem(entry, on_disk.pop(entry["path"], None))
        if problem:
            problems[entry["path"]] = problem
        elif "sha256" in entry:
            to_hash.append(entry)
    for item in on_disk.values():
        problems[item.path] = item.reason if item.kind == REFUSED else f"is not in the manifest (an extra {item.kind})"
    for entry in to_hash if checksums else []:
        problem = _content_problem(real_root, entry)
        if problem:
            problems[entry["path"]] = problem
    return [f"{path}: {problem}" for path, problem in sorted(problems.items())]


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
    for variable, pins in ((PIP_PINS, inputs.pip_pins), (PIP_OVERRIDES, inputs.pip_overrides)):
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
