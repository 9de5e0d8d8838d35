"""Connections: one custodied credential for an MCP server, and photographs of its tools.

The credential is sealed at rest and never returned; it is unsealed only by the control plane, at
the moment it photographs the server or executes a brokered call.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from api import responses as out
from api.deps import Principal, PrincipalDep, Services, ServicesDep
from api.errors import errors
from api.views import connection_public as public
from api.views import snapshot_public
from core.errors import BadRequest, Conflict, Forbidden, NotFound
from integrations.oauth import OAuthClientError
from integrations.urls import UrlRefused

router = APIRouter(prefix="/v1/connections", tags=["connections"])

# RFC 6749 §3.3 scope-token: printable ASCII except space, double quote and backslash.
_SCOPE = re.compile(r"[\x21\x23-\x5b\x5d-\x7e]+")


class ConnectionCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    provider: str
    base_url: str = Field(min_length=1, max_length=2048)
    display_name: str | None = Field(default=None, max_length=200)
    auth_kind: Literal["static", "oauth"] = "static"
    token: SecretStr | None = None
    header_name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9-]{0,63}$")
    scheme: Literal["Bearer", "Basic", ""] = "Bearer"
    owner: Literal["organization", "personal"] = "organization"
    client_id: str | None = Field(default=None, max_length=2048)
    client_secret: SecretStr | None = None
    scopes: list[str] | None = Field(default=None, min_length=1, max_length=50)


async def visible(svc: Services, who: Principal, connection_id: str) -> dict[str, Any]:
    """The connection if the caller may see it: someone else's personal connection is 404 for
    everyone, the operator and admins included."""
    row = await svc.connections.get(who.tenant_id, connection_id)
    if row is None or (row["owner_type"] == "user" and row["owner_user_id"] != who.user_id):
        raise NotFound()
    return row


def require_manage(who: Principal, row: dict[str, Any], action: str) -> None:
    """A personal connection is managed by its owner (visibility already proved that); an
    organization connection by the operator, an admin or an owner."""
    if row["owner_type"] != "user" and not who.mutates_resources:
        raise Forbidden(f"{action} an organization connection requires the admin or owner role")


async def manageable(svc: Services, who: Principal, connection_id: str, action: str) -> dict[str, Any]:
    """The connection if the caller may see it (:func:`visible`) and manage it (:func:`require_manage`)."""
    row = await visible(svc, who, connection_id)
    require_manage(who, row, action)
    return row


@router.post(
    "",
    summary="Connect an MCP server (the credential is sealed, then the tools photographed)",
    response_model=out.ConnectionCreated,
    response_model_exclude_unset=True,
    responses=errors(401, 403, 409, 502, 503),
)
async def create_connection(body: ConnectionCreate, who: PrincipalDep, svc: ServicesDep) -> dict[str, Any]:
    """A rejected credential or a refused photograph stores nothing. ``owner: personal`` makes a
    connection only its creator can see or use (any signed-in user; never the operator)."""
    svc.connection_service.custody()
    if body.provider != "mcp_http":
        raise BadRequest(f"unsupported provider '{body.provider}' (supported: mcp_http)")
    if body.owner == "personal" and who.is_operator:
        raise BadRequest("a personal connection belongs to a signed-in user; the operator token has none")
    if body.owner == "organization" and not who.mutates_resources:
        raise Forbidden("creating an organization connection requires the admin or owner role")
    if body.auth_kind == "oauth":
        if body.token is not None:
            raise BadRequest("an oauth connection takes no `token`: it is obtained by signing in")
        if body.header_name is not None or body.scheme != "Bearer":
            raise BadRequest(
                "an oauth connection sends `Authorization: Bearer`; `header_name` and `scheme` do not apply"
            )
        if body.client_secret is not None and body.client_id is None:
            raise BadRequest("`client_secret` needs the `client_id` it was issued with")
        if body.scopes is not None and not all(_SCOPE.fullmatch(scope) for scope in body.scopes):
            raise BadRequest("`scopes` must be non-empty OAuth scope tokens (no spaces or quotes)")
        row = await svc.connection_service.connect_oauth(
            who.tenant_id,
            base_url=body.base_url,
            display_name=body.display_name,
            owner_user_id=who.user_id if body.owner == "personal" else None,
            created_by_user_id=who.user_id,
        )
        if body.client_id is not None or body.scopes:
            try:
                await svc.connection_service.oauth_connect().preregister(
                    who.tenant_id, row, client_id=body.client_id, client_secret=body.client_secret, scopes=body.scopes
                )
            except (OAuthClientError, UrlRefused) as err:
                await svc.connections.discard_pending_oauth(who.tenant_id, row["id"])
                raise BadRequest(f"cannot use this client id with this server: {err}") from None
        return {"connection": public(row), "next": f"/v1/connections/{row['id']}/oauth/start"}
    if body.client_id is not None or body.client_secret is not None or body.scopes is not None:
        raise BadRequest("`client_id`, `client_secret` and `scopes` apply to oauth connections only")
    if body.token is None or not body.token.get_secret_value():
        raise BadRequest("a static connection needs a `token`")
    row, snapshot = await svc.connection_service.connect_static(
        who.tenant_id,
        base_url=body.base_url,
        token=body.token.get_secret_value(),
        header_name=body.header_name,
        scheme=body.scheme,
        display_name=body.display_name,
        owner_user_id=who.user_id if body.owner == "personal" else None,
        created_by_user_id=who.user_id,
    )
    return {"connection": public(row), "snapshot": snapshot_public(snapshot)}


@router.post(
    "/{connection_id}/oauth/start",
    summary="Start (or redo) an OAuth connection's sign-in",
    response_model=out.GoUrl,
    responses=errors(401, 403, 404, 409, 502, 503),
)
async def oauth_start(connection_id: str, who: PrincipalDep, svc: ServicesDep) -> dict[str, Any]:
    """A one-time ``go_url`` (600 s) to open in the browser that signs in; reconnecting bumps the generation."""
    svc.connection_service.oauth_connect()
    row = await manageable(svc, who, connection_id, "connecting")
    if row["auth_kind"] != "oauth":
        raise BadRequest("this connection does not use OAuth")
    if row["status"] == "revoked":
        raise Conflict("connection is revoked")
    return {"go_url": await svc.connection_service.start_sign_in(who.tenant_id, row, who.user_id)}


@router.get("", summary="List connections", response_model=out.ConnectionList, responses=errors(401))
async def list_connections(who: PrincipalDep, svc: ServicesDep) -> dict[str, Any]:
    """Organization connections and the caller's own personal ones; never includes a secret."""
    return {"connections": [public(r) for r in await svc.connections.all(who.tenant_id, who.user_id)]}


@router.get("/{connection_id}", summary="A connection", response_model=out.ConnectionOut, responses=errors(401, 404))
async def get_connection(connection_id: str, who: PrincipalDep, svc: ServicesDep) -> dict[str, Any]:
    """404 when unknown or not visible."""
    return {"connection": public(await visible(svc, who, connection_id))}


@router.post(
    "/{connection_id}/revoke",
    summary="Revoke a connection",
    response_model=out.ConnectionOut,
    responses=errors(401, 403, 404, 409),
)
async def revoke(connection_id: str, who: PrincipalDep, svc: ServicesDep) -> dict[str, Any]:
    """The sealed credential is destroyed; in-flight runs fail closed on their next brokered call."""
    await manageable(svc, who, connection_id, "revoking")
    # An OAuth grant is also revoked at its authorization server (RFC 7009), best effort, after ours is gone.
    upstream = await svc.oauth.revocation(who.tenant_id, connection_id) if svc.oauth is not None else None
    revoked = await svc.connections.revoke(who.tenant_id, connection_id)
    svc.connection_service.evict_token(connection_id)
    if upstream is not None:
        await upstream()
    return {"connection": public(revoked)}


@router.get(
    "/{connection_id}/tools",
    summary="The latest tool snapshot",
    response_model=out.SnapshotOut,
    responses=errors(401, 404),
)
async def tools(connection_id: str, who: PrincipalDep, svc: ServicesDep) -> dict[str, Any]:
    """Names and descriptions of the photographed tools, with the snapshot's version and digest."""
    await visible(svc, who, connection_id)
    snapshot = await svc.connections.latest_snapshot(connection_id)
    if snapshot is None:
        raise NotFound()
    return {"snapshot": snapshot_public(snapshot)}


@router.post(
    "/{connection_id}/tools/refresh",
    summary="Re-photograph the server's tools",
    response_model=out.SnapshotOut,
    responses=errors(401, 403, 404, 409, 502, 503),
)
async def refresh(connection_id: str, who: PrincipalDep, svc: ServicesDep) -> dict[str, Any]:
    """Appends snapshot v+1 for future runs; runs in flight keep the snapshot they froze."""
    svc.connection_service.custody()
    row = await manageable(svc, who, connection_id, "refreshing")
    snapshot = await svc.connection_service.refresh(who.tenant_id, row)
    return {"snapshot": snapshot_public(snapshot)}
