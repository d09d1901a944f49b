"""`lab/lab`: bring the local multi-node lab up and down, break it on purpose, and look at it."""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

from . import base, inventory, net, nodes, serve, teardown
from .settings import (
    BRIDGE,
    CGROUP_ROOTS,
    DEFAULT_DATA_SIZE,
    HOST_ADDRESS,
    MAX_NODES,
    REPO_ROOT,
    Settings,
    load_settings,
    node_address,
    node_index,
    node_name,
    node_veth,
    parse_size,
)
from .state import LabRecord, StatePaths
from .system import LabError, install_signal_handlers, run

# Host program -> the Debian package that provides it (the hint in the error message).
REQUIRED_PROGRAMS = {
    "debootstrap": "debootstrap",
    "systemd-nspawn": "systemd-container",
    "chroot": "coreutils",
    "iptables": "iptables",
    "ip": "iproute2",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "dpkg-scanpackages": "dpkg-dev",
    "dpkg-deb": "dpkg",
    "zstd": "zstd",
    "mount": "mount",
    "umount": "mount",
    "losetup": "mount",
}
BUILD_TARGETS = ("base", "apt", "wheels", "hf", "all")


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (and still exit 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"lab: {message} (see `lab/lab --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="lab/lab", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)

    up = commands.add_parser("up", help=f"build what is missing, boot N nodes (1..{MAX_NODES}), start the mirrors")
    up.add_argument("count", help="number of nodes")
    up.add_argument("--data-size", default=DEFAULT_DATA_SIZE, help="size of each node's /data (default 4G)")
    up.set_defaults(func=cmd_up)

    commands.add_parser("down", help="stop and remove everything the lab created").set_defaults(func=cmd_down)

    status = commands.add_parser("status", help="nodes, servers and mirror URLs")
    status.add_argument("--json", action="store_true", help="machine-readable (Molecule's create playbook)")
    status.set_defaults(func=cmd_status)

    for name, func, text in (
        ("crash", cmd_crash, "power-cut a node (SIGKILL its PID 1); its disk is kept"),
        ("start", cmd_start, "boot a crashed node again from its kept state"),
        ("cut", cmd_cut, "take a node's network link down"),
        ("heal", cmd_heal, "bring a cut node's link back"),
    ):
        sub = commands.add_parser(name, help=text)
        sub.add_argument("node", help="node1..node8")
        sub.set_defaults(func=func)

    airgap = commands.add_parser("airgap", help="on: the nodes can open no connection to the host; off: undo")
    airgap.add_argument("state", choices=("on", "off"))
    airgap.set_defaults(func=cmd_airgap)

    ssh = commands.add_parser("ssh", help="ssh to a node as root (optionally run a command)")
    ssh.add_argument("node")
    ssh.add_argument("remote_command", nargs=argparse.REMAINDER)
    ssh.set_defaults(func=cmd_ssh)

    build = commands.add_parser("build", help="build the cached base rootfs and mirrors")
    build.add_argument("target", nargs="?", default="all", choices=BUILD_TARGETS)
    build.set_defaults(func=cmd_build)

    bulk = commands.add_parser(
        "bulk-checkpoint", help="build (or reuse) a checkpoint of N GiB of random shards for olah to serve"
    )
    bulk.add_argument("--gib", required=True, help="the shards' total size in GiB (e.g. 2 or 0.5)")
    bulk.set_defaults(func=cmd_bulk_checkpoint)

    data_size = commands.add_parser("data-size", help="resize a node's /data (e.g. to make a disk check fail)")
    data_size.add_argument("node")
    data_size.add_argument("size", help="e.g. 64M, 2G")
    data_size.set_defaults(func=cmd_data_size)
    return parser


# --- validation --------------------------------------------------------------------------------------------


def parse_node_count(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= MAX_NODES:
        raise LabError(f"node count must be a whole number from 1 to {MAX_NODES}, got {text!r}", exit_code=2)
    return int(text)


def missing_programs(path: str | None = None) -> list[str]:
    return [program for program in REQUIRED_PROGRAMS if shutil.which(program, path=path) is None]


def require_root() -> None:
    if os.geteuid() != 0:
        raise LabError("the lab needs root (it mounts, creates links and boots containers)", exit_code=2)


def require_host_ready() -> None:
    missing = missing_programs()
    if missing:
        packages = sorted({REQUIRED_PROGRAMS[p] for p in missing})
        raise LabError(
            f"missing host programs: {', '.join(missing)} (install: apt-get install {' '.join(packages)})",
            exit_code=2,
        )
    for root in CGROUP_ROOTS:
        if not root.is_dir():
            raise LabError(f"{root} is missing: the lab expects this host's hybrid cgroup layout", exit_code=2)


def require_nothing_left(paths: StatePaths) -> None:
    record = LabRecord.load(paths)
    if record is not None:
        what = "is already up" if record.ready else "was half made by an interrupted up"
        raise LabError(f"a lab with {record.node_count} nodes {what}: run `lab/lab down` first", exit_code=2)


# --- `up N` again: a healthy lab of the same shape is kept --------------------------------------------------


def other_shape_error(record: LabRecord, count: int, data_size: int, settings: Settings) -> str | None:
    """Why the running lab is not the one `up count` asks for (None when it is): another size, /data or port."""
    if record.node_count != count:
        return (
            f"a lab with {record.node_count} nodes is already up, and {count} were asked for: run `lab/lab down` "
            f"first, or keep this one (`lab/lab up {record.node_count}`, `make demo NODES={record.node_count}`)"
        )
    if record.data_size_bytes != data_size:
        return (
            f"the lab up has {record.data_size_bytes} B of /data per node, and {data_size} B were asked for: "
            f"run `lab/lab down` first, or `lab/lab up {count}` without --data-size"
        )
    ports = (record.http_port, record.hf_port)
    if ports != (settings.http_port, settings.hf_port):
        return (
            f"the lab up serves its mirrors on ports {ports[0]}/{ports[1]}, and "
            f"{settings.http_port}/{settings.hf_port} were asked for (KIMI_LAB_HTTP_PORT/KIMI_LAB_HF_PORT): "
            f"run `lab/lab down` first"
        )
    return None


def unhealthy_error(record: LabRecord, problems: list[tuple[str, str]]) -> str:
    """One line: everything wrong with a lab of the right size, then the fixes (each named once)."""
    fixes = list(dict.fromkeys(fix for _, fix in problems))
    return (
        f"a lab with {record.node_count} nodes is up but not healthy: {'; '.join(what for what, _ in problems)} "
        f"(fix: {'; '.join(fixes)})"
    )


def _http_ok(url: str) -> bool:
    # No proxy: the mirrors are on the bridge address, and a proxy from the environment must never see them.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=5) as response:
            return response.status == 200
    except (OSError, ValueError):
        return False


def health_problems(paths: StatePaths, record: LabRecord, mirrors: dict[str, dict]) -> list[tuple[str, str]]:
    """(what is wrong, the fix) for a lab that is up: every node running and accepting SSH, both servers
    running and answering, serving what the mirror recipes build now, and the inventory written."""
    again = f"`lab/lab down`, then `lab/lab up {record.node_count}`"
    if not net.link_exists(BRIDGE) or not net.link_is_up(BRIDGE):
        # Without the bridge the lab addresses route elsewhere: probe nothing.
        return [(f"the bridge {BRIDGE} is missing or down", again)]
    if not net.is_local_address(HOST_ADDRESS):
        return [(f"{HOST_ADDRESS} is not this host's address on {BRIDGE}", again)]
    problems = []
    for index in range(1, record.node_count + 1):
        name = node_name(index)
        state = nodes.state_of(paths, name)
        if state == "crashed":
            problems.append((f"{name} is not running (crashed)", f"`lab/lab start {name}`"))
        elif state == "cut":
            problems.append((f"{name} is cut off the network", f"`lab/lab heal {name}`"))
        elif not nodes.accepts_ssh(paths, name):
            problems.append((f"{name} is running but does not accept SSH", again))
    server_pids = serve.server_pids(paths)
    checkpoint = record.checkpoint
    probes = {
        "http": (
            "the static HTTP mirror",
            f"{record.mirror_urls.get('apt_debian', f'http://{HOST_ADDRESS}:{record.http_port}/apt/debian')}/Packages",
        ),
        "hf": (
            "the olah Hugging Face mirror",
            f"http://{HOST_ADDRESS}:{record.hf_port}/api/models/{checkpoint.get('repo_id')}/revision/"
            f"{checkpoint.get('revision')}",
        ),
    }
    for server, (what, url) in probes.items():
        if server_pids[server] is None:
            problems.append((f"{what} is not running", again))
        elif not _http_ok(url):
            problems.append((f"{what} does not answer {url}", again))
    built = mirrors["hf"]
    if (built["repo_id"], built["revision"]) != (checkpoint.get("repo_id"), checkpoint.get("revision")):
        problems.append(
            (
                f"the lab serves checkpoint {checkpoint.get('revision')}, but its recipe now builds "
                f"{built['revision']}",
                again,
            )
        )
    if serve.docroot_targets(paths) != serve.docroot_targets_for(mirrors["apt"], mirrors["wheels"]):
        problems.append(("the lab serves older apt/wheel mirrors than their recipes now build", again))
    missing = [p for p in (inventory.hosts_path(), inventory.generated_vars_path()) if not p.is_file()]
    if missing:
        problems.append((f"{missing[0].relative_to(REPO_ROOT)} is missing", again))
    return problems
    left = teardown.leftovers(paths)
    if left:
        raise LabError(
            f"an earlier lab left {len(left)} things behind ({left[0]}, ...): run `lab/lab down` first", exit_code=2
        )


def lab_record(paths: StatePaths) -> LabRecord:
    record = LabRecord.load(paths)
    if record is None:
        raise LabError("the lab is not up (`lab/lab up N` starts it)", exit_code=2)
    return record


def lab_node(paths: StatePaths, name: str) -> str:
    record = lab_record(paths)
    try:
        index = node_index(name)
    except ValueError as error:
        raise LabError(str(error), exit_code=2) from None
    if index > record.node_count:
        raise LabError(f"{name} is not in this lab (it has node1..node{record.node_count})", exit_code=2)
    return name


@contextmanager
def exclusive(settings: Settings) -> Iterator[None]:
    """One lab command that changes the host at a time (names and addresses are host-wide)."""
    settings.cache.mkdir(parents=True, exist_ok=True)
    with (settings.cache / ".lab.lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print("lab: waiting for another lab/lab command to finish", file=sys.stderr)
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


# --- commands ----------------------------------------------------------------------------------------------


def cmd_up(args: argparse.Namespace, settings: Settings) -> int:
    count = parse_node_count(args.count)
    try:
        data_size = parse_size(args.data_size)
    except ValueError as error:
        raise LabError(f"--data-size: {error}", exit_code=2) from None
    require_root()
    require_host_ready()
    paths = StatePaths(settings.state)
    with exclusive(settings):
        record = LabRecord.load(paths)
        if record is not None and record.ready:
            return keep_running_lab(paths, settings, record, count, data_size)
        require_nothing_left(paths)
        net.check_port_free(settings.http_port, "KIMI_LAB_HTTP_PORT, static HTTP mirror")
        net.check_port_free(settings.hf_port, "KIMI_LAB_HF_PORT, olah Hugging Face mirror")
        # Builds only touch the cache; nothing of the lab exists until they are done.
        base_rootfs = base.build(settings.cache, settings.debian_mirror)
        base.prune(settings.cache, keep={base_rootfs.parent})
        mirrors = serve.build_mirrors(settings.cache)
        started = time.monotonic()
        try:
            bring_up(paths, settings, count, data_size, base_rootfs, mirrors)
        except BaseException:
            kept = teardown.save_logs(paths, settings.cache / "failed-up-logs")
            print(f"lab: up failed; removing what it created (logs kept in {kept})", file=sys.stderr)
            for problem in teardown.down(paths):
                print(f"lab: after failed up: {problem}", file=sys.stderr)
            raise
    print(f"lab: {count} node(s) up and accepting SSH in {time.monotonic() - started:.1f} s")
    print_status(paths)
    return 0


def keep_running_lab(paths: StatePaths, settings: Settings, record: LabRecord, count: int, data_size: int) -> int:
    """`up N` with a lab up: the same, healthy lab is kept (exit 0, nothing changed); anything else is refused."""
    other = other_shape_error(record, count, data_size, settings)
    if other:
        raise LabError(other, exit_code=2)
    started = time.monotonic()
    # The builders only check their caches here (milliseconds); a changed recipe shows as a stale mirror.
    problems = health_problems(paths, record, serve.build_mirrors(settings.cache))
    if problems:
        raise LabError(unhealthy_error(record, problems), exit_code=2)
    print(
        f"lab: a healthy lab with {count} node(s) is already up (every node accepts SSH, the mirrors answer; "
        f"checked in {time.monotonic() - started:.1f} s): nothing to do"
    )
    print_status(paths)
    return 0


def bring_up(
    paths: StatePaths, settings: Settings, count: int, data_size: int, base_rootfs: Path, mirrors: dict[str, dict]
) -> None:
    names = [node_name(i) for i in range(1, count + 1)]
    hf = mirrors["hf"]
    paths.root.mkdir(parents=True, exist_ok=True)
    record = LabRecord(
        node_count=count,
        data_size_bytes=data_size,
        http_port=settings.http_port,
        hf_port=settings.hf_port,
        base_rootfs=str(base_rootfs),
        mirror_urls=serve.mirror_urls(settings),
        checkpoint={k: hf[k] for k in ("repo_id", "revision", "total_bytes", "files")},
        data_sizes=dict.fromkeys(names, data_size),
    )
    record.save(paths)
    client_public_key = nodes.ensure_client_key(paths)
    net.create_bridge()
    net.create_chain()
    serve.prepare_docroot(paths, mirrors["apt"], mirrors["wheels"])
    serve.start_servers(paths, settings, hf)
    for index, name in enumerate(names, start=1):
        nodes.mount_data(paths, name, data_size)
        nodes.mount_overlay(paths, name, base_rootfs)
        nodes.write_identity(paths, index, count, settings.http_port, client_public_key)
    nodes.write_known_hosts(paths, count)
    for name in names:
        nodes.launch(paths, name)
    nodes.wait_for_ssh(paths, names, settings.boot_timeout_s)
    inventory.write(
        inventory.render_hosts(count, paths.client_key, paths.known_hosts),
        inventory.render_generated_vars(count, data_size, record.mirror_urls, record.checkpoint),
    )
    record.ready = True
    record.save(paths)


def cmd_down(args: argparse.Namespace, settings: Settings) -> int:
    require_root()
    started = time.monotonic()
    with exclusive(settings):
        problems = teardown.down(StatePaths(settings.state))
    if problems:
        raise LabError(f"down left {len(problems)} things: {'; '.join(problems[:5])}")
    print(f"lab: down ({time.monotonic() - started:.1f} s)")
    return 0


def cmd_crash(args: argparse.Namespace, settings: Settings) -> int:
    require_root()
    paths = StatePaths(settings.state)
    with exclusive(settings):
        name = lab_node(paths, args.node)
        nodes.crash(paths, name)
    print(f"lab: {name} crashed (power cut); `lab/lab start {name}` boots it again")
    return 0


def cmd_start(args: argparse.Namespace, settings: Settings) -> int:
    require_root()
    paths = StatePaths(settings.state)
    with exclusive(settings):
        name = lab_node(paths, args.node)
        if nodes.is_running(paths, name):
            raise LabError(f"{name} is already running", exit_code=2)
        record = lab_record(paths)
        started = time.monotonic()
        nodes.mount_data(paths, name, record.data_sizes.get(name, record.data_size_bytes))
        nodes.mount_overlay(paths, name, Path(record.base_rootfs))
        nodes.launch(paths, name)
        nodes.wait_for_ssh(paths, [name], settings.boot_timeout_s)
    print(f"lab: {name} started and accepting SSH in {time.monotonic() - started:.1f} s")
    return 0


def _set_link(args: argparse.Namespace, settings: Settings, state: str) -> int:
    require_root()
    paths = StatePaths(settings.state)
    with exclusive(settings):
        name = lab_node(paths, args.node)
        veth = node_veth(name)
        if not nodes.is_running(paths, name) or not net.link_exists(veth):
            raise LabError(f"{name} is not running (no {veth})", exit_code=2)
        run(["ip", "link", "set", veth, state])
    print(f"lab: {name} {'cut off' if state == 'down' else 'reconnected'} ({veth} {state})")
    return 0


def cmd_cut(args: argparse.Namespace, settings: Settings) -> int:
    return _set_link(args, settings, "down")


def cmd_heal(args: argparse.Namespace, settings: Settings) -> int:
    return _set_link(args, settings, "up")


def cmd_airgap(args: argparse.Namespace, settings: Settings) -> int:
    """The nodes' only reachable peers become each other: the host's mirrors (and anything else on it) refuse
    them, as a site with no route but its own mirror host. Idempotent both ways; `down` also undoes it."""
    require_root()
    paths = StatePaths(settings.state)
    with exclusive(settings):
        lab_record(paths)
        if args.state == "on" and not net.airgapped():
            net.delete_airgap_chain()
            net.create_airgap_chain()
        elif args.state == "off":
            problems = net.delete_airgap_chain()
            if problems:
                raise LabError("; ".join(problems))
    what = "the nodes can open no connection to the host" if args.state == "on" else "the nodes reach the host"
    print(f"lab: air gap {args.state} ({what})")
    return 0


def cmd_ssh(args: argparse.Namespace, settings: Settings) -> int:
    paths = StatePaths(settings.state)
    name = lab_node(paths, args.node)
    address = node_address(node_index(name))
    net.require_bridge_route(address)
    argv = nodes.ssh_argv(paths, address)
    if not args.remote_command and sys.stdin.isatty():
        argv.insert(1, "-t")
    sys.stdout.flush()
    os.execvp(argv[0], [*argv, *args.remote_command])
    return 0  # not reached: exec replaced this process


def cmd_build(args: argparse.Namespace, settings: Settings) -> int:
    require_root()
    require_host_ready()
    with exclusive(settings):
        if args.target in ("base", "all"):
            rootfs = base.build(settings.cache, settings.debian_mirror)
            record = LabRecord.load(StatePaths(settings.state))
            in_use = {Path(record.base_rootfs).parent} if record else set()
            for old in base.prune(settings.cache, keep={rootfs.parent, *in_use}):
                print(f"base: removed the outdated {old}")
            print(f"base: {rootfs}")
        kinds = serve.MIRROR_KINDS if args.target == "all" else (args.target,) if args.target != "base" else ()
        for kind, result in serve.build_mirrors(settings.cache, kinds).items():
            print(f"mirror {kind}: {json.dumps(result, default=str, sort_keys=True)}")
    return 0


def cmd_bulk_checkpoint(args: argparse.Namespace, settings: Settings) -> int:
    """Print the bulk checkpoint's manifest as JSON on stdout (progress and the olah check go to stderr)."""
    bulk = serve.mirrors_module("hf_bulk")
    try:
        gib = bulk.parse_gib(args.gib)
    except ValueError as error:
        raise LabError(str(error), exit_code=2) from None
    require_root()
    # No lab lock: this only writes its own cache kind, which _cache.cached_build locks, so it may run while
    # other lab commands (or a timing test on the running lab) go on.
    started = time.monotonic()
    try:
        result = bulk.build(settings.cache, gib)
    except RuntimeError as error:  # MirrorBuildError: its message names the failing step
        raise LabError(f"bulk checkpoint could not be built: {error}") from error
    print(f"lab: {result['repo_id']} ready in {time.monotonic() - started:.1f} s", file=sys.stderr)
    print(served_note(StatePaths(settings.state), result), file=sys.stderr)
    print(json.dumps({k: result[k] for k in ("repo_id", "revision", "files", "total_bytes", "mirrors_path")}, indent=2))
    return 0


def served_note(paths: StatePaths, result: dict) -> str:
    """Whether the running lab's olah answers for the new revision (an olah started before its config listed
    the bulk directory would not)."""
    record = LabRecord.load(paths)
    if record is None or not record.ready:
        return "lab: no lab is up; `lab/lab up N` serves it from olah"
    if not net.link_exists(BRIDGE) or not net.link_is_up(BRIDGE):
        return f"lab: the lab is up without {BRIDGE}: olah not checked (`lab/lab down`, `lab/lab up N`)"
    endpoint = f"http://{HOST_ADDRESS}:{record.hf_port}"
    if _http_ok(f"{endpoint}/api/models/{result['repo_id']}/revision/{result['revision']}"):
        return f"lab: served by olah at {endpoint} (HF_ENDPOINT)"
    return f"lab: olah at {endpoint} does not serve it: restart the lab (`lab/lab down`, `lab/lab up N`)"


def cmd_data_size(args: argparse.Namespace, settings: Settings) -> int:
    require_root()
    try:
        size = parse_size(args.size)
    except ValueError as error:
        raise LabError(str(error), exit_code=2) from None
    paths = StatePaths(settings.state)
    with exclusive(settings):
        name = lab_node(paths, args.node)
        nodes.resize_data(paths, name, size)
        record = lab_record(paths)
        record.data_sizes[name] = size
        record.save(paths)
    print(f"lab: {name} /data is now {size} bytes")
    return 0


def status_report(paths: StatePaths) -> dict[str, object]:
    record = LabRecord.load(paths)
    if record is None:
        return {"up": False, "nodes": [], "servers": {}, "mirrors": {}, "leftovers": teardown.leftovers(paths)}
    server_pids = serve.server_pids(paths)
    return {
        "up": True,
        "ready": record.ready,
        "bridge": {"name": BRIDGE, "address": HOST_ADDRESS, "present": net.link_exists(BRIDGE)},
        "nodes": [
            {
                "name": node_name(i),
                "address": node_address(i),
                "state": nodes.state_of(paths, node_name(i)),
                "ssh_key": str(paths.client_key),
                "known_hosts": str(paths.known_hosts),
                "user": "root",
                "port": nodes.SSH_PORT,
                "data_size_bytes": record.data_sizes.get(node_name(i), record.data_size_bytes),
            }
            for i in range(1, record.node_count + 1)
        ],
        "servers": {
            "http": {"url": f"http://{HOST_ADDRESS}:{record.http_port}", "pid": server_pids["http"]},
            "hf": {"url": f"http://{HOST_ADDRESS}:{record.hf_port}", "pid": server_pids["hf"]},
        },
        "mirrors": record.mirror_urls,
        "airgap": net.airgapped(),
        "checkpoint": record.checkpoint,
        "inventory": str(inventory.inventory_dir()),
    }


def print_status(paths: StatePaths) -> None:
    report = status_report(paths)
    if not report["up"]:
        left = report["leftovers"]
        print("lab: down" + (f" (but {len(left)} leftovers: run `lab/lab down`)" if left else ""))
        return
    for node in report["nodes"]:
        print(f"{node['name']:<6} {node['address']:<13} {node['state']:<8} /data {node['data_size_bytes']} B")
    for name, server in report["servers"].items():
        print(f"server {name:<5} {server['url']:<24} {'running' if server['pid'] else 'NOT RUNNING'}")
    for name, url in report["mirrors"].items():
        print(f"mirror {name:<15} {url}")
    if report["airgap"]:
        print("air gap on: the nodes can open no connection to the host (`lab/lab airgap off`)")
    print(f"inventory {report['inventory']}")


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    paths = StatePaths(settings.state)
    if args.json:
        print(json.dumps(status_report(paths), indent=2, sort_keys=True))
    else:
        print_status(paths)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # SIGTERM (a CI timeout) unwinds like Ctrl-C, so an interrupted `up` still removes what it made.
    install_signal_handlers()
    # Progress lines must reach a CI log (a file or pipe) when they happen, not when the buffer fills.
    sys.stdout.reconfigure(line_buffering=True)
    try:
        settings = load_settings()
        return args.func(args, settings)
    except ValueError as error:
        print(f"lab: {error}", file=sys.stderr)
        return 2
    except LabError as error:
        print(f"lab: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print("lab: interrupted", file=sys.stderr)
        return 130
    except subprocess.CalledProcessError as error:
        print(f"lab: {error}", file=sys.stderr)
        return 1
