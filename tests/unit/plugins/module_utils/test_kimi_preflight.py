from __future__ import annotations

import copy
import socket

import pytest
from ansible_collections.kimi.k2.plugins.module_utils.kimi_apt_sources import read_apt_sources
from ansible_collections.kimi.k2.plugins.module_utils.kimi_node import (
    directory_bytes,
    filesystem_usage,
    interfaces,
    memory_total_bytes,
    port_status,
    unit_from_cgroup,
)
from ansible_collections.kimi.k2.plugins.module_utils.kimi_preflight import (
    CHECKS,
    GIB,
    HostExpectation,
    Requirements,
    evaluate,
    on_mirror,
)

from tests.paths import FIXTURES

H100_MIB = 81559


def h100_node_facts() -> dict:
    return {
        "memory_total_bytes": 2048 * GIB,
        "cpu_count": 224,
        "data": {
            "path": "/data",
            "exists": True,
            "measured_at": "/data",
            "total_bytes": 4000 * GIB,
            "free_bytes": 3000 * GIB,
        },
        "checkpoint_dir_bytes": 0,
        "shm": {"total_bytes": 1024 * GIB},
        "interfaces": {
            "lo": {"operstate": "unknown", "up": True, "ipv4": ["127.0.0.1"]},
            "ib0": {"operstate": "up", "up": True, "ipv4": ["10.20.0.11"]},
        },
        "ports": {"8000": {"port": 8000, "free": True, "holders": []}},
        "processes": {},
    }


def h100_gpu_facts() -> dict:
    gpus = [{"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": H100_MIB, "driver_version": "580.95.05"}] * 8
    return {"gpus": gpus, "compute_processes": []}


def nvidia_requirements(**changes) -> Requirements:
    values = {
        "accelerator": "nvidia",
        "gpus_per_node": 8,
        "gpu": "h100-80gb",
        "model": "kimi-k2.7-code",
        "driver_version_prefix": "580.",
        "shm_min_bytes": 16 * GIB,
        "data_required_bytes": 0,
        "data_margin_bytes": 50 * GIB,
        "interfaces": ["ib0"],
        "own_units": ["kimi-*.service"],
    }
    values.update(changes)
    return Requirements(**values)


def judge(req=None, node=None, gpu=None, host_ip="10.20.0.11", ports=None):
    expect = {"gn1": HostExpectation(host_ip=host_ip, ports=ports or {8000: "API"})}
    return evaluate(
        req or nvidia_requirements(), expect, {"gn1": node or h100_node_facts()}, {"gn1": gpu or h100_gpu_facts()}
    )


def test_a_healthy_h100_node_passes_every_check():
    verdict = judge()
    assert verdict["passed"], verdict["failures"]
    # Without an offline mirror the apt sources are the node's own business: not applicable, like a CPU's driver.
    statuses = {name: cell["status"] for name, cell in verdict["table"]["gn1"].items()}
    assert statuses == {**dict.fromkeys(CHECKS, "ok"), "apt_sources": "n/a"}
    assert verdict["summary_lines"][0].split() == [
        "node",
        "devices",
        "driver",
        "memory",
        "shm",
        "data_disk",
        "interfaces",
        "host_ip",
        "ports",
        "device_processes",
        "apt_sources",
    ]


def test_missing_gpu_is_named_with_both_counts():
    gpu = h100_gpu_facts()
    gpu["gpus"] = gpu["gpus"][:7]
    verdict = judge(gpu=gpu)
    assert verdict["failures"] == ["gn1: devices: GPUs: need 8, nvidia-smi lists 7"]


def test_other_gpu_model_or_less_memory_than_the_preset_fails():
    gpu = h100_gpu_facts()
    gpu["gpus"] = [{**gpu["gpus"][0], "name": "NVIDIA H100 PCIe"}] * 8
    assert judge(gpu=gpu)["failures"] == [
        "gn1: devices: GPU model: kimi_gpu h100-80gb is 'NVIDIA H100 80GB HBM3', found 'NVIDIA H100 PCIe'"
    ]
    gpu["gpus"] = [{**gpu["gpus"][0], "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 40000}] * 8
    assert "plans 81559 MiB, smallest GPU has 40000 MiB" in judge(gpu=gpu)["failures"][0]


def test_unknown_checkpoint_size_is_a_clear_failure():
    verdict = judge(req=nvidia_requirements(model="/nowhere/config.json"))
    assert any("set kimi_checkpoint_bytes" in f for f in verdict["failures"])


def test_wrong_driver_branch_fails():
    verdict = judge(req=nvidia_requirements(driver_version_prefix="590."))
    assert "gn1: driver: driver: need 590.*, found 580.95.05" in verdict["failures"]


def test_small_disk_names_needed_and_available_bytes():
    node = h100_node_facts()
    node["data"]["free_bytes"] = 100 * GIB
    verdict = judge(node=node)
    (failure,) = verdict["failures"]
    needed = 595_177_988_208 + 50 * GIB
    assert failure.startswith(f"gn1: data_disk: disk /data: need {needed:,} B")
    assert f"available {100 * GIB:,} B" in failure


def test_checkpoint_already_on_disk_only_needs_the_rest():
    node = h100_node_facts()
    node["data"]["free_bytes"] = 60 * GIB
    node["checkpoint_dir_bytes"] = 595_177_988_208
    assert judge(node=node)["passed"]


def test_wrong_interface_name_lists_what_exists():
    verdict = judge(req=nvidia_requirements(interfaces=["ib1"]))
    assert any("interface ib1 does not exist (node has: ib0, lo)" in f for f in verdict["failures"])


def test_interface_down_or_without_ipv4_fails():
    node = h100_node_facts()
    node["interfaces"]["ib0"] = {"operstate": "down", "up": False, "ipv4": []}
    verdict = judge(node=node)
    assert any("interface ib0 is down, not up" in f for f in verdict["failures"])


def test_host_ip_must_belong_to_the_node():
    verdict = judge(host_ip="10.20.0.99")
    assert (
        "gn1: host_ip: VLLM_HOST_IP 10.20.0.99 is not an address of this node (10.20.0.11, 127.0.0.1)"
        in (verdict["failures"])
    )


def test_port_taken_by_a_stranger_names_the_pid_but_our_own_unit_is_fine():
    node = h100_node_facts()
    holder = {"pid": 4242, "cmdline": "python -m http.server 8000", "unit": "session-3.scope", "exists": True}
    node["ports"]["8000"] = {"port": 8000, "free": False, "holders": [holder]}
    verdict = judge(node=node)
    assert verdict["failures"] == ["gn1: ports: port 8000 (API) is taken by pid 4242 (python -m http.server 8000)"]
    ours = copy.deepcopy(node)
    ours["ports"]["8000"]["holders"][0]["unit"] = "kimi-vllm.service"
    assert judge(node=ours)["passed"]


def test_foreign_gpu_process_is_named():
    gpu = h100_gpu_facts()
    gpu["compute_processes"] = [{"pid": 777, "process_name": "python3", "used_memory_mib": 40000}]
    node = h100_node_facts()
    node["processes"] = {"777": {"pid": 777, "cmdline": "python3 train.py", "unit": "session-1.scope"}}
    verdict = judge(gpu=gpu, node=node)
    assert verdict["failures"] == [
        "gn1: device_processes: GPU memory held by other processes: pid 777 python3 (40000 MiB)"
    ]


def test_low_ram_is_a_warning_not_a_stop():
    node = h100_node_facts()
    node["memory_total_bytes"] = 1000 * GIB
    verdict = judge(node=node)
    assert verdict["passed"]
    assert verdict["notices"] and "below 2x GPU memory" in verdict["notices"][0]


def test_cpu_lab_replaces_gpu_checks_with_cpu_equivalents():
    req = Requirements(
        accelerator="cpu",
        gpus_per_node=1,
        cpu_ram_per_rank_bytes=4 * GIB,
        interfaces=["ib0"],
        data_required_bytes=10**7,
    )
    verdict = evaluate(req, {"n1": HostExpectation(host_ip="10.20.0.11")}, {"n1": h100_node_facts()}, {})
    row = verdict["table"]["n1"]
    assert row["devices"]["text"].startswith("cpu: 224 cores")
    assert row["driver"]["status"] == "n/a" and row["device_processes"]["status"] == "n/a"
    node = h100_node_facts()
    node["memory_total_bytes"] = 2 * GIB
    verdict = evaluate(req, {"n1": HostExpectation(host_ip="10.20.0.11")}, {"n1": node}, {})
    assert verdict["failures"] == ["n1: memory: RAM: 1 CPU rank(s) need 4.00 GiB, node has 2.00 GiB"]


# The readers, against this machine's real /proc and a real socket.


def test_readers_see_real_values(tmp_path):
    assert memory_total_bytes() > 0
    (tmp_path / "a").write_bytes(b"x" * 10)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b").write_bytes(b"y" * 5)
    assert directory_bytes(str(tmp_path)) == 15
    assert directory_bytes(str(tmp_path / "absent")) == 0
    usage = filesystem_usage(str(tmp_path / "not" / "yet"))
    assert usage["measured_at"] == str(tmp_path) and usage["free_bytes"] > 0 and not usage["exists"]
    assert interfaces()["lo"]["ipv4"] == ["127.0.0.1"]


def test_a_listening_port_is_reported_with_this_process_as_holder():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        status = port_status(port)
    assert status["free"] is False
    assert any(h["pid"] == __import__("os").getpid() for h in status["holders"])


@pytest.mark.parametrize(
    ("text", "unit"),
    [
        ("0::/system.slice/kimi-vllm.service\n", "kimi-vllm.service"),
        ("12:cpu:/user.slice/user-0.slice/session-4.scope\n0::/\n", "session-4.scope"),
        ("0::/\n", None),
    ],
)
def test_unit_from_cgroup(text, unit):
    assert unit_from_cgroup(text) == unit


# apt sources in an air-gapped site: only the offline mirror (and file:) may remain.

MIRROR = "http://10.0.0.5:8081/"
NVIDIA_SOURCES = "/etc/apt/sources.list.d/nvidia-cuda.sources"


def offline_requirements(**changes) -> Requirements:
    return nvidia_requirements(offline_mirror_url=MIRROR, apt_sources_managed=[NVIDIA_SOURCES], **changes)


def node_with_sources(*sources: tuple[str, int, str]) -> dict:
    node = h100_node_facts()
    node["apt_sources"] = [{"file": file, "line": line, "uri": uri} for file, line, uri in sources]
    return node


def apt_cell(req: Requirements, node: dict) -> dict:
    return judge(req=req, node=node)["table"]["gn1"]["apt_sources"]


def test_without_an_offline_mirror_apt_sources_are_not_applicable_whatever_the_node_has():
    node = node_with_sources(("/etc/apt/sources.list", 1, "http://deb.debian.org/debian"))
    assert apt_cell(nvidia_requirements(), node)["status"] == "n/a"
    assert apt_cell(nvidia_requirements(), h100_node_facts())["status"] == "n/a"  # not even read


def test_a_node_whose_sources_are_the_mirror_file_or_the_managed_file_passes():
    node = node_with_sources(
        ("/etc/apt/sources.list.d/kimi-offline.sources", 3, "http://10.0.0.5:8081/apt/"),
        ("/etc/apt/sources.list.d/kimi-offline-2.list", 1, "HTTP://10.0.0.5:8081/apt"),  # scheme and host any case
        ("/etc/apt/sources.list.d/kimi-bundle.sources", 2, "file:/var/lib/kimi-bundle/releases/abc/apt"),
        (NVIDIA_SOURCES, 3, "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/"),
    )
    verdict = judge(req=offline_requirements(), node=node)
    assert verdict["passed"], verdict["failures"]
    assert verdict["table"]["gn1"]["apt_sources"] == {
        "status": "ok",
        "text": "no apt source besides the offline mirror",
    }


def test_a_node_without_any_apt_source_passes():
    assert apt_cell(offline_requirements(), node_with_sources())["status"] == "ok"


def test_debian_sources_fail_naming_the_node_the_file_each_uri_and_what_to_do():
    node = h100_node_facts()
    node["apt_sources"] = read_apt_sources(FIXTURES / "apt_sources" / "debian-12")
    file = FIXTURES / "apt_sources" / "debian-12" / "sources.list.d" / "debian.sources"
    verdict = judge(req=offline_requirements(), node=node)
    assert verdict["failures"] == [
        f"gn1: apt_sources: {file} names http://deb.debian.org/debian (line 3), http://deb.debian.org/debian-security"
        " (line 10): remove or disable them: an air-gapped node's only apt source is the offline mirror"
        " http://10.0.0.5:8081/ (docs/air-gapped.md)"
    ]


def test_one_uri_on_a_deb_and_a_deb_src_line_is_one_thing_to_remove():
    node = node_with_sources(
        ("/etc/apt/sources.list", 2, "http://apt.corp.example/debian"),
        ("/etc/apt/sources.list", 3, "http://apt.corp.example/debian"),
        ("/etc/apt/sources.list.d/kimi-offline.sources", 3, "http://10.0.0.5:8081/apt/"),
    )
    cell = apt_cell(offline_requirements(), node)
    assert cell["status"] == "fail"
    assert cell["text"].startswith(
        "/etc/apt/sources.list names http://apt.corp.example/debian (lines 2, 3): remove or disable it: "
    )


def test_the_managed_file_is_skipped_by_its_exact_path_only():
    nvidia = "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/"
    node = node_with_sources(("/etc/apt/sources.list.d/nvidia-cuda.list", 1, nvidia))
    assert "nvidia-cuda.list names " + nvidia in apt_cell(offline_requirements(), node)["text"]
    # The path comes from the role (preflight_apt_sources_managed): none given, none skipped.
    node = node_with_sources((NVIDIA_SOURCES, 3, nvidia))
    assert apt_cell(nvidia_requirements(offline_mirror_url=MIRROR), node)["status"] == "fail"


def test_facts_read_without_apt_sources_fail_instead_of_passing_unseen():
    cell = apt_cell(offline_requirements(), h100_node_facts())
    assert cell == {
        "status": "fail",
        "text": "apt sources were not read (kimi_node_info needs apt_sources: true with an offline mirror)",
    }


@pytest.mark.parametrize(
    ("uri", "mirror", "expected"),
    [
        ("http://10.0.0.5:8081/apt/", "http://10.0.0.5:8081/", True),
        ("http://10.0.0.5:8081/apt", "http://10.0.0.5:8081", True),
        ("http://10.0.0.5:8081", "http://10.0.0.5:8081/", True),
        ("http://mirror.site.example:8081/apt/", "http://Mirror.Site.Example:8081/", True),
        ("http://10.0.0.5:80810/apt/", "http://10.0.0.5:8081/", False),  # a prefix of the port is another host
        ("http://10.0.0.5:8081/aptx/", "http://10.0.0.5:8081/apt/", False),  # a prefix of a path segment
        ("https://10.0.0.5:8081/apt/", "http://10.0.0.5:8081/", False),
        ("http://10.0.0.50:8081/apt/", "http://10.0.0.5:8081/", False),
        ("cdrom://[Debian GNU/Linux 12.5.0]/", "http://10.0.0.5:8081/", False),  # urllib cannot split it
    ],
)
def test_on_mirror_compares_whole_hosts_and_path_segments(uri, mirror, expected):
    assert on_mirror(uri, mirror) is expected
