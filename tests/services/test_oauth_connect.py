"""services.oauth_connect end to end on real parts: oidc-provider, an OAuth-protected MCP server, PostgreSQL.

The browser is played over HTTP (tests.oauth_servers.AuthorizationServer.sign_in); the order is the real one:
start (authenticated API) → open the link (sets the browser cookie) → sign in at the provider → callback.
"""

from __future__ import annotations

import asyncio
import uuid
from urllib.parse import parse_qsl, urlsplit

import pytest

from core.errors import Conflict, Forbidden
from core.tokens import token_digest
from db.connections import ConnectionRow, credential_context
from db.ids import new_id
from db.oauth import SUPERSEDED
from integrations import mcp_client
from integrations.oauth import AuthorizationFailed, OAuthClient
from integrations.sealing import Sealer
from integrations.urls import UrlPolicy
from services.context import AppContext
from services.oauth_connect import Activated, OAuthConnect
from tests.mcp_servers import RunningServer
from tests.oauth_servers import AuthorizationServer

REDIRECT_URI = "http://127.0.0.1:8787/v1/oauth/callback"
BROWSER = token_digest("the-browser-cookie")


@pytest.fixture
def service(ctx: AppContext, sealer: Sealer) -> OAuthConnect:
    policy = UrlPolicy(allow_loopback=True)
    return OAuthConnect(
        ctx.oauth_records, ctx.connections, sealer, OAuthClient(policy), policy, redirect_uri=REDIRECT_URI
    )


async def oauth_connection(ctx: AppContext, tenant: str, url: str) -> ConnectionRow:
    cid = new_id()
    async with ctx.pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO integration_connections (id, tenant_id, provider, display_name, base_url, auth_kind, status) "
            "VALUES ($1, $2, 'mcp_http', 'protected', $3, 'oauth', 'pending')",
            uuid.UUID(cid),
            uuid.UUID(tenant),
            url,
        )
    row = await ctx.connections.get(tenant, cid)
    assert row is not None
    return row


async def signed_in(
    service: OAuthConnect, auth: AuthorizationServer, tenant: str, connection: ConnectionRow, browser: str = BROWSER
) -> dict[str, str]:
    """Start a flow, open its link in ``browser``, sign in; returns the callback's query."""
    started = await service.start(tenant, connection)
    await service.open(started.flow_id, browser)
    landed = await auth.sign_in(started.authorization_url)
    assert landed.startswith(REDIRECT_URI), landed
    return dict(parse_qsl(urlsplit(landed).query))


async def test_connecting_activates_the_connection_with_a_sealed_grant_and_a_photograph(
    service: OAuthConnect, auth: AuthorizationServer, mcp: RunningServer, ctx: AppContext, sealer: Sealer, tenant: str
) -> None:
    connection = await oauth_connection(ctx, tenant, mcp.url)
    done = await service.complete(await signed_in(service, auth, tenant, connection), BROWSER)

    assert done.connection.status == "active" and done.connection.authorization_generation == 1
    assert [t["name"] for t in done.snapshot.tools_json] == ["add", "echo"]
    async with ctx.pool.acquire() as conn:
        row = await conn.fetchrow(
            "SELECT credential_sealed, oauth FROM integration_connections WHERE id = $1",
            connection.id,
        )
    refresh = sealer.open(bytes(row["credential_sealed"]), context=credential_context(tenant)).decode()
    assert done.tokens.refresh_token is not None and refresh == done.tokens.refresh_token.get_secret_value()
    assert row["oauth"]["issuer"] == auth.issuer and row["oauth"]["resource"] == mcp.url
    assert refresh not in str(row["oauth"])
    # The grant really opens the server.
    headers = {"Authorization": f"Bearer {done.tokens.access_token.get_secret_value()}"}
    assert (await mcp_client.photograph(mcp.url, headers)).tools


async def test_a_callback_from_another_browser_is_refused_without_burning_the_flow(
    service: OAuthConnect, auth: AuthorizationServer, mcp: RunningServer, ctx: AppContext, tenant: str
) -> None:
    connection = await oauth_connection(ctx, tenant, mcp.url)
    query = await signed_in(service, auth, tenant, connection)
    with pytest.raises(Forbidden, match="another browser"):
        await service.complete(query, token_digest("someone-else"))
    with pytest.raises(Forbidden):
        await service.complete(query, None)
    done = await service.complete(query, BROWSER)
    assert done.connection.status == "active"


async def test_a_replayed_callback_is_refused(
    service: OAuthConnect, auth: AuthorizationServer, mcp: RunningServer, ctx: AppContext, tenant: str
) -> None:
    connection = await oauth_connection(ctx, tenant, mcp.url)
    query = await signed_in(service, auth, tenant, connection)
    await service.complete(query, BROWSER)
    with pytest.raises(Conflict, match="already completed"):
        await service.complete(query, BROWSER)


async def test_the_tenants_registration_is_reused_for_every_connection_to_that_server(
    service: OAuthConnect, auth: AuthorizationServer, mcp: RunningServer, ctx: AppContext, tenant: str
) -> None:
    for _ in range(2):
        connection = await oauth_connection(ctx, tenant, mcp.url)
        await service.complete(await signed_in(service, auth, tenant, connection), BROWSER)
    async with ctx.pool.acquire() as conn:
        count = await conn.fetchval(
            "SELECT count(*) FROM oauth_client_registrations WHERE tenant_id = $1", uuid.UUID(tenant)
        )
    assert count == 1


async def test_of_two_concurrent_reauthorizations_exactly_one_wins(
    service: OAuthConnect, auth: AuthorizationServer, mcp: RunningServer, ctx: AppContext, tenant: str
) -> None:
    connection = await oauth_connection(ctx, tenant, mcp.url)
    first = await signed_in(service, auth, tenant, connection)
    second = await signed_in(service, auth, tenant, connection)
    outcomes = await asyncio.gather(
        service.complete(first, BROWSER), service.complete(second, BROWSER), return_exceptions=True
    )
    assert sum(isinstance(o, Activated) for o in outcomes) == 1, outcomes
    [loser] = [o for o in outcomes if not isinstance(o, Activated)]
    assert isinstance(loser, Conflict) and loser.message == SUPERSEDED


async def test_reconnecting_bumps_the_generation(
    service: OAuthConnect, auth: AuthorizationServer, mcp: RunningServer, ctx: AppContext, tenant: str
) -> None:
    connection = await oauth_connection(ctx, tenant, mcp.url)
    await service.complete(await signed_in(service, auth, tenant, connection), BROWSER)
    current = await ctx.connections.get(tenant, str(connection.id))
    assert current is not None
    again = await service.complete(await signed_in(service, auth, tenant, current), BROWSER)
    assert again.connection.authorization_generation == 2
    assert (again.snapshot.snapshot_version, again.snapshot.authorization_generation) == (2, 2)


async def test_a_refused_consent_leaves_the_connection_pending(
    service: OAuthConnect, auth: AuthorizationServer, mcp: RunningServer, ctx: AppContext, tenant: str
) -> None:
    connection = await oauth_connection(ctx, tenant, mcp.url)
    started = await service.start(tenant, connection)
    await service.open(started.flow_id, BROWSER)
    landed = await auth.sign_in(started.authorization_url, approve=False)
    with pytest.raises(AuthorizationFailed, match="refused"):
        await service.complete(dict(parse_qsl(urlsplit(landed).query)), BROWSER)
    after = await ctx.connections.get(tenant, str(connection.id))
    assert after is not None and after.status == "pending"
