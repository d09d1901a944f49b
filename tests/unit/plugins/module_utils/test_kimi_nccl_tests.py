"""nccl-tests: the launcher command (mpirun, torchrun; plugins/module_utils/kimi_nccl_tests_launch.py, as ntl), the
all_reduce_perf and NCCL INFO parser on recorded outputs (tests/fixtures/nccl_tests/, reconstructed: see its
README), the verdict's messages (kimi_nccl_tests_verdict.py, as ntv), the torch benchmark's output read back by
the same parser, and the kimi_nccl_tests_command and kimi_nccl_tests_result modules end to end."""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import replace

import pytest
from ansible_collections.kimi.k2.plugins.module_utils import kimi_nccl_tests_launch as ntl
from ansible_collections.kimi.k2.plugins.module_utils import kimi_nccl_tests_verdict as ntv

from tests import paths
from tests.unit.ansible_adhoc import run_module

REPO = paths.REPO_ROOT
FIXTURES = REPO / "tests" / "fixtures" / "nccl_tests"
BENCH = REPO / "roles" / "nccl_tests" / "files" / "kimi_allreduce_bench.py"
SIZES = [1 << k for k in range(20, 33)]  # -b 1M -e 4G -f 2
PIN = "2.30.7-1+cuda13.3"


def fixture(name: str) -> str:
    return (FIXTURES / f"{name}.log").read_text()


@pytest.fixture(scope="module")
def ib() -> dict:
    return ntv.parse_output(fixture("ib-2x8-h100-gdrdma"))


@pytest.fixture(scope="module")
def socket_run() -> dict:
    return ntv.parse_output(fixture("socket-fallback-2x8-h100"))


@pytest.fixture(scope="module")
def wrong() -> dict:
    return ntv.parse_output(fixture("wrong-values-2x8-h100"))


@pytest.fixture(scope="module")
def truncated() -> dict:
    return ntv.parse_output(fixture("truncated-2x8-h100"))


# ---------------------------------------------------------------------------------------------- render

ENV_FILE = """\
# Managed by Ansible
NCCL_SOCKET_IFNAME=ib0
GLOO_SOCKET_IFNAME=ib0
NCCL_IB_HCA=mlx5
NCCL_IB_GID_INDEX="3"
"""
TWO = ("gn-h100-node1", "gn-h100-node2")
ADDRESSES = {"gn-h100-node1": "10.20.0.11", "gn-h100-node2": "10.20.0.12"}
BINARY = "/opt/nccl-tests/2.19.6/build-nccl2.30.7-1+cuda13.3/all_reduce_perf"
MPIRUN = ntl.LaunchSpec(
    launcher="mpirun",
    hosts_by_rank=TWO,
    host_addresses=ADDRESSES,
    gpus_per_node=8,
    binary=BINARY,
    env=ntl.launch_env(ntl.parse_env_file(ENV_FILE)),
    interface="ib0",
    launcher_path="/usr/bin/mpirun",
    launcher_args=("--bind-to", "none"),
)


def value_after(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def exported(argv: list[str]) -> dict[str, str]:
    return dict(argv[i + 1].split("=", 1) for i, word in enumerate(argv) if word == "-x")


def test_mpirun_for_two_nodes_of_eight_gpus():
    rendered = ntl.render(MPIRUN)
    assert rendered["run_on"] == ["gn-h100-node1"]
    argv = rendered["commands"]["gn-h100-node1"]
    assert argv[0] == "/usr/bin/mpirun"
    assert value_after(argv, "-np") == "16"
    assert value_after(argv, "-H") == "10.20.0.11:8,10.20.0.12:8"
    assert rendered["processes"] == 16 and rendered["ranks"] == 16
    assert exported(argv) == {
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,NET",
        "NCCL_IB_GID_INDEX": "3",
        "NCCL_IB_HCA": "mlx5",
        "NCCL_SOCKET_IFNAME": "ib0",
    }
    # MPI's own TCP and out-of-band traffic on the cluster interface.
    mca = [tuple(argv[i + 1 : i + 3]) for i, word in enumerate(argv) if word == "--mca"]
    assert ("btl_tcp_if_include", "ib0") in mca and ("oob_tcp_if_include", "ib0") in mca
    # Launcher arguments before the binary, the test's after it.
    assert argv.index("--bind-to") < argv.index(BINARY)
    test_args = ["-b", "1M", "-e", "4G", "-f", "2", "-g", "1", "-n", "20", "-w", "5", "-c", "1"]
    assert argv[argv.index(BINARY) :] == [BINARY, *test_args]
    assert "--allow-run-as-root" not in argv and "timeout" not in argv
    assert rendered["command_lines"]["gn-h100-node1"].startswith("/usr/bin/mpirun -np 16 -H 10.20.0.11:8,10.20.0.12:8")


def test_mpirun_as_root_with_a_time_limit_and_eight_gpus_per_process():
    argv = ntl.render(replace(MPIRUN, allow_run_as_root=True, timeout_s=900, gpus_per_process=8))["commands"][
        "gn-h100-node1"
    ]
    assert argv[:4] == ["timeout", "--kill-after=30", "900", "/usr/bin/mpirun"]
    assert argv[4] == "--allow-run-as-root"
    assert value_after(argv, "-np") == "2" and value_after(argv, "-H") == "10.20.0.11:1,10.20.0.12:1"
    assert value_after(argv, "-g") == "8"


def test_host_list_follows_node_rank_not_name_order():
    argv = ntl.render(replace(MPIRUN, hosts_by_rank=TWO[::-1]))["commands"]["gn-h100-node2"]
    assert value_after(argv, "-H") == "10.20.0.12:8,10.20.0.11:8"


def test_extra_env_wins_over_the_file_and_the_debug_settings():
    env = ntl.launch_env(
        ntl.parse_env_file(ENV_FILE), {"NCCL_DEBUG_SUBSYS": "INIT,NET,GRAPH", "NCCL_IB_HCA": "=mlx5_0"}
    )
    assert env["NCCL_DEBUG_SUBSYS"] == "INIT,NET,GRAPH" and env["NCCL_IB_HCA"] == "=mlx5_0"
    assert "GLOO_SOCKET_IFNAME" not in env and env["NCCL_DEBUG"] == "INFO"


def test_env_file_syntax():
    parsed = ntl.parse_env_file("# c\n\nexport A_B='x y'\nC=\"1\"\n bad line\nD=a=b\n9X=1\n")
    assert parsed == {"A_B": "x y", "C": "1", "D": "a=b"}


def test_torchrun_runs_on_every_node_with_its_node_rank():
    spec = replace(MPIRUN, launcher="torchrun", launcher_path="/opt/vllm/current/bin/torchrun", launcher_args=())
    rendered = ntl.render(replace(spec, binary="/opt/nccl-tests/kimi_allreduce_bench.py"))
    assert rendered["run_on"] == list(TWO)
    for rank, host in enumerate(TWO):
        argv = rendered["commands"][host]
        assert argv[0] == "/opt/vllm/current/bin/torchrun"
        assert value_after(argv, "--nnodes") == "2" and value_after(argv, "--nproc-per-node") == "8"
        assert value_after(argv, "--node-rank") == str(rank)
        assert value_after(argv, "--master-addr") == "10.20.0.11"
        assert value_after(argv, "--master-port") == "29611"
        assert "-g" not in argv and "-x" not in argv
    assert rendered["env"]["NCCL_SOCKET_IFNAME"] == "ib0" and rendered["env"]["NCCL_DEBUG"] == "INFO"


@pytest.mark.parametrize(
    ("change", "variable"),
    [
        ({"gpus_per_process": 3}, "nccl_tests_gpus_per_process"),
        ({"launcher": "torchrun", "gpus_per_process": 2}, "nccl_tests_gpus_per_process"),
        ({"host_addresses": {"gn-h100-node1": "10.20.0.11", "gn-h100-node2": ""}}, "kimi_host_ip"),
        ({"min_bytes": "1MB"}, "nccl_tests_min_bytes"),
        ({"min_bytes": "8G"}, "nccl_tests_min_bytes"),
        ({"step_factor": 1}, "nccl_tests_step_factor"),
        ({"launcher": "srun"}, "nccl_tests_launcher"),
        ({"interface": "^docker,lo"}, "kimi_network_interface"),
        ({"env": {"BAD NAME": "1"}}, "nccl_tests_extra_env"),
        ({"binary": " "}, "nccl_tests_binary"),
    ],
)
def test_inputs_that_cannot_run_name_their_variable(change, variable):
    with pytest.raises(ntl.NcclTestsInputError) as raised:
        ntl.render(replace(MPIRUN, **change))
    assert raised.value.variable == variable
    assert str(raised.value).startswith(variable + ":")


def test_missing_address_says_how_to_fix_it():
    problems = ntl.validate(replace(MPIRUN, host_addresses={"gn-h100-node1": "10.20.0.11"}))
    assert len(problems) == 1
    assert "gn-h100-node2 has no address" in str(problems[0]) and "kimi_host_ip" in str(problems[0])


def test_sizes_and_version_codes():
    assert [ntl.parse_size(s) for s in ("8", "128K", "1M", "4G", "4g")] == [8, 131072, 1048576, 4 << 30, 4 << 30]
    assert ntv.decode_nccl_version(23007) == "2.30.7"
    assert ntv.decode_nccl_version(22809) == "2.28.9"
    assert ntv.decode_nccl_version(2804) == "2.8.4"
    assert ntv.upstream_version(PIN) == "2.30.7" and ntv.upstream_version("2.28.9") == "2.28.9"


# ---------------------------------------------------------------------------------------------- IB run


def test_ib_run_header_ranks_and_devices(ib):
    assert ib["program"] == "all_reduce_perf" and ib["nccl_tests_version"] == "2.19.6"
    assert ib["nccl_library_version"] == "2.30.7" and ib["nccl_headers_version"] == "2.30.7"
    assert ib["config"]["min_bytes"] == 1 << 20 and ib["config"]["max_bytes"] == 4 << 30
    assert ib["config"]["step"] == 2 and ib["config"]["step_kind"] == "factor" and ib["config"]["ngpus"] == 1
    assert ib["rank_count"] == 16
    assert ib["hosts"] == ["gn-h100-node1", "gn-h100-node2"]
    assert ib["ranks_per_host"] == {"gn-h100-node1": 8, "gn-h100-node2": 8}
    assert ib["gpu_models"] == ["NVIDIA H100 80GB HBM3"]
    rank8 = ib["ranks"][8]
    assert (rank8["rank"], rank8["host"], rank8["device"], rank8["bus_id"]) == (8, "gn-h100-node2", 0, "0000:18:00")
    assert [rank["device"] for rank in ib["ranks"]] == list(range(8)) * 2
    assert ib["nccl_comm_ranks"] == 16 and ib["nccl_comm_nodes"] == 2


def test_ib_run_table_every_size_once_in_order(ib):
    rows = ib["rows"]
    assert [row["size"] for row in rows] == SIZES
    assert all(row["count"] == row["size"] // 4 for row in rows)
    assert {(row["type"], row["redop"], row["root"]) for row in rows} == {("float", "sum", -1)}
    assert all(row["out_of_place"] and row["in_place"] for row in rows)


def test_ib_run_columns_are_where_the_header_says(ib):
    """Would fail if time, algbw and busbw were read from the wrong columns: busbw = algbw x 2(n-1)/n and
    algbw = size / time, within the table's rounding."""
    factor = 2 * 15 / 16
    for row in ib["rows"]:
        for side in (row["out_of_place"], row["in_place"]):
            assert side["busbw"] == pytest.approx(side["algbw"] * factor, abs=0.02)
            assert side["algbw"] == pytest.approx(row["size"] / 1e3 / side["time_us"], rel=0.002)
            assert side["wrong"] == 0


def test_ib_run_average_agrees_with_the_table(ib):
    assert ib["complete"] and ib["concluded"]
    assert ib["avg_busbw"] == 275.615
    # The footer's average is the mean over every row and both columns.
    assert ib["computed_avg_busbw"] == pytest.approx(ib["avg_busbw"], abs=0.01)
    assert ib["max_busbw"] == 389.89 and ib["max_busbw_size"] == 4 << 30 and ib["max_busbw_side"] == "in_place"
    assert ib["wrong"] == 0 and ib["out_of_bounds"] == 0


def test_ib_run_transport_gdrdma_and_versions(ib):
    assert ib["transport"] == "IB"
    assert ib["transports_by_host"] == {"gn-h100-node1": "IB", "gn-h100-node2": "IB"}
    assert ib["gdrdma"] is True and ib["net_channels"] == 64 and ib["gdrdma_channels"] == 64
    assert [device["name"] for device in ib["ib_devices"]["gn-h100-node2"]] == [f"mlx5_{i}" for i in range(8)]
    assert {device["link"] for devices in ib["ib_devices"].values() for device in devices} == {"IB"}
    assert ib["oob_interfaces"] == {"gn-h100-node1": "ib0:10.20.0.11", "gn-h100-node2": "ib0:10.20.0.12"}
    assert ib["bootstrap_interfaces"]["gn-h100-node2"] == "ib0:10.20.0.12"
    assert ib["nccl_versions"] == {"gn-h100-node1": ["2.30.7"], "gn-h100-node2": ["2.30.7"]}
    assert ib["nccl_version_banners"]["gn-h100-node1"] == ["2.30.7+cuda13.3"]
    assert ib["socket_interfaces"] == {} and ib["warnings"] == [] and ib["failures"] == []


def test_ib_run_passes_every_gate_it_meets(ib):
    assert ntv.judge(ib, 250, "IB", PIN, rc=0, expected_ranks=16, require_gdrdma=True) == []
    assert ntv.judge(ib, 0, "RDMA") == []
    assert ntv.judge(ib) == []


def test_ib_run_below_the_floor(ib):
    assert ntv.judge(ib, 350, "IB", PIN, rc=0, expected_ranks=16) == [
        "avg bus bandwidth 275.615 GB/s is below nccl_tests_min_busbw_gbs 350"
    ]


def test_ib_run_against_another_pin_and_rank_count(ib):
    problems = ntv.judge(ib, 0, "", "2.28.9", expected_ranks=32, nccl_source="nvidia-nccl-cu13 wheel")
    assert problems == [
        "16 ranks ran, 32 expected (every GPU of every node in kimi_nodes)",
        "ranks on gn-h100-node1, gn-h100-node2 report NCCL 2.30.7, the pinned nvidia-nccl-cu13 wheel is 2.28.9",
    ]


def test_ib_run_requiring_roce_names_what_it_got(ib):
    (problem,) = ntv.judge(ib, 0, "RoCE")
    assert problem.startswith("NCCL used IB, not RoCE")


def test_report_lines(ib):
    lines = ntv.report_lines(ib, [], 0)
    assert lines[0] == (
        "all_reduce_perf (nccl-tests 2.19.6): 16 ranks on 2 hosts (gn-h100-node1, gn-h100-node2), NVIDIA H100 80GB HBM3"
    )
    assert lines[1] == "NCCL 2.30.7; transport IB, GPUDirect RDMA on 64 of 64 NET channels"
    assert lines[2] == "bus bandwidth: avg 275.615 GB/s over 13 sizes; max 389.89 GB/s at 4 GiB (in-place)"
    assert lines[-1] == "passed (no busbw floor (report only))"


# ---------------------------------------------------------------------------------------------- socket fallback


def test_socket_fallback_is_seen(socket_run):
    assert socket_run["transport"] == "Socket"
    assert socket_run["socket_interfaces"] == {"gpu-a01": ["eth0:10.0.0.1"], "gpu-a02": ["eth0:10.0.0.2"]}
    assert socket_run["ib_missing_hosts"] == ["gpu-a01", "gpu-a02"]
    assert socket_run["gdrdma"] is False and socket_run["gdrdma_channels"] == 0
    assert socket_run["avg_busbw"] == 9.01 and socket_run["max_busbw"] == 10.07
    assert any("libibverbs" in hint for hint in socket_run["ib_hints"])


def test_socket_fallback_fails_naming_the_interface(socket_run):
    problems = ntv.judge(socket_run, 350, "IB", PIN, rc=0, expected_ranks=16)
    assert problems[0] == "avg bus bandwidth 9.01 GB/s is below nccl_tests_min_busbw_gbs 350"
    assert problems[1].startswith("NCCL used Socket (eth0), not IB: it fell back to TCP sockets on gpu-a01, gpu-a02")
    assert "'NET/IB : No device found' on gpu-a01, gpu-a02" in problems[1]
    assert len(problems) == 2


def test_socket_fallback_fails_rdma_and_gdrdma_but_passes_report_only(socket_run):
    assert ntv.judge(socket_run, 0, "RDMA")[0].startswith("NCCL used Socket (eth0), not RDMA")
    assert ntv.judge(socket_run) == []
    assert "transport Socket" in ntv.report_lines(socket_run, [])[1]
    assert ntv.report_lines(socket_run, [])[1].endswith("over eth0")


# ---------------------------------------------------------------------------------------------- wrong data


def test_wrong_values_are_counted_per_size(wrong):
    assert wrong["complete"]
    assert wrong["out_of_bounds"] == 4
    assert wrong["wrong_sizes"] == [1 << 28, 1 << 29, 1 << 30]
    # 1048576 is printed with %g as 1.04858e+06.
    assert wrong["wrong"] == 131072 + 262144 + 262144 + 1048580
    by_size = {row["size"]: row for row in wrong["rows"]}
    assert by_size[1 << 29]["in_place"]["wrong"] == 262144 and by_size[1 << 28]["in_place"]["wrong"] == 0
    assert wrong["exit_codes"] == [7]


def test_wrong_values_and_version_skew_are_all_listed(wrong):
    problems = ntv.judge(wrong, 0, "IB", PIN, rc=7, expected_ranks=16)
    assert problems == [
        "the launcher exited with status 7",
        "the all-reduce returned wrong data: 1703940 wrong elements at sizes 256 MiB, 512 MiB, 1 GiB "
        "(Out of bounds values: 4)",
        "ranks on gn-h100-node2 report NCCL 2.27.3, the pinned libnccl2 is 2.30.7",
    ]


# ---------------------------------------------------------------------------------------------- failed run


def test_truncated_run(truncated):
    assert not truncated["complete"] and truncated["avg_busbw"] is None and truncated["out_of_bounds"] is None
    assert [row["size"] for row in truncated["rows"]] == SIZES[:6]
    assert truncated["exit_codes"] == [3]
    assert truncated["warnings"][0].startswith("gn-h100-node2: NET/IB: Got completion from peer 10.20.0.11<52013>")
    problems = ntv.judge(truncated, 350, "IB", PIN, rc=3, expected_ranks=16)
    assert problems[0] == "the launcher exited with status 3"
    assert problems[1].startswith(
        "the run did not finish: no 'Avg bus bandwidth' line after 6 sizes (first error: gn-h100-node2: Test NCCL "
        "failure common.cu:418 'remote process exited or there was a network error"
    )
    # No average: the floor is not what failed.
    assert not any("below nccl_tests_min_busbw_gbs" in problem for problem in problems)
    assert "the run did not finish" in ntv.report_lines(truncated, problems, 350)[2]


def test_timeout_and_empty_output():
    summary = ntv.parse_output("")
    problems = ntv.judge(summary, 100, "IB", PIN, rc=124, timeout_s=1800)
    assert problems[0] == "the run was stopped after nccl_tests_timeout 1800 s (timeout exit status 124)"
    assert problems[1].endswith("(first error: no error line was printed)")
    assert problems[2].startswith("NCCL's transport is unknown, IB is required")
    assert problems[3] == "no rank logged its NCCL version (expected 2.30.7): is NCCL_DEBUG=INFO set?"


def test_mpirun_launch_failure_over_ssh():
    text = (
        "Host key verification failed.\n"
        "ORTE was unable to reliably start one or more daemons.\n"
        "This usually is caused by:\n"
    )
    summary = ntv.parse_output(text)
    assert summary["failures"] == [
        "Host key verification failed.",
        "ORTE was unable to reliably start one or more daemons.",
    ]
    assert "first error: Host key verification failed." in ntv.judge(summary, rc=1)[1]


# ---------------------------------------------------------------------------------------------- other shapes

ROCE = """\
n1:100:120 [0] NCCL INFO NCCL version 2.30.7+cuda13.3
n1:100:120 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE [RO]; OOB eth0:10.1.0.1<0>
n1:100:120 [0] NCCL INFO Using network IB
n1:100:130 [0] NCCL INFO Channel 00/0 : 0[0] -> 2[0] [send] via NET/IB/0(1)/GDRDMA
n2:200:220 [0] NCCL INFO NCCL version 2.30.7+cuda13.3
n2:200:220 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE [RO]; OOB eth0:10.1.0.2<0>
n2:200:220 [0] NCCL INFO Using network IB
n2:200:230 [0] NCCL INFO Channel 00/0 : 2[0] -> 0[0] [send] via NET/IB/0
# Avg bus bandwidth    : 12.5
"""


def test_roce_is_told_apart_from_infiniband_by_the_link_layer():
    summary = ntv.parse_output(ROCE)
    assert summary["transport"] == "RoCE"
    assert summary["gdrdma"] is True and summary["net_channels"] == 2 and summary["gdrdma_channels"] == 1
    assert ntv.judge(summary, 0, "RDMA") == [] and ntv.judge(summary, 0, "RoCE") == []
    assert ntv.judge(summary, 0, "IB")[0].startswith("NCCL used RoCE, not IB")
    assert "1 of 2 NET channels" not in ntv.judge(summary, require_gdrdma=True)


def test_gdrdma_required_but_absent():
    summary = ntv.parse_output(ROCE.replace("/GDRDMA", ""))
    assert summary["gdrdma"] is False
    (problem,) = ntv.judge(summary, require_gdrdma=True)
    assert problem.startswith("GPUDirect RDMA is not used: 0 of 2 NET channels")


def test_one_host_on_sockets_makes_the_run_mixed():
    text = ROCE.replace(
        "n2:200:220 [0] NCCL INFO Using network IB", "n2:200:220 [0] NCCL INFO Using network Socket"
    ).replace("via NET/IB/0\n", "via NET/Socket/0\n")
    text += "n2:200:220 [0] NCCL INFO NET/Socket : Using [0]eth1:192.168.5.2<0>\n"
    summary = ntv.parse_output(text)
    assert summary["transport"] == "mixed"
    assert summary["transports_by_host"] == {"n1": "RoCE", "n2": "Socket"}
    (problem,) = ntv.judge(summary, 0, "RDMA")
    assert problem.startswith("NCCL used Socket (eth1), not RDMA: it fell back to TCP sockets on n2 ")


PER_ITERATION_ROWS = [
    "8 2 float sum -1 10.50 0.00 0.00 N/A 10.1 11.2 11.0 2.10 10.40 0.00 0.00 N/A 10.0 11.0 10.9 2.00",
    "16 4 float sum -1 10.60 0.00 0.00 N/A 10.2 11.3 11.1 2.20 10.30 0.00 0.00 N/A 10.1 11.1 11.0 2.10",
]
TAGGED_PER_ITERATION = "\n".join(
    [
        "[1,0]<stdout>:# nccl-tests version 2.19.6 nccl-headers=23007 nccl-library=23007",
        "[1,0]<stdout>:# nThread 1 nGpus 1 minBytes 8 maxBytes 16 step: 2(factor) warmup iters: 1 iters: 20 "
        "agg iters: 1 validation: 0 graph: 0 unalign: 0",
        "[1,0]<stdout>:#  Rank  0 Group  0 Pid   1234 on   gpu-x01 device  0 [0000:18:00] NVIDIA H200",
        "[1,0]<stdout>:#  Rank  1 Group  0 Pid   1235 on   gpu-x01 device  1 [0000:2a:00] NVIDIA H200",
        "[1,0]<stdout>:#          out-of-place (+ per-iteration)        in-place (+ per-iteration)",
        *("[1,0]<stdout>:   " + row.replace(" ", "   ") for row in PER_ITERATION_ROWS),
        "[1,1]<stdout>:gpu-x01:1235:1235 [1] NCCL INFO NCCL version 2.30.7+cuda13.3",
        "[1,0]<stdout>:# Out of bounds values : 0 OK",
        "[1,0]<stdout>:# Avg bus bandwidth    : 0 ",
    ]
)


def test_tagged_output_and_per_iteration_columns():
    summary = ntv.parse_output(TAGGED_PER_ITERATION)
    assert summary["rank_count"] == 2 and summary["gpu_models"] == ["NVIDIA H200"]
    assert [row["size"] for row in summary["rows"]] == [8, 16]
    first = summary["rows"][0]
    assert first["out_of_place"]["time_us"] == 10.5 and first["in_place"]["time_us"] == 10.4
    assert first["in_place"]["wrong"] is None and summary["wrong"] == 0
    assert summary["complete"] and summary["nccl_versions"] == {"gpu-x01": ["2.30.7"]}


def test_version_banner_without_host_and_an_old_library_code():
    summary = ntv.parse_output(
        "NCCL version 2.27.3+cuda12.9\n# nccl-tests version 2.13.9 nccl-headers=2804 nccl-library=2804\n"
        "# Avg bus bandwidth    : 1.5\n"
    )
    assert summary["nccl_versions"] == {"?": ["2.27.3"]}
    assert summary["nccl_library_version"] == "2.8.4"
    assert ntv.judge(summary, expected_nccl_version="2.27.3") == [
        "nccl-tests reports NCCL library 2.8.4, the pinned libnccl2 is 2.27.3"
    ]
    assert (
        ntv.judge(summary, expected_nccl_version="2.30.7")[0]
        == "ranks report NCCL 2.27.3, the pinned libnccl2 is 2.30.7"
    )


def test_lines_that_are_not_rows_are_ignored():
    summary = ntv.parse_output("12 apples and 3 pears sum -1\n  1024  256  float  sum  -1  oops  1  2  0\n")
    assert summary["rows"] == []


# ---------------------------------------------------------------------------------------------- torch benchmark


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("kimi_allreduce_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_sizes_and_number_format(bench):
    assert bench.sizes(bench.parse_size("1M"), bench.parse_size("4G"), 2) == SIZES
    assert bench.sizes(8, 100, 4) == [8, 32]
    assert bench.bus_factor(16) == 1.875
    assert [bench.fit(v, 7) for v in (49.83, 20671.4, 101955.0, 12345678.0)] == [
        "  49.83",
        "20671.4",
        " 101955",
        "1.2e+07",
    ]
    assert bench.fit(389.891, 6) == "389.89"


def test_bench_output_reads_back_with_the_same_parser(bench):
    args = bench.arguments(["-b", "1M", "-e", "4M", "-f", "2", "-n", "20", "-w", "5", "-c", "1"])
    lines = bench.header_lines(args, 22809, "2.11.0")
    lines += [bench.rank_line(r, 500 + r, f"gpu-y0{r // 8 + 1}", r % 8, "0000:18:00", "NVIDIA H200") for r in range(16)]
    lines += bench.table_header()
    lines += [
        bench.row_line(1 << 20, 1 << 18, 60.0, 17.48, 32.77, 0),
        bench.row_line(2 << 20, 1 << 19, 70.0, 29.96, 56.17, 0),
        bench.row_line(4 << 20, 1 << 20, 90.0, 46.60, 87.38, 1048576),
    ]
    lines += bench.footer_lines(1, (32.77 + 56.17 + 87.38) / 3)
    summary = ntv.parse_output("\n".join(lines))
    assert summary["program"] == "kimi_allreduce_bench" and summary["complete"] and summary["concluded"]
    assert summary["nccl_library_version"] == "2.28.9" and summary["rank_count"] == 16
    assert summary["config"]["min_bytes"] == 1 << 20 and summary["config"]["iters"] == 20
    assert [row["size"] for row in summary["rows"]] == [1 << 20, 2 << 20, 4 << 20]
    assert all(row["out_of_place"] is None for row in summary["rows"])
    assert summary["rows"][1]["in_place"] == {"time_us": 70.0, "algbw": 29.96, "busbw": 56.17, "wrong": 0}
    assert summary["wrong"] == 1048580 and summary["out_of_bounds"] == 1
    assert summary["avg_busbw"] == pytest.approx(58.7733, abs=1e-3)
    assert summary["max_busbw"] == 87.38


# ---------------------------------------------------------------------------------------------- the module


def test_module_renders_mpirun(tmp_path):
    args = {
        "hosts": list(TWO),
        "host_addresses": ADDRESSES,
        "gpus_per_node": 8,
        "binary": BINARY,
        "env_file_text": ENV_FILE,
        "interface": "ib0",
        "allow_run_as_root": True,
    }
    ok, result = run_module(tmp_path, "kimi_nccl_tests_command", args, check=True)
    assert ok, result
    argv = result["commands"]["gn-h100-node1"]
    assert value_after(argv, "-np") == "16" and "-x" in argv and "--allow-run-as-root" in argv
    assert result["changed"] is False and result["run_on"] == ["gn-h100-node1"]


def test_module_refuses_naming_the_variable(tmp_path):
    args = {"hosts": list(TWO), "host_addresses": ADDRESSES, "binary": BINARY, "gpus_per_process": 3}
    ok, result = run_module(tmp_path, "kimi_nccl_tests_command", args)
    assert not ok and result["variable"] == "nccl_tests_gpus_per_process"


def test_modules_take_only_their_own_options(tmp_path):
    args = {"mode": "render", "hosts": list(TWO), "host_addresses": ADDRESSES, "binary": BINARY}
    ok, result = run_module(tmp_path, "kimi_nccl_tests_command", args, check=True)
    assert not ok and "mode" in result["msg"]
    ok, result = run_module(tmp_path, "kimi_nccl_tests_result", {"text": "", "launcher": "mpirun"}, check=True)
    assert not ok and "launcher" in result["msg"]


def test_module_judges_and_lists_every_problem(tmp_path):
    args = {
        "text": fixture("socket-fallback-2x8-h100"),
        "rc": 0,
        "min_busbw_gbs": 350,
        "require_transport": "IB",
        "expected_nccl_version": PIN,
        "expected_ranks": 16,
    }
    ok, result = run_module(tmp_path, "kimi_nccl_tests_result", args, check=True)
    assert not ok
    assert re.match(
        r"nccl-tests failed: avg bus bandwidth 9\.01 GB/s is below .*; NCCL used Socket \(eth0\)", result["msg"]
    )
    assert result["summary"]["transport"] == "Socket" and result["passed"] is False and len(result["problems"]) == 2


def test_module_passes_a_good_run(tmp_path):
    args = {"text": fixture("ib-2x8-h100-gdrdma"), "rc": 0, "require_transport": "IB"}
    ok, result = run_module(tmp_path, "kimi_nccl_tests_result", args)
    assert ok, result
    assert result["passed"] is True and result["problems"] == [] and result["summary"]["avg_busbw"] == 275.615


def test_older_nccl_tests_layout():
    """Before 2.14-ish: no version header, no unalign field, the device as [0x1b]."""
    text = "\n".join(
        [
            "# nThread 1 nGpus 8 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20 "
            "agg iters: 1 validation: 1 graph: 0",
            "#",
            "# Using devices",
            *(
                f"#  Rank {r:2d} Group  0 Pid   4242 on    dgx-a07 device {r:2d} [0x{0x1B + r:02x}] "
                "NVIDIA A100-SXM4-80GB"
                for r in range(8)
            ),
            "   134217728      33554432     float     sum      -1   1210.3  110.90  194.07      0"
            "   1205.1  111.38  194.91      0",
            "# Out of bounds values : 0 OK",
            "# Avg bus bandwidth    : 194.49 ",
        ]
    )
    summary = ntv.parse_output(text)
    assert summary["config"]["ngpus"] == 8 and summary["rank_count"] == 8
    assert summary["ranks"][3]["bus_id"] == "0x1e" and summary["hosts"] == ["dgx-a07"]
    assert summary["rows"][0]["in_place"]["busbw"] == 194.91 and summary["avg_busbw"] == 194.49
    assert summary["nccl_tests_version"] is None and summary["transport"] is None


# ---------------------------------------------------------------------------------------------- -J (JSON)


def json_fixture(name: str) -> str:
    return (FIXTURES / f"{name}.json").read_text()


def test_mpirun_writes_the_json_file_when_asked_and_torchrun_never():
    argv = ntl.render(replace(MPIRUN, json_path="/var/lib/kimi-nccl-tests/all_reduce_perf.json"))["commands"][TWO[0]]
    assert argv[-2:] == ["-J", "/var/lib/kimi-nccl-tests/all_reduce_perf.json"]
    torch = replace(MPIRUN, launcher="torchrun", binary="/opt/bench.py", json_path="/tmp/x.json")
    assert all("-J" not in argv for argv in ntl.render(torch)["commands"].values())


@pytest.mark.parametrize("path", ["all_reduce_perf.json", "/var/lib/kimi-nccl-tests/all_reduce_perf.txt"])
def test_a_json_path_nccl_tests_would_not_write_is_refused(path):
    with pytest.raises(ntl.NcclTestsInputError) as raised:
        ntl.render(replace(MPIRUN, json_path=path))
    assert raised.value.variable == "nccl_tests_json_path"


def test_the_json_file_gives_the_same_table_as_the_printed_one(ib):
    report = ntv.parse_json_output(json_fixture("ib-2x8-h100-gdrdma"))
    assert report["version"] == 3 and report["nccl_version_code"] == 23007
    assert [row["size"] for row in report["rows"]] == SIZES
    assert report["rows"] == ib["rows"]
    assert report["out_of_bounds"] == 0 and report["avg_busbw"] == 275.615
    assert len(report["devices"]) == 16 and report["devices"][8]["hostname"] == "gn-h100-node2"


def test_the_verdict_reads_the_figures_from_the_json_file_and_the_transport_from_the_log():
    exact = json_fixture("ib-2x8-h100-gdrdma").replace('"bandwidth":275.615000', '"bandwidth":275.614871')
    result = ntv.verdict(fixture("ib-2x8-h100-gdrdma"), 0, require_transport="IB", json_text=exact)
    summary = result["summary"]
    assert result["passed"] is True and summary["table_source"] == "json"
    assert summary["avg_busbw"] == 275.6149 and summary["transport"] == "IB" and summary["gdrdma"] is True
    assert summary["nccl_library_version"] == "2.30.7"
    assert result["report"][2].endswith("(from nccl-tests' JSON file)")


def test_wrong_data_in_the_json_file_fails_the_run_even_if_the_printed_table_was_lost():
    document = json.loads(json_fixture("ib-2x8-h100-gdrdma"))
    document["results"][8]["in_place"]["nwrong"] = "1048576.000000"
    document["out_of_bounds"] = {"count": 4, "okay": "false"}
    log = "\n".join(line for line in fixture("ib-2x8-h100-gdrdma").splitlines() if not line[:1].isspace())
    result = ntv.verdict(log, 0, json_text=json.dumps(document))
    assert result["passed"] is False
    assert "1048576 wrong elements at sizes 256 MiB (Out of bounds values: 4)" in result["problems"][0]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"version":3,"results":[{"size":1', "not JSON"),
        ('{"version":9,"results":[]}', "version 9"),
        ('{"version":3}', "no 'results' list"),
    ],
)
def test_a_json_file_that_cannot_be_read_leaves_the_printed_table_in_use_and_says_why(text, reason):
    result = ntv.verdict(fixture("ib-2x8-h100-gdrdma"), 0, json_text=text)
    summary = result["summary"]
    assert summary["table_source"] == "text" and summary["avg_busbw"] == 275.615 and result["passed"] is True
    assert any(w.startswith("nccl-tests' JSON file was not used: ") and reason in w for w in summary["warnings"])


def test_the_result_module_takes_the_json_file(tmp_path):
    args = {"text": fixture("ib-2x8-h100-gdrdma"), "rc": 0, "json_text": json_fixture("ib-2x8-h100-gdrdma")}
    ok, result = run_module(tmp_path, "kimi_nccl_tests_result", args)
    assert ok, result
    assert result["summary"]["table_source"] == "json" and result["summary"]["avg_busbw"] == 275.615
