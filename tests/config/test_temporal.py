"""Temporal connection settings: TLS (a private CA, mTLS, a server name), API keys, and mistakes caught at startup.

The Temporal dev server speaks plaintext only (``temporal server start-dev`` has no TLS flags), so the real TLS
test puts a TLS-terminating proxy that demands a client certificate in front of a real dev server and connects
through it with the settings; the certificates are made by the test with ``cryptography``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from pydantic import SecretStr
from temporalio.api.workflowservice.v1 import ListNamespacesRequest
from temporalio.service import TLSConfig
from temporalio.testing import WorkflowEnvironment

from config.settings import Settings
from config.temporal import TemporalSettingsError, check_temporal_settings, connect_client, tls_config

ROOT = Path(__file__).resolve().parents[2]
TEMPORAL = Path(sys.executable).parent / "temporal"
SERVER_NAME = "temporal.fluidbox.test"


@dataclass
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Certificate | None,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    usage: x509.ObjectIdentifier | None = None,
    dns: str | None = None,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer.subject if issuer is not None else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )  # fmt: skip
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if dns is not None:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(dns)]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca_key = _key()
    ca = _cert("fluidbox test CA", ca_key, None, ca_key, ca=True)
    server_key, client_key = _key(), _key()
    server = _cert("temporal", server_key, ca, ca_key, usage=ExtendedKeyUsageOID.SERVER_AUTH, dns=SERVER_NAME)
    client = _cert("fluidbox worker", client_key, ca, ca_key, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    files = {
        "ca.pem": ca.public_bytes(serialization.Encoding.PEM),
        "server.pem": server.public_bytes(serialization.Encoding.PEM),
        "server.key": _pem_key(server_key),
        "client.pem": client.public_bytes(serialization.Encoding.PEM),
        "client.key": _pem_key(client_key),
    }
    for name, data in files.items():
        (d / name).write_bytes(data)
    return Pki(d / "ca.pem", d / "server.pem", d / "server.key", d / "client.pem", d / "client.key")


# ---- settings → Client.connect(tls=...) ------------------------------------------------------------------


def test_no_tls_setting_connects_in_plaintext() -> None:
    assert tls_config(Settings()) is False


def test_tls_alone_or_an_api_key_use_the_system_roots() -> None:
    assert tls_config(Settings(temporal_tls=True)) is True
    assert tls_config(Settings(temporal_api_key=SecretStr("cloud-key"))) is True


def test_certificate_files_and_server_name_become_the_tls_config(pki: Pki) -> None:
    got = tls_config(
        Settings(
            temporal_tls_ca=pki.ca,
            temporal_tls_cert=pki.client_cert,
            temporal_tls_key=pki.client_key,
            temporal_tls_server_name=SERVER_NAME,
        )
    )
    assert got == TLSConfig(
        server_root_ca_cert=pki.ca.read_bytes(),
        domain=SERVER_NAME,
        client_cert=pki.client_cert.read_bytes(),
        client_private_key=pki.client_key.read_bytes(),
    )
    assert tls_config(Settings(temporal_tls_server_name=SERVER_NAME)) == TLSConfig(domain=SERVER_NAME)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"temporal_tls_cert": "/none/c.pem", "temporal_tls_key": "K"}, "FLUIDBOX_TEMPORAL_TLS_CERT: the file /none/c.pem does not exist"),  # noqa: E501
        ({"temporal_tls_ca": "/none/ca.pem"}, "FLUIDBOX_TEMPORAL_TLS_CA: the file /none/ca.pem does not exist"),
        ({"temporal_tls_cert": "C"}, "FLUIDBOX_TEMPORAL_TLS_CERT is set but FLUIDBOX_TEMPORAL_TLS_KEY is not"),
        ({"temporal_tls_key": "K"}, "FLUIDBOX_TEMPORAL_TLS_KEY is set but FLUIDBOX_TEMPORAL_TLS_CERT is not"),
        ({"temporal_tls_ca": "NOTPEM"}, "FLUIDBOX_TEMPORAL_TLS_CA: "),
        ({"temporal_api_key": " "}, "FLUIDBOX_TEMPORAL_API_KEY is set but empty"),
    ],
    ids=["missing-cert", "missing-ca", "cert-without-key", "key-without-cert", "not-pem", "empty-api-key"],
)  # fmt: skip
def test_a_setting_mistake_names_the_setting(pki: Pki, fields: dict[str, str], message: str) -> None:
    real = {"C": str(pki.client_cert), "K": str(pki.client_key), "NOTPEM": str(pki.ca.parent)}
    settings = Settings(**{k: real.get(v, v) for k, v in fields.items()})
    with pytest.raises(TemporalSettingsError) as err:
        check_temporal_settings(settings)
    assert message in str(err.value)


@pytest.mark.parametrize("process", ["worker", "api"])
def test_a_missing_certificate_file_stops_the_process_at_startup_with_a_clear_error(process: str) -> None:
    env = {
        **os.environ,
        "FLUIDBOX_DATABASE_URL": "postgresql://nobody@/nowhere?host=/nonexistent",
        "FLUIDBOX_ADMIN_TOKEN": "fbx_admin_" + "0" * 48,
        "FLUIDBOX_TEMPORAL_TLS_CERT": "/nonexistent/worker.pem",
        "FLUIDBOX_TEMPORAL_TLS_KEY": "/nonexistent/worker.key",
        "FLUIDBOX_BIND": "127.0.0.1:1",
    }
    argv = [sys.executable, str(ROOT / "worker.py")] if process == "worker" else [sys.executable, "-m", "api.serve"]
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        f"fluidbox {process}: FLUIDBOX_TEMPORAL_TLS_CERT: the file /nonexistent/worker.pem does not exist"
    )


def test_an_unknown_worker_queue_role_stops_the_worker_at_startup() -> None:
    env = {**os.environ, "FLUIDBOX_DATABASE_URL": "postgresql://nobody@/nowhere?host=/nonexistent"}
    argv = [sys.executable, str(ROOT / "worker.py"), "--queues", "runs,sandbx"]
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == "fluidbox worker: unknown task queue role(s) 'sandbx'"


# ---- a real TLS connection -------------------------------------------------------------------------------


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, ssl.SSLError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


@contextlib.asynccontextmanager
async def tls_front(pki: Pki, upstream: str) -> AsyncIterator[str]:
    """A TLS endpoint (HTTP/2 by ALPN, a client certificate required) relaying bytes to ``upstream``."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki.ca))
    ctx.load_cert_chain(str(pki.server_cert), str(pki.server_key))
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.set_alpn_protocols(["h2"])
    host, _, port = upstream.rpartition(":")

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    server = await asyncio.start_server(relay, "127.0.0.1", 0, ssl=ctx)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


@pytest.fixture(scope="module")
async def dev_server() -> AsyncIterator[str]:
    async with await WorkflowEnvironment.start_local(dev_server_existing_path=str(TEMPORAL)) as env:
        yield env.client.service_client.config.target_host


async def test_the_tls_settings_connect_over_mutual_tls_to_a_real_temporal(pki: Pki, dev_server: str) -> None:
    async with tls_front(pki, dev_server) as address:
        settings = Settings(
            temporal_address=address,
            temporal_tls_ca=pki.ca,
            temporal_tls_cert=pki.client_cert,
            temporal_tls_key=pki.client_key,
            temporal_tls_server_name=SERVER_NAME,
        )
        client = await asyncio.wait_for(connect_client(settings), 30)
        assert await client.service_client.check_health()
        namespaces = await client.workflow_service.list_namespaces(ListNamespacesRequest())
        assert "default" in {ns.namespace_info.name for ns in namespaces.namespaces}


async def test_without_the_client_certificate_the_tls_server_refuses_the_connection(pki: Pki, dev_server: str) -> None:
    async with tls_front(pki, dev_server) as address:
        settings = Settings(temporal_address=address, temporal_tls_ca=pki.ca, temporal_tls_server_name=SERVER_NAME)
        with pytest.raises(RuntimeError, match=r"(?i)connect"):
            await asyncio.wait_for(connect_client(settings), 30)


async def test_a_server_certificate_for_another_name_is_refused(pki: Pki, dev_server: str) -> None:
    async with tls_front(pki, dev_server) as address:
        settings = Settings(
            temporal_address=address,
            temporal_tls_ca=pki.ca,
            temporal_tls_cert=pki.client_cert,
            temporal_tls_key=pki.client_key,
            temporal_tls_server_name="someone-else.test",
        )
        with pytest.raises(RuntimeError, match=r"(?i)connect"):
            await asyncio.wait_for(connect_client(settings), 30)
