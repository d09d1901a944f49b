"""bin/kimi-bundle's contract without apt, pip, gpg or a playbook run: its flags and the one line per problem
they get (naming the flag), how the inventory's values are read back from playbooks/bundle_inputs.yml's file
(and refused by variable), what it prints, and the playbook and role defaults it relies on.

The real command, end to end on the lab's mirrors, runs in tests/local/test_bundle_build.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible_collections.kimi.k2.plugins.module_utils import kimi_bundle_inputs as kbi
from kimi_tools import kimi_bundle_build as kbb
from kimi_tools import kimi_bundle_cli as cli
from kimi_tools.kimi_bundle_apt import AptSource
from kimi_tools.kimi_bundle_cli import FlagError, InventoryError

from tests import paths

REPO_ROOT = paths.REPO_ROOT
KIMI_BUNDLE = REPO_ROOT / "bin" / "kimi-bundle"
PLAYBOOK = yaml.safe_load((REPO_ROOT / "playbooks" / "bundle_inputs.yml").read_text())[0]
# The variables read and each node's values of them, shared by the build's play and the served bundle's check.
INPUT_VARS_FILE = "vars/bundle_inputs.yml"
INPUT_VARS = yaml.safe_load((REPO_ROOT / "playbooks" / INPUT_VARS_FILE).read_text())
MATCH_PLAY = next(
    play
    for play in yaml.safe_load((REPO_ROOT / "playbooks" / "offline_mirror.yml").read_text())
    if play["name"].startswith("Offline mirror | refuse a served bundle")
)
VARIABLES = {
    "kimi_bundle_inventory_name": "site-a",
    "kimi_bundle_distribution": "debian-12",
    "kimi_bundle_codename": "bookworm",
    "kimi_bundle_architecture": "amd64",
    "vllm_python_version": "3.11",
    "vllm_platforms": ["manylinux_2_36_x86_64"],
    "kimi_deb_pins": {"libnccl2": "2.30.7-1+cuda13.3"},
    "firewall_deb_pins": {"bookworm": {"nftables": "1.0.6-2+deb12u2"}},
    "kimi_bundle_apt_packages": ["acl"],
    "kimi_vllm_pip_pins": {"jinja2": "3.1.6"},
    "kimi_vllm_pip_overrides": {},
    "checkpoint_hf_version": "2.4.0",
    "kimi_bundle_checkpoint": False,
}


def build_args(tmp_path: Path, *extra: str) -> list[str]:
    return ["build", "-i", "inventories/site", "-o", str(tmp_path / "out"), *extra]


def parsed(tmp_path: Path, *extra: str):
    return cli.build_arg_parser().parse_args(build_args(tmp_path, *extra))


@pytest.fixture
def wheelhouse(tmp_path: Path) -> Path:
    (tmp_path / "wheels").mkdir()
    return tmp_path / "wheels"


@pytest.fixture
def no_playbook(monkeypatch):
    """Fail if a test's command would read the inventory (it must stop before)."""

    def refuse(*_args, **_kwargs):
        raise AssertionError("the inventory was read")

    monkeypatch.setattr(cli, "inventory_variables", refuse)


@pytest.fixture
def inventory(monkeypatch):
    """The inventory's variables without a playbook run: tests set the values."""
    values = dict(VARIABLES)
    monkeypatch.setattr(cli, "inventory_variables", lambda inventories, repo_root=None: dict(values))
    return values


# ---------------------------------------------------------------------------------------------- flags


def test_an_apt_source_reads_as_a_sources_list_line_without_deb(tmp_path):
    keyring = tmp_path / "debian.gpg"
    assert cli.parse_apt_source("[trusted=yes] file:/srv/lab ./", None) == AptSource(
        "file:/srv/lab", "./", trusted=True
    )
    assert cli.parse_apt_source("https://deb.debian.org/debian bookworm main contrib", keyring) == AptSource(
        "https://deb.debian.org/debian", "bookworm", ("main", "contrib"), signed_by=keyring
    )
    assert cli.parse_apt_source("[ signed-by=/k.gpg ] http://m/debian bookworm main", keyring) == AptSource(
        "http://m/debian", "bookworm", ("main",), signed_by=Path("/k.gpg")
    )


BAD_APT_SOURCES = [
    ("file:/srv/lab ./", None, "'file:/srv/lab ./': unsigned? say [trusted=yes]; signed? give --apt-keyring or"),
    ("[trusted=yes] file:/srv/lab", None, "'[trusted=yes] file:/srv/lab': give URI and SUITE, e.g."),
    ("[trusted=yes file:/srv/lab ./", None, "'[trusted=yes file:/srv/lab ./': the options' '[' has no ']'"),
    ("[arch=amd64] file:/srv/lab ./", None, "'[arch=amd64] file:/srv/lab ./': unknown option arch (trusted=yes,"),
]


@pytest.mark.parametrize(("text", "keyring", "expected"), BAD_APT_SOURCES)
def test_a_bad_apt_source_names_the_flag_and_itself(text, keyring, expected):
    with pytest.raises(FlagError) as caught:
        cli.parse_apt_source(text, keyring)
    ((flag, message),) = caught.value.problems
    assert flag == "--apt-source" and message.startswith(expected)


def test_sources_are_built_from_the_flags_with_local_paths_made_absolute(tmp_path, wheelhouse, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = parsed(tmp_path, "--apt-source", "[trusted=yes] file:/srv/lab ./", "--pip-find-links", "wheels")
    sources = cli.sources_from_args(args)
    assert sources.apt == (AptSource("file:/srv/lab", "./", trusted=True),)
    assert sources.pip.find_links == (str(wheelhouse),) and sources.pip.no_index


def test_a_wheelhouse_over_plain_http_reaches_pip_with_its_trusted_host(tmp_path):
    url = "http://198.18.0.1:8080/wheels/"
    flags = ("--apt-source", "[trusted=yes] file:/srv/lab ./", "--pip-find-links", url)
    trusted = cli.sources_from_args(parsed(tmp_path, *flags, "--pip-trusted-host", "198.18.0.1")).pip
    assert trusted.find_links == (url,) and trusted.options()[-2:] == ["--trusted-host", "198.18.0.1"]
    assert "--trusted-host" not in cli.sources_from_args(parsed(tmp_path, *flags)).pip.options()


FLAGS = ("--apt-source", "[trusted=yes] file:/srv/lab ./", "--pip-find-links", "http://198.18.0.1:8080/wheels/")


def test_the_checkpoints_source_is_the_flag_else_hf_endpoint_else_the_hub_and_the_token_hf_token(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    assert cli.sources_from_args(parsed(tmp_path, *FLAGS)).hub == kbb.HubSource("https://huggingface.co")
    monkeypatch.setenv("HF_ENDPOINT", "http://198.18.0.1:8090/")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    hub = cli.sources_from_args(parsed(tmp_path, *FLAGS)).hub
    assert hub == kbb.HubSource("http://198.18.0.1:8090", "hf_secret")
    hub = cli.sources_from_args(parsed(tmp_path, *FLAGS, "--hf-endpoint", "https://hf.internal")).hub
    assert hub.endpoint == "https://hf.internal" and hub.token == "hf_secret"


@pytest.mark.parametrize("endpoint", ["huggingface.co", "ftp://hf.internal", "http://"])
def test_a_checkpoint_source_that_is_no_http_url_is_named(tmp_path, endpoint):
    with pytest.raises(FlagError) as caught:
        cli.sources_from_args(parsed(tmp_path, *FLAGS, "--hf-endpoint", endpoint))
    assert caught.value.problems == [
        ("--hf-endpoint", f"{endpoint!r} is not an http(s) URL, e.g. https://huggingface.co")
    ]


def test_every_bad_source_flag_is_named_in_one_go(tmp_path):
    args = parsed(
        tmp_path,
        "--apt-source",
        "ftp://old ./",
        "--apt-keyring",
        str(tmp_path / "missing.gpg"),
        "--pip-find-links",
        str(tmp_path / "no-such-dir"),
        "--pip-index-url",
        "/srv/simple",
    )
    with pytest.raises(FlagError) as caught:
        cli.sources_from_args(args)
    flags = [flag for flag, _ in caught.value.problems]
    assert flags == ["--apt-keyring", "--apt-source", "--pip-index-url", "--pip-find-links"]
    assert f"{tmp_path / 'no-such-dir'}: does not answer" in caught.value.problems[-1][1]


def test_no_source_at_all_names_both_kinds(tmp_path):
    with pytest.raises(FlagError) as caught:
        cli.sources_from_args(parsed(tmp_path))
    assert [flag for flag, _ in caught.value.problems] == ["--apt-source", "--pip-find-links"]


def test_bad_flags_exit_2_with_one_line_each_before_the_inventory_is_read(tmp_path, no_playbook, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    status = cli.cli_main(build_args(tmp_path, "--reuse-from", str(tmp_path / "gone")))
    lines = capsys.readouterr().err.splitlines()
    assert status == 2
    assert lines == [
        f"kimi-bundle: error: argument --out: {tmp_path / 'out'}: holds notes.txt, which a bundle build never "
        "writes: give an empty directory or an earlier bundle",
        f"kimi-bundle: error: argument --reuse-from: {tmp_path / 'gone'}: not a directory (give an earlier bundle)",
        lines[2],
        lines[3],
    ]
    assert lines[2].startswith("kimi-bundle: error: argument --apt-source: give at least one repository")
    assert lines[3].startswith("kimi-bundle: error: argument --pip-find-links: give a wheelhouse")


def test_a_missing_required_flag_is_one_usage_line(capsys):
    with pytest.raises(SystemExit) as caught:
        cli.cli_main(["build", "-i", "inventories/lab"])
    assert caught.value.code == 2
    assert capsys.readouterr().err == "kimi-bundle build: error: the following arguments are required: -o/--out\n"


def test_a_fingerprint_that_is_not_one_exits_2_naming_the_flag(tmp_path, no_playbook, capsys):
    assert cli.cli_main(["verify", str(tmp_path), "--fingerprint", "0539E3B4"]) == 2
    assert capsys.readouterr().err.startswith("kimi-bundle: error: argument --fingerprint: '0539E3B4' is not an ")


# ------------------------------------------------------------------------------------ inventory values


def test_bad_inventory_values_exit_2_with_one_line_per_variable(tmp_path, wheelhouse, inventory, capsys):
    inventory.update(kimi_bundle_distribution="", vllm_python_version=3.1)
    extra = ("--apt-source", "[trusted=yes] file:/srv/lab ./", "--pip-find-links", str(wheelhouse))
    assert cli.cli_main(build_args(tmp_path, *extra)) == 2
    assert capsys.readouterr().err.splitlines() == [
        "kimi-bundle: error: kimi_bundle_distribution must be NAME-VERSION, e.g. \"debian-12\" (got '')",
        'kimi-bundle: error: vllm_python_version must be a quoted string such as "3.11" (got the number 3.1)',
    ]
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def test_an_inventory_asking_for_the_checkpoint_at_a_branch_is_refused_by_name(inventory, capsys):
    inventory.update(
        kimi_bundle_checkpoint=True,
        kimi_checkpoint_repo_id="moonshotai/Kimi-K2-Instruct",
        kimi_checkpoint_revision="main",
    )
    assert cli.cli_main(["inputs", "-i", "inventories/site"]) == 2
    expected = "kimi-bundle: error: kimi_checkpoint_revision must be a 40-hex commit (got 'main')\n"
    assert capsys.readouterr().err == expected


def test_inputs_prints_the_resolved_build_inputs_as_json(inventory, capsys):
    assert cli.cli_main(["inputs", "-i", "inventories/site"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == kbi.inputs_from_variables(VARIABLES).to_dict()
    assert printed["apt_pins"] == {"libnccl2": "2.30.7-1+cuda13.3", "nftables": "1.0.6-2+deb12u2"}
    assert printed["hf_version"] == "2.4.0"


def test_the_playbook_command_names_every_inventory_and_the_inputs_file():
    command = cli.playbook_command("/v/ansible-playbook", Path("/repo"), ["inv/a", "inv/b"], Path("/t/in.json"))
    assert command == [
        "/v/ansible-playbook",
        "/repo/playbooks/bundle_inputs.yml",
        "-i",
        "inv/a",
        "-i",
        "inv/b",
        "-e",
        '{"kimi_bundle_inputs_file": "/t/in.json"}',
    ]


def test_the_playbook_runs_with_the_repositorys_ansible_cfg_unless_the_caller_names_one():
    env = cli.playbook_environment(Path("/repo"), {"PATH": "/bin"})
    assert (env["ANSIBLE_CONFIG"], env["ANSIBLE_HOME"]) == ("/repo/ansible.cfg", "/repo/.ansible")
    assert env["ANSIBLE_CALLBACK_RESULT_FORMAT"] == "json" and env["PATH"] == "/bin"
    assert cli.playbook_environment(Path("/repo"), {"ANSIBLE_CONFIG": "/mine.cfg"})["ANSIBLE_CONFIG"] == "/mine.cfg"


def test_a_failed_playbook_is_explained_by_its_tasks_messages():
    output = "\n".join(
        [
            "TASK [Refuse Debian packages the converge installs that kimi_bundle_apt_packages lacks] ***",
            'fatal: [node1 -> localhost]: FAILED! => {"changed": false, "msg": "kimi_bundle_apt_packages lacks g++"}',
            "[ERROR]: Task failed: Conditional result was False",
            "PLAY RECAP ***",
        ]
    )
    assert cli.playbook_failure_lines(output) == [
        "kimi_bundle_apt_packages lacks g++",
        "[ERROR]: Task failed: Conditional result was False",
    ]
    assert cli.playbook_failure_lines("a\nb\nc") == ["a", "b", "c"]


def test_the_inputs_file_is_read_back_or_its_absence_explained(tmp_path):
    with pytest.raises(InventoryError) as caught:
        cli.read_inputs_file(tmp_path / "none.json")
    assert str(caught.value) == "the inventory has no host in kimi_nodes: there is nothing to resolve its variables for"
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(InventoryError, match="not JSON"):
        cli.read_inputs_file(tmp_path / "bad.json")
    (tmp_path / "flat.json").write_text(json.dumps(VARIABLES))
    with pytest.raises(InventoryError, match="expected"):
        cli.read_inputs_file(tmp_path / "flat.json")
    (tmp_path / "good.json").write_text(json.dumps({"hosts": {"node1": VARIABLES}}))
    assert cli.read_inputs_file(tmp_path / "good.json") == {"node1": VARIABLES}


def test_one_value_per_variable_across_the_nodes_or_each_difference_named():
    hosts = {"node1": VARIABLES, "node2": dict(VARIABLES)}
    assert cli.common_variables(hosts) == VARIABLES
    hosts["node3"] = {**VARIABLES, "kimi_vllm_pip_pins": {"jinja2": "3.1.5"}, "vllm_python_version": "3.12"}
    with pytest.raises(kbi.BundleInputError) as caught:
        cli.common_variables(hosts)
    assert [f"{variable} {message}" for variable, message in caught.value.problems] == [
        'kimi_vllm_pip_pins differs between nodes (node1, node2: {"jinja2":"3.1.6"}; node3: {"jinja2":"3.1.5"}): '
        "one bundle serves them all",
        'vllm_python_version differs between nodes (node1, node2: "3.11"; node3: "3.12"): one bundle serves them all',
    ]


def fake_ansible_playbook(hosts: dict | None, returncode: int = 0, output: str = ""):
    """A runner standing in for ansible-playbook: writes the inputs file named in -e, as the playbook does."""
    calls = []

    def run(command, **kwargs):
        calls.append((command, kwargs))
        inputs_file = Path(json.loads(command[command.index("-e") + 1])["kimi_bundle_inputs_file"])
        if hosts is not None:
            inputs_file.write_text(json.dumps({"hosts": hosts}))
        return subprocess.CompletedProcess(command, returncode, output, "")

    return run, calls


def test_inventory_variables_runs_the_playbook_and_reads_its_file(monkeypatch):
    monkeypatch.setattr(cli, "ansible_playbook_program", lambda: "ansible-playbook")
    monkeypatch.delenv("ANSIBLE_CONFIG", raising=False)
    run, calls = fake_ansible_playbook({"node1": VARIABLES})
    assert cli.inventory_variables(["inventories/site"], Path("/repo"), run) == VARIABLES
    ((command, kwargs),) = calls
    assert command[:2] == ["ansible-playbook", "/repo/playbooks/bundle_inputs.yml"]
    assert kwargs["cwd"] == Path("/repo") and kwargs["env"]["ANSIBLE_CONFIG"] == "/repo/ansible.cfg"


def test_a_failed_playbook_run_is_an_inventory_error_with_its_message(monkeypatch):
    monkeypatch.setattr(cli, "ansible_playbook_program", lambda: "ansible-playbook")
    output = 'fatal: [node1 -> localhost]: FAILED! => {"msg": "kimi_bundle_apt_packages lacks g++"}'
    run, _ = fake_ansible_playbook(None, returncode=2, output=output)
    with pytest.raises(InventoryError) as caught:
        cli.inventory_variables(["inventories/site"], Path("/repo"), run)
    assert str(caught.value) == (
        "reading inventories/site with playbooks/bundle_inputs.yml:\nkimi_bundle_apt_packages lacks g++"
    )


def test_a_playbook_that_does_not_finish_is_an_inventory_error(monkeypatch):
    monkeypatch.setattr(cli, "ansible_playbook_program", lambda: "ansible-playbook")

    def hang(command, **kwargs):
        raise subprocess.TimeoutExpired(command, kwargs["timeout"])

    with pytest.raises(InventoryError) as caught:
        cli.inventory_variables(["inventories/site"], Path("/repo"), hang)
    assert str(caught.value) == (
        f"reading inventories/site with playbooks/bundle_inputs.yml: no answer in {cli.PLAYBOOK_TIMEOUT_S} s"
    )


def test_a_failed_build_exits_1_with_its_message_and_the_partial_area_to_resume_from(
    tmp_path, wheelhouse, inventory, monkeypatch, capsys
):
    def fail(inputs, sources, out, gnupg_home, **options):
        Path(f"{out}.partial").mkdir()
        raise kbb.BuildError("apt package libnccl2 2.30.7-1+cuda13.3 (kimi_deb_pins): no apt source has this version")

    monkeypatch.setattr(kbb, "build", fail)
    extra = ("--apt-source", "[trusted=yes] file:/srv/lab ./", "--pip-find-links", str(wheelhouse))
    assert cli.cli_main(build_args(tmp_path, *extra)) == 1
    assert capsys.readouterr().err.splitlines() == [
        "kimi-bundle: error: build failed: apt package libnccl2 2.30.7-1+cuda13.3 (kimi_deb_pins): no apt source has "
        "this version",
        f"kimi-bundle: error: (the partial build in {tmp_path / 'out.partial'} resumes on the next run)",
    ]


# ------------------------------------------------------------------------------------------- printing


@pytest.mark.parametrize(
    ("count", "text"),
    [(0, "0 B"), (999, "999 B"), (1500, "1.50 kB"), (144836864, "144.8 MB"), (1064566028, "1.06 GB")],
)
def test_sizes_are_printed_in_decimal_units(count, text):
    assert cli.format_bytes(count) == text


def test_the_summary_says_what_was_fetched_and_reused_and_the_fingerprint_to_pin():
    steps = (
        kbb.StepReport("apt", "debs", 157, 2, 4096, 155, 144836864, 2, 1.25),
        kbb.StepReport("wheels", "wheels", 152, 0, 0, 152, 917636465, 0, 7.31),
    )
    summary = kbb.BuildSummary(
        "/b", "lab", "F" * 40, 470, 1064566028, steps, {"apt": 1.25, "wheels": 7.31, "total": 9.17}
    )
    assert cli.step_line(steps[0]) == ("apt: 157 debs, fetched 2 (4.10 kB), reused 155 (144.8 MB), dropped 2, 1.2 s")
    assert cli.summary_lines(summary) == [
        "kimi-bundle: built /b for inventory lab: 470 files, 1.06 GB",
        "  fetched 2 files (4.10 kB), reused 307 (1.06 GB) in 9.2 s (apt 1.2 s, wheels 7.3 s)",
        f"  signing key fingerprint: {'F' * 40}",
        f"  receivers check it with: bin/kimi-bundle verify BUNDLE --fingerprint {'F' * 40}",
    ]


def test_bin_kimi_bundle_runs_with_this_python_and_shows_its_commands():
    result = subprocess.run([sys.executable, str(KIMI_BUNDLE), "--help"], capture_output=True, text=True, check=False)
    assert result.returncode == 0
    assert re.search(r"\{build,verify,inputs,fingerprint\}|COMMAND", result.stdout)
    assert KIMI_BUNDLE.stat().st_mode & 0o111


# ------------------------------------------------------------------------------ the playbook and defaults


def test_the_playbook_resolves_exactly_the_variables_kimi_bundle_reads():
    role_pins = re.findall(r"'(\w+_pins)'", INPUT_VARS["kimi_bundle_read_role_pins"])
    read = [*INPUT_VARS["kimi_bundle_read_always"], *role_pins, *INPUT_VARS["kimi_bundle_read_checkpoint"]]
    assert sorted(read) == sorted(kbi.INPUT_VARIABLES) and len(read) == len(set(read))
    assert role_pins == [*kbi.RELEASE_DEB_PINS, *kbi.ROLE_DEB_PINS]


def test_the_build_and_the_served_bundles_check_resolve_the_same_values_the_same_way():
    """One list, one expression: a served bundle is compared with exactly what a build of it would read."""
    for play in (PLAYBOOK, MATCH_PLAY):
        assert play["vars_files"] == [INPUT_VARS_FILE], play["name"]
        # No play variable of either shadows the shared ones.
        assert not set(play.get("vars", {})) & set(INPUT_VARS), play["name"]
        assert play["gather_facts"] is False
        assert [(role["role"], role["when"]) for role in play["roles"]] == [
            (role["role"], False) for role in PLAYBOOK["roles"]
        ]
    (resolve,) = [
        task for task in PLAYBOOK["tasks"] if task["name"] == "Resolve each node's bundle inputs (on the controller)"
    ]
    assert resolve["ansible.builtin.set_fact"] == {"kimi_bundle_resolved": "{{ kimi_bundle_node_inputs }}"}
    (match,) = [task for task in MATCH_PLAY["tasks"] if "kimi.k2.kimi_bundle_match" in task]
    assert match["kimi.k2.kimi_bundle_match"]["variables"] == "{{ kimi_bundle_node_inputs }}"
    assert match["delegate_to"] == "localhost"


def test_the_playbook_contacts_no_node_and_runs_no_role_task():
    assert PLAYBOOK["gather_facts"] is False
    assert all(role["when"] is False for role in PLAYBOOK["roles"])
    assert {role["role"] for role in PLAYBOOK["roles"]} >= {"kimi", "vllm", "checkpoint", "firewall", "monitoring"}
    for task in PLAYBOOK["tasks"]:
        assert task["name"] and task["delegate_to"] == "localhost", task["name"]


def test_the_default_apt_packages_hold_every_package_the_converge_installs_unpinned():
    kimi = yaml.safe_load((REPO_ROOT / "roles/kimi/defaults/main.yml").read_text())
    vllm = yaml.safe_load((REPO_ROOT / "roles/vllm/defaults/main.yml").read_text())
    checkpoint = yaml.safe_load((REPO_ROOT / "roles/checkpoint/defaults/main.yml").read_text())
    installed = {name for names in vllm["vllm_os_packages_by_build"].values() for name in names}
    installed |= set(checkpoint["checkpoint_os_packages"])
    assert installed <= set(kimi["kimi_bundle_apt_packages"])
    assert kimi["kimi_bundle_checkpoint"] is False and kimi["kimi_bundle_architecture"] == "amd64"


@pytest.mark.parametrize(
    ("inventory", "distribution", "codename"),
    [
        ("lab/group_vars/all/lab.yml", "debian-12", "bookworm"),
        ("greennode/group_vars/all/cluster.yml", "ubuntu-24.04", "noble"),
    ],
)
def test_the_shipped_inventories_name_the_release_their_nodes_run(inventory, distribution, codename):
    values = yaml.safe_load((REPO_ROOT / "inventories" / inventory).read_text())
    assert (values["kimi_bundle_distribution"], values["kimi_bundle_codename"]) == (distribution, codename)
    release = {**VARIABLES, "kimi_bundle_distribution": distribution, "kimi_bundle_codename": codename}
    release["firewall_deb_pins"] = {codename: {}}
    assert kbi.inputs_from_variables(release).codename == codename


def test_the_bundle_carries_the_kimi_roles_advisory_snapshot_unless_told_otherwise(tmp_path):
    assert cli.sources_from_args(parsed(tmp_path, *FLAGS)).advisories == cli.DEFAULT_ADVISORIES
    assert cli.DEFAULT_ADVISORIES == REPO_ROOT / "roles" / "kimi" / "files" / "advisories.json"
    own = tmp_path / "advisories.json"
    own.write_text("{}")
    assert cli.sources_from_args(parsed(tmp_path, *FLAGS, "--advisories", str(own))).advisories == own
    with pytest.raises(FlagError) as caught:
        cli.sources_from_args(parsed(tmp_path, *FLAGS, "--advisories", str(tmp_path / "none.json")))
    assert caught.value.problems == [
        ("--advisories", f"{tmp_path / 'none.json'}: not a file (the snapshot bin/kimi-advisories writes)")
    ]
