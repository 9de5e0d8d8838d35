"""The runner's own HTTP/1.1 exchange over the gateway's Unix socket (no ``http.client`` on that path).

First against the server the API really runs (uvicorn with httptools on a Unix socket): plain and chunked
answers reach the harness intact, and the request carries what the control plane reads. Then against a tiny
real socket server that answers with exactly the bytes a test scripts, for what a well-behaved server never
sends: an answer cut in pieces, a peer that closes early, a malformed status line, an answer without the
peer closing, and a post the server keeps without answering (``held``: re-attached, never given up on).
"""

from __future__ import annotations

import itertools
import json
import shutil
import socket
import tempfile
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from runner.gateway import MAX_HOLD_S, Credentials, Gateway, path_segment
from tests.helpers import server_thread

CREDS = Credentials(session_id="0b7e-run", control_token="ctl", tool_token="tool", llm_token="llm")
PREFIX = "/internal/sessions/0b7e-run"
RESULT = {"ok": True, "result": {"content": [{"type": "text", "text": "5"}]}}


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    # Short: a Unix socket's path must fit in 108 bytes, which a pytest tmp_path may not.
    path = Path(tempfile.mkdtemp(prefix="gw", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# ---- the API's own server ------------------------------------------------------------------------


class ApiLikeServer:
    """uvicorn with httptools on a Unix socket, as api/serve.py runs the API; records every request."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen: list[dict[str, Any]] = []
        routes = [
            Route(f"{PREFIX}/permission", self._permission, methods=["POST"]),
            Route(f"{PREFIX}/tools/call", self._chunked, methods=["POST"]),
            Route(f"{PREFIX}/heartbeat", self._empty, methods=["POST"]),
        ]
        config = uvicorn.Config(
            Starlette(routes=routes), uds=str(path), http="httptools", log_level="warning", lifespan="off"
        )
        self.server = uvicorn.Server(config)

    async def _record(self, request: Request) -> dict[str, Any]:
        record = {"path": request.url.path, "headers": dict(request.headers), "body": json.loads(await request.body())}
        self.seen.append(record)
        return record

    async def _permission(self, request: Request) -> JSONResponse:
        body = (await self._record(request))["body"]
        return JSONResponse({"decision": "allow", "updated_input": {**body["input"], "checked": True}})

    async def _chunked(self, request: Request) -> StreamingResponse:
        await self._record(request)
        text = json.dumps(RESULT).encode()

        async def pieces() -> Any:  # no content-length: uvicorn sends the body chunked
            for start in range(0, len(text), 5):
                yield text[start : start + 5]

        return StreamingResponse(pieces(), media_type="application/json")

    async def _empty(self, request: Request) -> Response:
        await self._record(request)
        return Response(status_code=204)


@pytest.fixture
def api_like(socket_dir: Path) -> Iterator[ApiLikeServer]:
    srv = ApiLikeServer(socket_dir / "api.sock")
    with server_thread(srv.server):
        yield srv


def test_answers_of_the_apis_server_reach_the_harness_whole_over_the_socket(api_like: ApiLikeServer) -> None:
    gateway = Gateway(CREDS, socket_path=str(api_like.path), sleep=lambda _: None)

    verdict = gateway.permission("rp_001", "Bash", {"command": "ls"})
    assert (verdict.decision, verdict.updated_input) == ("allow", {"command": "ls", "checked": True})
    assert gateway.tools_call("rp_002", "mcp__calc__add", {"a": 2, "b": 3}) == RESULT, "a chunked answer"
    assert gateway.heartbeat() is None, "a 204 without a body"

    permission, call, _ = api_like.seen
    assert permission["path"] == f"{PREFIX}/permission"
    assert permission["body"] == {"tool_call_id": "rp_001", "tool": "Bash", "input": {"command": "ls"}}
    assert permission["headers"]["authorization"] == "Bearer tool"
    assert permission["headers"]["content-type"] == "application/json"
    assert permission["headers"]["connection"] == "close"
    assert call["body"]["tool_call_id"] == "rp_002"


# ---- a scripted peer -------------------------------------------------------------------------------

HOLD = b"<hold>"  # keep the connection without answering, until the test ends
CLOSE = b""  # close the connection without a byte of answer


class ScriptedPeer:
    """A real Unix-socket server: reads each whole request, then does what the script says for it (the last
    entry repeats). An answer is written in 7-byte pieces, so the client must put it back together; with
    ``keep_open`` the connection stays open after an answer instead of closing."""

    def __init__(self, path: Path, script: list[bytes], *, keep_open: bool = False) -> None:
        self.script = script
        self.keep_open = keep_open
        self.requests: list[tuple[list[str], dict[str, Any]]] = []
        self.release = threading.Event()
        self._lock = threading.Lock()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        self._listener.listen(16)
        self.path = str(path)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(4096)
            head, _, body = data.partition(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            length = next(int(line.split(":")[1]) for line in lines if line.lower().startswith("content-length:"))
            while len(body) < length:
                body += conn.recv(4096)
            with self._lock:
                self.requests.append((lines, json.loads(body)))
                action = self.script[min(len(self.requests), len(self.script)) - 1]
            if action == HOLD:
                self.release.wait(30)
                return
            try:
                for start in range(0, len(action), 7):
                    conn.sendall(action[start : start + 7])
            except OSError:  # the client stopped reading (a status line it refused): that is its right
                return
            if self.keep_open:
                self.release.wait(30)

    def close(self) -> None:
        self.release.set()
        self._listener.close()


def answer(status_line: bytes, *headers: bytes, body: bytes = b"") -> bytes:
    return b"\r\n".join([status_line, *headers, b"", body])


def ok(body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    return answer(b"HTTP/1.1 200 OK", b"Content-Type: application/json", b"Content-Length: %d" % len(data), body=data)


def chunked(body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    first, second = data[:10], data[10:]
    return answer(
        b"HTTP/1.1 200 OK",
        b"Transfer-Encoding: chunked",
        body=b"".join([b"%x;name=value\r\n" % len(first), first, b"\r\n", b"%X\r\n" % len(second), second, b"\r\n"])
        + b"0\r\nX-Trailer: yes\r\n\r\n",
    )


@pytest.fixture
def peer(socket_dir: Path) -> Iterator[Any]:
    made: list[ScriptedPeer] = []

    def make(script: list[bytes], *, keep_open: bool = False) -> ScriptedPeer:
        made.append(ScriptedPeer(socket_dir / f"p{len(made)}.sock", script, keep_open=keep_open))
        return made[-1]

    try:
        yield make
    finally:
        for srv in made:
            srv.close()


def gateway_on(srv: ScriptedPeer, **kwargs: Any) -> Gateway:
    return Gateway(CREDS, socket_path=srv.path, sleep=lambda _: None, **kwargs)


def test_a_chunked_answer_with_extensions_and_trailers_is_read_whole(peer: Any) -> None:
    srv = peer([chunked(RESULT)])
    odd = Credentials(session_id="s 1/ü", control_token="ctl", tool_token="tool", llm_token="llm")
    gateway = Gateway(odd, socket_path=srv.path, sleep=lambda _: None)
    assert gateway.tools_call("rp_001", "mcp__calc__add", {"a": 2, "b": 3}) == RESULT
    lines, body = srv.requests[0]
    assert lines[0] == "POST /internal/sessions/s%201%2F%C3%BC/tools/call HTTP/1.1", "the id is one path segment"
    assert "authorization: Bearer tool" in lines
    assert f"content-length: {len(json.dumps(body, separators=(',', ':')))}" in lines
    assert body["tool_call_id"] == "rp_001"


def test_a_peer_that_closes_without_answering_is_retried_then_the_outcome_is_unknown(peer: Any) -> None:
    srv = peer([CLOSE])
    answer_ = gateway_on(srv).tools_call("rp_001", "mcp__calc__add", {"a": 2, "b": 3})
    assert answer_["ok"] is False and "UNKNOWN" in answer_["error"]
    assert [body["tool_call_id"] for _, body in srv.requests] == ["rp_001"] * 3, "three attempts, one call"


def test_an_answer_cut_short_is_no_answer_and_the_retry_gets_the_whole_one(peer: Any) -> None:
    whole = ok(RESULT)
    srv = peer([whole[:-5], chunked(RESULT)[:-7], whole])
    assert gateway_on(srv).tools_call("rp_001", "mcp__calc__add", {"a": 2, "b": 3}) == RESULT
    assert len(srv.requests) == 3


@pytest.mark.parametrize(
    "status_line",
    [b"HTTP/1.1 2OO OK", b"ICY 200 OK", b"HTTP/1.1", b"HTTP/1.1 099 Low", b"<html>not http</html>"],
)
def test_a_malformed_status_line_is_no_answer(peer: Any, status_line: bytes) -> None:
    srv = peer([answer(status_line, b"Content-Length: 2", body=b"{}")])
    assert gateway_on(srv).discover("tools/search", {"query": "x"}) == {
        "error": "the control plane could not be reached"
    }
    assert len(srv.requests) == 3, "retried like a dropped connection"


def test_malformed_framing_is_no_answer(peer: Any) -> None:
    srv = peer(
        [
            answer(b"HTTP/1.1 200 OK", b"Content-Length: 2, 3", body=b"{}"),
            answer(b"HTTP/1.1 200 OK", b"Transfer-Encoding: chunked", body=b"zz\r\n{}\r\n0\r\n\r\n"),
            answer(b"HTTP/1.1 200 OK", b"Transfer-Encoding: gzip", body=b"{}"),
        ]
    )
    assert gateway_on(srv).discover("tools/describe", {"name": "x"}) == {
        "error": "the control plane could not be reached"
    }


def test_an_answer_is_read_by_its_length_not_by_waiting_for_the_peer_to_close(peer: Any) -> None:
    srv = peer([ok(RESULT)], keep_open=True)
    ticks = itertools.count(step=MAX_HOLD_S)  # were the post taken for held, the wait would end at once
    gateway = gateway_on(srv, hold_timeout_s=5.0, clock=lambda: float(next(ticks)))
    assert gateway.tools_call("rp_001", "mcp__calc__add", {"a": 2, "b": 3}) == RESULT
    assert len(srv.requests) == 1


def test_an_error_answer_reaches_the_harness_with_its_message(peer: Any) -> None:
    data = json.dumps({"detail": "unknown tool mcp__calc__mul"}).encode()
    srv = peer([answer(b"HTTP/1.1 404 Not Found", b"content-length: %d" % len(data), body=data)])
    assert gateway_on(srv).tools_call("rp_001", "mcp__calc__mul", {}) == {
        "ok": False,
        "error": "fluidbox broker returned HTTP 404: unknown tool mcp__calc__mul",
    }


def test_a_post_the_server_keeps_past_the_timeout_is_held_and_re_attached(peer: Any) -> None:
    srv = peer([HOLD, HOLD, HOLD, HOLD, ok(RESULT)])
    answer_ = gateway_on(srv, hold_timeout_s=0.3, staleness_s=0.0).tools_call("rp_001", "mcp__calc__add", {"a": 2})
    assert answer_ == RESULT
    assert [body["tool_call_id"] for _, body in srv.requests] == ["rp_001"] * 5, "four held posts, no attempt used"


def test_a_socket_nobody_listens_on_is_unreachable_not_held(socket_dir: Path) -> None:
    gateway = Gateway(CREDS, socket_path=str(socket_dir / "none.sock"), sleep=lambda _: None, hold_timeout_s=0.3)
    answer_ = gateway.tools_call("rp_001", "mcp__calc__add", {"a": 2})
    assert answer_["ok"] is False and "UNKNOWN" in answer_["error"]


@pytest.mark.parametrize("text", ["", "0b7e-run", "a b/c?d#e%f", "~_.-", "ü€😀", "+&=;:@!$'()*,[]", "\x00\x7f"])
def test_a_session_id_is_encoded_into_one_path_segment_as_urllib_would(text: str) -> None:
    assert path_segment(text) == urllib.parse.quote(text, safe="")


def test_a_control_url_with_a_path_prefixes_every_post_on_the_socket(peer: Any) -> None:
    srv = peer([ok({"ok": True})])
    gateway = Gateway(CREDS, base_url="http://fluidbox/api/", socket_path=srv.path, sleep=lambda _: None)
    assert gateway.tools_call("rp_001", "mcp__calc__add", {}) == {"ok": True}
    assert srv.requests[0][0][0] == f"POST /api{PREFIX}/tools/call HTTP/1.1"
