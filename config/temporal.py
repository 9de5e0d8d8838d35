"""The Temporal client factory: one data converter and one connection setup for the API, the worker and the tests.

TLS and API-key settings (``FLUIDBOX_TEMPORAL_TLS*``, ``FLUIDBOX_TEMPORAL_API_KEY``) are read here. A mistake in
them (a missing file, a certificate without its key) is a :class:`TemporalSettingsError` naming the setting, raised
by :func:`check_temporal_settings` when a process starts rather than at its first Temporal call.
"""

from __future__ import annotations

from pathlib import Path

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import TLSConfig

from config.settings import Settings


class TemporalSettingsError(ValueError):
    """A Temporal connection setting that cannot work; the message names the environment variable."""


def _read(path: Path | None, variable: str) -> bytes | None:
    if path is None:
        return None
    try:
        data = path.expanduser().read_bytes()
    except FileNotFoundError:
        raise TemporalSettingsError(f"{variable}: the file {path} does not exist") from None
    except IsADirectoryError:
        raise TemporalSettingsError(f"{variable}: {path} is a directory, not a PEM file") from None
    except OSError as exc:
        raise TemporalSettingsError(f"{variable}: the file {path} cannot be read ({exc.strerror})") from None
    if b"-----BEGIN" not in data:
        raise TemporalSettingsError(f"{variable}: {path} is not a PEM file (no -----BEGIN line)")
    return data


def tls_config(settings: Settings) -> TLSConfig | bool:
    """What ``Client.connect(tls=...)`` gets: a TLSConfig when any TLS file or the server name is set, else
    True when TLS is asked for (``FLUIDBOX_TEMPORAL_TLS``, or an API key, which Temporal Cloud only takes over
    TLS) with the system's CA roots, else False (plaintext, the embedded dev server)."""
    cert = _read(settings.temporal_tls_cert, "FLUIDBOX_TEMPORAL_TLS_CERT")
    key = _read(settings.temporal_tls_key, "FLUIDBOX_TEMPORAL_TLS_KEY")
    ca = _read(settings.temporal_tls_ca, "FLUIDBOX_TEMPORAL_TLS_CA")
    if (cert is None) != (key is None):
        given, missing = (
            ("FLUIDBOX_TEMPORAL_TLS_CERT", "FLUIDBOX_TEMPORAL_TLS_KEY")
            if cert is not None
            else ("FLUIDBOX_TEMPORAL_TLS_KEY", "FLUIDBOX_TEMPORAL_TLS_CERT")
        )
        raise TemporalSettingsError(f"{given} is set but {missing} is not: mTLS needs the certificate and its key")
    name = settings.temporal_tls_server_name or None
    if cert is not None or ca is not None or name is not None:
        return TLSConfig(server_root_ca_cert=ca, domain=name, client_cert=cert, client_private_key=key)
    return settings.temporal_tls or settings.temporal_api_key is not None


def check_temporal_settings(settings: Settings) -> None:
    """Fail at startup, naming the setting, when the Temporal connection settings cannot work."""
    tls_config(settings)
    if settings.temporal_api_key is not None and not settings.temporal_api_key.get_secret_value().strip():
        raise TemporalSettingsError("FLUIDBOX_TEMPORAL_API_KEY is set but empty")


async def connect_client(settings: Settings) -> Client:
    api_key = settings.temporal_api_key.get_secret_value() if settings.temporal_api_key else None
    return await Client.connect(
        settings.temporal_target,
        namespace=settings.temporal_namespace,
        data_converter=pydantic_data_converter,
        tls=tls_config(settings),
        api_key=api_key,
    )
