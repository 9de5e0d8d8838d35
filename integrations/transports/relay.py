"""``transport: relay``: an MCP server behind a device, reached through a static HTTPS relay.

The relay is a URL (admitted like any outbound URL, https only) that forwards MCP Streamable HTTP to a server
on a device (a laptop, an on-premises box). The control plane holds one sealed credential for the relay and
sends it as ``Authorization: Bearer`` on every request; the sandbox never sees it. Every exchange is bounded
by the connection's ``timeout_s``. A relay whose certificate comes from its own CA names that CA in
``ca_pem`` (public data: a certificate, never a key); the name in the URL is still verified against it.

One provider behind the interface every transport implements (``list_tools`` / ``call_tool`` / ``close``),
registered as ``relay``: creating, refreshing and brokering all go through the registry, so the broker's
claim → call → settle order and the execution claim apply unchanged.
"""

from __future__ import annotations

import ssl
from typing import Any

from integrations import mcp_client
from integrations.headers import auth_headers
from integrations.transports import TransportConnection, TransportDeps, TransportError
from integrations.urls import AdmittedUrl, UrlRefused

DEFAULT_TIMEOUT_S = 30.0
MAX_TIMEOUT_S = 120.0
MAX_CA_PEM = 64 * 1024


class RelayConfigError(ValueError):
    """The relay settings are unusable (the message names the problem)."""


def check_config(url: str, config: dict[str, Any] | None) -> dict[str, Any]:
    """The stored ``transport_config`` of a relay connection: ``{timeout_s, ca_pem?}``.

    Raises:
        RelayConfigError: not https, an unknown field, a timeout out of range, or a ``ca_pem`` that is not
            a certificate (or that carries a private key).
    """
    if not url.lower().startswith("https://"):
        raise RelayConfigError("a relay URL must be https://")
    config = dict(config or {})
    unknown = sorted(set(config) - {"timeout_s", "ca_pem"})
    if unknown:
        raise RelayConfigError(
            f"unknown relay setting(s): {', '.join(unknown)} (a relay takes timeout_s and ca_pem; "
            "its credential is the connection's token)"
        )
    timeout = config.get("timeout_s", DEFAULT_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= MAX_TIMEOUT_S:
        raise RelayConfigError(f"relay timeout_s must be a number of seconds in (0, {MAX_TIMEOUT_S:g}]")
    out: dict[str, Any] = {"timeout_s": float(timeout)}
    ca_pem = config.get("ca_pem")
    if ca_pem is not None:
        if not isinstance(ca_pem, str) or len(ca_pem) > MAX_CA_PEM or "PRIVATE KEY" in ca_pem:
            raise RelayConfigError("relay ca_pem must be PEM certificate text (at most 64 KiB, no private key)")
        try:
            tls_context(ca_pem)
        except (ssl.SSLError, ValueError) as exc:
            raise RelayConfigError(f"relay ca_pem is not a usable CA certificate: {exc}") from None
        out["ca_pem"] = ca_pem
    return out


def tls_context(ca_pem: str | None) -> ssl.SSLContext | None:
    """A verifying context that trusts ``ca_pem`` (None: the system trust store)."""
    if ca_pem is None:
        return None
    context = ssl.create_default_context(cadata=ca_pem)
    context.check_hostname = True
    return context


class RelayProvider:
    """``transport: relay`` behind the common provider interface (:class:`~integrations.transports.TransportProvider`).

    Each operation checks the stored settings, admits the relay URL again (a name that now resolves somewhere
    forbidden is refused with nothing sent) and connects only to the vetted addresses, with the connection's
    credential as ``Authorization: Bearer`` and its bounded timeout. Nothing is kept open between calls.
    """

    def __init__(self, deps: TransportDeps) -> None:
        self.deps = deps

    async def _target(self, conn: TransportConnection) -> tuple[AdmittedUrl, dict[str, Any]]:
        """The admitted relay and its checked settings; :class:`RelayConfigError` or ``UrlRefused``."""
        settings = check_config(conn.base_url, conn.config)
        return await self.deps.url_policy.admit(conn.base_url), settings

    @staticmethod
    def _headers(conn: TransportConnection) -> dict[str, str]:
        return auth_headers(conn.credential or "", header_name=None, scheme="Bearer")

    async def list_tools(self, conn: TransportConnection) -> mcp_client.Photograph:
        """The tools behind the relay; ``TransportError`` for unusable settings, ``McpClientError`` otherwise."""
        try:
            admitted, settings = await self._target(conn)
        except RelayConfigError as err:
            raise TransportError(str(err)) from None
        except UrlRefused as err:
            raise mcp_client.Unreachable(str(err)) from None
        return await mcp_client.photograph(
            admitted.url,
            self._headers(conn),
            timeout=settings["timeout_s"],
            pin=admitted,
            tls=tls_context(settings.get("ca_pem")),
        )

    async def call_tool(
        self, conn: TransportConnection, tool: dict[str, Any], arguments: dict[str, Any]
    ) -> mcp_client.CallOutcome:
        """One ``tools/call`` on a fresh session (a relay's sessions are not pooled), classified as the MCP
        transport classifies it; never raises for upstream trouble."""
        try:
            admitted, settings = await self._target(conn)
        except (RelayConfigError, UrlRefused) as err:
            return mcp_client.CallOutcome(outcome="failed_before_send", result=None, error=str(err))
        return await mcp_client.call_tool(
            admitted.url,
            self._headers(conn),
            str(tool["name"]),
            arguments,
            expected_protocol=conn.protocol_version,
            timeout=settings["timeout_s"],
            pin=admitted,
            tls=tls_context(settings.get("ca_pem")),
        )

    async def close(self) -> None:
        """Nothing is kept open between calls."""
