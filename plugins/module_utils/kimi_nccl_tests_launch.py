"""nccl-tests across the cluster, the launch: the environment every rank gets (the NCCL variables of the nccl
role's EnvironmentFile, INFO logging of INIT and NET, the role's extra variables) and the launcher command,
mpirun (all_reduce_perf, optionally writing its -J JSON file) or torchrun (the role's torch benchmark), from the
inventory.

Pure logic, no Ansible: plugins/modules/kimi_nccl_tests_command.py wraps it (launch_spec, render); the tests call
it directly (tests/unit/plugins/module_utils/test_kimi_nccl_tests.py). Separate from kimi_nccl_tests_verdict
(reading what the run printed and judging it): the two share nothing but the role's variables, the command is
rendered before the run (also in check mode) and the verdict after it, each by its own module.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

LAUNCHERS = ("mpirun", "torchrun")
# Always exported to the ranks: the transport lines the verdict reads are INFO lines of these subsystems.
DEBUG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}

_SIZE = re.compile(r"^[0-9]+[KMGkmg]?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class NcclTestsInputError(ValueError):
    """An input the launcher cannot run with, naming the role variable to fix."""

    def __init__(self, variable: str, message: str) -> None:
        super().__init__(f"{variable}: {message}")
        self.variable = variable


# ------------------------------------------------------------------------------------------ environment


def parse_env_file(text: str) -> dict[str, str]:
    """KEY=VALUE lines of an EnvironmentFile (comments and blank lines skipped, one pair of quotes removed)."""
    found: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")) or "=" not in line:
            continue
        if line.startswith("export "):
            line = line[len("export ") :].lstrip()
        name, value = line.split("=", 1)
        name, value = name.strip(), value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        if _ENV_NAME.match(name):
            found[name] = value
    return found


def launch_env(
    file_env: Mapping[str, str], extra_env: Mapping[str, str] | None = None, prefixes: Sequence[str] = ("NCCL_",)
) -> dict[str, str]:
    """What every rank gets: the NCCL variables of the nccl role's file, then INFO logging of INIT and NET (the
    verdict needs those lines), then the role's extra variables, which win."""
    env = {name: str(value) for name, value in file_env.items() if name.startswith(tuple(prefixes))}
    env.update(DEBUG_ENV)
    env.update({name: str(value) for name, value in (extra_env or {}).items()})
    return dict(sorted(env.items()))


# ------------------------------------------------------------------------------------------ the command


@dataclass(frozen=True)
class LaunchSpec:
    """Everything the launcher argv depends on, as the role's variables give it (names in the comments)."""

    launcher: str  # nccl_tests_launcher: mpirun or torchrun
    hosts_by_rank: Sequence[str]  # kimi role: the kimi_nodes hosts ordered by node rank
    host_addresses: Mapping[str, str]  # per host: kimi_announced_ip (kimi_host_ip or the interface's IPv4)
    gpus_per_node: int  # kimi_gpus_per_node
    binary: str  # all_reduce_perf (mpirun) or the torch benchmark script (torchrun)
    min_bytes: str = "1M"  # nccl_tests_min_bytes (-b)
    max_bytes: str = "4G"  # nccl_tests_max_bytes (-e)
    step_factor: int = 2  # nccl_tests_step_factor (-f)
    gpus_per_process: int = 1  # nccl_tests_gpus_per_process (-g)
    iters: int = 20  # nccl_tests_iters (-n)
    warmup_iters: int = 5  # nccl_tests_warmup_iters (-w)
    check_iters: int = 1  # nccl_tests_check_iters (-c; 0 skips the data check)
    env: Mapping[str, str] = field(default_factory=dict)  # launch_env(): -x for mpirun, the environment for torchrun
    interface: str = ""  # kimi_network_interface: MPI's TCP and out-of-band traffic
    launcher_path: str = ""  # nccl_tests_mpirun / nccl_tests_torchrun; empty: the launcher's name
    launcher_args: Sequence[str] = ()  # nccl_tests_mpirun_args / nccl_tests_torchrun_args, before the binary
    test_args: Sequence[str] = ()  # nccl_tests_extra_test_args, after the sizes
    master_port: int = 29611  # kimi_nccl_tests_master_port (torchrun only)
    allow_run_as_root: bool = False  # mpirun refuses root without --allow-run-as-root
    timeout_s: int = 0  # nccl_tests_timeout: wrap the launcher in timeout(1); 0 runs without a limit
    json_path: str = ""  # nccl_tests_json_path: nccl-tests' -J file on node rank 0 (mpirun only); empty: none

    @property
    def nodes(self) -> int:
        return len(self.hosts_by_rank)

    @property
    def processes_per_node(self) -> int:
        return self.gpus_per_node // max(self.gpus_per_process, 1)


def validate(spec: LaunchSpec) -> list[NcclTestsInputError]:
    """Every reason the spec cannot be launched, each naming its variable."""
    problems = []
    if spec.launcher not in LAUNCHERS:
        problems.append(NcclTestsInputError("nccl_tests_launcher", f"{spec.launcher!r} is not one of mpirun, torchrun"))
    if not str(spec.binary or "").strip():
        problems.append(NcclTestsInputError("nccl_tests_binary", "no all_reduce_perf or benchmark script to run"))
    if not spec.hosts_by_rank:
        problems.append(NcclTestsInputError("kimi_nodes", "the group has no hosts"))
    for host in spec.hosts_by_rank:
        if not str(spec.host_addresses.get(host) or "").strip():
            problems.append(
                NcclTestsInputError(
                    "kimi_host_ip",
                    f"{host} has no address: set kimi_host_ip, or make sure kimi_network_interface "
                    f"{spec.interface or '(unset)'} has an IPv4 address there (facts of that interface are needed)",
                )
            )
    if spec.gpus_per_node < 1 or spec.gpus_per_process < 1:
        problems.append(
            NcclTestsInputError("nccl_tests_gpus_per_process", "GPUs per node and per process must be >= 1")
        )
    elif spec.gpus_per_node % spec.gpus_per_process:
        problems.append(
            NcclTestsInputError(
                "nccl_tests_gpus_per_process",
                f"{spec.gpus_per_process} (-g) does not divide {spec.gpus_per_node} GPUs per node",
            )
        )
    if spec.launcher == "torchrun" and spec.gpus_per_process != 1:
        problems.append(NcclTestsInputError("nccl_tests_gpus_per_process", "torchrun runs one GPU per process: use 1"))
    for variable, value in (("nccl_tests_min_bytes", spec.min_bytes), ("nccl_tests_max_bytes", spec.max_bytes)):
        if not _SIZE.match(str(value)):
            problems.append(NcclTestsInputError(variable, f"{value!r} is not a size like 8, 128K, 1M or 4G"))
    if not problems and parse_size(spec.min_bytes) > parse_size(spec.max_bytes):
        problems.append(
            NcclTestsInputError("nccl_tests_min_bytes", f"{spec.min_bytes} is larger than max {spec.max_bytes}")
        )
    if spec.step_factor < 2:
        problems.append(NcclTestsInputError("nccl_tests_step_factor", "the size factor (-f) must be at least 2"))
    if spec.iters < 1 or spec.warmup_iters < 0 or spec.check_iters < 0:
        problems.append(NcclTestsInputError("nccl_tests_iters", "iterations must be >= 1 (warmup and check >= 0)"))
    for name, value in spec.env.items():
        if not _ENV_NAME.match(name) or "\n" in str(value):
            problems.append(NcclTestsInputError("nccl_tests_extra_env", f"{name}={value!r} is not a usable variable"))
    if spec.json_path and (not spec.json_path.startswith("/") or not spec.json_path.endswith(".json")):
        # nccl-tests picks the format from the suffix and writes nothing for any other.
        problems.append(
            NcclTestsInputError("nccl_tests_json_path", f"{spec.json_path!r} is not an absolute *.json path")
        )
    if spec.interface and not re.match(r"^[A-Za-z0-9_.:@-]+$", spec.interface):
        problems.append(
            NcclTestsInputError(
                "kimi_network_interface", f"{spec.interface!r} is not one interface name (MPI needs one)"
            )
        )
    return problems


def parse_size(text: str) -> int:
    """nccl-tests' size syntax: bytes with an optional K, M or G (powers of 1024)."""
    text = str(text).strip()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    return int(text[:-1] if scale > 1 else text) * scale


def _test_args(spec: LaunchSpec) -> list[str]:
    args = ["-b", str(spec.min_bytes), "-e", str(spec.max_bytes), "-f", str(spec.step_factor)]
    if spec.launcher == "mpirun":
        args += ["-g", str(spec.gpus_per_process)]
    args += ["-n", str(spec.iters), "-w", str(spec.warmup_iters), "-c", str(spec.check_iters)]
    if spec.launcher == "mpirun" and spec.json_path:
        args += ["-J", spec.json_path]
    return args + [str(arg) for arg in spec.test_args]


def _timeout_prefix(spec: LaunchSpec) -> list[str]:
    # The launcher gets TERM at the limit and KILL 30 s later; its exit status is then 124.
    return ["timeout", "--kill-after=30", str(spec.timeout_s)] if spec.timeout_s > 0 else []


def mpirun_argv(spec: LaunchSpec) -> list[str]:
    """One mpirun on node rank 0 starts every rank: -np nodes x processes per node, -H addr:slots in node order,
    MPI's own traffic on the cluster interface, every NCCL variable exported with -x."""
    slots = spec.processes_per_node
    argv = [*_timeout_prefix(spec), spec.launcher_path or "mpirun"]
    if spec.allow_run_as_root:
        argv.append("--allow-run-as-root")
    argv += ["-np", str(spec.nodes * slots)]
    argv += ["-H", ",".join(f"{spec.host_addresses[host]}:{slots}" for host in spec.hosts_by_rank)]
    if spec.interface:
        argv += ["--mca", "btl_tcp_if_include", spec.interface, "--mca", "oob_tcp_if_include", spec.interface]
    for name, value in spec.env.items():
        argv += ["-x", f"{name}={value}"]
    argv += [str(arg) for arg in spec.launcher_args]
    return [*argv, spec.binary, *_test_args(spec)]


def torchrun_argv(spec: LaunchSpec, host: str) -> list[str]:
    """torchrun on every node with its node rank; rank 0's address is the rendezvous. The environment (NCCL
    variables) is set on the process, not in the argv."""
    master = spec.host_addresses[spec.hosts_by_rank[0]]
    argv = [*_timeout_prefix(spec), spec.launcher_path or "torchrun"]
    argv += ["--nnodes", str(spec.nodes), "--nproc-per-node", str(spec.gpus_per_node)]
    argv += ["--node-rank", str(list(spec.hosts_by_rank).index(host))]
    argv += ["--master-addr", master, "--master-port", str(spec.master_port)]
    argv += [str(arg) for arg in spec.launcher_args]
    return [*argv, spec.binary, *_test_args(spec)]


def launch_spec(options: Mapping[str, Any]) -> LaunchSpec:
    """The spec from kimi_nccl_tests_command's options (its names; the environment file as text, extra_env on top)."""
    return LaunchSpec(
        launcher=options["launcher"],
        hosts_by_rank=list(options["hosts"] or []),
        host_addresses={str(host): str(address) for host, address in (options["host_addresses"] or {}).items()},
        gpus_per_node=options["gpus_per_node"],
        binary=options["binary"],
        min_bytes=options["min_bytes"],
        max_bytes=options["max_bytes"],
        step_factor=options["step_factor"],
        gpus_per_process=options["gpus_per_process"],
        iters=options["iters"],
        warmup_iters=options["warmup_iters"],
        check_iters=options["check_iters"],
        env=launch_env(parse_env_file(options["env_file_text"] or ""), options["extra_env"]),
        interface=options["interface"],
        launcher_path=options["launcher_path"],
        launcher_args=list(options["launcher_args"] or []),
        test_args=list(options["test_args"] or []),
        master_port=options["master_port"],
        allow_run_as_root=options["allow_run_as_root"],
        timeout_s=options["timeout_s"],
        json_path=options.get("json_path") or "",
    )


def render(spec: LaunchSpec) -> dict[str, Any]:
    """The commands to run, per host: mpirun runs on node rank 0 only, torchrun on every node at once.
    Raises NcclTestsInputError (the first problem) when the spec cannot run."""
    problems = validate(spec)
    if problems:
        raise problems[0]
    if spec.launcher == "mpirun":
        commands = {spec.hosts_by_rank[0]: mpirun_argv(spec)}
    else:
        commands = {host: torchrun_argv(spec, host) for host in spec.hosts_by_rank}
    return {
        "launcher": spec.launcher,
        "run_on": list(commands),
        "commands": commands,
        "command_lines": {host: shlex.join(argv) for host, argv in commands.items()},
        "env": dict(spec.env),
        "ranks": spec.nodes * spec.gpus_per_node,
        "processes": spec.nodes * spec.processes_per_node,
    }
