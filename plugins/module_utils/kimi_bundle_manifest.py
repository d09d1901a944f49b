"""The manifest of an air-gapped bundle (bin/kimi-bundle) and the bundle's contents against its inputs.

A bundle is a directory: the apt repository, the wheelhouse and optionally the checkpoint's files, plus
MANIFEST_NAME (the document manifest_document writes) and its detached signature SIGNATURE_NAME. The manifest
records every file's size and sha256 and the inputs the bundle was built for (kimi_bundle_inputs.BuildInputs), so
that the mirror host checks sizes, then checksums, before serving anything (kimi_bundle_tree.verify_tree), and
read_manifest refuses a built_for edited after the build. The bundle's apt index and wheelhouse are checked
against its pins (apt_index_problems, wheelhouse_problems) before it is signed.

Separate from kimi_bundle_inputs (which it imports) because it is about one built bundle, not the inputs alone;
and from kimi_bundle_fetch (which imports it), which matches a served bundle against a node and plans a rebuild's
downloads. The tree walk, the files' checks and the document's shape are kimi_bundle_tree.py's (stdlib only: the
mirror host runs them); import those names from there. Stdlib and `packaging` only (wheel tags), free of Ansible
imports; no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import PurePosixPath
from typing import Any

from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version

from .kimi_bundle_inputs import (
    APT_PACKAGES,
    HF_DISTRIBUTION,
    HF_VERSION,
    PIP_OVERRIDES,
    PIP_PINS,
    PLATFORM_TAG,
    BuildInputs,
    BundleInputError,
    apt_source,
    inputs_from_dict,
)
from .kimi_bundle_tree import (
    MANIFEST_KIND,
    MANIFEST_NAME,
    SCHEMA_VERSION,
    BundleError,
    ManifestError,
    checked_entries,
    read_document,
    totals,
)
from .kimi_pinset import expand_platforms

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
    source = apt_source(inputs)
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
