"""A fake OpenAI-compatible server on 127.0.0.1 (an ephemeral port) for the verify and load-test tests.

It answers /health and /v1/models, non-streamed chat completions from a reply function, and streamed chat
completions the way vLLM streams them (a role-only first chunk, one chunk per token, a usage chunk, [DONE]),
each stream following a StreamPlan: delays, an HTTP error, a hang, a malformed line. Every request is recorded.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class StreamPlan:
    tokens: int = 4
    first_token_delay: float = 0.0  # after the role chunk, before the first token
    token_delay: float = 0.0  # between tokens
    status: int = 200  # anything else: an error body instead of a stream
    hang: float = 0.0  # sleep after the role chunk (beyond the client's timeout)
    malformed_after: int | None = None  # send a broken data line after this many tokens
    usage: bool = True
    usage_tokens: int | None = None  # the count the usage chunk reports (default: tokens)
    done: bool = True
    reasoning_tokens: int = 0  # the first tokens go out as delta.reasoning_content


Reply = Callable[[dict[str, Any]], tuple[int, Any]]


def chunk(delta: dict[str, Any] | None = None, usage: dict[str, int] | None = None) -> bytes:
    payload: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "kimi-k2"}
    payload["choices"] = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": None}]
    if usage is not None:
        payload["usage"] = usage
    return f"data: {json.dumps(payload)}\n\n".encode()


class FakeOpenAI:
    def __init__(
        self,
        models: tuple[str, ...] = ("kimi-k2",),
        reply: Reply | None = None,
        plans: list[StreamPlan] | None = None,
        default_plan: StreamPlan | None = None,
        health_status: int = 200,
    ) -> None:
        self.models = models
        self.reply = reply or (lambda body: (200, {"choices": []}))
        self.plans = list(plans or [])
        self.default_plan = default_plan or StreamPlan()
        self.health_status = health_status
        self.requests: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        # A short poll interval: shutdown() waits up to one interval.
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeOpenAI:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()

    def next_plan(self) -> StreamPlan:
        with self.lock:
            return self.plans.pop(0) if self.plans else self.default_plan

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                fake.requests.append({"method": "GET", "path": self.path, "headers": dict(self.headers)})
                if self.path == "/health":
                    self._send(fake.health_status, b"")
                elif self.path == "/v1/models":
                    data = [{"id": name, "object": "model", "owned_by": "vllm"} for name in fake.models]
                    self._send(200, json.dumps({"object": "list", "data": data}).encode())
                else:
                    self._send(404, b'{"detail": "Not Found"}')

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append({"method": "POST", "path": self.path, "headers": dict(self.headers), "body": body})
                with fake.lock:
                    fake.in_flight += 1
                    fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
                self.counted = True
                try:
                    if body.get("stream"):
                        self._stream(fake.next_plan())
                    else:
                        status, reply = fake.reply(body)
                        self._send(status, reply.encode() if isinstance(reply, str) else json.dumps(reply).encode())
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)
                finally:
                    self._leave_flight()

            def _leave_flight(self) -> None:
                # A client that stops reading at [DONE] may send its next request before this thread reaches
                # `finally`, so a stream leaves the count just before its last line goes out: two requests of one
                # client worker are then never counted at once.
                with fake.lock:
                    if self.counted:
                        fake.in_flight -= 1
                        self.counted = False

            def _send(self, status: int, data: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, plan: StreamPlan) -> None:
                if plan.status != 200:
                    error = {"object": "error", "message": "engine exploded", "type": "InternalServerError"}
                    self._send(plan.status, json.dumps(error).encode())
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()  # no length: the stream ends when the connection closes (HTTP/1.0)
                self.wfile.write(chunk({"role": "assistant", "content": ""}))
                if plan.hang:
                    fake.stopping.wait(plan.hang)
                fake.stopping.wait(plan.first_token_delay)
                for token in range(plan.tokens):
                    if token:
                        fake.stopping.wait(plan.token_delay)
                    key = "reasoning_content" if token < plan.reasoning_tokens else "content"
                    self.wfile.write(chunk({key: f"t{token} "}))
                    if plan.malformed_after is not None and token + 1 == plan.malformed_after:
                        self.wfile.write(b"data: {not json\n\n")
                if plan.usage:
                    count = plan.tokens if plan.usage_tokens is None else plan.usage_tokens
                    usage = {"prompt_tokens": 20, "completion_tokens": count, "total_tokens": 20 + count}
                    self.wfile.write(chunk(None, usage))
                if plan.done:
                    self._leave_flight()
                    self.wfile.write(b"data: [DONE]\n\n")

        return Handler


def closed_port_url() -> str:
    """A loopback URL nothing listens on (the port was just bound and released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"
