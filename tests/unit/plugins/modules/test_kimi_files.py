"""kimi_files as Ansible runs it: a role's directories and files in one module run, each file's bytes compared,
written atomically through its validate command, its owner, group and mode kept, and nothing written in check
mode. A second run with the same input changes nothing (the no-op converge depends on it)."""

from __future__ import annotations

from tests.unit.ansible_adhoc import run_module

MODULE = "kimi.k2.kimi_files"


def leftovers(directory) -> list[str]:
    return [p.name for p in directory.iterdir() if p.name.startswith(".")]


def test_creates_directories_then_writes_files_and_a_second_run_changes_nothing(tmp_path):
    root = tmp_path / "etc" / "kimi"
    args = {
        "directories": [{"path": str(root / "rules"), "mode": "0750"}],
        "files": [
            {"dest": str(root / "rules" / "a.yml"), "content": "groups: []\n", "mode": "0640"},
            {"dest": str(root / "b.env"), "content": "A=1\n"},
        ],
    }
    ok, result = run_module(tmp_path, MODULE, args)
    assert ok, result
    assert result["changed"] is True
    assert result["changed_paths"] == [str(root / "rules"), str(root / "rules" / "a.yml"), str(root / "b.env")]
    assert (root / "rules" / "a.yml").read_text() == "groups: []\n"
    assert oct((root / "rules").stat().st_mode & 0o777) == "0o750"
    assert oct((root / "rules" / "a.yml").stat().st_mode & 0o777) == "0o640"
    assert not leftovers(root / "rules") and not leftovers(root)

    ok, again = run_module(tmp_path, MODULE, args)
    assert ok and again["changed"] is False and again["changed_paths"] == []


def test_only_what_differs_is_written_and_a_mode_alone_is_a_change(tmp_path):
    same, other = tmp_path / "same.conf", tmp_path / "other.conf"
    same.write_text("x\n")
    other.write_text("old\n")
    other.chmod(0o600)
    before = same.stat().st_mtime_ns
    ok, result = run_module(
        tmp_path,
        MODULE,
        {"files": [{"dest": str(same), "content": "x\n"}, {"dest": str(other), "content": "old\n", "mode": "0644"}]},
    )
    assert ok and result["changed_paths"] == [str(other)]
    assert same.stat().st_mtime_ns == before
    assert oct(other.stat().st_mode & 0o777) == "0o644"


def test_check_mode_names_the_changes_and_writes_nothing(tmp_path):
    existing = tmp_path / "unit.service"
    existing.write_text("[Unit]\n")
    args = {
        "directories": [{"path": str(tmp_path / "new")}],
        "files": [
            {"dest": str(existing), "content": "[Unit]\nDescription=x\n"},
            {"dest": str(tmp_path / "new" / "f"), "content": "y\n", "mode": "0644"},
        ],
    }
    ok, result = run_module(tmp_path, MODULE, args, check=True)
    assert ok, result
    assert result["changed"] is True and len(result["changed_paths"]) == 3
    assert existing.read_text() == "[Unit]\n"
    assert not (tmp_path / "new").exists()


def test_a_failing_validate_keeps_the_old_file_and_says_which(tmp_path):
    target = tmp_path / "rules.nft"
    target.write_text("good\n")
    ok, result = run_module(
        tmp_path, MODULE, {"files": [{"dest": str(target), "content": "bad\n", "validate": "grep -q good %s"}]}
    )
    assert not ok
    assert f"validate refused the new {target}" in result["msg"]
    assert target.read_text() == "good\n"
    assert not leftovers(tmp_path)

    ok, result = run_module(
        tmp_path, MODULE, {"files": [{"dest": str(target), "content": "good too\n", "validate": "grep -q good %s"}]}
    )
    assert ok and result["changed"] is True and target.read_text() == "good too\n"


def test_refused_inputs_name_the_path(tmp_path):
    target = str(tmp_path / "f")
    ok, result = run_module(tmp_path, MODULE, {"files": [{"dest": target, "content": "a", "validate": "true"}]})
    assert not ok and "must contain %s" in result["msg"] and target in result["msg"]
    ok, result = run_module(
        tmp_path, MODULE, {"directories": [{"path": target}], "files": [{"dest": target + "/", "content": "a"}]}
    )
    assert not ok and "named more than once" in result["msg"] and target in result["msg"]
    (tmp_path / "f").mkdir()
    ok, result = run_module(tmp_path, MODULE, {"files": [{"dest": target, "content": "a"}]})
    assert not ok and "is a directory" in result["msg"]
    assert list((tmp_path / "f").iterdir()) == []
