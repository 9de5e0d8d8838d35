"""Outbound URL admission (SSRF policy) for connector and MCP server URLs.

Users hand us URLs (``mcp_http`` ``base_url``, callback URLs) and the control plane then
connects to them while holding credentials, from inside the operator's network. Without a
policy, ``https://169.254.169.254/…`` reads the cloud instance's credentials and
``http://10.0.0.5/admin`` reaches services that trust the VPC. :class:`UrlPolicy` admits a
URL only if it is plain http(s) and every address its host resolves to is publicly routable.

What is refused, and why it is checked the way it is:

- Anything but ``http``/``https``; a missing host; ``user:password@`` (credentials belong in
  the sealed connection credential, never in a URL we echo, log or store); ports outside
  1..65535.
- Hosts that parsers disagree about: non-canonical IPv4 spellings (``2130706433``,
  ``0x7f.1``, ``010.0.0.1``) which libc and WHATWG read as IP addresses, unbracketed IPv6,
  zone ids, percent-encoded or non-ASCII names (use the ``xn--`` form). Refusing them up
  front means the host we vet is the host the HTTP client connects to.
- Any resolved address that is loopback, private (RFC 1918, ``fc00::/7``), link-local,
  a cloud metadata address, CGNAT ``100.64/10``, multicast, unspecified (``0.0.0.0`` reaches
  loopback on Linux) or otherwise reserved/non-global; IPv4 embedded in IPv6 (mapped
  ``::ffff:a.b.c.d``, NAT64 ``64:ff9b::/96``, 6to4 ``2002::/16``) is judged as the IPv4 it
  carries. *Any* bad address refuses the URL, because the client may connect to any of them.
  The tables are explicit rather than ``ipaddress.is_global``, whose answers differ between
  Python patch releases.
- ``allow_loopback`` (local development, tests against servers on 127.0.0.1) admits
  loopback only; private, link-local and metadata addresses stay refused.

Residual risks the caller must own:

- **DNS rebinding.** Admission resolves the name now; an HTTP client that connects by name
  resolves it again, and a hostile DNS server (TTL 0) can answer a public address first and
  ``127.0.0.1`` second. Closing the window needs the client to connect to
  :attr:`AdmittedUrl.addresses` with the original Host/SNI, as result deliveries
  (``activities.delivery.post_pinned``) and brokered MCP calls
  (:class:`integrations.pinning.PinnedTransport`, the ``pin`` argument of ``mcp_client`` and
  ``mcp_pool``) do, or to check the peer address after connecting (:meth:`UrlPolicy.permits`).
  A caller that hands only the URL on is still exposed.
- **Redirects.** Every redirect target is a new URL and must be admitted again (or
  redirects disabled).
- **Proxies.** With ``HTTP(S)_PROXY`` honoured (httpx ``trust_env``), the proxy resolves and
  connects, so this check says nothing about where traffic lands; disable it for these
  clients.

Errors::

    UrlRefused   .category: RefusalCategory (machine-readable), str(): human reason
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import urlsplit

__all__ = [
    "AdmittedUrl",
    "IPAddress",
    "RefusalCategory",
    "Resolver",
    "UrlPolicy",
    "UrlRefused",
    "classify_address",
    "normalize_url",
    "same_origin_path",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# A blocking ``(host, port) -> address strings`` lookup; the default is ``getaddrinfo``.
Resolver = Callable[[str, int], Iterable[str]]

DEFAULT_RESOLVE_TIMEOUT = 5.0
_MAX_URL_LEN = 2048
_MAX_DISPLAY_LEN = 200
_DEFAULT_PORTS = {"http": 80, "https": 443}
_HOST_NAME = re.compile(r"[a-z0-9._-]+")
# WHATWG treats a host whose last label is numeric as IPv4, and so does inet_aton.
_NUMERIC_LABEL = re.compile(r"[0-9]+|0x[0-9a-f]*")


class RefusalCategory(StrEnum):
    """Why a URL was refused; stable strings for machine-readable errors."""

    MALFORMED = "malformed"
    SCHEME = "scheme"
    USERINFO = "userinfo"
    PORT = "port"
    HOST = "host"
    UNRESOLVABLE = "unresolvable"
    LOOPBACK = "loopback"
    PRIVATE = "private"
    LINK_LOCAL = "link_local"
    METADATA = "metadata"
    CGNAT = "cgnat"
    MULTICAST = "multicast"
    UNSPECIFIED = "unspecified"
    RESERVED = "reserved"


class UrlRefused(Exception):
    """A URL failed admission. The message names the host and the reason, never userinfo."""

    def __init__(self, reason: str, category: RefusalCategory = RefusalCategory.MALFORMED) -> None:
        super().__init__(reason)
        self.reason = reason
        self.category = category


_ADDRESS_WORDS = {
    RefusalCategory.LOOPBACK: "a loopback address",
    RefusalCategory.PRIVATE: "a private address",
    RefusalCategory.LINK_LOCAL: "a link-local address",
    RefusalCategory.METADATA: "a cloud metadata address",
    RefusalCategory.CGNAT: "a carrier-grade NAT (shared) address",
    RefusalCategory.MULTICAST: "a multicast address",
    RefusalCategory.UNSPECIFIED: "an unspecified address",
    RefusalCategory.RESERVED: "a reserved or non-public address",
}

_METADATA = frozenset(
    ipaddress.ip_address(text)
    for text in (
        "169.254.169.254",  # AWS, GCP, Azure, OCI, DigitalOcean instance metadata
        "169.254.170.2",  # AWS ECS task credentials
        "100.100.100.200",  # Alibaba Cloud
        "168.63.129.16",  # Azure WireServer: a public-range address only the host answers
        "fd00:ec2::254",  # AWS IMDS over IPv6
    )
)

_C = RefusalCategory
_V4_RULES = tuple(
    (ipaddress.IPv4Network(net), category)
    for net, category in (
        ("0.0.0.0/8", _C.UNSPECIFIED),
        ("127.0.0.0/8", _C.LOOPBACK),
        ("10.0.0.0/8", _C.PRIVATE),
        ("172.16.0.0/12", _C.PRIVATE),
        ("192.168.0.0/16", _C.PRIVATE),
        ("169.254.0.0/16", _C.LINK_LOCAL),
        ("100.64.0.0/10", _C.CGNAT),
        ("224.0.0.0/4", _C.MULTICAST),
        ("240.0.0.0/4", _C.RESERVED),
        ("192.0.0.0/24", _C.RESERVED),
        ("192.0.2.0/24", _C.RESERVED),
        ("198.18.0.0/15", _C.RESERVED),
        ("198.51.100.0/24", _C.RESERVED),
        ("203.0.113.0/24", _C.RESERVED),
    )
)
_V6_RULES = tuple(
    (ipaddress.IPv6Network(net), category)
    for net, category in (
        ("::/128", _C.UNSPECIFIED),
        ("::1/128", _C.LOOPBACK),
        ("fc00::/7", _C.PRIVATE),
        ("fec0::/10", _C.PRIVATE),  # deprecated site-local, still routed inside some networks
        ("64:ff9b:1::/48", _C.PRIVATE),  # local-use NAT64
        ("fe80::/10", _C.LINK_LOCAL),
        ("ff00::/8", _C.MULTICAST),
        ("2001::/32", _C.RESERVED),  # Teredo: the embedded client address is unknowable here
        ("2001:db8::/32", _C.RESERVED),
    )
)
_V6_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_SIX_TO_FOUR = ipaddress.IPv6Network("2002::/16")


def _embedded_v4(ip: ipaddress.IPv6Address) -> tuple[str, ipaddress.IPv4Address] | None:
    if ip.ipv4_mapped is not None:
        return "IPv4-mapped", ip.ipv4_mapped
    if ip in _NAT64:
        return "NAT64 of", ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.sixtofour is not None:
        return "6to4 of", ip.sixtofour
    return None


def _as_ip(address: str | IPAddress) -> IPAddress:
    if isinstance(address, str):
        address = ipaddress.ip_address(address.partition("%")[0])
    elif isinstance(address, ipaddress.IPv6Address) and address.scope_id:
        address = ipaddress.IPv6Address(int(address))
    return address


def classify_address(address: str | IPAddress) -> RefusalCategory | None:
    """The refusal category of one address, or ``None`` when it is publicly routable.

    Loopback is reported as :attr:`RefusalCategory.LOOPBACK`; whether that is acceptable is
    the policy's call (:meth:`UrlPolicy.permits`). Raises ``ValueError`` for a non-address.
    """
    ip = _as_ip(address)
    if ip in _METADATA:
        return RefusalCategory.METADATA
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = _embedded_v4(ip)
        if embedded is not None:
            return classify_address(embedded[1])
        for net6, category in _V6_RULES:
            if ip in net6:
                return category
        if ip not in _V6_GLOBAL_UNICAST or not ip.is_global:
            return RefusalCategory.RESERVED
        return None
    for net4, category in _V4_RULES:
        if ip in net4:
            return category
    return None if ip.is_global else RefusalCategory.RESERVED


@dataclass(frozen=True, slots=True)
class _Parts:
    scheme: str
    host: str  # lowercased; IPv6 without brackets, in compressed form
    ip: IPAddress | None
    port: int
    path: str
    query: str

    @property
    def origin(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        netloc = host if self.port == _DEFAULT_PORTS[self.scheme] else f"{host}:{self.port}"
        return f"{self.scheme}://{netloc}"

    @property
    def url(self) -> str:
        query = f"?{self.query}" if self.query else ""
        return f"{self.origin}{self.path}{query}"

    @property
    def display(self) -> str:
        # The query often carries tokens; messages get logged, so leave it out.
        return _clip(f"{self.origin}{self.path}")


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_DISPLAY_LEN else text[: _MAX_DISPLAY_LEN - 1] + "…"


def _refuse(display: str, detail: str, category: RefusalCategory) -> UrlRefused:
    return UrlRefused(f"refusing {display}: {detail}", category)


def _parse(url: str) -> _Parts:
    if not isinstance(url, str) or not url:
        raise UrlRefused("refusing an empty URL", RefusalCategory.MALFORMED)
    if len(url) > _MAX_URL_LEN:
        raise UrlRefused(f"refusing a URL longer than {_MAX_URL_LEN} characters", RefusalCategory.MALFORMED)
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in url):
        raise UrlRefused("refusing a URL that contains whitespace or control characters", RefusalCategory.MALFORMED)
    try:
        split = urlsplit(url)
    except ValueError as exc:
        raise UrlRefused(f"refusing a malformed URL: {exc}", RefusalCategory.MALFORMED) from None
    scheme = split.scheme.lower()
    netloc = split.netloc
    # Until the authority is parsed, show what we have minus anything before '@'.
    display = _clip(f"{scheme}://{netloc.rpartition('@')[2]}{split.path}")
    if scheme not in _DEFAULT_PORTS:
        if not scheme:
            raise UrlRefused(
                f"refusing {_clip(url)!r}: the URL needs an http:// or https:// scheme", RefusalCategory.SCHEME
            )
        raise _refuse(display, f"scheme {scheme!r} is not allowed (use http or https)", RefusalCategory.SCHEME)
    if not netloc:
        raise _refuse(display, "the URL has no host", RefusalCategory.MALFORMED)
    if "@" in netloc:
        raise _refuse(
            display,
            "credentials in the URL (user:password@) are not allowed; supply them as the connection's credential",
            RefusalCategory.USERINFO,
        )
    host, ip, port_text = _split_authority(netloc, display)
    port = _parse_port(port_text, scheme, display)
    return _Parts(scheme=scheme, host=host, ip=ip, port=port, path=split.path or "/", query=split.query)


def _split_authority(netloc: str, display: str) -> tuple[str, IPAddress | None, str]:
    if netloc.startswith("["):
        inner, bracket, rest = netloc[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise _refuse(display, "the bracketed IPv6 host is malformed", RefusalCategory.MALFORMED)
        if "%" in inner:
            raise _refuse(display, "IPv6 zone identifiers are not allowed", RefusalCategory.HOST)
        try:
            ip6 = ipaddress.IPv6Address(inner)
        except ValueError:
            raise _refuse(display, f"[{inner}] is not a valid IPv6 address", RefusalCategory.MALFORMED) from None
        return str(ip6), ip6, rest[1:]
    if netloc.count(":") > 1:
        raise _refuse(display, "IPv6 addresses must be written in brackets", RefusalCategory.MALFORMED)
    raw_host, _, port_text = netloc.partition(":")
    host = raw_host.lower()
    if not host:
        raise _refuse(display, "the URL has no host", RefusalCategory.MALFORMED)
    if not host.isascii():
        raise _refuse(
            display, "non-ASCII host names must be written in their punycode (xn--) form", RefusalCategory.HOST
        )
    labels = (host[:-1] if host.endswith(".") else host).split(".")
    if not _HOST_NAME.fullmatch(host) or len(host) > 253 or any(not label or len(label) > 63 for label in labels):
        raise _refuse(display, f"{_clip(raw_host)!r} is not a valid host name", RefusalCategory.HOST)
    try:
        ip4 = ipaddress.IPv4Address(host)
    except ValueError:
        if _NUMERIC_LABEL.fullmatch(labels[-1]):
            raise _refuse(display, _non_canonical(host), RefusalCategory.HOST) from None
        return host, None, port_text
    return str(ip4), ip4, port_text


def _non_canonical(host: str) -> str:
    try:
        meaning = f" (it would be read as {ipaddress.IPv4Address(socket.inet_aton(host))})"
    except (OSError, ValueError):
        meaning = ""
    return f"{host} is not a canonical dotted-quad IPv4 address{meaning}; write it as four decimal octets"


def _parse_port(port_text: str, scheme: str, display: str) -> int:
    if not port_text:
        return _DEFAULT_PORTS[scheme]
    if not (port_text.isascii() and port_text.isdigit()) or len(port_text) > 5:
        raise _refuse(display, f"port {_clip(port_text)!r} is not a number", RefusalCategory.PORT)
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise _refuse(display, f"port {port} is outside 1..65535", RefusalCategory.PORT)
    return port


def normalize_url(url: str) -> str:
    """Syntax-check ``url`` (no resolution) and return its normalized form.

    Lowercased scheme and host, canonical IP literals, default port dropped, empty path
    as ``/``, fragment dropped. Raises :class:`UrlRefused` for anything :meth:`UrlPolicy.admit`
    would refuse before resolving.
    """
    return _parse(url).url


def same_origin_path(a: str | AdmittedUrl, b: str | AdmittedUrl) -> bool:
    """Whether two URLs name the same scheme, host, port and path, ignoring trailing slashes.

    Query and fragment are ignored. A URL that does not parse compares unequal to everything.
    """
    try:
        left = _parse(a if isinstance(a, str) else a.url)
        right = _parse(b if isinstance(b, str) else b.url)
    except UrlRefused:
        return False
    return left.origin == right.origin and left.path.rstrip("/") == right.path.rstrip("/")


@dataclass(frozen=True, slots=True)
class AdmittedUrl:
    """A URL that passed admission, with the addresses it resolved to at that moment."""

    url: str
    """Normalized URL (see :func:`normalize_url`); use this, not the caller's spelling."""
    scheme: str
    host: str
    """Lowercased host name or canonical IP literal (IPv6 without brackets)."""
    port: int
    """Effective port, the scheme default when the URL had none."""
    path: str
    addresses: tuple[IPAddress, ...]
    """Every address the host resolved to (the literal itself for IP hosts)."""

    @property
    def origin(self) -> str:
        """``scheme://host[:port]`` with the default port omitted."""
        return _parse(self.url).origin

    @staticmethod
    def same_origin_path(a: str | AdmittedUrl, b: str | AdmittedUrl) -> bool:
        """Alias of the module-level :func:`same_origin_path`."""
        return same_origin_path(a, b)

    def __str__(self) -> str:
        return self.url


def _system_resolve(host: str, port: int) -> list[str]:
    return _sockaddr_hosts(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))


def _sockaddr_hosts(infos: Iterable[tuple[object, ...]]) -> list[str]:
    hosts: list[str] = []
    for info in infos:
        family, sockaddr = info[0], info[4]
        if family in (socket.AF_INET, socket.AF_INET6) and isinstance(sockaddr, tuple):
            hosts.append(str(sockaddr[0]))
    return hosts


def _call_bounded(fn: Callable[[], list[str]], timeout: float) -> list[str]:
    # getaddrinfo has no timeout of its own. A daemon thread lets us stop waiting without
    # keeping the interpreter alive for a lookup nobody wants any more.
    future: Future[list[str]] = Future()

    def run() -> None:
        try:
            future.set_result(fn())
        except BaseException as exc:
            future.set_exception(exc)

    threading.Thread(target=run, name="fluidbox-url-resolve", daemon=True).start()
    return future.result(timeout)


class UrlPolicy:
    """Admits outbound http(s) URLs whose host resolves only to public addresses."""

    def __init__(
        self,
        allow_loopback: bool = False,
        *,
        resolve_timeout: float = DEFAULT_RESOLVE_TIMEOUT,
        resolver: Resolver | None = None,
    ) -> None:
        """Configure the policy.

        Args:
            allow_loopback: also admit loopback addresses (127/8, ::1); never anything else.
            resolve_timeout: seconds a name lookup may take before the URL is refused.
            resolver: blocking ``(host, port) -> address strings``; defaults to getaddrinfo
                (``loop.getaddrinfo`` in :meth:`admit`). Injected by tests.
        """
        self._allow_loopback = allow_loopback
        self._timeout = resolve_timeout
        self._resolver = resolver

    @property
    def allow_loopback(self) -> bool:
        return self._allow_loopback

    def permits(self, address: str | IPAddress) -> bool:
        """Whether a single address is acceptable, e.g. a connected socket's peer address."""
        try:
            category = classify_address(address)
        except ValueError:
            return False
        return category is None or (category is RefusalCategory.LOOPBACK and self._allow_loopback)

    async def admit(self, url: str) -> AdmittedUrl:
        """Parse, resolve (bounded by the timeout) and vet ``url``.

        Raises:
            UrlRefused: the URL is malformed, not http(s), carries userinfo, does not resolve,
                or any resolved address is not permitted.
        """
        parts = _parse(url)
        if parts.ip is not None:
            return self._judge(parts, (parts.ip,), resolved=False)
        try:
            async with asyncio.timeout(self._timeout):
                if self._resolver is None:
                    loop = asyncio.get_running_loop()
                    infos = await loop.getaddrinfo(parts.host, parts.port, type=socket.SOCK_STREAM)
                    hosts = _sockaddr_hosts(infos)
                else:
                    hosts = await asyncio.to_thread(self._resolve_with, self._resolver, parts)
        except TimeoutError:
            raise self._timed_out(parts) from None
        except (OSError, UnicodeError, ValueError):
            raise self._unresolvable(parts) from None
        return self._judge(parts, self._addresses(parts, hosts), resolved=True)

    def admit_sync(self, url: str) -> AdmittedUrl:
        """Blocking twin of :meth:`admit`, for code that has no event loop."""
        parts = _parse(url)
        if parts.ip is not None:
            return self._judge(parts, (parts.ip,), resolved=False)
        resolver = self._resolver or _system_resolve
        try:
            hosts = _call_bounded(lambda: self._resolve_with(resolver, parts), self._timeout)
        except TimeoutError:
            raise self._timed_out(parts) from None
        except (OSError, UnicodeError, ValueError):
            raise self._unresolvable(parts) from None
        return self._judge(parts, self._addresses(parts, hosts), resolved=True)

    @staticmethod
    def _resolve_with(resolver: Resolver, parts: _Parts) -> list[str]:
        return list(resolver(parts.host, parts.port))

    def _timed_out(self, parts: _Parts) -> UrlRefused:
        return _refuse(
            parts.display,
            f"resolving {parts.host} timed out after {self._timeout:g} s",
            RefusalCategory.UNRESOLVABLE,
        )

    @staticmethod
    def _unresolvable(parts: _Parts) -> UrlRefused:
        return _refuse(parts.display, f"{parts.host} does not resolve", RefusalCategory.UNRESOLVABLE)

    @staticmethod
    def _addresses(parts: _Parts, hosts: Iterable[str]) -> tuple[IPAddress, ...]:
        addresses: list[IPAddress] = []
        for text in hosts:
            try:
                ip = _as_ip(text)
            except ValueError:
                # An answer we cannot read is an answer we cannot vet.
                raise _refuse(
                    parts.display, f"{parts.host} resolved to an unreadable address", RefusalCategory.UNRESOLVABLE
                ) from None
            if ip not in addresses:
                addresses.append(ip)
        if not addresses:
            raise UrlPolicy._unresolvable(parts)
        return tuple(addresses)

    def _judge(self, parts: _Parts, addresses: tuple[IPAddress, ...], *, resolved: bool) -> AdmittedUrl:
        for ip in addresses:
            category = classify_address(ip)
            if category is None or (category is RefusalCategory.LOOPBACK and self._allow_loopback):
                continue
            words = _ADDRESS_WORDS[category]
            embedded = _embedded_v4(ip) if isinstance(ip, ipaddress.IPv6Address) else None
            note = f" ({embedded[0]} {embedded[1]})" if embedded else ""
            detail = f"{parts.host} resolves to {ip}, {words}{note}" if resolved else f"{ip} is {words}{note}"
            raise _refuse(parts.display, detail, category)
        return AdmittedUrl(
            url=parts.url,
            scheme=parts.scheme,
            host=parts.host,
            port=parts.port,
            path=parts.path,
            addresses=addresses,
        )
