"""A coding agent's session, turn by turn, and the share of its prompt tokens vLLM served from its prefix cache.

An agent sends its whole session again on every step: each turn's prompt is the previous prompt, the model's
answer to it and new text (a file read, a command's output). With prefix caching, the replica that served the
previous turn skips the prefill of everything it has cached; another replica prefills it all again. vLLM says
in every answer how many prompt tokens came from its cache (`usage.prompt_tokens_details.cached_tokens`, with
--enable-prompt-tokens-details, which the serve phase sets with kimi_prefix_caching), so a session's hit rate is
read from vLLM's own counts, per request, whatever else the replica serves at the time.

The session's text is made here, deterministic per session name: words drawn from a fixed list, so that the
probe ships with the project and never reads a dataset from a hub. Written by hand because no library replays a
session turn by turn; the HTTP is the caller's (the kimi_prefix_probe module uses ansible-core's fetch_url, the
lab's replay uses http.client), so this file has no I/O of its own.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

# Words an agent's context is made of (code, paths, shell output): one or two tokens each in most tokenizers.
WORDS = (
    "def", "return", "import", "class", "self", "value", "path", "config", "error", "result", "request",
    "response", "handler", "node", "rank", "token", "cache", "prefix", "session", "model", "layer", "weight",
    "tensor", "shape", "batch", "queue", "worker", "thread", "lock", "timeout", "retry", "status", "check",
    "test", "assert", "expected", "actual", "line", "file", "directory", "build", "install", "version", "package",
    "module", "function", "argument", "option", "default", "true", "false", "none", "list", "dict", "string",
    "number", "index", "offset", "length", "count", "total", "first", "last", "next", "previous",
)  # fmt: skip


class ProbeAnswerError(ValueError):
    """An answer that is not an OpenAI completion with a usage block."""


@dataclass(frozen=True)
class Turn:
    """One request of the session: vLLM's counts and the time to its whole answer."""

    prompt_tokens: int
    # None: the answer said nothing about cached tokens (vLLM without --enable-prompt-tokens-details).
    cached_tokens: int | None
    seconds: float


def new_text(session: str, turn: int, words: int) -> str:
    """The text turn `turn` of `session` adds: the same words for the same session, turn and count."""
    draw = random.Random(f"{session}/{turn}")
    return " ".join(draw.choice(WORDS) for _ in range(words))


# Tokens per word the sizing below assumes: above what tokenizers give for these words (the lab's miniature
# tokenizer: 1.7; Kimi's: about 1), so the session's last turn stays inside the context.
TOKENS_PER_WORD = 2


def words_within(max_model_len: int, turns: int, first_words: int, new_words: int, max_tokens: int) -> tuple[int, int]:
    """(first_words, new_words), scaled down together when the session's last turn (every prompt's words, the
    answers and the last answer) could exceed max_model_len tokens; 0 means no limit."""
    if max_model_len <= 0:
        return first_words, new_words
    words = first_words + (turns - 1) * new_words
    room = max_model_len - turns * max_tokens - 16  # the answers, and the session's name and line breaks
    if words * TOKENS_PER_WORD <= room:
        return first_words, new_words
    scale = max(room, 0) / (words * TOKENS_PER_WORD)
    return max(int(first_words * scale), 1), max(int(new_words * scale), 1)


def first_prompt(session: str, words: int) -> str:
    """The session's first prompt. It starts with the session's name, so no earlier session's cache matches it:
    a later turn's hits can only come from this session's own earlier turns."""
    return f"session {session}\n{new_text(session, 0, words)}"


def next_prompt(session: str, turn: int, previous_prompt: str, answer: str, words: int) -> str:
    """Turn `turn`'s prompt: everything so far, the answer to it, and new text."""
    return f"{previous_prompt}{answer}\n{new_text(session, turn, words)}"


def turn_of(answer: Mapping[str, Any], seconds: float) -> tuple[str, Turn]:
    """The answer's text and its counts, from a /v1/completions answer."""
    usage = answer.get("usage")
    choices = answer.get("choices")
    if not isinstance(usage, Mapping) or not isinstance(choices, Sequence) or not choices:
        raise ProbeAnswerError(f"not a completion with usage: {str(answer)[:200]}")
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    text = choices[0].get("text", "") if isinstance(choices[0], Mapping) else ""
    return str(text), Turn(int(usage.get("prompt_tokens", 0)), None if cached is None else int(cached), seconds)


# ask(prompt) -> (the completion answer as JSON, seconds it took)
Ask = Callable[[str], tuple[Mapping[str, Any], float]]


def run_session(ask: Ask, session: str, turns: int, first_words: int, new_words: int) -> list[Turn]:
    """Send the session's turns one after the other, each built on the previous answer."""
    prompt, answer_text = first_prompt(session, first_words), ""
    done: list[Turn] = []
    for turn in range(turns):
        if turn:
            prompt = next_prompt(session, turn, prompt, answer_text, new_words)
        answer, seconds = ask(prompt)
        answer_text, counts = turn_of(answer, seconds)
        done.append(counts)
    return done


def cached_share(turns: Sequence[Turn]) -> tuple[int, int] | None:
    """(cached, prompt) tokens over the turns after the first; None when an answer had no cached count."""
    later = turns[1:]
    if any(turn.cached_tokens is None for turn in later):
        return None
    return sum(turn.cached_tokens or 0 for turn in later), sum(turn.prompt_tokens for turn in later)


def hit_rate(turns: Sequence[Turn]) -> float | None:
    share = cached_share(turns)
    if share is None or share[1] == 0:
        return None
    return share[0] / share[1]


def check_name(where: str) -> str:
    return f"prefix_cache {where}"


def unanswered(where: str, why: str) -> dict[str, Any]:
    """The check for a router whose session broke off (an HTTP error, an answer that is no completion)."""
    return _check(check_name(where), "fail", why, [])


def verdict(where: str, turns: Sequence[Turn], min_hit_rate: float, prefix_caching: bool = True) -> dict[str, Any]:
    """The verify report's check for one router: the session's hit rate against min_hit_rate."""
    name = check_name(where)
    if not prefix_caching:
        return _check(name, "skip", "kimi_prefix_caching is false: vLLM runs with --no-enable-prefix-caching", turns)
    share = cached_share(turns)
    if share is None:
        return _check(
            name,
            "fail",
            "the answers carry no cached-token count (usage.prompt_tokens_details): vLLM runs without "
            "--enable-prompt-tokens-details, which the serve phase gives it with kimi_prefix_caching",
            turns,
        )
    cached, prompt = share
    rate = cached / prompt if prompt else 0.0
    said = (
        f"turns 2-{len(turns)} of one session (its header kept): {cached} of {prompt} prompt tokens from the "
        f"prefix cache ({rate:.0%}; the first turn: {turns[0].prompt_tokens} tokens)"
    )
    if rate >= min_hit_rate:
        return _check(name, "pass", said, turns, rate)
    why = (
        f"{said}, under verify_prefix_cache_min_hit_rate ({min_hit_rate:.0%}): the turns reached different "
        "replicas (is kimi_router_session_header the router's?), or vLLM turned prefix caching off (it does for "
        "MLA models on its CPU build without AMX), or the cache is too small to keep one session's prefix"
    )
    return _check(name, "fail", why, turns, rate)


def _check(name: str, status: str, detail: str, turns: Sequence[Turn], rate: float | None = None) -> dict[str, Any]:
    """A verify report check; its figures go under data, which the report keeps (kimi_verify_report)."""
    data = {"hit_rate": None if rate is None else round(rate, 4), "turns": [asdict(turn) for turn in turns]}
    return {"name": name, "status": status, "detail": detail, "data": data}
