"""Transports: the providers that speak to a connection's server, behind one interface.

A connection is an external capability and an account, not a wire protocol. Its ``transport`` column picks
the provider that photographs its tools and executes brokered calls; everything above this package (tool
snapshots, bindings, the gate, the execution claim, the ledger) is the same for every transport.

==========  ==============================================================  ================================
transport   what it speaks                                                  module
==========  ==============================================================  ================================
mcp_http    MCP over Streamable HTTP (the kept-open session pool)           :mod:`.mcp_http`
openapi     an HTTP API described by an OpenAPI document                    :mod:`.openapi`
http        an HTTP API described by a declared list of endpoints            :mod:`.http`
stdio       an MCP server launched on the worker host, spoken to on stdio   :mod:`.stdio`
relay       MCP over HTTPS through a device relay (sealed credential)       :mod:`.relay`
==========  ==============================================================  ================================

``sandbox_cli`` connections have no provider here: their declared tools are the photograph and the runner
executes them inside the sandbox (``core/sandbox_cli.py``, ``runner/local_tools.py``), never the broker.

Every provider implements :class:`TransportProvider`: ``list_tools(conn)`` returns a
:class:`~integrations.mcp_client.Photograph` (tools ``{"name", "description", "input_schema", ...}`` sorted by
name; non-MCP tools also carry ``"access": "read" | "write"`` and the ``"request"`` recipe the broker sends),
``call_tool(conn, tool, arguments)`` returns a :class:`~integrations.mcp_client.CallOutcome` with the four-state
claim semantics (``failed_before_send`` only with positive proof nothing was sent) and never raises for
upstream trouble, ``close()`` releases what the provider holds (kept-open sessions, stdio processes).

Providers are registered by name (:func:`register`); one :class:`Transports` per process instantiates each
lazily and closes them all at shutdown. A later transport adds a module and one ``register`` call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from integrations.mcp_client import CallOutcome, McpClientError, Photograph
from integrations.mcp_pool import SessionPool
from integrations.urls import UrlPolicy

__all__ = [
    "DEFAULT_MAX_RESPONSE_BYTES",
    "TRANSPORTS",
    "TransportConnection",
    "TransportDeps",
    "TransportError",
    "TransportProvider",
    "Transports",
    "UnknownTransport",
    "register",
]

DEFAULT_MAX_RESPONSE_BYTES = 1024 * 1024


class TransportError(McpClientError):
    """A provider could not photograph its server or read its description (messages carry no credential)."""


class UnknownTransport(LookupError):
    """No provider is registered under this name."""


@dataclass(frozen=True)
class TransportConnection:
    """What a provider needs of one connection for one operation. ``credential`` is the unsealed secret
    (static token, OAuth access token or ``user:password`` for Basic), held only in memory for the call."""

    id: str
    transport: str
    base_url: str
    config: dict[str, Any] = field(default_factory=dict)
    credential: str | None = field(default=None, repr=False)
    header_name: str | None = None
    scheme: str = "Bearer"
    auth_kind: str = "static"
    generation: int = 1
    protocol_version: str | None = None
    """The frozen snapshot's protocol version (MCP transports refuse a server that now negotiates another)."""


class TransportProvider(Protocol):
    """One way of speaking to a connection's server."""

    async def list_tools(self, conn: TransportConnection) -> Photograph:
        """Every tool the connection offers, photographed now; raises :class:`McpClientError`."""
        ...

    async def call_tool(
        self, conn: TransportConnection, tool: dict[str, Any], arguments: dict[str, Any]
    ) -> CallOutcome:
        """Execute one call of ``tool`` (its frozen snapshot entry); never raises for upstream trouble."""
        ...

    async def close(self) -> None:
        """Release every session and process this provider holds."""
        ...


@dataclass
class TransportDeps:
    """What providers are built from (one set per process)."""

    url_policy: UrlPolicy
    pool: SessionPool | None = None
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    timeout: float = 30.0


Factory = Callable[[TransportDeps], TransportProvider]
_FACTORIES: dict[str, Factory] = {}


def register(name: str, factory: Factory) -> None:
    """Make ``name`` a transport: ``factory(deps)`` builds its provider (once per :class:`Transports`)."""
    _FACTORIES[name] = factory


class Transports:
    """The providers of one process, built on first use and closed together (worker shutdown)."""

    def __init__(self, deps: TransportDeps) -> None:
        self.deps = deps
        self._providers: dict[str, TransportProvider] = {}
        self._lock = asyncio.Lock()

    def provider_for(self, transport: str) -> TransportProvider:
        """The provider for ``transport``; :class:`UnknownTransport` when none is registered."""
        provider = self._providers.get(transport)
        if provider is None:
            factory = _FACTORIES.get(transport)
            if factory is None:
                raise UnknownTransport(f"unknown transport '{transport}' (known: {', '.join(sorted(_FACTORIES))})")
            provider = self._providers[transport] = factory(self.deps)
        return provider

    async def aclose(self) -> None:
        """Close every provider built so far (stdio processes end, kept-open sessions close)."""
        providers, self._providers = list(self._providers.values()), {}
        for provider in providers:
            await provider.close()


def _register_builtins() -> None:
    from integrations.transports import http, mcp_http, openapi, relay, stdio

    register("mcp_http", mcp_http.McpHttpProvider)
    register("openapi", openapi.OpenApiProvider)
    register("http", http.HttpProvider)
    register("stdio", stdio.StdioProvider)
    register("relay", relay.RelayProvider)


_register_builtins()
TRANSPORTS: tuple[str, ...] = tuple(_FACTORIES)
