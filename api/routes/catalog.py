"""The connector catalog, the non-committing probe, and one-call custom server connect."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from api import responses as out
from api.deps import ContextDep, OperatorDep
from api.errors import errors
from core.connection_drafts import PERSONAL_NEEDS_USER
from core.errors import BadRequest, found
from services.catalog import EntryConnect, NewServer

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


@router.get(
    "/v1/catalog", summary="Curated and custom connectors", response_model=out.CatalogList, responses=errors(401, 403)
)
async def catalog(op: OperatorDep, ctx: ContextDep) -> out.CatalogList:
    """Each entry with the connection that covers it (if any), the newest bundle named after its slug (if
    any) and whether it can be connected now."""
    listed = await ctx.catalog_service.listing(op.tenant_id)
    return out.CatalogList(connectors=[out.CatalogListed.of_listing(entry) for entry in listed])


@router.get(
    "/v1/catalog/{slug}",
    summary="One catalog entry",
    response_model=out.CatalogEntryOut,
    responses=errors(401, 403, 404),
)
async def catalog_entry(slug: str, op: OperatorDep, ctx: ContextDep) -> out.CatalogEntryOut:
    """404 when unknown or another tenant's custom entry."""
    return out.CatalogEntryOut(connector=out.CatalogEntryPublic.of(found(await ctx.catalog.get(op.tenant_id, slug))))


@router.post(
    "/v1/catalog",
    summary="Add a custom catalog entry (tier custom)",
    response_model=out.CatalogEntryOut,
    responses=errors(401, 403, 409, 422),
)
async def create_entry(body: CatalogEntryIn, op: OperatorDep, ctx: ContextDep) -> out.CatalogEntryOut:
    """Tenant-scoped; a slug already used (globally or by this tenant) is a 409; a stdio entry needs a
    ``sandbox_launch`` with declared tools (400); a relay entry an https URL and ``auth_mode: api_key``, a
    sandbox_cli entry a ``sandbox-cli://`` URL, ``auth_mode: none`` and its tools (400 naming the problem).
    A ``transport_config`` its transport cannot use (stdio, openapi, http) or a bad ``access`` declaration is
    422, as on ``POST /v1/connections``."""
    entry = await ctx.catalog_service.add_entry(op.tenant_id, body.model_dump())
    return out.CatalogEntryOut(connector=out.CatalogEntryPublic.of(entry))


@router.post(
    "/v1/catalog/{slug}/connect",
    summary="Connect a catalog entry",
    response_model=out.CatalogConnected,
    response_model_exclude_unset=True,
    responses=errors(401, 403, 404, 409, 502, 503),
)
async def connect_entry(slug: str, body: ConnectIn, op: OperatorDep, ctx: ContextDep) -> out.CatalogConnected:
    """api_key → a sealed, photographed connection; an in-image server → a sandbox capability bundle."""
    entry = found(await ctx.catalog.get(op.tenant_id, slug))
    if body.owner == "personal":
        raise BadRequest(PERSONAL_NEEDS_USER)
    done = await ctx.catalog_service.connect(op.tenant_id, entry, EntryConnect(**body.model_dump(exclude={"owner"})))
    return out.CatalogConnected.of(done)


@router.post(
    "/v1/mcp/probe",
    summary="Detect a URL's auth mode and preview its tools (stores nothing)",
    response_model=out.Probe,
    responses=errors(401, 403),
)
async def probe(body: ProbeIn, op: OperatorDep, ctx: ContextDep) -> out.Probe:
    """A URL the admission refuses, or a server that does not answer, is ``reachable: false`` with the reason
    in ``notes`` (a probe is a question, not a change: 200 either way); nothing is ever stored."""
    return out.Probe.of(await ctx.catalog_service.probe(op.tenant_id, body.url))


@router.post(
    "/v1/mcp/servers",
    summary="Add a custom MCP server and connect it in one call",
    response_model=out.ServerAdded,
    responses=errors(401, 403, 409, 422, 502, 503),
)
async def add_server(body: ServerIn, op: OperatorDep, ctx: ContextDep) -> out.ServerAdded:
    """Creates a custom catalog entry and a connection; a failed connect leaves no orphan entry."""
    if body.owner == "personal":
        raise BadRequest(PERSONAL_NEEDS_USER)
    entry, row, snapshot = await ctx.catalog_service.add_server(
        op.tenant_id, NewServer(**body.model_dump(exclude={"owner"}))
    )
    return out.ServerAdded(
        connector=out.CatalogEntryPublic.of(entry),
        connection=out.ConnectionPublic.of(row),
        snapshot=out.SnapshotPublic.of(snapshot),
    )
