"""``stdio``: an MCP server launched on the worker host and spoken to over its stdin/stdout.

``config`` (accepted only from trusted configuration: an admin-created connection or a catalog entry)::

    {"command": "node",                       # an executable name (looked up on PATH) or an absolute path
     "args": ["/opt/servers/fs/dist/index.js", "/srv/data"],
     "cwd": "/srv",                           # optional working directory
     "env": {"LOG_LEVEL": "warn"},            # explicit environment, merged over the MCP SDK's safe defaults
     "credential_env": "API_TOKEN"}           # optional: the connection's sealed credential, and only there

The process is started with the ``mcp`` SDK's stdio client, which execs ``command`` with ``args`` as an
argument vector (no shell: ``; rm -rf /`` stays one literal argument). Its environment is the SDK's short list
of safe variables (``HOME``, ``PATH``, ``USER``…), then ``env``, then the credential under ``credential_env``:
nothing else of the worker's environment reaches it. Its stderr goes to ``/dev/null`` (a server may print what
it was given).

One process per (connection, authorization generation, configuration) per process, started lazily by the
first call and kept for the next ones (calls share it: MCP multiplexes requests by id). Before reusing a
process the provider pings it; a process that died (crash, OOM kill) is discarded and a new one started, and
the call is sent to the new one: the tool call was provably never sent to the dead one. A process that dies
while a call is in flight makes that call ``ambiguous`` (never re-sent) and is replaced on the next call.
``close()`` ends every process (the worker calls it at shutdown); photographing uses a process of its own
that ends right after.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import Any

import anyio
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from core.digests import document_digest
from integrations.mcp_client import (
    CallOutcome,
    Photograph,
    _before_send,
    _call_request,
    _classify_result,
    _describe,
    _initialize,
    _is_sdk_standin,
    _list_all_tools,
    _malformed,
    _no_answer,
    _rpc_error_text,
    _synthetic_error_result,
    drift_message,
)
from integrations.transports import TransportConnection, TransportDeps, TransportError

logger = logging.getLogger("fluidbox.transports.stdio")

_ENV_NAME = "^[A-Za-z_][A-Za-z0-9_]{0,127}$"
_PING_SECS = 5.0
_START_SECS = 30.0
_STOP_SECS = 10.0
MAX_ARGS = 64


def validate_config(config: dict[str, Any]) -> str | None:
    """Why a stdio configuration is malformed, or None (shapes only: trust is decided by the caller)."""
    import re

    command = config.get("command")
    if not isinstance(command, str) or not command.strip() or "\x00" in command:
        return "a stdio connection needs a `command` (an executable name or absolute path)"
    args = config.get("args", [])
    if (
        not isinstance(args, list)
        or len(args) > MAX_ARGS
        or not all(isinstance(a, str) and "\x00" not in a for a in args)
    ):
        return f"`args` must be a list of at most {MAX_ARGS} strings"
    cwd = config.get("cwd")
    if cwd is not None and (not isinstance(cwd, str) or not os.path.isabs(cwd)):
        return "`cwd` must be an absolute path"
    env = config.get("env", {})
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and re.match(_ENV_NAME, k) and isinstance(v, str) and "\x00" not in v for k, v in env.items()
    ):
        return "`env` must map variable names to string values"
    cred = config.get("credential_env")
    if cred is not None and (not isinstance(cred, str) or not re.match(_ENV_NAME, cred)):
        return "`credential_env` must be an environment variable name"
    extra = set(config) - {"command", "args", "cwd", "env", "credential_env"}
    if extra:
        return f"unknown stdio field(s): {', '.join(sorted(extra))}"
    return None


def server_parameters(conn: TransportConnection) -> StdioServerParameters:
    config = conn.config
    problem = validate_config(config)
    if problem is not None:
        raise TransportError(problem)
    env = dict(config.get("env") or {})
    if config.get("credential_env") and conn.credential:
        env[config["credential_env"]] = conn.credential
    return StdioServerParameters(
        command=config["command"], args=list(config.get("args") or []), env=env, cwd=config.get("cwd")
    )


class _Process:
    """One server process and its MCP session, opened, kept and closed by its own task."""

    def __init__(self, params: StdioServerParameters, label: str) -> None:
        self.params = params
        self.label = label
        self.session: ClientSession | None = None
        self.version: str | None = None
        self.failure: str | None = None
        self.ready = asyncio.Event()
        self.done = asyncio.Event()
        self._close = asyncio.Event()
        self.task = asyncio.create_task(self._hold(), name=f"stdio-mcp {label}")

    @property
    def alive(self) -> bool:
        return self.session is not None and not self.done.is_set()

    async def _hold(self) -> None:
        try:
            with open(os.devnull, "w") as errlog:  # noqa: ASYNC230 (opening /dev/null never blocks)
                async with stdio_client(self.params, errlog=errlog) as (read, write):
                    async with ClientSession(read, write) as session:
                        with anyio.fail_after(_START_SECS):
                            self.version = await _initialize(session)
                        self.session = session
                        self.ready.set()
                        await self._close.wait()
        except Exception as exc:
            if self.session is None and self.failure is None:
                self.failure = f"could not start stdio MCP server '{self.label}': {_describe(exc)}"
            logger.debug("stdio MCP server %s ended: %s", self.label, _describe(exc))
        finally:
            if self.session is None and self.failure is None:
                self.failure = f"stdio MCP server '{self.label}' exited while starting"
            self.session = None
            self.ready.set()
            self.done.set()

    async def close(self) -> None:
        self._close.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(self.task), timeout=_STOP_SECS)
        if not self.task.done():
            self.task.cancel()


def _key(conn: TransportConnection) -> str:
    return document_digest([conn.id, conn.generation, conn.config, conn.credential or ""])


class StdioProvider:
    """Lazy, kept, restarted, closed server processes (one per connection) on this host."""

    def __init__(self, deps: TransportDeps) -> None:
        self.deps = deps
        self._processes: dict[str, _Process] = {}
        self._lock = asyncio.Lock()
        self.started = 0  # processes started so far (for tests and benchmarks)

    async def list_tools(self, conn: TransportConnection) -> Photograph:
        proc = _Process(server_parameters(conn), conn.config.get("command", "?"))
        try:
            await proc.ready.wait()
            if proc.session is None:
                raise TransportError(proc.failure or "the stdio MCP server did not start")
            try:
                with anyio.fail_after(self.deps.timeout):
                    tools = await _list_all_tools(proc.session, 50)
            except (MCPError, ValidationError, TimeoutError) as err:
                raise TransportError(f"tools/list failed on the stdio MCP server: {_describe(err)}") from None
            return Photograph(protocol_version=str(proc.version), tools=tools)
        finally:
            await proc.close()

    async def _acquire(self, conn: TransportConnection) -> tuple[_Process, bool]:
        key = _key(conn)
        async with self._lock:
            proc = self._processes.get(key)
            if proc is not None and proc.alive:
                return proc, True
            if proc is not None:
                await proc.close()
            proc = _Process(server_parameters(conn), f"{conn.id}")
            self._processes[key] = proc
            self.started += 1
        await proc.ready.wait()
        return proc, False

    async def _discard(self, conn: TransportConnection, proc: _Process) -> None:
        async with self._lock:
            if self._processes.get(_key(conn)) is proc:
                del self._processes[_key(conn)]
        await proc.close()

    async def _usable(self, conn: TransportConnection) -> _Process | CallOutcome:
        """A live process proven to answer, restarting a dead one once; or a ``failed_before_send`` outcome."""
        for _ in range(2):
            try:
                proc, reused = await self._acquire(conn)
            except TransportError as err:
                return _before_send(str(err))
            session = proc.session
            if session is None:
                await self._discard(conn, proc)
                return _before_send(proc.failure or "the stdio MCP server did not start")
            if not reused:
                return proc
            try:
                with anyio.fail_after(_PING_SECS):
                    await session.send_ping()
                return proc
            except Exception as exc:  # a dead or wedged process: replaced, and the call goes to the new one
                logger.info(
                    "stdio MCP server of connection %s stopped answering (%s): restarting", conn.id, _describe(exc)
                )
                await self._discard(conn, proc)
        return _before_send("the stdio MCP server died twice in a row before tools/call")

    async def call_tool(
        self, conn: TransportConnection, tool: dict[str, Any], arguments: dict[str, Any]
    ) -> CallOutcome:
        name = str(tool["name"])
        usable = await self._usable(conn)
        if isinstance(usable, CallOutcome):
            return usable
        proc = usable
        if conn.protocol_version is not None and proc.version != conn.protocol_version:
            return _before_send(drift_message(str(proc.version), conn.protocol_version))
        session = proc.session
        if session is None:
            return _before_send("the stdio MCP server exited before tools/call")
        with anyio.move_on_after(self.deps.timeout):
            try:
                result = await session.send_request(_call_request(name, arguments), types.CallToolResult)
            except MCPError as err:
                if _is_sdk_standin(err):
                    await self._discard(conn, proc)
                    return CallOutcome(
                        "ambiguous", None, f"tools/call {name!r} lost its answer ({err.message}) — outcome unknown"
                    )
                text = _rpc_error_text(err)
                return CallOutcome(
                    "failed_upstream", _synthetic_error_result(text), f"tools/call {name!r} failed: {text}"
                )
            except ValidationError:
                return _malformed(name)
            except Exception as exc:
                await self._discard(conn, proc)
                return CallOutcome("ambiguous", None, f"tools/call {name!r} failed: {_describe(exc)} — outcome unknown")
            return _classify_result(result, name)
        await self._discard(conn, proc)  # a wedged server is replaced
        return _no_answer(name, self.deps.timeout)

    @property
    def running(self) -> int:
        return sum(1 for p in self._processes.values() if p.alive)

    async def close(self) -> None:
        async with self._lock:
            procs, self._processes = list(self._processes.values()), {}
        await asyncio.gather(*(p.close() for p in procs), return_exceptions=True)


__all__ = ["StdioProvider", "server_parameters", "validate_config"]
