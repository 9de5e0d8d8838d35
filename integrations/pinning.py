"""An ``httpx2`` transport that connects only to the addresses URL admission vetted.

:meth:`integrations.urls.UrlPolicy.admit` resolves a host and checks every address it got; a
client that then connects by *name* asks DNS again, and a hostile resolver (TTL 0) can answer
``169.254.169.254`` the second time. :class:`PinnedTransport` closes that window for one admitted
origin: each request's URL host is replaced by one of :attr:`AdmittedUrl.addresses`, while the
``Host`` header stays the original ``host[:port]`` and, for https, the original name is the TLS
server name (httpcore hands the ``sni_hostname`` request extension to ``SSLContext.wrap_bio`` as
``server_hostname``), so the certificate is still verified against the name.

Addresses are tried in admission order, starting from the last one that connected, and the next
one is tried only while the connection itself fails (connect refused or timed out: nothing was
sent). A request for any other scheme, host or port — a redirect, an absolute URL from a server —
is refused with :class:`PinViolation` before anything is resolved or connected.

Errors::

    httpx2.TransportError
    ├── PinViolation           a request left the pinned origin (nothing resolved, nothing sent)
    └── httpx2.ConnectError    no admitted address accepted the connection (nothing sent)

:class:`PinnedClients` keeps one pinned client per connection between calls (its TCP/TLS connections stay
open), and hands it out again only when admission, run again for the new call, vetted exactly the addresses
the client is pinned to: a host whose DNS answer changed gets a fresh client pinned to the new answer, so a
kept client can never carry a request to an address the latest admission did not check. A client idle for
``idle_secs`` is closed, and :meth:`PinnedClients.aclose` closes them all (process shutdown).
"""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from types import TracebackType

import httpx2

from integrations.urls import AdmittedUrl

__all__ = ["PinViolation", "PinnedClients", "PinnedTransport"]

_DEFAULT_PORTS = {"http": 80, "https": 443}


class PinViolation(httpx2.TransportError):
    """A request named an origin other than the pinned one; it was refused before any connection."""


def _same_host(raw_host: bytes, admitted_host: str) -> bool:
    host = raw_host.decode("ascii", "replace").lower()
    try:
        return ipaddress.ip_address(host) == ipaddress.ip_address(admitted_host)
    except ValueError:
        return host == admitted_host


def _origin_text(url: httpx2.URL) -> str:
    # Scheme and authority only: paths and queries may carry tokens and this text reaches logs.
    return f"{url.scheme}://{url.netloc.decode('ascii', 'replace')}"


class PinnedTransport(httpx2.AsyncBaseTransport):
    """Sends requests for ``admitted``'s origin to its vetted addresses; refuses every other origin."""

    def __init__(self, admitted: AdmittedUrl, *, verify: ssl.SSLContext | bool = True) -> None:
        """Pin to ``admitted``.

        Args:
            admitted: the admission result whose origin and addresses this transport serves.
            verify: TLS verification, as for ``httpx2.AsyncHTTPTransport``. The environment
                (proxies, ``SSL_CERT_FILE``) is never consulted: a proxy would resolve the name itself.
        """
        self.admitted = admitted
        self._inner = httpx2.AsyncHTTPTransport(verify=verify, trust_env=False)
        self._preferred = 0  # index of the address that last accepted a connection

    def matches(self, url: httpx2.URL) -> bool:
        """Whether ``url`` has the pinned scheme, host and (effective) port."""
        admitted = self.admitted
        if url.scheme != admitted.scheme:
            return False
        port = url.port if url.port is not None else _DEFAULT_PORTS.get(url.scheme)
        return port == admitted.port and _same_host(url.raw_host, admitted.host)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        admitted = self.admitted
        if not self.matches(request.url):
            raise PinViolation(
                f"refusing a request to {_origin_text(request.url)}: this connection is pinned to "
                f"{admitted.origin} and may only reach the addresses admitted for it",
                request=request,
            )
        headers = request.headers.copy()
        headers["Host"] = request.url.netloc.decode("ascii")
        extensions = dict(request.extensions)
        if admitted.scheme == "https":
            extensions["sni_hostname"] = admitted.host
        count = len(admitted.addresses)
        failures: list[str] = []
        last: httpx2.TransportError | None = None
        for step in range(count):
            index = (self._preferred + step) % count
            address = admitted.addresses[index]
            pinned = httpx2.Request(
                request.method,
                request.url.copy_with(host=str(address)),
                headers=headers,
                stream=request.stream,
                extensions=extensions,
            )
            try:
                response = await self._inner.handle_async_request(pinned)
            except (httpx2.ConnectError, httpx2.ConnectTimeout) as exc:
                # The connection itself failed, so the request never left: the next address may have it.
                failures.append(f"{address}: {str(exc).strip() or type(exc).__name__}")
                last = exc
                continue
            self._preferred = index
            return response
        raise httpx2.ConnectError(
            f"could not connect to {admitted.origin} at any admitted address ({'; '.join(failures)})",
            request=request,
        ) from last

    async def __aenter__(self) -> PinnedTransport:
        await self._inner.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        await self._inner.__aexit__(exc_type, exc_value, traceback)

    async def aclose(self) -> None:
        await self._inner.aclose()


def _pin_of(admitted: AdmittedUrl) -> tuple[str, str, int, frozenset[str]]:
    """What a kept client is pinned to: the origin and the set of vetted addresses."""
    return admitted.scheme, admitted.host, admitted.port, frozenset(str(a) for a in admitted.addresses)


@dataclass(eq=False)
class _Kept:
    pin: tuple[str, str, int, frozenset[str]]
    client: httpx2.AsyncClient
    users: int = 0
    last_used: float = field(default_factory=time.monotonic)
    retired: bool = False  # replaced or expired: closed once its last user is done
    timer: asyncio.TimerHandle | None = None


class PinnedClients:
    """``httpx2`` clients kept between calls, one per key (a connection) and admitted address set."""

    def __init__(self, factory: Callable[[AdmittedUrl], httpx2.AsyncClient], *, idle_secs: float = 2.0) -> None:
        """``factory(admitted)`` builds a client whose transport is a :class:`PinnedTransport` of ``admitted``."""
        self._factory = factory
        self.idle_secs = idle_secs
        self._kept: dict[str, _Kept] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._kept)

    @asynccontextmanager
    async def client(self, key: str, admitted: AdmittedUrl) -> AsyncIterator[httpx2.AsyncClient]:
        """The kept client for ``key`` if it is pinned to exactly ``admitted``'s origin and addresses; otherwise a
        new one, kept in its place (the old one closes once no call uses it)."""
        pin = _pin_of(admitted)
        kept = self._kept.get(key)
        if kept is None or kept.pin != pin:
            if kept is not None:
                self._retire(key, kept)
            kept = _Kept(pin, self._factory(admitted))
            self._kept[key] = kept
        if kept.timer is not None:
            kept.timer.cancel()
            kept.timer = None
        kept.users += 1
        try:
            yield kept.client
        finally:
            kept.users -= 1
            kept.last_used = time.monotonic()
            if kept.users == 0:
                if kept.retired:
                    self._close_soon(kept)
                else:
                    kept.timer = asyncio.get_running_loop().call_later(self.idle_secs, self._expire, key, kept)

    def _expire(self, key: str, kept: _Kept) -> None:
        kept.timer = None
        if kept.users == 0 and self._kept.get(key) is kept:
            self._retire(key, kept)

    def _retire(self, key: str, kept: _Kept) -> None:
        if self._kept.get(key) is kept:
            del self._kept[key]
        kept.retired = True
        if kept.timer is not None:
            kept.timer.cancel()
            kept.timer = None
        if kept.users == 0:
            self._close_soon(kept)

    def _close_soon(self, kept: _Kept) -> None:
        task = asyncio.get_running_loop().create_task(kept.client.aclose())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def aclose(self) -> None:
        """Close every kept client (and wait for those already closing)."""
        for key, kept in list(self._kept.items()):
            self._retire(key, kept)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
