"""Coding agents' sessions replayed through the lab's router, with and without session affinity.

Each session is a coding agent: it sends a prompt, gets an answer, "runs a tool" for a moment and sends the whole
session again with new text (the same turns verify's probe sends: plugins/module_utils/kimi_prefix_probe.py),
several sessions at once. Every turn is streamed, so its time to first token is measured where a client sees it,
and vLLM's final usage chunk says how many of its prompt tokens came from the replica's prefix cache. Sent without
the session header the router balances each turn by leastconn; with it, by the session's hash.

Bounded: a fixed number of sessions, turns and concurrent sessions, a pause between turns (the agent's own tool
time, which also keeps the load under the lab's per-key rate limit), and a deadline.
"""

from __future__ import annotations

import http.client
import json
import re
import statistics
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

from ansible_collections.kimi.k2.plugins.module_utils.kimi_prefix_probe import first_prompt, next_prompt

from tests.lab_api import SERVED_MODEL, FrontDoor, assert_routes_via_lab_bridge

# A replay's requests with more prompt tokens than this are the sessions' (the router's health checks ask one
# token with "ping"); vLLM's request_prompt_tokens histogram has a bucket boundary here.
SESSION_PROMPT_MIN_TOKENS = 100


@dataclass(frozen=True)
class TurnResult:
    session: str
    turn: int
    ttft_s: float
    seconds: float
    prompt_tokens: int
    cached_tokens: int


def stream_turn(
    door: FrontDoor, prompt: str, headers: Mapping[str, str], max_tokens: int, timeout: float = 120
) -> tuple[str, float, float, Mapping]:
    """(answer text, seconds to the first token, seconds to [DONE], usage) of one streamed completion."""
    assert_routes_via_lab_bridge(door.address)
    body = {
        "model": SERVED_MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sent = {"Content-Type": "application/json", "Authorization": f"Bearer {door.key}", **headers}
    connection = http.client.HTTPSConnection(door.address, door.port, context=door.context(), timeout=timeout)
    started = time.monotonic()
    first_token: float | None = None
    text: list[str] = []
    usage = None
    try:
        connection.request("POST", "/v1/completions", body=json.dumps(body).encode(), headers=sent)
        reply = connection.getresponse()
        if reply.status != 200:
            raise RuntimeError(f"status {reply.status}: {reply.read()[:200]!r}")
        for raw in reply:
            line = raw.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            # The first chunk that carries a choice is the first token's, even when the token adds no text yet
            # (part of a multi-byte character, or the end of the answer).
            if chunk.get("choices") and first_token is None:
                first_token = time.monotonic() - started
            text += [choice.get("text") or "" for choice in chunk.get("choices") or []]
            usage = chunk.get("usage") or usage
    finally:
        connection.close()
    if usage is None or first_token is None:
        raise RuntimeError("the stream ended without a token or without its usage")
    return "".join(text), first_token, time.monotonic() - started, usage


@dataclass(frozen=True)
class Replay:
    """The shape of one replay: sessions, turns, text sizes, concurrency, pause and deadline."""

    sessions: int = 12
    turns: int = 6
    first_words: int = 600
    new_words: int = 40
    max_tokens: int = 16
    concurrency: int = 4
    pause_s: float = 1.0
    deadline_s: float = 600


def run_replay(door: FrontDoor, shape: Replay, name: str, session_header: str | None) -> list[TurnResult]:
    """Every session of the replay; session_header None sends no session header (leastconn)."""
    deadline = time.monotonic() + shape.deadline_s
    results: list[TurnResult] = []
    lock = threading.Lock()

    def one_session(index: int) -> None:
        session = f"{name}-{index}"
        headers = {session_header: session} if session_header else {}
        prompt, answer = first_prompt(session, shape.first_words), ""
        for turn in range(shape.turns):
            if time.monotonic() > deadline:
                raise TimeoutError(f"replay {name}: past its {shape.deadline_s} s deadline")
            if turn:
                time.sleep(shape.pause_s)
                prompt = next_prompt(session, turn, prompt, answer, shape.new_words)
            answer, ttft, seconds, usage = stream_turn(door, prompt, headers, shape.max_tokens)
            details = usage.get("prompt_tokens_details") or {}
            with lock:
                cached = int(details.get("cached_tokens") or 0)
                results.append(
                    TurnResult(session, turn, round(ttft, 4), round(seconds, 4), int(usage["prompt_tokens"]), cached)
                )

    with ThreadPoolExecutor(max_workers=shape.concurrency) as pool:
        for done in [pool.submit(one_session, index) for index in range(shape.sessions)]:
            done.result()
    return results


_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")


def sample_sum(metrics: str, name: str, label: str = "") -> float:
    """The sum of a metric's samples over its label sets (only those whose labels contain `label`)."""
    total = 0.0
    for line in metrics.splitlines():
        match = _SAMPLE.match(line)
        if match and match["name"] == name and label in (match["labels"] or ""):
            total += float(match["value"])
    return total


def replica_counters(metrics: str) -> dict[str, float]:
    """What the replay reads of one replica's /metrics: prefix-cache hits and queries (tokens), and the requests
    with more than SESSION_PROMPT_MIN_TOKENS prompt tokens."""
    over = sample_sum(metrics, "vllm:request_prompt_tokens_count") - sample_sum(
        metrics, "vllm:request_prompt_tokens_bucket", f'le="{SESSION_PROMPT_MIN_TOKENS}.0"'
    )
    return {
        "hits": sample_sum(metrics, "vllm:prefix_cache_hits_total"),
        "queries": sample_sum(metrics, "vllm:prefix_cache_queries_total"),
        "session_requests": over,
    }


def difference(after: Mapping[str, float], before: Mapping[str, float]) -> dict[str, float]:
    return {key: after[key] - before[key] for key in after}


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def summary(results: list[TurnResult], per_replica: Mapping[str, Mapping[str, float]]) -> dict:
    """The figures of one replay: hit rate of the turns after the first, TTFT mean and p99 (all turns and the
    later ones), and each replica's requests and hit rate from its own counters."""
    later = [r for r in results if r.turn > 0]
    cached, prompt = sum(r.cached_tokens for r in later), sum(r.prompt_tokens for r in later)
    return {
        "requests": len(results),
        "hit_rate_after_first_turn": round(cached / prompt, 4) if prompt else None,
        "later_turns": len(later),
        "later_turns_without_a_hit": sum(1 for r in later if r.cached_tokens == 0),
        "ttft_mean_s": round(statistics.fmean(r.ttft_s for r in results), 4),
        "ttft_p99_s": round(p99([r.ttft_s for r in results]), 4),
        "ttft_mean_after_first_turn_s": round(statistics.fmean(r.ttft_s for r in later), 4),
        "ttft_p99_after_first_turn_s": round(p99([r.ttft_s for r in later]), 4),
        "replicas": {
            name: {
                "session_requests": int(counts["session_requests"]),
                "hit_rate": round(counts["hits"] / counts["queries"], 4) if counts["queries"] else None,
            }
            for name, counts in per_replica.items()
        },
        "turns": [asdict(r) for r in results],
    }
