"""Connections: one custodied credential for an MCP server, and photographs of its tools.

The credential is sealed at rest and never returned; it is unsealed only by the control plane, at
the moment it photographs the server or executes a brokered call.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from api import responses as out
from api.deps import ContextDep, Principal, PrincipalDep
from api.errors import errors
from core.access import parse_access
from core.connection_drafts import ConnectionDraft
from core.errors import BadRequest, Forbidden, NotFound, found
from db.connections import ConnectionRow
from services.connections import unavailable
from services.context import AppContext

router = APIRouter(prefix="/v1/connections", tags=["connections"])

# Only ``…_MCP_TOKEN`` variables, never the control plane's own (FLUIDBOX_*): a connection must not be able to
# send the credential key or the LLM key to a server.
ENV_VAR = r"^[A-Z][A-Z0-9_]{0,100}_MCP_TOKEN$"


def _not_ours(var: str | None) -> str | None:
    if var is not None and var.startswith("FLUIDBOX_"):
        raise ValueError("`credential_env` cannot name a FLUIDBOX_ variable")
    return var


class ConnectionCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    provider: str | None = None
    # Which provider speaks to the server (docs/api.md "Transports"); ``provider`` may name it too.
    transport: Literal["mcp_http", "openapi", "http", "stdio", "relay", "sandbox_cli", "git"] | None = None
    transport_config: dict[str, Any] | None = None
    base_url: str | None = Field(default=None, min_length=1, max_length=2048)
    display_name: str | None = Field(default=None, max_length=200)
    auth_kind: Literal["static", "oauth"] = "static"
    token: SecretStr | None = None
    header_name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9-]{0,63}$")
    scheme: Literal["Bearer", "Basic", ""] = "Bearer"
    owner: Literal["organization", "personal"] = "organization"
    client_id: str | None = Field(default=None, max_length=2048)
    client_secret: SecretStr | None = None
    scopes: list[str] | None = Field(default=None, min_length=1, max_length=50)
    access: Any = Field(
        default=None,
        description="Which tools read and which write: `{read: {tools: [globs]} | true | false, write: "
        "{tools: [globs], approval: always|policy} | false}`. Omitted: no tool is classified, so none is callable "
        "(an OpenAPI or HTTP operation keeps its method's class).",
    )
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=64)  # a sandbox_cli connection's tools
    credential_env: str | None = Field(
        default=None,
        pattern=ENV_VAR,
        description="Take the static credential from this environment variable of the control plane "
        "(`<PROVIDER>_MCP_TOKEN`) instead of `token`: configuration, never stored; unset → `Missing <VAR>`.",
    )
    _env = field_validator("credential_env")(classmethod(lambda cls, v: _not_ours(v)))


class ConnectionPatch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    access: Any = Field(description="The new access declaration (replaces the old one; future runs only).")


class CredentialReplace(BaseModel):
    model_config = ConfigDict(extra="forbid")
    token: SecretStr | None = None
    credential_env: str | None = Field(default=None, pattern=ENV_VAR)
    _env = field_validator("credential_env")(classmethod(lambda cls, v: _not_ours(v)))


async def visible(ctx: AppContext, who: Principal, connection_id: str) -> ConnectionRow:
    """The connection if the caller may see it: someone else's personal connection is 404 for
    everyone, the operator and admins included."""
    row = await ctx.connections.get(who.tenant_id, connection_id)
    if row is None or (row.owner_type == "user" and str(row.owner_user_id) != who.user_id):
        raise NotFound()
    return row


def require_manage(who: Principal, row: ConnectionRow, action: str) -> None:
    """A personal connection is managed by its owner (visibility already proved that); an
    organization connection by the operator, an admin or an owner."""
    if row.owner_type != "user" and not who.mutates_resources:
        raise Forbidden(f"{action} an organization connection requires the admin or owner role")


async def manageable(ctx: AppContext, who: Principal, connection_id: str, action: str) -> ConnectionRow:
    """The connection if the caller may see it (:func:`visible`) and manage it (:func:`require_manage`)."""
    row = await visible(ctx, who, connection_id)
    require_manage(who, row, action)
    return row


@router.post(
    "",
    summary="Connect a server over MCP, OpenAPI, HTTP endpoints or stdio MCP (credential sealed, tools photographed)",
    response_model=out.ConnectionCreated,
    response_model_exclude_unset=True,
    responses=errors(401, 403, 409, 422, 502, 503),
)
async def create_connection(body: ConnectionCreate, who: PrincipalDep, ctx: ContextDep) -> out.ConnectionCreated:
    """A rejected credential or a refused photograph stores nothing. ``owner: personal`` makes a
    connection only its creator can see or use (any signed-in user; never the operator). A usable new
    connection wakes every run parked for a connection to its URL, whatever its transport."""
    row, snapshot = await ctx.connection_service.create(who, ConnectionDraft(**dict(body)))
    connection = out.ConnectionPublic.of(row)
    if snapshot is None:  # a pending oauth connection: usable after its first sign-in
        return out.ConnectionCreated(connection=connection, next=f"/v1/connections/{row.id}/oauth/start")
    await ctx.run_control.wake_parked(who.tenant_id, row)
    return out.ConnectionCreated(connection=connection, snapshot=out.SnapshotPublic.of(snapshot))


@router.get(
    "/authorize",
    summary="Start or poll a connection's authorization",
    response_model=out.ConnectionAuthorize,
    response_model_exclude_none=True,
    responses=errors(401, 403, 404, 409, 502, 503),
)
async def authorize(
    who: PrincipalDep,
    ctx: ContextDep,
    connection: str = Query(min_length=1, max_length=128, description="A connection id or a catalog slug."),
    owner: Literal["organization", "personal"] = "organization",
) -> out.ConnectionAuthorize:
    """``connected``; ``authorize`` with the sign-in ``url`` (a pending flow's link is reused, so calling
    again mints no new flow and doubles as a poll); or 409 ``{status: "unavailable", reason}``.

    A read-only token polls only: ``connected`` and ``unavailable`` as for anyone, but 403 where the answer
    would make a connection or hand out a sign-in link (a bearer link: whoever opens it connects the account
    they sign in with), since a GET must not do what the token could not do otherwise."""
    if owner == "personal" and who.user_id is None:
        raise unavailable("a personal connection needs a signed-in user; the operator token has none")
    try:
        uuid.UUID(connection)
    except ValueError:
        entry = found(await ctx.catalog.get(who.tenant_id, connection))
        row = await ctx.connection_service.for_catalog_entry(who, entry, owner)
    else:
        row = await visible(ctx, who, connection)
    require_manage(who, row, "authorizing")
    state = await ctx.connection_service.authorize(who.tenant_id, row, who.user_id, signs_in=not who.read_only)
    return out.ConnectionAuthorize.model_validate(state)


@router.put(
    "/{connection_id}/credential",
    summary="Give a static connection a new credential",
    response_model=out.ConnectionCreated,
    response_model_exclude_unset=True,
    responses=errors(401, 403, 404, 409, 502, 503),
)
async def replace_credential(
    connection_id: str, body: CredentialReplace, who: PrincipalDep, ctx: ContextDep
) -> out.ConnectionCreated:
    """Photographed with the new credential first (a rejected one changes nothing), then sealed: the connection
    is active again (also after a revocation) at the next authorization generation, and every run parked on it
    resumes. Runs bound under the old generation that do not park fail closed."""
    if (body.token is None or not body.token.get_secret_value()) == (body.credential_env is None):
        raise BadRequest("give exactly one of `token` or `credential_env`")
    row = await visible(ctx, who, connection_id)
    require_manage(who, row, "changing the credential of")
    updated, snapshot = await ctx.connection_service.replace_credential(
        who,
        row,
        token=body.token.get_secret_value() if body.token else None,
        credential_env=body.credential_env,
    )
    await ctx.run_control.wake_parked(who.tenant_id, updated)
    return out.ConnectionCreated(connection=out.ConnectionPublic.of(updated), snapshot=out.SnapshotPublic.of(snapshot))


@router.post(
    "/{connection_id}/oauth/start",
    summary="Start (or redo) an OAuth connection's sign-in",
    response_model=out.GoUrl,
    responses=errors(401, 403, 404, 409, 502, 503),
)
async def oauth_start(connection_id: str, who: PrincipalDep, ctx: ContextDep) -> out.GoUrl:
    """A one-time ``go_url`` (600 s) to open in the browser that signs in; reconnecting bumps the generation."""
    ctx.connection_service.oauth_connect()
    row = await manageable(ctx, who, connection_id, "connecting")
    return out.GoUrl(go_url=await ctx.connection_service.start_sign_in(who.tenant_id, row, who.user_id))


@router.get("", summary="List connections", response_model=out.ConnectionList, responses=errors(401))
async def list_connections(who: PrincipalDep, ctx: ContextDep) -> out.ConnectionList:
    """Organization connections and the caller's own personal ones; never includes a secret."""
    rows = await ctx.connections.all(who.tenant_id, who.user_id)
    return out.ConnectionList(connections=[out.ConnectionPublic.of(r) for r in rows])


@router.get("/{connection_id}", summary="A connection", response_model=out.ConnectionOut, responses=errors(401, 404))
async def get_connection(connection_id: str, who: PrincipalDep, ctx: ContextDep) -> out.ConnectionOut:
    """404 when unknown or not visible."""
    return out.ConnectionOut(connection=out.ConnectionPublic.of(await visible(ctx, who, connection_id)))


@router.patch(
    "/{connection_id}",
    summary="Edit a connection's tool access classes",
    response_model=out.ConnectionOut,
    responses=errors(401, 403, 404, 422),
)
async def edit_connection(
    connection_id: str, body: ConnectionPatch, who: PrincipalDep, ctx: ContextDep
) -> out.ConnectionOut:
    """Replaces ``access`` (422 naming the problem when malformed); runs already bound keep the classes
    they froze. Enabling writes on a catalog connection is this explicit edit."""
    await manageable(ctx, who, connection_id, "editing")
    access = parse_access(body.access)
    edited = await ctx.connections.set_access(who.tenant_id, connection_id, access)
    return out.ConnectionOut(connection=out.ConnectionPublic.of(edited))


@router.post(
    "/{connection_id}/revoke",
    summary="Revoke a connection",
    response_model=out.ConnectionOut,
    responses=errors(401, 403, 404, 409),
)
async def revoke(connection_id: str, who: PrincipalDep, ctx: ContextDep) -> out.ConnectionOut:
    """The sealed credential is destroyed; in-flight runs fail closed on their next brokered call."""
    await manageable(ctx, who, connection_id, "revoking")
    revoked = await ctx.connection_service.revoke(who.tenant_id, connection_id)
    return out.ConnectionOut(connection=out.ConnectionPublic.of(revoked))


@router.get(
    "/{connection_id}/tools",
    summary="The latest tool snapshot",
    response_model=out.SnapshotOut,
    responses=errors(401, 404),
)
async def tools(connection_id: str, who: PrincipalDep, ctx: ContextDep) -> out.SnapshotOut:
    """Names and descriptions of the photographed tools, with the snapshot's version and digest; each
    tool with its access class under the connection's declaration and whether new runs may bind it
    (``review: approved``) or it is quarantined until an admin approves its change (``pending``)."""
    row = await visible(ctx, who, connection_id)
    snapshot = found(await ctx.connections.latest_snapshot(connection_id))
    reviews = await ctx.connection_service.tool_reviews(row, snapshot)
    return out.SnapshotOut(snapshot=out.SnapshotPublic.of(snapshot, reviews=reviews))


@router.post(
    "/{connection_id}/tools/refresh",
    summary="Re-photograph the server's tools",
    response_model=out.SnapshotOut,
    responses=errors(401, 403, 404, 409, 502, 503),
)
async def refresh(connection_id: str, who: PrincipalDep, ctx: ContextDep) -> out.SnapshotOut:
    """Appends snapshot v+1 for future runs; runs in flight keep the snapshot they froze."""
    ctx.connection_service.custody()
    row = await manageable(ctx, who, connection_id, "refreshing")
    snapshot = await ctx.connection_service.refresh(who.tenant_id, row)
    reviews = await ctx.connection_service.tool_reviews(row, snapshot)
    return out.SnapshotOut(snapshot=out.SnapshotPublic.of(snapshot, reviews=reviews))


@router.get(
    "/{connection_id}/tools/changes",
    summary="Tool definitions awaiting review (and past reviews)",
    response_model=out.ToolChangeList,
    responses=errors(401, 404, 422),
)
async def tool_changes(
    connection_id: str,
    who: PrincipalDep,
    ctx: ContextDep,
    status: Literal["pending", "approved", "rejected", "superseded"] | None = None,
) -> out.ToolChangeList:
    """A refresh that photographs a new tool, or a changed description or input schema, quarantines that
    tool (new runs do not bind it) until an admin approves its change here. Newest first, each with a
    unified diff of the approved and the proposed definition."""
    await visible(ctx, who, connection_id)
    changes = await ctx.connections.tool_changes(connection_id, status)
    return out.ToolChangeList(changes=[out.ToolChangePublic.of(c) for c in changes])


async def _decide_change(
    connection_id: str, change_id: str, decision: str, who: Principal, ctx: AppContext
) -> out.ToolChangeOut:
    await manageable(ctx, who, connection_id, "reviewing tool changes of")
    change = await ctx.connection_service.decide_tool_change(who, connection_id, change_id, decision)
    return out.ToolChangeOut(change=out.ToolChangePublic.of(change))


@router.post(
    "/{connection_id}/tools/changes/{change_id}/approve",
    summary="Approve a tool's new definition (new runs bind it again)",
    response_model=out.ToolChangeOut,
    responses=errors(401, 403, 404, 409),
)
async def approve_change(connection_id: str, change_id: str, who: PrincipalDep, ctx: ContextDep) -> out.ToolChangeOut:
    """Recorded with who and when (and in the audit log); 409 when the change is no longer pending
    (decided already, or superseded by a newer refresh)."""
    return await _decide_change(connection_id, change_id, "approved", who, ctx)


@router.post(
    "/{connection_id}/tools/changes/{change_id}/reject",
    summary="Reject a tool's new definition (it stays quarantined)",
    response_model=out.ToolChangeOut,
    responses=errors(401, 403, 404, 409),
)
async def reject_change(connection_id: str, change_id: str, who: PrincipalDep, ctx: ContextDep) -> out.ToolChangeOut:
    """Recorded with who and when; the tool stays out of new runs until the server lists its approved
    definition again or a later change is approved."""
    return await _decide_change(connection_id, change_id, "rejected", who, ctx)
