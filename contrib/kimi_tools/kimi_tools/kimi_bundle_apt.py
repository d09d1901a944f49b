"""The apt part of an air-gapped bundle (bin/kimi-bundle): the pinned debs and their whole dependency closure,
fetched with apt's own solver for the nodes' distribution, laid out as a signed flat repository in
``<bundle>/apt/``, and proved installable from that repository alone by apt itself.

The steps, each a function (build_apt_repository runs them in order):

1. create_apt_root, update_lists, fetch_packages: a private apt root (its own apt.conf, sources.list, empty
   dpkg status, lists and archives, all under a work directory), ``apt-get update``, then
   ``apt-get install --download-only`` of ``package=version`` for every pin and the bare name of every
   unpinned package, so apt's resolver picks the closure at the pinned versions.
2. lay_out_repository, write_indexes, write_release, sign_release, export_keyring: the .debs, ``Packages``
   and ``Packages.gz`` (apt-ftparchive packages), ``Release`` (apt-ftparchive release, with Origin, Label,
   Suite, Codename and Architectures), ``InRelease`` and ``Release.gpg`` (gpg), and the public key as the
   binary keyring KEYRING_NAME that nodes name in ``signed-by``.
3. check_repository: a second, fresh private root whose only source is
   ``deb [signed-by=<KEYRING_NAME>] file:<bundle>/apt ./``: ``apt-get update`` verifies the signature,
   ``apt-get install -s`` must resolve every pin at its version from the bundle alone, ``apt-get install
   --download-only`` hashes every .deb of the closure against the signed index (the file method reads them
   in place and copies nothing), and kimi_bundle_manifest.apt_index_problems reads the Packages file.
4. Incremental builds: apt skips a file already in its archives directory when only its SIZE matches
   (checked on apt 2.6: a same-size corrupt .deb is kept), so nothing unverified may sit there. Before the
   download, apt's ``--print-uris`` lists the closure with each file's size and sha256 from the sources'
   signed indexes; kimi_bundle_fetch.plan_fetches matches those against the sha256 of the .debs the bundle (or an
   interrupted run's archives directory) already holds, only matches are linked into the archives
   directory, everything else there is removed, and apt fetches the rest. AptFetch reports both byte counts.

Why the private root is an APT_CONFIG file and not only ``-o`` options: apt reads APT_CONFIG before
/etc/apt/apt.conf.d, and that file points Dir::Etc::parts and Dir::Etc::main into the root, so none of the
host's apt configuration is read nor any of its hooks run (the host's APT::Update::Post-Invoke-Success
refreshes appstream's cache, docker images' docker-clean deletes /var/cache/apt/archives/*.deb). Every Dir::
path apt resolves is checked to lie inside the root (apt-config) before apt runs.

Hand-written, and why: the apt.conf and sources.list text (apt has no command that writes them); reading
apt-get's ``--print-uris`` lines and simulation ``Inst`` lines (apt prints nothing machine-readable for the
closure it resolved) and its ``E:`` lines (to name the package, version or source in errors). Everything else
is apt-get, apt-config, apt-ftparchive, gpg, gpgv and gpgconf; the commands run through run_tool only.

No Ansible imports; part of the bundle builder (``kimi_tools.kimi_bundle_apt``), not of the collection.
"""

from __future__ import annotations

import gzip
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from urllib.parse import unquote

from ansible_collections.kimi.k2.plugins.module_utils.kimi_bundle_fetch import Artifact, FetchPlan, plan_fetches
from ansible_collections.kimi.k2.plugins.module_utils.kimi_bundle_inputs import (
    APT_PACKAGES,
    DEB_PINS,
    DEBIAN_PACKAGE,
    BuildInputs,
)
from ansible_collections.kimi.k2.plugins.module_utils.kimi_bundle_manifest import apt_index_problems
from ansible_collections.kimi.k2.plugins.module_utils.kimi_bundle_tree import BundleError, hash_file
from ansible_collections.kimi.k2.plugins.module_utils.kimi_inputs import DEBIAN_VERSION
from ansible_collections.kimi.k2.plugins.module_utils.kimi_report import write_atomic

# The bundle's apt repository: a flat repository (suite "./") in this directory of the bundle.
APT_DIR = "apt"
KEYRING_NAME = "kimi-bundle-archive.gpg"
PACKAGES_NAME = "Packages"
PACKAGES_GZ_NAME = "Packages.gz"
RELEASE_NAME = "Release"
INRELEASE_NAME = "InRelease"
RELEASE_GPG_NAME = "Release.gpg"
# Written from the .debs on every build; removed first, so a stale signature never sits beside a new index.
GENERATED_NAMES = (PACKAGES_NAME, PACKAGES_GZ_NAME, RELEASE_NAME, INRELEASE_NAME, RELEASE_GPG_NAME, KEYRING_NAME)
FLAT_SUITE = "./"
ORIGIN = "kimi-bundle"
# plan_fetches' name for the .debs an interrupted run left in the private archives directory.
CACHE_POOL = "cache"
DEFAULT_KEY_USER_ID = "kimi-bundle build key <kimi-bundle@localhost>"

# The programs (module names, so a test can point one at a missing file) and the Debian package of each.
APT_GET = "apt-get"
APT_CONFIG = "apt-config"
APT_FTPARCHIVE = "apt-ftparchive"
GPG = "gpg"
GPGV = "gpgv"
GPGCONF = "gpgconf"
PROVIDERS = {
    "apt-get": "apt",
    "apt-config": "apt",
    "apt-ftparchive": "apt-utils",
    "gpg": "gnupg",
    "gpgv": "gpgv",
    "gpgconf": "gpgconf",
}

URI = re.compile(r"(?:file|copy|http|https):\S+")
COMPONENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_./-]*")
# "./" (flat), "bookworm", "bookworm-updates", "stable/updates"
SUITE = re.compile(r"[A-Za-z0-9._/-]+")
ARCHITECTURE = re.compile(r"[a-z0-9][a-z0-9-]*")
# A line of `apt-get --print-uris`: 'URI' FILE-NAME SIZE HASH (HASH is SHA256:... under Acquire::ForceHash).
PRINT_URI = re.compile(r"'(?P<uri>[^']+)' (?P<name>\S+) (?P<size>[0-9]+) ?(?P<hash>\S*)")
SHA256_HASH = re.compile(r"SHA256:(?P<hex>[0-9a-f]{64})")
# `apt-get -s` prints one Inst line per package it would install: Inst NAME [OLD] (VERSION RELEASE [ARCH]).
INST_LINE = re.compile(r"^Inst (?P<package>[^\s:]+)(?::\S+)? (?:\[[^\]]*\] )?\((?P<version>\S+)", re.MULTILINE)
VERSION_NOT_FOUND = re.compile(r"^E: Version '(?P<version>[^']+)' for '(?P<package>[^']+)' was not found", re.M)
UNKNOWN_PACKAGE = re.compile(r"^E: Unable to locate package (?P<package>\S+)", re.MULTILINE)
NO_CANDIDATE = re.compile(r"^E: Package '(?P<package>[^']+)' has no installation candidate", re.MULTILINE)
HASH_MISMATCH = re.compile(r"^E: Failed to fetch (?P<uri>\S+)\s+Hash Sum mismatch", re.MULTILINE)
UNMET_HEADER = "The following packages have unmet dependencies:"
FETCH_FAILED = "Failed to fetch"
# The apt paths that must lie inside a private root, as apt-config resolves them (/d a directory, /f a file).
PRIVATE_PATHS = (
    "Dir::Etc/d",
    "Dir::Etc::main/f",
    "Dir::Etc::parts/d",
    "Dir::Etc::sourcelist/f",
    "Dir::Etc::sourceparts/d",
    "Dir::Etc::trusted/f",
    "Dir::Etc::trustedparts/d",
    "Dir::Etc::preferences/f",
    "Dir::Etc::preferencesparts/d",
    "Dir::Etc::netrc/f",
    "Dir::Etc::netrcparts/d",
    "Dir::State/d",
    "Dir::State::lists/d",
    "Dir::State::status/f",
    "Dir::State::extended_states/f",
    "Dir::Cache/d",
    "Dir::Cache::archives/d",
    "Dir::Cache::pkgcache/f",
    "Dir::Cache::srcpkgcache/f",
    "Dir::Log/d",
)
ERROR_LINES_SHOWN = 30


class AptBundleError(BundleError):
    """A step of the bundle's apt part failed; the message names the package and version, the source or the
    file, and quotes apt's or gpg's own words."""


# ------------------------------------------------------------------------------------------ commands


def tool_environment() -> dict[str, str]:
    """The caller's environment (PATH, proxies) with messages in English: errors are read for names."""
    return {**os.environ, "LC_ALL": "C"}


def run_tool(
    command: Sequence[str], what: str, env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run one command with its output captured; the exit status is the caller's to explain, in its terms.
    AptBundleError when the program is not installed, naming the Debian package that ships it."""
    environment = dict(env) if env is not None else tool_environment()
    program = command[0]
    if shutil.which(program, path=environment.get("PATH")) is None:
        provider = PROVIDERS.get(Path(program).name, "that ships it")
        raise AptBundleError(f"{what}: {program} is not installed (install the Debian package {provider})")
    return subprocess.run(list(command), env=environment, cwd=cwd, capture_output=True, text=True, check=False)


def output_tail(text: str, lines: int = ERROR_LINES_SHOWN) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def require_success(result: subprocess.CompletedProcess[str], what: str) -> subprocess.CompletedProcess[str]:
    if result.returncode != 0:
        raise AptBundleError(f"{what} failed (exit {result.returncode}):\n{output_tail(result.stderr + result.stdout)}")
    return result


# --------------------------------------------------------------------------------------------- sources


@dataclass(frozen=True)
class AptSource:
    """One repository the debs come from: a URI and a suite ("./" for a flat repository, which then has no
    components), trusted only where the caller says so (the lab's unsigned mirrors), else signed by a keyring."""

    uri: str
    suite: str = FLAT_SUITE
    components: tuple[str, ...] = ()
    trusted: bool = False
    signed_by: Path | None = None

    def describe(self) -> str:
        return " ".join([self.uri, self.suite, *self.components])


def source_problems(source: AptSource) -> list[str]:
    """Why apt could not be given this source, each naming it; empty when it can."""
    name = f"apt source {source.describe()}"
    problems = []
    if not URI.fullmatch(source.uri):
        problems.append(f"{name}: the URI must be file:, copy:, http: or https: and hold no white space")
    if not SUITE.fullmatch(source.suite):
        problems.append(f"{name}: {source.suite!r} is not a suite (a flat repository's is ./)")
    flat = source.suite.endswith("/")
    if flat and source.components:
        problems.append(f"{name}: a flat repository (suite {source.suite}) has no components")
    if not flat and not source.components:
        problems.append(f"{name}: suite {source.suite} needs at least one component, e.g. main")
    problems += [f"{name}: {part!r} is not a component" for part in source.components if not COMPONENT.fullmatch(part)]
    if source.trusted == (source.signed_by is not None):
        problems.append(f"{name}: give exactly one of signed_by (a keyring) and trusted (an unsigned repository)")
    if source.signed_by is not None and (not Path(source.signed_by).is_absolute() or " " in str(source.signed_by)):
        problems.append(f"{name}: signed_by must be an absolute path without spaces (got {source.signed_by})")
    return problems


def fetch_uri(uri: str, copy_local_files: bool) -> str:
    """The URI apt is given. apt's file method uses a local repository's .debs where they lie, so a
    --download-only run would leave nothing in the archives directory; copy: is the same method plus a copy."""
    if copy_local_files and uri.startswith("file:"):
        return "copy:" + uri.removeprefix("file:")
    return uri


def source_line(source: AptSource, copy_local_files: bool) -> str:
    option = "trusted=yes" if source.trusted else f"signed-by={source.signed_by}"
    return " ".join(["deb", f"[{option}]", fetch_uri(source.uri, copy_local_files), source.suite, *source.components])


def sources_list_text(sources: Sequence[AptSource], copy_local_files: bool) -> str:
    problems = [problem for source in sources for problem in source_problems(source)]
    if not sources:
        problems.append("no apt source given: the debs must come from somewhere")
    if problems:
        raise AptBundleError("; ".join(problems))
    return "".join(source_line(source, copy_local_files) + "\n" for source in sources)


def _same_location(uri: str) -> str:
    """A URI as apt prints it: copy: read as file:, any run of slashes after the scheme as one."""
    return re.sub(r"^(?:file|copy):/+", "file:/", uri).rstrip("/")


def source_for(text: str, sources: Iterable[AptSource]) -> AptSource | None:
    """The source whose URI appears in a line of apt's output."""
    normalised = re.sub(r"(?:file|copy):/+", "file:/", text)
    for source in sources:
        if _same_location(source.uri) in normalised:
            return source
    return None


# ----------------------------------------------------------------------------------------- the apt root


@dataclass(frozen=True)
class AptRoot:
    """A private apt root under `base`: apt reads and writes nothing outside it (see apt_settings)."""

    base: Path
    architecture: str
    sources: tuple[AptSource, ...]
    copy_local_files: bool

    @property
    def config_file(self) -> Path:
        return self.base / "apt.conf"

    @property
    def etc(self) -> Path:
        return self.base / "etc"

    @property
    def state(self) -> Path:
        return self.base / "state"

    @property
    def status(self) -> Path:
        return self.state / "status"

    @property
    def archives(self) -> Path:
        return self.base / "cache" / "archives"

    @property
    def plan_archives(self) -> Path:
        """An always-empty archives directory, so that --print-uris lists the whole closure."""
        return self.base / "plan" / "archives"


def apt_settings(root: AptRoot) -> dict[str, str | tuple[str, ...]]:
    """Every setting of the private root's apt.conf; each Dir:: path is absolute and inside root.base."""
    base, etc = root.base, root.etc
    return {
        "Dir": f"{base}/",
        "Dir::Etc": f"{etc}/",
        "Dir::Etc::main": str(etc / "apt.conf"),
        "Dir::Etc::parts": f"{etc / 'apt.conf.d'}/",
        "Dir::Etc::sourcelist": str(etc / "sources.list"),
        "Dir::Etc::sourceparts": f"{etc / 'sources.list.d'}/",
        "Dir::Etc::trusted": str(etc / "trusted.gpg"),
        "Dir::Etc::trustedparts": f"{etc / 'trusted.gpg.d'}/",
        "Dir::Etc::preferences": str(etc / "preferences"),
        "Dir::Etc::preferencesparts": f"{etc / 'preferences.d'}/",
        "Dir::Etc::netrc": str(etc / "auth.conf"),
        "Dir::Etc::netrcparts": f"{etc / 'auth.conf.d'}/",
        "Dir::State": f"{root.state}/",
        "Dir::State::lists": f"{root.state / 'lists'}/",
        # Empty: as on a bare node, so the closure holds every dependency, not only what the host lacks.
        "Dir::State::status": str(root.status),
        "Dir::State::extended_states": str(root.state / "extended_states"),
        "Dir::Cache": f"{root.archives.parent}/",
        "Dir::Cache::archives": f"{root.archives}/",
        "Dir::Log": f"{base / 'log'}/",
        "APT::Architecture": root.architecture,
        "APT::Architectures": (root.architecture,),
        "APT::Install-Recommends": "false",
        "APT::Install-Suggests": "false",
        # A source that fails is an error, not a warning after which apt carries on with older lists.
        "APT::Update::Error-Mode": "any",
        "Acquire::Languages": ("none",),
        # As root, apt drops to _apt for downloads and falls back to root, warning on every file, when _apt
        # cannot reach a private root (a 0700 work directory); say so up front so the output stays readable.
        "APT::Sandbox::User": "root",
    }


def _conf_value(key: str, value: str) -> str:
    # apt.conf has no escapes: a quote, a backslash or a line break would end or corrupt the value.
    if re.search(r'["\\\x00-\x1f]', value):
        raise AptBundleError(f"apt setting {key}: {value!r} holds a quote, a backslash or a control character")
    return f'"{value}"'


def apt_config_text(settings: Mapping[str, str | tuple[str, ...]]) -> str:
    lines = ["// A private apt root written by kimi_bundle_apt: the host's /etc/apt is never read."]
    for key, value in settings.items():
        if isinstance(value, tuple):
            lines.append(f"{key} {{ {' '.join(_conf_value(key, item) + ';' for item in value)} }};")
        else:
            lines.append(f"{key} {_conf_value(key, value)};")
    return "\n".join(lines) + "\n"


def apt_environment(root: AptRoot) -> dict[str, str]:
    return {**tool_environment(), "APT_CONFIG": str(root.config_file)}


def _make_directories(root: AptRoot) -> None:
    for name in ("apt.conf.d", "sources.list.d", "trusted.gpg.d", "preferences.d", "auth.conf.d"):
        (root.etc / name).mkdir(parents=True, exist_ok=True)
    for directory in (root.state / "lists" / "partial", root.archives / "partial", root.plan_archives / "partial"):
        directory.mkdir(parents=True, exist_ok=True)
    (root.base / "log").mkdir(exist_ok=True)


def create_apt_root(
    base: Path, architecture: str, sources: Sequence[AptSource], copy_local_files: bool = True
) -> AptRoot:
    """Write a private apt root under `base` (kept between runs: its archives directory is what an
    interrupted download resumes from) and check with apt-config that apt resolves every path inside it."""
    if not ARCHITECTURE.fullmatch(architecture):
        raise AptBundleError(f"architecture {architecture!r} is not a Debian architecture name")
    root = AptRoot(Path(base).resolve(), architecture, tuple(sources), copy_local_files)
    sources_text = sources_list_text(root.sources, copy_local_files)
    config_text = apt_config_text(apt_settings(root))
    _make_directories(root)
    root.status.write_text("")
    (root.etc / "sources.list").write_text(sources_text)
    root.config_file.write_text(config_text)
    outside = paths_outside(resolved_apt_paths(root), root.base)
    if outside:
        raise AptBundleError(f"the private apt root {root.base} leaks onto the host: " + "; ".join(outside))
    return root


def resolved_apt_paths(root: AptRoot) -> dict[str, str]:
    """Each of PRIVATE_PATHS as apt itself resolves it under the root's configuration (apt-config shell)."""
    names = {f"KIMI_PATH_{index}": key for index, key in enumerate(PRIVATE_PATHS)}
    arguments = [part for name, key in names.items() for part in (name, key)]
    result = run_tool([APT_CONFIG, "shell", *arguments], "apt-config", env=apt_environment(root))
    require_success(result, "apt-config shell (resolving the private root's paths)")
    return parse_apt_config_shell(result.stdout, names)


def parse_apt_config_shell(output: str, names: Mapping[str, str]) -> dict[str, str]:
    """{apt key: value} from `apt-config shell` lines NAME='value' (shell-quoted)."""
    resolved = {}
    for line in output.splitlines():
        name, _, quoted = line.partition("=")
        if name in names:
            values = shlex.split(quoted)
            resolved[names[name]] = values[0] if values else ""
    return resolved


def paths_outside(resolved: Mapping[str, str], base: Path) -> list[str]:
    """Each resolved apt path that is not inside `base`, named by its key; an empty value (unset) is fine."""
    base = Path(base)
    return [
        f"{key} is {value}, outside {base}"
        for key, value in resolved.items()
        if value and not Path(value).is_relative_to(base)
    ]


# -------------------------------------------------------------------------------------- what to install


@dataclass(frozen=True)
class AptRequest:
    """The debs a bundle must hold: pins (package -> exact version) and unpinned packages (apt's candidate)."""

    architecture: str
    pins: Mapping[str, str] = field(default_factory=dict)
    extras: tuple[str, ...] = ()
    # Which variable each pin came from, for messages only.
    pin_sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    @classmethod
    def from_inputs(cls, inputs: BuildInputs) -> AptRequest:
        return cls(inputs.architecture, dict(inputs.apt_pins), tuple(inputs.apt_packages), dict(inputs.apt_pin_sources))

    def source_of(self, package: str) -> str:
        if package in self.pins:
            return self.pin_sources.get(package, DEB_PINS)
        return APT_PACKAGES if package in self.extras else "not requested"

    def label(self, package: str) -> str:
        version = self.pins.get(package)
        return f"apt package {package}{' ' + version if version else ''} ({self.source_of(package)})"


def request_problems(request: AptRequest) -> list[str]:
    problems = []
    for package, version in request.pins.items():
        if not DEBIAN_PACKAGE.fullmatch(package) or not DEBIAN_VERSION.fullmatch(version):
            problems.append(f"{request.label(package)}: not a Debian package name and exact version")
    problems += [
        f"{request.label(name)}: not a Debian package name"
        for name in request.extras
        if not DEBIAN_PACKAGE.fullmatch(name)
    ]
    if not request.pins and not request.extras:
        problems.append("nothing to fetch: no apt pin and no unpinned apt package")
    return problems


def install_arguments(request: AptRequest) -> list[str]:
    """apt-get install's package arguments: NAME=VERSION per pin, then each unpinned name not also pinned.
    Names are checked first: one starting with '-' would be read as an option."""
    problems = request_problems(request)
    if problems:
        raise AptBundleError("; ".join(problems))
    pinned = [f"{package}={version}" for package, version in sorted(request.pins.items())]
    return pinned + sorted(set(request.extras) - set(request.pins))


# ---------------------------------------------------------------------------- reading apt's output


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(("E: ", "W: "))][:ERROR_LINES_SHOWN]


def unmet_dependency_lines(output: str) -> list[str]:
    """The block apt prints under UNMET_HEADER: ' pkg : Depends: other (= v) but w is to be installed'."""
    lines = output.splitlines()
    if UNMET_HEADER not in lines:
        return []
    block = []
    for line in lines[lines.index(UNMET_HEADER) + 1 :]:
        if not line.startswith(" "):
            break
        block.append(line)
    return [UNMET_HEADER, *block]


def install_failure_message(output: str, request: AptRequest, what: str) -> str:
    """What apt could not do, per package and version (named with the variable each came from), followed
    by apt's own lines."""
    named = [
        f"apt package {found['package']} {found['version']} ({request.source_of(found['package'])}): "
        "no apt source has this version"
        for found in VERSION_NOT_FOUND.finditer(output)
    ]
    named += [
        f"{request.label(found['package'])}: no apt source has this package"
        for found in UNKNOWN_PACKAGE.finditer(output)
    ]
    named += [
        f"{request.label(found['package'])}: apt has no installable version of it (a virtual package, or only "
        f"for another architecture than {request.architecture}?)"
        for found in NO_CANDIDATE.finditer(output)
    ]
    named += [
        f"{unquote(PurePosixPath(found['uri']).name)}: its content does not match the signed index (apt: Hash Sum "
        "mismatch)"
        for found in HASH_MISMATCH.finditer(output)
    ]
    unmet = unmet_dependency_lines(output)
    if unmet and not named:
        named.append("the pinned versions' dependencies cannot all be met from the sources")
    said = "\n".join([*unmet, *error_lines(output)]) or output_tail(output)
    summary = f": {'; '.join(named)}" if named else ""
    return f"{what} failed{summary}\napt said:\n{said}"


def update_failure_message(output: str, sources: Sequence[AptSource], what: str) -> str:
    """apt-get update's failures, each line naming the source it is about."""
    lines = []
    for line in error_lines(output):
        source = source_for(line, sources)
        if source is None:
            lines.append(line)
        elif FETCH_FAILED in line:
            lines.append(f"apt source {source.describe()} does not answer: {line}")
        else:
            lines.append(f"apt source {source.describe()}: {line}")
    return f"{what} failed:\n" + "\n".join(lines or [output_tail(output)])


@dataclass(frozen=True)
class AptDownload:
    """One .deb of the closure: where apt fetches it, the name apt stores it under, its size and sha256."""

    uri: str
    filename: str
    size: int
    sha256: str | None

    def artifact(self) -> Artifact:
        return Artifact(f"{APT_DIR}/{self.filename}", self.size, self.sha256)


def parse_print_uris(output: str) -> list[AptDownload]:
    """The downloads in `apt-get --print-uris` output (other lines, such as 'Reading package lists...', skipped)."""
    downloads = []
    for line in output.splitlines():
        found = PRINT_URI.fullmatch(line.strip())
        if not found:
            continue
        name = found["name"]
        if "/" in name or not name.endswith(".deb"):
            raise AptBundleError(f"apt-get --print-uris: {name!r} is not a .deb file name (line {line!r})")
        sha256 = SHA256_HASH.fullmatch(found["hash"])
        downloads.append(AptDownload(found["uri"], name, int(found["size"]), sha256["hex"] if sha256 else None))
    return downloads


def parse_simulated_installs(output: str) -> dict[str, str]:
    """{package: version} from `apt-get install -s` output's Inst lines."""
    return {found["package"]: found["version"] for found in INST_LINE.finditer(output)}


def unresolved_requests(installs: Mapping[str, str], request: AptRequest) -> list[str]:
    """Each pin apt would not install at its version, and each unpinned package it would not install."""
    problems = []
    for package, version in sorted(request.pins.items()):
        if installs.get(package) != version:
            found = installs.get(package)
            would = f"version {found}" if found else "nothing"
            problems.append(f"{request.label(package)}: apt would install {would} from the bundle")
    for package in sorted(set(request.extras) - set(request.pins)):
        if package not in installs:
            problems.append(f"{request.label(package)}: apt would not install it from the bundle")
    return problems


# ---------------------------------------------------------------------------- step 1: fetch with apt


def update_lists(root: AptRoot, what: str = "apt-get update") -> None:
    """apt-get update in the private root; every source must answer (APT::Update::Error-Mode any)."""
    result = run_tool([APT_GET, "update", "-q"], what, env=apt_environment(root))
    if result.returncode != 0:
        raise AptBundleError(update_failure_message(result.stdout + result.stderr, root.sources, what))


def _install(root: AptRoot, request: AptRequest, options: Sequence[str], what: str) -> str:
    command = [APT_GET, "install", "--download-only", "--no-install-recommends", "-q", "-y", *options]
    result = run_tool([*command, *install_arguments(request)], what, env=apt_environment(root))
    if result.returncode != 0:
        raise AptBundleError(install_failure_message(result.stdout + "\n" + result.stderr, request, what))
    return result.stdout


def plan_downloads(root: AptRoot, request: AptRequest) -> list[AptDownload]:
    """The closure apt resolves for the request, as downloads with the sha256 of the sources' indexes."""
    for leftover in root.plan_archives.glob("*.deb"):
        leftover.unlink()
    options = [
        "--print-uris",
        # Without it apt prints whichever hash it lists first (MD5Sum on Debian's indexes).
        "-o",
        "Acquire::ForceHash=SHA256",
        "-o",
        f"Dir::Cache::archives={root.plan_archives}/",
    ]
    output = _install(root, request, options, "apt-get install --print-uris (resolving the pins)")
    downloads = parse_print_uris(output)
    if not downloads:
        raise AptBundleError(f"apt-get install --print-uris listed nothing to fetch:\n{output_tail(output)}")
    return downloads


def deb_entries(directory: Path, pool: str) -> list[dict]:
    """{path: POOL/NAME, size, sha256} of each regular .deb in `directory`, for kimi_bundle_fetch.plan_fetches."""
    if not directory.is_dir():
        return []
    entries = []
    for path in sorted(directory.glob("*.deb")):
        if path.is_file() and not path.is_symlink():
            size, sha256 = hash_file(path)
            entries.append({"path": f"{pool}/{path.name}", "size": size, "sha256": sha256})
    return entries


def link_or_copy(source: Path, target: Path) -> None:
    """`target` holding `source`'s bytes, replaced in one rename: a hard link where both share a file system
    (nothing copied; apt never writes into a file it keeps, it renames new ones over it), else a copy."""
    temporary = target.with_name(target.name + ".kimi-seed")
    temporary.unlink(missing_ok=True)
    try:
        temporary.hardlink_to(source)
    except OSError:  # another file system, or one without hard links
        shutil.copy2(source, temporary)
    temporary.replace(target)


def seed_archives(plan: FetchPlan, pools: Mapping[str, Path], archives: Path) -> None:
    """Put every reusable .deb into apt's archives directory under the name apt looks for, then remove every
    other .deb there: apt would keep any file of the right size, whatever its content."""
    keep = set()
    for new_path, old_path in plan.reuse:
        pool, _, name = old_path.partition("/")
        source, target = pools[pool] / name, archives / PurePosixPath(new_path).name
        if not (target.exists() and source.exists() and target.samefile(source)):
            link_or_copy(source, target)
        keep.add(target.name)
    for path in archives.glob("*.deb"):
        if path.name not in keep:
            path.unlink()


def missing_downloads(archives: Path, downloads: Iterable[AptDownload]) -> list[str]:
    problems = []
    for download in downloads:
        path = archives / download.filename
        if not path.is_file():
            problems.append(f"{download.filename}: apt reported success but did not store it")
        elif path.stat().st_size != download.size:
            problems.append(f"{download.filename}: {path.stat().st_size} bytes, the index says {download.size}")
    return problems


@dataclass(frozen=True)
class AptFetch:
    """The closure and how each file got into apt's archives directory: reused (already held, same sha256)
    or fetched from the sources."""

    downloads: tuple[AptDownload, ...]
    reused: tuple[str, ...]
    fetched: tuple[str, ...]

    def _bytes(self, names: Iterable[str]) -> int:
        sizes = {download.filename: download.size for download in self.downloads}
        return sum(sizes[name] for name in names)

    @property
    def fetched_bytes(self) -> int:
        return self._bytes(self.fetched)

    @property
    def reused_bytes(self) -> int:
        return self._bytes(self.reused)

    def summary(self) -> str:
        return (
            f"{len(self.downloads)} debs: fetched {len(self.fetched)} ({self.fetched_bytes} bytes), "
            f"reused {len(self.reused)} ({self.reused_bytes} bytes)"
        )


def fetch_packages(root: AptRoot, request: AptRequest, apt_dir: Path) -> AptFetch:
    """The closure of `request` in root.archives, reusing every .deb `apt_dir` (the bundle's apt directory)
    or the archives directory already holds with the sha256 the sources' indexes give; apt fetches the rest.
    Run update_lists first."""
    downloads = plan_downloads(root, request)
    pools = {APT_DIR: Path(apt_dir), CACHE_POOL: root.archives}
    have = sorted(deb_entries(Path(apt_dir), APT_DIR) + deb_entries(root.archives, CACHE_POOL), key=lambda e: e["path"])
    plan = plan_fetches(have, [download.artifact() for download in downloads])
    seed_archives(plan, pools, root.archives)
    if plan.fetch:
        _install(root, request, [], "apt-get install --download-only")
    missing = missing_downloads(root.archives, downloads)
    if missing:
        raise AptBundleError("after apt-get install --download-only: " + "; ".join(missing))
    return AptFetch(
        downloads=tuple(downloads),
        reused=tuple(PurePosixPath(new_path).name for new_path, _ in plan.reuse),
        fetched=tuple(PurePosixPath(artifact.path).name for artifact, _ in plan.fetch),
    )


# -------------------------------------------------------------------- step 2: the flat repository


def move_file(source: Path, target: Path) -> None:
    try:
        source.replace(target)
    except OSError:  # another file system: copy, then remove
        link_or_copy(source, target)
        source.unlink()


def lay_out_repository(root: AptRoot, fetch: AptFetch, apt_dir: Path) -> list[str]:
    """Move the closure from root.archives into `apt_dir`, remove the .debs no longer in it and the previous
    indexes and signatures; returns the names of the removed .debs. The archives directory is left empty, so
    the next run has only the bundle to hash."""
    apt_dir = Path(apt_dir)
    apt_dir.mkdir(parents=True, exist_ok=True)
    wanted = {download.filename for download in fetch.downloads}
    for name in sorted(wanted):
        source, target = root.archives / name, apt_dir / name
        if target.exists() and target.samefile(source):
            source.unlink()
        else:
            move_file(source, target)
    dropped = sorted(path.name for path in apt_dir.glob("*.deb") if path.name not in wanted)
    for name in dropped:
        (apt_dir / name).unlink()
    for name in GENERATED_NAMES:
        (apt_dir / name).unlink(missing_ok=True)
    return dropped


def write_indexes(root: AptRoot, apt_dir: Path) -> None:
    """Packages (apt-ftparchive packages, Filename ./NAME as a flat repository needs) and Packages.gz."""
    what = "apt-ftparchive packages"
    result = require_success(run_tool([APT_FTPARCHIVE, "packages", "."], what, apt_environment(root), apt_dir), what)
    packages = result.stdout.encode()
    write_atomic(Path(apt_dir) / PACKAGES_NAME, packages)
    # mtime 0: the same index gives the same bytes, so an unchanged bundle stays unchanged.
    write_atomic(Path(apt_dir) / PACKAGES_GZ_NAME, gzip.compress(packages, compresslevel=9, mtime=0))


@dataclass(frozen=True)
class ReleaseFields:
    """What the Release file says about the repository; nodes may pin on Origin (apt_preferences o=)."""

    origin: str
    label: str
    suite: str
    codename: str
    architectures: tuple[str, ...]

    @classmethod
    def for_inputs(cls, inputs: BuildInputs) -> ReleaseFields:
        label = f"kimi.k2 bundle for {inputs.inventory_name}"
        return cls(ORIGIN, label, inputs.codename, inputs.codename, (inputs.architecture,))


def release_options(fields: ReleaseFields) -> list[str]:
    values = {
        "Origin": fields.origin,
        "Label": fields.label,
        "Suite": fields.suite,
        "Codename": fields.codename,
        "Architectures": " ".join(fields.architectures),
    }
    options = []
    for name, value in values.items():
        if not value or "\n" in value:
            raise AptBundleError(f"Release field {name}: {value!r} must be one non-empty line")
        options += ["-o", f"APT::FTPArchive::Release::{name}={value}"]
    return options


def write_release(root: AptRoot, apt_dir: Path, fields: ReleaseFields) -> None:
    """Release with the sizes and hashes of Packages and Packages.gz (apt-ftparchive release)."""
    what = "apt-ftparchive release"
    command = [APT_FTPARCHIVE, *release_options(fields), "release", "."]
    result = require_success(run_tool(command, what, apt_environment(root), apt_dir), what)
    write_atomic(Path(apt_dir) / RELEASE_NAME, result.stdout)


@dataclass(frozen=True)
class SigningKey:
    """A secret key in a GnuPG home: the caller's (its agent must be able to use it unattended) or one
    build_dir_signing_key made."""

    gnupg_home: Path
    key_id: str


def gpg_base(gnupg_home: Path) -> list[str]:
    return [GPG, "--homedir", str(gnupg_home), "--batch", "--no-tty"]


def gpg_command(key: SigningKey, *arguments: str) -> list[str]:
    """gpg on the key's home; the key id is checked first, since one starting with '-' would be an option."""
    if not key.key_id or key.key_id.startswith("-") or "\n" in key.key_id:
        raise AptBundleError(f"signing key id {key.key_id!r}: give a fingerprint, a key id or a user id")
    return [*gpg_base(key.gnupg_home), *arguments]


def secret_key_fingerprints(colons: str) -> list[str]:
    """The primary keys' fingerprints in `gpg --with-colons --list-secret-keys` output."""
    fingerprints, after_primary = [], False
    for line in colons.splitlines():
        fields = line.split(":")
        if fields[0] in ("sec", "ssb"):
            after_primary = fields[0] == "sec"
        elif fields[0] == "fpr" and after_primary and len(fields) > 9:
            fingerprints.append(fields[9])
            after_primary = False
    return fingerprints


def _secret_keys(gnupg_home: Path) -> list[str]:
    result = run_tool([*gpg_base(gnupg_home), "--with-colons", "--list-secret-keys"], "gpg --list-secret-keys")
    # gpg exits 2 on a new home with no keyring yet: that is "no keys", read from the output.
    return secret_key_fingerprints(result.stdout)


def build_dir_signing_key(gnupg_home: Path, user_id: str = DEFAULT_KEY_USER_ID) -> SigningKey:
    """The first secret key in `gnupg_home`, made there first when there is none (ed25519, no passphrase,
    for a build directory and tests; a site signs with its own key). Reused on later builds, so the nodes'
    keyring stays the same. Stop its agent with stop_gpg_agent when done."""
    home = Path(gnupg_home)
    home.mkdir(parents=True, exist_ok=True)
    home.chmod(0o700)  # gpg warns about, and may refuse, a home others can read
    existing = _secret_keys(home)
    if existing:
        return SigningKey(home, existing[0])
    what = "gpg --quick-gen-key"
    if not user_id or user_id.startswith("-") or "\n" in user_id:
        raise AptBundleError(f"key user id {user_id!r}: give one line such as 'Name <address>'")
    command = [*gpg_base(home), "--passphrase", "", "--quick-gen-key", user_id, "ed25519", "sign", "never"]
    require_success(run_tool(command, what), what)
    made = _secret_keys(home)
    if not made:
        raise AptBundleError(f"{what} made no secret key in {home}")
    return SigningKey(home, made[0])


def stop_gpg_agent(gnupg_home: Path) -> None:
    """Stop the gpg-agent that gpg started for this home (only that one)."""
    run_tool([GPGCONF, "--homedir", str(gnupg_home), "--kill", "gpg-agent"], "gpgconf --kill gpg-agent")


def sign_release(apt_dir: Path, key: SigningKey) -> None:
    """InRelease (clear-signed Release) and Release.gpg (detached, armored), with SHA512 digests whatever
    the home's gpg.conf prefers: apt refuses SHA1 signatures."""
    apt_dir = Path(apt_dir)
    common = ["--yes", "--local-user", key.key_id, "--digest-algo", "SHA512"]
    for output, mode in ((INRELEASE_NAME, ["--clearsign"]), (RELEASE_GPG_NAME, ["--armor", "--detach-sign"])):
        what = f"gpg signing {output} with {key.key_id} from {key.gnupg_home}"
        command = gpg_command(key, *common, *mode, "--output", str(apt_dir / output), str(apt_dir / RELEASE_NAME))
        require_success(run_tool(command, what), what)


def export_keyring(apt_dir: Path, key: SigningKey) -> Path:
    """The public key as a binary keyring in the bundle, for the nodes' signed-by."""
    keyring = Path(apt_dir) / KEYRING_NAME
    keyring.unlink(missing_ok=True)
    what = f"gpg --export {key.key_id}"
    command = gpg_command(key, "--export-options", "export-minimal", "--output", str(keyring), "--export", key.key_id)
    require_success(run_tool(command, what), what)
    if not keyring.is_file() or keyring.stat().st_size == 0:
        raise AptBundleError(f"{what}: {key.gnupg_home} has no public key {key.key_id}")
    return keyring


def verify_signatures(apt_dir: Path, keyring: Path, scratch_home: Path) -> None:
    """gpgv checks InRelease and Release.gpg against the exported keyring alone (apt reads only InRelease
    when it verifies, so Release.gpg is checked here)."""
    apt_dir = Path(apt_dir)
    Path(scratch_home).mkdir(mode=0o700, parents=True, exist_ok=True)
    base = [GPGV, "--homedir", str(scratch_home), "--keyring", str(Path(keyring).resolve())]
    checks = {INRELEASE_NAME: [str(apt_dir / INRELEASE_NAME)]}
    checks[RELEASE_GPG_NAME] = [str(apt_dir / RELEASE_GPG_NAME), str(apt_dir / RELEASE_NAME)]
    for name, files in checks.items():
        what = f"gpgv {name} against {keyring.name}"
        require_success(run_tool([*base, *files], what), what)


# -------------------------------------------------------------------- step 3: apt checks the bundle


@dataclass(frozen=True)
class AptCheck:
    """What apt would install on a bare node from the bundle alone: {package: version}."""

    installs: dict[str, str]


def check_repository(apt_dir: Path, request: AptRequest, base: Path, inputs: BuildInputs | None = None) -> AptCheck:
    """Prove with apt that nodes can install the request from the bundle alone: a fresh private root whose
    only source is the bundle with signed-by its keyring; update (signature), simulate (every pin at its
    version), download-only (each .deb's hash against the signed index, read in place); then
    kimi_bundle_manifest.apt_index_problems on Packages when `inputs` is given."""
    apt_dir = Path(apt_dir).resolve()
    shutil.rmtree(base, ignore_errors=True)  # no lists from an earlier check may stand in for this one
    source = AptSource(f"file:{apt_dir}", FLAT_SUITE, signed_by=apt_dir / KEYRING_NAME)
    root = create_apt_root(base, request.architecture, [source], copy_local_files=False)
    update_lists(root, f"apt-get update from the bundle's repository {apt_dir} (signed-by {KEYRING_NAME})")
    simulated = _install(root, request, ["-s"], "apt-get install -s from the bundle alone")
    installs = parse_simulated_installs(simulated)
    problems = unresolved_requests(installs, request)
    if not problems:
        _install(root, request, [], f"apt-get install --download-only from {apt_dir} (hash check of each .deb)")
    if inputs is not None:
        packages_text = (apt_dir / PACKAGES_NAME).read_text()
        problems += apt_index_problems(packages_text, inputs, f"{APT_DIR}/{PACKAGES_NAME}")
    if problems:
        raise AptBundleError(f"the bundle's apt repository {apt_dir}: " + "; ".join(problems))
    return AptCheck(installs)


# ---------------------------------------------------------------------------------------- all steps


@dataclass(frozen=True)
class AptBuild:
    """What build_apt_repository did: the fetch (bytes fetched and reused), the .debs dropped from the previous
    bundle, what apt would install from the bundle, and the keyring nodes name in signed-by."""

    fetch: AptFetch
    dropped: tuple[str, ...]
    check: AptCheck
    keyring: Path


def build_apt_repository(
    inputs: BuildInputs, sources: Sequence[AptSource], bundle_root: Path, work: Path, key: SigningKey
) -> AptBuild:
    """Every step: fetch the closure of the inputs' apt pins and packages from `sources` (private root in
    `work`, reusing the bundle's .debs), lay out and sign `bundle_root`/apt, and check it with apt."""
    request = AptRequest.from_inputs(inputs)
    apt_dir = Path(bundle_root) / APT_DIR
    apt_dir.mkdir(parents=True, exist_ok=True)
    root = create_apt_root(Path(work) / "apt-root", inputs.architecture, sources, copy_local_files=True)
    update_lists(root, "apt-get update from the sources")
    fetch = fetch_packages(root, request, apt_dir)
    dropped = lay_out_repository(root, fetch, apt_dir)
    write_indexes(root, apt_dir)
    write_release(root, apt_dir, ReleaseFields.for_inputs(inputs))
    sign_release(apt_dir, key)
    keyring = export_keyring(apt_dir, key)
    verify_signatures(apt_dir, keyring, Path(work) / "gpgv-home")
    check = check_repository(apt_dir, request, Path(work) / "apt-check", inputs)
    return AptBuild(fetch, tuple(dropped), check, keyring)
