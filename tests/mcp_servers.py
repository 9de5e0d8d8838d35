"""Real MCP servers for tests, served over Streamable HTTP on free loopback ports.

Every server is built with the mcp SDK (``MCPServer`` for the plain ones, the lowlevel ``Server`` where the test
needs control over ``tools/list`` pagination or a tool set that changes at runtime) and runs under uvicorn in a
background thread with its own event loop, so a slow tool never stalls the test's loop and a server can be stopped
abruptly.

Usage::

    async with serve(basic()) as srv:          # srv.url == "http://127.0.0.1:<port>/mcp"
        ...
        assert srv.call_count("add") == 1      # tools/call requests that reached the HTTP endpoint
        await srv.stop()                       # abrupt stop: the port now refuses connections

``blackhole()`` yields the URL of a port that accepts connections and never answers.

Factories: ``basic()``, ``bearer(token)``, ``header(name, value)``, ``paginating(n_tools=7, page_size=3)``,
``endless()``, ``repeating_cursor()``, ``changing()`` (mutable ``ToolRegistry`` at ``.registry``) and
``many_tools()`` (300 distinct, realistic tools: ``<verb>_<noun>``, for deferred discovery) and
``pinned_version(version)`` (``basic`` whose ``initialize`` offer is rewritten so the SDK server negotiates an older
protocol version) and ``http_error_on_call(status)`` (``basic`` answering every ``tools/call`` with a bare HTTP status).

Counting happens in an ASGI layer in front of the SDK app, before any auth check: ``srv.calls`` lists every
``tools/call`` JSON-RPC request that reached the HTTP endpoint (``(tool_name, arguments)``), ``srv.methods`` every
JSON-RPC request method. "Zero upstream requests" therefore means nothing arrived at all, not merely that nothing
executed.

``basic``'s ``drop_connection`` tool really executes (it is counted in ``srv.executions``), then the ASGI layer
aborts the HTTP response before the result is written, so the client sees the connection die mid-call.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import uvicorn
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "McpTestServer",
    "Recorder",
    "RunningServer",
    "ToolRegistry",
    "basic",
    "bearer",
    "blackhole",
    "changing",
    "endless",
    "header",
    "http_error_on_call",
    "many_tools",
    "paginating",
    "pinned_version",
    "repeating_cursor",
    "serve",
]

START_TIMEOUT = 10.0
STOP_TIMEOUT = 10.0


# --------------------------------------------------------------------------------------------------------------------
# Recording


class Recorder:
    """Thread-safe record of what reached a server (written by the server thread, read by the test)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._methods: list[str] = []
        self._calls: list[tuple[str, dict[str, Any]]] = []
        self._executions: list[str] = []
        self._http: list[tuple[str, int]] = []  # (HTTP method, status we answered with or 0 = passed through)
        self._reject_calls = 0  # answer this many coming tools/call requests with a bare 401
        self._accepted: dict[str, str] | None = None  # replaces the recipe's required headers (a rotated token)

    def record_rpc(self, method: str, params: Any) -> None:
        with self._lock:
            self._methods.append(method)
            if method == "tools/call" and isinstance(params, dict):
                args = params.get("arguments")
                self._calls.append((str(params.get("name")), dict(args) if isinstance(args, dict) else {}))

    def record_http(self, method: str, status: int) -> None:
        with self._lock:
            self._http.append((method, status))

    def reject_next_calls(self, count: int) -> None:
        """Answer the next ``count`` ``tools/call`` requests with HTTP 401 (as for a token the server stopped
        accepting), whatever credential they carry."""
        with self._lock:
            self._reject_calls = count

    def rotate_bearer(self, token: str) -> None:
        """From now on accept ``Authorization: Bearer <token>`` only (the server's operator rotated the token:
        every request with the old one, on a new or a kept-open session, gets HTTP 401)."""
        with self._lock:
            self._accepted = {"authorization": f"Bearer {token}"}

    def accepted_headers(self) -> dict[str, str] | None:
        with self._lock:
            return dict(self._accepted) if self._accepted is not None else None

    def take_call_rejection(self) -> bool:
        with self._lock:
            if self._reject_calls <= 0:
                return False
            self._reject_calls -= 1
            return True

    def record_execution(self, tool: str) -> None:
        with self._lock:
            self._executions.append(tool)

    @property
    def methods(self) -> list[str]:
        with self._lock:
            return list(self._methods)

    @property
    def calls(self) -> list[tuple[str, dict[str, Any]]]:
        with self._lock:
            return list(self._calls)

    @property
    def executions(self) -> list[str]:
        with self._lock:
            return list(self._executions)

    @property
    def http_requests(self) -> list[tuple[str, int]]:
        with self._lock:
            return list(self._http)

    def call_count(self, tool: str | None = None) -> int:
        with self._lock:
            return sum(1 for name, _ in self._calls if tool is None or name == tool)

    def reset(self) -> None:
        with self._lock:
            self._methods.clear()
            self._calls.clear()
            self._executions.clear()
            self._http.clear()


# --------------------------------------------------------------------------------------------------------------------
# The ASGI layer in front of every SDK app: counting, auth, version pinning, connection dropping


class _DropConnection(Exception):
    """Raised inside the send wrapper to abandon a response mid-stream."""


@dataclass
class _Gate:
    app: ASGIApp
    recorder: Recorder
    required_headers: dict[str, str] = field(default_factory=dict)  # lower-cased name -> exact value
    pin_version: str | None = None
    drop_tools: frozenset[str] = frozenset()
    status_on_call: int | None = None  # answer every tools/call with this bare HTTP status

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan
            await self.app(scope, receive, send)
            return
        body = b""
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # client went away before the body arrived
            body += message.get("body", b"")
            more = bool(message.get("more_body", False))

        rpc = _parse_jsonrpc(body) if scope["method"] == "POST" else []
        for msg in rpc:
            if "method" in msg and "id" in msg:
                self.recorder.record_rpc(str(msg["method"]), msg.get("params"))

        calling = any(m.get("method") == "tools/call" for m in rpc)
        if not self._authorised(scope) or (calling and self.recorder.take_call_rejection()):
            self.recorder.record_http(scope["method"], 401)
            await _plain_response(send, 401, b'{"error":"unauthorized"}', [(b"www-authenticate", b"Bearer")])
            return
        if self.status_on_call is not None and any(m.get("method") == "tools/call" for m in rpc):
            self.recorder.record_http(scope["method"], self.status_on_call)
            await _plain_response(send, self.status_on_call, b'{"error":"refused by test server"}', [])
            return
        self.recorder.record_http(scope["method"], 0)

        if self.pin_version is not None and any(m.get("method") == "initialize" for m in rpc):
            for msg in rpc:
                if msg.get("method") == "initialize" and isinstance(msg.get("params"), dict):
                    msg["params"]["protocolVersion"] = self.pin_version
            body = json.dumps(rpc[0] if len(rpc) == 1 else rpc).encode()
            scope = dict(scope)
            scope["headers"] = [(k, v) for k, v in scope["headers"] if k != b"content-length"] + [
                (b"content-length", str(len(body)).encode())
            ]

        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        drop = any(
            m.get("method") == "tools/call"
            and isinstance(m.get("params"), dict)
            and m["params"].get("name") in self.drop_tools
            for m in rpc
        )
        if not drop:
            await self.app(scope, replay, send)
            return

        async def send_until_result(message: Message) -> None:
            # Let the status line and headers through, then die instead of writing the first body bytes (the
            # tool result): the response is left incomplete and uvicorn closes the connection.
            if message["type"] == "http.response.body" and message.get("body"):
                raise _DropConnection
            await send(message)

        try:
            await self.app(scope, replay, send_until_result)
        except* _DropConnection:
            pass  # returning with the response incomplete makes uvicorn close the connection

    def _authorised(self, scope: Scope) -> bool:
        required = self.recorder.accepted_headers() or self.required_headers
        if not required:
            return True
        got: dict[str, str] = {}
        for k, v in scope["headers"]:
            got.setdefault(k.decode("latin-1").lower(), v.decode("latin-1"))
        return all(got.get(name) == value for name, value in required.items())


def _parse_jsonrpc(body: bytes) -> list[dict[str, Any]]:
    try:
        data = json.loads(body) if body else None
    except ValueError:
        return []
    items = data if isinstance(data, list) else [data]
    return [m for m in items if isinstance(m, dict)]


async def _plain_response(send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]]) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


# --------------------------------------------------------------------------------------------------------------------
# Server specs


@dataclass
class McpTestServer:
    """A server recipe: ``build()`` makes a fresh ASGI app (an SDK app can run its lifespan only once).

    A recipe whose app must know its own URL (an OAuth resource server names itself in its metadata) sets
    ``build_at`` instead; :func:`serve` calls it with the URL it is about to serve.
    """

    name: str
    build: Callable[[Recorder], ASGIApp]
    recorder: Recorder = field(default_factory=Recorder)
    registry: ToolRegistry | None = None
    build_at: Callable[[Recorder, str], ASGIApp] | None = None


def _basic_mcp(recorder: Recorder) -> MCPServer:
    srv = MCPServer("fluidbox-test-basic", version="0.1")

    @srv.tool(description="Add two integers.")
    def add(a: int, b: int) -> int:
        recorder.record_execution("add")
        return a + b

    @srv.tool(description="Echo the text back.")
    def echo(text: str) -> str:
        recorder.record_execution("echo")
        return text

    @srv.tool(description="Always fails with an MCP error result (isError: true).")
    def fail(text: str) -> types.CallToolResult:
        recorder.record_execution("fail")
        return types.CallToolResult(content=[types.TextContent(type="text", text=f"failed: {text}")], is_error=True)

    @srv.tool(description="Sleep for the given number of seconds, then answer.")
    async def slow(seconds: float) -> str:
        recorder.record_execution("slow")
        await anyio.sleep(seconds)
        return f"slept {seconds}"

    @srv.tool(description="Answer with a JSON-RPC error response instead of a tool result.")
    def rpc_error(text: str) -> str:
        recorder.record_execution("rpc_error")
        raise MCPError(code=types.INVALID_PARAMS, message=f"rejected: {text}")

    @srv.tool(description="Executes, then the server drops the connection before the result is written.")
    def drop_connection() -> str:
        recorder.record_execution("drop_connection")
        return "you should never see this"

    return srv


def _basic_app(recorder: Recorder, **gate: Any) -> ASGIApp:
    app = _basic_mcp(recorder).streamable_http_app()
    return _Gate(app, recorder, drop_tools=frozenset({"drop_connection"}), **gate)


def basic() -> McpTestServer:
    """Tools ``add(a,b)``, ``echo(text)``, ``fail(text)`` (isError result), ``slow(seconds)``,
    ``rpc_error(text)`` (JSON-RPC error response) and ``drop_connection()``."""
    return McpTestServer("basic", _basic_app)


def bearer(token: str) -> McpTestServer:
    """``basic`` behind ``Authorization: Bearer <token>`` (401 otherwise)."""
    return McpTestServer("bearer", lambda rec: _basic_app(rec, required_headers={"authorization": f"Bearer {token}"}))


def header(name: str, value: str) -> McpTestServer:
    """``basic`` behind a custom header ``<name>: <value>`` (401 otherwise)."""
    return McpTestServer("header", lambda rec: _basic_app(rec, required_headers={name.lower(): value}))


def pinned_version(version: str) -> McpTestServer:
    """``basic``, but the SDK server is shown an ``initialize`` offering ``version``, so it negotiates that."""
    return McpTestServer(f"pinned-{version}", lambda rec: _basic_app(rec, pin_version=version))


def http_error_on_call(status: int) -> McpTestServer:
    """``basic``, but every ``tools/call`` is answered with a bare HTTP ``status`` (no JSON-RPC body)."""
    return McpTestServer(f"http-{status}", lambda rec: _basic_app(rec, status_on_call=status))


def _text(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


def _lowlevel_app(
    recorder: Recorder,
    name: str,
    list_tools: Callable[[types.PaginatedRequestParams | None], types.ListToolsResult],
    call_tool: Callable[[str, dict[str, Any]], Awaitable[types.CallToolResult]],
) -> ASGIApp:
    async def on_list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return list_tools(params)

    async def on_call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        recorder.record_execution(params.name)
        return await call_tool(params.name, dict(params.arguments or {}))

    server: Server[Any] = Server(name, version="0.1", on_list_tools=on_list_tools, on_call_tool=on_call_tool)
    return _Gate(server.streamable_http_app(), recorder)


def _numbered_tool(i: int) -> types.Tool:
    return types.Tool(
        name=f"t{i:03d}",
        description=f"tool number {i}",
        input_schema={"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
    )


async def _echo_name(name: str, arguments: dict[str, Any]) -> types.CallToolResult:
    return _text(f"{name}:{json.dumps(arguments, sort_keys=True)}")


def paginating(n_tools: int = 7, page_size: int = 3) -> McpTestServer:
    """Lowlevel server listing ``t000``.. in pages of ``page_size`` (cursor = ``"offset:<n>"``)."""
    tools = [_numbered_tool(i) for i in range(n_tools)]

    def list_tools(params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        cursor = params.cursor if params is not None else None
        start = 0
        if cursor is not None:
            if not cursor.startswith("offset:"):
                raise MCPError(code=types.INVALID_PARAMS, message="bad cursor")
            start = int(cursor.removeprefix("offset:"))
        end = start + page_size
        return types.ListToolsResult(tools=tools[start:end], next_cursor=f"offset:{end}" if end < n_tools else None)

    return McpTestServer("paginating", lambda rec: _lowlevel_app(rec, "paginating", list_tools, _echo_name))


MANY_VERBS = ("create", "list", "get", "update", "delete", "archive")
MANY_NOUNS = (
    "invoice", "customer", "ticket", "project", "repository", "branch", "commit", "deployment", "incident", "alert",
    "dashboard", "report", "user", "team", "channel", "message", "calendar", "meeting", "document", "folder",
    "spreadsheet", "contact", "lead", "opportunity", "campaign", "order", "shipment", "product", "warehouse",
    "supplier", "payment", "refund", "subscription", "coupon", "webhook", "secret", "certificate", "domain",
    "bucket", "database", "cluster", "volume", "snapshot", "pipeline", "build", "release", "milestone", "label",
    "comment", "zone",
)  # fmt: skip


def many_tool(verb: str, noun: str) -> types.Tool:
    """One of ``many_tools``' tools; its schema depends on the verb, so a parameter name can find it too."""
    key = {"type": "string", "description": f"the {noun}'s id"}
    schemas: dict[str, dict[str, Any]] = {
        "create": {"properties": {"title": {"type": "string"}}, "required": ["title"]},
        "list": {"properties": {"limit": {"type": "integer", "minimum": 1}}},
        "get": {"properties": {f"{noun}_id": key}, "required": [f"{noun}_id"]},
        "update": {"properties": {f"{noun}_id": key, "title": {"type": "string"}}, "required": [f"{noun}_id"]},
        "delete": {"properties": {f"{noun}_id": key}, "required": [f"{noun}_id"]},
        "archive": {"properties": {f"{noun}_id": key, "reason": {"type": "string"}}, "required": [f"{noun}_id"]},
    }
    article = "an" if noun[0] in "aeiou" else "a"
    text = {
        "create": f"Create {article} {noun}.",
        "list": f"List every {noun} visible to the caller, newest first.",
        "get": f"Fetch one {noun} by its id.",
        "update": f"Rename {article} {noun}.",
        "delete": f"Permanently remove {article} {noun}.",
        "archive": f"Archive {article} {noun}: it leaves the active list but can be restored.",
    }[verb]
    return types.Tool(name=f"{verb}_{noun}", description=text, input_schema={"type": "object", **schemas[verb]})


def many_tools(page_size: int = 100) -> McpTestServer:
    """Lowlevel server with 300 tools (``MANY_VERBS`` × ``MANY_NOUNS``), listed in pages; calls echo name+args."""
    tools = [many_tool(verb, noun) for noun in MANY_NOUNS for verb in MANY_VERBS]

    def list_tools(params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        start = int(params.cursor) if params is not None and params.cursor else 0
        end = start + page_size
        return types.ListToolsResult(tools=tools[start:end], next_cursor=str(end) if end < len(tools) else None)

    return McpTestServer("many", lambda rec: _lowlevel_app(rec, "many", list_tools, _echo_name))


def endless() -> McpTestServer:
    """Every ``tools/list`` page carries one tool and a brand-new ``next_cursor``."""

    def list_tools(params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        cursor = params.cursor if params is not None else None
        n = 0 if cursor is None else int(cursor.removeprefix("page-"))
        return types.ListToolsResult(tools=[_numbered_tool(n)], next_cursor=f"page-{n + 1}")

    return McpTestServer("endless", lambda rec: _lowlevel_app(rec, "endless", list_tools, _echo_name))


def repeating_cursor() -> McpTestServer:
    """Cursors go ``a`` → ``b`` → ``a`` … (a loop) while listing different tools each page."""
    state = {"n": 0}

    def list_tools(params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        cursor = params.cursor if params is not None else None
        state["n"] += 1
        return types.ListToolsResult(tools=[_numbered_tool(state["n"])], next_cursor="b" if cursor == "a" else "a")

    return McpTestServer("repeating", lambda rec: _lowlevel_app(rec, "repeating", list_tools, _echo_name))


# --------------------------------------------------------------------------------------------------------------------
# A tool set that changes at runtime


ToolFn = Callable[[dict[str, Any]], Any]


@dataclass
class _RegisteredTool:
    description: str
    input_schema: dict[str, Any]
    fn: ToolFn | None


class ToolRegistry:
    """The mutable tool set behind ``changing()``; the test flips it while the server runs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tools: dict[str, _RegisteredTool] = {}

    def add(
        self, name: str, description: str = "", input_schema: dict[str, Any] | None = None, fn: ToolFn | None = None
    ) -> None:
        schema = input_schema if input_schema is not None else {"type": "object", "properties": {}}
        with self._lock:
            self._tools[name] = _RegisteredTool(description, schema, fn)

    def remove(self, name: str) -> None:
        with self._lock:
            del self._tools[name]

    def alter_schema(self, name: str, input_schema: dict[str, Any]) -> None:
        with self._lock:
            self._tools[name].input_schema = input_schema

    def set_description(self, name: str, description: str) -> None:
        with self._lock:
            self._tools[name].description = description

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._tools)

    def list_tools(self, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        with self._lock:
            tools = [
                types.Tool(name=n, description=t.description, input_schema=dict(t.input_schema))
                for n, t in self._tools.items()
            ]
        return types.ListToolsResult(tools=tools)

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        with self._lock:
            tool = self._tools.get(name)
        if tool is None:
            unknown = types.TextContent(type="text", text=f"unknown tool {name}")
            return types.CallToolResult(content=[unknown], is_error=True)
        if tool.fn is None:
            return await _echo_name(name, arguments)
        out = tool.fn(arguments)
        return out if isinstance(out, types.CallToolResult) else _text(str(out))


def changing() -> McpTestServer:
    """Lowlevel server over a ``ToolRegistry`` (``.registry``) seeded with ``alpha`` and ``beta``."""
    registry = ToolRegistry()
    registry.add(
        "alpha",
        "first tool",
        {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
    )
    registry.add("beta", "second tool", {"type": "object", "properties": {"n": {"type": "integer"}}})
    return McpTestServer(
        "changing",
        lambda rec: _lowlevel_app(rec, "changing", registry.list_tools, registry.call_tool),
        registry=registry,
    )


# --------------------------------------------------------------------------------------------------------------------
# Serving


class _Uvicorn(uvicorn.Server):
    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.loop = asyncio.get_running_loop()
        self.ready.set()

    def abort(self) -> None:
        """Runs on the server's loop: stop listening and reset every open connection, then shut down."""
        for listener in self.servers:
            listener.close()
        for connection in list(self.server_state.connections):
            transport = getattr(connection, "transport", None)
            if transport is not None:
                transport.abort()
        self.should_exit = True


@dataclass
class RunningServer:
    """A started server: ``url``, the recorder's views, ``registry`` (``changing`` only) and ``stop()``."""

    spec: McpTestServer
    url: str
    port: int
    _uvicorn: _Uvicorn
    _thread: threading.Thread

    @property
    def recorder(self) -> Recorder:
        return self.spec.recorder

    @property
    def registry(self) -> ToolRegistry:
        assert self.spec.registry is not None, f"server {self.spec.name!r} has no tool registry"
        return self.spec.registry

    @property
    def calls(self) -> list[tuple[str, dict[str, Any]]]:
        return self.spec.recorder.calls

    @property
    def methods(self) -> list[str]:
        return self.spec.recorder.methods

    @property
    def executions(self) -> list[str]:
        return self.spec.recorder.executions

    def call_count(self, tool: str | None = None) -> int:
        return self.spec.recorder.call_count(tool)

    @property
    def stopped(self) -> bool:
        return not self._thread.is_alive()

    async def stop(self, *, abrupt: bool = True) -> None:
        """Stop the server; afterwards its port refuses connections.

        ``abrupt`` (default) closes the listener and resets every open connection at once (in-flight responses
        are lost); otherwise uvicorn shuts down gracefully (in-flight requests get up to 1 s).
        """
        if self._thread.is_alive():
            loop = self._uvicorn.loop
            if abrupt and loop is not None:
                with contextlib.suppress(RuntimeError):  # loop already closed: the thread is finishing anyway
                    loop.call_soon_threadsafe(self._uvicorn.abort)
            else:
                self._uvicorn.should_exit = True
            await asyncio.to_thread(self._thread.join, STOP_TIMEOUT)
        if self._thread.is_alive():
            raise RuntimeError(f"MCP test server {self.spec.name!r} did not stop within {STOP_TIMEOUT}s")


@contextlib.asynccontextmanager
async def serve(spec: McpTestServer, port: int = 0) -> AsyncIterator[RunningServer]:
    """Serve ``spec`` on 127.0.0.1 (a free port, or ``port`` — e.g. to restart a server where it was) in a
    background thread; yields a ``RunningServer``."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/mcp"
    config = uvicorn.Config(
        spec.build_at(spec.recorder, url) if spec.build_at is not None else spec.build(spec.recorder),
        log_level="warning",
        lifespan="on",
        ws="none",
        http="h11",
        timeout_graceful_shutdown=1,
    )
    server = _Uvicorn(config)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(server.serve(sockets=[sock]))
        except BaseException as exc:
            errors.append(exc)
        finally:
            server.ready.set()  # never leave the starter waiting
            sock.close()

    thread = threading.Thread(target=run, name=f"mcp-test-{spec.name}-{port}", daemon=True)
    thread.start()
    ready = await asyncio.to_thread(server.ready.wait, START_TIMEOUT)
    if not ready or errors or not server.started:
        server.should_exit = True
        await asyncio.to_thread(thread.join, STOP_TIMEOUT)
        raise RuntimeError(f"MCP test server {spec.name!r} failed to start") from (errors[0] if errors else None)
    running = RunningServer(spec, url, port, server, thread)
    try:
        yield running
    finally:
        if not running.stopped:
            # Abrupt: the test is over, and a graceful stop would wait its full second on every kept-open session.
            await running.stop()


@contextlib.asynccontextmanager
async def blackhole() -> AsyncIterator[str]:
    """A loopback port that accepts TCP connections and never answers; yields its ``/mcp`` URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    finally:
        sock.close()
