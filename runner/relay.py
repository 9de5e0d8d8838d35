"""A loopback TCP relay onto the control plane's Unix socket, for clients that only speak ``http://host:port``.

Inside the sandbox there is no network: the control plane is reached through a Unix socket bound into it.
The Claude Code CLI needs an HTTP base URL, so the runner listens on ``127.0.0.1`` (an ephemeral port, in
the sandbox's own empty network namespace) and pipes every accepted connection onto a fresh connection to
the socket. Responses are copied byte for byte as they arrive (no buffering beyond one read, so a streamed
answer gains no latency).

With ``api_key`` set, the relay also holds the credential: in each HTTP/1.1 request it forwards, the
request line and headers are rewritten with every ``x-api-key``/``authorization`` header replaced by
``x-api-key: <api_key>``, and the body (``content-length`` or chunked) is then copied through unchanged.
The client (the CLI) is configured with a placeholder key, so neither it nor any shell it starts ever holds
the token in its environment.

It runs its own event loop on a daemon thread, so nothing the harness does on its loop (or a blocking
call there) can stall model traffic. ``stop()`` closes the listener and every open connection.

Usage::

    with Relay("/run/fluidbox/api.sock") as relay:
        base_url = relay.url          # "http://127.0.0.1:<port>"
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import threading
from types import TracebackType
from urllib.parse import urlsplit

CHUNK = 64 * 1024
_START_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 5.0


class RelayError(RuntimeError):
    """The relay could not start listening."""


class Relay:
    """Pipes ``127.0.0.1:<port>`` onto the Unix socket at ``socket_path``, or onto ``http(s)://host:port``
    when ``socket_path`` is such a URL (a Pod reaches the control plane over the network, not a socket)."""

    def __init__(
        self, socket_path: str, host: str = "127.0.0.1", *, api_key: str | None = None, path_prefix: str | None = None
    ) -> None:
        self._socket_path = socket_path
        self._api_key = api_key.encode("ascii") if api_key else None
        # With a key, only requests under this path are forwarded: the token the relay adds is for them.
        self._prefix = path_prefix.encode("ascii") if path_prefix else None
        self._host = host
        self._port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="fluidbox-relay", daemon=True)
        self.connections = 0

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        target = self._socket_path
        if target.startswith(("http://", "https://")):
            parts = urlsplit(target)
            tls = parts.scheme == "https"
            port = parts.port or (443 if tls else 80)
            return await asyncio.open_connection(
                parts.hostname, port, ssl=ssl.create_default_context() if tls else None
            )
        return await asyncio.open_unix_connection(target)

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self._port}"

    def start(self) -> Relay:
        """Start listening; returns once the port is bound.

        Raises:
            RelayError: the listener could not be opened.
        """
        self._thread.start()
        if not self._ready.wait(_START_TIMEOUT_S):
            raise RelayError("the relay did not start in time")
        if self._error is not None:
            raise RelayError(f"the relay could not listen on {self._host}: {self._error}") from self._error
        return self

    def stop(self) -> None:
        """Close the listener and every open connection; waits (bounded) for the thread to end."""
        loop = self._loop
        if loop is None or not self._thread.is_alive():
            return
        with contextlib.suppress(RuntimeError):  # the loop may already be closing
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(_STOP_TIMEOUT_S)
        self._thread.join(_STOP_TIMEOUT_S)

    def __enter__(self) -> Relay:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- the loop thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._listen())
        except BaseException as exc:  # reported to start(); the thread ends
            self._error = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._accept, self._host, 0)
        self._port = int(self._server.sockets[0].getsockname()[1])

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
        asyncio.get_running_loop().call_soon(asyncio.get_running_loop().stop)

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        upstream_w: asyncio.StreamWriter | None = None
        try:
            try:
                upstream_r, upstream_w = await self._connect()
            except OSError as exc:
                await _refuse(client_r, client_w, f"fluidbox relay: the control plane is unreachable ({exc.strerror})")
                return
            forward = (
                _pipe(client_r, upstream_w)
                if self._api_key is None
                else _requests(client_r, upstream_w, self._api_key, self._prefix)
            )
            await asyncio.gather(forward, _pipe(upstream_r, client_w))
        except asyncio.CancelledError:
            pass
        finally:
            for writer in (client_w, upstream_w):
                if writer is not None:
                    writer.close()
            self._tasks.discard(task)


async def _refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, message: str) -> None:
    """Answer 502 in the Anthropic error shape, then wait (bounded) for the client to hang up, so the
    unread request does not turn the close into a reset."""
    body = json.dumps({"type": "error", "error": {"type": "api_error", "message": message}}).encode()
    head = (
        "HTTP/1.1 502 Bad Gateway\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    with contextlib.suppress(ConnectionError, OSError, asyncio.TimeoutError):
        writer.write(head.encode() + body)
        await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
        async with asyncio.timeout(_STOP_TIMEOUT_S):
            while await reader.read(CHUNK):
                pass


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until EOF, then half-close the far side so the peer sees the end of the request/response."""
    try:
        while chunk := await reader.read(CHUNK):
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.close()


class BadRequest(Exception):
    """The client sent something that is not an HTTP/1.1 request the relay can frame."""


_DROPPED_HEADERS = (b"x-api-key", b"authorization")


async def _requests(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, api_key: bytes, prefix: bytes | None = None
) -> None:
    """Forward HTTP/1.1 requests one after another, each with its credential headers replaced."""
    try:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as exc:
                if exc.partial.strip():
                    raise BadRequest("connection closed inside a request head") from None
                break
            head_out, length, chunked = rewrite_head(head, api_key, prefix)
            writer.write(head_out)
            if chunked:
                await _copy_chunked(reader, writer)
            else:
                await _copy_exact(reader, writer, length)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (BadRequest, asyncio.LimitOverrunError, asyncio.IncompleteReadError, ValueError, ConnectionError, OSError):
        writer.close()


def rewrite_head(head: bytes, api_key: bytes, prefix: bytes | None = None) -> tuple[bytes, int, bool]:
    """The request head with its credential headers replaced; returns (head, content length, chunked).

    Raises:
        BadRequest: a malformed header line or content length, or a target outside ``prefix``.
    """
    lines = head[:-4].split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3:
        raise BadRequest("malformed request line")
    if prefix is not None and not (parts[1] == prefix or parts[1].startswith(prefix + b"/")):
        raise BadRequest("the relay forwards the LLM facade only")
    out = [lines[0]]
    length, chunked = 0, False
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise BadRequest("malformed header line")
        key = name.strip().lower()
        if key in _DROPPED_HEADERS:
            continue
        if key == b"content-length":
            try:
                length = int(value.strip())
            except ValueError:
                raise BadRequest("invalid content-length") from None
            if length < 0:
                raise BadRequest("invalid content-length")
        elif key == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
        out.append(line)
    out.append(b"x-api-key: " + api_key)
    return b"\r\n".join(out) + b"\r\n\r\n", length, chunked


async def _copy_exact(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, length: int) -> None:
    while length > 0:
        chunk = await reader.read(min(CHUNK, length))
        if not chunk:
            raise BadRequest("connection closed inside a request body")
        writer.write(chunk)
        length -= len(chunk)
        await writer.drain()


async def _copy_chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        size_line = await reader.readuntil(b"\r\n")
        writer.write(size_line)
        size = int(size_line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            while (trailer := await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers, then the blank line
                writer.write(trailer)
            writer.write(trailer)
            return
        await _copy_exact(reader, writer, size + 2)  # the chunk and its CRLF
