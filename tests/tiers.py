"""The two test tiers, and which tier-2 groups a CI run has room for.

Tier 1 is `make test`, the README's test command: every layer CI must always pass, at most 40 minutes on a clean
clone on a 2-core machine. Tier 2 is every slower test, in GROUPS below: each group is one command (a pytest
selection by the `tier2` marker, or Molecule scenarios) that boots what it needs and tears it down. `make
test-all` runs tier 1 and then every group; `.ci/run` runs tier 1 and then the groups that fit in CI's time
(`ci` below): first those whose code changed since the last full pass, then those that ran longest ago.

What ran, and how long each group took, is recorded in RECORD (committed: CI starts from a clean clone, so the
repository is the only memory a CI run has): `make test-all` writes the full pass's commit; any group run through
this file writes the group's duration and commit. CI's own runs are thrown away with its clone, so a CI run cannot
tell which groups the CI before it ran: among groups that ran equally long ago, the commit count picks where to
start, so consecutive submissions start at different groups.

Run: .venv/bin/python tests/tiers.py {list,run GROUP...,all,ci,changed} (see --help)
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

# Run as a script (make, .ci/run) as well as imported by the tests: the repository root must be importable.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.processes import stop_group

REPO_ROOT = Path(__file__).resolve().parent.parent
RECORD = REPO_ROOT / "tests" / "tier2-record.json"
VENV_BIN = REPO_ROOT / ".venv" / "bin"
TIMES_DIR = Path(os.environ.get("KIMI_TEST_TIMES_DIR", REPO_ROOT / "artifacts" / "test-times"))

# CI's limits (issue "Tests that fit"): no group starts after STOP_STARTING_S of CI time, and CI ends by HARD_LIMIT_S
# (its own hard limit is 90 minutes; this keeps it far from it). A group runs only when its recorded time, with
# MARGIN for a slow day, ends before HARD_LIMIT_S less TEARDOWN_S (the trap's lab teardown). A group whose code did
# not change since the last full pass is only there for the rotation: it must end by ROUTINE_END_S, so a submission
# that touches no slow group's code keeps CI at 45 minutes; a change to a group's own code may take CI to 65.
STOP_STARTING_S = 60 * 60
HARD_LIMIT_S = 65 * 60
ROUTINE_END_S = 45 * 60
MARGIN = 1.2
TEARDOWN_S = 60


@dataclass(frozen=True)
class Group:
    """A tier-2 group: one command, the paths whose change makes CI run it, and its time until one is recorded."""

    name: str
    what: str
    kind: str  # "lab", "local" (pytest selections by the tier2 marker) or "molecule" (scenarios)
    paths: tuple[str, ...]
    estimate_s: int
    scenarios: tuple[str, ...] = ()
    # The group leaves the lab in another shape (two replicas behind a router, an air-gapped site): no later group
    # may take it over, so it goes down after the group.
    reshapes_lab: bool = False

    @property
    def watched(self) -> tuple[str, ...]:
        """Its paths (for a Molecule group also its own scenarios' directories and what every scenario shares), and
        the collection code they call (code_called_by)."""
        own = (*self.paths, *ANSIBLE_BASE)
        if self.kind == "molecule":
            own = (*own, *MOLECULE_BASE, *(f"molecule/{scenario}/" for scenario in self.scenarios))
        return (*own, *code_called_by(own))

    def command(self) -> list[str]:
        if self.kind == "molecule":
            return ["make", "--no-print-directory", "molecule", f"MOLECULE_SCENARIOS={' '.join(self.scenarios)}"]
        junit = f"--junitxml={TIMES_DIR / (self.name + '.xml')}"
        pytest = [str(VENV_BIN / "pytest"), "-q", "--durations=0", f"--tier2-group={self.name}", junit]
        if self.kind == "local":
            return [*pytest, "-n", "2", "--dist", "loadfile", "tests/local"]
        return [*pytest, "-m", "lab", "tests/lab"]


# ---------------------------------------------------------------- the code a group's paths call
# A group lists the roles, playbooks and tests it exercises; what those call is found here, not listed by hand (a
# hand list missed the planner that the serve golden files embed, and CI failed on a group no one had run). From a
# role or playbook: the roles it runs (`role:`, include_role/import_role `name:`), the playbooks it imports, the
# modules, action plugins and filters it names as kimi.k2.<name>; from Python (plugins, bin/, contrib/, tests): the
# module_utils and plugin_utils it imports; and so on, transitively. site.yml is watched as a file only: every lab
# test converges it, and expanding it would make every lab group depend on every role.
NOT_EXPANDED = ("site.yml",)
SCANNED_SUFFIXES = {".yml", ".yaml", ".j2", ".py", ""}
COLLECTION_NAME = re.compile(r"\bkimi\.k2\.(\w+)\b")
IMPORTED_UTIL = re.compile(r"kimi\.k2\.plugins\.(module_utils|plugin_utils)\.(\w+)")
RELATIVE_IMPORT = re.compile(r"^from \.(\w+) import", re.MULTILINE)
ROLE_NAME = re.compile(
    r"^\s*-?\s*role:\s*(?:kimi\.k2\.)?(\w+)\s*$"
    r"|(?:include_role|import_role):\s*\n\s+name:\s*(?:kimi\.k2\.)?(\w+)\s*$",
    re.MULTILINE,
)
IMPORTED_PLAYBOOK = re.compile(r"import_playbook:\s*(\S+)\s*$", re.MULTILINE)


def _files_under(prefix: str) -> list[Path]:
    """The files a watched prefix names: a directory's files, a file, or every file whose path starts with it."""
    matches = REPO_ROOT.glob(prefix.rstrip("/") + "*") if not prefix.endswith("/") else [REPO_ROOT / prefix]
    files: list[Path] = []
    for match in matches:
        found = match.rglob("*") if match.is_dir() else [match]
        files.extend(f for f in found if f.is_file() and "__pycache__" not in f.parts and f.suffix in SCANNED_SUFFIXES)
    return files


@functools.cache
def _filter_files() -> dict[str, str]:
    """Filter name -> the plugins/filter file that defines it."""
    defined: dict[str, str] = {}
    for path in sorted((REPO_ROOT / "plugins" / "filter").glob("*.py")):
        for name in re.findall(r"""["'](\w+)["']\s*:""", path.read_text()):
            defined.setdefault(name, f"plugins/filter/{path.name}")
    return defined


def _called(path: Path) -> set[str]:
    """The repository paths one file calls or imports (roles as their directories)."""
    text = path.read_text(errors="replace")
    called: set[str] = set()
    for kind, name in IMPORTED_UTIL.findall(text):
        called.add(f"plugins/{kind}/{name}.py")
    if path.suffix == ".py" and "plugins" in path.relative_to(REPO_ROOT).parts:
        called.update(f"plugins/module_utils/{name}.py" for name in RELATIVE_IMPORT.findall(text))
    if path.suffix in (".yml", ".yaml", ".j2"):
        for name in COLLECTION_NAME.findall(text):
            called.update(f"plugins/{kind}/{name}.py" for kind in ("modules", "action"))
            if name in _filter_files():
                called.add(_filter_files()[name])
        for role, included in ROLE_NAME.findall(text):
            called.add(f"roles/{role or included}/")
        for playbook in IMPORTED_PLAYBOOK.findall(text):
            called.add(str((path.parent / playbook).resolve().relative_to(REPO_ROOT.resolve())))
    return {p for p in called if (REPO_ROOT / p).exists()}


@functools.cache
def code_called_by(paths: tuple[str, ...]) -> tuple[str, ...]:
    """The collection's files and roles that `paths` call, transitively, less those the paths already cover."""
    seen: set[str] = set()
    todo = [p for p in paths if p not in NOT_EXPANDED]
    while todo:
        prefix = todo.pop()
        for file in _files_under(prefix):
            for called in _called(file) - seen:
                seen.add(called)
                todo.append(called)
    return tuple(sorted(p for p in seen if not any(p.startswith(own) for own in paths)))


# Paths every lab group depends on: the lab itself and the converge every lab test starts from.
LAB_BASE = ("lab/", "tests/lab/conftest.py", "tests/ansible_run.py", "tests/lab_api.py", "site.yml")
# The roles and playbooks a serving converge runs (a change there can break any test that starts from it).
SERVING = (
    "roles/kimi/",
    "roles/vllm_serve/",
    "playbooks/serve.yml",
    "plugins/module_utils/kimi_serve.py",
    "plugins/module_utils/kimi_systemd.py",
    # The watchdog imports these beside itself; the serve phase times each start with the last two.
    "plugins/module_utils/kimi_rendezvous.py",
    "plugins/module_utils/kimi_start_phases.py",
    "plugins/modules/kimi_start_phases.py",
    "inventories/lab/",
)

# What every group's Ansible runs read (each group runs ansible-playbook or Molecule from the checkout).
ANSIBLE_BASE = ("ansible.cfg",)

# What every Molecule scenario shares (Group.watched adds each group's own scenario directories).
MOLECULE_BASE = ("molecule/shared/", ".config/molecule/")

GROUPS: tuple[Group, ...] = (
    Group(
        name="lab-lifecycle",
        what="a changed flag restarts the group in order, rank 0 restarted alone, a failing phase, Ray's cluster",
        kind="lab",
        paths=(
            *LAB_BASE,
            *SERVING,
            "roles/ray_cluster/",
            "roles/verify/",
            "plugins/callback/kimi_phase_failures.py",
            "tests/lab/test_site_then_lifecycle.py",
        ),
        estimate_s=14 * 60,
    ),
    Group(
        name="lab-heal",
        what=(
            "power cuts of either rank heal by themselves and the alerts fire and resolve; a paused watchdog; a hung "
            "rank's evidence, collected by playbooks/evidence.yml"
        ),
        kind="lab",
        paths=(
            *LAB_BASE,
            *SERVING,
            "roles/monitoring/",
            "roles/evidence/",
            "playbooks/evidence.yml",
            "plugins/module_utils/kimi_rendezvous.py",
            "plugins/module_utils/kimi_metrics.py",
            "tests/lab/test_site_then_heal.py",
        ),
        estimate_s=13 * 60,
    ),
    Group(
        name="lab-drift",
        what="every drift injected by hand is named with its host, then site.yml repairs it; parity names an interface",
        kind="lab",
        paths=(
            *LAB_BASE,
            "roles/drift/",
            "playbooks/drift.yml",
            "plugins/module_utils/kimi_drift_",
            "plugins/callback/kimi_drift_changes.py",
            "roles/firewall/",
            "tests/lab/test_site_then_drift.py",
        ),
        estimate_s=11 * 60,
    ),
    Group(
        name="lab-front-door",
        what="two replicas behind the router: TLS and keys, the firewall, a hung replica, rollouts under load",
        kind="lab",
        paths=(
            *LAB_BASE,
            *SERVING,
            "roles/router/",
            "roles/firewall/",
            "playbooks/router.yml",
            "playbooks/rolling.yml",
            "plugins/module_utils/kimi_replicas.py",
            "tests/lab/test_front_door.py",
        ),
        estimate_s=20 * 60,
        reshapes_lab=True,
    ),
    Group(
        name="lab-airgap",
        what="the lab converged air-gapped from node1's offline mirror (the signed bundle, checkpoint included)",
        kind="lab",
        paths=(
            *LAB_BASE,
            "roles/offline_mirror/",
            "playbooks/offline_mirror.yml",
            "bin/kimi-bundle",
            "contrib/kimi_tools/",
            "plugins/module_utils/kimi_bundle",
            "inventories/lab-offline/",
            "roles/nvidia_repo/",
            "roles/kimi/tasks/pinned_debs.yml",
            "roles/checkpoint/",
            "tests/lab/test_site_offline.py",
        ),
        estimate_s=16 * 60,
        reshapes_lab=True,
    ),
    Group(
        name="lab-checkpoint-spread",
        what=(
            "four nodes take a generated GiB checkpoint from the mirror once and from each other in rounds; a node "
            "cut off mid-transfer resumes; a file every peer serves corrupt comes from the mirror"
        ),
        kind="lab",
        paths=(
            *LAB_BASE,
            "roles/checkpoint/",
            "playbooks/checkpoint.yml",
            "plugins/module_utils/kimi_checkpoint",
            "plugins/filter/kimi_checkpoint.py",
            "roles/kimi/tasks/pinned_debs.yml",
            "tests/lab_olah.py",
            "tests/lab/test_checkpoint_spread.py",
        ),
        estimate_s=15 * 60,
        reshapes_lab=True,
    ),
    Group(
        name="molecule-stack",
        what="Molecule create, converge, idempotence and verify of the roles that install the stack",
        kind="molecule",
        paths=(
            "roles/preflight/",
            "roles/cuda/",
            "roles/nccl/",
            "roles/nvidia_driver/",
            "roles/nvidia_repo/",
            "roles/kimi/tasks/pinned_debs.yml",
            "roles/vllm/",
            "roles/checkpoint/",
        ),
        estimate_s=8 * 60,
        scenarios=("preflight", "cuda", "nccl", "nvidia_driver", "vllm", "checkpoint"),
    ),
    Group(
        name="molecule-services",
        what="Molecule create, converge, idempotence and verify of the roles that serve, watch and guard",
        kind="molecule",
        paths=(
            "roles/vllm_serve/",
            "roles/monitoring/",
            "roles/router/",
            "roles/offline_mirror/",
            "roles/firewall/",
            "roles/kimi/tasks/pinned_debs.yml",
        ),
        estimate_s=9 * 60,
        scenarios=("vllm_serve", "monitoring", "router", "offline_mirror", "firewall"),
    ),
    Group(
        name="local-serve",
        what="on this host: serve.yml's units for every layout against golden files, the watchdog, nccl_tests",
        kind="local",
        paths=(
            "roles/vllm_serve/",
            "roles/nccl_tests/",
            "roles/ray_cluster/",
            "playbooks/serve.yml",
            "playbooks/nccl_tests.yml",
            "plugins/module_utils/kimi_serve.py",
            "plugins/module_utils/kimi_systemd.py",
            "plugins/module_utils/kimi_rendezvous.py",
            "plugins/module_utils/kimi_nccl_tests_",
            "tests/local/test_serve_render.py",
            "tests/local/test_watchdog_render.py",
            "tests/local/test_nccl_tests_render.py",
            "tests/fixtures/serve/",
            "tests/fixtures/nccl_tests/",
        ),
        estimate_s=10 * 60,
    ),
    Group(
        name="local-bundle",
        what="on this host: the air-gapped bundle built, signed, verified and served, and the mirror's wiring",
        kind="local",
        paths=(
            "bin/kimi-bundle",
            "contrib/kimi_tools/",
            "plugins/module_utils/kimi_bundle",
            "plugins/modules/kimi_bundle",
            "roles/offline_mirror/",
            "playbooks/offline_mirror.yml",
            "playbooks/bundle_inputs.yml",
            "playbooks/vars/",
            "tests/local/test_bundle_",
            "tests/local/test_offline_mirror_",
            "tests/local/test_kimi_bundle_verify_module.py",
            "tests/fixtures/offline_mirror/",
        ),
        estimate_s=8 * 60,
    ),
    Group(
        name="local-slow",
        what="on this host: the vllm role's venvs (the real CPU build too), every checkpoint repair, drift.yml",
        kind="local",
        paths=(
            "roles/vllm/",
            "roles/checkpoint/",
            "roles/drift/",
            "playbooks/drift.yml",
            "plugins/module_utils/kimi_checkpoint",
            "plugins/module_utils/kimi_drift_",
            "plugins/callback/kimi_drift_changes.py",
            "plugins/action/",
            "plugins/module_utils/kimi_pinset.py",
            "plugins/module_utils/kimi_venv_diff.py",
            "tests/local/test_vllm_role.py",
            "tests/local/test_checkpoint_role.py",
            "tests/local/test_drift_playbook.py",
            "tests/local/test_drift_callback.py",
            "tests/fixtures/drift/",
        ),
        estimate_s=14 * 60,
    ),
)
GROUP_NAMES = tuple(group.name for group in GROUPS)


def by_name(name: str) -> Group:
    for group in GROUPS:
        if group.name == name:
            return group
    raise SystemExit(f"tests/tiers.py: no tier-2 group {name!r} (groups: {', '.join(GROUP_NAMES)})")


# ---------------------------------------------------------------- the record


def load_record(path: Path = RECORD) -> dict:
    if not path.is_file():
        return {"full_pass": None, "groups": {}}
    record = json.loads(path.read_text())
    record.setdefault("full_pass", None)
    record.setdefault("groups", {})
    return record


def save_record(record: dict, path: Path = RECORD) -> None:
    path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else ""


def now_utc() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def note_run(record: dict, name: str, seconds: float, passed: bool, commit: str, when: str) -> None:
    """A group's last run; a passing run's time is the one fits() plans with (a failure may have stopped early)."""
    entry = record["groups"].setdefault(name, {})
    entry["last_run"] = {"commit": commit, "date": when, "passed": passed}
    if passed:
        entry["seconds"] = round(seconds)


def every_group_passed_at(
    record: dict, commit: str, changed_between: Callable[[str, str], list[str] | None] | None = None
) -> bool:
    """Every group's last run passed at this commit, or at an earlier one from which nothing the group depends on
    (its paths) changed up to this commit: make test-all, or groups run one by one and a failed one run again after
    a fix to its own code. `changed_between(old, new)` lists the paths changed (None: unknown, not a pass)."""
    if not commit:
        return False
    changed_between = changed_between or _paths_changed_between
    for group in GROUPS:
        run = record["groups"].get(group.name, {}).get("last_run") or {}
        if not run.get("passed") or not run.get("commit"):
            return False
        if run["commit"] == commit:
            continue
        changed = changed_between(run["commit"], commit)
        if changed is None or touches(group, changed):
            return False
    return True


def _paths_changed_between(old: str, new: str) -> list[str] | None:
    if not (_commit_exists(old) and _commit_exists(new)):
        return None
    return git("diff", "--name-only", f"{old}..{new}").splitlines()


def recorded_seconds(record: dict, group: Group) -> int:
    return int(record["groups"].get(group.name, {}).get("seconds") or group.estimate_s)


# ---------------------------------------------------------------- choosing what CI runs


def touches(group: Group, changed_paths: Iterable[str]) -> bool:
    return any(path.startswith(prefix) for path in changed_paths for prefix in group.watched)


def is_changed(group: Group, changed_paths: list[str] | None) -> bool:
    """None (the last full pass is unknown here) makes every group changed."""
    return changed_paths is None or touches(group, changed_paths)


def changed_since(commit: str | None) -> list[str] | None:
    """Paths changed since `commit`, uncommitted changes included; None when the commit is unknown here (then
    every group counts as changed)."""
    committed = _paths_changed_between(commit, "HEAD") if commit else None
    if committed is None:
        return None
    # Not `git status --porcelain`: git() strips its output, and with it the first line's leading status column.
    uncommitted = (
        git("diff", "--name-only", "HEAD").splitlines() + git("ls-files", "--others", "--exclude-standard").splitlines()
    )
    return sorted(set(committed) | set(uncommitted))


def _commit_exists(commit: str) -> bool:
    done = subprocess.run(
        ["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=REPO_ROOT, capture_output=True, check=False
    )
    return done.returncode == 0


def order(groups: Sequence[Group], record: dict, changed_paths: list[str] | None, rotation: int) -> list[Group]:
    """Changed groups first, then the rest; within each, the one that ran longest ago first (never run: first of
    all), by the day it ran, and among equals the commit count's rotation. The day, not the second: a full pass
    runs its groups over a few hours, and CI never writes the record back, so finer times would put the same groups
    first in every CI until the next full pass."""
    count = len(groups)

    def key(item: tuple[int, Group]) -> tuple[bool, str, int]:
        index, group = item
        changed = is_changed(group, changed_paths)
        last = record["groups"].get(group.name, {}).get("last_run") or {}
        return (not changed, last.get("date", "")[:10], (index - rotation) % count)

    return [group for _, group in sorted(enumerate(groups), key=key)]


def end_by(changed: bool) -> int:
    """The CI second a group must end by: a changed group's own tests may use CI's whole room, the rotation not."""
    return HARD_LIMIT_S - TEARDOWN_S if changed else ROUTINE_END_S - TEARDOWN_S


def fits(group: Group, record: dict, elapsed_s: float, *, changed: bool = True) -> tuple[bool, str]:
    """Whether a group may start at `elapsed_s` of CI time, and why not."""
    if elapsed_s >= STOP_STARTING_S:
        return False, f"no group starts after {STOP_STARTING_S // 60} minutes of CI time"
    needed = recorded_seconds(record, group) * MARGIN
    left = end_by(changed) - elapsed_s
    if needed > left:
        room = "" if changed else f" of the rotation's {ROUTINE_END_S // 60} (its code did not change)"
        return False, f"needs about {needed / 60:.0f} min (recorded time x {MARGIN}), {left / 60:.0f} min left{room}"
    return True, ""


# ---------------------------------------------------------------- running groups


@dataclass
class Outcome:
    group: Group
    seconds: float
    status: str  # "passed", "failed", "cut for time"


def lab_down() -> bool:
    """`lab/lab down`: True when nothing was left behind (it fails naming any leftover)."""
    return subprocess.run([sys.executable, str(REPO_ROOT / "lab" / "lab"), "down"], cwd=REPO_ROOT).returncode == 0


def run_group(group: Group, deadline_s: float | None = None) -> Outcome:
    """Run one group; with a deadline (seconds from now), stop it there (its process group) and say so.

    Lab groups take over the lab an earlier session left converged (KIMI_LAB_KEEP=1: a converge that changes
    nothing instead of a fresh one) and leave theirs up for the next; the others start without a lab."""
    print(f"== tier 2: {group.name} ({group.what})", flush=True)
    started = time.monotonic()
    if group.kind != "lab":
        lab_down()
    env = {**os.environ, "KIMI_LAB_KEEP": "1" if group.kind == "lab" else "0"}
    with subprocess.Popen(group.command(), cwd=REPO_ROOT, env=env, start_new_session=True) as process:
        try:
            rc = process.wait(timeout=deadline_s)
            status = "passed" if rc == 0 else "failed"
        except subprocess.TimeoutExpired:
            stop_group(process, grace_s=60)
            status = "cut for time"
    if group.reshapes_lab or status != "passed":
        lab_down()
    seconds = time.monotonic() - started
    print(f"== tier 2: {group.name} {status} in {seconds:.0f} s", flush=True)
    return Outcome(group, seconds, status)


def record_outcomes(outcomes: Sequence[Outcome], *, full_pass: bool = False) -> None:
    record = load_record()
    commit, when = git("rev-parse", "HEAD"), now_utc()
    for outcome in outcomes:
        if outcome.status != "cut for time":
            note_run(record, outcome.group.name, outcome.seconds, outcome.status == "passed", commit, when)
    if full_pass or every_group_passed_at(record, commit):
        record["full_pass"] = {"commit": commit, "date": when}
    save_record(record)
    with (TIMES_DIR / "layers.tsv").open("a") as layers:
        for outcome in outcomes:
            layers.write(f"tier2:{outcome.group.name} {outcome.seconds:.0f}\n")


def summary(outcomes: Sequence[Outcome], skipped: Sequence[tuple[Group, str]]) -> int:
    """Print what ran and what did not; take the lab down (a leftover fails the run, as it fails a session)."""
    clean = lab_down()
    for outcome in outcomes:
        print(f"  {outcome.status:<12} {outcome.group.name:<18} {outcome.seconds:5.0f} s")
    for group, why in skipped:
        print(f"  {'skipped':<12} {group.name:<18} {why}")
    failed = [outcome.group.name for outcome in outcomes if outcome.status == "failed"]
    if failed:
        print(f"tier 2 failed: {', '.join(failed)}", file=sys.stderr)
    if not clean:
        print("tier 2: lab/lab down left something behind (see above)", file=sys.stderr)
    return 1 if failed or not clean else 0


def run_ci(started_at: float) -> int:
    """After tier 1: the groups that fit, in order(); every group not run is printed with the reason."""
    record = load_record()
    full_pass = record["full_pass"] or {}
    changed = changed_since(full_pass.get("commit"))
    rotation = int(git("rev-list", "--count", "HEAD") or 0)
    outcomes: list[Outcome] = []
    skipped: list[tuple[Group, str]] = []
    print(f"== tier 2 in CI: last full pass {full_pass.get('commit', 'never')[:12]} ({full_pass.get('date', '-')})")
    for group in order(GROUPS, record, changed, rotation):
        elapsed = time.time() - started_at
        group_changed = is_changed(group, changed)
        ok, why = fits(group, record, elapsed, changed=group_changed)
        if not ok:
            skipped.append((group, why))
            continue
        # The rotation's 45 minutes decide what starts; only CI's hard room cuts a group that runs long.
        deadline = HARD_LIMIT_S - TEARDOWN_S - elapsed
        outcomes.append(run_group(group, deadline))
    record_outcomes(outcomes)
    print(f"== tier 2 in CI after {(time.time() - started_at) / 60:.1f} min of CI time:")
    return summary(outcomes, skipped)


def run_all() -> int:
    outcomes = [run_group(group) for group in GROUPS]
    every_one_passed = all(outcome.status == "passed" for outcome in outcomes)
    record_outcomes(outcomes, full_pass=every_one_passed)
    print("== tier 2, every group:")
    return summary(outcomes, [])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    sub.add_parser("list", help="every group, its command and its recorded time")
    run = sub.add_parser("run", help="run the named groups and record their times")
    run.add_argument("groups", nargs="+", choices=GROUP_NAMES)
    sub.add_parser("all", help="every group (make test-all); a full pass is recorded")
    ci = sub.add_parser("ci", help="the groups that fit after tier 1 (.ci/run)")
    ci.add_argument("--started-at", type=float, required=True, help="when CI started (seconds since the epoch)")
    sub.add_parser("changed", help="the groups a change since the last full pass touches, in CI's order")
    args = parser.parse_args(argv)
    TIMES_DIR.mkdir(parents=True, exist_ok=True)
    if args.verb == "list":
        record = load_record()
        for group in GROUPS:
            print(f"{group.name:<18} {recorded_seconds(record, group):5d} s  {group.what}")
            print(f"{'':<18} {' '.join(group.command())}")
        return 0
    if args.verb == "changed":
        record = load_record()
        changed = changed_since((record["full_pass"] or {}).get("commit"))
        for group in order(GROUPS, record, changed, int(git("rev-list", "--count", "HEAD") or 0)):
            print(f"{group.name:<18} {'changed' if changed is None or touches(group, changed) else '-'}")
        return 0
    if args.verb == "run":
        outcomes = [run_group(by_name(name)) for name in args.groups]
        record_outcomes(outcomes)
        return summary(outcomes, [])
    if args.verb == "all":
        return run_all()
    return run_ci(args.started_at)


if __name__ == "__main__":
    sys.exit(main())
