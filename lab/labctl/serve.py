"""The lab's stand-ins for a site's package and model mirrors, served from the bridge address.

Static HTTP (python's http.server) serves a document root of symlinks into the mirror builders' output:
  /apt/nvidia  (placeholder packages with NVIDIA's names and versions)
  /apt/debian  (the Debian packages nodes may install; nodes have no other Debian source)
  /wheels/     (the wheelhouse, for pip --no-index --find-links; its index.html names each wheel's PEP 658
               metadata, as PyPI does, so a dry-run resolve downloads no wheel: labctl/wheel_index.py)
olah, in offline mode, serves the miniature checkpoint as a Hugging Face endpoint, and the bulk checkpoints
(`lab/lab bulk-checkpoint`) from a second mirrors path.
"""

from __future__ import annotations

import importlib
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

from . import wheel_index
from .settings import HOST_ADDRESS, Settings
from .state import StatePaths
from .system import (
    LabError,
    critical_section,
    pid_file_process,
    process_alive,
    signal_pids,
    wait_until_gone,
)

MIRROR_KINDS = ("apt", "wheels", "hf")
HTTP_MARKER = "http.server"
OLAH_MARKER = "olah.server"
READY_TIMEOUT_S = 60


def mirrors_module(kind: str) -> ModuleType:
    """labctl.mirrors_<kind>, imported on use so that commands not needing mirrors never load them."""
    name = f"labctl.mirrors_{kind}"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name == name:
            raise LabError(f"{name} is missing: the mirror builders are not installed in this checkout") from None
        raise


def build_mirrors(cache: Path, kinds: tuple[str, ...] = MIRROR_KINDS) -> dict[str, dict]:
    """Run the (cached) mirror builders; returns their results by kind."""
    results = {}
    for kind in kinds:
        started = time.monotonic()
        try:
            results[kind] = mirrors_module(kind).build(cache)
        except (RuntimeError, subprocess.CalledProcessError) as error:
            # The builders raise RuntimeError subclasses whose message names the failing step.
            detail = " / ".join(line.strip() for line in str(error).splitlines() if line.strip())
            raise LabError(f"mirror {kind} could not be built: {detail[:600]}") from error
        print(f"mirror {kind}: ready in {time.monotonic() - started:.1f} s")
    return results


def mirror_urls(settings: Settings) -> dict[str, str]:
    return {
        "apt_nvidia": f"{settings.http_url}/apt/nvidia",
        "apt_debian": f"{settings.http_url}/apt/debian",
        "pip_find_links": f"{settings.http_url}/wheels/",
        "hf_endpoint": settings.hf_url,
    }


DOCROOT_LINKS = ("apt/nvidia", "apt/debian", "wheels")


def docroot_targets_for(apt: dict[str, Path], wheels: dict[str, Path]) -> dict[str, Path]:
    """What each document-root link should point to for these mirror builds."""
    targets = (Path(apt["nvidia"]), Path(apt["debian"]), Path(wheels["wheelhouse"]))
    return {link: target.resolve() for link, target in zip(DOCROOT_LINKS, targets, strict=True)}


def docroot_targets(paths: StatePaths) -> dict[str, Path]:
    """What each document-root link of the running lab points to (missing links are left out)."""
    return {link: (paths.docroot / link).resolve() for link in DOCROOT_LINKS if (paths.docroot / link).is_symlink()}


def prepare_docroot(paths: StatePaths, apt: dict[str, Path], wheels: dict[str, Path]) -> None:
    links = {paths.docroot / link: target for link, target in docroot_targets_for(apt, wheels).items()}
    for link, target in links.items():
        if not target.is_dir():
            raise LabError(f"mirror directory {target} does not exist (for {link.relative_to(paths.docroot)})")
        link.parent.mkdir(parents=True, exist_ok=True)
        link.unlink(missing_ok=True)
        link.symlink_to(target.resolve(), target_is_directory=True)
    # Also for wheelhouses built before the page existed: it adds files beside the wheels, never changes one.
    wheel_index.ensure(Path(wheels["wheelhouse"]))


def _spawn(argv: list[str], log: Path, pid_file: Path, cwd: Path) -> int:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out, critical_section():
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        pid_file.write_text(f"{proc.pid}\n")
    return proc.pid


def _wait_listening(port: int, pid: int, what: str, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((HOST_ADDRESS, port), timeout=0.5):
                return
        except OSError:
            pass
        if not process_alive(pid):
            raise LabError(f"the {what} server exited at start (log: {log})")
        time.sleep(0.1)
    raise LabError(f"the {what} server did not listen on {HOST_ADDRESS}:{port} in {READY_TIMEOUT_S} s (log: {log})")


def http_pid_file(paths: StatePaths) -> Path:
    return paths.serve_dir / "http.pid"


def olah_pid_file(paths: StatePaths) -> Path:
    return paths.serve_dir / "olah.pid"


def start_servers(paths: StatePaths, settings: Settings, hf: dict) -> None:
    """Start the static HTTP server and olah, both bound to the bridge address, and wait until they listen."""
    paths.serve_dir.mkdir(parents=True, exist_ok=True)
    http_log = paths.logs / "http.log"
    http_pid = _spawn(
        [
            sys.executable,
            "-m",
            HTTP_MARKER,
            "--bind",
            HOST_ADDRESS,
            "--directory",
            str(paths.docroot),
            str(settings.http_port),
        ],
        http_log,
        http_pid_file(paths),
        paths.serve_dir,
    )

    # olah looks for a repository under its mirrors paths on every request, so listing the bulk checkpoints'
    # directory (mirrors_hf_bulk) now serves those that `lab/lab bulk-checkpoint` builds after `up`.
    bulk_root = mirrors_module("hf_bulk").served_root(settings.cache)
    bulk_root.mkdir(parents=True, exist_ok=True)
    config_text = mirrors_module("hf").olah_config(
        [Path(hf["mirrors_path"]), bulk_root], HOST_ADDRESS, settings.hf_port, paths.serve_dir / "olah-repos"
    )
    config = paths.serve_dir / "olah.toml"
    config.write_text(config_text)
    olah_log = paths.logs / "olah.log"
    olah_pid = _spawn(
        [str(hf["olah_python"]), "-m", OLAH_MARKER, "--config", str(config), "--log-path", str(paths.logs / "olah")],
        olah_log,
        olah_pid_file(paths),
        paths.serve_dir,
    )
    _wait_listening(settings.http_port, http_pid, "static HTTP", http_log)
    _wait_listening(settings.hf_port, olah_pid, "olah", olah_log)


def server_pids(paths: StatePaths) -> dict[str, int | None]:
    return {
        "http": pid_file_process(http_pid_file(paths), HTTP_MARKER),
        "hf": pid_file_process(olah_pid_file(paths), OLAH_MARKER),
    }


def stop_servers(paths: StatePaths) -> None:
    pids = [pid for pid in server_pids(paths).values() if pid is not None]
    signal_pids(pids, signal.SIGTERM)
    for pid in wait_until_gone(pids, 5):
        signal_pids([pid], signal.SIGKILL)
    wait_until_gone(pids, 5)
    for pid_file in (http_pid_file(paths), olah_pid_file(paths)):
        pid_file.unlink(missing_ok=True)
