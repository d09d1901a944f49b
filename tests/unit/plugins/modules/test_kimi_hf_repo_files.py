"""kimi_hf_repo_files against a fake Hub API on 127.0.0.1: pagination, branch resolution, include/exclude,
LFS checksums, the error messages (gated, unknown revision, server errors, no answer) and the retries.

The pure parts (next_page, hub_retry_delay, explain_hub_error in module_utils/kimi_checkpoint.py) are tested
on their own first.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from ansible_collections.kimi.k2.plugins.module_utils import kimi_checkpoint as ck

from tests.unit.ansible_adhoc import run_module

SHA = "60877af7bde655c71406a1843bcc395afa52fb57"
TOKEN = "hf_fakeTokenNeverPrinted0123456789"
LFS_SHA256 = "9be78edb5b928eba33aa88f431551348f7466ba9f5ef3daf1d552398722a5436"
PAGE_ONE = [
    {"type": "file", "path": "config.json", "size": 8, "oid": "2f9618c3a19b9a61add74f70bfb121335aeef666"},
    {"type": "directory", "path": "sub", "oid": "aa536c4ea18073388b5b0bc791057a7296a00398"},
    {
        "type": "file",
        "path": "model.safetensors",
        "size": 134,  # the pointer's size; lfs.size is the content's
        "oid": "64eaa9c526867e404b68f2c5d66fd78e27026523",
        "lfs": {"oid": LFS_SHA256, "size": 8192, "pointerSize": 134},
    },
]
PAGE_TWO = [{"type": "file", "path": "sub/notes.txt", "size": 5, "oid": "226b0752cac7789c48f0cb3ec53eda48b7be36cc"}]


# ------------------------------------------------------------------------------------------------ pure logic


def test_next_page_reads_the_link_header():
    link = '<https://huggingface.co/api/models/o/r/tree/x?recursive=true&cursor=abc>; rel="next"'
    assert ck.next_page(link) == "https://huggingface.co/api/models/o/r/tree/x?recursive=true&cursor=abc"
    assert ck.next_page(None) is None
    assert ck.next_page('<https://huggingface.co/a>; rel="prev"') is None


def test_retry_delay_retries_no_answer_429_and_5xx_a_bounded_number_of_times():
    assert ck.hub_retry_delay(1, -1) == 1.0 and ck.hub_retry_delay(2, 503) == 2.0
    assert ck.hub_retry_delay(ck.HUB_ATTEMPTS, 503) is None
    assert ck.hub_retry_delay(1, 429, "7") == 7.0
    assert ck.hub_retry_delay(1, 429, "3600") == ck.HUB_MAX_RETRY_WAIT
    assert ck.hub_retry_delay(1, 429, "Wed, 21 Oct 2026 07:28:00 GMT") == 1.0
    for final in (400, 401, 403, 404, 200):
        assert ck.hub_retry_delay(1, final) is None


def test_explain_keeps_the_old_sentence_and_adds_what_the_hub_says():
    gated = ck.explain_hub_error(
        "listing o/r at revision x", 403, "Forbidden", True, "GatedRepo", "Access is restricted"
    )
    assert gated.startswith(
        "listing o/r at revision x: HTTP 403: the repository or revision does not exist, or it is private/gated "
        "and the token is missing or wrong (a token was sent)"
    )
    assert gated.endswith("; the Hub says: the repository is gated: accept its conditions on the Hub with the "
                          "token's account: Access is restricted")  # fmt: skip
    unknown = ck.explain_hub_error("w", 404, "Not Found", False, "RevisionNotFound")
    assert "(no token was sent)" in unknown and unknown.endswith("the revision does not exist in the repository")
    assert ck.explain_hub_error("w", 404, "Not Found", False) == (
        "w: HTTP 404: the repository or revision does not exist, or it is private/gated and the token is missing "
        "or wrong (no token was sent)"
    )
    assert ck.explain_hub_error("w", 500, "Internal Server Error", False) == "w: HTTP 500 Internal Server Error"
    assert (
        ck.explain_hub_error("w", 409, "Conflict", False, "SomethingNew")
        == "w: HTTP 409 Conflict; the Hub says: SomethingNew"
    )
    assert len(ck.explain_hub_error("w", 500, "Internal Server Error", False, None, "x" * 5000)) < 500


# -------------------------------------------------------------------------------------------- the fake Hub


class FakeHub:
    """Answers /api/models/<repo>/revision/<rev> and /api/models/<repo>/tree/<sha> for a few repositories:
    org/r (two pages, branch main), org/gated (403 GatedRepo), org/flaky (503 once, then org/r's tree),
    org/down (500 always), org/broken (200 that is not JSON). Records every request's path and auth."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str | None]] = []
        self.flaky_left = 1
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                hub.requests.append((self.path, self.headers.get("Authorization")))
                hub.answer(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def send(self, handler, status: int, body, headers: dict[str, str] | None = None) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        handler.send_response(status)
        for name, value in (headers or {}).items():
            handler.send_header(name, value)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def answer(self, handler) -> None:
        path = handler.path
        if path.startswith("/api/models/org/gated/"):
            return self.send(handler, 403, {"error": "gated"}, {
                "X-Error-Code": "GatedRepo",
                "X-Error-Message": "Access to model org/gated is restricted and you are not in the authorized list.",
            })  # fmt: skip
        if path.startswith("/api/models/org/down/"):
            return self.send(handler, 500, {"error": "boom"})
        if path.startswith("/api/models/org/broken/"):
            return self.send(handler, 200, b"<html>a captive portal</html>")
        if path.startswith("/api/models/org/flaky/") and self.flaky_left:
            self.flaky_left -= 1
            return self.send(handler, 503, {"error": "busy"}, {"Retry-After": "0"})
        if path == "/api/models/org/r/revision/main":
            return self.send(handler, 200, {"id": "org/r", "sha": SHA})
        tree = f"/tree/{SHA}?recursive=true&expand=false"
        if path in (f"/api/models/org/r{tree}", f"/api/models/org/flaky{tree}"):
            return self.send(handler, 200, PAGE_ONE, {"Link": f'<{self.url}{path}&cursor=2>; rel="next"'})
        if path in (f"/api/models/org/r{tree}&cursor=2", f"/api/models/org/flaky{tree}&cursor=2"):
            return self.send(handler, 200, PAGE_TWO)
        if "/revision/" in path:
            return self.send(handler, 404, {"error": "Invalid rev id"}, {"X-Error-Code": "RevisionNotFound"})
        return self.send(handler, 404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})


@pytest.fixture(scope="module")
def hub() -> Iterator[FakeHub]:
    fake = FakeHub()
    thread = threading.Thread(target=fake.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        fake.server.shutdown()
        fake.server.server_close()


def args(hub: FakeHub, **extra) -> dict:
    return {"repo_id": "org/r", "revision": SHA, "endpoint": hub.url + "/", **extra}


def test_lists_every_page_with_lfs_checksums_and_sends_the_token_as_a_header_only(hub, tmp_path):
    hub.requests.clear()
    ok, result = run_module(tmp_path, "kimi_hf_repo_files", args(hub, token=TOKEN))
    assert ok, result
    assert result["changed"] is False and result["revision"] == SHA and result["resolved_from"] is None
    assert result["files"] == [
        {"path": "config.json", "size": 8, "sha256": None, "git_oid": "2f9618c3a19b9a61add74f70bfb121335aeef666"},
        {"path": "model.safetensors", "size": 8192, "sha256": LFS_SHA256, "git_oid": None},
        {"path": "sub/notes.txt", "size": 5, "sha256": None, "git_oid": "226b0752cac7789c48f0cb3ec53eda48b7be36cc"},
    ]
    assert result["file_count"] == 3 and result["total_bytes"] == 8205
    assert [auth for _, auth in hub.requests] == [f"Bearer {TOKEN}"] * 2
    assert TOKEN not in json.dumps(result)


def test_a_branch_is_refused_unless_allowed_then_resolved_and_include_exclude_select(hub, tmp_path):
    ok, refused = run_module(tmp_path, "kimi_hf_repo_files", args(hub, revision="main"))
    assert not ok and "'main' is not a 40-hex commit sha" in refused["msg"]
    hub.requests.clear()
    chosen = args(hub, revision="main", allow_branch=True, include=["*.json", "*.safetensors"], exclude=["c*"])
    ok, result = run_module(tmp_path, "kimi_hf_repo_files", chosen, check=True)
    assert ok, result
    assert result["revision"] == SHA and result["resolved_from"] == "main"
    assert [f["path"] for f in result["files"]] == ["model.safetensors"] and result["total_bytes"] == 8192
    assert hub.requests[0] == ("/api/models/org/r/revision/main", None)  # no token: no header


def test_nothing_selected_is_an_error(hub, tmp_path):
    ok, result = run_module(tmp_path, "kimi_hf_repo_files", args(hub, include=["*.bin"]))
    assert not ok and result["msg"] == f"org/r at {SHA}: no file matches the include/exclude patterns"


def test_a_gated_repository_says_so_without_the_token(hub, tmp_path):
    ok, result = run_module(tmp_path, "kimi_hf_repo_files", args(hub, repo_id="org/gated", token=TOKEN))
    assert not ok
    assert result["msg"].startswith(f"listing org/gated at revision {SHA}: HTTP 403: the repository or revision does "
                                    "not exist, or it is private/gated and the token is missing or wrong (a token "
                                    "was sent); the Hub says: the repository is gated")  # fmt: skip
    assert "not in the authorized list" in result["msg"] and TOKEN not in json.dumps(result)


def test_an_unknown_branch_names_the_revision(hub, tmp_path):
    ok, result = run_module(tmp_path, "kimi_hf_repo_files", args(hub, revision="nope", allow_branch=True))
    assert not ok and result["msg"].startswith("resolving revision 'nope' of org/r: HTTP 404: ")
    assert result["msg"].endswith("the revision does not exist in the repository")


def test_a_busy_hub_is_asked_again_and_a_failing_one_named_after_the_retries(hub, tmp_path):
    hub.requests.clear()
    ok, result = run_module(tmp_path, "kimi_hf_repo_files", args(hub, repo_id="org/flaky"))
    assert ok and result["file_count"] == 3, result
    assert len(hub.requests) == 3  # 503, then both pages
    hub.requests.clear()
    ok, result = run_module(tmp_path, "kimi_hf_repo_files", args(hub, repo_id="org/down"))
    assert not ok and result["msg"] == f"listing org/down at revision {SHA}: HTTP 500 Internal Server Error"
    assert len(hub.requests) == ck.HUB_ATTEMPTS


def test_an_answer_that_is_not_json_is_named(hub, tmp_path):
    ok, result = run_module(tmp_path, "kimi_hf_repo_files", args(hub, repo_id="org/broken"))
    assert not ok
    assert result["msg"].startswith(
        f"listing org/broken at revision {SHA}: unexpected answer from {hub.url}/api/models/org/broken/tree/{SHA}: "
    )


def test_no_answer_is_cannot_reach_the_hub(tmp_path):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    ok, result = run_module(tmp_path, "kimi_hf_repo_files", {"repo_id": "org/r", "revision": SHA, "endpoint": endpoint})
    assert not ok and result["msg"].startswith(f"cannot reach the Hub at {endpoint}: ")
    assert result["msg"].endswith(f"(after {ck.HUB_ATTEMPTS} attempt(s))")
