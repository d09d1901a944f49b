"""Where one start of a vLLM unit spent its time: the milestones its journal shows and the phases between them.

Why hand-written: vLLM's start-up log is free text written for people (its logger's lines, tqdm's progress bars,
uvicorn's own lines), not a format that any library parses. A start is read from the few lines vLLM logs at each
step; each marker below names the vLLM 0.32.0 file that logs it, and the unit tests run the parser over journals
recorded on the lab (tests/fixtures/journal/).

Input: the entries of `journalctl -o json` (one JSON object a line) of one start of a vLLM unit:
`__REALTIME_TIMESTAMP` (microseconds since the epoch, when journald received the line), `MESSAGE` (a string, or a
list of byte values for a line that is not plain UTF-8 text, e.g. tqdm's carriage returns),
`_SYSTEMD_INVOCATION_ID` on the service's own lines and `INVOCATION_ID` on systemd's lines about the unit. Entries
of another invocation (an earlier start in the same journal) are dropped. Besides the log, the caller may know the
unit's start (`systemctl show -p ExecMainStartTimestamp`) and when the first token was generated.

Output: `StartPhases`, the milestones (seconds since the epoch; None where the log does not show one, never
guessed), the phase durations between consecutive milestones found, and the figures vLLM itself reports (its
"took N seconds"). Where vLLM logs a marker in every worker process (`logger.info`; a GPU node runs one worker per
GPU) a milestone is the last worker's line, since the phase ends when every local rank is done with it. Some
markers vLLM 0.32.0 logs with `logger.info_once`, whose default scope is the node's first local rank only
(vllm/logger.py): the rank assignment and "Loading weights took"; those milestones are local rank 0's time.

Standard library only, Python >= 3.10, no package-relative import: a module runs it on a node's own python3, and
a node program may import it as a plain module copied beside it (as the watchdog does kimi_systemd.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from itertools import pairwise
from typing import Any

# systemd's catalog id of "Started UNIT" (SD_MESSAGE_UNIT_STARTED, systemd's src/systemd/sd-messages.h), logged by
# PID 1 with the unit's INVOCATION_ID once ExecStart= was executed (the vLLM units are Type=exec).
UNIT_STARTED_MESSAGE_ID = "39f53479d3a045ac8e11786248231fbf"
# "(Worker_PP0 pid=1970) INFO ...": vLLM's prefix naming the process that logged the line (vllm/logger.py).
_PROCESS_PREFIX = re.compile(r"^\((?P<name>[^()\s]+) pid=(?P<pid>\d+)\)")
_NUMBER = r"(-?\d+(?:\.\d+)?)"


@dataclass(frozen=True)
class Milestones:
    """When the start reached each step, in seconds since the epoch; None where the log shows no such step.

    The order of the fields is the order of a start; each vLLM milestone is the last worker's line."""

    started: float | None = None  # the unit's main process was started (the caller's, or systemd's "Started")
    rendezvous_entered: float | None = None  # every local worker called init_distributed_environment
    group_formed: float | None = None  # local rank 0 got its ranks: the group of all nodes exists
    weights_loaded: float | None = None  # the weights are loaded (on GPUs: every worker's model is in memory)
    compile_started: float | None = None  # torch.compile started (GPU), the compile warm-up started (CPU build)
    compiled: float | None = None  # torch.compile finished (GPU), the compile warm-up done (CPU build)
    graphs_captured: float | None = None  # CUDA graphs captured (GPU only)
    engine_ready: float | None = None  # the engine core initialised (KV cache, warm-up): rank 0's node only
    api_starting: float | None = None  # the API server built its routes and starts serving
    api_up: float | None = None  # uvicorn's application started: the port answers
    first_token: float | None = None  # the first token generated (the caller's, never the log's)


MILESTONES: tuple[str, ...] = tuple(field.name for field in fields(Milestones))


@dataclass(frozen=True)
class Reported:
    """What vLLM itself says a step took (the slowest worker's figure); None where it did not say."""

    loading_weights_s: float | None = None  # "Loading weights took %.2f seconds"
    stream_s: float | None = None  # Run:ai's "Overall time to stream ... of all files ...: %ss"
    model_loading_s: float | None = None  # "Model loading took %s GiB memory and %.6f seconds" (GPU)
    model_loading_gib: float | None = None
    compile_s: float | None = None  # "torch.compile took %.2f s in total", summed over a worker's compiled models
    graph_capture_s: float | None = None  # "Graph capturing finished in %.0f secs, took %.2f GiB"
    graph_capture_gib: float | None = None
    init_engine_s: float | None = None  # "init engine (profile, create kv cache, warmup model) took %.2f s"


@dataclass(frozen=True)
class Phase:
    """The time from one milestone the log shows to the next one it shows (`start` is the milestone before `end`
    in MILESTONES that was found, so a missing milestone makes the phase span it rather than vanish)."""

    start: str
    end: str
    seconds: float


@dataclass(frozen=True)
class StartPhases:
    invocation_id: str | None
    milestones: Milestones
    phases: tuple[Phase, ...]
    reported: Reported
    workers: int  # processes that entered the rendezvous (this node's workers); 0 when none did

    def as_dict(self) -> dict[str, Any]:
        """Plain data for a module's result or a report."""
        return {
            "invocation_id": self.invocation_id,
            "milestones": asdict(self.milestones),
            "phases": [asdict(phase) for phase in self.phases],
            "reported": asdict(self.reported),
            "workers": self.workers,
        }


@dataclass(frozen=True)
class Marker:
    """A line that shows a milestone; `figures` name the Reported fields its groups fill, in order."""

    milestone: str
    pattern: re.Pattern[str]
    figures: tuple[str, ...] = ()


MARKERS: tuple[Marker, ...] = (
    # vllm/distributed/parallel_state.py (0.32.0), init_distributed_environment: each worker, before
    # torch.distributed waits for every rank at the rendezvous ("world_size=%d rank=%d local_rank=%d
    # distributed_init_method=%s backend=%s").
    Marker("rendezvous_entered", re.compile(r"world_size=\d+ rank=\d+ local_rank=\d+ distributed_init_method=\S+")),
    # vllm/distributed/parallel_state.py (0.32.0), initialize_model_parallel: "rank %s in world size %s is assigned
    # as DP rank %s, PP rank %s, ...", once the process groups of all nodes exist (info_once: local rank 0 only).
    Marker("group_formed", re.compile(r"rank \d+ in world size \d+ is assigned as ")),
    # vllm/model_executor/model_loader/default_loader.py (0.32.0, also sharded_state_loader.py): "Loading weights
    # took %.2f seconds" (info_once: local rank 0 only).
    Marker("weights_loaded", re.compile(rf"Loading weights took {_NUMBER} seconds"), ("loading_weights_s",)),
    # runai_model_streamer/safetensors_streamer/safetensors_streamer.py (runai-model-streamer 0.17.1, vLLM's
    # --load-format runai_streamer): "[RunAI Streamer] Overall time to stream %s of all files to %s: %ss, %s/s"
    # once the last tensor was read, in every worker; only with RUNAI_STREAMER_LOG_TO_STDERR=1, which the unit sets
    # for that format. vLLM's own progress bar for it ("Loading safetensors using Runai Model Streamer") is global
    # rank 0's only, and "Loading weights took" is the default loader's.
    Marker(
        "weights_loaded",
        re.compile(rf"\[RunAI Streamer\] Overall time to stream .+? of all files(?: to \S+)?: {_NUMBER}s\b"),
        ("stream_s",),
    ),
    # vllm/v1/worker/gpu/model_runner.py (0.32.0's default Model Runner V2: every worker; also
    # v1/worker/gpu_model_runner.py, the V1 runner: info_once): "Model loading took %s GiB memory and %.6f seconds",
    # after the weights' post-processing; logged after the line above, so it is the milestone on GPUs.
    Marker(
        "weights_loaded",
        re.compile(rf"Model loading took {_NUMBER} GiB memory and {_NUMBER} seconds"),
        ("model_loading_gib", "model_loading_s"),
    ),
    # vllm/compilation/monitor.py (0.32.0), monitor_torch_compile: "%sStarting torch.compile" (the prefix is an
    # optional "[tag] "), in compilation mode VLLM_COMPILE only.
    Marker("compile_started", re.compile(r"Starting torch\.compile\s*$")),
    # vllm/v1/worker/cpu_model_runner.py (0.32.0, also v1/worker/cpu/model_runner.py), warming_up_model: the CPU
    # build compiles during this warm-up.
    Marker("compile_started", re.compile(r"Warming up model for the compilation\.\.\.")),
    # vllm/compilation/monitor.py (0.32.0): "%storch.compile took %.2f s in total"; vllm/compilation/decorators.py
    # (0.32.0) passes "%storch.compile and initial profiling/warmup run together took %.2f s in total" instead.
    Marker(
        "compiled",
        re.compile(rf"torch\.compile (?:and initial profiling/warmup run together )?took {_NUMBER} s in total"),
        ("compile_s",),
    ),
    # vllm/v1/worker/cpu_model_runner.py (0.32.0), warming_up_model: "Warming up done."
    Marker("compiled", re.compile(r"Warming up done\.")),
    # vllm/v1/worker/gpu/model_runner.py (0.32.0, Model Runner V2: every worker; also v1/worker/gpu_model_runner.py,
    # info_once), capture_model: "Graph capturing finished in %.0f secs, took %.2f GiB".
    Marker(
        "graphs_captured",
        re.compile(rf"Graph capturing finished in {_NUMBER} secs, took {_NUMBER} GiB"),
        ("graph_capture_s", "graph_capture_gib"),
    ),
    # vllm/v1/engine/core.py (0.32.0), _initialize_kv_caches: "init engine (profile, create kv cache, warmup model)
    # took %.2f s", with " (compilation: ...)" after it when vLLM compiled.
    Marker(
        "engine_ready",
        re.compile(rf"init engine \(profile, create kv cache, warmup model\) took {_NUMBER} s"),
        ("init_engine_s",),
    ),
    # vllm/entrypoints/launchers/api_server/entry.py (0.32.0): "Starting vLLM server on %s".
    Marker("api_starting", re.compile(r"Starting vLLM server on \S+")),
    # uvicorn/lifespan/on.py (uvicorn 0.54.0, in vLLM 0.32.0's venv on the lab): "Application startup complete."
    Marker("api_up", re.compile(r"Application startup complete\.")),
)


def parse_journal_json(text: str) -> list[dict[str, Any]]:
    """`journalctl -o json` output as its entries; blank lines and journalctl's own notes ('-- No entries --') are
    skipped, anything else that is not a JSON object is an error (a ValueError naming the line)."""
    entries = []
    for number, line in enumerate((text or "").splitlines(), 1):
        if not line.strip() or line.startswith("-- "):
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"journal line {number} is not JSON: {error}") from error
        if not isinstance(entry, dict):
            raise ValueError(f"journal line {number} is not a JSON object")
        entries.append(entry)
    return entries


def message_text(entry: Mapping[str, Any]) -> str:
    """An entry's MESSAGE as text: journalctl writes a message that is not plain UTF-8 text as a list of byte
    values, and null for one larger than its field limit."""
    message = entry.get("MESSAGE")
    if isinstance(message, list):
        return bytes(value & 0xFF for value in message if isinstance(value, int)).decode("utf-8", "replace")
    return message if isinstance(message, str) else ""


def entry_time(entry: Mapping[str, Any]) -> float | None:
    """When journald received the entry, in seconds since the epoch; None without a usable timestamp."""
    try:
        return int(entry["__REALTIME_TIMESTAMP"]) / 1_000_000
    except (KeyError, TypeError, ValueError):
        return None


def entry_invocation(entry: Mapping[str, Any]) -> str | None:
    """The start an entry belongs to: the service's own lines carry _SYSTEMD_INVOCATION_ID, systemd's lines about
    the unit INVOCATION_ID."""
    return entry.get("_SYSTEMD_INVOCATION_ID") or entry.get("INVOCATION_ID") or None


def last_invocation(entries: Iterable[Mapping[str, Any]]) -> str | None:
    """The invocation of the last entry that names one (the most recent start in a journal read in order)."""
    found = None
    for entry in entries:
        found = entry_invocation(entry) or found
    return found


def process_of(entry: Mapping[str, Any], text: str) -> str:
    """Which process logged a line: the pid of vLLM's '(Worker_PP0 pid=1970)' prefix, else journald's _PID."""
    prefix = _PROCESS_PREFIX.match(text)
    return prefix.group("pid") if prefix else str(entry.get("_PID", ""))


def unit_started(entry: Mapping[str, Any]) -> bool:
    """systemd's "Started UNIT" line (PID 1 writes it when the unit's process was executed)."""
    return entry.get("MESSAGE_ID") == UNIT_STARTED_MESSAGE_ID and entry.get("JOB_RESULT", "done") == "done"


def derive_phases(milestones: Milestones) -> tuple[Phase, ...]:
    """The time between each milestone found and the next one found, in MILESTONES' order."""
    found = [(name, getattr(milestones, name)) for name in MILESTONES if getattr(milestones, name) is not None]
    return tuple(
        Phase(start=start, end=end, seconds=round(end_at - start_at, 3))
        for (start, start_at), (end, end_at) in pairwise(found)
    )


def start_phases(
    entries: Iterable[Mapping[str, Any]],
    invocation_id: str | None = None,
    started_at: float | None = None,
    first_token_at: float | None = None,
) -> StartPhases:
    """The milestones and phases of one start.

    `invocation_id` keeps that start's entries only; without it, the start of the last entry that names one (all
    entries when none does). `started_at` (the unit's ExecMainStartTimestamp) wins over systemd's "Started" line;
    `first_token_at` is only ever the caller's."""
    entries = list(entries)
    invocation = invocation_id or last_invocation(entries)
    if invocation:
        entries = [entry for entry in entries if entry_invocation(entry) == invocation]
    reached: dict[str, float] = {}
    figures: dict[str, dict[str, float]] = {}  # figure -> process -> the sum of its lines' values
    workers: set[str] = set()
    for entry in entries:
        at = entry_time(entry)
        if at is None:
            continue
        if unit_started(entry):
            reached["started"] = max(reached.get("started", at), at)
            continue
        text = message_text(entry)
        for marker in MARKERS:
            match = marker.pattern.search(text)
            if match is None:
                continue
            reached[marker.milestone] = max(reached.get(marker.milestone, at), at)
            process = process_of(entry, text)
            if marker.milestone == "rendezvous_entered":
                workers.add(process)
            for name, value in zip(marker.figures, match.groups(), strict=True):
                per_process = figures.setdefault(name, {})
                per_process[process] = per_process.get(process, 0.0) + float(value)
    if started_at is not None:
        reached["started"] = float(started_at)
    if first_token_at is not None:
        reached["first_token"] = float(first_token_at)
    milestones = Milestones(**reached)
    reported = Reported(**{name: round(max(values.values()), 6) for name, values in figures.items()})
    return StartPhases(
        invocation_id=invocation,
        milestones=milestones,
        phases=derive_phases(milestones),
        reported=reported,
        workers=len(workers),
    )
