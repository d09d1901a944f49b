"""Building and checking an air-gapped bundle (bin/kimi-bundle): orchestration of kimi_bundle_inputs,
kimi_bundle_manifest and kimi_bundle_tree (inputs, manifest, tree checks), kimi_bundle_apt (the signed apt
repository) and kimi_bundle_wheels (the wheelhouse).

build() runs, in this order:

1. seed: the new bundle is assembled in a staging area, and every .deb and .whl the previous bundle in OUT
   (and any --reuse-from bundle) holds is hard-linked there first (copied across file systems), so the steps
   below find them and reuse each one whose sha256 the sources still publish;
2. apt: kimi_bundle_apt.build_apt_repository (the closure of the pins, a signed flat repository, apt's own
   check from the bundle alone);
3. wheels: kimi_bundle_wheels.build_wheelhouse (pip's closure for the nodes' Python and platforms, the
   indexes, pip's own check from the bundle alone);
3b. hf, when the inventory sets kimi_bundle_checkpoint: kimi_bundle_hf.fetch_checkpoint lays the pinned
   checkpoint out under hf/ for the mirror's static server, reusing (after checking its size and checksum) every
   file the previous bundle's or a --reuse-from bundle's hf/ holds;
3c. advisories: the advisory snapshot the build was given (kimi_advisories.py; by default the kimi role's
   files/advisories.json) copied to advisories/advisories.json after it parses, so the bundle carries, under
   its signed manifest, the data the input check judged its pins with (docs/air-gapped.md);
4. manifest: every file's size and sha256 and the inputs (kimi_bundle_manifest.manifest_document), signed detached and
   armored by the key that signs the apt Release, and that signature checked against the bundle's keyring;
5. commit: OUT's manifest is removed first, its apt/, wheels/ and hf/ swapped for the new ones, then the signature
   and the manifest are renamed in, the manifest last. A directory without a manifest whose signature holds is
   never a complete bundle, so a reader never takes a half-swapped OUT for one.

Where a build works: beside OUT, never inside it (every file in OUT must be in the manifest, and the mirror
host copies OUT whole):

    <OUT>.partial/bundle/    the new bundle being assembled
    <OUT>.partial/work/      the private apt root and pip's runs: what an interrupted download resumes from
    <OUT>.partial/replaced/  the previous apt/ and wheels/ while they are swapped out
    <OUT>.partial/lock       one build at a time

An interrupted build leaves OUT as it was (or, interrupted during the swap, without a manifest) and its work in
<OUT>.partial, which the next build resumes from; a finished build removes <OUT>.partial.

verify() is what a receiver runs: kimi_bundle_verify's checks, the ones the mirror host runs (the manifest's
signature by the key whose fingerprint the operator pinned, with the bundle's exported keyring as the only key;
the tree against the manifest, sizes then sha256), then the manifest's inputs (their recorded sha256 included),
the apt index and the wheelhouse against those inputs, and those inputs against an inventory's. Each problem
names the file, or the variable.

No Ansible imports. Part of the bundle builder (``kimi_tools.kimi_bundle_build``), not of the collection.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ansible_collections.kimi.k2.plugins.module_utils.kimi_advisories import AdvisoryDataError
from ansible_collections.kimi.k2.plugins.module_utils.kimi_advisories import load as load_advisories
from ansible_collections.kimi.k2.plugins.module_utils.kimi_bundle_inputs import (
    WITH_CHECKPOINT,
    BuildInputs,
    Checkpoint,
    compare_inputs,
)
from ansible_collections.kimi.k2.plugins.module_utils.kimi_bundle_manifest import (
    apt_index_problems,
    manifest_document,
    manifest_inputs,
    read_manifest,
    wheelhouse_problems,
)
from ansible_collections.kimi.k2.plugins.module_utils.kimi_bundle_signature import verify_signature
from ansible_collections.kimi.k2.plugins.module_utils.kimi_bundle_tree import (
    MANIFEST_NAME,
    SIGNATURE_NAME,
    BundleError,
    ManifestError,
    manifest_entries,
    manifest_text,
)
from ansible_collections.kimi.k2.plugins.module_utils.kimi_bundle_verify import default_keyring, verify_bundle
from ansible_collections.kimi.k2.plugins.module_utils.kimi_checkpoint import files_from_tree, select_files
from ansible_collections.kimi.k2.plugins.module_utils.kimi_report import write_atomic

from .kimi_bundle_apt import (
    APT_DIR,
    GPGV,
    PACKAGES_NAME,
    AptBuild,
    AptSource,
    SigningKey,
    build_apt_repository,
    build_dir_signing_key,
    gpg_command,
    link_or_copy,
    require_success,
    run_tool,
    stop_gpg_agent,
)
from .kimi_bundle_hf import (
    FETCHED,
    HF_DIR,
    CheckpointFetch,
    fetch_checkpoint,
    resolve_path,
    revision_path,
    tree_path,
)
from .kimi_bundle_wheels import WHEELS_DIR, PipSources, PipTool, WheelBuild, build_wheelhouse

# The advisory snapshot's place in a bundle (step 3c): a directory of its own, swapped with the others.
ADVISORIES_DIR = "advisories"
ADVISORIES_NAME = "advisories.json"
# What a bundle directory holds; anything else in OUT is refused rather than swapped or listed. hf/ only when the
# inventory has the bundle carry the checkpoint, advisories/ when the build was given a snapshot.
BUNDLE_DIRS = (APT_DIR, WHEELS_DIR, HF_DIR, ADVISORIES_DIR)
BUNDLE_NAMES = frozenset({*BUNDLE_DIRS, MANIFEST_NAME, SIGNATURE_NAME})
# The files each directory's step reuses from an earlier bundle.
REUSABLE = {APT_DIR: "*.deb", WHEELS_DIR: "*.whl"}
PARTIAL_SUFFIX = ".partial"


class BuildError(BundleError):
    """The build could not run or finish; the message names the directory, the step or the file."""


# ------------------------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class BuildLayout:
    """The bundle directory and the partial area beside it (see the module's docstring)."""

    out: Path

    @property
    def partial(self) -> Path:
        return self.out.with_name(self.out.name + PARTIAL_SUFFIX)

    @property
    def staging(self) -> Path:
        return self.partial / "bundle"

    @property
    def work(self) -> Path:
        return self.partial / "work"

    @property
    def replaced(self) -> Path:
        return self.partial / "replaced"

    @property
    def lock(self) -> Path:
        return self.partial / "lock"


def absolute(path: str | Path) -> Path:
    """`path` absolute and normalised, symlinks kept (a link named as OUT is refused, not followed): apt's file:
    URIs and the partial area's name must not depend on the working directory."""
    return Path(os.path.normpath(Path(path).expanduser().absolute()))


def layout_for(out_dir: Path) -> BuildLayout:
    return BuildLayout(absolute(out_dir))


def out_dir_problems(out: Path) -> list[str]:
    """Why `out` cannot receive a bundle: not a directory, or holding what no bundle build writes (the build
    swaps out its apt/ and wheels/, so a wrong -o must not be someone's home directory)."""
    if not out.exists():
        return []
    if not out.is_dir() or out.is_symlink():
        return [f"{out}: not a directory"]
    foreign = sorted(path.name for path in out.iterdir() if path.name not in BUNDLE_NAMES)
    if foreign:
        return [
            f"{out}: holds {', '.join(foreign)}, which a bundle build never writes: give an empty directory or an "
            "earlier bundle"
        ]
    return []


@contextmanager
def build_lock(layout: BuildLayout) -> Iterator[None]:
    """One build per OUT at a time: two would swap each other's directories."""
    layout.partial.mkdir(parents=True, exist_ok=True)
    with layout.lock.open("w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BuildError(f"{layout.out}: another build is running into it ({layout.lock} is locked)") from None
        yield


def tidy_staging(staging: Path, with_checkpoint: bool) -> None:
    """Leave in the staging area only the .debs and .whls an interrupted run put there, and its hf/ when the
    bundle carries the checkpoint (the checkpoint step tidies it itself: its partial downloads are what an
    interrupted run resumes from): a half-written temporary file, a stale index or an old manifest would
    otherwise end up in the new manifest."""
    staging.mkdir(parents=True, exist_ok=True)
    wanted = set(BUNDLE_DIRS) if with_checkpoint else set(BUNDLE_DIRS) - {HF_DIR}
    for path in staging.iterdir():
        if path.name not in wanted or not path.is_dir() or path.is_symlink():
            _remove(path)
    for name, pattern in REUSABLE.items():
        directory = staging / name
        directory.mkdir(exist_ok=True)
        for path in directory.iterdir():
            if not (path.match(pattern) and path.is_file() and not path.is_symlink()):
                _remove(path)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def seed_staging(staging: Path, earlier: Sequence[Path]) -> int:
    """Link (or copy) into the staging area every .deb and .whl the earlier bundles hold that it lacks by name;
    returns how many. The steps then reuse those whose sha256 the sources publish and drop the rest."""
    seeded = 0
    for name, pattern in REUSABLE.items():
        target_dir = staging / name
        target_dir.mkdir(parents=True, exist_ok=True)
        for bundle in earlier:
            for path in sorted((Path(bundle) / name).glob(pattern)):
                target = target_dir / path.name
                if path.is_file() and not path.is_symlink() and not target.exists():
                    link_or_copy(path, target)
                    seeded += 1
    return seeded


def _move(source: Path, target: Path) -> None:
    """A rename; a move (copy, then remove) where OUT is another file system than the partial area."""
    try:
        source.replace(target)
    except OSError as error:
        if error.errno != errno.EXDEV:
            raise
        shutil.move(str(source), str(target))


def commit(layout: BuildLayout) -> None:
    """Put the staged bundle in OUT: the old manifest out first, the directories swapped, the signature in, the
    manifest last (see the module's docstring)."""
    out, staging = layout.out, layout.staging
    out.mkdir(parents=True, exist_ok=True)
    # From here until the last rename OUT has no manifest: it reads as incomplete, never as the wrong bundle.
    (out / MANIFEST_NAME).unlink(missing_ok=True)
    (out / SIGNATURE_NAME).unlink(missing_ok=True)
    shutil.rmtree(layout.replaced, ignore_errors=True)
    layout.replaced.mkdir(parents=True)
    for name in BUNDLE_DIRS:
        if (out / name).exists():
            _move(out / name, layout.replaced / name)
        # hf/ is staged only for a bundle with the checkpoint: without it, OUT's old hf/ goes with the rest.
        if (staging / name).exists():
            _move(staging / name, out / name)
    _move(staging / SIGNATURE_NAME, out / SIGNATURE_NAME)
    _move(staging / MANIFEST_NAME, out / MANIFEST_NAME)
    _fsync_directory(out)


def _fsync_directory(directory: Path) -> None:
    # The renames themselves reach the disk, so a power cut cannot bring back the old manifest over new files.
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


# ------------------------------------------------------------------------------------------ signing


def sign_manifest(directory: Path, key: SigningKey) -> Path:
    """MANIFEST_NAME's detached, armored signature (SHA512, whatever the home's gpg.conf prefers)."""
    signature = Path(directory) / SIGNATURE_NAME
    signature.unlink(missing_ok=True)
    what = f"gpg signing {MANIFEST_NAME} with {key.key_id} from {key.gnupg_home}"
    options = ["--yes", "--local-user", key.key_id, "--digest-algo", "SHA512", "--armor", "--detach-sign"]
    command = gpg_command(key, *options, "--output", str(signature), str(Path(directory) / MANIFEST_NAME))
    require_success(run_tool(command, what), what)
    return signature


def run_gpgv(argv: list[str]) -> tuple[int, str, str]:
    """kimi_bundle_signature's runner: gpgv through run_tool (a missing gpgv names its Debian package)."""
    result = run_tool(argv, "gpgv (checking the manifest's signature)")
    return result.returncode, result.stdout, result.stderr


# ----------------------------------------------------------------------------------------- the build


@dataclass(frozen=True)
class HubSource:
    """Where the checkpoint comes from: the Hub or a mirror answering like it (HF_ENDPOINT), and the token for
    a gated or private repository (sent to that origin only; never printed)."""

    endpoint: str
    token: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class BuildSources:
    """Where the debs, the wheels and the checkpoint come from (hub: needed only when the inventory has the
    bundle carry the checkpoint), and the advisory snapshot the bundle carries (none: it carries none)."""

    apt: tuple[AptSource, ...]
    pip: PipSources
    hub: HubSource | None = None
    advisories: Path | None = None


@dataclass(frozen=True)
class StepReport:
    """One step's files: the closure, how many fetched from the sources and reused from an earlier bundle or an
    interrupted run (with their bytes), how many of the earlier bundle's it dropped, and its time."""

    step: str
    unit: str
    files: int
    fetched: int
    fetched_bytes: int
    reused: int
    reused_bytes: int
    dropped: int
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "fetched": self.fetched,
            "fetched_bytes": self.fetched_bytes,
            "reused": self.reused,
            "reused_bytes": self.reused_bytes,
            "dropped": self.dropped,
            "seconds": round(self.seconds, 2),
        }


def _step_report(step: str, unit: str, files: int, built: AptBuild | WheelBuild, seconds: float) -> StepReport:
    fetch = built.fetch
    return StepReport(
        step,
        unit,
        files,
        len(fetch.fetched),
        fetch.fetched_bytes,
        len(fetch.reused),
        fetch.reused_bytes,
        len(built.dropped),
        seconds,
    )


def apt_report(built: AptBuild, seconds: float) -> StepReport:
    return _step_report(APT_DIR, "debs", len(built.fetch.downloads), built, seconds)


def wheels_report(built: WheelBuild, seconds: float) -> StepReport:
    return _step_report(WHEELS_DIR, "wheels", len(built.fetch.wheels), built, seconds)


def hf_report(fetched: CheckpointFetch, seconds: float) -> StepReport:
    """The checkpoint's files (the two API answers not counted); reused: kept or linked from a local copy."""
    downloaded = [item for item in fetched.files if item.how == FETCHED]
    return StepReport(
        HF_DIR,
        "checkpoint files",
        len(fetched.files),
        len(downloaded),
        fetched.fetched_bytes,
        len(fetched.files) - len(downloaded),
        fetched.reused_bytes,
        len(fetched.removed),
        seconds,
    )


@dataclass(frozen=True)
class BuildSummary:
    """What build() made: the bundle, its totals, each step's figures, the signing key's fingerprint (what
    receivers pin) and the time of every phase in seconds (seed, apt, wheels, manifest, commit, total)."""

    bundle: str
    inventory: str
    fingerprint: str
    files: int
    bytes: int
    steps: tuple[StepReport, ...]
    seconds: Mapping[str, float]
    seeded: int = 0
    warnings: tuple[str, ...] = ()

    @property
    def fetched(self) -> int:
        return sum(step.fetched for step in self.steps)

    @property
    def fetched_bytes(self) -> int:
        return sum(step.fetched_bytes for step in self.steps)

    @property
    def reused(self) -> int:
        return sum(step.reused for step in self.steps)

    @property
    def reused_bytes(self) -> int:
        return sum(step.reused_bytes for step in self.steps)

    def to_dict(self) -> dict[str, Any]:
        return {
            "bundle": self.bundle,
            "inventory": self.inventory,
            "fingerprint": self.fingerprint,
            "files": self.files,
            "bytes": self.bytes,
            "fetched": self.fetched,
            "fetched_bytes": self.fetched_bytes,
            "reused": self.reused,
            "reused_bytes": self.reused_bytes,
            "steps": {step.step: step.to_dict() for step in self.steps},
            "seconds": {name: round(value, 2) for name, value in self.seconds.items()},
            "warnings": list(self.warnings),
        }


class _Clock:
    """Seconds per phase, in the order they ran."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.seconds: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.seconds[name] = time.monotonic() - started

    def totals(self) -> dict[str, float]:
        return {**self.seconds, "total": time.monotonic() - self.started}


def write_signed_manifest(
    staging: Path,
    inputs: BuildInputs,
    key: SigningKey,
    created_at: datetime,
    known: Sequence[Mapping[str, Any]] = (),
) -> dict:
    """The manifest of the staged tree, signed, and the signature checked against the staged keyring, as a
    receiver checks it (it proves the keyring nodes will trust holds the key that signed). `known`: entries a
    step already hashed (the checkpoint's), taken as they are when the file's size still matches."""
    (staging / MANIFEST_NAME).unlink(missing_ok=True)
    (staging / SIGNATURE_NAME).unlink(missing_ok=True)
    entries = manifest_entries(staging, {entry["path"]: entry for entry in known})
    document = manifest_document(inputs, entries, created_at)
    write_atomic(staging / MANIFEST_NAME, manifest_text(document))
    signature = sign_manifest(staging, key)
    manifest = (staging / MANIFEST_NAME).read_bytes()
    try:
        verify_signature(manifest, signature.read_bytes(), default_keyring(staging), key.key_id, run_gpgv, GPGV)
    except BundleError as error:
        raise BuildError(f"the new bundle's own signature does not check: {error}") from None
    return document


StepCallback = Callable[[StepReport], None]


def build(
    inputs: BuildInputs,
    sources: BuildSources,
    out_dir: Path,
    gnupg_home: Path,
    reuse_from: Sequence[Path] = (),
    tool: PipTool | None = None,
    on_step: StepCallback | None = None,
    created_at: datetime | None = None,
) -> BuildSummary:
    """Build the bundle for `inputs` into `out_dir` (see the module's docstring); `on_step` hears of each step as
    it ends (progress lines; a test's interruption). BundleInputError for inputs this builder does not take,
    BuildError for OUT, AptBundleError or WheelBundleError (naming the package, source or file) for a step."""
    layout = layout_for(out_dir)
    problems = (
        hub_problems(inputs, sources)
        + out_dir_problems(layout.out)
        + [
            f"{path}: not a directory (--reuse-from takes an earlier bundle)"
            for path in reuse_from
            if not path.is_dir()
        ]
    )
    if problems:
        raise BuildError("; ".join(problems))
    clock = _Clock()
    with build_lock(layout):
        key = build_dir_signing_key(Path(gnupg_home))
        try:
            return _build_locked(inputs, sources, layout, key, reuse_from, tool, on_step, created_at, clock)
        finally:
            stop_gpg_agent(Path(gnupg_home))


def _build_locked(
    inputs: BuildInputs,
    sources: BuildSources,
    layout: BuildLayout,
    key: SigningKey,
    reuse_from: Sequence[Path],
    tool: PipTool | None,
    on_step: StepCallback | None,
    created_at: datetime | None,
    clock: _Clock,
) -> BuildSummary:
    staging, work = layout.staging, layout.work
    with clock.phase("seed"):
        tidy_staging(staging, inputs.checkpoint is not None)
        seeded = seed_staging(staging, [layout.out, *reuse_from])
    steps = []
    with clock.phase(APT_DIR):
        apt = build_apt_repository(inputs, sources.apt, staging, work, key)
    steps.append(apt_report(apt, clock.seconds[APT_DIR]))
    _tell(on_step, steps[-1])
    with clock.phase(WHEELS_DIR):
        wheels = build_wheelhouse(inputs, sources.pip, staging, work, hf_version=inputs.hf_version, tool=tool)
    steps.append(wheels_report(wheels, clock.seconds[WHEELS_DIR]))
    _tell(on_step, steps[-1])
    known: list[dict[str, Any]] = []
    # build() refused a checkpoint without its source before anything ran (hub_problems).
    if inputs.checkpoint is not None and sources.hub is not None:
        with clock.phase(HF_DIR):
            fetched = fetch_staged_checkpoint(inputs.checkpoint, sources.hub, layout, reuse_from)
        known = fetched.manifest_entries(HF_DIR)
        steps.append(hf_report(fetched, clock.seconds[HF_DIR]))
        _tell(on_step, steps[-1])
    stage_advisories(staging, sources.advisories)
    with clock.phase("manifest"):
        document = write_signed_manifest(staging, inputs, key, created_at or datetime.now(UTC), known)
    with clock.phase("commit"):
        commit(layout)
        shutil.rmtree(layout.partial)
    totals = document["totals"]
    return BuildSummary(
        bundle=str(layout.out),
        inventory=inputs.inventory_name,
        fingerprint=key.key_id,
        files=totals["files"],
        bytes=totals["bytes"],
        steps=tuple(steps),
        seconds=clock.totals(),
        seeded=seeded,
        warnings=wheels.warnings,
    )


def stage_advisories(staging: Path, snapshot: Path | None) -> None:
    """The advisory snapshot into the staging area's advisories/ (replacing an interrupted run's), after it parses:
    a bundle must not carry data the input check would refuse. None stages nothing (the commit then drops OUT's
    old advisories/ with the rest of the old bundle)."""
    target = staging / ADVISORIES_DIR
    shutil.rmtree(target, ignore_errors=True)
    if snapshot is None:
        return
    try:
        load_advisories(snapshot)
    except AdvisoryDataError as error:
        raise BuildError(f"the advisory snapshot cannot go into the bundle: {error}") from None
    target.mkdir(parents=True)
    shutil.copyfile(snapshot, target / ADVISORIES_NAME)


def hub_problems(inputs: BuildInputs, sources: BuildSources) -> list[str]:
    """A bundle with the checkpoint needs its source, known before anything is fetched."""
    if inputs.checkpoint is None or sources.hub is not None:
        return []
    return [
        f"{WITH_CHECKPOINT} is true: give the Hub (or a mirror of it) the checkpoint {inputs.checkpoint.repo_id} "
        "comes from (--hf-endpoint)"
    ]


def fetch_staged_checkpoint(
    checkpoint: Checkpoint, hub: HubSource, layout: BuildLayout, reuse_from: Sequence[Path]
) -> CheckpointFetch:
    """The inventory's checkpoint into the staging area's hf/, reusing OUT's and the --reuse-from bundles' hf/."""
    reuse = [Path(bundle) / HF_DIR for bundle in (layout.out, *reuse_from) if (Path(bundle) / HF_DIR).is_dir()]
    return fetch_checkpoint(
        hub.endpoint,
        checkpoint.repo_id,
        checkpoint.revision,
        list(checkpoint.include),
        list(checkpoint.exclude),
        layout.staging / HF_DIR,
        reuse,
        hub.token,
    )


def _tell(on_step: StepCallback | None, report: StepReport) -> None:
    if on_step is not None:
        on_step(report)


def signing_fingerprint(gnupg_home: Path) -> str:
    """The fingerprint of the key builds in `gnupg_home` sign with (made there first when there is none)."""
    try:
        return build_dir_signing_key(Path(gnupg_home)).key_id
    finally:
        stop_gpg_agent(Path(gnupg_home))


# ---------------------------------------------------------------------------------------- verification


def content_problems(bundle: Path, document: Mapping[str, Any]) -> list[str]:
    """The bundle's apt index and wheel names against the inputs its own manifest lists (a bundle that lacks
    what it claims to be built for is named per package and variable)."""
    inputs = manifest_inputs(document)
    packages = Path(bundle) / APT_DIR / PACKAGES_NAME
    problems = []
    if packages.is_file():
        problems += apt_index_problems(packages.read_text(errors="replace"), inputs, f"{APT_DIR}/{PACKAGES_NAME}")
    wheels = [entry["path"] for entry in document["files"] if re.fullmatch(rf"{WHEELS_DIR}/[^/]+\.whl", entry["path"])]
    return problems + wheelhouse_problems(wheels, inputs) + checkpoint_problems(bundle, document)


def checkpoint_problems(bundle: Path, document: Mapping[str, Any]) -> list[str]:
    """The checkpoint the manifest's inputs name against the bundle's hf/: the two API answers listed, and every
    file the role's patterns select from the bundled tree listed at the size, and with the sha256 (LFS files),
    the Hub gave. The manifest's sha256 were checked against the files already, so this ties the checkpoint to
    the Hub's own checksums. A bundle built without the checkpoint must hold no hf/."""
    checkpoint = manifest_inputs(document).checkpoint
    listed = {entry["path"]: entry for entry in document["files"]}
    carried = sorted(path for path in listed if path.startswith(f"{HF_DIR}/"))
    if checkpoint is None:
        return [f"{carried[0]}: the bundle was built without the checkpoint ({WITH_CHECKPOINT})"] if carried else []
    what = f"checkpoint {checkpoint.repo_id} at {checkpoint.revision}"
    documents = [f"{HF_DIR}/{path(checkpoint.repo_id, checkpoint.revision)}" for path in (revision_path, tree_path)]
    missing = [path for path in documents if path not in listed]
    if missing:
        return [f"{path}: not in the bundle, which claims the {what}" for path in missing]
    try:
        entries = json.loads((Path(bundle) / documents[1]).read_text())
        files = select_files(files_from_tree(entries), list(checkpoint.include), list(checkpoint.exclude))
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as error:
        return [f"{documents[1]}: not the tree listing of the {what}: {error}"]
    if not files:
        return [f"{documents[1]}: no file of the {what} matches its include/exclude patterns"]
    problems = []
    for repo_file in files:
        path = f"{HF_DIR}/{resolve_path(checkpoint.repo_id, checkpoint.revision, repo_file.path)}"
        entry = listed.get(path)
        if entry is None:
            problems.append(f"{path}: {repo_file.path} of the {what} is not in the bundle")
        elif entry.get("size") != repo_file.size:
            problems.append(f"{path}: {entry.get('size')} bytes, the Hub lists {repo_file.size}")
        elif repo_file.sha256 is not None and entry.get("sha256") != repo_file.sha256:
            problems.append(f"{path}: sha256 {entry.get('sha256')}, the Hub lists {repo_file.sha256}")
    return problems


def verify(
    bundle_dir: Path, fingerprint: str, wanted_inputs: BuildInputs | None = None, checksums: bool = True
) -> list[str]:
    """Every reason not to trust or not to use the bundle, each naming a file or a variable; empty when it is
    complete, unchanged since the key `fingerprint` signed it and, when given, built for `wanted_inputs`.

    The signature and the tree are kimi_bundle_verify's (what the mirror host runs); on top of them, the apt index
    and the wheelhouse against the manifest's own inputs, and those inputs against the inventory's. The fingerprint
    is required: the bundle's own keyring proves nothing about who made it."""
    bundle = Path(bundle_dir)
    try:
        verdict = verify_bundle(bundle, fingerprint, run_gpgv, checksums=checksums, gpgv=GPGV)
    except BundleError as error:
        return [_unusable_line(bundle, error)]
    problems = list(verdict.problems)
    try:
        # The very document whose signature held, read with the checks that need `packaging` (built_for).
        document = read_manifest(json.dumps(verdict.document))
    except ManifestError as error:
        return [*problems, str(error)]
    inputs = manifest_inputs(document)
    if not problems:
        problems += content_problems(bundle, document)
    if wanted_inputs is not None:
        problems += compare_inputs(inputs, wanted_inputs)
    return problems


def _unusable_line(bundle: Path, error: Exception) -> str:
    """The one problem that stops verification (no manifest, no good signature by the key), naming the bundle,
    and an interrupted build beside it when there is one."""
    partial = layout_for(bundle).partial
    hint = f" ({partial} holds an interrupted build: run the build again)" if partial.is_dir() else ""
    return f"{bundle}: {error}{hint}"


@dataclass(frozen=True)
class BundleInfo:
    """A verified bundle at a glance, for a summary line."""

    created_at: str
    inventory: str
    files: int
    bytes: int
    built_for: Mapping[str, Any] = field(default_factory=dict)


def bundle_info(bundle_dir: Path) -> BundleInfo:
    document = read_manifest((Path(bundle_dir) / MANIFEST_NAME).read_text())
    built_for = document["built_for"]
    totals = document["totals"]
    return BundleInfo(
        document["created_at"], built_for["inventory"]["name"], totals["files"], totals["bytes"], built_for
    )
