"""services.oauth_tokens on real parts: oidc-provider (60 s access tokens, rotating refresh tokens), an
OAuth-protected MCP server, PostgreSQL. The 300 s refresh margin makes every 60 s token due at once; a zero margin
makes it fresh."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest
from pydantic import SecretStr

from core.errors import Conflict, NotFound
from db.connections import credential_context
from integrations import mcp_client
from integrations.oauth import OAuthClient
from integrations.sealing import Sealer
from integrations.urls import UrlPolicy
from services.context import AppContext
from services.oauth_connect import Activated, OAuthConnect
from services.oauth_tokens import AccessTokens, GrantLost
from tests.mcp_servers import RunningServer
from tests.oauth_servers import AuthorizationServer
from tests.services.test_oauth_connect import BROWSER, REDIRECT_URI, oauth_connection, signed_in

POLICY = UrlPolicy(allow_loopback=True)


@pytest.fixture
def connect(ctx: AppContext, sealer: Sealer) -> OAuthConnect:
    return OAuthConnect(
        ctx.oauth_records, ctx.connections, sealer, OAuthClient(POLICY), POLICY, redirect_uri=REDIRECT_URI
    )


async def connected(
    connect: OAuthConnect, auth: AuthorizationServer, mcp: RunningServer, ctx: AppContext, tenant: str
) -> Activated:
    connection = await oauth_connection(ctx, tenant, mcp.url)
    return await connect.complete(await signed_in(connect, auth, tenant, connection), BROWSER)


def tokens(ctx: AppContext, sealer: Sealer, **kw: object) -> AccessTokens:
    return AccessTokens(ctx.oauth_records, sealer, OAuthClient(POLICY), **kw)  # type: ignore[arg-type]


def bearer(token: SecretStr) -> dict[str, str]:
    return {"Authorization": f"Bearer {token.get_secret_value()}"}


async def refresh_requests(auth: AuthorizationServer) -> int:
    return sum(
        1 for r in await auth.requests() if r["route"] == "token" and r["params"].get("grant_type") == "refresh_token"
    )


async def stored_refresh(ctx: AppContext, sealer: Sealer, tenant: str, connection_id: str) -> str:
    async with ctx.pool.acquire() as conn:
        blob = await conn.fetchval(
            "SELECT credential_sealed FROM integration_connections WHERE id = $1", uuid.UUID(connection_id)
        )
    return sealer.open(bytes(blob), context=credential_context(tenant)).decode()


async def test_a_fresh_access_token_is_served_without_asking_the_provider(
    connect: OAuthConnect, auth: AuthorizationServer, mcp: RunningServer, ctx: AppContext, sealer: Sealer, tenant: str
) -> None:
    done = await connected(connect, auth, mcp, ctx, tenant)
    await auth.clear_requests()
    access = tokens(ctx, sealer, margin=timedelta(0))
    cid = str(done.connection.id)
    first = await access.get(tenant, cid, 1)
    assert first.get_secret_value() == done.tokens.access_token.get_secret_value()
    assert (await access.get(tenant, cid, 1)) == first
    assert await refresh_requests(auth) == 0
    assert (await mcp_client.photograph(mcp.url, bearer(first))).tools


async def test_a_token_inside_the_margin_is_refreshed_and_the_rotated_refresh_token_stored(
    connect: OAuthConnect, auth: AuthorizationServer, mcp: RunningServer, ctx: AppContext, sealer: Sealer, tenant: str
) -> None:
    done = await connected(connect, auth, mcp, ctx, tenant)
    cid = str(done.connection.id)
    before = await stored_refresh(ctx, sealer, tenant, cid)
    await auth.clear_requests()

    fresh = await tokens(ctx, sealer).get(tenant, cid, 1)
    assert fresh.get_secret_value() != done.tokens.access_token.get_secret_value()
    assert await refresh_requests(auth) == 1
    after = await stored_refresh(ctx, sealer, tenant, cid)
    assert after != before  # rotated, and the new one is what the next refresh will present
    assert (await mcp_client.photograph(mcp.url, bearer(fresh))).tools

    # Another process (its own cache) finds the stored token when it has enough time left.
    other = await tokens(ctx, sealer, margin=timedelta(0)).get(tenant, cid, 1)
    assert other == fresh and await refresh_requests(auth) == 1


async def test_concurrent_callers_across_processes_refresh_once(
    connect: OAuthConnect, auth: AuthorizationServer, mcp: RunningServer, ctx: AppContext, sealer: Sealer, tenant: str
) -> None:
    done = await connected(connect, auth, mcp, ctx, tenant)
    cid = str(done.connection.id)
    async with ctx.pool.acquire() as conn:  # the stored access token has expired
        await conn.execute(
            "UPDATE integration_connections SET access_expires_at = now() - interval '1 hour' WHERE id = $1",
            uuid.UUID(cid),
        )
    await auth.clear_requests()
    # Five "processes" (caches of their own): the first to take the row lock refreshes, the others find its token.
    results = await asyncio.gather(*(tokens(ctx, sealer, margin=timedelta(0)).get(tenant, cid, 1) for _ in range(5)))
    assert len({r.get_secret_value() for r in results}) == 1
    assert await refresh_requests(auth) == 1


async def test_refreshes_serialize_so_a_rotated_refresh_token_is_never_presented_twice(
    connect: OAuthConnect, auth: AuthorizationServer, mcp: RunningServer, ctx: AppContext, sealer: Sealer, tenant: str
) -> None:
    done = await connected(connect, auth, mcp, ctx, tenant)
    cid = str(done.connection.id)
    await auth.clear_requests()
    # With the 300 s margin every 60 s token is due, so every caller refreshes. Under the row lock each presents
    # the refresh token the previous one stored; had two presented the same one, oidc-provider would have revoked
    # the whole grant (reuse detection) and the connection would be in error.
    results = await asyncio.gather(*(tokens(ctx, sealer).get(tenant, cid, 1) for _ in range(5)))
    assert len({r.get_secret_value() for r in results}) == 5
    assert await refresh_requests(auth) == 5
    row = await ctx.connections.get(tenant, cid)
    assert row is not None and row.status == "active"
    current = await tokens(ctx, sealer, margin=timedelta(0)).get(tenant, cid, 1)
    assert (await mcp_client.photograph(mcp.url, bearer(current))).tools


async def test_a_rejected_token_is_refreshed_even_if_it_looks_valid(
    connect: OAuthConnect, auth: AuthorizationServer, mcp: RunningServer, ctx: AppContext, sealer: Sealer, tenant: str
) -> None:
    done = await connected(connect, auth, mcp, ctx, tenant)
    cid = str(done.connection.id)
    access = tokens(ctx, sealer, margin=timedelta(0))
    first = await access.get(tenant, cid, 1)
    second = await access.get(tenant, cid, 1, rejected=first)
    assert second != first


async def test_a_revoked_grant_moves_the_connection_to_error_with_the_providers_reason(
    connect: OAuthConnect, auth: AuthorizationServer, mcp: RunningServer, ctx: AppContext, sealer: Sealer, tenant: str
) -> None:
    done = await connected(connect, auth, mcp, ctx, tenant)
    cid = str(done.connection.id)
    assert done.tokens.refresh_token is not None
    server = connect.client
    discovery = await server.discover(mcp.url)
    async with ctx.pool.acquire() as conn:
        registration_id = await conn.fetchval(
            "SELECT registration_id FROM integration_connections WHERE id = $1", uuid.UUID(cid)
        )
    registration = await connect.records.registration(tenant, str(registration_id))
    assert registration is not None
    identity = connect.identity_of(tenant, registration)
    await server.revoke(discovery.authorization_server, identity, done.tokens.refresh_token)

    with pytest.raises(GrantLost) as lost:
        await tokens(ctx, sealer).get(tenant, cid, 1)
    assert lost.value.reason and lost.value.status == 502
    row = await ctx.connections.get(tenant, cid)
    assert row is not None and row.status == "error"
    async with ctx.pool.acquire() as conn:
        oauth = await conn.fetchval("SELECT oauth FROM integration_connections WHERE id = $1", uuid.UUID(cid))
    assert oauth["last_error"] == lost.value.reason
    with pytest.raises(NotFound):
        await tokens(ctx, sealer).get(tenant, cid, 1)


async def test_a_binding_frozen_before_a_reconnect_is_stale(
    connect: OAuthConnect, auth: AuthorizationServer, mcp: RunningServer, ctx: AppContext, sealer: Sealer, tenant: str
) -> None:
    done = await connected(connect, auth, mcp, ctx, tenant)
    current = await ctx.connections.get(tenant, str(done.connection.id))
    assert current is not None
    await connect.complete(await signed_in(connect, auth, tenant, current), BROWSER)
    with pytest.raises(Conflict, match="stale"):
        await tokens(ctx, sealer).get(tenant, str(done.connection.id), 1)
    assert await tokens(ctx, sealer, margin=timedelta(0)).get(tenant, str(done.connection.id), 2)
