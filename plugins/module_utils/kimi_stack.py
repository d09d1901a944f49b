"""Facts about the pinned stack on one node: debs and holds, driver, fabric manager, CUDA, the vLLM venv's
wheels, which libnccl.so.2 that venv's torch would load (and its real version), and the NCCL environment file
checked against the node's interfaces.

Pure stdlib. Every parser takes the text a command or file produced, so unit tests feed recorded output;
`gather` is the only function that runs commands, through a `run(argv) -> (rc, stdout, stderr)` callable the
Ansible module supplies. Runs on the nodes' own Python (3.10 on Ubuntu 22.04), hence no 3.11-only stdlib.
"""

from __future__ import annotations

import ctypes
import json
import platform
import re
import socket
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .kimi_gpu import parse_rows
from .kimi_node import (
    IP_ADDR_COMMAND,
    SYS_CLASS_NET,
    read_links,
)

FACTS_SCHEMA = 1

# What the module asks dpkg about by default: the pinned debs, and globs that catch whatever driver,
# fabric manager and CUDA toolkit packages a node actually has (an unpinned glob is how a 590 fabric manager
# once landed on a 580 driver).
DEFAULT_DEB_PATTERNS = (
    "libnccl2",
    "libnccl-dev",
    "cuda-toolkit-[0-9]*",
    "nvidia-driver-[0-9]*",
    "nvidia-fabricmanager*",
)
DPKG_QUERY_FORMAT = "${Package}\\t${Version}\\t${Status}\\n"
FABRIC_MANAGER_DEB = re.compile(r"^nvidia-fabricmanager(-\d+)?$")
DRIVER_DEB = re.compile(r"^nvidia-driver-(\d+)(-server)?(-open)?$")
VERSION_TOKEN = re.compile(r"\b(\d+\.\d+(?:\.\d+)*)\b")
NCCL_WHEEL_LIBRARY = Path("nvidia") / "nccl" / "lib" / "libnccl.so.2"
PROC_DRIVER_VERSION = Path("/proc/driver/nvidia/version")
INTERFACE_ENV_KEYS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
HCA_ENV_KEY = "NCCL_IB_HCA"

Runner = Callable[[list[str]], tuple[int, str, str]]


# ---------------------------------------------------------------- versions and names


def upstream_version(deb_version: str | None) -> str | None:
    """A Debian version without epoch and packaging suffix: '1:580.95.05-0ubuntu1' -> '580.95.05'.

    NCCL's debs put the CUDA flavour after the revision ('2.30.7-1+cuda13.3'), so cutting at the last '-'
    also drops it; that is what makes a deb comparable with the driver or a wheel version.
    """
    if not deb_version:
        return None
    version = deb_version.split(":", 1)[1] if ":" in deb_version else deb_version
    return version.rsplit("-", 1)[0] if "-" in version else version


def nccl_version_from_code(code: int) -> str:
    """NCCL's integer version as dotted text: 23007 -> '2.30.7', 2804 -> '2.8.4'.

    nccl.h encodes X.Y.Z as X*10000+Y*100+Z, except releases up to 2.8 which used X*1000+Y*100+Z.
    """
    if code >= 10000:
        major, rest = divmod(code, 10000)
    else:
        major, rest = divmod(code, 1000)
    minor, patch = divmod(rest, 100)
    return f"{major}.{minor}.{patch}"


def normalize_dist_name(name: str) -> str:
    """PEP 503 form, so 'Nvidia_NCCL.cu13' and 'nvidia-nccl-cu13' are one package.

    The nodes' one copy of packaging's canonicalize_name (a node's python3 may lack packaging); kimi_parity
    reuses it. The controller's filters and kimi_pinset use packaging itself; test_kimi_venv_diff.py checks
    that both agree.
    """
    return re.sub(r"[-_.]+", "-", name).lower()


def first_version_token(text: str) -> str | None:
    """The first dotted number in a line of text (driver banners put it among other words)."""
    found = VERSION_TOKEN.search(text or "")
    return found.group(1) if found else None


# ---------------------------------------------------------------- dpkg and apt


def parse_dpkg_query(text: str) -> dict[str, dict[str, Any]]:
    """Packages from `dpkg-query -W -f='${Package}\\t${Version}\\t${Status}\\n'`.

    Status is 'want error state' ('hold ok installed' once apt-mark hold ran). Only state 'installed'
    counts as installed: 'config-files' after a remove, or a half-configured package, is not a working one.
    """
    packages: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        fields = line.rstrip("\n").split("\t")
        if len(fields) < 3 or not fields[0]:
            continue
        name = fields[0].split(":", 1)[0]
        status_words = fields[2].split()
        state = status_words[-1] if status_words else ""
        packages[name] = {
            "version": fields[1] or None,
            "status": fields[2],
            "installed": state == "installed",
            "selection": status_words[0] if status_words else "",
        }
    return packages


def parse_showhold(text: str) -> set[str]:
    """Package names from `apt-mark showhold` (one a line, possibly with an ':arch' suffix)."""
    return {line.strip().split(":", 1)[0] for line in text.splitlines() if line.strip()}


def deb_facts(
    dpkg: dict[str, dict[str, Any]], holds: set[str], wanted_names: Iterable[str] = ()
) -> dict[str, dict[str, Any]]:
    """Each deb dpkg knows plus each explicitly wanted name, with version, installed and held.

    A wanted package dpkg does not know is reported as absent rather than left out, so a node that lacks it
    shows up in the parity table instead of silently agreeing.
    """
    result: dict[str, dict[str, Any]] = {}
    for name, entry in dpkg.items():
        installed = entry["installed"]
        result[name] = {
            "installed": installed,
            "version": entry["version"] if installed else None,
            "held": installed and (name in holds or entry["selection"] == "hold"),
            "status": entry["status"],
        }
    for name in wanted_names:
        if any(ch in name for ch in "*?[") or name in result:
            continue
        result[name] = {"installed": False, "version": None, "held": name in holds, "status": "not-installed"}
    return dict(sorted(result.items()))


def fabric_manager_from_debs(debs: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The installed fabric-manager deb (nvidia-fabricmanager or nvidia-fabricmanager-<branch>), if any."""
    installed = [(name, entry) for name, entry in debs.items() if FABRIC_MANAGER_DEB.match(name) and entry["installed"]]
    if not installed:
        return None
    name, entry = installed[0]
    return {
        "package": name,
        "deb_version": entry["version"],
        "version": upstream_version(entry["version"]),
        "held": entry["held"],
        "others": [other for other, _ in installed[1:]],
    }


# ---------------------------------------------------------------- driver


def parse_proc_driver_version(text: str) -> str | None:
    """Driver version from /proc/driver/nvidia/version ('NVRM version: NVIDIA UNIX ... Module  580.95.05 ...')."""
    for line in text.splitlines():
        if line.startswith("NVRM version:"):
            return first_version_token(line.split("Module", 1)[-1])
    return None


def parse_nvidia_smi_gpus(text: str) -> list[dict[str, str]]:
    """GPUs from `nvidia-smi --query-gpu=name,driver_version --format=csv,noheader` (kimi_gpu's CSV reader)."""
    return [
        {"name": row["name"] or "", "driver_version": row["driver_version"] or ""}
        for row in parse_rows(text, ("name", "driver_version"))
    ]


def parse_fabric_manager_version(text: str) -> str | None:
    """Version from `nv-fabricmanager --version` ('Fabric Manager version is : 580.95.05')."""
    return first_version_token(text.split(":", 1)[-1]) if text.strip() else None


# ---------------------------------------------------------------- CUDA


def parse_cuda_version_json(text: str) -> dict[str, str | None]:
    """Toolkit ('cuda') and runtime ('cuda_cudart') versions from a CUDA install's version.json."""
    data = json.loads(text)
    return {
        "toolkit_version": (data.get("cuda") or {}).get("version"),
        "cudart_version": (data.get("cuda_cudart") or {}).get("version"),
    }


def cudart_version_from_filename(filename: str) -> str | None:
    """'libcudart.so.13.3.40' -> '13.3.40'; the bare soname link carries only the major."""
    found = re.search(r"libcudart\.so\.(\d+(?:\.\d+)*)$", filename)
    return found.group(1) if found else None


def cuda_installs(root: Path = Path("/usr/local")) -> dict[str, Any]:
    """Every /usr/local/cuda-X.Y tree, and which one /usr/local/cuda points at (the default).

    version.json is the authority; without it the toolkit version comes from the directory name and the
    runtime version from the real file name of libcudart.so (its soname link only carries the major).
    """
    installs = [
        _cuda_install(directory)
        for directory in sorted(root.glob("cuda-*"))
        if directory.is_dir() and not directory.is_symlink()
    ]
    default_link = root / "cuda"
    default = str(default_link.resolve()) if default_link.exists() else None
    chosen = next((entry for entry in installs if entry["path"] == default), None)
    return {
        "default_path": default,
        "toolkit_version": chosen["toolkit_version"] if chosen else None,
        "cudart_version": chosen["cudart_version"] if chosen else None,
        "installs": installs,
    }


def _cuda_install(directory: Path) -> dict[str, Any]:
    entry: dict[str, Any] = {"path": str(directory), "toolkit_version": None, "cudart_version": None}
    version_json = directory / "version.json"
    if version_json.is_file():
        try:
            entry.update(parse_cuda_version_json(version_json.read_text()))
            entry["version_source"] = "version.json"
        except (ValueError, OSError) as error:
            entry["error"] = f"{version_json}: {error}"
    if not entry["toolkit_version"]:
        entry["toolkit_version"] = directory.name.split("-", 1)[1]
        entry["version_source"] = "directory name"
    libraries = sorted(
        {
            path.resolve().name
            for pattern in ("lib64/libcudart.so.*", "lib/libcudart.so.*", "targets/*/lib/libcudart.so.*")
            for path in directory.glob(pattern)
        }
    )
    entry["libcudart"] = libraries
    if not entry["cudart_version"]:
        versions = [v for v in map(cudart_version_from_filename, libraries) if v and "." in v]
        entry["cudart_version"] = max(versions, key=_version_key) if versions else None
    return entry


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


# ---------------------------------------------------------------- the vLLM venv

# Run by the venv's own interpreter: importlib.metadata sees exactly what that venv would import, and it works
# in venvs made without pip (uv). Printed as one JSON object.
# A distribution installed twice (two site directories, or a leftover .dist-info) is read as its first copy on
# sys.path, the one `import` loads and the one the vllm role's read_installed.yml reports: both readers must agree.
VENV_PROBE_SCRIPT = """
import importlib.metadata as md, json, platform, re, sys, sysconfig
packages, seen = {}, set()
for dist in md.distributions():
    name = dist.metadata["Name"]
    key = re.sub(r"[-_.]+", "-", name or "").lower()
    if name and key not in seen:
        seen.add(key)
        packages[name] = dist.version
paths = sysconfig.get_paths()
print(json.dumps({"python": platform.python_version(), "prefix": sys.prefix,
                  "site_dirs": sorted({paths["purelib"], paths["platlib"]}), "packages": packages}))
"""


def parse_venv_probe(text: str) -> dict[str, Any]:
    """The probe's JSON, with package names normalised."""
    data = json.loads(text)
    data["packages"] = {normalize_dist_name(k): v for k, v in sorted(data.get("packages", {}).items())}
    return data


def parse_pip_list_json(text: str) -> dict[str, str]:
    """`pip list --format=json` as {normalised name: version} (the fallback when the probe cannot run)."""
    return {normalize_dist_name(item["name"]): item["version"] for item in json.loads(text or "[]")}


# ---------------------------------------------------------------- which NCCL torch loads, and its version


# How `ldconfig -p` tags libraries of the machine's own ABI; untagged (or other) entries are 32-bit ones.
LDCONFIG_ABI_TAGS = {"x86_64": "x86-64", "aarch64": "AArch64", "ppc64le": "64bit"}


def parse_ldconfig(text: str, abi_tag: str | None = None) -> dict[str, list[str]]:
    """`ldconfig -p` as {soname: [paths]} for this machine's ABI (a 32-bit copy would never be loaded)."""
    tag = LDCONFIG_ABI_TAGS.get(platform.machine(), "") if abi_tag is None else abi_tag
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        match = re.match(r"\s+(\S+) \(([^)]*)\) => (\S+)", line)
        if match and tag in match.group(2):
            found.setdefault(match.group(1), []).append(match.group(3))
    return found


def locate_nccl(
    env_values: dict[str, str],
    site_dirs: Iterable[str],
    ldconfig: dict[str, list[str]],
    explicit_so_path: str | None = None,
) -> dict[str, Any]:
    """The libnccl.so.2 vLLM's processes would use, and why.

    Order, as vLLM picks it: VLLM_NCCL_SO_PATH (the module argument, else the value in the environment file
    the units load); else the nvidia-nccl-cu13 wheel's library next to torch in the venv (torch's RPATH finds
    it before the system's); else whatever libnccl.so.2 the dynamic linker knows (an apt libnccl2).
    `shadowed` lists the other copies present, because an apt libnccl2 next to the wheel is exactly the
    confusion that `dpkg -l | grep nccl` hides.
    """
    candidates: list[dict[str, str]] = []
    so_path = explicit_so_path or env_values.get("VLLM_NCCL_SO_PATH")
    if so_path:
        candidates.append({"source": "VLLM_NCCL_SO_PATH", "path": so_path})
    for site_dir in site_dirs:
        wheel_library = Path(site_dir) / NCCL_WHEEL_LIBRARY
        if wheel_library.exists():
            candidates.append({"source": "wheel", "path": str(wheel_library)})
    for path in ldconfig.get("libnccl.so.2", []):
        candidates.append({"source": "system", "path": path})
    if not candidates:
        return {"path": None, "source": None, "shadowed": [], "exists": False}
    chosen, others = candidates[0], candidates[1:]
    return {
        "path": chosen["path"],
        "source": chosen["source"],
        "exists": Path(chosen["path"]).exists(),
        "realpath": str(Path(chosen["path"]).resolve()),
        "shadowed": others,
    }


def read_nccl_version_code(library_path: str) -> int:
    """dlopen the library and call ncclGetVersion: the version of the code that will run, not of a package.

    ncclGetVersion needs no GPU and no communicator. Raises OSError when the library cannot be loaded or
    lacks the symbol, RuntimeError when NCCL returns an error code.
    """
    library = ctypes.CDLL(library_path)
    get_version = library.ncclGetVersion
    get_version.argtypes = [ctypes.POINTER(ctypes.c_int)]
    get_version.restype = ctypes.c_int
    code = ctypes.c_int(0)
    result = get_version(ctypes.byref(code))
    if result != 0:
        raise RuntimeError(f"ncclGetVersion returned error {result}")
    return code.value


# Run in a child interpreter: a library that crashes on load takes the child down, not the module.
_NCCL_PROBE_SCRIPT = """
import ctypes, json, sys
try:
    lib = ctypes.CDLL(sys.argv[1])
    fn = lib.ncclGetVersion
    fn.argtypes = [ctypes.POINTER(ctypes.c_int)]
    fn.restype = ctypes.c_int
    code = ctypes.c_int(0)
    rc = fn(ctypes.byref(code))
    print(json.dumps({"rc": rc, "code": code.value}))
except (OSError, AttributeError) as error:
    print(json.dumps({"error": str(error)}))
"""


def probe_nccl_version(library_path: str, python: str = sys.executable, timeout: int = 60) -> dict[str, Any]:
    """The library's real version, read by a child Python via ctypes; errors are reported, not raised."""
    try:
        completed = subprocess.run(
            [python, "-c", _NCCL_PROBE_SCRIPT, library_path],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as error:
        return {"version": None, "code": None, "error": f"probe did not run: {error}"}
    return interpret_nccl_probe(completed.returncode, completed.stdout, completed.stderr)


def interpret_nccl_probe(returncode: int, stdout: str, stderr: str) -> dict[str, Any]:
    """Turn the child's exit status and JSON line into {version, code, error}."""
    if returncode != 0:
        detail = (stderr.strip().splitlines() or [f"exit status {returncode}"])[-1]
        return {"version": None, "code": None, "error": f"probe failed: {detail}"}
    try:
        data = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"version": None, "code": None, "error": f"probe printed no result: {stdout!r}"}
    if "error" in data:
        return {"version": None, "code": None, "error": data["error"]}
    if data.get("rc"):
        return {"version": None, "code": None, "error": f"ncclGetVersion returned error {data['rc']}"}
    return {"version": nccl_version_from_code(data["code"]), "code": data["code"], "error": None}


# ---------------------------------------------------------------- the NCCL environment file


def parse_env_file(text: str) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """KEY=VALUE lines as systemd's EnvironmentFile= and a shell both read them.

    Blank lines and lines starting with '#' or ';' are skipped; an 'export ' prefix is allowed; a value in
    single quotes is taken literally, one in double quotes has \\" \\\\ \\$ escapes undone. Lines that are
    none of these come back in the second list, so a typo is reported instead of silently ignored.
    """
    values: dict[str, str] = {}
    invalid: list[dict[str, Any]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("export "):
            line = line[len("export ") :].lstrip()
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            invalid.append({"line": number, "text": raw})
            continue
        values[key] = _unquote(value.strip())
    return values, invalid


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] == "'":
        return value[1:-1]
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return re.sub(r'\\(["\\$`])', r"\1", value[1:-1])
    return value


# ---------------------------------------------------------------- interfaces


def gather_interfaces(run: Runner, sys_class_net: Path = SYS_CLASS_NET) -> dict[str, dict[str, Any]]:
    """Parity's view of kimi_node.read_links: one record per interface, operstate, up, IPv4 'address/prefix'.

    'up' is operstate up, or 'unknown' with the UP and LOWER_UP flags: loopback, tun and some IPoIB drivers
    never report a carrier state yet carry traffic. /sys/class/net's operstate wins over ip's; it is the
    authority on which names exist.
    """
    rc, ip_out, _ = run(list(IP_ADDR_COMMAND))
    interfaces = {}
    for name, link in read_links(ip_out if rc == 0 else "", sys_class_net).items():
        ip_link = link["ip"] or {}
        operstate = (link["sysfs"]["operstate"] if link["sysfs"] else ip_link.get("operstate", "unknown")).lower()
        flags = set(ip_link.get("flags", []))
        up = operstate == "up" or (operstate == "unknown" and {"UP", "LOWER_UP"} <= flags)
        interfaces[name] = {"operstate": operstate, "up": up, "ipv4": ip_link.get("ipv4", [])}
    return interfaces


def parse_interface_spec(spec: str) -> dict[str, Any]:
    """NCCL's interface-list syntax: 'ib0,ib1' are prefixes, '=ib0' exact names, '^docker,lo' exclusions.

    HCA entries may carry ':port' ('mlx5_0:1'); the port is not part of the device name.
    """
    text = spec.strip()
    exclude = text.startswith("^")
    text = text[1:] if exclude else text
    exact = text.startswith("=")
    text = text[1:] if exact else text
    entries = [item.strip().split(":", 1)[0] for item in text.split(",") if item.strip()]
    return {"exclude": exclude, "exact": exact, "entries": entries}


def check_interface_spec(
    spec: str, interfaces: dict[str, dict[str, Any]], need_ipv4: bool = True, exact: bool = False
) -> dict[str, Any]:
    """Whether an interface setting names something usable on this node.

    Every listed entry must match at least one interface that is up (and has an IPv4 address when
    ``need_ipv4``); for an exclusion list, at least one non-loopback usable interface must remain.
    ``exact`` forces exact names (gloo does not do prefixes). Returns ok, matched names, a short status for
    tables ('ok', 'missing ib0', 'down ib0', 'no IPv4 eth1') and the problem in words.
    """
    parsed = parse_interface_spec(spec)
    exact = exact or parsed["exact"]

    def matches(name: str, entry: str) -> bool:
        return name == entry if exact else name.startswith(entry)

    def usable(name: str) -> bool:
        record = interfaces[name]
        return record.get("up", False) and (bool(record.get("ipv4")) or not need_ipv4)

    present = sorted(interfaces)
    result: dict[str, Any] = {"spec": spec, "ok": True, "status": "ok", "matched": [], "problem": None}
    if not parsed["entries"]:
        return {**result, "ok": False, "status": "empty", "problem": "empty interface list"}
    if parsed["exclude"]:
        remaining = [n for n in present if n != "lo" and not any(matches(n, e) for e in parsed["entries"])]
        result["matched"] = [n for n in remaining if usable(n)]
        if not result["matched"]:
            problem = f"excludes every usable interface (present: {', '.join(present)})"
            result.update(ok=False, status="excludes all", problem=problem)
        return result
    problems, statuses = [], []
    for entry in parsed["entries"]:
        found = [name for name in present if matches(name, entry)]
        result["matched"].extend(found)
        if not found:
            problems.append(f"{entry} matches no interface (present: {', '.join(present) or 'none'})")
            statuses.append(f"missing {entry}")
        elif not any(usable(name) for name in found):
            states = [_describe_interface(name, interfaces[name], need_ipv4) for name in found]
            problems.append(f"{entry} is not usable ({', '.join(states)})")
            down = not any(interfaces[name].get("up") for name in found)
            statuses.append(f"{'down' if down else 'no IPv4'} {entry}")
    if problems:
        result.update(ok=False, status=", ".join(statuses), problem="; ".join(problems))
    return result


def _describe_interface(name: str, record: dict[str, Any], need_ipv4: bool) -> str:
    if not record.get("up"):
        return f"{name} is {record.get('operstate', 'down')}"
    if need_ipv4 and not record.get("ipv4"):
        return f"{name} has no IPv4 address"
    return f"{name} ok"


def check_env_interfaces(
    env_values: dict[str, str],
    interfaces: dict[str, dict[str, Any]],
    hcas: list[str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Check every interface-naming variable set in the NCCL environment file against this node."""
    checks = {}
    for key in INTERFACE_ENV_KEYS:
        if env_values.get(key):
            checks[key] = check_interface_spec(env_values[key], interfaces, exact=key == "GLOO_SOCKET_IFNAME")
    if env_values.get(HCA_ENV_KEY) and hcas is not None:
        # InfiniBand devices have no operstate or address of their own: existing is what counts.
        devices = {name: {"up": True, "ipv4": [], "operstate": "up"} for name in hcas}
        checks[HCA_ENV_KEY] = check_interface_spec(env_values[HCA_ENV_KEY], devices, need_ipv4=False)
    return checks


# ---------------------------------------------------------------- os and python


def parse_os_release(text: str) -> dict[str, str]:
    values, _ = parse_env_file(text)
    return {"id": values.get("ID", ""), "version_id": values.get("VERSION_ID", ""), "name": values.get("NAME", "")}


# ---------------------------------------------------------------- gathering (the only part that runs things)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def gather_debs(run: Runner, patterns: Iterable[str]) -> tuple[dict[str, dict[str, Any]], str | None]:
    """dpkg state of the given names/globs; dpkg-query exits 1 when some pattern matches nothing."""
    patterns = list(patterns)
    rc, out, err = run(["dpkg-query", "-W", "-f", DPKG_QUERY_FORMAT, *patterns])
    error = None if rc in (0, 1) else (err.strip() or f"dpkg-query exit status {rc}")
    hold_rc, hold_out, _ = run(["apt-mark", "showhold"])
    holds = parse_showhold(hold_out) if hold_rc == 0 else set()
    return deb_facts(parse_dpkg_query(out), holds, patterns), error


def gather_driver(
    run: Runner,
    debs: dict[str, dict[str, Any]],
    nvidia_smi: str | None,
    proc_version: Path = PROC_DRIVER_VERSION,
) -> dict[str, Any]:
    """Driver version from the loaded kernel module, else nvidia-smi, else the installed driver deb."""
    driver: dict[str, Any] = {"version": None, "source": None, "gpus": []}
    proc_text = _read(proc_version)
    if proc_text:
        driver.update(version=parse_proc_driver_version(proc_text), source=str(proc_version))
    if nvidia_smi:
        rc, out, err = run([nvidia_smi, "--query-gpu=name,driver_version", "--format=csv,noheader"])
        if rc == 0:
            driver["gpus"] = parse_nvidia_smi_gpus(out)
            smi_versions = sorted({gpu["driver_version"] for gpu in driver["gpus"]})
            driver["nvidia_smi_version"] = ", ".join(smi_versions) or None
            if not driver["version"] and smi_versions:
                driver.update(version=smi_versions[0], source="nvidia-smi")
        else:
            driver["nvidia_smi_error"] = (err or out).strip()
    if not driver["version"]:
        driver_debs = [(n, e) for n, e in debs.items() if DRIVER_DEB.match(n) and e["installed"]]
        if driver_debs:
            name, entry = driver_debs[0]
            driver.update(version=upstream_version(entry["version"]), source=f"deb {name}")
    return driver


def gather_fabric_manager(run: Runner, debs: dict[str, dict[str, Any]], binary: str | None) -> dict[str, Any]:
    fabric = fabric_manager_from_debs(debs) or {"package": None, "version": None, "deb_version": None}
    if binary:
        rc, out, _ = run([binary, "--version"])
        if rc == 0:
            fabric["binary_version"] = parse_fabric_manager_version(out)
            fabric["version"] = fabric["version"] or fabric["binary_version"]
    return fabric


def gather_venv(run: Runner, venv_path: str) -> dict[str, Any]:
    """Python version and installed distributions of the vLLM venv, read by its own interpreter."""
    python = Path(venv_path) / "bin" / "python"
    venv: dict[str, Any] = {"path": venv_path, "exists": python.exists(), "python": None, "packages": {}}
    if not venv["exists"]:
        return venv
    venv["realpath"] = str(Path(venv_path).resolve())
    rc, out, err = run([str(python), "-c", VENV_PROBE_SCRIPT])
    if rc == 0:
        probe = parse_venv_probe(out)
        venv.update(python=probe["python"], site_dirs=probe["site_dirs"], packages=probe["packages"])
        return venv
    venv["error"] = (err or out).strip().splitlines()[-1:] or [f"exit status {rc}"]
    rc, out, _ = run([str(python), "-m", "pip", "list", "--format=json"])
    if rc == 0:
        venv["packages"] = parse_pip_list_json(out)
        venv["site_dirs"] = sorted(str(p) for p in Path(venv_path).glob("lib/python*/site-packages"))
    return venv


def gather_nccl_env(
    env_file: str, interfaces: dict[str, dict[str, Any]], ib_root: Path = Path("/sys/class/infiniband")
) -> dict[str, Any]:
    hcas = sorted(p.name for p in ib_root.iterdir()) if ib_root.is_dir() else []
    text = _read(Path(env_file))
    if text is None:
        return {
            "path": env_file,
            "exists": False,
            "values": {},
            "invalid_lines": [],
            "infiniband_devices": hcas,
            "checks": {},
        }
    values, invalid = parse_env_file(text)
    return {
        "path": env_file,
        "exists": True,
        "values": values,
        "invalid_lines": invalid,
        "infiniband_devices": hcas,
        "checks": check_env_interfaces(values, interfaces, hcas),
    }


def gather(
    run: Runner,
    venv_path: str,
    nccl_env_file: str,
    deb_patterns: Iterable[str] = DEFAULT_DEB_PATTERNS,
    vllm_nccl_so_path: str | None = None,
    nvidia_smi: str | None = None,
    fabric_manager_binary: str | None = None,
    probe_nccl: bool = True,
    proc_driver_version: Path = PROC_DRIVER_VERSION,
    cuda_root: Path = Path("/usr/local"),
    sys_class_net: Path = SYS_CLASS_NET,
) -> dict[str, Any]:
    """Every fact parity compares, for this node, in one pass (the paths are parameters for tests)."""
    debs, dpkg_error = gather_debs(run, deb_patterns)
    interfaces = gather_interfaces(run, sys_class_net)
    nccl_env = gather_nccl_env(nccl_env_file, interfaces)
    venv = gather_venv(run, venv_path)
    rc, ld_out, _ = run(["ldconfig", "-p"])
    nccl = locate_nccl(
        nccl_env["values"], venv.get("site_dirs", []), parse_ldconfig(ld_out) if rc == 0 else {}, vllm_nccl_so_path
    )
    if nccl["path"] and probe_nccl:
        nccl.update(probe_nccl_version(nccl["path"]))
    return {
        "schema": FACTS_SCHEMA,
        "hostname": socket.gethostname(),
        "kernel": platform.release(),
        "os": parse_os_release(_read(Path("/etc/os-release")) or ""),
        "python": platform.python_version(),
        "debs": debs,
        "dpkg_error": dpkg_error,
        "driver": gather_driver(run, debs, nvidia_smi, proc_driver_version),
        "fabric_manager": gather_fabric_manager(run, debs, fabric_manager_binary),
        "cuda": cuda_installs(cuda_root),
        "venv": venv,
        "nccl": nccl,
        "nccl_env": nccl_env,
        "interfaces": interfaces,
    }


def subprocess_runner(argv: list[str]) -> tuple[int, str, str]:
    """A Runner over subprocess (for CLIs and tests; the Ansible module passes module.run_command)."""
    try:
        completed = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    except (OSError, subprocess.SubprocessError) as error:
        return 127, "", str(error)
    return completed.returncode, completed.stdout, completed.stderr
