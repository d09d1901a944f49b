"""kimi_prefix_probe against a stand-in router on 127.0.0.1 (plain HTTP): what it sends on each turn, and the
check it returns for a session kept on one replica, one that meets no cache, answers without cached counts, and a
router that refuses the key."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.unit.ansible_adhoc import run_module

KEY = "client-key-never-printed-0123"
HEADER = "X-Session-ID"


def common_prefix_length(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


class StandIn(ThreadingHTTPServer):
    """Answers /v1/completions like vLLM with --enable-prompt-tokens-details: a prompt's tokens are its
    characters, cached in blocks of 16 when an earlier prompt of the same session started the same way."""

    def __init__(self, *, forget: bool = False, details: bool = True, status: int = 200) -> None:
        self.forget, self.details, self.status = forget, details, status
        self.requests: list[dict] = []
        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    server: StandIn

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        earlier = [r for r in self.server.requests if r["session"] == self.headers.get(HEADER)]
        session, auth = self.headers.get(HEADER), self.headers.get("Authorization")
        self.server.requests.append({"path": self.path, "session": session, "auth": auth, "body": body})
        if self.server.status != 200:
            self._answer(self.server.status, {"error": {"message": "no"}})
            return
        prompt = body["prompt"]
        best = 0
        if not self.server.forget:
            best = max((common_prefix_length(prompt, old["body"]["prompt"]) for old in earlier), default=0)
        usage: dict = {"prompt_tokens": len(prompt), "completion_tokens": 4}
        if self.server.details:
            usage["prompt_tokens_details"] = {"cached_tokens": best // 16 * 16}
        self._answer(200, {"choices": [{"text": f" step {len(earlier) + 1} done"}], "usage": usage})

    def _answer(self, status: int, data: dict) -> None:
        payload = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@pytest.fixture
def stand_in(request) -> Iterator[StandIn]:
    server = StandIn(**getattr(request, "param", {}))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def args(server: StandIn, **extra: object) -> dict:
    return {"url": server.url, "api_key": KEY, "session_header": HEADER, "model": "kimi-k2", "first_words": 120,
            "new_words": 8, **extra}  # fmt: skip


def test_a_session_kept_on_one_replica_passes_and_every_turn_carries_the_header_and_the_key(tmp_path, stand_in):
    ok, result = run_module(tmp_path, "kimi_prefix_probe", args(stand_in))
    assert ok, result
    assert result["check"]["status"] == "pass" and result["hit_rate"] > 0.8, result["check"]
    sent = stand_in.requests
    assert len(sent) == 3 and {r["path"] for r in sent} == {"/v1/completions"}
    assert {r["session"] for r in sent} == {result["session"]} and result["session"].startswith("kimi-verify-")
    assert {r["auth"] for r in sent} == {f"Bearer {KEY}"}
    assert sent[0]["body"]["prompt"].startswith(f"session {result['session']}\n")
    assert sent[1]["body"]["prompt"].startswith(sent[0]["body"]["prompt"] + " step 1 done\n")
    assert sent[2]["body"]["prompt"].startswith(sent[1]["body"]["prompt"] + " step 2 done\n")
    assert KEY not in json.dumps(result)


@pytest.mark.parametrize("stand_in", [{"forget": True}], indirect=True)
def test_a_session_that_meets_no_cache_fails_or_is_returned_for_the_report(tmp_path, stand_in):
    ok, failed = run_module(tmp_path, "kimi_prefix_probe", args(stand_in))
    assert not ok and "under verify_prefix_cache_min_hit_rate (50%)" in failed["msg"]
    ok, reported = run_module(tmp_path, "kimi_prefix_probe", args(stand_in, fail_on_problem=False), check=True)
    assert ok and reported["check"]["status"] == "fail" and reported["hit_rate"] == 0


@pytest.mark.parametrize("stand_in", [{"status": 401}], indirect=True)
def test_a_router_that_refuses_the_key_is_a_failed_check_naming_the_status(tmp_path, stand_in):
    ok, reported = run_module(tmp_path, "kimi_prefix_probe", args(stand_in, fail_on_problem=False))
    assert ok and reported["check"]["status"] == "fail"
    assert reported["check"]["detail"] == f"POST {stand_in.url}/v1/completions: 401"


def test_bad_options_are_refused_by_name_before_anything_is_sent(tmp_path, stand_in):
    for extra, words in (({"turns": 1}, "turns is 1"), ({"min_hit_rate": 1.5}, "min_hit_rate is 1.5")):
        ok, refused = run_module(tmp_path, "kimi_prefix_probe", args(stand_in, **extra))
        assert not ok and refused["msg"].startswith(words)
    assert stand_in.requests == []


def test_the_session_is_sized_to_the_served_context(tmp_path, stand_in):
    sized = args(stand_in, first_words=800, new_words=40, max_model_len=1024)
    ok, result = run_module(tmp_path, "kimi_prefix_probe", sized)
    assert ok, result
    # 436 words, then 21 a turn (words_within): the first prompt is the session's name and 436 words.
    first = stand_in.requests[0]["body"]["prompt"]
    assert len(first.split("\n", 1)[1].split()) == 436
