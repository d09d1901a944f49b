"""The wheelhouse part of an air-gapped bundle (bin/kimi-bundle): every wheel the nodes' pip installs for the
inventory's pin set, resolved by pip itself for the nodes' Python and platforms (not this host's), fetched
into ``<bundle>/wheels/``, indexed for ``pip --no-index --find-links``, and proved installable from the
bundle alone by pip itself.

What the nodes install (each a PipSet, resolved separately because the nodes install them separately):

- the vllm role's resolved set: kimi_vllm_pip_pins minus the names kimi_vllm_pip_overrides replaces, with all
  their dependencies (Ray too, in layout ray: roles/ray_cluster expects it among kimi_vllm_pip_pins);
- the overrides, installed after that set with --no-deps;
- pins an override replaces, also --no-deps: the role never installs them, but the bundle's manifest lists
  every pin and kimi_bundle_manifest.wheelhouse_problems expects a wheel for each;
- the hf CLI of roles/checkpoint (huggingface_hub at checkpoint_hf_version, in its own venv), when the caller
  passes that version.

The steps, each a function (build_wheelhouse runs them in order):

1. resolve_request: ``pip install --dry-run --ignore-installed --report`` per set with the nodes' target
   flags (--python-version, --implementation cp, --abi, --only-binary=:all:, every --platform tag
   kimi_pinset.expand_platforms gives) against the caller's sources: the closure with each file's URL and
   sha256, before anything is downloaded. pip's --log file names the sources that did not answer (pip
   itself only skips them).
2. fetch_wheels: kimi_bundle_fetch.plan_fetches matches those sha256 against the wheels the bundle (or an
   interrupted run's download directory) already holds; matches are moved or linked into place, then
   ``pip download --no-deps`` with each file's ``--hash`` fetches the rest into a download directory in the
   work directory, each file is hashed again and renamed into ``<bundle>/wheels/``; wheels no longer needed
   are removed. A partial file (an interrupted copy, a ``.part``) is never a ``.whl`` under its final name
   in the bundle, and one left in the download directory fails its sha256 and is fetched again.
3. write_indexes: ``requirements.lock`` (name==version --hash=sha256:..., one line per distribution
   version), ``SHA256SUMS`` (sha256sum -c format) and, for pip over HTTP, ``index.html`` with each wheel's
   ``<wheel>.metadata`` (PEP 658/714).
4. check_wheelhouse: ``pip install --dry-run --ignore-installed --no-index --find-links`` on the bundle's
   directory and on its index page, with the same target flags, must resolve every pin at its version from
   the bundle alone, and kimi_bundle_manifest.wheelhouse_problems must report nothing.

Why index.html and the .metadata files: the vllm and checkpoint roles pass one flat ``--find-links`` location
with ``--no-index`` (never a PEP 503 ``--index-url`` tree). A node reading the bundle's directory needs
nothing else, but a mirror host serving it over HTTP needs a page naming the wheels, and the controller's
resolve (kimi_pinset, vllm_pinset_find_links) reads each wheel's metadata instead of downloading ~1 GB of
wheels when the page names it. This is the page lab/labctl/wheel_index.py writes for the lab (module_utils
may not import the lab); index generators (dumb-pypi, simple503, piprepo) write per-project PEP 503 trees.

Hand-written, and why: that page (above); reading pip's --log lines ``Could not fetch URL ...`` and
``Location ... is ignored`` (pip reports an unreachable source only there) and its hash-mismatch block (to
name the file); the report's files and sha256 (kimi_pinset.parse_report keeps only versions and URLs). pip's
failures and conflict chains are read with kimi_pinset's parsers, wheel names and versions with ``packaging``;
resolving, downloading and checking are pip's own. Commands run through run_pip only, but for
kimi_pinset.pip_preflight's probe of the interpreter.

No Ansible imports. Part of the bundle builder (``kimi_tools.kimi_bundle_wheels``), not of the collection.
"""

from __future__ import annotations

import hashlib
import html
import json
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from ansible_collections.kimi.k2.plugins.module_utils.kimi_bundle_fetch import Artifact, FetchPlan, plan_fetches
from ansible_collections.kimi.k2.plugins.module_utils.kimi_bundle_inputs import (
    HF_DISTRIBUTION,
    HF_VERSION,
    PIP_OVERRIDES,
    PIP_PINS,
    PYTHON_MINOR,
    BuildInputs,
)
from ansible_collections.kimi.k2.plugins.module_utils.kimi_bundle_manifest import wheelhouse_problems
from ansible_collections.kimi.k2.plugins.module_utils.kimi_bundle_tree import SHA256_HEX, BundleError, hash_file
from ansible_collections.kimi.k2.plugins.module_utils.kimi_pinset import (
    ResolveSettings,
    conflict_chain,
    expand_platforms,
    index_options,
    parse_pip_failure,
    pip_environment,
    pip_preflight,
)
from ansible_collections.kimi.k2.plugins.module_utils.kimi_report import write_atomic
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from .kimi_bundle_apt import link_or_copy, output_tail, tool_environment

# The bundle's wheelhouse: a flat directory, what the roles' --find-links names.
WHEELS_DIR = "wheels"
LOCK_NAME = "requirements.lock"
SUMS_NAME = "SHA256SUMS"
INDEX_NAME = "index.html"
METADATA_SUFFIX = ".metadata"
GENERATED_NAMES = (LOCK_NAME, SUMS_NAME, INDEX_NAME)
# plan_fetches' name for the wheels an interrupted run left in the download directory.
CACHE_POOL = "cache"
DOWNLOADS_DIR = "wheel-downloads"
# A line of pip's --log: "Could not fetch URL <url>: <reason> - skipping".
NOT_FETCHED = re.compile(r"Could not fetch URL (?P<url>\S+): (?P<reason>.*) - skipping$", re.MULTILINE)
LOCATION_IGNORED = re.compile(r"Location '(?P<location>[^']*)' is ignored: (?P<reason>.*)$", re.MULTILINE)
# pip's hash-mismatch block: "    jinja2==3.1.6 from file:///...whl#sha256=... (from -r ...):".
HASH_MISMATCH_HEADER = "THESE PACKAGES DO NOT MATCH THE HASHES"
MISMATCHED = re.compile(r"^\s+(?P<name>[A-Za-z0-9._-]+)==(?P<version>\S+) from (?P<url>\S+)", re.MULTILINE)
ERROR_LINES_SHOWN = 30
PAGE_TITLE = "kimi.k2 bundle wheelhouse"


class WheelBundleError(BundleError):
    """A step of the bundle's wheelhouse failed; the message names the pin and its variable, the source or
    the file, and quotes pip's own words."""


# ------------------------------------------------------------------------------------------ commands


@dataclass(frozen=True)
class PipTool:
    """The interpreter whose pip resolves and downloads (pip >= 22.2), and how long it may take. One of the
    nodes' Python gives an exact resolve: pip evaluates environment markers with its own interpreter."""

    python: str = sys.executable
    timeout_s: int = 3600
    # pip's own --retries and --timeout (seconds per connection): a dead source fails in seconds, not minutes.
    retries: int = 2
    socket_timeout_s: int = 30


def run_pip(tool: PipTool, arguments: Sequence[str], what: str) -> subprocess.CompletedProcess[str]:
    """`python -m pip` with no pip.conf, no PIP_* variable and messages in English (kimi_pinset's isolation,
    so only the sources given here count); the exit status is the caller's to explain."""
    command = [tool.python, "-m", "pip", "--isolated", "--no-input", "--disable-pip-version-check", *arguments]
    try:
        return subprocess.run(
            command,
            env=pip_environment(tool_environment()),
            capture_output=True,
            text=True,
            timeout=tool.timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise WheelBundleError(f"{what}: pip did not finish within {tool.timeout_s} s") from None
    except OSError as error:
        raise WheelBundleError(f"{what}: cannot run {tool.python} -m pip: {error}") from None


def pip_error_lines(output: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith(("ERROR: ", "WARNING: "))]
    return "\n".join(lines[:ERROR_LINES_SHOWN]) or output_tail(output, ERROR_LINES_SHOWN)


def tool_warnings(tool: PipTool, python_version: str) -> list[str]:
    """kimi_pinset's check of the interpreter: WheelBundleError when its pip cannot --report, else the
    warnings (markers evaluated for another Python than the nodes')."""
    checked = pip_preflight(ResolveSettings(python_version=python_version, pip_python=tool.python))
    if checked["error"]:
        raise WheelBundleError(checked["error"])
    return list(checked["warnings"])


# --------------------------------------------------------------------------------------------- sources


@dataclass(frozen=True)
class PipSources:
    """Where the wheels come from: an index (and extra ones), or find-links alone (then --no-index), as the
    roles' vllm_pip_* variables say it. Locations are URLs or absolute directories/pages on this host."""

    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    trusted_hosts: tuple[str, ...] = ()
    cert: str | None = None

    @property
    def no_index(self) -> bool:
        return self.index_url is None

    def locations(self) -> list[tuple[str, str]]:
        """(pip option, location) of every source, as messages name them."""
        named = [("--index-url", self.index_url)] if self.index_url else []
        named += [("--extra-index-url", url) for url in self.extra_index_urls]
        return named + [("--find-links", location) for location in self.find_links]

    def options(self) -> list[str]:
        problems = source_problems(self)
        if problems:
            raise WheelBundleError("; ".join(problems))
        settings = ResolveSettings(
            index_url=self.index_url,
            extra_index_urls=list(self.extra_index_urls),
            find_links=list(self.find_links),
            no_index=self.no_index,
            trusted_hosts=list(self.trusted_hosts),
            cert=self.cert,
        )
        return index_options(settings)


def _location_problem(option: str, location: str) -> str | None:
    name = f"pip source {option} {location}"
    if not location or location.startswith("-") or any(character.isspace() for character in location):
        return f"{name}: give a URL or an absolute path without white space"
    scheme = urlsplit(location).scheme
    if scheme in ("http", "https", "file"):
        return None
    if scheme or not Path(location).is_absolute():
        return f"{name}: give an http(s):// or file:// URL or an absolute path"
    if option == "--find-links" and not Path(location).exists():
        return f"{name}: does not answer (no such directory or page on this host)"
    return None if option == "--find-links" else f"{name}: an index is a URL (a directory is a --find-links)"


def source_problems(sources: PipSources) -> list[str]:
    """Why pip could not be given these sources, each naming one; empty when it can."""
    problems = [
        problem
        for option, location in sources.locations()
        if (problem := _location_problem(option, location)) is not None
    ]
    if not sources.locations():
        problems.append("no pip source given: give an index URL or find-links (a wheelhouse)")
    if sources.extra_index_urls and sources.no_index:
        problems.append("extra index URLs need an index URL (without one, pip runs with --no-index)")
    return problems


def _source_of(url: str, sources: PipSources) -> tuple[str, str] | None:
    """The source a URL pip fetched belongs to (the longest location it starts with)."""
    matches = [(option, location) for option, location in sources.locations() if url.startswith(location.rstrip("/"))]
    return max(matches, key=lambda match: len(match[1]), default=None)


def unanswered_sources(log_text: str, output: str, sources: PipSources) -> list[str]:
    """Each source pip skipped (from its --log and warnings), named; an index's 404 for a project page only
    says the index lacks that project, which pip reports as a missing version."""
    problems: dict[str, str] = {}
    for found in NOT_FETCHED.finditer(log_text):
        source = _source_of(found["url"], sources)
        index_404 = found["reason"].startswith("404 ") and source is not None and source[0] != "--find-links"
        if not index_404:
            label = " ".join(source) if source else found["url"]
            problems.setdefault(label, f"pip source {label} does not answer: {found['url']}: {found['reason']}")
    for found in LOCATION_IGNORED.finditer(output):
        label = f"--find-links {found['location']}"
        problems.setdefault(label, f"pip source {label} does not answer: {found['reason']}")
    return list(problems.values())


# -------------------------------------------------------------------------------------- what to install


@dataclass(frozen=True)
class PipRequirement:
    """One pinned distribution (PEP 503 name, exact version) and the variable it comes from."""

    name: str
    version: str
    variable: str

    @property
    def text(self) -> str:
        return f"{self.name}=={self.version}"

    def label(self) -> str:
        return f"pip package {self.name} {self.version} ({self.variable})"


@dataclass(frozen=True)
class PipSet:
    """One pip install the nodes run: its requirements, and whether it is --no-deps (the overrides)."""

    label: str
    requirements: tuple[PipRequirement, ...]
    no_deps: bool = False

    def variables(self) -> str:
        return ", ".join(dict.fromkeys(requirement.variable for requirement in self.requirements))

    def find(self, name: str) -> PipRequirement | None:
        return next((r for r in self.requirements if r.name == canonicalize_name(name)), None)


def _requirements(pins: Mapping[str, str], variable: str) -> tuple[PipRequirement, ...]:
    return tuple(PipRequirement(canonicalize_name(name), version, variable) for name, version in sorted(pins.items()))


def exact_version(value: Any, variable: str) -> str:
    """One exact PEP 440 version (normalised), else WheelBundleError naming the variable."""
    # A number is refused rather than read: YAML turns an unquoted 2.10 into 2.1.
    if isinstance(value, str):
        try:
            return str(Version(value.strip()))
        except InvalidVersion:
            pass
    raise WheelBundleError(f'{variable} must be one exact version as a quoted string, e.g. "2.4.0" (got {value!r})')


def pip_sets(inputs: BuildInputs, hf_version: str | None = None) -> tuple[PipSet, ...]:
    """The pip installs the converge runs for these inputs (see the module's docstring); the hf CLI at
    `hf_version`, else at the inputs' own hf_version when they carry one."""
    hf_version = hf_version if hf_version is not None else inputs.hf_version
    overrides = inputs.pip_overrides
    resolved = {name: version for name, version in inputs.pip_pins.items() if name not in overrides}
    replaced = {name: version for name, version in inputs.pip_pins.items() if name in overrides}
    sets = [PipSet("the vLLM pin set", _requirements(resolved, PIP_PINS))] if resolved else []
    if overrides:
        sets.append(PipSet("the overrides (--no-deps)", _requirements(overrides, PIP_OVERRIDES), no_deps=True))
    if replaced:
        sets.append(PipSet("the pins an override replaces (--no-deps)", _requirements(replaced, PIP_PINS), True))
    if hf_version is not None:
        pin = {HF_DISTRIBUTION: exact_version(hf_version, HF_VERSION)}
        sets.append(PipSet("the hf CLI (roles/checkpoint)", _requirements(pin, HF_VERSION)))
    return tuple(sets)


@dataclass(frozen=True)
class WheelRequest:
    """The nodes' Python (MAJOR.MINOR) and platform tags, and the pip installs to serve."""

    python_version: str
    platforms: tuple[str, ...]
    sets: tuple[PipSet, ...]

    @classmethod
    def from_inputs(cls, inputs: BuildInputs, hf_version: str | None = None) -> WheelRequest:
        return cls(inputs.python_version, tuple(inputs.platforms), pip_sets(inputs, hf_version))

    def target(self) -> str:
        return f"Python {self.python_version} on {', '.join(self.platforms)}"


def target_options(python_version: str, platforms: Iterable[str]) -> list[str]:
    """pip's flags for the nodes' interpreter, whatever runs pip: wheels only, CPython's ABI, and every tag
    the nodes' glibc accepts (pip does not expand PEP 600 tags itself: kimi_pinset.expand_platforms)."""
    if not PYTHON_MINOR.fullmatch(python_version):
        raise WheelBundleError(f"Python version {python_version!r}: give MAJOR.MINOR, e.g. 3.11")
    tags = expand_platforms(platforms)
    if not tags:
        raise WheelBundleError("no platform tag given: give the nodes' newest, e.g. manylinux_2_36_x86_64")
    options = ["--python-version", python_version, "--implementation", "cp"]
    options += ["--abi", "cp" + python_version.replace(".", ""), "--only-binary=:all:"]
    return options + [part for tag in tags for part in ("--platform", tag)]


def network_options(tool: PipTool) -> list[str]:
    return ["--retries", str(tool.retries), "--timeout", str(tool.socket_timeout_s), "--progress-bar", "off"]


# ------------------------------------------------------------------------------- reading pip's report


@dataclass(frozen=True)
class ResolvedWheel:
    """One wheel of a closure: the file pip chose, where from, and its sha256 (None if the source gave none)."""

    name: str
    version: str
    filename: str
    url: str
    sha256: str | None = None
    requested: bool = False

    def artifact(self) -> Artifact:
        return Artifact(f"{WHEELS_DIR}/{self.filename}", None, self.sha256)

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"


def _report_sha256(download_info: Mapping[str, Any]) -> str | None:
    archive = download_info.get("archive_info") or {}
    digest = (archive.get("hashes") or {}).get("sha256")
    if digest is None and str(archive.get("hash", "")).startswith("sha256="):
        digest = archive["hash"].removeprefix("sha256=")
    return digest if isinstance(digest, str) and SHA256_HEX.fullmatch(digest) else None


def _report_wheel(entry: Mapping[str, Any], where: str) -> ResolvedWheel:
    metadata = entry.get("metadata") or {}
    download_info = entry.get("download_info") or {}
    url = str(download_info.get("url", ""))
    filename = unquote(PurePosixPath(urlsplit(url).path).name)
    label = f"{metadata.get('name')} {metadata.get('version')}"
    try:
        name, version, _, _ = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        raise WheelBundleError(f"{where}: pip chose {url or 'nothing'} for {label}, which is not a wheel") from None
    if name != canonicalize_name(str(metadata.get("name", ""))) or version != Version(str(metadata.get("version"))):
        raise WheelBundleError(f"{where}: {filename} holds {label}, not what its file name says")
    return ResolvedWheel(name, str(version), filename, url, _report_sha256(download_info), bool(entry.get("requested")))


def parse_resolution_report(report: Mapping[str, Any], where: str) -> list[ResolvedWheel]:
    """The wheels of a pip installation report (--dry-run --report), in pip's order."""
    install = report.get("install")
    if not isinstance(install, list):
        raise WheelBundleError(f"{where}: pip's report has no install list (pip {report.get('pip_version')})")
    return [_report_wheel(entry, where) for entry in install]


def merge_resolutions(resolutions: Mapping[str, Sequence[ResolvedWheel]]) -> list[ResolvedWheel]:
    """Every set's wheels once, by file name, sorted; a name whose sha256 differs between sets is an error
    (two sources offering different files under one name)."""
    merged: dict[str, tuple[str, ResolvedWheel]] = {}
    for label, wheels in resolutions.items():
        for wheel in wheels:
            earlier = merged.get(wheel.filename)
            if earlier is None or earlier[1].sha256 is None:
                merged[wheel.filename] = (label, wheel)
            elif wheel.sha256 not in (None, earlier[1].sha256):
                raise WheelBundleError(
                    f"{wheel.filename}: the sources offer two different files under this name (sha256 "
                    f"{earlier[1].sha256} for {earlier[0]}, {wheel.sha256} for {label})"
                )
    return [wheel for _, (_, wheel) in sorted(merged.items())]


# -------------------------------------------------------------------------------- explaining failures


def _unavailable_message(missing: Mapping[str, Any], pip_set: PipSet, target: str) -> str:
    seen = ", ".join(missing["versions_seen"])
    have = f"they have {seen}" if seen else "they have no version of it for this Python and platform"
    requirement = missing["requirement"]
    pinned = pip_set.find(re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0])
    if missing["required_by"] is None and pinned is not None:
        return f"{pinned.label()}: no wheel of this version for {target} in the sources ({have})"
    by = f", required by {missing['required_by']}" if missing["required_by"] else ""
    return f"pip package {requirement}{by} ({pip_set.label}: {pip_set.variables()}): no wheel for {target} ({have})"


def resolve_failure_message(output: str, pip_set: PipSet, target: str, what: str) -> str:
    """What pip could not resolve, per pin (named with its variable) or dependency (named with what
    requires it), or the conflict's chain; followed by pip's own lines."""
    failure = parse_pip_failure(output)
    named = [_unavailable_message(missing, pip_set, target) for missing in failure.unavailable]
    if failure.kind == "conflict":
        chain = "; ".join(conflict_chain(failure))
        named.append(f"the pins of {pip_set.label} ({pip_set.variables()}) cannot be one environment: {chain}")
    summary = f": {'; '.join(named)}" if named else ""
    return f"{what} failed{summary}\npip said:\n{pip_error_lines(output)}"


def download_failure_message(output: str, what: str) -> str:
    """pip download's failure; a hash mismatch names each file whose content changed since the resolve."""
    named = []
    if HASH_MISMATCH_HEADER in output:
        block = output[output.index(HASH_MISMATCH_HEADER) :]
        named = [
            f"{unquote(PurePosixPath(urlsplit(found['url']).path).name)} ({found['name']} {found['version']}): "
            "its content differs from the sha256 pip resolved a moment before (the source changed it?)"
            for found in MISMATCHED.finditer(block)
        ]
    summary = f": {'; '.join(named)}" if named else ""
    return f"{what} failed{summary}\npip said:\n{output_tail(output, ERROR_LINES_SHOWN)}"


# ----------------------------------------------------------------------------- step 1: resolve with pip


@dataclass(frozen=True)
class PipRun:
    """Where one pip run keeps its report, log and (never written) --target directory."""

    base: Path

    @property
    def report(self) -> Path:
        return self.base / "report.json"

    @property
    def log(self) -> Path:
        return self.base / "pip.log"

    @property
    def target(self) -> Path:
        return self.base / "target"

    def reset(self) -> None:
        # --log appends, and a report from an earlier run must not stand in for this one.
        self.base.mkdir(parents=True, exist_ok=True)
        self.report.unlink(missing_ok=True)
        self.log.unlink(missing_ok=True)


def dry_run_arguments(
    request: WheelRequest, pip_set: PipSet, source_options: Sequence[str], run: PipRun, tool: PipTool
) -> list[str]:
    """pip install's arguments for a resolve of one set: nothing installed, the closure in the report."""
    arguments = ["install", "--dry-run", "--ignore-installed", "--report", str(run.report), "--log", str(run.log)]
    arguments += ["--target", str(run.target), *target_options(request.python_version, request.platforms)]
    arguments += [*network_options(tool), *source_options]
    if pip_set.no_deps:
        arguments.append("--no-deps")
    return arguments + [requirement.text for requirement in pip_set.requirements]


def _read_log(run: PipRun) -> str:
    return run.log.read_text(errors="replace") if run.log.exists() else ""


def resolve_set(
    request: WheelRequest,
    pip_set: PipSet,
    sources: PipSources,
    run: PipRun,
    tool: PipTool,
    against: str = "the sources",
) -> list[ResolvedWheel]:
    """One set's closure from pip's report; WheelBundleError names a source that did not answer, a pin the
    sources lack (with its variable) or the conflict."""
    what = f"pip install --dry-run --report ({pip_set.label} from {against}, for {request.target()})"
    run.reset()
    result = run_pip(tool, dry_run_arguments(request, pip_set, sources.options(), run, tool), what)
    output = result.stdout + "\n" + result.stderr
    silent = unanswered_sources(_read_log(run), output, sources)
    if silent:
        raise WheelBundleError(f"{what}: " + "; ".join(silent))
    if result.returncode != 0:
        raise WheelBundleError(resolve_failure_message(output, pip_set, request.target(), what))
    if not run.report.is_file():
        raise WheelBundleError(f"{what}: pip succeeded but wrote no report\n{output_tail(output)}")
    return parse_resolution_report(json.loads(run.report.read_text()), what)


def resolve_request(
    request: WheelRequest, sources: PipSources, work: Path, tool: PipTool | None = None
) -> list[ResolvedWheel]:
    """Every set's closure, merged by file name: what the bundle must hold."""
    tool = tool or PipTool()
    if not request.sets:
        raise WheelBundleError(f"nothing to resolve: {PIP_PINS} and {PIP_OVERRIDES} are empty")
    run = PipRun(Path(work) / "pip-resolve")
    resolutions = {pip_set.label: resolve_set(request, pip_set, sources, run, tool) for pip_set in request.sets}
    return merge_resolutions(resolutions)


# ------------------------------------------------------------------------------- step 2: fetch the wheels


def wheel_entries(directory: Path, pool: str) -> list[dict[str, Any]]:
    """{path: POOL/NAME, size, sha256} of each regular .whl in `directory`, for kimi_bundle_fetch.plan_fetches."""
    if not Path(directory).is_dir():
        return []
    entries = []
    for path in sorted(Path(directory).glob("*.whl")):
        if path.is_file() and not path.is_symlink():
            size, sha256 = hash_file(path)
            entries.append({"path": f"{pool}/{path.name}", "size": size, "sha256": sha256})
    return entries


def install_file(source: Path, target: Path, keep_source: bool) -> None:
    """`target` holding `source`'s bytes, replaced in one rename (link_or_copy), so that a half-written wheel
    never lies under its final name; the source is removed unless kept."""
    if target.exists() and source.exists() and target.samefile(source):
        return
    link_or_copy(source, target)
    if not keep_source:
        source.unlink()


def apply_reuse(plan: FetchPlan, pools: Mapping[str, Path], wheels_dir: Path) -> None:
    """Put every reusable wheel in place: from the bundle itself (another name, same bytes) or the downloads
    an interrupted run left."""
    for new_path, old_path in plan.reuse:
        pool, _, name = old_path.partition("/")
        target = wheels_dir / PurePosixPath(new_path).name
        install_file(pools[pool] / name, target, keep_source=pool != CACHE_POOL)


def clear_directory(directory: Path) -> None:
    """Remove every file in `directory`: pip download keeps a file already there whatever its content."""
    directory.mkdir(parents=True, exist_ok=True)
    for path in directory.iterdir():
        if path.is_file() or path.is_symlink():
            path.unlink()


def download_batches(wheels: Iterable[ResolvedWheel]) -> list[list[ResolvedWheel]]:
    """The wheels in as few pip runs as possible: pip's resolver refuses one name at two versions in one run
    (even --no-deps), and a run with any --hash requires one on every line, so hashed and unhashed wheels
    never share a run."""
    batches: list[tuple[bool, set[str], list[ResolvedWheel]]] = []
    for wheel in wheels:
        hashed = wheel.sha256 is not None
        batch = next((b for b in batches if b[0] == hashed and wheel.name not in b[1]), None)
        if batch is None:
            batch = (hashed, set(), [])
            batches.append(batch)
        batch[1].add(wheel.name)
        batch[2].append(wheel)
    return [batch[2] for batch in batches]


def download_requirements_text(wheels: Iterable[ResolvedWheel]) -> str:
    """A requirements file: name==version, with --hash when the resolve gave one (pip then checks it)."""
    lines = []
    for wheel in wheels:
        digest = f" --hash=sha256:{wheel.sha256}" if wheel.sha256 else ""
        lines.append(f"{wheel.requirement}{digest}\n")
    return "".join(lines)


def download_arguments(
    request: WheelRequest, source_options: Sequence[str], requirements: Path, dest: Path, run: PipRun, tool: PipTool
) -> list[str]:
    arguments = ["download", "--no-deps", "--dest", str(dest), "--log", str(run.log)]
    arguments += [*target_options(request.python_version, request.platforms), *network_options(tool)]
    return [*arguments, *source_options, "-r", str(requirements)]


def staged_digests(downloads: Path, wheels: Iterable[ResolvedWheel]) -> tuple[dict[str, str], list[str]]:
    """{file name: sha256} of the wanted wheels in `downloads`, and each one pip did not leave there with
    the sha256 the resolve gave (each file is read once)."""
    digests: dict[str, str] = {}
    problems = []
    for wheel in wheels:
        path = downloads / wheel.filename
        if not path.is_file():
            problems.append(f"{wheel.filename}: pip download reported success but did not save it")
            continue
        digests[wheel.filename] = hash_file(path)[1]
        if wheel.sha256 is not None and digests[wheel.filename] != wheel.sha256:
            problems.append(f"{wheel.filename}: sha256 {digests[wheel.filename]}, the resolve said {wheel.sha256}")
    return digests, problems


def download_wheels(
    request: WheelRequest, sources: PipSources, wheels: Sequence[ResolvedWheel], work: Path, tool: PipTool
) -> dict[str, str]:
    """pip download --no-deps of exactly these files into the (emptied) download directory, checked there;
    returns each file's sha256."""
    downloads = Path(work) / DOWNLOADS_DIR
    clear_directory(downloads)
    run = PipRun(Path(work) / "pip-download")
    for number, batch in enumerate(download_batches(wheels), start=1):
        what = f"pip download --no-deps ({len(batch)} wheels, run {number}, for {request.target()})"
        run.reset()
        requirements = run.base / "download-requirements.txt"
        requirements.write_text(download_requirements_text(batch))
        arguments = download_arguments(request, sources.options(), requirements, downloads, run, tool)
        result = run_pip(tool, arguments, what)
        output = result.stdout + "\n" + result.stderr
        silent = unanswered_sources(_read_log(run), output, sources)
        if result.returncode != 0:
            raise WheelBundleError("; ".join([*silent, download_failure_message(output, what)]))
    digests, problems = staged_digests(downloads, wheels)
    if problems:
        raise WheelBundleError("after pip download: " + "; ".join(problems))
    return digests


@dataclass(frozen=True)
class WheelFetch:
    """The closure and how each file got into the bundle: reused (already held, same sha256) or fetched."""

    wheels: tuple[ResolvedWheel, ...]
    reused: tuple[str, ...]
    fetched: tuple[str, ...]
    sizes: Mapping[str, int] = field(default_factory=dict)

    @property
    def fetched_bytes(self) -> int:
        return sum(self.sizes[name] for name in self.fetched)

    @property
    def reused_bytes(self) -> int:
        return sum(self.sizes[name] for name in self.reused)

    def summary(self) -> str:
        return (
            f"{len(self.wheels)} wheels: fetched {len(self.fetched)} ({self.fetched_bytes} bytes), "
            f"reused {len(self.reused)} ({self.reused_bytes} bytes)"
        )


def _with_sha256(wheels: Sequence[ResolvedWheel], learned: Mapping[str, str]) -> list[ResolvedWheel]:
    """The wheels with the sha256 of the downloaded file for each the resolve gave none (a reused one always
    has one: reuse is by sha256)."""
    return [replace(wheel, sha256=wheel.sha256 or learned[wheel.filename]) for wheel in wheels]


def fetch_wheels(
    request: WheelRequest,
    sources: PipSources,
    wheels: Sequence[ResolvedWheel],
    wheels_dir: Path,
    work: Path,
    tool: PipTool | None = None,
) -> WheelFetch:
    """The closure in `wheels_dir`: every wheel it (or an interrupted run's downloads) holds with the sha256
    of the resolve is reused, pip downloads the rest; each file is renamed into place whole."""
    tool = tool or PipTool()
    wheels_dir = Path(wheels_dir)
    wheels_dir.mkdir(parents=True, exist_ok=True)
    downloads = Path(work) / DOWNLOADS_DIR
    pools = {WHEELS_DIR: wheels_dir, CACHE_POOL: downloads}
    have = sorted(wheel_entries(wheels_dir, WHEELS_DIR) + wheel_entries(downloads, CACHE_POOL), key=lambda e: e["path"])
    plan = plan_fetches(have, [wheel.artifact() for wheel in wheels])
    apply_reuse(plan, pools, wheels_dir)
    # What is left there is not wanted (an older pin's wheel, a cut file): never hashed again.
    clear_directory(downloads)
    fetched_names = {PurePosixPath(artifact.path).name for artifact, _ in plan.fetch}
    to_fetch = [wheel for wheel in wheels if wheel.filename in fetched_names]
    learned = download_wheels(request, sources, to_fetch, work, tool) if to_fetch else {}
    for wheel in to_fetch:
        install_file(downloads / wheel.filename, wheels_dir / wheel.filename, keep_source=False)
    sizes = {wheel.filename: (wheels_dir / wheel.filename).stat().st_size for wheel in wheels}
    return WheelFetch(
        wheels=tuple(_with_sha256(wheels, learned)),
        reused=tuple(PurePosixPath(new_path).name for new_path, _ in plan.reuse),
        fetched=tuple(sorted(fetched_names)),
        sizes=sizes,
    )


def drop_unwanted(wheels_dir: Path, wanted: Iterable[str]) -> list[str]:
    """Remove every file in `wheels_dir` that is neither a wanted wheel, nor its .metadata, nor an index
    (older pins' wheels and their .metadata, partial files); returns the removed wheels' names."""
    names = list(wanted)
    keep = {*names, *(f"{name}{METADATA_SUFFIX}" for name in names), *GENERATED_NAMES}
    dropped = []
    for path in sorted(Path(wheels_dir).iterdir()):
        if path.name in keep or not (path.is_file() or path.is_symlink()):
            continue
        if path.name.endswith(".whl"):
            dropped.append(path.name)
        path.unlink()
    return dropped


# ------------------------------------------------------------------------------- step 3: the indexes


def lock_text(wheels: Iterable[ResolvedWheel], request: WheelRequest) -> str:
    """requirements.lock: one `name==version --hash=sha256:...` line per distribution version (every file's
    hash on it). A name can appear at two versions (an override and the pin it replaces), so this records
    the wheelhouse rather than being one `pip install -r` environment."""
    hashes: dict[str, list[str]] = {}
    for wheel in wheels:
        hashes.setdefault(wheel.requirement, []).append(f"--hash=sha256:{wheel.sha256}")
    header = f"# The bundle's wheels for {request.target()}: one line per distribution version.\n"
    return header + "".join(f"{line} {' '.join(sorted(h))}\n" for line, h in sorted(hashes.items()))


def sums_text(wheels: Iterable[ResolvedWheel]) -> str:
    """SHA256SUMS, as `sha256sum -c` reads it."""
    return "".join(f"{wheel.sha256}  {wheel.filename}\n" for wheel in sorted(wheels, key=lambda w: w.filename))


def wheel_metadata(wheel: Path) -> bytes:
    """The METADATA file of the wheel's one top-level .dist-info directory."""
    with zipfile.ZipFile(wheel) as archive:
        found = [n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        if len(found) != 1:
            raise WheelBundleError(f"{wheel.name}: expected one .dist-info/METADATA, found {len(found)}")
        return archive.read(found[0])


def page_anchor(filename: str, wheel_sha256: str, metadata_sha256: str) -> str:
    """One link: the wheel's hash in the fragment, its metadata's as PEP 714's data-core-metadata (only that
    name: pip 22.3-23.1 misread the older data-dist-info-metadata, lab/labctl/wheel_index.py says why)."""
    href = html.escape(f"{quote(filename)}#sha256={wheel_sha256}")
    return f'<a href="{href}" data-core-metadata="sha256={metadata_sha256}">{html.escape(filename)}</a>'


def index_page_text(anchors: Iterable[str]) -> str:
    page = f"<!DOCTYPE html>\n<html><head><title>{PAGE_TITLE}</title></head><body>\n"
    return page + "".join(f"{anchor}<br>\n" for anchor in anchors) + "</body></html>\n"


def write_indexes(wheels_dir: Path, wheels: Sequence[ResolvedWheel], request: WheelRequest) -> None:
    """requirements.lock, SHA256SUMS, each wheel's .metadata, then index.html last (it names the others); each
    written beside and renamed (a reader never sees half a file), an unchanged one left alone."""
    wheels_dir = Path(wheels_dir)
    write_atomic(wheels_dir / LOCK_NAME, lock_text(wheels, request).encode())
    write_atomic(wheels_dir / SUMS_NAME, sums_text(wheels).encode())
    anchors = []
    for wheel in sorted(wheels, key=lambda w: w.filename):
        metadata = wheel_metadata(wheels_dir / wheel.filename)
        write_atomic(wheels_dir / f"{wheel.filename}{METADATA_SUFFIX}", metadata)
        anchors.append(page_anchor(wheel.filename, str(wheel.sha256), hashlib.sha256(metadata).hexdigest()))
    write_atomic(wheels_dir / INDEX_NAME, index_page_text(anchors).encode())


# ------------------------------------------------------------------ step 4: pip checks the bundle


def _outside_bundle(wheels: Iterable[ResolvedWheel], wheels_dir: Path) -> list[str]:
    problems = []
    for wheel in wheels:
        parts = urlsplit(wheel.url)
        place = Path(unquote(parts.path)).parent if parts.scheme == "file" else None
        if place is None or place.resolve() != wheels_dir.resolve():
            problems.append(f"{wheel.filename}: pip took it from {wheel.url}, not from the bundle")
    return problems


def pins_not_resolved(wheels: Iterable[ResolvedWheel], pip_set: PipSet, where: str) -> list[str]:
    """Each requirement of the set pip would not install at its pinned version (PEP 440 equality)."""
    chosen = {wheel.name: wheel.version for wheel in wheels if wheel.requested}
    problems = []
    for requirement in pip_set.requirements:
        found = chosen.get(requirement.name)
        if found is None or Version(found) != Version(requirement.version):
            would = f"version {found}" if found else "nothing"
            problems.append(f"{requirement.label()}: pip would install {would} from {where}")
    return problems


@dataclass(frozen=True)
class WheelCheck:
    """What pip would install on a node from the bundle alone, per set: {name: version}."""

    installs: Mapping[str, Mapping[str, str]]


def _check_set(
    request: WheelRequest, pip_set: PipSet, wheels_dir: Path, location: str, run: PipRun, tool: PipTool
) -> tuple[dict[str, str], list[str]]:
    where = f"the bundle's {location}"
    try:
        wheels = resolve_set(request, pip_set, PipSources(find_links=(location,)), run, tool, where)
    except WheelBundleError as error:
        return {}, [str(error)]
    problems = pins_not_resolved(wheels, pip_set, where) + _outside_bundle(wheels, wheels_dir)
    return {wheel.name: wheel.version for wheel in wheels}, problems


def check_wheelhouse(
    wheels_dir: Path,
    request: WheelRequest,
    work: Path,
    inputs: BuildInputs | None = None,
    tool: PipTool | None = None,
) -> WheelCheck:
    """Prove with pip that the nodes can install every set from the bundle alone: --no-index, the nodes'
    target flags, and as --find-links the bundle's directory (a node reading a copy of it), then, when the
    directory serves, its index page (what a mirror serves over HTTP); and kimi_bundle_manifest.wheelhouse_problems
    on its wheel names when `inputs` is given. WheelBundleError names every problem: a pin and its variable,
    or a wheel file."""
    tool = tool or PipTool()
    wheels_dir = Path(wheels_dir).resolve()
    run = PipRun(Path(work) / "pip-check")
    problems: list[str] = []
    if inputs is not None:
        names = [f"{WHEELS_DIR}/{path.name}" for path in sorted(wheels_dir.glob("*.whl"))]
        problems += wheelhouse_problems(names, inputs)
    installs: dict[str, dict[str, str]] = {}
    page = wheels_dir / INDEX_NAME
    for pip_set in request.sets:
        found, set_problems = _check_set(request, pip_set, wheels_dir, str(wheels_dir), run, tool)
        if not set_problems and page.is_file():
            # Only then: a page naming files that do not resolve would repeat the same problems.
            set_problems = _check_set(request, pip_set, wheels_dir, str(page), run, tool)[1]
        installs[pip_set.label] = found
        problems += set_problems
    if problems:
        raise WheelBundleError(f"the bundle's wheelhouse {wheels_dir} for {request.target()}: " + "; ".join(problems))
    return WheelCheck(installs)


# ---------------------------------------------------------------------------------------- all steps


@dataclass(frozen=True)
class WheelBuild:
    """What build_wheelhouse did: the fetch (bytes fetched and reused), the wheels dropped from the previous
    bundle, what pip would install from the bundle, and warnings about the interpreter that ran pip."""

    fetch: WheelFetch
    dropped: tuple[str, ...]
    check: WheelCheck
    warnings: tuple[str, ...] = ()


def build_wheelhouse(
    inputs: BuildInputs,
    sources: PipSources,
    bundle_root: Path,
    work: Path,
    hf_version: str | None = None,
    tool: PipTool | None = None,
) -> WheelBuild:
    """Every step: resolve the inputs' pip sets from `sources` (for the inputs' Python and platforms), fetch
    the closure into `bundle_root`/wheels reusing what it holds, index it, and check it with pip."""
    tool = tool or PipTool()
    request = WheelRequest.from_inputs(inputs, hf_version)
    warnings = tool_warnings(tool, request.python_version)
    wheels_dir = Path(bundle_root) / WHEELS_DIR
    wheels = resolve_request(request, sources, work, tool)
    fetch = fetch_wheels(request, sources, wheels, wheels_dir, work, tool)
    dropped = drop_unwanted(wheels_dir, [wheel.filename for wheel in fetch.wheels])
    write_indexes(wheels_dir, fetch.wheels, request)
    check = check_wheelhouse(wheels_dir, request, work, inputs, tool)
    return WheelBuild(fetch, tuple(dropped), check, tuple(warnings))
