"""Managed app connections for embedding products: list apps, connect one in one call, complete the sign-in.

Every route but the provider's redirect acts for the calling account (a user's personal access token): the
connection it makes is that user's personal connection. The operator token has no account and is refused (403).
Reads accept a read-only token; ``connect`` and ``connect/complete`` need one that may write.
"""

from __future__ import annotations

import html

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from api import responses as out
from api.deps import ContextDep, Principal, PrincipalDep
from api.errors import errors, json_errors
from core.errors import BadRequest, Forbidden, Unavailable, UpstreamFailed
from integrations import mcp_client
from integrations.oauth import AuthorizationFailed, OAuthClientError
from integrations.urls import UrlRefused
from services.managed_apps import NOT_CONFIGURED, ManagedApps

router = APIRouter(prefix="/v1/mcp-oauth/catalog", tags=["managed-apps"])

NO_ACCOUNT = (
    "managed app connections belong to an account: call with a user's personal access token "
    "(the operator token has no account)"
)


class ConnectIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    redirect_url: str | None = Field(default=None, min_length=1, max_length=2048)


class CompleteIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    completion_proof: str = Field(min_length=1, max_length=512)
    expected_server_id: str | None = Field(default=None, max_length=64)


def managed_of(ctx: ContextDep) -> ManagedApps:
    managed = ctx.managed_apps
    if managed is None:
        raise Unavailable(f"{NOT_CONFIGURED} (credential storage is needed too: FLUIDBOX_CREDENTIAL_KEY)")
    managed.require_configured()
    return managed


def account(who: Principal) -> str:
    if who.user_id is None:
        raise Forbidden(NO_ACCOUNT)
    return who.user_id


def writer(who: Principal) -> str:
    user_id = account(who)
    if who.read_only:
        raise Forbidden("this token is read-only; connecting an app needs a token that may write")
    return user_id


@router.get(
    "",
    summary="Apps this deployment can connect, and whether the caller has a usable connection",
    response_model=out.ManagedApps,
    responses=errors(401, 403, 503),
)
async def apps(request: Request, who: PrincipalDep, ctx: ContextDep) -> out.ManagedApps:
    """App ids with name, icon, description, scopes and ``connected``; a read-only token may read."""
    managed = managed_of(ctx)
    user_id = account(who)
    connected = {row.app_id for row, status in await managed.statuses(who.tenant_id, user_id)
                 if status == "connected"}  # fmt: skip
    listed = await managed.apps(who.tenant_id)
    return out.ManagedApps(apps=[out.ManagedApp.of(app, connected=app.app_id in connected) for app in listed])


@router.get(
    "/connections",
    summary="The caller's app connections and their status (reads only)",
    response_model=out.ManagedAppConnections,
    responses=errors(401, 403, 503),
)
async def connections(request: Request, who: PrincipalDep, ctx: ContextDep) -> out.ManagedAppConnections:
    """``status``: connected | PROVISIONING | pending | error | revoked. Reading repairs nothing."""
    managed = managed_of(ctx)
    rows = await managed.statuses(who.tenant_id, account(who))
    return out.ManagedAppConnections(
        connections=[
            out.ManagedAppConnection(
                app_id=r.app_id, status=status, server_id=str(r.connection.id),
                connection=out.ManagedConnectionPublic.of(r.connection),
            )
            for r, status in rows
        ]
    )  # fmt: skip


@router.get(
    "/callback",
    summary="The provider's redirect back after signing in to an app (not a status endpoint)",
    response_class=HTMLResponse,
    responses={
        200: {"description": "A small 'Signed in' page (no token in it).", "content": {"text/html": {}}},
        302: {"description": "On to the client's allowed redirect_url, with app_id and a completion proof."},
        **json_errors(404, 409, 502, 503),
    },
)
async def callback(request: Request, ctx: ContextDep) -> Response:
    """Validates its own one-time state; sends the browser on to the client's ``redirect_url`` with a completion
    proof, or answers a small page. The connection becomes usable only when the account completes it."""
    managed = managed_of(ctx)
    query = dict(request.query_params)
    if "state" not in query:
        raise BadRequest(
            "this is the provider's redirect target, not a status endpoint: read "
            "GET /v1/mcp-oauth/catalog/connections for a connection's status"
        )
    try:
        target, flow = await managed.callback(query)
    except AuthorizationFailed as err:
        raise BadRequest(f"sign-in did not complete: {err}") from None
    except (OAuthClientError, UrlRefused) as err:
        raise UpstreamFailed(f"the sign-in could not be completed: {err}") from None
    headers = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"}
    if target is not None:
        return RedirectResponse(target, status_code=302, headers=headers)
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>Signed in</title></head><body>"
        f"<h1>Signed in</h1><p>{html.escape(flow.app_id)} is being set up; return to the app that sent "
        "you here. You can close this window.</p></body></html>"
    )
    return HTMLResponse(page, headers=headers)


@router.post(
    "/connect/complete",
    summary="Complete an app sign-in with its completion proof",
    response_model=out.ManagedConnectOutcome,
    response_model_exclude_unset=True,
    responses=errors(401, 403, 404, 409, 502, 503),
)
async def complete(body: CompleteIn, request: Request, who: PrincipalDep, ctx: ContextDep) -> out.ManagedConnectOutcome:
    """The proof is single use, bound to the account that started the sign-in and valid for five minutes;
    ``expected_server_id`` must name the connection it completes. A refusal changes nothing."""
    managed = managed_of(ctx)
    user_id = writer(who)
    try:
        outcome = await managed.complete(who.tenant_id, user_id, body.completion_proof, body.expected_server_id)
    except (OAuthClientError, mcp_client.McpClientError) as err:
        raise UpstreamFailed(f"the connection could not be completed: {err}") from None
    if (
        outcome.status == "connected" and outcome.connection is not None
    ):  # runs parked on this account's connection resume
        await ctx.run_control.wake_parked(who.tenant_id, outcome.connection)
    return out.ManagedConnectOutcome.of(outcome)


@router.post(
    "/{app_id}/connect",
    summary="Connect an app (idempotent)",
    response_model=out.ManagedConnectOutcome,
    response_model_exclude_unset=True,
    responses=errors(401, 403, 404, 409, 502, 503),
)
async def connect(
    app_id: str, request: Request, who: PrincipalDep, ctx: ContextDep, body: ConnectIn | None = None
) -> out.ManagedConnectOutcome:
    """``connected`` with the usable connection; ``redirect`` with the provider's ``authorization_url``; or
    ``PROVISIONING`` while a finished sign-in's setup cannot complete yet (a later call completes it)."""
    managed = managed_of(ctx)
    user_id = writer(who)
    outcome = await managed.connect(who.tenant_id, user_id, app_id, body.redirect_url if body else None)
    if outcome.status == "connected" and outcome.connection is not None:  # a held grant completed by this call
        await ctx.run_control.wake_parked(who.tenant_id, outcome.connection)
    return out.ManagedConnectOutcome.of(outcome)
