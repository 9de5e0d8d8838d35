"""A real HTTPS device relay for tests: TLS with a certificate from a CA the test creates, in front of a real
MCP server (``tests/mcp_servers.py``).

The relay accepts a request only with ``Authorization: Bearer <credential>``, strips that header and forwards
the request to the upstream MCP server, streaming the answer back (MCP Streamable HTTP answers with SSE).
``relay.authorized`` counts accepted requests, ``relay.refused`` the ones refused with 401.

Usage::

    async with serve(basic()) as upstream, tls_relay(upstream.url, "credential") as relay:
        relay.url      # "https://127.0.0.1:<port>/mcp"
        relay.ca_pem   # the CA certificate that issued the relay's certificate (PEM)
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import socket
import tempfile
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.mcp_servers import _Uvicorn

HOP_HEADERS = frozenset({"host", "authorization", "content-length", "connection", "transfer-encoding"})


def make_ca_and_cert(directory: Path) -> tuple[str, Path, Path]:
    """A fresh CA and a server certificate for 127.0.0.1/localhost signed by it: (CA PEM, cert file, key file)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fluidbox test relay CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.IPv4Address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    cert_file, key_file = directory / "relay.crt", directory / "relay.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return ca.public_bytes(serialization.Encoding.PEM).decode(), cert_file, key_file


@dataclass
class Relay:
    url: str
    ca_pem: str
    authorized: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


def _relay_app(upstream: str, credential: str, relay: Relay) -> Any:
    client = httpx.AsyncClient(timeout=httpx.Timeout(30, read=None))

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await client.aclose()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        if headers.get("authorization") != f"Bearer {credential}":
            relay.refused.append(scope["method"])
            await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"relay credential required"})
            return
        relay.authorized.append(scope["method"])
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        forwarded = {k: v for k, v in headers.items() if k not in HOP_HEADERS}
        request = client.build_request(scope["method"], upstream, headers=forwarded, content=body)
        response = await client.send(request, stream=True)
        try:
            out = [(k.encode(), v.encode()) for k, v in response.headers.items() if k.lower() not in HOP_HEADERS]
            await send({"type": "http.response.start", "status": response.status_code, "headers": out})
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await response.aclose()

    return app


@contextlib.asynccontextmanager
async def tls_relay(upstream: str, credential: str) -> AsyncIterator[Relay]:
    """Serve an HTTPS relay onto ``upstream`` (an MCP endpoint URL) on a free loopback port."""
    with tempfile.TemporaryDirectory(prefix="fbx-relay-") as tmp:
        ca_pem, cert_file, key_file = make_ca_and_cert(Path(tmp))
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        relay = Relay(url=f"https://127.0.0.1:{port}/mcp", ca_pem=ca_pem)
        config = uvicorn.Config(
            _relay_app(upstream, credential, relay),
            log_level="warning",
            lifespan="on",
            ws="none",
            http="h11",
            ssl_certfile=str(cert_file),
            ssl_keyfile=str(key_file),
            timeout_graceful_shutdown=1,
        )
        server = _Uvicorn(config)

        def run() -> None:
            try:
                asyncio.run(server.serve(sockets=[sock]))
            finally:
                server.ready.set()  # never leave the starter waiting

        thread = threading.Thread(target=run, name=f"tls-relay-{port}", daemon=True)
        thread.start()
        if not await asyncio.to_thread(server.ready.wait, 10) or not server.started:
            raise RuntimeError("the TLS relay did not start")
        try:
            yield relay
        finally:
            server.should_exit = True
            await asyncio.to_thread(thread.join, 10)
            sock.close()
