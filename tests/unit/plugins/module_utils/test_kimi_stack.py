"""The stack facts: parsers fed recorded output, and the NCCL version read for real from a compiled library."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.kimi.k2.plugins.module_utils import kimi_stack
from ansible_collections.kimi.k2.plugins.module_utils.kimi_stack import (
    check_env_interfaces,
    check_interface_spec,
    cuda_installs,
    deb_facts,
    fabric_manager_from_debs,
    gather_interfaces,
    interpret_nccl_probe,
    locate_nccl,
    nccl_version_from_code,
    parse_cuda_version_json,
    parse_dpkg_query,
    parse_env_file,
    parse_ldconfig,
    parse_nvidia_smi_gpus,
    parse_pip_list_json,
    parse_proc_driver_version,
    parse_showhold,
    parse_venv_probe,
    probe_nccl_version,
    read_nccl_version_code,
    upstream_version,
)

from tests import paths

FIXTURES = paths.FIXTURES / "stack"
NCCL_STUB = """
int ncclGetVersion(int *version) {
    if (!version) return 4;
    *version = NCCL_CODE;
    return NCCL_RESULT;
}
"""


def compile_library(directory: Path, name: str, source: str, defines: dict[str, int]) -> Path:
    """A real shared library built with gcc, so dlopen and ctypes run exactly as on a node."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the stub library")
    source_file = directory / f"{name}.c"
    source_file.write_text(source)
    library = directory / name
    flags = [f"-D{key}={value}" for key, value in defines.items()]
    subprocess.run(["gcc", "-shared", "-fPIC", *flags, "-o", str(library), str(source_file)], check=True)
    return library


@pytest.fixture
def nccl_library(tmp_path):
    return compile_library(tmp_path, "libnccl.so.2", NCCL_STUB, {"NCCL_CODE": 23007, "NCCL_RESULT": 0})


# ---------------------------------------------------------------- versions


@pytest.mark.parametrize(
    ("code", "text"),
    [(23007, "2.30.7"), (22809, "2.28.9"), (21903, "2.19.3"), (2804, "2.8.4"), (2708, "2.7.8"), (30001, "3.0.1")],
)
def test_nccl_codes_decode_both_encodings(code, text):
    assert nccl_version_from_code(code) == text


@pytest.mark.parametrize(
    ("deb", "upstream"),
    [
        ("2.30.7-1+cuda13.3", "2.30.7"),
        ("580.95.05-1", "580.95.05"),
        ("1:580.95.05-0ubuntu1", "580.95.05"),
        ("13.3.0-1", "13.3.0"),
        ("590.44.01", "590.44.01"),
        (None, None),
    ],
)
def test_upstream_version_drops_epoch_and_revision(deb, upstream):
    assert upstream_version(deb) == upstream


# ---------------------------------------------------------------- dpkg (recorded output)


def test_dpkg_query_of_a_pinned_and_held_node():
    dpkg = parse_dpkg_query((FIXTURES / "dpkg" / "node1.dpkg-query.txt").read_text())
    holds = parse_showhold((FIXTURES / "dpkg" / "node1.showhold.txt").read_text())
    debs = deb_facts(dpkg, holds, ["libnccl2", "libnccl-dev", "nvidia-fabricmanager*"])
    assert debs["libnccl2"] == {
        "installed": True,
        "version": "2.30.7-1+cuda13.3",
        "held": True,
        "status": "hold ok installed",
    }
    assert debs["libnccl-dev"]["installed"] and debs["libnccl-dev"]["held"]
    assert debs["cuda-toolkit-13-3"]["version"] == "13.3.0-1"
    assert "nvidia-fabricmanager*" not in debs  # a glob is a query, not a package
    fabric = fabric_manager_from_debs(debs)
    assert fabric == {
        "package": "nvidia-fabricmanager-580",
        "deb_version": "580.95.05-1",
        "version": "580.95.05",
        "held": True,
        "others": [],
    }


def test_dpkg_query_of_a_drifted_node_reports_absent_and_unheld():
    dpkg = parse_dpkg_query((FIXTURES / "dpkg" / "drifted.dpkg-query.txt").read_text())
    holds = parse_showhold((FIXTURES / "dpkg" / "drifted.showhold.txt").read_text())
    debs = deb_facts(dpkg, holds, ["libnccl2", "libnccl-dev"])
    assert debs["libnccl2"]["version"] == "2.30.5-1+cuda13.3"
    assert debs["libnccl2"]["held"] is False
    assert debs["libnccl-dev"] == {"installed": False, "version": None, "held": False, "status": "not-installed"}
    assert fabric_manager_from_debs(debs)["version"] == "590.44.01"


def test_removed_package_with_config_files_is_not_installed():
    dpkg = parse_dpkg_query("libnccl2\t2.30.7-1+cuda13.3\tdeinstall ok config-files\n")
    debs = deb_facts(dpkg, set(), ["libnccl2"])
    assert debs["libnccl2"]["installed"] is False
    assert debs["libnccl2"]["version"] is None


# ---------------------------------------------------------------- driver and CUDA

PROC_DRIVER_OPEN = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  "
    "(dvs-builder@U16-I3-B03-4-3)  Tue Sep 23 09:55:41 UTC 2025\n"
    "GCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)\n"
)
PROC_DRIVER_PROPRIETARY = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.127.05  Tue Oct  8 03:12:00 UTC 2024\n"
    "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n"
)


def test_driver_version_from_proc_banner():
    assert parse_proc_driver_version(PROC_DRIVER_OPEN) == "580.95.05"
    assert parse_proc_driver_version(PROC_DRIVER_PROPRIETARY) == "550.127.05"
    assert parse_proc_driver_version("garbage") is None


def test_nvidia_smi_gpu_list():
    gpus = parse_nvidia_smi_gpus("NVIDIA H100 80GB HBM3, 580.95.05\nNVIDIA H100 80GB HBM3, 580.95.05\n")
    assert gpus == [{"name": "NVIDIA H100 80GB HBM3", "driver_version": "580.95.05"}] * 2


def test_cuda_version_json_and_install_tree(tmp_path):
    version_json = json.dumps(
        {"cuda": {"name": "CUDA SDK", "version": "13.3.0"}, "cuda_cudart": {"version": "13.3.40"}}
    )
    assert parse_cuda_version_json(version_json) == {"toolkit_version": "13.3.0", "cudart_version": "13.3.40"}
    tree = tmp_path / "cuda-13.3"
    (tree / "targets" / "x86_64-linux" / "lib").mkdir(parents=True)
    (tree / "version.json").write_text(version_json)
    (tree / "targets" / "x86_64-linux" / "lib" / "libcudart.so.13.3.40").write_bytes(b"")
    (tree / "lib64").symlink_to("targets/x86_64-linux/lib")
    (tree / "lib64" / "libcudart.so.13").symlink_to("libcudart.so.13.3.40")
    bare = tmp_path / "cuda-12.8"  # no version.json: fall back to the names
    (bare / "lib64").mkdir(parents=True)
    (bare / "lib64" / "libcudart.so.12.8.90").write_bytes(b"")
    (tmp_path / "cuda").symlink_to(tree)
    cuda = cuda_installs(tmp_path)
    assert cuda["default_path"] == str(tree)
    assert (cuda["toolkit_version"], cuda["cudart_version"]) == ("13.3.0", "13.3.40")
    by_path = {entry["path"]: entry for entry in cuda["installs"]}
    assert by_path[str(tree)]["libcudart"] == ["libcudart.so.13.3.40"]
    assert by_path[str(bare)]["toolkit_version"] == "12.8"
    assert by_path[str(bare)]["cudart_version"] == "12.8.90"


# ---------------------------------------------------------------- venv packages


def test_venv_probe_runs_in_a_real_interpreter_and_normalises_names():
    completed = subprocess.run(
        [sys.executable, "-c", kimi_stack.VENV_PROBE_SCRIPT], capture_output=True, text=True, check=True
    )
    probe = parse_venv_probe(completed.stdout)
    assert probe["python"] == ".".join(map(str, sys.version_info[:3]))
    assert probe["packages"]["ansible-core"]  # the dev venv's own
    assert all(name == name.lower() and "_" not in name for name in probe["packages"])


def test_venv_probe_reports_the_copy_python_imports_when_a_distribution_is_installed_twice(tmp_path):
    """Two copies of one distribution on sys.path: the first is the one `import` loads, and the one the vllm
    role's read_installed.yml reports, so parity must read the same one."""
    for site, version in (("first", "2.28.9"), ("second", "2.30.4")):
        info = tmp_path / site / f"nvidia_nccl_cu13-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: nvidia_nccl_cu13\nVersion: {version}\n")
    env = {"PYTHONPATH": f"{tmp_path / 'first'}:{tmp_path / 'second'}", "PATH": "/usr/bin:/bin"}
    completed = subprocess.run(
        [sys.executable, "-c", kimi_stack.VENV_PROBE_SCRIPT], capture_output=True, text=True, check=True, env=env
    )
    assert parse_venv_probe(completed.stdout)["packages"]["nvidia-nccl-cu13"] == "2.28.9"


def test_pip_list_json_fallback():
    text = '[{"name": "nvidia_nccl_cu13", "version": "2.28.9"}, {"name": "Torch", "version": "2.11.0"}]'
    assert parse_pip_list_json(text) == {"nvidia-nccl-cu13": "2.28.9", "torch": "2.11.0"}


# ---------------------------------------------------------------- NCCL: which library, and its real version


def test_ncclgetversion_read_through_ctypes(nccl_library):
    assert read_nccl_version_code(str(nccl_library)) == 23007


def test_probe_in_a_child_python_reports_version(nccl_library):
    assert probe_nccl_version(str(nccl_library)) == {"version": "2.30.7", "code": 23007, "error": None}


def test_probe_reports_old_encoding(tmp_path):
    library = compile_library(tmp_path, "libnccl-old.so", NCCL_STUB, {"NCCL_CODE": 2708, "NCCL_RESULT": 0})
    assert probe_nccl_version(str(library))["version"] == "2.7.8"


def test_probe_reports_missing_symbol_and_nccl_error(tmp_path):
    no_symbol = compile_library(tmp_path, "libother.so", "int other(void) { return 1; }", {})
    result = probe_nccl_version(str(no_symbol))
    assert result["version"] is None
    assert "ncclGetVersion" in result["error"]
    failing = compile_library(tmp_path, "libfail.so", NCCL_STUB, {"NCCL_CODE": 1, "NCCL_RESULT": 3})
    assert probe_nccl_version(str(failing))["error"] == "ncclGetVersion returned error 3"
    assert "cannot open" in probe_nccl_version(str(tmp_path / "absent.so"))["error"]


def test_probe_interpretation_of_a_crashed_child():
    assert interpret_nccl_probe(-11, "", "")["error"] == "probe failed: exit status -11"


def wheel_site(tmp_path: Path, library: Path) -> Path:
    site = tmp_path / "venv" / "lib" / "python3.12" / "site-packages"
    (site / "nvidia" / "nccl" / "lib").mkdir(parents=True)
    shutil.copy(library, site / "nvidia" / "nccl" / "lib" / "libnccl.so.2")
    return site


LDCONFIG_WITH_NCCL = (
    "3 libs found in cache `/etc/ld.so.cache'\n"
    "\tlibnccl.so.2 (libc6,x86-64) => /lib/x86_64-linux-gnu/libnccl.so.2\n"
    "\tlibnccl.so.2 (libc6) => /lib/i386-linux-gnu/libnccl.so.2\n"
    "\tlibnccl.so (libc6,x86-64) => /lib/x86_64-linux-gnu/libnccl.so\n"
)


def test_ldconfig_keeps_only_this_abi():
    found = parse_ldconfig(LDCONFIG_WITH_NCCL, abi_tag="x86-64")
    assert found["libnccl.so.2"] == ["/lib/x86_64-linux-gnu/libnccl.so.2"]
    recorded = parse_ldconfig((FIXTURES / "system" / "ldconfig-p.txt").read_text(), abi_tag="x86-64")
    assert recorded and "libnccl.so.2" not in recorded


def test_wheel_nccl_wins_over_the_apt_one_and_the_apt_one_is_reported(tmp_path, nccl_library):
    site = wheel_site(tmp_path, nccl_library)
    found = locate_nccl({}, [str(site)], parse_ldconfig(LDCONFIG_WITH_NCCL, abi_tag="x86-64"))
    assert found["source"] == "wheel"
    assert found["path"] == str(site / "nvidia" / "nccl" / "lib" / "libnccl.so.2")
    assert found["shadowed"] == [{"source": "system", "path": "/lib/x86_64-linux-gnu/libnccl.so.2"}]


def test_vllm_nccl_so_path_is_honoured_first(tmp_path, nccl_library):
    site = wheel_site(tmp_path, nccl_library)
    found = locate_nccl({"VLLM_NCCL_SO_PATH": "/opt/nccl/libnccl.so.2"}, [str(site)], {})
    assert (found["source"], found["path"], found["exists"]) == ("VLLM_NCCL_SO_PATH", "/opt/nccl/libnccl.so.2", False)
    explicit = locate_nccl({"VLLM_NCCL_SO_PATH": "/a"}, [], {}, explicit_so_path=str(nccl_library))
    assert explicit["path"] == str(nccl_library)


def test_system_nccl_when_the_venv_has_no_wheel():
    found = locate_nccl({}, ["/nonexistent/site-packages"], parse_ldconfig(LDCONFIG_WITH_NCCL, abi_tag="x86-64"))
    assert (found["source"], found["path"]) == ("system", "/lib/x86_64-linux-gnu/libnccl.so.2")
    assert locate_nccl({}, [], {})["path"] is None


# ---------------------------------------------------------------- the NCCL environment file


def test_env_file_with_comments_quotes_and_exports():
    text = (
        "# NCCL settings the vLLM units load\n"
        "; systemd also takes semicolon comments\n"
        "\n"
        "NCCL_SOCKET_IFNAME=ib0\n"
        'export GLOO_SOCKET_IFNAME="ib0"\n'
        "NCCL_IB_HCA='mlx5'\n"
        'NCCL_DEBUG_SUBSYS="INIT,\\"NET\\""\n'
        "  NCCL_DEBUG = INFO  \n"
        "this line is wrong\n"
        "1BAD=x\n"
    )
    values, invalid = parse_env_file(text)
    assert values == {
        "NCCL_SOCKET_IFNAME": "ib0",
        "GLOO_SOCKET_IFNAME": "ib0",
        "NCCL_IB_HCA": "mlx5",
        "NCCL_DEBUG_SUBSYS": 'INIT,"NET"',
        "NCCL_DEBUG": "INFO",
    }
    assert [entry["line"] for entry in invalid] == [9, 10]


# ---------------------------------------------------------------- interfaces


def test_ip_json_recorded_output(tmp_path):
    recorded = (FIXTURES / "system" / "ip-j-addr.json").read_text()
    # No /sys/class/net here, so every state is ip's own.
    interfaces = gather_interfaces(lambda argv: (0, recorded, ""), sys_class_net=tmp_path / "absent")
    assert interfaces["lo"]["up"] is True  # operstate unknown, but UP and LOWER_UP
    assert interfaces["lo"]["ipv4"] == ["127.0.0.1/8"]
    assert interfaces["eth0"]["up"] is True
    assert interfaces["eth0"]["ipv4"]
    assert interfaces["ifb0"]["up"] is False


LAB_INTERFACES = {
    "host0": {"operstate": "up", "up": True, "ipv4": ["198.18.0.11/24"]},
    "ib0": {"operstate": "down", "up": False, "ipv4": ["10.0.0.1/24"]},
    "eth1": {"operstate": "up", "up": True, "ipv4": []},
    "lo": {"operstate": "unknown", "up": True, "ipv4": ["127.0.0.1/8"]},
}


@pytest.mark.parametrize(
    ("spec", "ok", "problem_part"),
    [
        ("host0", True, None),
        ("host", True, None),  # NCCL matches prefixes
        ("=host", False, "host matches no interface"),
        ("ib0", False, "ib0 is down"),
        ("eth1", False, "eth1 has no IPv4 address"),
        ("enp9s0", False, "enp9s0 matches no interface (present: eth1, host0, ib0, lo)"),
        ("host0,ens", False, "ens matches no interface"),
        ("^docker,lo", True, None),
        ("^host,eth,ib", False, "excludes every usable interface"),
    ],
)
def test_interface_specs_follow_nccl_syntax(spec, ok, problem_part):
    result = check_interface_spec(spec, LAB_INTERFACES)
    assert result["ok"] is ok
    if problem_part:
        assert problem_part in result["problem"]


def test_env_interface_checks_gloo_exact_and_hca_devices():
    values = {"NCCL_SOCKET_IFNAME": "host", "GLOO_SOCKET_IFNAME": "host", "NCCL_IB_HCA": "mlx5_0:1,mlx5_1:1"}
    checks = check_env_interfaces(values, LAB_INTERFACES, hcas=["mlx5_0"])
    assert checks["NCCL_SOCKET_IFNAME"]["ok"] is True
    assert checks["GLOO_SOCKET_IFNAME"]["ok"] is False  # gloo wants the exact name
    assert checks["NCCL_IB_HCA"]["ok"] is False
    assert "mlx5_1 matches no interface" in checks["NCCL_IB_HCA"]["problem"]


# ---------------------------------------------------------------- gather, with recorded commands


def test_gather_with_recorded_commands_and_a_real_library(tmp_path, nccl_library):
    site = wheel_site(tmp_path, nccl_library)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir()
    (venv / "bin" / "python").write_text("")  # only its existence is checked; the runner answers for it
    env_file = tmp_path / "nccl.env"
    env_file.write_text("NCCL_SOCKET_IFNAME=lo\nGLOO_SOCKET_IFNAME=no-such-if0\n")
    probe = {"python": "3.12.3", "prefix": str(venv), "site_dirs": [str(site)], "packages": {"Torch": "2.11.0"}}
    answers = {
        "dpkg-query": (1, (FIXTURES / "dpkg" / "node1.dpkg-query.txt").read_text(), "no packages found"),
        "apt-mark": (0, (FIXTURES / "dpkg" / "node1.showhold.txt").read_text(), ""),
        "ip": (0, (FIXTURES / "system" / "ip-j-addr.json").read_text(), ""),
        "ldconfig": (0, LDCONFIG_WITH_NCCL, ""),
        str(venv / "bin" / "python"): (0, json.dumps(probe), ""),
    }
    calls = []

    def run(argv):
        calls.append(argv)
        return answers[argv[0]]

    facts = kimi_stack.gather(
        run,
        venv_path=str(venv),
        nccl_env_file=str(env_file),
        proc_driver_version=tmp_path / "no-driver-loaded",
        cuda_root=tmp_path,
    )
    assert facts["debs"]["libnccl2"]["held"] is True
    assert facts["venv"]["packages"] == {"torch": "2.11.0"}
    assert facts["venv"]["python"] == "3.12.3"
    assert facts["nccl"]["source"] == "wheel"
    assert facts["nccl"]["version"] == "2.30.7"  # read from the library, not from a package database
    assert facts["nccl"]["shadowed"][0]["source"] == "system"
    assert facts["driver"] == {"version": "580.95.05", "source": "deb nvidia-driver-580", "gpus": []}
    assert facts["fabric_manager"]["version"] == "580.95.05"
    assert facts["nccl_env"]["checks"]["NCCL_SOCKET_IFNAME"]["ok"] is True
    assert facts["nccl_env"]["checks"]["GLOO_SOCKET_IFNAME"]["ok"] is False
    assert facts["cuda"] == {"default_path": None, "toolkit_version": None, "cudart_version": None, "installs": []}
    assert ["apt-mark", "showhold"] in calls


def test_gather_prefers_the_loaded_kernel_module(tmp_path):
    proc = tmp_path / "version"
    proc.write_text(PROC_DRIVER_OPEN)
    smi = "NVIDIA H200, 580.95.05\n"
    driver = kimi_stack.gather_driver(lambda argv: (0, smi, ""), {}, "/usr/bin/nvidia-smi", proc)
    assert driver["version"] == "580.95.05"
    assert driver["source"] == str(proc)
    assert driver["nvidia_smi_version"] == "580.95.05"
    assert driver["gpus"] == [{"name": "NVIDIA H200", "driver_version": "580.95.05"}]


def key_shape(value, depth=2):
    """Nested key names down to ``depth`` (the structure, not the values)."""
    if not isinstance(value, dict) or depth == 0:
        return None
    return {key: key_shape(item, depth - 1) for key, item in value.items()}


def test_gather_runs_for_real_here_and_the_recorded_node_facts_have_its_shape(tmp_path):
    """The real commands (dpkg-query, apt-mark, ip, ldconfig) on this machine, without root."""
    facts = kimi_stack.gather(
        kimi_stack.subprocess_runner, venv_path=sys.prefix, nccl_env_file=str(tmp_path / "absent.env")
    )
    assert facts["venv"]["python"] == ".".join(map(str, sys.version_info[:3]))
    assert "lo" in facts["interfaces"]
    assert facts["nccl_env"]["exists"] is False
    recorded = json.loads((FIXTURES / "facts" / "node1.json").read_text())
    live_top, recorded_top = key_shape(facts, 1), key_shape(recorded, 1)
    assert live_top == recorded_top
    for section in ("venv", "nccl_env", "fabric_manager"):
        assert set(recorded[section]) <= set(facts[section]) | {"realpath", "site_dirs", "held", "others"}
