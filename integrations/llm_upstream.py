"""The LLM facade's upstream: one pooled aiohttp session per process, the real key swapped in.

aiohttp rather than httpx: its C parser halves the time to the upstream's headers, measured in
bench/facade.py's terms (docs/decisions.md). The session follows no redirect (one would carry the
real key and the body to wherever the upstream points, and a 303 would turn a served request into a
second one), keeps no cookie and reads no proxy from the environment. A request fails as either
:class:`Unreachable` (nothing was sent) or :class:`NoAnswer` (sent, and it may have been served).
An error answer is read whole and handed back with the key scrubbed out of it.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator, Mapping

import aiohttp
from yarl import URL

from core.redaction import MARK
from core.usage import Dialect

CONNECT_TIMEOUT_SECS = 10.0
POOL_WAIT_SECS = 30.0
ANTHROPIC_VERSION = "2023-06-01"
PASS_HEADERS = ("content-type", "request-id", "x-request-id", "retry-after")
# What reading an answer's body may raise: the stream broke or stalled past the read timeout.
READ_ERRORS = (TimeoutError, aiohttp.ClientError)
UpstreamResponse = aiohttp.ClientResponse


class Unreachable(Exception):
    """Nothing was sent: the connection to the upstream could not be made (the exception's class name)."""


class NoAnswer(Exception):
    """Sent, but no answer came (the exception's class name): the upstream may have served it."""


class LlmUpstream:
    """The per-process client: :meth:`post` a request, read the answer, :meth:`close` at shutdown."""

    def __init__(self, *, timeout_secs: float, keepalive_secs: float) -> None:
        self.timeout_secs = timeout_secs
        self.keepalive_secs = keepalive_secs
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            timeout = aiohttp.ClientTimeout(
                total=None,
                connect=POOL_WAIT_SECS,  # a free pooled connection, then the connection itself
                sock_connect=CONNECT_TIMEOUT_SECS,
                sock_read=self.timeout_secs,
            )
            # Idle connections are dropped before common upstream idle timeouts (uvicorn-served proxies such as
            # LiteLLM close at 5 s): a POST on a connection the server just closed fails without any way to
            # tell whether it was served, and would cost a whole reservation.
            connector = aiohttp.TCPConnector(limit=512, limit_per_host=0, keepalive_timeout=self.keepalive_secs)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=timeout,
                auto_decompress=False,
                trust_env=False,
                cookie_jar=aiohttp.DummyCookieJar(),  # nothing an upstream sets reaches another run's call
                skip_auto_headers=("User-Agent",),
            )
        return self._session

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> UpstreamResponse:
        """Send one request and wait for the answer's headers (never following a redirect: a 3xx is an
        answer like any other)."""
        try:
            async with asyncio.timeout(self.timeout_secs):
                return await self.session().post(
                    URL(url, encoded=True), data=body, headers=headers, allow_redirects=False
                )
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            raise Unreachable(type(exc).__name__) from exc
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise NoAnswer(type(exc).__name__) from exc

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def request_headers(dialect: Dialect, key: str, client_headers: Mapping[str, str]) -> dict[str, str]:
    """The upstream's headers: the real key in the dialect's place and the few client headers that
    shape the answer (``client_headers`` is the client's request headers, lower-case names)."""
    headers = {"content-type": "application/json", "accept-encoding": "identity"}
    headers["accept"] = client_headers.get("accept", "application/json")
    if dialect is Dialect.ANTHROPIC:
        headers["x-api-key"] = key
        headers["anthropic-version"] = client_headers.get("anthropic-version", ANTHROPIC_VERSION)
        if beta := client_headers.get("anthropic-beta"):
            headers["anthropic-beta"] = beta
    else:
        headers["authorization"] = f"Bearer {key}"
    return headers


def request_url(base: str, path: str, query: str) -> str:
    return f"{base.rstrip('/')}/{path}" + (f"?{query}" if query else "")


def passed_headers(upstream: UpstreamResponse) -> dict[str, str]:
    """The answer's headers the client sees, whatever the status."""
    return {k: v for k in PASS_HEADERS if (v := upstream.headers.get(k)) is not None}


def relay_headers(upstream: UpstreamResponse, passed: dict[str, str]) -> tuple[list[tuple[bytes, bytes]], bool]:
    """The raw ASGI headers of a 2xx answer relayed as it streams in, and whether it is an SSE stream."""
    streaming = upstream.headers.get("content-type", "").startswith("text/event-stream")
    if streaming:
        passed.update({"cache-control": "no-cache", "x-accel-buffering": "no"})
    elif "content-length" in upstream.headers:
        passed["content-length"] = upstream.headers["content-length"]
    if upstream.headers.get("content-encoding", "identity").lower() != "identity":
        # Relayed as sent (the client can decode it); the meter cannot read it, so the reservation is held.
        passed["content-encoding"] = upstream.headers["content-encoding"]
    return [(k.encode("latin-1", "replace"), v.encode("latin-1", "replace")) for k, v in passed.items()], streaming


def chunks(upstream: UpstreamResponse) -> AsyncIterator[bytes]:
    """The answer's body as it arrives; raises one of :data:`READ_ERRORS` if the stream breaks."""
    return upstream.content.iter_any()


async def error_content(upstream: UpstreamResponse, key: str) -> bytes | None:
    """A non-2xx answer's body, read whole (the connection goes back to the pool), with the key scrubbed
    out; ``None`` when it came compressed and does not decompress."""
    try:
        content = await upstream.read()
    except READ_ERRORS:
        content = b""
    finally:
        upstream.release()
    if upstream.headers.get("content-encoding", "identity").lower() != "identity":
        # The upstream ignored accept-encoding: identity. The key scrub must see the plain bytes.
        try:
            content = zlib.decompressobj(wbits=47).decompress(content)  # gzip or zlib
        except zlib.error:
            return None
    return content.replace(key.encode(), MARK.encode())
