"""lab/lab's argument handling: bad input is one line on stderr and exit 2, before anything is touched."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from labctl import cli, system
from labctl.system import LabError

from tests import paths

REPO_ROOT = paths.REPO_ROOT


@pytest.mark.parametrize("text", ["1", "2", "8"])
def test_node_count_accepts_one_to_eight(text):
    assert cli.parse_node_count(text) == int(text)


@pytest.mark.parametrize("text", ["0", "9", "-1", "two", "", "2.5"])
def test_node_count_rejects_everything_else(text):
    with pytest.raises(LabError) as raised:
        cli.parse_node_count(text)
    assert raised.value.exit_code == 2
    assert "1 to 8" in str(raised.value)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["up", "0"], "from 1 to 8, got '0'"),
        (["up", "9"], "from 1 to 8, got '9'"),
        (["up", "2", "--data-size", "lots"], "--data-size"),
        (["up"], "required"),
        (["crash"], "required"),
        (["explode"], "invalid choice"),
        (["build", "everything"], "invalid choice"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, needle, capsys, monkeypatch, tmp_path):
    # Pointed at empty directories, so a bug that did act would touch nothing real.
    monkeypatch.setenv("KIMI_LAB_STATE", str(tmp_path / "state"))
    monkeypatch.setenv("KIMI_LAB_CACHE", str(tmp_path / "cache"))
    try:
        code = cli.main(argv)
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert needle in err
    assert not (tmp_path / "state").exists()
    assert not (tmp_path / "cache").exists()


def test_bad_port_setting_is_one_line(capsys, monkeypatch):
    monkeypatch.setenv("KIMI_LAB_HTTP_PORT", "80800")
    assert cli.main(["status"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "KIMI_LAB_HTTP_PORT" in err


def test_commands_on_a_lab_that_is_not_up_say_so(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("KIMI_LAB_STATE", str(tmp_path / "state"))
    assert cli.main(["ssh", "node1", "true"]) == 2
    assert "not up" in capsys.readouterr().err


def test_missing_programs_are_named(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for program in cli.REQUIRED_PROGRAMS:
        if program != "debootstrap":
            (bin_dir / program).symlink_to("/bin/true")
    assert cli.missing_programs(str(bin_dir)) == ["debootstrap"]
    assert set(cli.missing_programs(str(tmp_path / "empty"))) == set(cli.REQUIRED_PROGRAMS)


def test_status_json_when_down(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("KIMI_LAB_STATE", str(tmp_path / "state"))
    assert cli.main(["status", "--json"]) == 0
    out = capsys.readouterr().out
    assert '"up": false' in out
    assert '"nodes": []' in out


def test_entry_point_runs_with_the_system_python(tmp_path):
    """lab/lab is stdlib-only: it must run outside the dev venv (CI's teardown trap relies on it)."""
    env = {**os.environ, "KIMI_LAB_STATE": str(tmp_path / "state")}
    proc = subprocess.run(
        [sys.executable, "-I", str(REPO_ROOT / "lab" / "lab"), "up", "0"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("lab: node count must be")


def test_a_signal_inside_a_critical_section_is_raised_when_it_ends():
    """SIGTERM must not abandon a half-started child: it is held until the section ends, then unwinds."""
    previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    system.install_signal_handlers()
    reached_end_of_section = False
    try:
        with pytest.raises(SystemExit) as raised, system.critical_section():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            reached_end_of_section = True
        assert raised.value.code == 128 + signal.SIGTERM
        assert reached_end_of_section
        with pytest.raises(SystemExit):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
    finally:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])
