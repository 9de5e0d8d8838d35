"""The connector catalog, the non-committing probe, and one-call custom server connect."""

from __future__ import annotations

import re
from typing import Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from api import responses as out
from api.deps import ContextDep, OperatorDep
from api.errors import errors
from api.views import connection_public as public
from api.views import snapshot_public
from core.access import READ_ONLY, from_catalog, parse_access
from core.capabilities import check_catalog_launch, launch_server, parse_bundle
from core.digests import document_digest
from core.errors import BadRequest, Conflict, Unprocessable, found
from db.catalog import duplicate_slug
from db.models.catalog import ConnectorCatalogEntry
from integrations import mcp_client
from integrations.catalog import CatalogEntryError, check_entry
from integrations.oauth import OAuthClient, OAuthClientError
from integrations.transports.openapi import config_problem as openapi_config_problem
from integrations.transports.stdio import validate_config as stdio_config_problem
from integrations.urls import UrlRefused, same_origin_path
from services.connections import Ownership
from services.context import AppContext

router = APIRouter(tags=["catalog"])
SLUG = r"^[a-z0-9][a-z0-9-]{0,63}$"


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CatalogEntryIn(_Body):
    slug: str = Field(pattern=SLUG)
    name: str = Field(min_length=1, max_length=200)
    icon: str | None = Field(default=None, max_length=2048)
    description: str | None = Field(default=None, max_length=4096)
    categories: list[str] = Field(default_factory=list, max_length=16)
    url: str | None = Field(default=None, max_length=2048)
    transport: Literal["streamable_http", "mcp_http", "openapi", "http", "stdio", "relay", "sandbox_cli"] = (
        "streamable_http"
    )
    transport_config: dict[str, Any] | None = None
    """openapi / http / stdio / relay / sandbox_cli: the transport configuration (a stdio entry with it, and no
    ``sandbox_launch``, launches its command on the worker hosts; catalog entries are trusted configuration; a
    relay's is ``{timeout_s?, ca_pem?}``, a sandbox_cli's ``{tools}``). See :mod:`integrations.catalog`."""
    auth_mode: Literal["none", "api_key", "oauth"] = "api_key"
    auth_hints: dict[str, Any] = Field(default_factory=dict)
    scopes: list[str] = Field(default_factory=list, max_length=64)
    egress: list[str] = Field(default_factory=list, max_length=64)
    tool_hints: list[dict[str, Any]] = Field(default_factory=list, max_length=256)
    sandbox_launch: dict[str, Any] | None = None
    access: Any = Field(default=None, description="Reviewed read/write tool patterns (default: `read: true`).")


class ConnectIn(_Body):
    display_name: str | None = Field(default=None, max_length=200)
    token: SecretStr | None = None
    bundle_name: str | None = Field(default=None, pattern=r"^[a-z0-9_-]{1,64}$")
    owner: Literal["organization", "personal"] = "organization"
    client_id: str | None = Field(default=None, max_length=2048)
    client_secret: SecretStr | None = None
    scopes: list[str] | None = Field(default=None, min_length=1, max_length=50)


class ProbeIn(_Body):
    url: str = Field(min_length=1, max_length=2048)


class ServerIn(_Body):
    url: str = Field(min_length=1, max_length=2048)
    name: str = Field(min_length=1, max_length=200)
    auth_mode: Literal["api_key", "oauth", "none"] = "api_key"
    token: SecretStr | None = None
    display_name: str | None = Field(default=None, max_length=200)
    icon: str | None = None
    description: str | None = Field(default=None, max_length=4096)
    header_name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9-]{0,63}$")
    scheme: Literal["Bearer", "Basic", ""] = "Bearer"
    owner: Literal["organization", "personal"] = "organization"
    access: Any = Field(
        default=None,
        description="The connection's access declaration (default `read: true, write: false`).",
    )


def entry_public(row: ConnectorCatalogEntry) -> dict[str, Any]:
    return row.model_dump(exclude={"disabled_at"})


async def _covering(ctx: AppContext, tenant_id: str, url: str | None) -> dict[str, Any] | None:
    if not url:
        return None
    for conn in await ctx.connections.all(tenant_id):
        named = conn.base_url.rstrip("/") == url.rstrip("/")  # sandbox-cli://name is a name, not a URL
        if conn.status != "revoked" and (named or same_origin_path(conn.base_url, url)):
            return public(conn)
    return None


@router.get(
    "/v1/catalog", summary="Curated and custom connectors", response_model=out.CatalogList, responses=errors(401, 403)
)
async def catalog(op: OperatorDep, ctx: ContextDep) -> dict[str, Any]:
    """Each entry with the connection that covers it (if any), the newest bundle named after its slug (if
    any) and whether it can be connected now."""
    rows = await ctx.catalog.visible(op.tenant_id)
    bundles = await ctx.capabilities.newest(op.tenant_id, [row.slug for row in rows])
    return {"connectors": [await _listed(ctx, op.tenant_id, row, bundles.get(row.slug)) for row in rows]}


def _connectable(row: ConnectorCatalogEntry) -> bool:
    if row.transport == "relay":
        return bool(row.url)
    return row.auth_mode == "api_key" or bool(row.sandbox_launch) or bool(row.transport_config)


async def _listed(
    ctx: AppContext, tenant_id: str, row: ConnectorCatalogEntry, bundle: tuple[str, int] | None
) -> dict[str, Any]:
    covering = await _covering(ctx, tenant_id, row.url)
    published = None if bundle is None else {"id": bundle[0], "name": row.slug, "version": bundle[1]}
    return {**entry_public(row), "connection": covering, "bundle": published, "connectable": _connectable(row)}


@router.get(
    "/v1/catalog/{slug}",
    summary="One catalog entry",
    response_model=out.CatalogEntryOut,
    responses=errors(401, 403, 404),
)
async def catalog_entry(slug: str, op: OperatorDep, ctx: ContextDep) -> dict[str, Any]:
    """404 when unknown or another tenant's custom entry."""
    return {"connector": entry_public(found(await ctx.catalog.get(op.tenant_id, slug)))}


@router.post(
    "/v1/catalog",
    summary="Add a custom catalog entry (tier custom)",
    response_model=out.CatalogEntryOut,
    responses=errors(401, 403, 409, 422),
)
async def create_entry(body: CatalogEntryIn, op: OperatorDep, ctx: ContextDep) -> dict[str, Any]:
    """Tenant-scoped; a slug already used (globally or by this tenant) is a 409; a stdio entry needs a
    ``sandbox_launch`` with declared tools (400); a relay entry an https URL and ``auth_mode: api_key``, a
    sandbox_cli entry a ``sandbox-cli://`` URL, ``auth_mode: none`` and its tools (400 naming the problem).
    A ``transport_config`` its transport cannot use (stdio, openapi, http) or a bad ``access`` declaration is
    422, as on ``POST /v1/connections``."""
    if body.transport == "stdio" and body.transport_config is not None and body.sandbox_launch is None:
        problem = stdio_config_problem(body.transport_config)
        if problem is not None:
            raise Unprocessable(problem)
    else:
        check_catalog_launch(body.slug, body.transport, body.sandbox_launch)
    if body.transport in ("openapi", "http") and body.transport_config is None:
        raise Unprocessable(f"an {body.transport} catalog entry needs `transport_config`")
    if body.transport == "openapi" and body.transport_config is not None:
        problem = openapi_config_problem(body.transport_config)
        if problem is not None:
            raise Unprocessable(problem)
    try:
        entry = check_entry(body.model_dump(exclude={"egress"}))
    except CatalogEntryError as err:
        raise BadRequest(str(err)) from None
    # Before the URL is admitted: re-posting an existing entry is a 409 whatever its URL resolves to.
    if await ctx.catalog.slug_taken(op.tenant_id, body.slug):
        raise Conflict(duplicate_slug(body.slug))
    if body.url is not None and body.transport != "sandbox_cli":  # sandbox-cli://name is a name, not a place
        try:
            await ctx.url_policy.admit(body.url)
        except UrlRefused as err:
            raise BadRequest(str(err)) from None
    entry["access"] = parse_access(body.access if body.access is not None else READ_ONLY)
    row = await ctx.catalog.create_custom(op.tenant_id, entry)
    return {"connector": entry_public(row)}


@router.post(
    "/v1/catalog/{slug}/connect",
    summary="Connect a catalog entry",
    response_model=out.CatalogConnected,
    response_model_exclude_unset=True,
    responses=errors(401, 403, 404, 409, 502, 503),
)
async def connect_entry(slug: str, body: ConnectIn, op: OperatorDep, ctx: ContextDep) -> dict[str, Any]:
    """api_key → a sealed, photographed connection; an in-image server → a sandbox capability bundle."""
    row = found(await ctx.catalog.get(op.tenant_id, slug))
    if body.owner == "personal":
        raise BadRequest("a personal connection belongs to a signed-in user; the operator token has none")
    if row.sandbox_launch:
        # The bundle is named after the slug (the catalog lists it under the entry by that name). Bundles
        # published under the older underscore spelling stay as they are: agents pin bundles by name.
        definition = {
            "name": body.bundle_name or slug,
            "description": row.description,
            "servers": [launch_server(slug, row.sandbox_launch)],
        }
        bundle = parse_bundle(definition)
        doc = bundle.model_dump(mode="json", by_alias=True, exclude_none=True)
        published = await ctx.capabilities.publish(
            op.tenant_id, bundle.name, bundle.description, doc, document_digest(doc)
        )
        return {"bundle": {"id": str(published.id), "name": published.name, "version": published.version}}
    if row.transport in ("relay", "sandbox_cli"):
        return await _connect_device_or_cli(ctx, op.tenant_id, row, body)
    if row.transport in ("openapi", "http", "stdio") and row.transport_config is not None:
        config = dict(row.transport_config)
        auth = config.get("auth") or {}
        needs_token = row.transport != "stdio" and auth.get("type", "bearer") != "none"
        if needs_token and (body.token is None or not body.token.get_secret_value()):
            raise BadRequest(f"'{slug}' needs a `token`")
        if row.url:
            base_url = row.url
        elif row.transport == "openapi":
            base_url = await ctx.connection_service.openapi_base_url(config)
        else:
            base_url = f"stdio://{slug}"
        made, snapshot = await ctx.connection_service.connect_static(
            op.tenant_id,
            base_url=base_url,
            token=body.token.get_secret_value() if body.token is not None else "",
            header_name=None,
            scheme="Basic" if auth.get("type") == "basic" else "Bearer",
            made=Ownership(body.display_name or row.name),
            transport=row.transport,
            transport_config=config,
        )
        return {"connection": public(made), "snapshot": snapshot_public(snapshot)}
    if not row.url:
        raise BadRequest(f"'{slug}' has no URL to connect to")
    if row.auth_mode == "oauth":
        if body.token is not None:
            raise BadRequest(f"'{slug}' connects with OAuth: it takes no `token`")
        if body.client_secret is not None and body.client_id is None:
            raise BadRequest("`client_secret` needs the `client_id` it was issued with")
        made = await ctx.connection_service.connect_oauth(
            op.tenant_id,
            base_url=row.url,
            made=Ownership(body.display_name or row.name, access=from_catalog(row.access)),
        )
        try:
            scopes = body.scopes or row.scopes or None
            if body.client_id is not None or scopes:
                await ctx.connection_service.oauth_connect().preregister(
                    op.tenant_id, made, client_id=body.client_id, client_secret=body.client_secret, scopes=scopes
                )
            go_url = await ctx.connection_service.start_sign_in(op.tenant_id, made, None)
        except (OAuthClientError, UrlRefused) as err:
            await ctx.connections.discard_pending_oauth(op.tenant_id, str(made.id))
            raise BadRequest(f"cannot start OAuth with this server: {err}") from None
        except Exception:
            # One call, one outcome: a server we cannot start signing in to leaves no pending connection behind.
            await ctx.connections.discard_pending_oauth(op.tenant_id, str(made.id))
            raise
        return {"connection": public(made), "go_url": go_url}
    if body.token is None or not body.token.get_secret_value():
        raise BadRequest(f"'{slug}' needs a `token`")
    hints = row.auth_hints or {}
    made, snapshot = await ctx.connection_service.connect_static(
        op.tenant_id,
        base_url=row.url,
        token=body.token.get_secret_value(),
        header_name=hints.get("header_name"),
        scheme=hints.get("scheme", "Bearer"),
        made=Ownership(body.display_name or row.name, access=from_catalog(row.access)),
    )
    await ctx.run_control.wake_parked(op.tenant_id, made)
    return {"connection": public(made), "snapshot": snapshot_public(snapshot)}


async def _connect_device_or_cli(
    ctx: AppContext, tenant_id: str, row: ConnectorCatalogEntry, body: ConnectIn
) -> dict[str, Any]:
    """A relay entry with the relay's credential (``token``, sealed); a sandbox CLI entry with none at all."""
    slug = row.slug
    if body.client_id is not None or body.client_secret is not None or body.scopes is not None:
        raise BadRequest(f"'{slug}' ({row.transport}) takes no OAuth settings")
    config = dict(row.transport_config or {})
    if not row.url:
        raise BadRequest(f"'{slug}' has no URL to connect to")
    if row.transport == "sandbox_cli":
        if body.token is not None:
            raise BadRequest(
                f"'{slug}' is a sandbox CLI: it takes no `token` (its tools run inside the sandbox, which never "
                "holds a credential)"
            )
        made, snapshot = await ctx.connection_service.connect_sandbox_cli(
            tenant_id, base_url=row.url, tools=config.get("tools"),
            made=Ownership(body.display_name or row.name, access=from_catalog(row.access)),
        )  # fmt: skip
    else:
        if body.token is None or not body.token.get_secret_value():
            raise BadRequest(f"'{slug}' is a relay: it needs the relay's credential as `token`")
        made, snapshot = await ctx.connection_service.connect_relay(
            tenant_id, base_url=row.url, token=body.token.get_secret_value(), config=config,
            display_name=body.display_name or row.name, access=from_catalog(row.access),
        )  # fmt: skip
    await ctx.run_control.wake_parked(tenant_id, made)
    return {"connection": public(made), "snapshot": snapshot_public(snapshot)}


def _hints(rows: list[ConnectorCatalogEntry], url: str) -> dict[str, Any]:
    """How to present a credential to ``url``: the hints of the catalog entry for it (a vendor's own header or
    scheme), or none known."""
    for row in rows:
        if row.url and same_origin_path(row.url, url):
            return dict(row.auth_hints or {})
    return {}


@router.post(
    "/v1/mcp/probe",
    summary="Detect a URL's auth mode and preview its tools (stores nothing)",
    response_model=out.Probe,
    responses=errors(401, 403),
)
async def probe(body: ProbeIn, op: OperatorDep, ctx: ContextDep) -> dict[str, Any]:
    """A URL the admission refuses, or a server that does not answer, is ``reachable: false`` with the reason
    in ``notes`` (a probe is a question, not a change: 200 either way); nothing is ever stored."""
    found: dict[str, Any] = {"url": body.url, "transport": "streamable_http", "reachable": False, "auth_mode": None,
                             "oauth_available": False, "static_possible": False, "tools_preview": [],
                             "tools_truncated": False, "oauth": None, "auth_hints": {}, "notes": []}  # fmt: skip
    try:
        admitted = await ctx.url_policy.admit(body.url)
    except UrlRefused as err:
        found["notes"].append(str(err))
        return found
    found |= {"url": admitted.url, "reachable": True,
              "auth_hints": _hints(await ctx.catalog.visible(op.tenant_id), admitted.url)}  # fmt: skip
    try:
        photo = await mcp_client.photograph(admitted.url, {}, timeout=10, pin=admitted)
    except mcp_client.AuthRejected:
        found |= {"auth_mode": "api_key", "static_possible": True}
        found["notes"].append("the server requires credentials; tools are listed once connected")
        try:
            # The connect flow's own discovery (admitted, pinned): OAuth is offered only where it would work.
            server = (await OAuthClient(ctx.url_policy).discover(admitted.url)).authorization_server
        except OAuthClientError as err:
            found["notes"].append(f"no OAuth sign-in: {err}")
            return found
        found |= {"auth_mode": "oauth", "oauth_available": True}
        found["oauth"] = {"issuer": server.issuer, "authorization_endpoint": server.authorization_endpoint,
                          "scopes_supported": server.scopes_supported}  # fmt: skip
        return found
    except mcp_client.McpClientError as err:
        found["reachable"] = False
        found["notes"].append(str(err))
        return found
    preview = [{"name": t["name"], "description": t.get("description", "")} for t in photo.tools]
    found |= {"auth_mode": "none", "static_possible": True, "tools_preview": preview[:50],
              "tools_truncated": len(preview) > 50}  # fmt: skip
    found["notes"].append(f"negotiated MCP {photo.protocol_version}")
    return found


def slugify(name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:64].strip("-")
    if not slug:
        raise BadRequest("`name` must contain letters or digits")
    return slug


@router.post(
    "/v1/mcp/servers",
    summary="Add a custom MCP server and connect it in one call",
    response_model=out.ServerAdded,
    responses=errors(401, 403, 409, 422, 502, 503),
)
async def add_server(body: ServerIn, op: OperatorDep, ctx: ContextDep) -> dict[str, Any]:
    """Creates a custom catalog entry and a connection; a failed connect leaves no orphan entry."""
    if body.owner == "personal":
        raise BadRequest("a personal connection belongs to a signed-in user; the operator token has none")
    if body.auth_mode != "api_key":
        raise BadRequest("only api_key servers can be connected in one call today")
    if body.token is None or not body.token.get_secret_value():
        raise BadRequest("an api_key server needs a `token`")
    access = parse_access(body.access if body.access is not None else READ_ONLY)
    try:
        await ctx.url_policy.admit(body.url)
    except UrlRefused as err:
        raise BadRequest(str(err)) from None
    hints = {"header_name": body.header_name, "scheme": body.scheme}
    entry = await ctx.catalog.create_custom(
        op.tenant_id,
        {"slug": slugify(body.name), "name": body.name, "icon": body.icon, "description": body.description,
         "url": body.url, "transport": "streamable_http", "auth_mode": "api_key", "auth_hints": hints,
         "access": access},
    )  # fmt: skip
    try:
        made, snapshot = await ctx.connection_service.connect_static(
            op.tenant_id,
            base_url=body.url,
            token=body.token.get_secret_value(),
            header_name=body.header_name,
            scheme=body.scheme,
            made=Ownership(body.display_name or body.name, access=access),
        )
    except Exception:
        await ctx.catalog.delete(entry.id)
        raise
    return {"connector": entry_public(entry), "connection": public(made), "snapshot": snapshot_public(snapshot)}
