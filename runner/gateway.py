"""The runner's client for the control plane's internal plane (``/internal/sessions/{id}/...``).

Synchronous on purpose: the runner is one driver thread plus a heartbeat thread, and a blocking
``/permission`` call *is* the gate — the tool must not run until the answer arrives.

Standard library only, one short connection per request (so the two threads never share one): a sandbox
starts a fresh interpreter for every run, and httpx and pydantic would cost each start about 0.3 s of CPU,
which a burst of runs pays hundreds of times over.

Inside bubblewrap there is no network; the API is reached through a Unix socket bound into the sandbox
(``FLUIDBOX_CONTROL_SOCKET``), and the URL host is then only cosmetic. That hot local path does not use
``http.client`` either: importing it (with the ``email`` parser and ``ssl`` it drags in) was about half of
a replay runner's start CPU (issue 12, docs/decisions.md). The runner speaks only to our own gateway, and
only one kind of exchange: one POST with ``content-length`` and ``connection: close``, then one answer read
by its framing (``content-length``, chunked, or until the peer closes). :func:`_exchange` does exactly that
and nothing more; an answer it cannot read is a :class:`TransportError`, like no answer at all. A Pod
reaches the control plane over TCP or TLS (``FLUIDBOX_CONTROL_URL``), where ``http.client`` (and ``ssl``)
is still used, imported on that path only.

Tokens are read once by :func:`take_credentials`, which also removes every token variable from the
environment so that no child process the runner spawns can inherit one.

Exceptions (independent, so catching one never swallows another)::

    GatewayError          -- a post that must succeed (/result) did not (exit 1)
    GatewayGone           -- the control plane was unreachable for longer than the staleness window (exit 6)
    AudienceMismatch      -- the server answered wrong_audience: runner image and server disagree (exit 3)
    MissingEnv            -- required environment absent (exit 2)
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import sys
import time
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any, NamedTuple, Protocol

from core.wire import (
    ENV_CONTROL_SOCKET,
    ENV_CONTROL_URL,
    ENV_GATEWAY_STALENESS_SECS,
    ENV_LLM_TOKEN,
    ENV_SECRETS_FD,
    ENV_SESSION_ID,
    ENV_SESSION_TOKEN,
    ENV_TOOL_TOKEN,
    GATEWAY_GONE,
    MAX_PARK_SECS,
    RUN_ERROR,
    TOKEN_ENV_VARS,
)

DEFAULT_CONTROL_URL = "http://fluidbox"
DEFAULT_TIMEOUT_S = 30.0
# Longer than the default 10-minute approval TTL: an approval wait holds the request open.
PERMISSION_TIMEOUT_S = 12 * 60.0
DIAGNOSTIC_TIMEOUT_S = 5.0
# One brokered call (or connection proposal) is held by the server while it waits for a human or for a
# connection: each post waits this long, then the runner re-attaches (same tool_call_id) for as long as a
# park can last plus an approval wait, so the park's TTL (or the run ending) decides, never this client.
HOLD_TIMEOUT_S = PERMISSION_TIMEOUT_S + 30
MAX_HOLD_S = MAX_PARK_SECS + PERMISSION_TIMEOUT_S
EMIT_RETRIES = 2
HEARTBEAT_RETRIES = 1
RESULT_RETRIES = 5
SUMMARY_MAX_CHARS = 4000
INACTIVE_MESSAGE = "session is not active"
# How long an unreachable control plane (a restart, an upgrade) is ridden out before the runner gives up.
DEFAULT_GATEWAY_STALENESS_S = 600.0

Sleep = Callable[[float], None]


class GatewayError(Exception):
    """A post that must succeed (``/result``) failed for good."""


class GatewayGone(Exception):
    """No answer at all from the control plane for longer than the staleness window. Fatal."""


class AudienceMismatch(Exception):
    """The server rejected a token with ``wrong_audience``: a misdeployed runner image. Fatal."""


class MissingEnv(Exception):
    """A required environment variable (session id, control token) is absent."""


class TransportError(Exception):
    """No HTTP answer arrived (refused, reset, timed out): the request may be retried unchanged. ``held``: the
    request was delivered and the server kept it without answering within the timeout (it is waiting, not
    gone)."""

    def __init__(self, message: str, *, held: bool = False) -> None:
        super().__init__(message)
        self.held = held


# The value types below are NamedTuples (immutable, equal by value) rather than dataclasses: ``dataclasses``
# loads ``inspect``, a few ms of every runner's start (issue 12).


class Response(NamedTuple):
    """A complete HTTP answer from the control plane."""

    status_code: int
    content: bytes

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        """The body as JSON. Raises ValueError when it is not."""
        return json.loads(self.content)


class Verdict(NamedTuple):
    """The gate's answer to one tool call (``/permission``)."""

    decision: str  # allow | deny
    message: str | None = None
    updated_input: dict[str, Any] | None = None


# Limits on an answer's head, as http.client has them: a peer that never ends a line cannot grow the buffer.
_MAX_LINE = 65536
_MAX_HEADERS = 100
_HEX = frozenset(b"0123456789abcdefABCDEF")
# Characters http.client refuses in a request target (controls and the space).
_BAD_TARGET = frozenset(chr(c) for c in (*range(0x21), 0x7F))


class HttpProtocolError(Exception):
    """The exchange broke HTTP/1.1: the peer's bytes are not one complete answer, or the request target could
    not be sent as it is."""


class _Reader:
    """Buffered reads from one connected socket; each ``recv`` is bound by the socket's timeout."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buf = bytearray()

    def _more(self) -> bool:
        data = self._sock.recv(65536)
        self._buf += data
        return bool(data)

    def line(self) -> bytes | None:
        """The next line without its line end (CRLF, or a bare LF), or None at the end of the stream."""
        while (end := self._buf.find(b"\n")) < 0:
            if len(self._buf) > _MAX_LINE:
                raise HttpProtocolError("a line of the answer is too long")
            if not self._more():
                if self._buf:
                    raise HttpProtocolError("the answer ended inside a line")
                return None
        if end > _MAX_LINE:
            raise HttpProtocolError("a line of the answer is too long")
        line = bytes(self._buf[:end])
        del self._buf[: end + 1]
        return line[:-1] if line.endswith(b"\r") else line

    def exact(self, size: int) -> bytes:
        while len(self._buf) < size:
            if not self._more():
                raise HttpProtocolError(f"the answer ended {size - len(self._buf)} bytes short of its body")
        data = bytes(self._buf[:size])
        del self._buf[:size]
        return data

    def rest(self) -> bytes:
        while self._more():
            pass
        data = bytes(self._buf)
        self._buf.clear()
        return data


def _read_head(reader: _Reader) -> tuple[int, dict[str, str]]:
    """The status code and the headers (names lower-cased; repeated ones joined with ``", "``)."""
    line = reader.line()
    if line is None:
        raise HttpProtocolError("the peer closed the connection without answering")
    parts = line.split(None, 2)
    if (
        len(parts) < 2
        or not parts[0].startswith(b"HTTP/1.")
        or len(parts[1]) != 3
        or not parts[1].isdigit()
        or parts[1][0] == ord("0")
    ):
        raise HttpProtocolError(f"malformed status line {line[:80]!r}")
    headers: dict[str, str] = {}
    for _ in range(_MAX_HEADERS + 1):
        line = reader.line()
        if line is None:
            raise HttpProtocolError("the answer ended inside its headers")
        if not line:
            return int(parts[1]), headers
        name, colon, value = line.partition(b":")
        # No space before the colon and no folded continuation lines (RFC 9112 forbids both).
        if not colon or not name or name != name.strip():
            raise HttpProtocolError(f"malformed header line {line[:80]!r}")
        key, text = name.decode("latin-1").lower(), value.strip().decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    raise HttpProtocolError(f"more than {_MAX_HEADERS} headers")


def _read_chunked(reader: _Reader) -> bytes:
    parts: list[bytes] = []
    while True:
        line = reader.line()
        if line is None:
            raise HttpProtocolError("the answer ended inside its chunked body")
        size = line.split(b";", 1)[0].strip()  # a chunk extension is ignored
        if not size or len(size) > 16 or not _HEX.issuperset(size):
            raise HttpProtocolError(f"malformed chunk size {line[:40]!r}")
        if not (length := int(size, 16)):
            break
        parts.append(reader.exact(length))
        if reader.line() != b"":
            raise HttpProtocolError("a chunk is longer than its size says")
    # The trailer section, ignored: lines up to an empty one (or the end of the stream).
    for _ in range(_MAX_HEADERS + 1):
        if not reader.line():
            return b"".join(parts)
    raise HttpProtocolError(f"more than {_MAX_HEADERS} trailer lines")


def _read_answer(reader: _Reader) -> Response:
    """One complete answer: the body is framed by chunked coding, ``content-length``, or the peer closing."""
    status, headers = _read_head(reader)
    while 100 <= status < 200 and status != 101:  # an interim answer (100 Continue): the real one follows
        status, headers = _read_head(reader)
    if status in (101, 204, 304):
        return Response(status, b"")
    coding = headers.get("transfer-encoding")
    if coding is not None:
        if coding.strip().lower() != "chunked":
            raise HttpProtocolError(f"unsupported transfer-encoding {coding!r}")
        return Response(status, _read_chunked(reader))
    length = headers.get("content-length")
    if length is None:
        return Response(status, reader.rest())
    values = {value.strip() for value in length.split(",")}
    text = values.pop()
    if values or not (text.isascii() and text.isdigit()):
        raise HttpProtocolError(f"malformed content-length {length[:40]!r}")
    return Response(status, reader.exact(int(text)))


def _request_bytes(target: str, headers: Mapping[str, str], body: bytes) -> bytes:
    if not target.startswith("/") or not _BAD_TARGET.isdisjoint(target):
        raise HttpProtocolError(f"cannot send a request to {target!r}")
    lines = [f"POST {target} HTTP/1.1", "host: fluidbox"]
    for name, value in headers.items():
        if "\r" in value or "\n" in value:
            raise ValueError(f"invalid value for header {name}")
        lines.append(f"{name}: {value}")
    lines.append(f"content-length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _exchange(socket_path: str, target: str, headers: Mapping[str, str], body: bytes, timeout: float) -> Response:
    """One POST over the gateway's Unix socket and its complete answer.

    ``timeout`` bounds the connect and every single send and receive (as ``http.client``'s does).

    Raises:
        TransportError: refused, reset, closed early, an unreadable answer, or a timeout; ``held`` when the
            timeout came after the whole request was sent (the server has it and is keeping it).
    """
    sent = False
    sock: socket.socket | None = None
    try:
        request = _request_bytes(target, headers, body)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        sock.connect(socket_path)
        sock.sendall(request)
        sent = True
        return _read_answer(_Reader(sock))
    except (OSError, HttpProtocolError) as exc:
        held = sent and isinstance(exc, TimeoutError)
        raise TransportError(f"{type_name(exc)}: {exc}", held=held) from None
    finally:
        if sock is not None:
            sock.close()


# ``scheme://host[:port]`` with at most a bare "/" after it: urlsplit would find no path (nor a bad port) in it.
_BARE_ORIGIN = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[A-Za-z0-9.-]*(?::[0-9]{1,4})?/?")
_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")


def path_segment(text: str) -> str:
    """``text`` as one percent-encoded URL path segment: ``urllib.parse.quote(text, safe="")``, without
    loading urllib (and the ipaddress it loads) at every runner start."""
    return "".join(chr(b) if b in _UNRESERVED else f"%{b:02X}" for b in text.encode("utf-8"))


class _Http:
    """One JSON POST per connection, over the gateway socket or to ``FLUIDBOX_CONTROL_URL``."""

    def __init__(self, base_url: str, socket_path: str | None) -> None:
        self._socket_path = socket_path
        self._tls = False
        self._host, self._port, self._base_path = "fluidbox", None, ""
        if socket_path and _BARE_ORIGIN.fullmatch(base_url):
            return  # only the path matters on the socket, and this URL has none: urllib stays unloaded
        from urllib.parse import urlsplit

        parts = urlsplit(base_url)
        self._tls = parts.scheme == "https"
        self._host = parts.hostname or "fluidbox"
        self._port = parts.port
        self._base_path = parts.path.rstrip("/")

    def post(self, path: str, payload: dict[str, Any], token: str, timeout: float) -> Response:
        """Raises TransportError when no complete answer arrived."""
        body = json.dumps(payload, separators=(",", ":")).encode()
        headers = {
            "authorization": f"Bearer {token}",
            "content-type": "application/json",
            "accept": "application/json",
            "accept-encoding": "identity",
            "connection": "close",
        }
        if self._socket_path:
            return _exchange(self._socket_path, self._base_path + path, headers, body, timeout)
        return self._post_tcp(self._base_path + path, headers, body, timeout)

    def _post_tcp(self, target: str, headers: dict[str, str], body: bytes, timeout: float) -> Response:
        # A Pod's path (TCP, or TLS to the control plane's Service): http.client and ssl are loaded here only.
        import http.client

        conn: http.client.HTTPConnection
        if self._tls:
            conn = http.client.HTTPSConnection(self._host, self._port, timeout=timeout)
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        sent = False
        try:
            conn.request("POST", target, body=body, headers=headers)
            sent = True
            answer = conn.getresponse()
            return Response(answer.status, answer.read())
        except (OSError, http.client.HTTPException) as exc:
            held = sent and isinstance(exc, TimeoutError)
            raise TransportError(f"{type_name(exc)}: {exc}", held=held) from None
        finally:
            conn.close()


class Credentials(NamedTuple):
    session_id: str
    control_token: str
    tool_token: str
    llm_token: str


class ControlPlane(Protocol):
    """What a harness needs from the control plane; :class:`Gateway` is the real one."""

    def emit(self, actor: str, type: str, data: dict[str, Any]) -> None: ...

    def heartbeat(self) -> str | None: ...

    def renew_tokens(self) -> bool: ...

    def permission(self, tool_call_id: str, tool: str, input: dict[str, Any]) -> Verdict: ...

    def tools_call(
        self, tool_call_id: str, tool: str, input: dict[str, Any], via: str | None = None
    ) -> dict[str, Any]: ...

    def discover(self, leaf: str, payload: dict[str, Any]) -> dict[str, Any]: ...

    def propose_connection(self, tool_call_id: str, connection: dict[str, Any]) -> dict[str, Any]: ...

    def result(self, outcome: str, summary: str) -> None: ...


def log(message: str) -> None:
    """Diagnostics go to stderr (the sandbox log); never pass a token here."""
    print(f"fluidbox-runner: {message}", file=sys.stderr, flush=True)


def _read_secrets_fd(value: str | None) -> dict[str, str]:
    """Read the tokens the sandbox was handed on an inherited pipe, to its end, and close it.

    The caller has made this process non-dumpable first (``runner.harness.guard_memory``): from here on
    the tokens live only in memory that nothing else in the sandbox may read.
    """
    if not value:
        return {}
    try:
        fd = int(value)
    except ValueError:
        raise MissingEnv(f"{ENV_SECRETS_FD} is not a descriptor number: {value!r}") from None
    chunks: list[bytes] = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        data = json.loads(b"".join(chunks))
    except (OSError, ValueError) as exc:
        raise MissingEnv(f"cannot read the secrets from descriptor {fd}: {exc}") from None
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    if not isinstance(data, dict):
        raise MissingEnv(f"the secrets on descriptor {fd} are not a JSON object")
    return {str(k): str(v) for k, v in data.items()}


def take_credentials(environ: MutableMapping[str, str], handed: Mapping[str, str] | None = None) -> Credentials:
    """Read the session id and tokens, deleting every token variable from ``environ`` first.

    The deletion happens even when something is missing, so a failing runner leaks nothing either.
    A missing tool/llm token falls back to the control token (older servers issue one token).

    Raises:
        MissingEnv: no session id or no control token.
    """
    tokens = {name: (environ.pop(name, None) or "").strip() for name in TOKEN_ENV_VARS}
    # ``handed``: tokens a remote runner got for its bootstrap credential (runner.remote.exchange).
    for name, value in [*_read_secrets_fd(environ.pop(ENV_SECRETS_FD, None)).items(), *(handed or {}).items()]:
        if name in tokens and value:
            tokens[name] = value.strip()
    session_id = (environ.get(ENV_SESSION_ID) or "").strip()
    control = tokens[ENV_SESSION_TOKEN]
    missing = [name for name, value in ((ENV_SESSION_ID, session_id), (ENV_SESSION_TOKEN, control)) if not value]
    if missing:
        raise MissingEnv(f"missing required environment: {', '.join(missing)}")
    return Credentials(
        session_id=session_id,
        control_token=control,
        tool_token=tokens[ENV_TOOL_TOKEN] or control,
        llm_token=tokens[ENV_LLM_TOKEN] or tokens.get("ANTHROPIC_API_KEY", "") or control,
    )


def is_transient(status: int) -> bool:
    """Statuses worth retrying: the request may succeed unchanged later."""
    return status in (408, 425, 429) or 500 <= status <= 599


def error_text(response: Response) -> str:
    """The server's error message, from a JSON ``detail``/``error``/``message`` field or the raw body."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        for key in ("detail", "error", "message"):
            value = body.get(key)
            if isinstance(value, str) and value:
                return value
            if value is not None:
                return json.dumps(value)[:500]
    return response.text.strip()[:500] or f"HTTP {response.status_code}"


class Gateway:
    """Sync client for one session's internal routes."""

    def __init__(
        self,
        credentials: Credentials,
        *,
        base_url: str = DEFAULT_CONTROL_URL,
        socket_path: str | None = None,
        sleep: Sleep = time.sleep,
        staleness_s: float = DEFAULT_GATEWAY_STALENESS_S,
        clock: Callable[[], float] = time.monotonic,
        hold_timeout_s: float = HOLD_TIMEOUT_S,
    ) -> None:
        self._http = _Http(base_url, socket_path)
        self._prefix = f"/internal/sessions/{path_segment(credentials.session_id)}"
        self._control = credentials.control_token
        self._tool = credentials.tool_token
        self._sleep = sleep
        self._staleness_s = staleness_s
        self._clock = clock
        self._hold_timeout_s = hold_timeout_s
        self._unreachable_since: float | None = None  # first transport failure of the current outage
        # Runs before /result is posted (a remote runner uploads its final workspace there).
        self.before_result: Callable[[], None] | None = None

    @classmethod
    def from_env(cls, credentials: Credentials, environ: Mapping[str, str], *, sleep: Sleep = time.sleep) -> Gateway:
        try:
            staleness = float(environ.get(ENV_GATEWAY_STALENESS_SECS) or DEFAULT_GATEWAY_STALENESS_S)
        except ValueError:
            staleness = DEFAULT_GATEWAY_STALENESS_S
        return cls(
            credentials,
            base_url=environ.get(ENV_CONTROL_URL) or DEFAULT_CONTROL_URL,
            socket_path=environ.get(ENV_CONTROL_SOCKET) or None,
            sleep=sleep,
            staleness_s=staleness,
        )

    def close(self) -> None:
        """Nothing to release: every request has its own short connection."""

    # -- public calls ------------------------------------------------------------------------------

    def emit(self, actor: str, type: str, data: dict[str, Any]) -> None:
        """Append an event to the run's ledger. Advisory: failures are logged and ignored.

        Raises:
            AudienceMismatch: the only failure that is not ignored.
        """
        payload = {"actor": actor, "body": {"type": type, "data": data}}
        response = self._send("events", payload, self._control, retries=EMIT_RETRIES, backoff_cap=8.0)
        if response is None or not response.is_success:
            reason = "unreachable" if response is None else f"HTTP {response.status_code}"
            log(f"event {type} not recorded: {reason}")

    def heartbeat(self) -> str | None:
        """Report liveness; returns the server's ``action`` (``"quiesce"`` while cancelling) or None."""
        response = self._send("heartbeat", {}, self._control, retries=HEARTBEAT_RETRIES, backoff_cap=8.0)
        if response is None or not response.is_success:
            log(f"heartbeat failed: {'unreachable' if response is None else f'HTTP {response.status_code}'}")
            return None
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or body.get("action") not in (None, "quiesce"):
            log("heartbeat answer unreadable")
            return None
        action = body.get("action")
        return str(action) if action is not None else None

    def renew_tokens(self) -> bool:
        """Extend the run's four tokens (``/internal/token/renew``, control token); True when renewed."""
        try:
            response = self._http.post("/internal/token/renew", {}, self._control, DEFAULT_TIMEOUT_S)
        except TransportError as exc:
            log(f"token renewal failed: {exc}")
            return False
        if not response.is_success:
            log(f"token renewal refused: HTTP {response.status_code}: {error_text(response)}")
            return False
        return True

    def permission(self, tool_call_id: str, tool: str, input: dict[str, Any]) -> Verdict:
        """Ask the gate whether a tool call may run; blocks while a human decides.

        Transient failures are retried forever with the same ``tool_call_id``: the server dedupes on it,
        so a retry after an API restart re-attaches to the pending approval instead of asking twice.
        Every non-transient failure becomes a deny (fail closed).

        Raises:
            AudienceMismatch: the tool token has the wrong audience.
        """
        payload = {"tool_call_id": tool_call_id, "tool": tool, "input": input}
        attempt = 0
        while True:
            try:
                response = self._post("permission", payload, self._tool, PERMISSION_TIMEOUT_S)
            except TransportError as exc:
                failure = str(exc)
            else:
                status = response.status_code
                if response.is_success:
                    return _decision(response)
                if status in (401, 403):
                    return Verdict(decision="deny", message=INACTIVE_MESSAGE)
                if not is_transient(status):
                    return Verdict(decision="deny", message=error_text(response))
                failure = f"HTTP {status}"
            delay = min(2.0 * (attempt + 1), 10.0)
            log(f"permission {tool_call_id}: {failure}; retrying in {delay:g}s")
            self._sleep(delay)
            attempt += 1

    def tools_call(self, tool_call_id: str, tool: str, input: dict[str, Any], via: str | None = None) -> dict[str, Any]:
        """Have the control plane execute a brokered ``mcp__<slot>__<tool>`` call (gate included).

        Up to 3 transport attempts with the same ``tool_call_id`` when no usable answer arrived; the
        server's execution claim makes the upstream call at-most-once whatever happens here. ``via``
        ("tool_call") labels a call reached through deferred discovery; the gate judges ``tool`` alike.
        """
        payload: dict[str, Any] = {"tool_call_id": tool_call_id, "tool": tool, "input": input}
        if via is not None:
            payload["via"] = via
        return self._tool_post("tools/call", payload)

    def propose_connection(self, tool_call_id: str, connection: dict[str, Any]) -> dict[str, Any]:
        """Propose a new URL-backed connection (dynamic connections); waits while a human decides.

        Returns ``{"ok": true, "connection_id", "status"}``, or ``{"ok": false, ...}`` with the reason.
        """
        return self._tool_post("connections/propose", {"tool_call_id": tool_call_id, "connection": connection})

    def _tool_post(self, leaf: str, payload: dict[str, Any]) -> dict[str, Any]:
        """Three attempts for failures; a post the server holds (an approval or a parked call waiting) is
        re-attached without using one, for up to ``MAX_HOLD_S`` in all."""
        tool_call_id = payload["tool_call_id"]
        started = self._clock()
        attempt = 0
        while attempt < 3:
            try:
                response = self._post(leaf, payload, self._tool, self._hold_timeout_s)
            except TransportError as exc:
                if exc.held and self._clock() - started < MAX_HOLD_S:
                    log(f"{leaf} {tool_call_id}: still held by the control plane; waiting on")
                    continue
                failure = str(exc)
            else:
                if response.is_success:
                    try:
                        body = response.json()
                    except ValueError:
                        body = None
                    if isinstance(body, dict):
                        return body
                    failure = "unreadable answer"
                elif response.status_code in (401, 403) and "wrong_audience" in response.text:
                    raise AudienceMismatch("the tool token was refused with wrong_audience")
                elif not is_transient(response.status_code):
                    return {"ok": False, "error": f"fluidbox broker returned HTTP {response.status_code}: "
                            f"{error_text(response)}"}  # fmt: skip
                else:
                    failure = f"HTTP {response.status_code}"
            log(f"{leaf} {tool_call_id}: {failure}; attempt {attempt + 1} of 3")
            self._sleep((0.5, 1.5, 0.0)[attempt])
            attempt += 1
        return {
            "ok": False,
            "error": "the brokered call's outcome is UNKNOWN (the control plane could not be reached); "
            "do not blindly repeat it",
        }

    def discover(self, leaf: str, payload: dict[str, Any]) -> dict[str, Any]:
        """Deferred discovery (``tools/search`` or ``tools/describe``), answered from the frozen RunSpec.

        Read-only on the server, so transient failures are simply retried. Returns the answer, or
        ``{"error": ...}`` naming why there is none.
        """
        response = self._send(leaf, payload, self._tool, retries=EMIT_RETRIES, backoff_cap=8.0)
        if response is None:
            return {"error": "the control plane could not be reached"}
        if not response.is_success:
            return {"error": error_text(response)}
        try:
            body = response.json()
        except ValueError:
            body = None
        return body if isinstance(body, dict) else {"error": "unreadable answer from the control plane"}

    def result(self, outcome: str, summary: str) -> None:
        """Post the run's outcome (once per run). The summary is cut to 4000 characters.

        Raises:
            GatewayError: not accepted after the retries.
        """
        if len(summary) > SUMMARY_MAX_CHARS:
            summary = summary[: SUMMARY_MAX_CHARS - 1] + "…"
        payload = {"outcome": outcome, "summary": summary}
        if self.before_result is not None:
            self.before_result()
        response = self._send("result", payload, self._control, retries=RESULT_RETRIES, backoff_cap=8.0)
        if response is None:
            raise GatewayError("could not post /result: control plane unreachable")
        if not response.is_success:
            raise GatewayError(f"/result rejected: HTTP {response.status_code}: {error_text(response)}")

    # -- plumbing ----------------------------------------------------------------------------------

    def _post(self, leaf: str, payload: dict[str, Any], token: str, timeout: float) -> Response:
        """One post. A transport failure starts (or continues) an outage; past the staleness window it is fatal.

        Raises:
            GatewayGone: no answer for longer than the staleness window.
            TransportError: no answer, still within the window (callers retry with backoff).
        """
        try:
            response = self._http.post(f"{self._prefix}/{leaf}", payload, token, timeout)
        except TransportError as exc:
            if exc.held:  # the server has the request and is waiting: no outage
                raise
            now = self._clock()
            if self._unreachable_since is None:
                self._unreachable_since = now
            elif now - self._unreachable_since > self._staleness_s:
                gone = now - self._unreachable_since
                raise GatewayGone(
                    f"{GATEWAY_GONE} for {gone:.0f}s, longer than {ENV_GATEWAY_STALENESS_SECS}={self._staleness_s:g}"
                ) from None
            raise
        self._unreachable_since = None
        if response.status_code in (401, 403) and "wrong_audience" in response.text:
            self._report_audience_mismatch(leaf)
            raise AudienceMismatch(f"/{leaf} answered wrong_audience: runner image and server disagree")
        return response

    def _send(
        self, leaf: str, payload: dict[str, Any], token: str, *, retries: int, backoff_cap: float
    ) -> Response | None:
        """Post, retrying transient failures; the last response, or None if none ever arrived."""
        attempt = 0
        while True:
            response: Response | None
            try:
                response = self._post(leaf, payload, token, DEFAULT_TIMEOUT_S)
            except TransportError as exc:
                response, failure = None, str(exc)
            else:
                if not is_transient(response.status_code):
                    return response
                failure = f"HTTP {response.status_code}"
            if attempt >= retries:
                return response
            delay = min(2.0 * (attempt + 1), backoff_cap)
            log(f"/{leaf}: {failure}; retrying in {delay:g}s")
            self._sleep(delay)
            attempt += 1

    def _report_audience_mismatch(self, leaf: str) -> None:
        # Raw post with the control token and a short cap: the diagnostic must never recurse or hang.
        message = (
            f"runner aborted: /{leaf} rejected the token with wrong_audience — "
            "the runner image and the server disagree on token audiences"
        )
        payload = {"actor": "harness", "body": {"type": RUN_ERROR, "data": {"message": message}}}
        log(message)
        with contextlib.suppress(TransportError):
            self._http.post(f"{self._prefix}/events", payload, self._control, DIAGNOSTIC_TIMEOUT_S)


def type_name(exc: BaseException) -> str:
    return type(exc).__name__


def _decision(response: Response) -> Verdict:
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and body.get("decision") in ("allow", "deny"):
        message, updated = body.get("message"), body.get("updated_input")
        if (message is None or isinstance(message, str)) and (updated is None or isinstance(updated, dict)):
            return Verdict(decision=str(body["decision"]), message=message, updated_input=updated)
    # A complete but unreadable 2xx is a server bug, not a dropped connection: fail closed.
    return Verdict(decision="deny", message="unreadable permission answer from the control plane")
