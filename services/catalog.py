"""The connector catalog's use cases: add a custom entry, connect an entry, probe a URL, add a server in one call.

The route parses and authorizes (the catalog is the operator's); this module holds the rules:

- a custom entry's transport configuration must be one its transport can use (422, as on
  ``POST /v1/connections``); a stdio entry without one launches inside the sandbox, so it needs a
  ``sandbox_launch`` with declared tools (400); a slug already used is 409 before its URL is admitted;
- connecting an in-image entry publishes the capability bundle named after its slug; any other entry is
  connected under the draft rules of :mod:`core.connection_drafts`, refused in the catalog's words;
- a probe is a question, not a change: it stores nothing and answers either way;
- a one-call server connect that fails leaves no catalog entry behind.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import SecretStr

from core.access import READ_ONLY, from_catalog, parse_access
from core.capabilities import check_catalog_launch, launch_server, parse_bundle
from core.connection_drafts import (
    DEVICE_OR_CLI,
    ConnectionDraft,
    check_described_credential,
    check_device_or_cli,
    check_oauth_client,
    check_static_credential,
    credential_scheme,
)
from core.digests import document_digest
from core.errors import BadRequest, Conflict, Unprocessable
from db.capabilities import Capabilities
from db.catalog import Catalog, duplicate_slug
from db.connections import ConnectionRow, Connections
from db.models.capabilities import CapabilityBundle
from db.models.catalog import ConnectorCatalogEntry
from db.models.connections import ConnectionToolSnapshot
from integrations import mcp_client
from integrations.catalog import CatalogEntryError, check_entry
from integrations.oauth import OAuthClient, OAuthClientError
from integrations.transports.openapi import config_problem as openapi_config_problem
from integrations.transports.stdio import validate_config as stdio_config_problem
from integrations.urls import UrlPolicy, UrlRefused, same_origin_path
from services.connections import ConnectionService, Ownership, unusable
from services.run_control import RunControl

PREVIEW_TOOLS = 50


@dataclass(frozen=True)
class Listed:
    """A catalog entry with the connection that covers it, the newest bundle named after its slug ((id, version)),
    and whether it can be connected now."""

    entry: ConnectorCatalogEntry
    connection: ConnectionRow | None
    bundle: tuple[str, int] | None
    connectable: bool


@dataclass(frozen=True)
class EntryConnect:
    """What connecting a catalog entry is given (the entry itself says the rest)."""

    display_name: str | None = None
    token: SecretStr | None = None
    bundle_name: str | None = None
    client_id: str | None = None
    client_secret: SecretStr | None = None
    scopes: list[str] | None = None


@dataclass(frozen=True)
class EntryConnected:
    """An in-image entry → ``bundle``; api_key and described → ``connection`` + ``snapshot``; oauth →
    ``connection`` + ``go_url`` (None: not part of this outcome)."""

    bundle: CapabilityBundle | None = None
    connection: ConnectionRow | None = None
    snapshot: ConnectionToolSnapshot | None = None
    go_url: str | None = None


@dataclass(frozen=True)
class NewServer:
    """A custom MCP server to add to the catalog and connect in one call."""

    url: str
    name: str
    auth_mode: str = "api_key"
    token: SecretStr | None = None
    display_name: str | None = None
    icon: str | None = None
    description: str | None = None
    header_name: str | None = None
    scheme: str = "Bearer"
    access: Any = None


@dataclass
class ProbeFindings:
    """What a probe found out about a URL (``api.responses.Probe`` documents each field)."""

    url: str
    transport: str = "streamable_http"
    reachable: bool = False
    auth_mode: str | None = None
    oauth_available: bool = False
    static_possible: bool = False
    tools_preview: list[dict[str, Any]] = field(default_factory=list)
    tools_truncated: bool = False
    oauth: dict[str, Any] | None = None
    auth_hints: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def connectable(entry: ConnectorCatalogEntry) -> bool:
    """A relay connects once it has a URL; otherwise an api_key entry, an in-image server or a described one."""
    if entry.transport == "relay":
        return bool(entry.url)
    return entry.auth_mode == "api_key" or bool(entry.sandbox_launch) or bool(entry.transport_config)


def covering(connections: list[ConnectionRow], url: str | None) -> ConnectionRow | None:
    """The live connection to ``url`` (same scheme, host, port and path), if any."""
    if not url:
        return None
    for conn in connections:
        named = conn.base_url.rstrip("/") == url.rstrip("/")  # sandbox-cli://name is a name, not a URL
        if conn.status != "revoked" and (named or same_origin_path(conn.base_url, url)):
            return conn
    return None


def credential_hints(entries: list[ConnectorCatalogEntry], url: str) -> dict[str, Any]:
    """How to present a credential to ``url``: the hints of the catalog entry for it (a vendor's own header or
    scheme), or none known."""
    for entry in entries:
        if entry.url and same_origin_path(entry.url, url):
            return dict(entry.auth_hints or {})
    return {}


def slugify(name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:64].strip("-")
    if not slug:
        raise BadRequest("`name` must contain letters or digits")
    return slug


def entry_draft(entry: ConnectorCatalogEntry, request: EntryConnect) -> ConnectionDraft:
    """Connecting ``entry`` as a connection draft: the entry's reviewed transport and URL, the caller's
    credential and client settings (a sandbox CLI entry's configuration is its declared tools)."""
    config = dict(entry.transport_config or {})
    cli = entry.transport == "sandbox_cli"
    return ConnectionDraft(
        transport=entry.transport, base_url=entry.url, display_name=request.display_name or entry.name,
        token=request.token, client_id=request.client_id, client_secret=request.client_secret,
        scopes=request.scopes, tools=config.get("tools") if cli else None, transport_config=None if cli else config,
        entry=entry.slug,
    )  # fmt: skip


@dataclass
class CatalogService:
    catalog: Catalog
    capabilities: Capabilities
    connections: Connections
    connection_service: ConnectionService
    run_control: RunControl
    url_policy: UrlPolicy
    oauth_client: OAuthClient

    async def listing(self, tenant_id: str) -> list[Listed]:
        """Every entry this tenant sees, with what covers it (organization connections only)."""
        entries = await self.catalog.visible(tenant_id)
        bundles = await self.capabilities.newest(tenant_id, [entry.slug for entry in entries])
        rows = await self.connections.all(tenant_id)
        return [
            Listed(entry, covering(rows, entry.url), bundles.get(entry.slug), connectable(entry)) for entry in entries
        ]

    async def add_entry(self, tenant_id: str, fields: dict[str, Any]) -> ConnectorCatalogEntry:
        """A custom entry (tier custom, this tenant's) from the request's ``fields``, checked as the module says."""
        slug, transport = fields["slug"], fields["transport"]
        config, launch = fields.get("transport_config"), fields.get("sandbox_launch")
        if transport == "stdio" and config is not None and launch is None:
            unusable(stdio_config_problem(config))
        else:
            check_catalog_launch(slug, transport, launch)
        if transport in ("openapi", "http") and config is None:
            raise Unprocessable(f"an {transport} catalog entry needs `transport_config`")
        if transport == "openapi" and config is not None:
            unusable(openapi_config_problem(config))
        try:
            entry = check_entry({k: v for k, v in fields.items() if k != "egress"})
        except CatalogEntryError as err:
            raise BadRequest(str(err)) from None
        # Before the URL is admitted: re-posting an existing entry is a 409 whatever its URL resolves to.
        if await self.catalog.slug_taken(tenant_id, slug):
            raise Conflict(duplicate_slug(slug))
        if fields.get("url") is not None and transport != "sandbox_cli":  # sandbox-cli://name is a name, not a place
            await self.connection_service.admit(fields["url"])
        access = fields.get("access")
        entry["access"] = parse_access(access if access is not None else READ_ONLY)
        return await self.catalog.create_custom(tenant_id, entry)

    async def connect(self, tenant_id: str, entry: ConnectorCatalogEntry, request: EntryConnect) -> EntryConnected:
        """api_key → a sealed, photographed connection; oauth → a pending one and its sign-in link; an in-image
        server → a sandbox capability bundle. A connection made usable wakes the runs parked for it."""
        if entry.sandbox_launch:
            return EntryConnected(bundle=await self._publish(tenant_id, entry, request.bundle_name))
        draft = entry_draft(entry, request)
        made = Ownership(request.display_name or entry.name, access=from_catalog(entry.access))
        if entry.transport in DEVICE_OR_CLI:
            check_device_or_cli(draft, entry.transport)
            row, snapshot = await self._connect_device_or_cli(tenant_id, entry, draft, made)
        elif entry.transport in ("openapi", "http", "stdio") and entry.transport_config is not None:
            return await self._connect_described(tenant_id, entry, draft)
        elif not entry.url:
            raise BadRequest(f"'{entry.slug}' has no URL to connect to")
        elif entry.auth_mode == "oauth":
            return await self._connect_oauth(tenant_id, entry, draft, made)
        else:
            check_static_credential(draft)
            assert request.token is not None
            hints = entry.auth_hints or {}
            row, snapshot = await self.connection_service.connect_static(
                tenant_id, base_url=entry.url, token=request.token.get_secret_value(),
                header_name=hints.get("header_name"), scheme=hints.get("scheme", "Bearer"), made=made,
            )  # fmt: skip
        await self.run_control.wake_parked(tenant_id, row)
        return EntryConnected(connection=row, snapshot=snapshot)

    async def _publish(self, tenant_id: str, entry: ConnectorCatalogEntry, name: str | None) -> CapabilityBundle:
        # The bundle is named after the slug (the catalog lists it under the entry by that name). Bundles
        # published under the older underscore spelling stay as they are: agents pin bundles by name.
        assert entry.sandbox_launch is not None
        definition = {
            "name": name or entry.slug,
            "description": entry.description,
            "servers": [launch_server(entry.slug, entry.sandbox_launch)],
        }
        bundle = parse_bundle(definition)
        doc = bundle.model_dump(mode="json", by_alias=True, exclude_none=True)
        return await self.capabilities.publish(tenant_id, bundle.name, bundle.description, doc, document_digest(doc))

    async def _connect_device_or_cli(
        self, tenant_id: str, entry: ConnectorCatalogEntry, draft: ConnectionDraft, made: Ownership
    ) -> tuple[ConnectionRow, ConnectionToolSnapshot]:
        """A relay entry with the relay's credential (``token``, sealed); a sandbox CLI entry with none at all."""
        assert entry.url is not None
        if entry.transport == "sandbox_cli":
            return await self.connection_service.connect_sandbox_cli(
                tenant_id, base_url=entry.url, tools=draft.tools, made=made
            )
        assert draft.token is not None
        return await self.connection_service.connect_relay(
            tenant_id, base_url=entry.url, token=draft.token.get_secret_value(), config=draft.transport_config,
            display_name=made.display_name, access=made.access,
        )  # fmt: skip

    async def _connect_described(
        self, tenant_id: str, entry: ConnectorCatalogEntry, draft: ConnectionDraft
    ) -> EntryConnected:
        """An openapi, http or stdio entry with its (trusted) configuration: at its URL, the API the document
        names, or ``stdio://<slug>``."""
        config = dict(entry.transport_config or {})
        check_described_credential(draft, entry.transport, config)
        if entry.url:
            base_url = entry.url
        elif entry.transport == "openapi":
            base_url = await self.connection_service.openapi_base_url(config)
        else:
            base_url = f"stdio://{entry.slug}"
        row, snapshot = await self.connection_service.connect_static(
            tenant_id, base_url=base_url, token=draft.token.get_secret_value() if draft.token is not None else "",
            header_name=None, scheme=credential_scheme(config, "Bearer"), made=Ownership(draft.display_name),
            transport=entry.transport, transport_config=config,
        )  # fmt: skip
        return EntryConnected(connection=row, snapshot=snapshot)

    async def _connect_oauth(
        self, tenant_id: str, entry: ConnectorCatalogEntry, draft: ConnectionDraft, made: Ownership
    ) -> EntryConnected:
        """A pending connection and the sign-in link to make it usable: one call, one outcome (a server we cannot
        start signing in to leaves no pending connection behind)."""
        assert entry.url is not None
        check_oauth_client(draft)
        row = await self.connection_service.connect_oauth(tenant_id, base_url=entry.url, made=made)
        try:
            scopes = draft.scopes or entry.scopes or None
            if draft.client_id is not None or scopes:
                await self.connection_service.oauth_connect().preregister(
                    tenant_id, row, client_id=draft.client_id, client_secret=draft.client_secret, scopes=scopes
                )
            go_url = await self.connection_service.start_sign_in(tenant_id, row, None)
        except (OAuthClientError, UrlRefused) as err:
            await self.connections.discard_pending_oauth(tenant_id, str(row.id))
            raise BadRequest(f"cannot start OAuth with this server: {err}") from None
        except Exception:
            await self.connections.discard_pending_oauth(tenant_id, str(row.id))
            raise
        return EntryConnected(connection=row, go_url=go_url)

    async def probe(self, tenant_id: str, url: str) -> ProbeFindings:
        """Detect ``url``'s auth mode and preview its tools, storing nothing: a URL the admission refuses, or a
        server that does not answer, is ``reachable: false`` with the reason in ``notes``."""
        found = ProbeFindings(url=url)
        try:
            admitted = await self.url_policy.admit(url)
        except UrlRefused as err:
            found.notes.append(str(err))
            return found
        found.url, found.reachable = admitted.url, True
        found.auth_hints = credential_hints(await self.catalog.visible(tenant_id), admitted.url)
        try:
            photo = await mcp_client.photograph(admitted.url, {}, timeout=10, pin=admitted)
        except mcp_client.AuthRejected:
            found.auth_mode, found.static_possible = "api_key", True
            found.notes.append("the server requires credentials; tools are listed once connected")
            try:
                # The connect flow's own discovery (admitted, pinned): OAuth is offered only where it would work.
                server = (await self.oauth_client.discover(admitted.url)).authorization_server
            except OAuthClientError as err:
                found.notes.append(f"no OAuth sign-in: {err}")
                return found
            found.auth_mode, found.oauth_available = "oauth", True
            found.oauth = {"issuer": server.issuer, "authorization_endpoint": server.authorization_endpoint,
                           "scopes_supported": server.scopes_supported}  # fmt: skip
            return found
        except mcp_client.McpClientError as err:
            found.reachable = False
            found.notes.append(str(err))
            return found
        preview = [{"name": t["name"], "description": t.get("description", "")} for t in photo.tools]
        found.auth_mode, found.static_possible = "none", True
        found.tools_preview, found.tools_truncated = preview[:PREVIEW_TOOLS], len(preview) > PREVIEW_TOOLS
        found.notes.append(f"negotiated MCP {photo.protocol_version}")
        return found

    async def add_server(
        self, tenant_id: str, server: NewServer
    ) -> tuple[ConnectorCatalogEntry, ConnectionRow, ConnectionToolSnapshot]:
        """A custom catalog entry and its connection; a failed connect removes the entry again."""
        if server.auth_mode != "api_key":
            raise BadRequest("only api_key servers can be connected in one call today")
        if server.token is None or not server.token.get_secret_value():
            raise BadRequest("an api_key server needs a `token`")
        access = parse_access(server.access if server.access is not None else READ_ONLY)
        await self.connection_service.admit(server.url)
        hints = {"header_name": server.header_name, "scheme": server.scheme}
        entry = await self.catalog.create_custom(
            tenant_id,
            {"slug": slugify(server.name), "name": server.name, "icon": server.icon,
             "description": server.description, "url": server.url, "transport": "streamable_http",
             "auth_mode": "api_key", "auth_hints": hints, "access": access},
        )  # fmt: skip
        try:
            row, snapshot = await self.connection_service.connect_static(
                tenant_id, base_url=server.url, token=server.token.get_secret_value(),
                header_name=server.header_name, scheme=server.scheme,
                made=Ownership(server.display_name or server.name, access=access),
            )  # fmt: skip
        except Exception:
            await self.catalog.delete(entry.id)
            raise
        return entry, row, snapshot


__all__ = [
    "CatalogService",
    "EntryConnect",
    "EntryConnected",
    "Listed",
    "NewServer",
    "ProbeFindings",
    "connectable",
    "covering",
    "slugify",
]
