"""Connector OAuth: the browser legs (unauthenticated by design; the one-time flow and its cookie are the proof).

``POST /v1/connections/{id}/oauth/start`` (in :mod:`api.routes.connections`) records a flow and answers a
``go_url`` whose ``f`` is the flow id and the authorization URL sealed together, so the URL (it carries ``state``)
never sits in our database and a forged link cannot be opened. ``/go`` binds the flow to this browser's cookie
and redirects to the authorization server; ``/callback`` finishes the flow only from that browser.

The cookie is always ``__Host-fbx_oauth_flow``: ``Secure``, ``HttpOnly``, ``Path=/`` and no ``Domain``, as the
prefix requires. A browser keeps a ``Secure`` cookie only from a secure context: https, or plain http on a
loopback host (``localhost``, ``*.localhost``, ``127.0.0.0/8``, ``[::1]``), which browsers treat as secure. So a
loopback development deployment signs in over http, and a public URL that is plain http on any other host cannot
finish a sign-in: ``/go`` says so (400) before it binds anything. It is ``SameSite=Lax`` so the authorization
server's top-level redirect back to the callback carries it. A browser keeps one cookie value for all its flows.
"""

from __future__ import annotations

import html
import ipaddress
import secrets
from urllib.parse import urlsplit

from fastapi import APIRouter, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse

from api import responses as out
from api.deps import ContextDep
from api.errors import errors, json_errors
from core.errors import BadRequest, NotFound, UpstreamFailed
from core.tokens import token_digest
from integrations import mcp_client
from integrations.oauth import (
    AuthorizationFailed,
    EndpointRefused,
    OAuthClientError,
    client_metadata_document,
    client_metadata_document_url,
)
from integrations.urls import UrlRefused
from services.context import AppContext
from services.oauth_connect import OAuthConnect

router = APIRouter(tags=["oauth"])

COOKIE = "__Host-fbx_oauth_flow"
COOKIE_MAX_AGE = 600  # the flow's own lifetime
INSECURE_ORIGIN = (
    "this sign-in cannot finish here: the control plane's public URL ({base}) is plain http on a host that is not "
    "loopback, and a browser keeps the sign-in's Secure cookie (__Host-fbx_oauth_flow) only from https (or http on "
    "localhost / 127.0.0.1 / [::1]); set FLUIDBOX_PUBLIC_URL to the https URL browsers reach it at"
)


def oauth_of(ctx: AppContext) -> OAuthConnect:
    return ctx.connection_service.oauth_connect()


def secure_context(url: str) -> bool:
    """Whether browsers treat pages from ``url`` as a secure context (W3C Secure Contexts, "potentially
    trustworthy"): https, or http on a loopback host. Only such an origin can set a ``Secure`` cookie."""
    parts = urlsplit(url)
    if parts.scheme == "https":
        return True
    host = (parts.hostname or "").lower()
    if parts.scheme != "http" or not host:
        return False
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _open_go(ctx: AppContext, f: str) -> tuple[str, str]:
    return ctx.connection_service.open_sign_in_link(f)


@router.get(
    "/v1/oauth/go",
    summary="Open a connector sign-in link: bind it to this browser, go to the provider",
    response_class=RedirectResponse,
    status_code=302,
    responses={302: {"description": "To the authorization server, with the flow cookie set."}, **errors(404, 409, 503)},
)
async def go(f: str, request: Request, ctx: ContextDep) -> RedirectResponse:
    """Sets the flow cookie and redirects (302) to the authorization server; a used or expired link is refused,
    and so (400, nothing bound) is an authorization endpoint the outbound admission refuses now, or a public URL
    no browser would keep the flow cookie from (plain http on a host that is not loopback)."""
    oauth = oauth_of(ctx)
    if not secure_context(ctx.public_base):
        raise BadRequest(INSECURE_ORIGIN.format(base=ctx.public_base))
    flow_id, url = _open_go(ctx, f)
    try:
        # Admitted when the flow was made; again now, as its name may resolve elsewhere since.
        await oauth.client.admit_sign_in_page(url)
    except EndpointRefused as err:
        raise BadRequest(f"this sign-in cannot continue: {err}") from None
    browser = request.cookies.get(COOKIE) or secrets.token_urlsafe(32)
    await oauth.open(flow_id, token_digest(browser))
    response = RedirectResponse(url, status_code=302)
    response.set_cookie(COOKIE, browser, max_age=COOKIE_MAX_AGE, path="/", secure=True, httponly=True, samesite="lax")
    response.headers["Cache-Control"] = "no-store"
    response.headers["Referrer-Policy"] = "no-referrer"
    return response


@router.get(
    "/v1/oauth/callback",
    summary="The authorization server's redirect back: finish the connection",
    response_class=HTMLResponse,
    responses={
        200: {"description": "A small 'Connected' page (no token in it).", "content": {"text/html": {}}},
        **json_errors(404, 409, 502, 503),
    },
)
async def callback(request: Request, ctx: ContextDep) -> HTMLResponse:
    """Consumes the flow once, from the browser that opened it; answers a small HTML page (no token in it)."""
    oauth = oauth_of(ctx)
    browser = request.cookies.get(COOKIE)
    try:
        done = await oauth.complete(dict(request.query_params), token_digest(browser) if browser else None)
    except AuthorizationFailed as err:
        raise BadRequest(f"sign-in did not complete: {err}") from None
    except (OAuthClientError, mcp_client.McpClientError, UrlRefused) as err:
        raise UpstreamFailed(f"the connection could not be completed: {err}") from None
    if ctx.access_tokens is not None:
        ctx.access_tokens.evict(str(done.connection.id))
    # Runs parked on this connection (or on its URL) resume: each re-checks the live row itself.
    await ctx.run_control.wake_parked(str(done.connection.tenant_id), done.connection)
    name = html.escape(done.connection.display_name or "the server")
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>Connected</title></head><body>"
        f"<h1>Connected</h1><p>{name} is connected ({len(done.snapshot.tools_json)} tools). "
        "You can close this window.</p></body></html>"
    )
    return HTMLResponse(page, headers={"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"})


@router.get(
    "/.well-known/fluidbox-client.json",
    summary="Our OAuth Client ID Metadata Document",
    response_model=out.ClientMetadataDocument,
    responses={
        200: {"description": "The Client ID Metadata Document (its URL is this deployment's OAuth client_id)."},
        **errors(404),
    },
)
async def client_document(response: Response, ctx: ContextDep) -> out.ClientMetadataDocument:
    """Served only when the public URL is https and not loopback (an authorization server must fetch it)."""
    if client_metadata_document_url(ctx.public_base) is None:
        raise NotFound()
    response.headers["Cache-Control"] = "public, max-age=300"
    return out.ClientMetadataDocument.model_validate(client_metadata_document(ctx.public_base))
