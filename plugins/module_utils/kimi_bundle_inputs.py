"""What an air-gapped bundle (bin/kimi-bundle) is built for, and how two such sets of inputs differ.

The inputs are the inventory's resolved variables (INPUT_VARIABLES: distribution, Python, pip platforms, the
apt and pip pins, the hf CLI's version, the checkpoint, the inventory's name), judged as a build judges them
(inputs_from_variables names every bad variable at once) into BuildInputs, whose digest the manifest records;
compare_inputs lists every difference between what a bundle was built for and what a node wants, each naming its
variable, so that preflight's refusal says what to change.

Separate from kimi_bundle_manifest (the document and the bundle's contents, which import this) because these are
the bundle's inputs alone: bin/kimi-bundle's `inputs` command and playbooks/bundle_inputs.yml need nothing else.
Stdlib and `packaging` only (pip names and versions as pip compares them), free of Ansible imports and of I/O.
"""

from __future__ import annotations

import hashlib
import json
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from .kimi_bundle_tree import BundleError
from .kimi_inputs import DEBIAN_VERSION, HEX_COMMIT, REPO_ID, as_bool

# The inventory variables a bundle is built from (resolved values, as an Ansible task passes them).
INVENTORY_NAME = "kimi_bundle_inventory_name"
DISTRIBUTION = "kimi_bundle_distribution"
CODENAME = "kimi_bundle_codename"
ARCHITECTURE = "kimi_bundle_architecture"
PYTHON_VERSION = "vllm_python_version"
PLATFORMS = "vllm_platforms"
DEB_PINS = "kimi_deb_pins"
# Roles that pin their debs per release ({bookworm: {nftables: ...}}); only those the caller passes are read.
RELEASE_DEB_PINS = ("firewall_deb_pins", "monitoring_deb_pins", "router_deb_pins", "kimi_nginx_deb_pins")
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


def apt_source(inputs: BuildInputs) -> Callable[[str], str]:
    """The variable each apt pin of `inputs` came from, for messages (kimi_bundle_manifest names it too)."""
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
    lines += _pin_differences("apt package", bundle.apt_pins, wanted.apt_pins, apt_source(wanted))
    lines += _field_difference("apt_packages", bundle.apt_packages, wanted.apt_packages)
    lines += _pin_differences("pip package", bundle.pip_pins, wanted.pip_pins, lambda _: PIP_PINS, _same_pip_version)
    lines += _pin_differences(
        "pip override", bundle.pip_overrides, wanted.pip_overrides, lambda _: PIP_OVERRIDES, _same_pip_version
    )
    lines += _field_difference("hf_version", bundle.hf_version, wanted.hf_version)
    lines += _checkpoint_differences(bundle.checkpoint, wanted.checkpoint)
    return lines
