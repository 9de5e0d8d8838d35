"""Kept-open MCP sessions for brokered calls.

A fresh session per call costs four HTTP exchanges (``initialize``, ``notifications/initialized``,
``tools/call``, the closing ``DELETE``); a kept-open one costs one. The pool keeps idle sessions per
(URL, credential headers, expected protocol, pinned addresses) for a short while and lends each to one
call at a time, so the per-session record of HTTP statuses stays unambiguous.

A session opened with a ``pin`` connects only to the addresses that admission vetted, for its whole
life. It is lent only to a call for the same URL whose own, fresh admission produced the same set of
addresses; a pinned session never serves an unpinned call or the reverse.

The execution-claim semantics of ``mcp_client.call_tool`` are kept exactly:

* a session is only ever reused after a clean answer (``succeeded`` / ``failed_upstream``);
  anything else closes it;
* a reused session the server no longer knows (HTTP 404 on ``tools/call``: the server refused it
  before executing anything) is closed and the call is sent once on a fresh session;
* a session whose transport died because the server could not be reached at all (every failure a
  refused or timed-out connect) reports ``failed_before_send``, as a fresh session would;
* everything else after the request was handed over stays ``ambiguous``.

Each session lives in a task of its own (the SDK's context managers must be entered and exited by
the same task); callers borrow it from their own tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

import anyio
from mcp import types
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from core.digests import document_digest
from integrations.mcp_client import (
    CallOutcome,
    _before_send,
    _call_request,
    _classify_call_error,
    _classify_result,
    _describe,
    _handshake,
    _is_connect_failure,
    _is_sdk_standin,
    _malformed,
    _no_answer,
    _open_session,
    _safe_url,
    _Wire,
    drift_message,
)
from integrations.urls import AdmittedUrl, IPAddress

logger = logging.getLogger("fluidbox.mcp.pool")

IDLE_SECS = 30.0  # an idle session older than this is closed instead of reused
MAX_IDLE_PER_KEY = 4
_UNWIND_SECS = 1.0  # how long a caller waits to learn why a session's transport went away


@dataclass(frozen=True)
class _Key:
    url: str
    headers: str  # digest of the headers (they carry the credential)
    protocol: str | None
    addresses: frozenset[IPAddress] | None  # the pin's vetted addresses; None: resolved at connect time


class _Held:
    """One MCP session, opened, kept and closed by its own task."""

    def __init__(self, url: str, headers: dict[str, str], timeout: float, pin: AdmittedUrl | None) -> None:
        self.url = url
        self.pin = pin
        self.wire = _Wire()
        self.session: ClientSession | None = None
        self.version: str | None = None
        self.failure: CallOutcome | None = None  # set when the session could not be opened
        self.error: BaseException | None = None  # what ended the transport, if anything did
        self.idle_since = time.monotonic()
        self.ready = asyncio.Event()
        self.done = asyncio.Event()
        self._close = asyncio.Event()
        self.task = asyncio.create_task(self._hold(headers, timeout), name=f"mcp-session {_safe_url(url)}")

    @property
    def alive(self) -> bool:
        return self.session is not None and not self.done.is_set()

    async def _hold(self, headers: dict[str, str], timeout: float) -> None:
        try:
            async with _open_session(self.url, headers, timeout, self.wire, self.pin) as session:
                version, failure = await _handshake(session, self.wire, self.url, timeout)
                if failure is not None:
                    self.failure = failure
                    return
                self.session, self.version = session, version
                self.ready.set()
                await self._close.wait()
        except Exception as exc:
            self.error = exc
            if self.session is None and self.failure is None:
                self.failure = _before_send(f"cannot reach MCP server at {_safe_url(self.url)}: {_describe(exc)}")
            logger.debug("mcp session to %s ended: %s", _safe_url(self.url), _describe(exc))
        finally:
            if self.session is None and self.failure is None:
                self.failure = _before_send(f"MCP server at {_safe_url(self.url)} closed the session while opening")
            self.ready.set()
            self.done.set()

    def close(self) -> None:
        self._close.set()


class SessionPool:
    """Idle MCP sessions, lent to one brokered call at a time."""

    def __init__(self, *, idle_secs: float = IDLE_SECS, max_idle_per_key: int = MAX_IDLE_PER_KEY) -> None:
        self._idle: dict[_Key, list[_Held]] = {}
        self._all: set[_Held] = set()
        self._idle_secs = idle_secs
        self._max_idle = max_idle_per_key
        self.opened = 0  # sessions opened so far (for tests and benchmarks)

    async def call_tool(
        self,
        url: str,
        headers: dict[str, str],
        name: str,
        arguments: dict[str, Any],
        *,
        expected_protocol: str | None,
        timeout: float = 30.0,
        pin: AdmittedUrl | None = None,
    ) -> CallOutcome:
        """Same contract as ``mcp_client.call_tool`` (never raises for upstream trouble), ``pin`` included."""
        addresses = frozenset(pin.addresses) if pin is not None else None
        key = _Key(url, document_digest(sorted(headers.items())), expected_protocol, addresses)
        for _ in range(2):
            held, reused = await self._acquire(key, headers, timeout, pin)
            if held.failure is not None:
                self._discard(held)
                return held.failure
            if expected_protocol is not None and held.version != expected_protocol:
                self._discard(held)
                return _before_send(drift_message(str(held.version), expected_protocol))
            outcome, stale = await self._send(held, reused, name, arguments, timeout)
            if stale:
                self._discard(held)
                continue  # the server forgot the session and executed nothing: once more, fresh
            if outcome.outcome in ("succeeded", "failed_upstream") and held.alive:
                self._release(key, held)
            else:
                self._discard(held)
            return outcome
        return _before_send(f"MCP server at {_safe_url(url)} dropped two sessions in a row before tools/call")

    async def _acquire(
        self, key: _Key, headers: dict[str, str], timeout: float, pin: AdmittedUrl | None
    ) -> tuple[_Held, bool]:
        self._sweep()
        idle = self._idle.get(key, [])
        while idle:
            held = idle.pop()
            if held.alive:
                return held, True
            self._discard(held)
        held = _Held(key.url, headers, timeout, pin)
        self._all.add(held)
        self.opened += 1
        await held.ready.wait()
        return held, False

    async def _send(
        self, held: _Held, reused: bool, name: str, arguments: dict[str, Any], timeout: float
    ) -> tuple[CallOutcome, bool]:
        session = held.session
        if session is None:  # died between the check and now: nothing was sent
            return _before_send(f"MCP session to {_safe_url(held.url)} closed before tools/call"), reused
        held.wire.status.clear()
        with anyio.move_on_after(timeout):
            try:
                result = await session.send_request(_call_request(name, arguments), types.CallToolResult)
            except MCPError as err:
                status = held.wire.status.get("tools/call")
                if reused and status == 404:
                    # HTTP 404 to a request carrying a session id: the server does not know the session
                    # and refused the request before dispatching it (whatever JSON-RPC error it added).
                    return _before_send("session expired"), True
                if status is None and _is_sdk_standin(err):
                    # No HTTP answer at all: learn from the transport why it went away.
                    with anyio.move_on_after(_UNWIND_SECS):
                        await held.done.wait()
                    if held.error is not None and _is_connect_failure(held.error):
                        return _before_send(f"tools/call {name!r} could not connect: {_describe(held.error)}"), False
                return _classify_call_error(err, held.wire, name), False
            except ValidationError:
                return _malformed(name), False
            return _classify_result(result, name), False
        return _no_answer(name, timeout), False

    def _release(self, key: _Key, held: _Held) -> None:
        idle = self._idle.setdefault(key, [])
        if len(idle) >= self._max_idle:
            self._discard(held)
            return
        held.idle_since = time.monotonic()
        idle.append(held)

    def _discard(self, held: _Held) -> None:
        held.close()
        self._all.discard(held)

    def _sweep(self) -> None:
        cutoff = time.monotonic() - self._idle_secs
        for key, idle in list(self._idle.items()):
            keep = []
            for held in idle:
                if held.alive and held.idle_since >= cutoff:
                    keep.append(held)
                else:
                    self._discard(held)
            if keep:
                self._idle[key] = keep
            else:
                del self._idle[key]

    @property
    def idle_count(self) -> int:
        return sum(len(v) for v in self._idle.values())

    async def aclose(self) -> None:
        """Close every session (idle or lent) and wait briefly for their tasks."""
        helds = list(self._all)
        self._idle.clear()
        self._all.clear()
        for held in helds:
            held.close()
        if helds:
            with contextlib.suppress(Exception):
                await asyncio.wait([h.task for h in helds], timeout=5)
        for held in helds:
            if not held.task.done():
                held.task.cancel()
