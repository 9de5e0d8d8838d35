"""The runner's patience with a brokered call the control plane holds (a parked call, an approval wait).

A real HTTP server on loopback keeps the first posts without answering (as the API does while a call waits for a
connection); the runner's per-post timeout is shortened so each held post times out. A held post is re-attached
with the same ``tool_call_id`` without using up one of the three failure attempts, so the wait ends when the server
answers (the park's TTL decides), not after three timeouts. A server that is not there still gives up after three.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from runner.gateway import Credentials, Gateway

CREDS = Credentials(session_id="s-1", control_token="c", tool_token="t", llm_token="l")


class HoldingServer:
    """Holds the first ``hold`` posts until the test ends (never answers them), then answers ``ok``."""

    def __init__(self, hold: int) -> None:
        self.hold = hold
        self.posts: list[dict[str, Any]] = []
        self.release = threading.Event()
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                with lock:
                    outer.posts.append(body)
                    held = len(outer.posts) <= outer.hold
                if held:
                    outer.release.wait(30)
                    return
                answer = json.dumps({"ok": True, "result": {"content": [{"type": "text", "text": "5"}]}}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def holding() -> Iterator[HoldingServer]:
    srv = HoldingServer(hold=4)
    try:
        yield srv
    finally:
        srv.close()


def test_a_held_brokered_call_is_waited_on_past_three_timeouts_until_the_server_answers(
    holding: HoldingServer,
) -> None:
    gateway = Gateway(CREDS, base_url=holding.url, sleep=lambda _: None, hold_timeout_s=0.5, staleness_s=0.1)
    answer = gateway.tools_call("call-1", "mcp__calc__add", {"a": 2, "b": 3})
    assert answer == {"ok": True, "result": {"content": [{"type": "text", "text": "5"}]}}
    assert len(holding.posts) == 5, "four held posts re-attached, the fifth answered"
    assert {p["tool_call_id"] for p in holding.posts} == {"call-1"}, "every re-attach is the same call"


def test_a_control_plane_that_is_not_there_still_gives_up_after_three_attempts() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gateway = Gateway(CREDS, base_url=f"http://127.0.0.1:{port}", sleep=lambda _: None, hold_timeout_s=0.5)
    answer = gateway.tools_call("call-2", "mcp__calc__add", {"a": 2, "b": 3})
    assert answer["ok"] is False and "UNKNOWN" in answer["error"]
