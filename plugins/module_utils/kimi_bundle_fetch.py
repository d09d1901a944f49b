"""What is fetched from or for an air-gapped bundle: a served bundle against a node before it installs from it
(match_manifest, for kimi_bundle_match: preflight refuses a bundle built for other inputs, naming each difference,
with the messages the module fails with), and a rebuild's fetch plan (plan_fetches, changed_since: building again
after a pin bump fetches only what changed, and an interrupted build resumes).

Separate from kimi_bundle_manifest and kimi_bundle_inputs, which it imports (read_manifest, compare_inputs): these
are the two decisions made against a bundle that already exists, one on the controller for each node, one in the
builder for the next build. Stdlib and `packaging` (through its siblings) only, free of Ansible imports; no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .kimi_bundle_inputs import BundleInputError, compare_inputs, inputs_from_variables
from .kimi_bundle_manifest import manifest_inputs, read_manifest
from .kimi_bundle_tree import OWN_FILES, SHA256_HEX, BundleError, checked_entries, safe_path

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
        if not safe_path(artifact.path) or artifact.path in OWN_FILES or artifact.path in seen:
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
