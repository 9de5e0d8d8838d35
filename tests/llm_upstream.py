"""A scripted LLM upstream for tests: the real wire formats, canned turns, every request recorded.

No model is reachable from the tests, so this server stands where Anthropic (or a LiteLLM proxy) would.
It speaks the Anthropic Messages API (``POST /v1/messages``, streaming SSE and plain JSON;
``POST /v1/messages/count_tokens``) and the OpenAI Responses API (``POST /v1/responses``, streaming
and not), and answers ``HEAD /`` with 200 (the Claude CLI probes its base URL).

Usage::

    from tests.llm_upstream import scripted_upstream, text, tool_use, failure, Usage

    async with scripted_upstream() as up:
        up.url                                     # http://127.0.0.1:<port>, no trailing slash
        up.push(text("hi", usage=Usage(input=12, output=3, cache_read=100, cache_write=7)))
        up.push(tool_use("Bash", {"command": "ls"}))
        up.push(failure(529, "overloaded"))        # provider-shaped error body for that status
        up.push(text("slow").stalled(after=2))     # send 2 SSE events, then wait for up.release()
        up.push(text("cut").broken(after=2))       # send 2 SSE events, then drop the connection
        up.push(text("x", omit_usage=True))        # a response that carries no usage at all
        ...
        up.requests                                # [Recorded(method, path, query, headers, body, raw)]
        await up.wait_requests(2)                  # poll with a deadline until 2 requests arrived
        up.release()                               # let stalled streams continue

Turns are served first-in first-out to ``/v1/messages`` and ``/v1/responses`` alike (the dialect is
the request path's); when the queue is empty the ``default`` turn (``text("ok")``) answers. A turn's
usage is declared Anthropic-style (input excludes the cache); the OpenAI rendering reports
``input_tokens = input + cache_read`` with ``input_tokens_details.cached_tokens = cache_read``.

The server runs on its own thread and event loop, so a test that blocks its own loop cannot stall it.
Standalone, for manual demos: ``python -m tests.llm_upstream --port 8999 [--text "hello"]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import itertools
import json
import socket
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.helpers import eventually

_ids = itertools.count(1)


@dataclass(frozen=True)
class Usage:
    """What the upstream reports for one response (Anthropic semantics: ``input`` excludes the cache)."""

    input: int = 10
    output: int = 5
    cache_read: int = 0
    cache_write: int = 0


@dataclass(frozen=True)
class Turn:
    """One canned answer. Build with :func:`text`, :func:`tool_use` or :func:`failure`."""

    blocks: tuple[dict[str, Any], ...] = ()
    usage: Usage = Usage()
    stop_reason: str = "end_turn"
    omit_usage: bool = False
    status: int = 200
    error_type: str | None = None
    error_message: str | None = None
    stall_after: int | None = None  # SSE events sent before waiting for release()
    delay: float = 0.0  # seconds between SSE events
    break_after: int | None = None  # SSE events sent before the connection is dropped mid-stream
    location: str | None = None  # an error turn's Location header (a redirect)
    gzip: bool = False  # an error turn's body gzip-compressed (ignoring the client's accept-encoding)

    def stalled(self, after: int) -> Turn:
        """The same turn, holding its stream after ``after`` events until :meth:`Upstream.release`."""
        return replace(self, stall_after=after)

    def paced(self, delay: float) -> Turn:
        return replace(self, delay=delay)

    def redirecting(self, location: str) -> Turn:
        """An error turn that also names a ``Location`` (use with a 3xx status)."""
        return replace(self, location=location)

    def gzipped(self) -> Turn:
        """An error turn whose body is sent gzip-compressed whatever the client accepts."""
        return replace(self, gzip=True)

    def broken(self, after: int) -> Turn:
        """The same turn, its connection dropped after ``after`` SSE events (no end of the chunked body)."""
        return replace(self, break_after=after)


def text(content: str, *, usage: Usage | None = None, omit_usage: bool = False, chunks: int | None = None) -> Turn:
    """An assistant text turn; the text is streamed in ``chunks`` deltas (default: one per word)."""
    return Turn(
        blocks=({"type": "text", "text": content, "chunks": chunks},),
        usage=usage or Usage(),
        omit_usage=omit_usage,
    )


def tool_use(
    name: str,
    tool_input: dict[str, Any],
    *,
    id: str | None = None,
    usage: Usage | None = None,
    preamble: str | None = None,
) -> Turn:
    """An assistant turn that calls one tool (optionally after some text)."""
    blocks: list[dict[str, Any]] = []
    if preamble:
        blocks.append({"type": "text", "text": preamble, "chunks": None})
    blocks.append({"type": "tool_use", "id": id or f"toolu_{next(_ids):06d}", "name": name, "input": tool_input})
    return Turn(blocks=tuple(blocks), usage=usage or Usage(), stop_reason="tool_use")


def failure(status: int, message: str, *, error_type: str | None = None) -> Turn:
    """An HTTP error with the provider's error body (shape chosen by the request's dialect)."""
    default = {400: "invalid_request_error", 401: "authentication_error", 429: "rate_limit_error"}
    kind = error_type or default.get(status, "overloaded_error" if status == 529 else "api_error")
    return Turn(status=status, error_type=kind, error_message=message)


class UpstreamBroke(Exception):
    """Raised inside a streaming body: the server drops the connection without ending the response."""


@dataclass
class Recorded:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: Any
    raw: bytes
    response: bytearray = field(default_factory=bytearray)  # exactly the bytes sent back


def _split(content: str, chunks: int | None) -> list[str]:
    if not content:
        return [""]
    if chunks is None:
        words = content.split(" ")
        return [w + (" " if i < len(words) - 1 else "") for i, w in enumerate(words)]
    size = max(1, -(-len(content) // chunks))
    return [content[i : i + size] for i in range(0, len(content), size)]


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


# ---- Anthropic Messages -------------------------------------------------------------------------


def _anthropic_usage(u: Usage) -> dict[str, int]:
    return {
        "input_tokens": u.input,
        "cache_creation_input_tokens": u.cache_write,
        "cache_read_input_tokens": u.cache_read,
        "output_tokens": u.output,
    }


def _anthropic_content(turn: Turn) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for b in turn.blocks:
        if b["type"] == "text":
            out.append({"type": "text", "text": b["text"]})
        else:
            out.append({"type": "tool_use", "id": b["id"], "name": b["name"], "input": b["input"]})
    return out


def anthropic_message(turn: Turn, model: str) -> dict[str, Any]:
    msg: dict[str, Any] = {
        "id": f"msg_{next(_ids):08d}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": _anthropic_content(turn),
        "stop_reason": turn.stop_reason,
        "stop_sequence": None,
    }
    if not turn.omit_usage:
        msg["usage"] = _anthropic_usage(turn.usage)
    return msg


def anthropic_events(turn: Turn, model: str) -> list[bytes]:
    start_usage = {**_anthropic_usage(turn.usage), "output_tokens": 1}
    message: dict[str, Any] = {
        "id": f"msg_{next(_ids):08d}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
    }
    if not turn.omit_usage:
        message["usage"] = start_usage
    events = [_sse("message_start", {"type": "message_start", "message": message})]
    events.append(_sse("ping", {"type": "ping"}))
    for index, b in enumerate(turn.blocks):
        if b["type"] == "text":
            events.append(
                _sse(
                    "content_block_start",
                    {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}},
                )
            )
            for piece in _split(b["text"], b["chunks"]):
                delta = {"type": "text_delta", "text": piece}
                events.append(
                    _sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
                )
        else:
            block = {"type": "tool_use", "id": b["id"], "name": b["name"], "input": {}}
            events.append(
                _sse("content_block_start", {"type": "content_block_start", "index": index, "content_block": block})
            )
            args = json.dumps(b["input"])
            for piece in _split(args, max(1, len(args) // 12)):
                delta = {"type": "input_json_delta", "partial_json": piece}
                events.append(
                    _sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
                )
        events.append(_sse("content_block_stop", {"type": "content_block_stop", "index": index}))
    final: dict[str, Any] = {
        "type": "message_delta",
        "delta": {"stop_reason": turn.stop_reason, "stop_sequence": None},
    }
    if not turn.omit_usage:
        final["usage"] = {"output_tokens": turn.usage.output}
    events.append(_sse("message_delta", final))
    events.append(_sse("message_stop", {"type": "message_stop"}))
    return events


# ---- OpenAI Responses ---------------------------------------------------------------------------


def _openai_usage(u: Usage) -> dict[str, Any]:
    total_in = u.input + u.cache_read
    return {
        "input_tokens": total_in,
        "input_tokens_details": {"cached_tokens": u.cache_read},
        "output_tokens": u.output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": total_in + u.output,
    }


def _openai_items(turn: Turn) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for b in turn.blocks:
        if b["type"] == "text":
            items.append(
                {
                    "id": f"msg_{next(_ids):08d}",
                    "type": "message",
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": b["text"], "annotations": []}],
                }
            )
        else:
            items.append(
                {
                    "id": f"fc_{next(_ids):08d}",
                    "type": "function_call",
                    "status": "completed",
                    "call_id": b["id"],
                    "name": b["name"],
                    "arguments": json.dumps(b["input"]),
                }
            )
    return items


def openai_response(turn: Turn, model: str, *, status: str = "completed") -> dict[str, Any]:
    done = status == "completed"
    return {
        "id": f"resp_{next(_ids):08d}",
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "model": model,
        "output": _openai_items(turn) if done else [],
        "usage": None if (turn.omit_usage or not done) else _openai_usage(turn.usage),
    }


def openai_events(turn: Turn, model: str) -> list[bytes]:
    seq = itertools.count()
    shell = openai_response(turn, model, status="in_progress")

    def ev(kind: str, **data: Any) -> bytes:
        return _sse(kind, {"type": kind, "sequence_number": next(seq), **data})

    events = [ev("response.created", response=shell), ev("response.in_progress", response=shell)]
    items = _openai_items(turn)
    for index, (b, item) in enumerate(zip(turn.blocks, items, strict=True)):
        if item["type"] == "message":
            events.append(ev("response.output_item.added", output_index=index, item={**item, "content": []}))
            part = {"type": "output_text", "text": "", "annotations": []}
            events.append(
                ev("response.content_part.added", item_id=item["id"], output_index=index, content_index=0, part=part)
            )
            for piece in _split(b["text"], b["chunks"]):
                events.append(
                    ev(
                        "response.output_text.delta",
                        item_id=item["id"],
                        output_index=index,
                        content_index=0,
                        delta=piece,
                    )
                )
            events.append(
                ev(
                    "response.output_text.done",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    text=b["text"],
                )
            )
            events.append(
                ev(
                    "response.content_part.done",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    part=item["content"][0],
                )
            )
        else:
            events.append(ev("response.output_item.added", output_index=index, item={**item, "arguments": ""}))
            events.append(
                ev(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=index,
                    delta=item["arguments"],
                )
            )
            events.append(
                ev(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    arguments=item["arguments"],
                )
            )
        events.append(ev("response.output_item.done", output_index=index, item=item))
    completed = {**shell, "status": "completed", "output": items}
    completed["usage"] = None if turn.omit_usage else _openai_usage(turn.usage)
    events.append(ev("response.completed", response=completed))
    return events


# ---- the server ---------------------------------------------------------------------------------


@dataclass
class Upstream:
    """The live scripted upstream. Thread-safe: tests push and read from their own loop."""

    url: str = ""
    default: Turn = field(default_factory=lambda: text("ok"))
    requests: list[Recorded] = field(default_factory=list)
    _queue: deque[Turn] = field(default_factory=deque)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _loop: asyncio.AbstractEventLoop | None = None
    _release: asyncio.Event | None = None

    def push(self, *turns: Turn) -> None:
        with self._lock:
            self._queue.extend(turns)

    def clear(self) -> None:
        """Forget queued turns and recorded requests (a session-scoped upstream shared by tests)."""
        with self._lock:
            self._queue.clear()
            self.requests.clear()

    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    def release(self) -> None:
        """Let every stalled stream continue (and future stalled turns pass straight through)."""
        loop, event = self._loop, self._release
        if loop is not None and event is not None:
            loop.call_soon_threadsafe(event.set)

    def rearm(self) -> None:
        """Make stalled turns stall again after a :meth:`release`."""
        loop, event = self._loop, self._release
        if loop is not None and event is not None:
            loop.call_soon_threadsafe(event.clear)

    async def wait_requests(self, count: int, timeout: float = 30.0) -> list[Recorded]:
        async def seen() -> list[Recorded] | None:
            with self._lock:
                return list(self.requests) if len(self.requests) >= count else None

        return await eventually(
            seen, timeout=timeout, interval=0.02,
            message=lambda: f"the upstream saw {len(self.requests)} requests, wanted {count}",
        )  # fmt: skip

    def _next(self) -> Turn:
        with self._lock:
            return self._queue.popleft() if self._queue else self.default

    def _record(self, rec: Recorded) -> None:
        with self._lock:
            self.requests.append(rec)

    # ---- handlers (run on the server's own loop) ----

    async def _probe(self, request: Request) -> Response:
        return Response(status_code=200)

    async def _handle(self, request: Request) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        path = request.url.path
        headers = {k.lower(): v for k, v in request.headers.items()}
        rec = Recorded(request.method, path, request.url.query, headers, body, raw)
        self._record(rec)
        openai = path.endswith("/responses")
        if path.endswith("/count_tokens"):
            return self._json(rec, {"input_tokens": max(1, len(raw) // 4)})
        if not isinstance(body, dict):
            return self._error(openai, 400, "invalid_request_error", "request body is not a JSON object")
        turn = self._next()
        if turn.status != 200:
            error = self._error(openai, turn.status, turn.error_type or "api_error", turn.error_message or "error")
            if turn.location:
                error.headers["location"] = turn.location
            if turn.gzip:
                error.body = gzip.compress(bytes(error.body))
                error.headers["content-encoding"] = "gzip"
                error.headers["content-length"] = str(len(error.body))
            return error
        model = str(body.get("model", "unknown"))
        if not body.get("stream"):
            doc = openai_response(turn, model) if openai else anthropic_message(turn, model)
            return self._json(rec, doc, headers={"request-id": f"req_{next(_ids):08d}"})
        events = openai_events(turn, model) if openai else anthropic_events(turn, model)
        return StreamingResponse(
            self._stream(events, turn, rec),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "request-id": f"req_{next(_ids):08d}"},
        )

    async def _stream(self, events: list[bytes], turn: Turn, rec: Recorded) -> AsyncIterator[bytes]:
        for i, chunk in enumerate(events):
            if turn.break_after is not None and i == turn.break_after:
                raise UpstreamBroke(f"dropped after {i} events, as scripted")
            if turn.stall_after is not None and i == turn.stall_after and self._release is not None:
                await self._release.wait()
            if turn.delay and i:
                await asyncio.sleep(turn.delay)
            rec.response += chunk
            yield chunk

    @staticmethod
    def _json(rec: Recorded, doc: Any, headers: dict[str, str] | None = None) -> Response:
        content = json.dumps(doc, separators=(",", ":")).encode()
        rec.response += content
        return Response(content, media_type="application/json", headers=headers)

    @staticmethod
    def _error(openai: bool, status: int, kind: str, message: str) -> JSONResponse:
        if openai:
            doc: dict[str, Any] = {"error": {"message": message, "type": kind, "param": None, "code": None}}
        else:
            doc = {"type": "error", "error": {"type": kind, "message": message}}
        return JSONResponse(doc, status_code=status)

    def app(self) -> Starlette:
        routes = [
            Route("/", self._probe, methods=["HEAD", "GET"]),
            Route("/v1/messages", self._handle, methods=["POST"]),
            Route("/v1/messages/count_tokens", self._handle, methods=["POST"]),
            Route("/v1/responses", self._handle, methods=["POST"]),
        ]
        return Starlette(routes=routes)


def _serve(up: Upstream, sock: socket.socket, ready: threading.Event, stop: threading.Event) -> None:
    async def main() -> None:
        up._loop = asyncio.get_running_loop()
        up._release = asyncio.Event()
        config = uvicorn.Config(up.app(), log_level="warning", access_log=False, lifespan="off")
        server = uvicorn.Server(config)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        ready.set()
        while not stop.is_set() and not task.done():
            await asyncio.sleep(0.05)
        up._release.set()  # a stalled stream must not hold shutdown
        server.should_exit = True
        await task

    asyncio.run(main())


@contextlib.contextmanager
def running_upstream(port: int = 0) -> Iterator[Upstream]:
    """Start the scripted upstream on 127.0.0.1 (an ephemeral port by default); stopped on exit."""
    # IPPROTO_TCP explicitly: asyncio then sets TCP_NODELAY on accepted connections. With protocol 0 it
    # does not, and a stream's first event would wait ~40 ms for the client's delayed ACK (Nagle).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    up = Upstream(url=f"http://127.0.0.1:{sock.getsockname()[1]}")
    ready, stop = threading.Event(), threading.Event()
    thread = threading.Thread(target=_serve, args=(up, sock, ready, stop), name="llm-upstream", daemon=True)
    thread.start()
    try:
        if not ready.wait(15):
            raise RuntimeError("the scripted LLM upstream did not start")
        yield up
    finally:
        stop.set()
        thread.join(15)
        sock.close()


@contextlib.asynccontextmanager
async def scripted_upstream(port: int = 0) -> AsyncIterator[Upstream]:
    """``async with scripted_upstream() as up`` — the same server as :func:`running_upstream`."""
    with running_upstream(port) as up:
        yield up


def main() -> None:
    parser = argparse.ArgumentParser(description="A scripted Anthropic/OpenAI upstream for manual demos.")
    parser.add_argument("--port", type=int, default=8999)
    parser.add_argument("--text", default="Hello from the scripted upstream.", help="the answer to every request")
    args = parser.parse_args()
    with running_upstream(args.port) as up:
        up.default = text(args.text, usage=Usage(input=25, output=len(args.text.split())))
        print(f"scripted LLM upstream on {up.url} (Ctrl-C to stop)", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":
    main()
