"""Values several roles read are defined once, in the kimi role, and derived everywhere else (issue: a path
copied into six role defaults drifts the day one of them changes)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from ansible_collections.kimi.k2.plugins.module_utils import kimi_inputs as ki
from ansible_collections.kimi.k2.plugins.module_utils.kimi_serve import API_UNIT, HEADLESS_UNIT, PRELOAD_UNIT

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
    assert KIMI_VARS["kimi_vllm_preload_unit"] == PRELOAD_UNIT


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
    "monitoring_data_mountpoint": (
        "the disk alert matches the mount point exactly: where kimi_data_dir is not itself a mount point the site "
        "sets the mount point holding it (docs/monitoring.md#kimidatadiskfilling)"
    ),
    "vllm_serve_gpu_memory_utilization": (
        "the lab's vLLM-CPU needs 0.3 (it reserves 92 % of RAM otherwise) while the planner keeps "
        "kimi_gpu_memory_utilization for its memory model (inventories/lab/group_vars/all/lab.yml)"
    ),
    "vllm_serve_block_size": (
        "the lab gives the planner the block size vLLM-CPU picks itself (kimi_kv_block_size) and vLLM no "
        "--block-size (inventories/lab/group_vars/all/lab.yml)"
    ),
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
    refused = copies_and_owned_names(role_settings(), set(PER_ROLE_OVERRIDES))
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


# ---------------------------------------------------------------- no file reads a retired name
# A retired name (the input check refuses it in an inventory or -e: RETIRED_* in plugins/module_utils/kimi_inputs.py)
# read anywhere would be undefined, or a second name again. Docs mention them only in CHANGELOG.md.
RETIRED_NAMES = {
    *ki.RETIRED_VARIABLES,
    *ki.RETIRED_DERIVED_VARIABLES,
    *ki.RETIRED_PORT_VARIABLES,
    *ki.RETIRED_HOST_LISTS,
}
RETIRED_WORD = re.compile(r"(?<![\w.])(" + "|".join(sorted(RETIRED_NAMES, key=len, reverse=True)) + r")(?!\w)")
SCANNED_SUFFIXES = {".yml", ".yaml", ".j2", ".py", ".cfg", ".ini"}
# The retirement itself: the refusal's own tests, and this file.
RETIREMENT_TESTS = {
    "tests/unit/plugins/module_utils/test_kimi_inputs.py",
    "tests/local/test_inputs.py",
    "tests/unit/roles/test_single_source.py",
}
# A word equal to a retired name that is not the Ansible variable: file -> {name: what it is}.
NOT_THE_VARIABLE = {
    "roles/firewall/templates/kimi.nft.j2": {"monitoring_hosts": "the nft set's name"},
    "tests/unit/plugins/module_utils/test_kimi_nftables.py": {"monitoring_hosts": "the nft set's name"},
    "tests/local/test_firewall_render.py": {
        "monitoring_hosts": "the nft set's name",
        "router_port": "the test's ROUTER_PORT constant, named by every_port()",
    },
    "tests/local/test_vllm_role.py": {"vllm_version": "a key of the record the vllm role writes on the node"},
    "tests/unit/plugins/module_utils/test_kimi_plan_overhead.py": {"vllm_version": "the kimi_plan option"},
    "tests/unit/bin/test_kimi_plan_cli.py": {"vllm_version": "the kimi_plan option"},
    "tests/unit/contrib/test_kimi_plan_check.py": {"vllm_version": "the kimi_plan option, and the version a log shows"},
    "tests/unit/plugins/module_utils/test_kimi_plan_calibration.py": {"vllm_version": "the kimi_plan option"},
    "tests/unit/plugins/module_utils/test_kimi_stack.py": {"nccl_env_file": "kimi_stack_facts' option"},
    "tests/fixtures/stack/facts/regenerate.py": {"nccl_env_file": "kimi_stack_facts' option"},
}
# In a role's tasks and handlers a mapping key is a module option or a key of data a task writes (kimi_plan's
# vllm_version, kimi_node_info's checkpoint_dir, the vllm role's record), never a variable read.
YAML_KEY = re.compile(r"^\s*(?:-\s+)?([A-Za-z_]\w*)\s*:")
# roles/kimi/vars/main.yml hands each retired name to the input check (kimi_input_variables), which refuses it.
HANDED_OVER = re.compile(r"^\s*-\s+(\w+)\s*$")


def retired_scan_files() -> list[Path]:
    root = paths.REPO_ROOT
    found = [root / "site.yml"]
    for top in ("roles", "playbooks", "molecule", "inventories", "lab", "tests"):
        found += [p for p in (root / top).rglob("*") if p.suffix in SCANNED_SUFFIXES and p.is_file()]
    return sorted(p for p in found if str(p.relative_to(root)) not in RETIREMENT_TESTS)


def retired_reads(relative: str, text: str) -> list[str]:
    """`relative:line: name` for each retired name `text` reads."""
    keys_are_options = re.match(r"roles/[^/]+/(tasks|handlers)/", relative) is not None
    allowed = NOT_THE_VARIABLE.get(relative, {})
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        handed = HANDED_OVER.match(line) if relative == "roles/kimi/vars/main.yml" else None
        key = YAML_KEY.match(line) if keys_are_options else None
        for match in RETIRED_WORD.finditer(line):
            name = match.group(1)
            if name in allowed or (handed and handed.group(1) == name):
                continue
            if key and key.group(1) == name and key.start(1) == match.start(1):
                continue
            found.append(f"{relative}:{number}: {name}")
    return found


def test_no_file_reads_a_retired_variable():
    root = paths.REPO_ROOT
    found = [
        hit
        for path in retired_scan_files()
        for hit in retired_reads(str(path.relative_to(root)), path.read_text(errors="replace"))
    ]
    assert not found, (
        f"retired names read (use the successor RETIRED_* in plugins/module_utils/kimi_inputs.py names): {found}"
    )


def test_the_retired_scan_finds_reads_and_only_reads():
    assert retired_reads("inventories/x/group_vars/all/cluster.yml", "checkpoint_revision: abc\n") == [
        "inventories/x/group_vars/all/cluster.yml:1: checkpoint_revision"
    ]
    assert retired_reads("roles/drift/tasks/main.yml", 'x: "{{ parity_deb_pins }}"\n') == [
        "roles/drift/tasks/main.yml:1: parity_deb_pins"
    ]
    # A module option in a task, a record's key, an attribute, a longer name: not the variable.
    assert retired_reads("roles/kimi/tasks/plan.yml", '    vllm_version: "{{ kimi_vllm_version }}"\n') == []
    assert retired_reads("molecule/vllm/verify.yml", "- record.vllm_version == kimi_vllm_version\n") == []
    assert retired_reads("roles/x/defaults/main.yml", 'x: "{{ kimi_checkpoint_dir }}"\n') == []
    # A key outside a role's tasks sets the variable: refused.
    assert retired_reads("molecule/x/group_vars/all.yml", "monitoring_enabled: false\n") == [
        "molecule/x/group_vars/all.yml:1: monitoring_enabled"
    ]
    assert retired_reads("tests/local/test_x.py", '    "checkpoint_dir": str(tmp),\n') == [
        "tests/local/test_x.py:1: checkpoint_dir"
    ]
