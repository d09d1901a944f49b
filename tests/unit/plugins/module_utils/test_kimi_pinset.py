"""The pin-set resolve: real pip runs recorded against PyPI (replayed here), plus real pip runs on local wheels."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from ansible_collections.kimi.k2.plugins.module_utils import kimi_pinset
from ansible_collections.kimi.k2.plugins.module_utils.kimi_pinset import (
    Cause,
    PipFailure,
    ResolveSettings,
    build_pip_command,
    conflict_chain,
    describe,
    expand_platforms,
    parse_pin,
    parse_pip_failure,
    pins_from_mapping,
    pip_environment,
    pip_preflight,
    resolve_pinset,
    suggest_adjustment,
)

from tests import paths
from tests.pip_commands import requirements_of

REPO = paths.REPO_ROOT
RECORDED = REPO / "tests" / "fixtures" / "stack" / "pip"
SEED_000 = ["vllm==0.23.0", "vllm-flash-attn==2.6.2", "nvidia-nccl-cu13==2.30.4"]


def recorded_output(case: str, run: int) -> str:
    return "\n".join((RECORDED / case / f"run{run}.{part}.txt").read_text() for part in ("stdout", "stderr"))


class Replay:
    """Answers pip commands from a recorded case, and checks each command is the one recorded live."""

    def __init__(self, case: str):
        self.directory = RECORDED / case
        self.runs = json.loads((self.directory / "runs.json").read_text())
        self.commands: list[list[str]] = []

    def __call__(self, command, env, timeout):
        assert env["PIP_CONFIG_FILE"] == os.devnull
        assert not [key for key in env if key.startswith("PIP_") and key != "PIP_CONFIG_FILE"]
        self.commands.append(command)
        wanted = (requirements_of(command), "--no-deps" in command)
        entry = next(r for r in self.runs if (r["requirements"], r["no_deps"]) == wanted)
        report, target = command[command.index("--report") + 1], command[command.index("--target") + 1]
        placeholders = {report: "REPORT", target: "TARGET", command[0]: "PYTHON"}
        assert [placeholders.get(arg, arg) for arg in command] == entry["command"]
        if "report" in entry:
            Path(report).write_text((self.directory / entry["report"]).read_text())
        stdout = (self.directory / entry["stdout"]).read_text()
        stderr = (self.directory / entry["stderr"]).read_text()
        return entry["rc"], stdout, stderr


def recorded_settings(platform_tag: str = "manylinux_2_35_x86_64") -> ResolveSettings:
    # What record.py ran with: PyPI, the machine's CA bundle (a TLS-inspecting proxy), Python 3.12 nodes.
    return ResolveSettings(python_version="3.12", platforms=[platform_tag], cert="/etc/ssl/certs/ca-certificates.crt")


def pins(texts):
    return [parse_pin(text) for text in texts]


# ---------------------------------------------------------------- pins and the command


def test_pins_from_a_group_vars_mapping():
    parsed = pins_from_mapping({"vllm": "0.23.0", "Nvidia_NCCL_cu13": "2.30.4", "torch": ">=2.11"})
    assert [p.text for p in parsed] == ["vllm==0.23.0", "nvidia-nccl-cu13==2.30.4", "torch>=2.11"]
    assert parsed[0].exact_version == "0.23.0"
    assert parsed[2].exact_version is None
    assert parse_pin("fastapi[standard]<0.137,>=0.115.0").text == "fastapi[standard]<0.137,>=0.115.0"
    with pytest.raises(ValueError, match="not a requirement"):
        parse_pin("==1.0")


def test_platforms_expand_to_every_older_tag_the_node_accepts():
    x86 = expand_platforms(["manylinux_2_35_x86_64"])
    assert x86[0] == "manylinux_2_35_x86_64"
    assert "manylinux_2_31_x86_64" in x86  # llguidance 1.7 ships only this one
    assert x86.index("manylinux2014_x86_64") == x86.index("manylinux_2_17_x86_64") + 1
    assert x86[-2:] == ["manylinux_2_5_x86_64", "manylinux1_x86_64"]  # vllm-flash-attn ships manylinux1
    arm = expand_platforms(["manylinux_2_28_aarch64"])
    assert arm[-2:] == ["manylinux_2_17_aarch64", "manylinux2014_aarch64"]
    assert expand_platforms(["musllinux_1_2_x86_64", "manylinux_2_17_x86_64", "manylinux_2_17_x86_64"])[:2] == [
        "musllinux_1_2_x86_64",
        "manylinux_2_17_x86_64",
    ]


def test_the_command_is_an_isolated_dry_run_for_the_target():
    settings = ResolveSettings(python_version="3.12", platforms=["manylinux_2_35_x86_64"], pip_python="/py")
    command = build_pip_command(settings, ["vllm==0.23.0"], "/r.json", "/t")
    assert command[:4] == ["/py", "-m", "pip", "--isolated"]
    for flag in ("--dry-run", "--ignore-installed", "--only-binary=:all:"):
        assert flag in command
    pairs = list(itertools.pairwise(command))
    for pair in [("--report", "/r.json"), ("--python-version", "3.12"), ("--implementation", "cp"), ("--target", "/t")]:
        assert pair in pairs
    assert ("--index-url", "https://pypi.org/simple") in pairs
    assert command[-1] == "vllm==0.23.0"
    offline = ResolveSettings(no_index=True, find_links=["/wheels"], pip_python="/py")
    offline_command = build_pip_command(offline, ["a==1"], "/r", "/t", no_deps=True)
    assert "--index-url" not in offline_command
    assert offline_command[-4:] == ["--find-links", "/wheels", "--no-deps", "a==1"]


def test_environment_drops_every_pip_setting():
    env = pip_environment({"PATH": "/bin", "PIP_FIND_LINKS": "/opt/wheels", "PIP_CERT": "/x", "HOME": "/root"})
    assert env == {"PATH": "/bin", "HOME": "/root", "PIP_CONFIG_FILE": os.devnull}


def test_no_pip_configuration_of_the_machine_reaches_pip(tmp_path):
    """--isolated alone still reads the global pip.conf (this machine's adds torch<=2.14.1); ours reads none."""
    config_dir = tmp_path / "xdg" / "pip"
    config_dir.mkdir(parents=True)
    (config_dir / "pip.conf").write_text("[global]\nconstraint = /leaked/constraints.txt\nfind-links = /leaked\n")
    machine = {**os.environ, "XDG_CONFIG_DIRS": str(tmp_path / "xdg"), "PIP_FIND_LINKS": "/leaked-env"}
    listing = [sys.executable, "-m", "pip", "--isolated", "config", "list"]
    leaky = subprocess.run(listing, env=machine, capture_output=True, text=True, check=True).stdout
    assert "/leaked/constraints.txt" in leaky  # the trap is real
    ours = subprocess.run(listing, env=pip_environment(machine), capture_output=True, text=True, check=True).stdout
    assert ours.strip() == ""


# ---------------------------------------------------------------- reading pip's failures (recorded)


def test_flash_attn_conflict_recorded_from_pypi():
    failure = parse_pip_failure(recorded_output("seed000", 1))
    assert failure.kind == "conflict"
    assert conflict_chain(failure) == [
        "vllm 0.23.0 requires torch==2.11.0",
        "vllm-flash-attn 2.6.2 requires torch==2.4.0",
    ]
    assert "ResolutionImpossible: for help visit" in failure.errors[-1]


def test_nccl_wheel_conflict_recorded_from_pypi():
    failure = parse_pip_failure(recorded_output("seed000", 2))
    assert "; ".join(conflict_chain(failure)) == (
        "vllm 0.23.0 requires torch==2.11.0; torch 2.11.0 requires nvidia-nccl-cu13==2.28.9; "
        "you pinned nvidia-nccl-cu13==2.30.4"
    )
    torch_cause = next(c for c in failure.causes if c.requirer == "torch")
    assert torch_cause.marker == 'platform_system == "Linux"'


def test_pip_26_reports_the_same_conflict_in_its_own_words():
    directory = RECORDED / "pip26-seed000"
    failure = parse_pip_failure((directory / "stdout.txt").read_text() + (directory / "stderr.txt").read_text())
    assert conflict_chain(failure)[-2:] == [
        "torch 2.11.0 requires nvidia-nccl-cu13==2.28.9",
        "you pinned nvidia-nccl-cu13==2.30.4",
    ]
    assert conflict_chain(failure)[0] == "vllm 0.23.0 requires torch==2.11.0"


def test_a_platform_too_old_for_a_dependency_is_named():
    failure = parse_pip_failure(recorded_output("seed000-manylinux_2_28", 1))
    assert failure.kind == "unavailable"
    missing = failure.unavailable[0]
    assert missing["requirement"] == "llguidance<1.8.0,>=1.7.0"
    assert missing["required_by"] == "vllm"
    assert "1.6.1" in missing["versions_seen"]


# ---------------------------------------------------------------- the whole resolve, replayed


def test_the_greennode_set_is_refused_with_the_chain_and_a_verified_suggestion():
    replay = Replay("seed000")
    result = resolve_pinset(pins(SEED_000), recorded_settings(), run=replay)
    assert result["ok"] is False
    assert result["chain"] == "vllm 0.23.0 requires torch==2.11.0; vllm-flash-attn 2.6.2 requires torch==2.4.0"
    assert result["conflicts"][1]["chain"] == (
        "vllm 0.23.0 requires torch==2.11.0; torch 2.11.0 requires nvidia-nccl-cu13==2.28.9; "
        "you pinned nvidia-nccl-cu13==2.30.4"
    )
    suggestion = result["suggestion"]
    assert suggestion["pins"] == ["vllm==0.23.0", "nvidia-nccl-cu13==2.28.9"]
    assert suggestion["verified"] is True
    assert [(a["action"], a["name"]) for a in suggestion["adjustments"]] == [
        ("drop", "vllm-flash-attn"),
        ("set", "nvidia-nccl-cu13"),
    ]
    assert "vllm.vllm_flash_attn" in suggestion["adjustments"][0]["reason"]
    assert suggestion["resolved"]["torch"] == "2.11.0"
    assert len(replay.commands) == 3
    message = describe(result)
    assert "suggested set: vllm==0.23.0 nvidia-nccl-cu13==2.28.9 - resolves (checked with pip)" in message


def test_the_greennode_set_with_platform_tag_2_28_alone_is_too_old_for_vllm_0_23():
    result = resolve_pinset(
        pins(SEED_000), recorded_settings("manylinux_2_28_x86_64"), run=Replay("seed000-manylinux_2_28")
    )
    assert result["ok"] is False
    assert "suggestion" not in result
    assert result["chain"] == ("no wheel of llguidance<1.8.0,>=1.7.0 (required by vllm) for this Python and platform")
    assert "manylinux_2_35_x86_64 for Ubuntu 22.04" in describe(result)


def test_greennode_set_resolves_with_torch_s_nccl():
    result = resolve_pinset(
        pins(["vllm==0.23.0", "nvidia-nccl-cu13==2.28.9"]), recorded_settings(), run=Replay("greennode")
    )
    assert result["ok"] is True
    resolved = result["resolved"]
    assert (resolved["vllm"], resolved["torch"], resolved["nvidia-nccl-cu13"]) == ("0.23.0", "2.11.0", "2.28.9")
    assert "vllm-flash-attn" not in resolved
    assert "torch==2.11.0" in result["constraints"]
    assert len(result["install_plan"]) == 1


def test_nccl_override_is_left_out_of_the_resolve_checked_and_planned_after_torch():
    replay = Replay("nccl-override")
    result = resolve_pinset(
        pins(["vllm==0.23.0", "nvidia-nccl-cu13==2.30.4"]),
        recorded_settings(),
        overrides=pins(["nvidia-nccl-cu13==2.30.4"]),
        run=replay,
    )
    assert result["ok"] is True
    assert result["resolved_pins"] == ["vllm==0.23.0"]
    assert result["excluded_for_override"] == ["nvidia-nccl-cu13==2.30.4"]
    assert result["resolved"]["nvidia-nccl-cu13"] == "2.28.9"  # what torch would bring
    assert result["expected_wheels"]["nvidia-nccl-cu13"] == "2.30.4"  # what the venv ends up with
    assert result["wheel_overrides"] == {"nvidia-nccl-cu13": "2.30.4"}
    override_step = result["install_plan"][1]
    assert override_step["no_deps"] is True
    assert override_step["replaces"] == {"nvidia-nccl-cu13": "2.28.9"}
    assert result["override_check"]["ok"] is True
    assert "--no-deps" in replay.commands[1]


# ---------------------------------------------------------------- suggestion rules on their own


def test_two_pinned_packages_disagreeing_drops_the_one_not_kept():
    failure = PipFailure(
        kind="conflict",
        causes=[
            Cause("torch==2.11.0", requirer="vllm", requirer_version="0.23.0"),
            Cause("torch==2.5.0", requirer="xformers", requirer_version="0.0.28"),
        ],
    )
    current = pins(["vllm==0.23.0", "xformers==0.0.28"])
    adjustment = suggest_adjustment(failure, current)
    assert (adjustment.action, adjustment.name) == ("drop", "xformers")
    assert suggest_adjustment(failure, current, keep=["vllm", "xformers"]) is None


def test_a_range_requirement_drops_the_contradicting_pin():
    failure = PipFailure(
        kind="conflict",
        causes=[Cause("numpy==1.26.4"), Cause("numpy>=2", requirer="vllm", requirer_version="0.23.0")],
    )
    adjustment = suggest_adjustment(failure, pins(["vllm==0.23.0", "numpy==1.26.4"]))
    assert (adjustment.action, adjustment.name, adjustment.after) == ("drop", "numpy", None)


def test_flash_attn_is_only_redundant_with_a_vllm_that_ships_its_own():
    failure = PipFailure(
        kind="conflict",
        causes=[
            Cause("torch==2.1.2", requirer="vllm", requirer_version="0.4.0"),
            Cause("torch==2.4.0", requirer="vllm-flash-attn", requirer_version="2.6.2"),
        ],
    )
    old = suggest_adjustment(failure, pins(["vllm==0.4.0", "vllm-flash-attn==2.6.2"]))
    assert old.reason.startswith("its requirements contradict")  # dropped as the non-kept pin, not as redundant


# ---------------------------------------------------------------- the interpreter that runs pip


def test_preflight_reads_the_real_interpreter():
    version = ".".join(map(str, sys.version_info[:2]))
    same = pip_preflight(ResolveSettings(python_version=version, pip_python=sys.executable))
    assert same["error"] is None
    assert same["python"].startswith(version)
    assert same["warnings"] == []
    other = pip_preflight(ResolveSettings(python_version="3.9", pip_python=sys.executable))
    assert "environment markers are evaluated for" in other["warnings"][0]


def test_preflight_refuses_a_pip_without_report():
    def old_pip(command, env, timeout):
        return 0, '{"python": "3.12.3", "pip": "21.3.1"}\n', ""

    result = pip_preflight(ResolveSettings(python_version="3.12", pip_python="/py"), run=old_pip)
    assert "older than 22.2" in result["error"]


# ---------------------------------------------------------------- real pip on a local wheelhouse


def make_wheel(directory: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    dist_info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": "",
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        + "".join(f"Requires-Dist: {requirement}\n" for requirement in requires),
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: kimi-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{dist_info}/RECORD"] = "".join(f"{path},,\n" for path in files) + f"{dist_info}/RECORD,,\n"
    with zipfile.ZipFile(directory / f"{name}-{version}-py3-none-any.whl", "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)


@pytest.fixture
def wheelhouse(tmp_path):
    house = tmp_path / "wheels"
    house.mkdir()
    make_wheel(house, "engine", "1.0", ("runtime==1.0",))
    make_wheel(house, "runtime", "1.0", ("comm==1.0",))
    make_wheel(house, "comm", "1.0")
    make_wheel(house, "comm", "2.0")
    return house


def offline_settings(house: Path) -> ResolveSettings:
    version = ".".join(map(str, sys.version_info[:2]))
    return ResolveSettings(python_version=version, no_index=True, find_links=[str(house)], pip_python=sys.executable)


def test_real_pip_on_a_wheelhouse_finds_the_chain_and_fixes_it(wheelhouse):
    result = resolve_pinset(pins(["engine==1.0", "comm==2.0"]), offline_settings(wheelhouse), keep=["engine"])
    assert result["ok"] is False
    assert result["chain"] == "engine 1.0 requires runtime==1.0; runtime 1.0 requires comm==1.0; you pinned comm==2.0"
    assert result["suggestion"]["pins"] == ["engine==1.0", "comm==1.0"]
    assert result["suggestion"]["verified"] is True
    assert result["suggestion"]["resolved"] == {"engine": "1.0", "runtime": "1.0", "comm": "1.0"}


def test_real_pip_override_installed_after_the_resolve(wheelhouse):
    result = resolve_pinset(
        pins(["engine==1.0"]), offline_settings(wheelhouse), overrides=pins(["comm==2.0"]), keep=["engine"]
    )
    assert result["ok"] is True
    assert result["expected_wheels"] == {"engine": "1.0", "runtime": "1.0", "comm": "2.0"}
    missing = resolve_pinset(pins(["engine==1.0"]), offline_settings(wheelhouse), overrides=pins(["comm==3.0"]))
    assert missing["ok"] is False
    assert "comm==3.0" in describe(missing)


def run_module(args: dict, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_CALLBACK_RESULT_FORMAT": "json"}
    command = [str(Path(sys.executable).parent / "ansible"), "localhost", "-i", "localhost,", "-c", "local"]
    command += ["-e", f"ansible_python_interpreter={sys.executable}"]
    command += ["-m", "kimi.k2.kimi_pinset", "-a", json.dumps(args)]
    return subprocess.run([*command, *extra], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_module_in_check_mode_refuses_a_conflicting_set_and_accepts_the_fixed_one(wheelhouse):
    version = ".".join(map(str, sys.version_info[:2]))
    args = {"python_version": version, "no_index": True, "find_links": [str(wheelhouse)], "keep": ["engine"]}
    refused = run_module({**args, "pins": {"engine": "1.0", "comm": "2.0"}}, "--check")
    output = refused.stdout + refused.stderr
    assert refused.returncode == 2, output
    assert "engine 1.0 requires runtime==1.0; runtime 1.0 requires comm==1.0; you pinned comm==2.0" in output
    assert "suggested set: engine==1.0 comm==1.0 - resolves (checked with pip)" in output
    accepted = run_module({**args, "pins": {"engine": "1.0", "comm": "1.0"}}, "--check")
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    assert '"comm==1.0"' in accepted.stdout
    assert '"changed": false' in accepted.stdout


# ---------------------------------------------------------------- live against PyPI (opt-in)


@pytest.mark.network
@pytest.mark.skipif(os.environ.get("KIMI_TEST_NETWORK") != "1", reason="set KIMI_TEST_NETWORK=1 to reach PyPI")
def test_live_pypi_greennode_set_resolves():
    cert = os.environ.get("KIMI_TEST_PIP_CERT") or (
        "/etc/ssl/certs/ca-certificates.crt" if Path("/etc/ssl/certs/ca-certificates.crt").exists() else None
    )
    settings = ResolveSettings(python_version="3.12", platforms=["manylinux_2_35_x86_64"], cert=cert)
    result = kimi_pinset.resolve_pinset(pins(["vllm==0.23.0", "nvidia-nccl-cu13==2.28.9"]), settings)
    assert result["ok"] is True, describe(result)
    assert result["resolved"]["torch"] == "2.11.0"


# --- versions and names as pip reads them (packaging) ---------------------------------------------------------


def test_a_release_candidate_comes_before_its_release():
    assert not kimi_pinset.at_least("0.23.0rc1", "0.23.0")
    assert kimi_pinset.at_least("0.23.0", "0.23.0") and kimi_pinset.at_least("0.23.1", "0.23.0")
    assert kimi_pinset.at_least("0.6.0.post1", "0.6") and not kimi_pinset.at_least("0.6.0.dev3", "0.6")
    assert not kimi_pinset.at_least("not-a-version", "0.6")


def test_names_are_normalized_as_pep_503_says():
    assert kimi_pinset.normalize_name("Flash_Attn") == kimi_pinset.normalize_name("flash.attn") == "flash-attn"
