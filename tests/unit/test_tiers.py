"""The test tiers: every slow test and every Molecule scenario belongs to a tier-2 group, and CI's choice of groups
keeps to its time (changed groups first, then the one that ran longest ago, nothing started after 60 minutes)."""

from __future__ import annotations

import re

import pytest

from tests import tiers
from tests.paths import REPO_ROOT

MARK = re.compile(r"""tier2\(\s*["']([^"']+)["']\s*\)""")


def marked_groups() -> dict[str, set[str]]:
    """Group name -> the test files that mark tests with it."""
    found: dict[str, set[str]] = {}
    for path in (REPO_ROOT / "tests").rglob("test_*.py"):
        if "unit" in path.relative_to(REPO_ROOT / "tests").parts:
            continue
        for name in MARK.findall(path.read_text()):
            found.setdefault(name, set()).add(path.name)
    return found


def test_every_tier2_marker_names_a_group_and_every_pytest_group_has_tests():
    marked = marked_groups()
    assert set(marked) - set(tiers.GROUP_NAMES) == set(), "a tier2 marker names no group of tests/tiers.py"
    pytest_groups = {group.name for group in tiers.GROUPS if group.kind != "molecule"}
    assert pytest_groups - set(marked) == set(), "a tier-2 group selects no test"


def test_every_molecule_scenario_runs_in_a_tier2_group_and_in_make_molecule():
    scenarios = {path.parent.name for path in (REPO_ROOT / "molecule").glob("*/molecule.yml")}
    grouped = {name for group in tiers.GROUPS for name in group.scenarios}
    assert scenarios - grouped == set(), "a Molecule scenario is in no tier-2 group"
    assert grouped - scenarios == set(), "a tier-2 group names a scenario that does not exist"
    makefile = (REPO_ROOT / "Makefile").read_text()
    listed = re.search(r"^MOLECULE_SCENARIOS \?=((?:.*\\\n)*.*)$", makefile, re.MULTILINE).group(1)
    assert set(listed.replace("\\", " ").split()) == scenarios


def test_every_group_watches_paths_that_exist():
    for group in tiers.GROUPS:
        for prefix in group.watched:
            assert list(REPO_ROOT.glob(prefix.rstrip("/") + "*")), f"{group.name}: {prefix} matches nothing"


def group(name: str, *paths: str, estimate_s: int = 600) -> tiers.Group:
    return tiers.Group(name=name, what=name, kind="lab", paths=paths, estimate_s=estimate_s)


A, B, C = group("a", "roles/a/"), group("b", "roles/b/"), group("c", "roles/c/")


def record(**last_runs: str) -> dict:
    return {"full_pass": None, "groups": {name: {"last_run": {"date": date}} for name, date in last_runs.items()}}


def test_changed_groups_come_first_then_the_one_that_ran_longest_ago():
    runs = record(a="2026-12-01T00:00:00Z", b="2026-12-03T00:00:00Z", c="2026-12-02T00:00:00Z")
    assert [g.name for g in tiers.order((A, B, C), runs, ["roles/b/tasks/main.yml"], rotation=0)] == ["b", "a", "c"]
    assert [g.name for g in tiers.order((A, B, C), runs, [], rotation=0)] == ["a", "c", "b"]


def test_groups_that_ran_on_the_same_day_rotate_with_the_commit_count():
    runs = record(a="2026-12-04T18:00:00Z", b="2026-12-04T17:00:00Z", c="2026-12-04T19:00:00Z")
    assert [g.name for g in tiers.order((A, B, C), runs, [], rotation=0)] == ["a", "b", "c"]
    assert [g.name for g in tiers.order((A, B, C), runs, [], rotation=2)] == ["c", "a", "b"]


def test_a_group_that_never_ran_comes_first_and_equals_rotate_with_the_commit_count():
    assert [g.name for g in tiers.order((A, B, C), record(a="2026-12-01T00:00:00Z"), [], 0)] == ["b", "c", "a"]
    assert [g.name for g in tiers.order((A, B, C), record(), [], rotation=1)] == ["b", "c", "a"]
    assert [g.name for g in tiers.order((A, B, C), record(), [], rotation=5)] == ["c", "a", "b"]


def test_an_unknown_last_full_pass_makes_every_group_changed():
    assert tiers.changed_since(None) is None
    assert tiers.changed_since("0" * 40) is None
    runs = record(a="2026-12-01T00:00:00Z", b="2026-12-03T00:00:00Z", c="2026-12-02T00:00:00Z")
    assert [g.name for g in tiers.order((A, B, C), runs, None, rotation=0)] == ["a", "c", "b"]


def test_nothing_starts_after_60_minutes_and_nothing_may_end_after_65():
    runs = {"full_pass": None, "groups": {"a": {"seconds": 600}}}
    assert tiers.fits(A, runs, elapsed_s=30 * 60) == (True, "")
    ok, why = tiers.fits(A, runs, elapsed_s=55 * 60)
    assert not ok and "needs about 12 min" in why
    ok, why = tiers.fits(group("tiny", estimate_s=10), {"groups": {}}, elapsed_s=60 * 60)
    assert not ok and why == "no group starts after 60 minutes of CI time"


def test_a_group_whose_code_did_not_change_must_end_by_45_minutes():
    runs = {"full_pass": None, "groups": {"a": {"seconds": 600}}}
    # 12 minutes with the margin and 1 for the teardown: at 35 minutes a changed group fits (65), the rotation's
    # does not (45); at 32 both do.
    assert tiers.fits(A, runs, elapsed_s=35 * 60, changed=True) == (True, "")
    ok, why = tiers.fits(A, runs, elapsed_s=35 * 60, changed=False)
    assert not ok and "9 min left of the rotation's 45" in why
    assert tiers.fits(A, runs, elapsed_s=32 * 60, changed=False) == (True, "")


def test_a_failed_run_keeps_the_last_passing_time():
    runs = {"full_pass": None, "groups": {"a": {"seconds": 600}}}
    tiers.note_run(runs, "a", 30.0, passed=False, commit="abc", when="2026-12-03T00:00:00Z")
    assert runs["groups"]["a"] == {
        "seconds": 600,
        "last_run": {"commit": "abc", "date": "2026-12-03T00:00:00Z", "passed": False},
    }
    tiers.note_run(runs, "a", 700.4, passed=True, commit="def", when="2026-12-04T00:00:00Z")
    assert runs["groups"]["a"]["seconds"] == 700


def test_an_unknown_group_is_refused_by_name():
    with pytest.raises(SystemExit, match="no tier-2 group 'nope'"):
        tiers.by_name("nope")


def test_a_full_pass_is_every_group_passing_at_one_commit():
    runs = {"full_pass": None, "groups": {}}
    for index, group in enumerate(tiers.GROUPS):
        tiers.note_run(runs, group.name, 60.0, passed=True, commit="abc", when=f"2026-12-03T00:00:{index:02d}Z")
    assert tiers.every_group_passed_at(runs, "abc")
    assert not tiers.every_group_passed_at(runs, "def")
    tiers.note_run(runs, tiers.GROUPS[0].name, 60.0, passed=False, commit="abc", when="2026-12-04T00:00:00Z")
    assert not tiers.every_group_passed_at(runs, "abc")


def test_a_group_passed_earlier_counts_when_nothing_it_depends_on_changed_since():
    runs = {"full_pass": None, "groups": {}}
    for group in tiers.GROUPS:
        tiers.note_run(runs, group.name, 60.0, passed=True, commit="old", when="2026-12-04T00:00:00Z")
    tiers.note_run(runs, "lab-airgap", 60.0, passed=True, commit="new", when="2026-12-04T01:00:00Z")

    def only_the_mirror_role_changed(old: str, new: str) -> list[str]:
        assert (old, new) == ("old", "new")
        return ["roles/offline_mirror/defaults/main.yml", "CONTRIBUTING.md"]

    # local-bundle and molecule-services depend on the offline mirror role too: they must run again at "new".
    assert not tiers.every_group_passed_at(runs, "new", only_the_mirror_role_changed)
    for name in ("local-bundle", "molecule-services"):
        tiers.note_run(runs, name, 60.0, passed=True, commit="new", when="2026-12-04T02:00:00Z")
    assert tiers.every_group_passed_at(runs, "new", only_the_mirror_role_changed)
    assert not tiers.every_group_passed_at(runs, "new", lambda old, new: None)


def test_a_molecule_group_depends_on_its_own_scenarios_only():
    stack, services = tiers.by_name("molecule-stack"), tiers.by_name("molecule-services")
    assert tiers.touches(services, ["molecule/offline_mirror/verify.yml"])
    assert not tiers.touches(stack, ["molecule/offline_mirror/verify.yml"])
    assert tiers.touches(stack, ["molecule/shared/prepare.yml"]) and tiers.touches(services, [".config/molecule/x"])


def test_changed_since_names_committed_modified_and_new_files_whole(monkeypatch):
    answers = {
        ("diff", "--name-only", "abc..HEAD"): "roles/vllm/tasks/main.yml",
        ("diff", "--name-only", "HEAD"): "tests/tiers.py\nroles/router/defaults/main.yml",
        ("ls-files", "--others", "--exclude-standard"): "molecule/new/verify.yml",
    }
    monkeypatch.setattr(tiers, "git", lambda *args: answers[args])
    monkeypatch.setattr(tiers, "_commit_exists", lambda commit: True)
    assert tiers.changed_since("abc") == [
        "molecule/new/verify.yml",
        "roles/router/defaults/main.yml",
        "roles/vllm/tasks/main.yml",
        "tests/tiers.py",
    ]


def test_a_group_watches_the_code_its_roles_and_playbooks_call():
    serve = tiers.by_name("local-serve")
    # The serve golden files hold the planned KV budget: the planner is the kimi role's, which serve.yml runs.
    assert tiers.touches(serve, ["plugins/module_utils/kimi_overhead.py"])
    assert tiers.touches(serve, ["roles/kimi/defaults/main.yml"])
    assert not tiers.touches(serve, ["docs/planner.md"])
    spread = tiers.by_name("lab-checkpoint-spread")
    assert tiers.touches(spread, ["plugins/modules/kimi_checkpoint_verify.py"])
    # site.yml is watched as a file: the router, which only site.yml's converge runs here, is not this group's.
    assert not tiers.touches(spread, ["roles/router/tasks/main.yml"])
    # bin/kimi-bundle imports the pin set's code.
    assert tiers.touches(tiers.by_name("local-bundle"), ["plugins/module_utils/kimi_pinset.py"])
    # Every group runs Ansible with the checkout's configuration.
    assert all(tiers.touches(group, ["ansible.cfg"]) for group in tiers.GROUPS)


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A repository of a playbook, roles, a module, a filter and module_utils, as tiers.py reads one."""
    files = {
        "site.yml": "- ansible.builtin.import_playbook: playbooks/p.yml\n",
        "playbooks/p.yml": "- hosts: all\n  roles:\n    - role: a\n",
        "roles/a/tasks/main.yml": (
            '- name: Call\n  kimi.k2.mod_a:\n    value: "{{ x | kimi.k2.filt }}"\n'
            "- name: Include\n  ansible.builtin.include_role:\n    name: b\n"
        ),
        "roles/b/tasks/main.yml": "- name: Nothing\n  ansible.builtin.debug:\n",
        "roles/c/tasks/main.yml": "- name: Never called\n  kimi.k2.mod_c:\n",
        "plugins/modules/mod_a.py": "from ansible_collections.kimi.k2.plugins.module_utils.util_a import f\n",
        "plugins/modules/mod_c.py": "from ansible_collections.kimi.k2.plugins.module_utils.util_c import f\n",
        "plugins/module_utils/util_a.py": "from .util_b import g\n",
        "plugins/module_utils/util_b.py": "",
        "plugins/module_utils/util_c.py": "",
        "plugins/filter/f.py": 'def filters(self):\n    return {"filt": filt}\n',
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.setattr(tiers, "REPO_ROOT", tmp_path)
    tiers.code_called_by.cache_clear()
    tiers._filter_files.cache_clear()
    yield tmp_path
    tiers.code_called_by.cache_clear()
    tiers._filter_files.cache_clear()


def test_what_a_playbook_calls_is_found_through_roles_modules_filters_and_imports(tree):
    assert tiers.code_called_by(("playbooks/p.yml",)) == (
        "plugins/filter/f.py",
        "plugins/module_utils/util_a.py",
        "plugins/module_utils/util_b.py",
        "plugins/modules/mod_a.py",
        "roles/a/",
        "roles/b/",
    )
    # What the paths already cover is not listed again.
    assert tiers.code_called_by(("playbooks/p.yml", "roles/", "plugins/")) == ()
    # An imported playbook is followed, except from site.yml (every lab test converges it).
    (tree / "playbooks" / "all.yml").write_text("- ansible.builtin.import_playbook: p.yml\n")
    assert "roles/a/" in tiers.code_called_by(("playbooks/all.yml",))
    assert tiers.code_called_by(("site.yml",)) == ()
