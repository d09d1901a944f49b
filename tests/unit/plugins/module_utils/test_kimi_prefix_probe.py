"""The multi-turn session of verify's prefix-cache probe: its text, its turns and its verdict (pure logic)."""

from __future__ import annotations

import pytest
from ansible_collections.kimi.k2.plugins.module_utils import kimi_prefix_probe as probe


def test_the_text_is_the_same_for_the_same_session_and_turn_and_differs_otherwise():
    assert probe.new_text("s1", 2, 30) == probe.new_text("s1", 2, 30)
    assert probe.new_text("s1", 2, 30) != probe.new_text("s1", 3, 30)
    assert probe.new_text("s1", 2, 30) != probe.new_text("s2", 2, 30)
    assert len(probe.new_text("s1", 0, 30).split()) == 30
    assert set(probe.new_text("s1", 0, 200).split()) <= set(probe.WORDS)


def test_a_session_starts_with_its_name_so_no_other_session_shares_its_first_block():
    assert probe.first_prompt("kimi-verify-ab12", 10).startswith("session kimi-verify-ab12\n")


class PrefixCache:
    """A stand-in for one replica: a prompt's tokens are its characters, cached in blocks of `block`."""

    def __init__(self, block: int = 16, forget: bool = False, details: bool = True) -> None:
        self.block, self.forget, self.details = block, forget, details
        self.seen: list[str] = []

    def ask(self, prompt: str) -> tuple[dict, float]:
        best = 0 if self.forget else max((_common(prompt, old) for old in self.seen), default=0)
        self.seen.append(prompt)
        usage: dict = {"prompt_tokens": len(prompt), "completion_tokens": 3}
        if self.details:
            usage["prompt_tokens_details"] = {"cached_tokens": best // self.block * self.block}
        return {"choices": [{"text": f" answer{len(self.seen)}"}], "usage": usage}, 0.25


def _common(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def test_each_turn_is_the_previous_prompt_its_answer_and_new_text():
    replica = PrefixCache()
    turns = probe.run_session(replica.ask, "s", 3, first_words=50, new_words=5)
    first, second, third = replica.seen
    assert second == f"{first} answer1\n{probe.new_text('s', 1, 5)}"
    assert third == f"{second} answer2\n{probe.new_text('s', 2, 5)}"
    assert [t.prompt_tokens for t in turns] == [len(first), len(second), len(third)]
    assert turns[0].cached_tokens == 0 and turns[1].cached_tokens == len(first) // 16 * 16


def test_the_hit_rate_counts_the_turns_after_the_first():
    turns = [probe.Turn(100, 0, 1.0), probe.Turn(120, 96, 0.2), probe.Turn(140, 112, 0.2)]
    assert probe.cached_share(turns) == (208, 260)
    assert probe.hit_rate(turns) == pytest.approx(0.8)
    assert probe.hit_rate([probe.Turn(100, 0, 1.0)]) is None
    assert probe.hit_rate([*turns, probe.Turn(150, None, 0.1)]) is None


def test_a_session_kept_on_one_replica_passes():
    turns = probe.run_session(PrefixCache().ask, "s", 3, first_words=200, new_words=10)
    check = probe.verdict("https://router:8443", turns, 0.5)
    assert check["status"] == "pass" and check["name"] == "prefix_cache https://router:8443"
    assert check["data"]["hit_rate"] > 0.8 and "turns 2-3 of one session" in check["detail"]
    turns = check["data"]["turns"]
    assert len(turns) == 3 and set(turns[0]) == {"prompt_tokens", "cached_tokens", "seconds"}


def test_a_session_that_meets_no_cache_fails_naming_the_threshold_and_the_likely_causes():
    turns = probe.run_session(PrefixCache(forget=True).ask, "s", 3, first_words=200, new_words=10)
    check = probe.verdict("https://router:8443", turns, 0.5)
    assert check["status"] == "fail" and check["data"]["hit_rate"] == 0
    assert "under verify_prefix_cache_min_hit_rate (50%)" in check["detail"]
    assert "kimi_router_session_header" in check["detail"] and "MLA" in check["detail"]
    # A threshold of 0 reports the rate and never fails on it.
    assert probe.verdict("u", turns, 0.0)["status"] == "pass"


def test_answers_without_cached_counts_fail_naming_the_flag_and_prefix_caching_off_skips():
    turns = probe.run_session(PrefixCache(details=False).ask, "s", 2, first_words=20, new_words=5)
    check = probe.verdict("u", turns, 0.5)
    assert check["status"] == "fail" and "--enable-prompt-tokens-details" in check["detail"]
    skipped = probe.verdict("u", [], 0.5, prefix_caching=False)
    assert skipped["status"] == "skip" and "kimi_prefix_caching is false" in skipped["detail"]


@pytest.mark.parametrize("answer", [{}, {"choices": [], "usage": {}}, {"choices": [{"text": "x"}]}, {"error": "x"}])
def test_an_answer_that_is_not_a_completion_is_refused(answer):
    with pytest.raises(probe.ProbeAnswerError, match="not a completion with usage"):
        probe.turn_of(answer, 0.1)


def test_the_session_shrinks_to_fit_the_served_context_and_is_left_alone_when_it_fits():
    # The lab's context: 800 + 2 x 40 words at two tokens a word fit 2,048 tokens with three 16-token answers.
    assert probe.words_within(2048, 3, 800, 40, 16) == (800, 40)
    assert probe.words_within(0, 20, 100_000, 5_000, 16) == (100_000, 5_000)
    first, new = probe.words_within(1024, 3, 800, 40, 16)
    assert (first, new) == (436, 21)
    assert (first + 2 * new) * probe.TOKENS_PER_WORD + 3 * 16 + 16 <= 1024
