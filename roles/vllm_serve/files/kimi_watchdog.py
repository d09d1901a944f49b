"""The serve watchdog: one node's judge of its own vLLM unit, started by kimi-vllm-watchdog.timer every few seconds.

Why it exists: ranks of a vLLM group only form a group when they start together, and a broken group does not
heal by itself (measured on the lab, tests/lab/test_site_then_lifecycle.py): a headless rank restarted by
systemd cannot rejoin while rank 0 keeps answering /health 200 and every request hangs; rank 0 restarted or
rebooted alone waits forever at the rendezvous. Each node's watchdog restarts its own unit, and only its own
(no SSH between nodes), when what it sees says the group it belongs to is gone. docs/self-healing.md has the
rules as a table; `decide` is where they live.

Layout: the decision (dataclasses in, a Decision out, no I/O), the parsers (vLLM's /metrics, the env file), the
state file and the textfile metrics, the observers (systemctl, ss, HTTP) and `main`. Standard library only and
Python >= 3.10: a program of the node, not a module helper. The vllm_serve role (tasks/watchdog.yml) copies this
file, kimi_evidence.py (what a restart is about to destroy, captured before it) and the three collection
module_utils it imports, kimi_systemd.py (`systemctl show`), kimi_rendezvous.py (`ss -Htan`, the reading the serve
phase's group decision shares) and kimi_start_phases.py (where a start spent its time, from its journal; the serve
report's reading too), into one directory on each node and runs it with the node's own /usr/bin/python3, which
finds them beside it.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

# Run as a script: these are the copies the role writes beside this file (kimi_evidence.py is the role's own).
from kimi_evidence import MAX_TIMEOUT_S as EVIDENCE_MAX_TIMEOUT_S
from kimi_evidence import Request as EvidenceRequest
from kimi_evidence import Result as EvidenceResult
from kimi_evidence import capture as capture_evidence
from kimi_rendezvous import rendezvous_closed, rendezvous_states
from kimi_start_phases import parse_journal_json, start_phases
from kimi_systemd import parse_unit, unix_timestamp

RANK0 = "rank0"
HEADLESS = "headless"
ROLES = (RANK0, HEADLESS)
# Why a unit is restarted, per role (the label `reason` of kimi_watchdog_restarts_total).
REASONS = {
    RANK0: ("rank0_stalled", "rank0_never_served"),
    HEADLESS: ("rendezvous_closed", "rank0_lost", "never_joined"),
}
# Every verdict a check can reach (the label `verdict` of kimi_watchdog_verdict).
VERDICTS = (
    "paused",  # the maintenance file exists
    "held",  # the serve phase restarts the group (its hold file)
    "stopped",  # the unit is inactive or failed: an operator stopped it
    "transition",  # systemd is starting or stopping the unit
    "loading",  # within the load grace
    "healthy",
    "busy",  # a headless rank's view: rank 0 accepted /health but answered slowly
    "suspect",  # a failing check, fewer than the threshold in a row
    "waiting",  # not serving, but the fix is another node's (or still too early to tell)
    "rank0_stopped",  # a headless rank's view: nothing listens on rank 0's rendezvous port (stopped, not restarted)
    "unknown",  # nothing to judge with
    "restart",
    "backoff",  # a restart is due, the back-off has not passed
    "gave_up",  # a restart is due, the window's restarts are spent
)
# vLLM's counters of the tokens it processed (Prometheus counters, one sample per model_name/engine label set;
# the same names in the v0 and v1 engines). The prompt tokens count too: a long prefill generates nothing for a
# while and is still work.
TOKEN_COUNTERS = ("vllm:generation_tokens_total", "vllm:prompt_tokens_total")
# A socket that rank 0 closed and this rank has still not closed one check later is abandoned: a single
# sighting may be the instant between rank 0's FIN and the rank's own close.
CLOSED_CONFIRMATIONS = 2
# An HTTP request whose connection was not made in time (a rank 0 whose node is down); "timeout" is an answer
# that did not come in time on a connection that was made (a rank 0 that is there but slow).
CONNECT_TIMEOUT = "connect timeout"
# A TCP connect to rank 0's master port that its node refused: rank 0's host is up and its unit is not running.
PORT_OPEN, PORT_REFUSED = "open", "refused"
METRICS_FILE = "kimi_watchdog.prom"
DEFAULT_CONFIG = "/etc/kimi/watchdog.json"
# Debian's node-exporter reads this directory; Debian 12 ships 0755 root.
TEXTFILE_DIR_MODE = 0o755
# A /metrics page of a large deployment is a few hundred kB; more is not vLLM's.
MAX_BODY = 8 * 1024 * 1024
# sd-daemon(3) priority prefixes: the journal files each stdout line under its level.
INFO, WARNING, ERROR = 6, 4, 3

# ------------------------------------------------------------------------------------------ inputs


class ConfigError(ValueError):
    """A watchdog config that cannot be used, naming the key."""


@dataclass(frozen=True)
class Config:
    """/etc/kimi/watchdog.json, rendered by the vllm_serve role (templates/kimi-vllm-watchdog.json.j2)."""

    role: str  # rank0 (serves the API) or headless
    unit: str  # this node's vLLM unit, the only one the watchdog restarts
    # Rank 0's /health as this node reaches it (its own for rank 0); "" where a headless rank cannot (API on
    # loopback): then only the rendezvous rule applies there.
    health_url: str = ""
    metrics_url: str = ""  # rank 0: its /metrics (vLLM's token counters)
    probe_url: str = ""  # rank 0: /v1/completions, asked for one token
    served_model_name: str = ""
    rendezvous: str = ""  # headless, layout mp: rank 0's master "ADDRESS:PORT"
    api_key_env: str = "VLLM_API_KEY"  # the variable holding the API key (systemd loads api_key_env_file)
    api_key_env_file: str = ""  # read when the variable is not set (a run by hand)
    load_timeout_s: int = 900
    stall_checks: int = 3
    lost_checks: int = 3
    backoff_s: int = 60
    backoff_max_s: int = 900
    max_restarts: int = 5
    restart_window_s: int = 3600
    http_timeout_s: float = 5.0
    probe_timeout_s: float = 10.0
    textfile_dir: str = "/var/lib/prometheus/node-exporter"
    maintenance_file: str = "/etc/kimi/maintenance"
    hold_file: str = "/run/kimi/watchdog.hold"
    hold_max_age_s: int = 2100
    marker_path: str = ""
    state_path: str = "/var/lib/kimi-watchdog/state.json"
    # Rank 0: where each check keeps the last /metrics it read (tmpfs), for the evidence of a restart.
    metrics_cache_path: str = ""
    # Evidence before every restart (kimi_evidence.py, docs/self-healing.md#evidence); "" takes none.
    evidence_dir: str = ""
    evidence_units: tuple[str, ...] = ()  # the group's units on this node whose journal tails are kept
    evidence_journal_lines: int = 300
    evidence_timeout_s: int = EVIDENCE_MAX_TIMEOUT_S
    evidence_keep: int = 20
    evidence_max_mb: int = 512
    evidence_py_spy: str = ""  # py-spy in the service's venv


def config_from_mapping(data: Mapping[str, Any]) -> Config:
    """A Config from the JSON object, refusing unknown keys, wrong types and non-positive counts by name."""
    known = {f.name: f for f in fields(Config)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError(f"unknown keys: {', '.join(unknown)}")
    missing = [name for name in ("role", "unit") if not data.get(name)]
    if missing:
        raise ConfigError(f"{', '.join(missing)}: required")
    for name, value in data.items():
        _check_type(name, value, known[name].default)
    config = Config(**{name: tuple(value) if isinstance(value, list) else value for name, value in data.items()})
    if config.role not in ROLES:
        raise ConfigError(f"role: {config.role!r} is not one of {', '.join(ROLES)}")
    if config.role == RANK0 and not config.health_url:
        # Without /health rank 0 could never be seen serving, and would be restarted as never served.
        raise ConfigError("health_url: required for rank0")
    counts = ("load_timeout_s", "stall_checks", "lost_checks", "max_restarts", "restart_window_s")
    for name in (*counts, "evidence_journal_lines", "evidence_timeout_s", "evidence_keep", "evidence_max_mb"):
        if getattr(config, name) < 1:
            raise ConfigError(f"{name}: must be at least 1")
    if config.evidence_timeout_s > EVIDENCE_MAX_TIMEOUT_S:
        # The heal waits for its evidence: the bound is what keeps a capture from delaying it.
        raise ConfigError(f"evidence_timeout_s: at most {EVIDENCE_MAX_TIMEOUT_S}, not {config.evidence_timeout_s}")
    return config


def _check_type(name: str, value: Any, default: Any) -> None:
    """Types come from the field's default: a str field (or one without a default) takes a str, an int field an
    int (not a bool), a float field an int or a float."""
    if isinstance(default, str) or default is MISSING:
        ok = isinstance(value, str)
    elif isinstance(default, tuple):
        ok = isinstance(value, list) and all(isinstance(item, str) for item in value)
    elif isinstance(default, float):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    else:
        ok = isinstance(value, int) and not isinstance(value, bool)
    if not ok:
        raise ConfigError(f"{name}: {value!r} has the wrong type")


@dataclass(frozen=True)
class UnitState:
    """What systemd says about this node's vLLM unit."""

    active_state: str  # ActiveState: active, activating, deactivating, inactive, failed, "" when unreadable
    invocation_id: str = ""  # InvocationID: changes with every start, also systemd's own Restart=
    started_at: float | None = None  # ExecMainStartTimestamp, seconds since the epoch


@dataclass(frozen=True)
class Http:
    """One HTTP exchange: the status, or why there was none."""

    status: int = 0  # 0: no HTTP answer
    error: str = ""  # refused, timeout, unreachable (...), HTTP 503

    @property
    def ok(self) -> bool:
        return self.status == 200

    def describe(self) -> str:
        return "200" if self.ok else self.error or f"HTTP {self.status}"


@dataclass(frozen=True)
class Observation:
    """One check's view. Only what the role needs is filled; the rest stays None or empty."""

    now: float
    unit: UnitState
    paused: bool = False
    held: bool = False
    health: Http | None = None  # rank 0's /health; None: not asked
    tokens: float | None = None  # rank 0: vLLM's token counters, summed; None: not read
    probe: Http | None = None  # rank 0: the one-token request; None: not sent
    rendezvous_states: tuple[str, ...] = ()  # headless: TCP states of its sockets to rank 0's master port
    # headless: a TCP connect to rank 0's master port, made only when the group looks gone: "open", "refused"
    # (rank 0's node is up and nothing listens: its unit is not running), another error; "" when not tried.
    rendezvous_port: str = ""


@dataclass(frozen=True)
class State:
    """What the watchdog remembers between checks (the state file). Per invocation of the unit: served,
    failures, closed_checks, last_tokens; across invocations: the restarts and the totals."""

    unit: str = ""
    invocation_id: str = ""
    served: bool = False  # rank 0 answered /health during this invocation: the group formed and loaded
    failures: int = 0  # failing checks in a row (rank 0: stalled; headless: rank 0 lost)
    closed_checks: int = 0  # headless: checks in a row with the rendezvous closed by rank 0
    last_tokens: float | None = None
    restarts: tuple[float, ...] = ()  # when this watchdog restarted the unit, within the window
    last_restart_at: float | None = None
    consecutive_restarts: int = 0  # restarts with no healthy check between them (the back-off's exponent)
    gave_up: bool = False
    totals: Mapping[str, int] = field(default_factory=dict)  # restarts per reason, ever
    # This invocation's start, read from its journal at its first healthy check: seconds from the unit's start to
    # each milestone the log shows (kimi_start_phases; rank 0's first_token is that check's own answer).
    start_timed: bool = False
    start: Mapping[str, float] = field(default_factory=dict)
    # The last restart's evidence (kimi_evidence.py): its directory, when and for which reason.
    evidence: str = ""
    evidence_at: float | None = None
    evidence_reason: str = ""


@dataclass(frozen=True)
class Decision:
    verdict: str
    why: str
    state: State
    reason: str = ""  # the restart reason, also when the bounds refused the restart
    restart: bool = False
    evidence: str = ""  # the restart's log words on its evidence: where it is, or why there is none


@dataclass(frozen=True)
class _Finding:
    verdict: str
    why: str
    reason: str = ""


# ------------------------------------------------------------------------------------------ the decision


def decide(config: Config, state: State, obs: Observation) -> Decision:
    """The verdict of one check and the state to keep. Pure: every input is in the arguments."""
    state = carry_over(config, state, obs.unit)
    state = replace(state, gave_up=state.gave_up and _window_full(config, state, obs.now))
    idle = _not_judged(config, obs)
    if idle is not None:
        # A streak counts judged checks in a row; a pause or a hold breaks it.
        return Decision(idle.verdict, idle.why, replace(state, failures=0, closed_checks=0))
    judge = _judge_rank0 if config.role == RANK0 else _judge_headless
    finding, state = judge(config, state, obs)
    if finding.verdict == "healthy":
        # Serving again: the next fault starts the back-off afresh, and nothing is refused any more.
        state = replace(state, consecutive_restarts=0, gave_up=False)
    if not finding.reason:
        return Decision(finding.verdict, finding.why, state)
    return _bounded(config, state, obs.now, finding)


def carry_over(config: Config, state: State, unit: UnitState) -> State:
    """The state as it stands for this invocation of the unit. A new invocation forgets what was seen of the
    last one; after a give-up it is someone else's restart (the watchdog restarts nothing then), which ends the
    give-up and the back-off."""
    if state.unit != config.unit:
        state = State(unit=config.unit)
    if not unit.invocation_id or unit.invocation_id == state.invocation_id:
        return state
    fresh = replace(
        state,
        invocation_id=unit.invocation_id,
        served=False,
        failures=0,
        closed_checks=0,
        last_tokens=None,
        start_timed=False,
        start={},
    )
    if state.gave_up:
        fresh = replace(fresh, gave_up=False, restarts=(), last_restart_at=None, consecutive_restarts=0)
    return fresh


def wants_probe(config: Config, state: State, health: Http | None, tokens: float | None) -> bool:
    """Rank 0 is asked for one token only when /health answers and vLLM's counter stood still since the last
    check: a group that generates needs no proof, and one that does not answer /health has none to give."""
    return (
        config.role == RANK0
        and bool(config.probe_url)
        and health is not None
        and health.ok
        and not tokens_grew(state.last_tokens, tokens)
    )


def wants_port_check(states: Sequence[str], health: Http | None) -> bool:
    """A headless rank connects to rank 0's master port only when its group looks gone (the rendezvous closed, or
    rank 0's /health failing): never while the group serves, so a healthy rank 0 is never touched by it."""
    return rendezvous_closed(states) or (health is not None and not health.ok and health.error != "timeout")


def needs_a_look(obs: Observation) -> bool:
    """Whether the check asks rank 0 and reads sockets at all: not while paused, held or not active."""
    return not obs.paused and not obs.held and obs.unit.active_state == "active"


def tokens_grew(before: float | None, now: float | None) -> bool:
    return before is not None and now is not None and now > before


def backoff_s(config: Config, consecutive: int) -> float:
    """The wait after `consecutive` restarts in a row: backoff_s, doubling per restart, at most backoff_max_s."""
    if consecutive < 1:
        return 0.0
    return float(min(config.backoff_s * 2 ** (consecutive - 1), config.backoff_max_s))


def _not_judged(config: Config, obs: Observation) -> _Finding | None:
    unit, active = config.unit, obs.unit.active_state
    if obs.paused:
        return _Finding("paused", f"{config.maintenance_file} exists: healing is paused on this node")
    if obs.held:
        return _Finding("held", f"{config.hold_file} exists: the serve phase is restarting the group")
    if active in ("inactive", "failed"):
        # Restart=always brings back anything but a deliberate stop.
        return _Finding("stopped", f"{unit} is {active}: stopped by an operator, left stopped")
    if not active:
        return _Finding("unknown", f"systemctl did not say what state {unit} is in")
    if active != "active":
        return _Finding("transition", f"{unit} is {active}: systemd is starting or stopping it")
    return None


def _age(obs: Observation) -> float:
    """Seconds since the unit's main process started; 0 (just started, the safe side) when unknown."""
    started = obs.unit.started_at
    return max(0.0, obs.now - started) if started is not None else 0.0


def _judge_rank0(config: Config, state: State, obs: Observation) -> tuple[_Finding, State]:
    health_ok = obs.health is not None and obs.health.ok
    before = state.last_tokens
    grew = tokens_grew(before, obs.tokens)
    tokens = obs.tokens if obs.tokens is not None else before
    state = replace(state, served=state.served or health_ok, last_tokens=tokens)
    if not state.served:
        return _rank0_not_served_yet(config, _age(obs)), replace(state, failures=0)
    if grew:
        processed = (obs.tokens or 0.0) - (before or 0.0)
        return _Finding("healthy", f"processed {processed:g} tokens since the last check"), replace(state, failures=0)
    if health_ok and (obs.probe is None or obs.probe.ok):
        how = "answered a one-token request" if obs.probe is not None else "answers /health (not probed)"
        return _Finding("healthy", f"rank 0 {how}"), replace(state, failures=0)
    state = replace(state, failures=state.failures + 1)
    return _streak(_stall(obs), state.failures, config.stall_checks, "the group is hung", "rank0_stalled"), state


def _streak(why: str, failures: int, needed: int, meaning: str, reason: str) -> _Finding:
    """A failing check: suspect until `needed` in a row, then a restart for `reason`."""
    if failures >= needed:
        return _Finding("restart", f"{why}, {failures} checks in a row: {meaning}", reason)
    return _Finding("suspect", f"{why} ({failures}/{needed})")


def _rank0_not_served_yet(config: Config, age: float) -> _Finding:
    """Rank 0 has not answered /health since it started: loading, or waiting at the rendezvous for ranks that
    belong to an older group. The fix for the latter is theirs (their watchdogs restart them), so rank 0 is
    restarted only when it lasts twice the load time."""
    if age < config.load_timeout_s:
        return _Finding("loading", f"started {age:.0f} s ago, within the load grace of {config.load_timeout_s} s")
    if age < 2 * config.load_timeout_s:
        return _Finding(
            "waiting",
            f"not serving {age:.0f} s after its start: waiting at the rendezvous for the headless ranks; "
            f"restarted only after {2 * config.load_timeout_s} s",
        )
    return _Finding("restart", f"never answered /health in the {age:.0f} s since its start", "rank0_never_served")


def _stall(obs: Observation) -> str:
    health = obs.health.describe() if obs.health is not None else "not asked"
    if obs.health is None or not obs.health.ok:
        return f"/health {health} after serving, no tokens processed since the last check"
    probe = obs.probe.describe() if obs.probe is not None else "not sent"
    return f"/health 200 but the one-token request got {probe} and no tokens were processed since the last check"


def _judge_headless(config: Config, state: State, obs: Observation) -> tuple[_Finding, State]:
    finding, state = _judge_headless_group(config, state, obs)
    if finding.verdict in ("suspect", "restart") and obs.rendezvous_port == PORT_REFUSED:
        # Rank 0's unit is not running: an operator's stop (or rank 0 between a stop and its start). A restart
        # here is a full reload of this rank's weights for a rank 0 that may never come; the streaks keep
        # counting, so the rank follows at once when rank 0 listens again (a restart of rank 0, or its start).
        return _rank0_stopped(config), state
    return finding, state


def _rank0_stopped(config: Config) -> _Finding:
    return _Finding(
        "rank0_stopped",
        f"nothing listens on rank 0's rendezvous ({config.rendezvous}): rank 0 is not running (stopped by an "
        "operator, or not started yet); this rank keeps its process and follows when rank 0 listens again",
    )


def _judge_headless_group(config: Config, state: State, obs: Observation) -> tuple[_Finding, State]:
    closed = rendezvous_closed(obs.rendezvous_states)
    health_ok = obs.health is not None and obs.health.ok
    served = state.served or (health_ok and _in_a_group(config, obs))
    state = replace(state, served=served, closed_checks=state.closed_checks + 1 if closed else 0)
    if closed:
        return _closed_rendezvous(config, state), state
    if not config.health_url:
        verdict = "loading" if _age(obs) < config.load_timeout_s else "unknown"
        return _Finding(
            verdict, "rank 0's API is not reachable from this node: only the rendezvous rule applies"
        ), state
    if health_ok:
        return _Finding("healthy", "rank 0 answers /health"), replace(state, failures=0)
    if obs.health is not None and obs.health.error == "timeout":
        # Rank 0 accepted the connection and is slow to answer (a busy API server on a loaded host): it is there.
        # A hung group is rank 0's own watchdog's to see.
        return _Finding("busy", "rank 0 accepted /health but answered slowly: it is alive"), replace(state, failures=0)
    if state.served:
        return _rank0_failing(config, replace(state, failures=state.failures + 1), obs)
    return _never_joined(config, obs), replace(state, failures=0)


def _in_a_group(config: Config, obs: Observation) -> bool:
    """Whether rank 0's answer is this rank's group's: the rank holds a live connection to rank 0's rendezvous.

    A rank started while the previous rank 0 drains (its watchdog restarting it) sees that old rank 0 answer
    /health before joining anything. Counting that answer as "the group served" would make the old rank 0's exit
    look like the loss of this rank's group, and restart it just as it joins the new rank 0 (measured in the lab:
    the two watchdogs then kept breaking each other's group for minutes). Without a rendezvous to look at (layouts
    other than mp), /health is all there is.
    """
    return not config.rendezvous or "ESTAB" in obs.rendezvous_states


def _closed_rendezvous(config: Config, state: State) -> _Finding:
    seen = f"its connection to rank 0's rendezvous ({config.rendezvous}) was closed by rank 0"
    if state.closed_checks >= CLOSED_CONFIRMATIONS:
        return _Finding(
            "restart",
            f"{seen} ({state.closed_checks} checks): rank 0 restarted and waits for a new group",
            "rendezvous_closed",
        )
    return _Finding("suspect", f"{seen}; confirming at the next check")


def _rank0_failing(config: Config, state: State, obs: Observation) -> tuple[_Finding, State]:
    health = obs.health.describe() if obs.health is not None else "not asked"
    why = f"rank 0's /health: {health} after it answered during this rank's run"
    meaning = "the group this rank joined is gone"
    return _streak(why, state.failures, config.lost_checks, meaning, "rank0_lost"), state


def _never_joined(config: Config, obs: Observation) -> _Finding:
    """Rank 0 has not answered since this rank started. While the rank holds a live connection to rank 0's
    rendezvous it belongs to a group (still loading, or rank 0's API unreachable from here): left alone."""
    age = _age(obs)
    if age < config.load_timeout_s:
        return _Finding("loading", f"started {age:.0f} s ago, within the load grace of {config.load_timeout_s} s")
    if "ESTAB" in obs.rendezvous_states:
        return _Finding("waiting", "connected to rank 0's rendezvous, rank 0 not answering /health yet")
    return _Finding(
        "restart",
        f"rank 0 never answered /health in the {age:.0f} s since this rank started, and it holds no connection "
        "to rank 0's rendezvous: it never joined a group",
        "never_joined",
    )


def _window(config: Config, state: State, now: float) -> tuple[float, ...]:
    return tuple(at for at in state.restarts if now - at < config.restart_window_s)


def _window_full(config: Config, state: State, now: float) -> bool:
    return len(_window(config, state, now)) >= config.max_restarts


def _bounded(config: Config, state: State, now: float, finding: _Finding) -> Decision:
    """A restart, unless the window's restarts are spent (give up) or the back-off has not passed."""
    recent = _window(config, state, now)
    state = replace(state, restarts=recent)
    if len(recent) >= config.max_restarts:
        until = min(recent) + config.restart_window_s
        why = (
            f"{finding.why}; {len(recent)} restarts in the last {config.restart_window_s} s: gave up until "
            f"{_clock(until)} or until someone else restarts {config.unit}"
        )
        return Decision("gave_up", why, replace(state, gave_up=True), finding.reason)
    last = state.last_restart_at
    wait = backoff_s(config, state.consecutive_restarts) - (now - last) if last is not None else 0.0
    if wait > 0:
        why = f"{finding.why}; back-off after {state.consecutive_restarts} restart(s) in a row: {wait:.0f} s left"
        return Decision("backoff", why, state, finding.reason)
    totals = {**state.totals, finding.reason: state.totals.get(finding.reason, 0) + 1}
    state = replace(
        state,
        restarts=(*recent, now),
        last_restart_at=now,
        consecutive_restarts=state.consecutive_restarts + 1,
        gave_up=False,
        failures=0,
        closed_checks=0,
        totals=totals,
    )
    return Decision("restart", finding.why, state, finding.reason, restart=True)


def _clock(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(seconds))


# ------------------------------------------------------------------------------------------ parsers


def processed_tokens(metrics_text: str) -> float | None:
    """vLLM's token counters (prompt and generated) from a /metrics page, summed over their label sets; None when
    neither is there."""
    total, found = 0.0, False
    for line in metrics_text.splitlines():
        sample = _sample(line)
        if sample is not None and sample[0] in TOKEN_COUNTERS:
            total += sample[1]
            found = True
    return total if found else None


def _sample(line: str) -> tuple[str, float] | None:
    """(name, value) of one exposition line; None for comments, blanks and lines that do not parse."""
    line = line.strip()
    if not line or line.startswith("#"):
        return None
    if "{" in line:
        name, _, rest = line.partition("{")
        words = rest[rest.rfind("}") + 1 :].split()
    else:
        name, *words = line.split()
    try:
        return name.strip(), float(words[0])
    except (IndexError, ValueError):
        return None


def read_env_file(text: str) -> dict[str, str]:
    """KEY=VALUE lines of a systemd EnvironmentFile (comments skipped, one pair of quotes removed)."""
    values = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")) or "=" not in line:
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        values[key.strip()] = value
    return values


# ------------------------------------------------------------------------------------------ state and metrics


def state_to_json(state: State) -> str:
    data = asdict(state)
    data["restarts"] = list(state.restarts)
    data["totals"] = dict(state.totals)
    data["start"] = dict(state.start)
    return json.dumps({"version": 1, **data}, indent=2, sort_keys=True) + "\n"


def state_from_json(text: str) -> State:
    """The kept state; a fresh one when the text is not a state this version wrote (a corrupt file must not
    stop the watchdog, and forgetting costs at most a few checks)."""
    try:
        data = json.loads(text)
    except ValueError:
        return State()
    if not isinstance(data, dict) or data.get("version") != 1:
        return State()
    known = {f.name for f in fields(State)}
    values = {key: value for key, value in data.items() if key in known}
    try:
        values["restarts"] = tuple(float(at) for at in values.get("restarts", ()))
        values["totals"] = {str(k): int(v) for k, v in dict(values.get("totals", {})).items()}
        values["start"] = {str(k): float(v) for k, v in dict(values.get("start", {})).items()}
        return State(**values)
    except (TypeError, ValueError):
        return State()


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(**labels: str) -> str:
    return "{" + ",".join(f'{key}="{_label_value(value)}"' for key, value in labels.items()) + "}"


def metrics_text(config: Config, decision: Decision, now: float, marker_present: bool | None) -> str:
    """The textfile collector's kimi_watchdog.prom: restarts per reason (cumulative, from the state), give-up,
    pause, the last check's time and verdict (every verdict written, 1 for this one, so a series never
    vanishes), and whether the checkpoint's marker is on disk."""
    unit = config.unit
    state = decision.state
    reasons = list(REASONS[config.role]) + sorted(set(state.totals) - set(REASONS[config.role]))
    families: list[tuple[str, str, str, list[tuple[str, float]]]] = [
        (
            "kimi_watchdog_restarts_total",
            "counter",
            "Restarts of this node's vLLM unit by the kimi watchdog, by reason.",
            [(_labels(unit=unit, reason=r), state.totals.get(r, 0)) for r in reasons],
        ),
        (
            "kimi_watchdog_gave_up",
            "gauge",
            "1 while the watchdog refuses restarts: its restarts within the window are spent.",
            [(_labels(unit=unit), int(state.gave_up))],
        ),
        (
            "kimi_watchdog_paused",
            "gauge",
            "1 while the maintenance file pauses healing on this node.",
            [(_labels(unit=unit), int(decision.verdict == "paused"))],
        ),
        (
            "kimi_watchdog_last_check_timestamp_seconds",
            "gauge",
            "When the watchdog last judged this node's vLLM unit.",
            [(_labels(unit=unit), now)],
        ),
        (
            "kimi_watchdog_verdict",
            "gauge",
            "The last check's verdict (1) among all verdicts (0).",
            [(_labels(unit=unit, verdict=v), int(v == decision.verdict)) for v in VERDICTS],
        ),
    ]
    if state.start:
        families.append(
            (
                "kimi_watchdog_start_seconds",
                "gauge",
                "Seconds from the start of this node's vLLM unit to each milestone of that start its journal shows.",
                [(_labels(unit=unit, milestone=name), at) for name, at in state.start.items()],
            )
        )
    if state.evidence:
        families.append(
            (
                "kimi_watchdog_last_evidence_timestamp_seconds",
                "gauge",
                "When the watchdog last took evidence before a restart; the label path is where it is on this node.",
                [(_labels(unit=unit, reason=state.evidence_reason, path=state.evidence), state.evidence_at or 0)],
            )
        )
    if marker_present is not None:
        families.append(
            (
                "kimi_checkpoint_marker_present",
                "gauge",
                "1 when the checkpoint phase's marker file is on disk.",
                [(_labels(path=config.marker_path), int(marker_present))],
            )
        )
    lines = []
    for name, kind, help_text, samples in families:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        lines += [f"{name}{labels} {_number(value)}" for labels, value in samples]
    return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else repr(float(value))


def write_atomically(path: Path, text: str, mode: int = 0o644) -> None:
    """Write through a temporary file in the same directory and rename it: a reader (node-exporter, the next
    check) sees the old file or the new one, never half of one. The temporary name does not end in .prom, so
    the textfile collector never reads it."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        Path(temporary).chmod(mode)
        Path(temporary).replace(path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def ensure_directory(path: Path, mode: int) -> None:
    """Create a missing directory with this mode (the umask does not decide it); leave an existing one alone."""
    if not path.is_dir():
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(mode)


# ------------------------------------------------------------------------------------------ observers

Runner = Callable[[Sequence[str]], tuple[int, str, str]]
Requester = Callable[[str, bytes | None, Mapping[str, str], float], tuple[Http, str]]


def run_command(argv: Sequence[str]) -> tuple[int, str, str]:
    """(returncode, stdout, stderr); 127 and the error when the command cannot run at all."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return 127, "", str(error)
    return done.returncode, done.stdout, done.stderr


def http_request(url: str, body: bytes | None, headers: Mapping[str, str], timeout: float) -> tuple[Http, str]:
    """GET (body None) or POST one URL. No proxy: every URL is rank 0's, on this node or the cluster network, and a
    proxy from the environment would answer for a rank 0 that is gone."""
    request = urllib.request.Request(url, data=body, headers=dict(headers), method="GET" if body is None else "POST")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=timeout) as response:
            return Http(response.status), response.read(MAX_BODY).decode("utf-8", "replace")
    except urllib.error.HTTPError as error:
        return Http(error.code, f"HTTP {error.code}"), ""
    except urllib.error.URLError as error:
        # urllib wraps what happens before the request is sent (the connection): a connect timeout is a rank 0
        # that is not there, unlike a slow answer below.
        if isinstance(error.reason, TimeoutError):
            return Http(0, CONNECT_TIMEOUT), ""
        return Http(0, _network_error(error.reason)), ""
    except (OSError, http.client.HTTPException) as error:
        return Http(0, _network_error(error)), ""


def _network_error(reason: object) -> str:
    if isinstance(reason, ConnectionRefusedError):
        return "refused"
    if isinstance(reason, TimeoutError):
        # Raised while waiting for the answer: rank 0 accepted the connection but did not answer in time.
        return "timeout"
    return f"unreachable ({reason})"


def tcp_connect(address: str, timeout: float) -> str:
    """Whether anything listens on "HOST:PORT": PORT_OPEN, PORT_REFUSED, or why neither (a connect timeout: a node
    that is down). The connection is closed at once without a byte sent; rank 0's store reads it as a client that
    went away."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return PORT_OPEN
    except ConnectionRefusedError:
        return PORT_REFUSED
    except TimeoutError:
        return CONNECT_TIMEOUT
    except (OSError, ValueError) as error:
        return _network_error(error)


def read_unit(run: Runner, unit: str) -> UnitState:
    argv = ["systemctl", "show", "-p", "ActiveState", "-p", "InvocationID", "-p", "ExecMainStartTimestamp"]
    code, out, _ = run([*argv, "--timestamp=unix", unit])
    if code != 0:
        return UnitState("")
    values = parse_unit(out)
    return UnitState(
        values.get("ActiveState", ""),
        values.get("InvocationID", ""),
        unix_timestamp(values.get("ExecMainStartTimestamp")),
    )


def hold_active(path: str, now: float, max_age_s: float) -> bool:
    """The serve phase's hold, unless it is older than a group restart can take (a run that died half-way)."""
    if not path:
        return False
    try:
        return now - Path(path).stat().st_mtime < max_age_s
    except OSError:
        return False


def _exists(path: str) -> bool | None:
    try:
        return Path(path).exists()
    except OSError:
        return None


def api_key(config: Config, environ: Mapping[str, str]) -> str:
    key = environ.get(config.api_key_env, "")
    if key or not config.api_key_env_file:
        return key
    try:
        text = Path(config.api_key_env_file).read_text(encoding="utf-8")
    except OSError:
        return ""
    return read_env_file(text).get(config.api_key_env, "")


@dataclass(frozen=True)
class System:
    """The watchdog's reach into the node; tests hand in fakes."""

    run: Runner = run_command
    request: Requester = http_request
    connect: Callable[[str, float], str] = tcp_connect
    clock: Callable[[], float] = time.time
    environ: Mapping[str, str] = field(default_factory=lambda: os.environ)
    emit: Callable[[str], None] = print
    evidence: Callable[[EvidenceRequest], EvidenceResult] = capture_evidence


def observe(config: Config, state: State, obs: Observation, system: System) -> Observation:
    """Ask rank 0 (and, on a headless rank, read the sockets) for what the role's rules need."""
    health = None
    if config.health_url:
        health, _ = system.request(config.health_url, None, {}, config.http_timeout_s)
    if config.role == HEADLESS:
        states: tuple[str, ...] = ()
        port = ""
        if config.rendezvous:
            _, out, _ = system.run(["ss", "-Htan"])
            states = tuple(rendezvous_states(out, config.rendezvous))
            if wants_port_check(states, health):
                port = system.connect(config.rendezvous, config.http_timeout_s)
        return replace(obs, health=health, rendezvous_states=states, rendezvous_port=port)
    tokens = None
    if config.metrics_url:
        answer, text = system.request(config.metrics_url, None, {}, config.http_timeout_s)
        tokens = processed_tokens(text) if answer.ok else None
        if answer.ok and config.metrics_cache_path:
            _keep_metrics(Path(config.metrics_cache_path), text)
    probe = _probe(config, system) if wants_probe(config, state, health, tokens) else None
    return replace(obs, health=health, tokens=tokens, probe=probe)


def _keep_metrics(path: Path, text: str) -> None:
    """The last /metrics read, for a restart's evidence: a hung rank 0 no longer answers one. Best effort: a
    check never fails for it."""
    try:
        ensure_directory(path.parent, 0o750)
        write_atomically(path, text, 0o640)
    except OSError:
        pass


def _probe(config: Config, system: System) -> Http:
    body = json.dumps({"model": config.served_model_name, "prompt": "ping", "max_tokens": 1}).encode()
    headers = {"Content-Type": "application/json"}
    key = api_key(config, system.environ)
    if key:
        headers["Authorization"] = f"Bearer {key}"
    answer, _ = system.request(config.probe_url, body, headers, config.probe_timeout_s)
    return answer


# ------------------------------------------------------------------------------------------ one check


def check(config: Config, system: System, *, dry_run: bool = False) -> Decision:
    """One check: observe, decide, restart when due, keep the state, write the metrics, log one line."""
    now = system.clock()
    state_path = Path(config.state_path)
    kept = _load_state(state_path)
    unit = read_unit(system.run, config.unit)
    # Whether an earlier check saw this very start before it served: only then is this check's first healthy
    # answer its first token (a watchdog installed after the start, the first deploy's, saw none of it).
    watched_the_load = bool(unit.invocation_id) and kept.invocation_id == unit.invocation_id and not kept.served
    state = carry_over(config, kept, unit)
    obs = Observation(
        now=now,
        unit=unit,
        paused=bool(config.maintenance_file) and Path(config.maintenance_file).exists(),
        held=hold_active(config.hold_file, now, config.hold_max_age_s),
    )
    if needs_a_look(obs):
        obs = observe(config, state, obs, system)
    decision = decide(config, state, obs)
    if decision.restart and not dry_run:
        decision = _restart(config, state, obs, decision, system)
    if wants_start_timing(decision, unit) and not dry_run:
        first_token = now if config.role == RANK0 and watched_the_load else None
        decision = _time_start(config, unit, decision, first_token, system)
    if not dry_run:
        ensure_directory(state_path.parent, 0o700)
        write_atomically(state_path, state_to_json(decision.state), 0o600)
        textfile_dir = Path(config.textfile_dir)
        ensure_directory(textfile_dir, TEXTFILE_DIR_MODE)
        marker = _exists(config.marker_path) if config.marker_path else None
        write_atomically(textfile_dir / METRICS_FILE, metrics_text(config, decision, now, marker))
    _log(config, decision, system, dry_run=dry_run)
    return decision


def wants_start_timing(decision: Decision, unit: UnitState) -> bool:
    """A start is read from its journal once, at the first healthy check of its invocation: by then every milestone
    up to the first token is in the journal (on rank 0 that check's probe or token counter is the first token, when
    an earlier check saw the start loading)."""
    return decision.verdict == "healthy" and not decision.state.start_timed and bool(unit.invocation_id)


def _time_start(
    config: Config, unit: UnitState, decision: Decision, first_token: float | None, system: System
) -> Decision:
    argv = ["journalctl", "-u", config.unit, f"_SYSTEMD_INVOCATION_ID={unit.invocation_id}", "-o", "json"]
    code, out, _ = system.run([*argv, "--no-pager", "--quiet"])
    offsets = start_offsets(out if code == 0 else "", unit, first_token)
    if offsets:
        line = ", ".join(f"{name} {at:.1f} s" for name, at in offsets.items())
        system.emit(_prefixed(system, INFO, f"{config.unit}: start timed (seconds after its start): {line}"))
    return replace(decision, state=replace(decision.state, start_timed=True, start=offsets))


def start_offsets(journal_json: str, unit: UnitState, first_token_at: float | None) -> dict[str, float]:
    """Seconds from the unit's start to each milestone of this invocation's start its journal shows (none when the
    start time is unknown)."""
    phases = start_phases(
        parse_journal_json(journal_json), unit.invocation_id, started_at=unit.started_at, first_token_at=first_token_at
    )
    started = phases.milestones.started
    if started is None:
        return {}
    found = asdict(phases.milestones)
    return {name: round(at - started, 3) for name, at in found.items() if at is not None and name != "started"}


def _load_state(path: Path) -> State:
    try:
        return state_from_json(path.read_text(encoding="utf-8"))
    except OSError:
        return State()


def _restart(config: Config, state: State, obs: Observation, decision: Decision, system: System) -> Decision:
    """`systemctl restart --no-block`: one job, so nothing can leave the unit stopped half-way (a stopped unit
    reads as an operator's stop, which no watchdog would ever start again), and --no-block because stopping a
    rank stuck in a collective takes up to TimeoutStopSec, longer than a check may run. The serve phase may have
    put its hold in place while rank 0 was probed: looked at once more, right before acting."""
    if hold_active(config.hold_file, system.clock(), config.hold_max_age_s):
        return decide(config, state, replace(obs, held=True))
    decision = _take_evidence(config, obs, decision, system)
    code, out, err = system.run(["systemctl", "restart", "--no-block", config.unit])
    if code != 0:
        system.emit(
            _prefixed(system, ERROR, f"{config.unit}: systemctl restart failed ({code}): {(err or out).strip()}")
        )
    return decision


def evidence_request(config: Config, reason: str, why: str, invocation_id: str = "") -> EvidenceRequest:
    return EvidenceRequest(
        directory=config.evidence_dir,
        unit=config.unit,
        reason=reason,
        why=why,
        units=config.evidence_units or (config.unit,),
        journal_lines=config.evidence_journal_lines,
        metrics_url=config.metrics_url,
        metrics_cache=config.metrics_cache_path,
        py_spy=config.evidence_py_spy,
        timeout_s=config.evidence_timeout_s,
        keep=config.evidence_keep,
        max_bytes=config.evidence_max_mb * 1024 * 1024,
        invocation_id=invocation_id,
    )


def _take_evidence(config: Config, obs: Observation, decision: Decision, system: System) -> Decision:
    """What the restart is about to destroy, within evidence_timeout_s. A capture that fails is said in the restart's
    line and never stops the restart."""
    if not config.evidence_dir:
        return decision
    request = evidence_request(config, decision.reason, decision.why, obs.unit.invocation_id)
    try:
        result = system.evidence(request)
    except Exception as error:  # the heal goes on whatever the capture hit
        return replace(decision, evidence=f"no evidence ({type(error).__name__}: {error})")
    if not result.path:
        return replace(decision, evidence=f"no evidence ({'; '.join(result.problems)})")
    missing = f", without {len(result.problems)} part(s): see its incident.json" if result.problems else ""
    state = replace(decision.state, evidence=result.path, evidence_at=obs.now, evidence_reason=decision.reason)
    return replace(decision, state=state, evidence=f"evidence in {result.path} ({result.seconds:.1f} s{missing})")


def _prefixed(system: System, priority: int, line: str) -> str:
    # The journal reads "<N>" as the line's priority only when stdout is its stream; by hand it is noise.
    return f"<{priority}>{line}" if "JOURNAL_STREAM" in system.environ else line


def _log(config: Config, decision: Decision, system: System, *, dry_run: bool) -> None:
    prefix = "(dry run) " if dry_run else ""
    if decision.restart:
        line = f"{prefix}{config.unit}: restarting ({decision.reason}): {decision.why}"
        if decision.evidence:
            line += f"; {decision.evidence}"
        system.emit(_prefixed(system, WARNING, line))
        return
    reason = f" ({decision.reason})" if decision.reason else ""
    priority = WARNING if decision.verdict in ("gave_up", "backoff") else INFO
    system.emit(_prefixed(system, priority, f"{prefix}{config.unit}: {decision.verdict}{reason}: {decision.why}"))


def load_config(path: Path) -> Config:
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ConfigError("the config is not a JSON object")
    return config_from_mapping(data)


def main(argv: Sequence[str] | None = None, system: System | None = None) -> int:
    parser = argparse.ArgumentParser(description="Judge this node's vLLM unit once; restart it when its group is gone.")
    parser.add_argument("--config", default=DEFAULT_CONFIG, help=f"the JSON config (default {DEFAULT_CONFIG})")
    parser.add_argument("--dry-run", action="store_true", help="say what would be done; restart and write nothing")
    parser.add_argument(
        "--evidence",
        action="store_true",
        help="take the evidence a restart would take (reason `manual`) into evidence_dir, print where; restart nothing",
    )
    args = parser.parse_args(argv)
    system = system or System()
    try:
        config = load_config(Path(args.config))
    except (OSError, ValueError) as error:
        system.emit(_prefixed(system, ERROR, f"kimi-watchdog: cannot use {args.config}: {error}"))
        return 2
    if args.evidence:
        return _evidence_by_hand(config, system)
    check(config, system, dry_run=args.dry_run)
    return 0


def _evidence_by_hand(config: Config, system: System) -> int:
    """An operator's capture of a rank that looks wrong, before deciding what to do with it."""
    if not config.evidence_dir:
        system.emit("kimi-watchdog: evidence_dir is empty in the config: no evidence is taken on this node")
        return 2
    unit = read_unit(system.run, config.unit)
    result = system.evidence(evidence_request(config, "manual", "taken by hand (--evidence)", unit.invocation_id))
    if not result.path:
        system.emit(f"kimi-watchdog: no evidence: {'; '.join(result.problems)}")
        return 1
    system.emit(f"{result.path} ({result.seconds:.1f} s)")
    for problem in result.problems:
        system.emit(f"  missing: {problem}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
