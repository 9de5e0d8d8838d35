"""Pinned MCP calls connect only to the addresses URL admission vetted (integrations.pinning).

The server is a real mcp-SDK app on 127.0.0.1 whose own DNS-rebinding guard accepts only ``Host:
mcp.pinned.test:<port>``. ``mcp.pinned.test`` is in the reserved ``.test`` domain, so the system resolver
cannot find it: a call that reaches the server went to the address the injected admission resolver
answered, and a call that resolves the name itself fails before anything is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ssl
import tempfile
import threading
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path

import httpx2
import pytest
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import ASGIApp, Receive, Scope, Send

from integrations.mcp_client import OFFERED_PROTOCOL, Unreachable, call_tool, photograph
from integrations.mcp_pool import SessionPool
from integrations.pinning import PinnedTransport, PinViolation
from integrations.urls import AdmittedUrl, UrlPolicy
from tests import mcp_servers as servers

pytestmark = pytest.mark.timeout(60)

NAME = "mcp.pinned.test"


class Seen:
    """Every HTTP request that reached the server: ``(method, Host header)`` (written by the server thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: list[tuple[str, str]] = []

    def add(self, method: str, host: str) -> None:
        with self._lock:
            self._requests.append((method, host))

    @property
    def requests(self) -> list[tuple[str, str]]:
        with self._lock:
            return list(self._requests)

    @property
    def hosts(self) -> set[str]:
        return {host for _, host in self.requests}


def named_server(seen: Seen) -> servers.McpTestServer:
    """An ``add(a, b)`` server that answers only requests for ``mcp.pinned.test:<port>`` (HTTP 421 otherwise)."""

    def build(recorder: servers.Recorder) -> ASGIApp:
        mcp = MCPServer("fluidbox-test-pinned", version="0.1")

        @mcp.tool(description="Add two integers.")
        def add(a: int, b: int) -> int:
            recorder.record_execution("add")
            return a + b

        guard = TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=[f"{NAME}:*"])
        app = mcp.streamable_http_app(transport_security=guard)

        async def logged(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), "")
                seen.add(scope["method"], host)
            await app(scope, receive, send)

        return logged

    return servers.McpTestServer("pinned", build)


def resolving(*addresses: str) -> Callable[[str, int], Iterable[str]]:
    """A resolver that knows only ``mcp.pinned.test``."""

    def resolve(host: str, port: int) -> Iterable[str]:
        if host != NAME:
            raise OSError(f"{host} is unknown to this resolver")
        return list(addresses)

    return resolve


async def admit(url: str, *addresses: str) -> AdmittedUrl:
    return await UrlPolicy(allow_loopback=True, resolver=resolving(*addresses)).admit(url)


def text(result: dict[str, object] | None) -> str:
    assert result is not None
    content = result["content"]
    assert isinstance(content, list)
    return str(content[0]["text"])


# --------------------------------------------------------------------------------------------------------------------
# call_tool


async def test_a_pinned_call_reaches_the_admitted_address_under_its_own_name() -> None:
    seen = Seen()
    async with servers.serve(named_server(seen)) as srv:
        url = f"http://{NAME}:{srv.port}/mcp"
        pin = await admit(url, "127.0.0.1")

        out = await call_tool(url, {}, "add", {"a": 2, "b": 3}, expected_protocol=OFFERED_PROTOCOL, pin=pin)

        assert out.outcome == "succeeded", out.error
        assert text(out.result) == "5"
        assert srv.executions == ["add"]
        assert seen.hosts == {f"{NAME}:{srv.port}"}


async def test_the_same_call_without_the_pin_resolves_the_name_and_fails_before_send() -> None:
    seen = Seen()
    async with servers.serve(named_server(seen)) as srv:
        url = f"http://{NAME}:{srv.port}/mcp"

        out = await call_tool(url, {}, "add", {"a": 2, "b": 3}, expected_protocol=OFFERED_PROTOCOL, timeout=5)

        assert out.outcome == "failed_before_send"
        assert seen.requests == []
        assert srv.executions == []


async def test_a_pinned_photograph_lists_the_tools_at_the_admitted_address() -> None:
    seen = Seen()
    async with servers.serve(named_server(seen)) as srv:
        url = f"http://{NAME}:{srv.port}/mcp"
        photo = await photograph(url, {}, timeout=10, pin=await admit(url, "127.0.0.1"))
        assert [t["name"] for t in photo.tools] == ["add"]
        assert seen.hosts == {f"{NAME}:{srv.port}"}
        with pytest.raises(Unreachable):
            await photograph(url, {}, timeout=5)


async def test_an_address_that_refuses_the_connection_falls_through_to_the_next() -> None:
    seen = Seen()
    async with servers.serve(named_server(seen)) as srv:
        url = f"http://{NAME}:{srv.port}/mcp"
        # Nothing listens on 127.0.0.2 (the server is bound to 127.0.0.1 only): on its own it fails before send…
        alone = await call_tool(
            url, {}, "add", {"a": 1, "b": 1}, expected_protocol=None, timeout=5, pin=await admit(url, "127.0.0.2")
        )
        assert alone.outcome == "failed_before_send"
        assert alone.error is not None and "127.0.0.2" in alone.error
        assert seen.requests == []

        # …and listed first, the call moves on to the address that answers.
        pin = await admit(url, "127.0.0.2", "127.0.0.1")
        assert [str(a) for a in pin.addresses] == ["127.0.0.2", "127.0.0.1"]
        out = await call_tool(url, {}, "add", {"a": 20, "b": 22}, expected_protocol=None, timeout=5, pin=pin)
        assert out.outcome == "succeeded", out.error
        assert text(out.result) == "42"
        assert srv.executions == ["add"]
        assert seen.hosts == {f"{NAME}:{srv.port}"}


async def test_no_admitted_address_answering_fails_before_send_naming_every_address() -> None:
    seen = Seen()
    async with servers.serve(named_server(seen)) as srv:
        url = f"http://{NAME}:{srv.port}/mcp"
        pin = await admit(url, "127.0.0.2", "127.0.0.3")
        out = await call_tool(url, {}, "add", {"a": 1, "b": 1}, expected_protocol=None, timeout=5, pin=pin)
        assert out.outcome == "failed_before_send"
        assert out.error is not None and "127.0.0.2" in out.error and "127.0.0.3" in out.error
        assert seen.requests == []


# --------------------------------------------------------------------------------------------------------------------
# SessionPool


async def test_a_pooled_pinned_session_serves_calls_with_the_same_admission(pool: SessionPool) -> None:
    seen = Seen()
    async with servers.serve(named_server(seen)) as srv:
        url = f"http://{NAME}:{srv.port}/mcp"
        for i in range(3):
            # Each call is admitted afresh, as the broker does; the answer order may change between lookups.
            pin = await admit(url, *(("127.0.0.2", "127.0.0.1") if i % 2 else ("127.0.0.1", "127.0.0.2")))
            out = await pool.call_tool(url, {}, "add", {"a": i, "b": 1}, expected_protocol=OFFERED_PROTOCOL, pin=pin)
            assert out.outcome == "succeeded", out.error
            assert text(out.result) == str(i + 1)
        assert pool.opened == 1
        assert srv.executions == ["add"] * 3
        assert seen.hosts == {f"{NAME}:{srv.port}"}


async def test_the_pool_never_lends_a_pinned_session_to_another_admission(pool: SessionPool) -> None:
    seen = Seen()
    async with servers.serve(named_server(seen)) as srv:
        url = f"http://{NAME}:{srv.port}/mcp"
        first = await pool.call_tool(
            url, {}, "add", {"a": 1, "b": 1}, expected_protocol=None, pin=await admit(url, "127.0.0.1")
        )
        assert first.outcome == "succeeded", first.error
        assert pool.idle_count == 1

        # The same URL admitted to other addresses: a fresh session pinned to those, not the idle one.
        moved = await pool.call_tool(
            url, {}, "add", {"a": 2, "b": 2}, expected_protocol=None, timeout=5, pin=await admit(url, "127.0.0.2")
        )
        assert moved.outcome == "failed_before_send"
        assert moved.error is not None and "127.0.0.2" in moved.error

        # Unpinned: the name is resolved at connect time, which the idle pinned session must not stand in for.
        unpinned = await pool.call_tool(url, {}, "add", {"a": 3, "b": 3}, expected_protocol=None, timeout=5)
        assert unpinned.outcome == "failed_before_send"

        assert srv.executions == ["add"]
        assert pool.opened == 3
        assert pool.idle_count == 1  # the pinned session is still there for its own admission
        again = await pool.call_tool(
            url, {}, "add", {"a": 4, "b": 4}, expected_protocol=None, pin=await admit(url, "127.0.0.1")
        )
        assert again.outcome == "succeeded", again.error
        assert pool.opened == 3


# --------------------------------------------------------------------------------------------------------------------
# The transport itself


@pytest.mark.parametrize(
    "target",
    [
        "http://127.0.0.1:{port}/mcp",  # the very address, but not the admitted name: would be resolved freely
        "http://localhost:{port}/mcp",
        "http://{name}:{other}/mcp",  # the admitted name on another port
        "https://{name}:{port}/mcp",  # another scheme
        "http://evil.example:{port}/mcp",
    ],
)
async def test_a_request_for_any_other_origin_is_refused_and_reaches_nothing(target: str) -> None:
    seen = Seen()
    async with servers.serve(named_server(seen)) as srv, servers.serve(named_server(seen)) as other:
        pin = await admit(f"http://{NAME}:{srv.port}/mcp", "127.0.0.1")
        transport = PinnedTransport(pin)
        async with httpx2.AsyncClient(transport=transport, trust_env=False, timeout=5) as http:
            url = target.format(port=srv.port, other=other.port, name=NAME)
            with pytest.raises(PinViolation, match=f"pinned to http://{NAME}:{srv.port}"):
                await http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
            assert seen.requests == []

            # The same client still reaches its own origin (so "nothing arrived" above was not a dead server).
            response = await http.get(f"http://{NAME}:{srv.port}/mcp")
        assert response.status_code != 421  # the server's Host guard let it through
        assert seen.requests == [("GET", f"{NAME}:{srv.port}")]


# --------------------------------------------------------------------------------------------------------------------
# https: the name stays the TLS server name and the certificate's identity


def tls_pair(name: str) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context with a certificate for ``name`` signed by a throwaway CA, and a client trusting only that CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def issue(subject: str, key: ec.EllipticCurvePrivateKey, signer: ec.EllipticCurvePrivateKey, ca: bool) -> bytes:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pinning test CA")]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(subject)]), critical=False)
        return builder.sign(signer, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)

    ca_key, leaf_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_pem = issue("pinning test CA", ca_key, ca_key, ca=True)
    with tempfile.TemporaryDirectory() as tmp:
        cert, key = Path(tmp, "leaf.pem"), Path(tmp, "leaf.key")
        cert.write_bytes(issue(name, leaf_key, ca_key, ca=False))
        key.write_bytes(
            leaf_key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server.load_cert_chain(cert, key)
    client = ssl.create_default_context(cadata=ca_pem.decode())
    return server, client


@contextlib.asynccontextmanager
async def tls_server(context: ssl.SSLContext) -> AsyncIterator[tuple[int, list[str | None], Seen]]:
    """A minimal HTTPS server on 127.0.0.1 answering ``200 ok``; yields its port, the SNI names and the requests."""
    names: list[str | None] = []
    seen = Seen()
    context.sni_callback = lambda _sock, name, _ctx: names.append(name)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            host = next((line.split(":", 1)[1].strip() for line in lines if line.lower().startswith("host:")), "")
            seen.add(lines[0].split(" ", 1)[0], host)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError, ssl.SSLError):
            pass  # the client gave up during the handshake
        finally:
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=context)
    try:
        yield server.sockets[0].getsockname()[1], names, seen
    finally:
        server.close()
        await server.wait_closed()


async def test_https_keeps_the_name_for_sni_and_certificate_checks() -> None:
    server_ctx, client_ctx = tls_pair(NAME)
    async with tls_server(server_ctx) as (port, names, seen):
        pin = await admit(f"https://{NAME}:{port}/mcp", "127.0.0.1")
        async with httpx2.AsyncClient(transport=PinnedTransport(pin, verify=client_ctx), trust_env=False) as http:
            response = await http.get(f"https://{NAME}:{port}/mcp", timeout=5)
    assert (response.status_code, response.text) == (200, "ok")
    assert names == [NAME]
    assert seen.requests == [("GET", f"{NAME}:{port}")]


async def test_https_refuses_a_certificate_for_another_name_at_the_admitted_address() -> None:
    server_ctx, client_ctx = tls_pair("someone-else.test")
    async with tls_server(server_ctx) as (port, names, seen):
        pin = await admit(f"https://{NAME}:{port}/mcp", "127.0.0.1")
        async with httpx2.AsyncClient(transport=PinnedTransport(pin, verify=client_ctx), trust_env=False) as http:
            with pytest.raises(httpx2.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await http.get(f"https://{NAME}:{port}/mcp", timeout=5)
    assert names == [NAME]
    assert seen.requests == []
