"""Sign-in links (issue 24, finding 13): our origin never redirects a browser where outbound admission would not
go, and a read-only token never makes a connection or gets a sign-in link.

The authorization server a misbehaving MCP server names is real HTTP served by the test (its metadata points its
authorization endpoint at a private address); the well-behaved one is oidc-provider (``tests/oauth_servers.py``).
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import AsyncIterator
from urllib.parse import parse_qs, urlsplit

import asyncpg
import httpx
import pytest
from starlette.responses import JSONResponse, Response

from cli.stack import Stack
from integrations.sealing import Sealer
from services.connections import GO_CONTEXT
from tests.integration.conftest import FAST
from tests.integration.helpers import unique
from tests.integration.test_identity import add_user, fluidbox, mint
from tests.integration.test_oauth_connections import browser_client
from tests.integrations.test_oauth_client import as_document, misbehaving
from tests.mcp_servers import McpTestServer, RunningServer, serve
from tests.oauth_servers import AuthorizationServer

pytestmark = pytest.mark.stack

PRIVATE = "http://10.0.0.8/authorize"
READ_ONLY = "this token is read-only; starting or handing out a sign-in needs a token that may write"


@pytest.fixture
async def browser() -> AsyncIterator[httpx.AsyncClient]:
    async with browser_client() as client:
        yield client


def private_sign_in_page() -> McpTestServer:
    """An MCP server whose authorization server's metadata names a sign-in page on a private address."""

    def prm(url: str) -> Response:
        return JSONResponse({"resource": url, "authorization_servers": [url.removesuffix("/mcp")]})

    return misbehaving(prm=prm, as_metadata=lambda origin: as_document(origin, authorization_endpoint=PRIVATE))


async def flows_of(stack: Stack, connection_id: str) -> int:
    conn = await asyncpg.connect(stack.database_url)
    try:
        count = await conn.fetchval(
            "SELECT count(*) FROM connector_oauth_flows WHERE connection_id = $1", uuid.UUID(connection_id)
        )
    finally:
        await conn.close()
    return int(count)


async def pending(api: httpx.AsyncClient, url: str, **extra: object) -> httpx.Response:
    body = {"provider": "mcp_http", "access": {"read": True}, "base_url": url, "auth_kind": "oauth", **extra}
    return await api.post("/v1/connections", json=body)


async def test_an_authorization_endpoint_on_a_private_address_is_never_a_redirect_of_ours(
    api: httpx.AsyncClient, stack: Stack
) -> None:
    refusal = "refusing to send a browser to http://10.0.0.8/authorize: "
    async with serve(private_sign_in_page()) as server:
        before = (await api.get("/v1/connections")).json()["connections"]
        # A client id given at creation runs discovery at once: refused, and the connection is not kept.
        r = await pending(api, server.url, client_id="preregistered-client")
        assert r.status_code == 400, r.text
        assert r.json()["error"].startswith("cannot use this client id with this server: " + refusal), r.text
        assert "10.0.0.8 is a private address" in r.json()["error"]
        assert (await api.get("/v1/connections")).json()["connections"] == before
        # Without one, the pending connection is made, but no sign-in flow ever starts for it.
        r = await pending(api, server.url)
        assert r.status_code == 200, r.text
        connection_id = r.json()["connection"]["id"]
        for attempt in (
            api.post(f"/v1/connections/{connection_id}/oauth/start"),
            api.get("/v1/connections/authorize", params={"connection": connection_id}),
        ):
            r = await attempt
            assert r.status_code == 400, r.text
            assert r.json()["error"].startswith("cannot start OAuth with this server: " + refusal), r.text
            assert "go_url" not in r.json() and "url" not in r.json()
        assert await flows_of(stack, connection_id) == 0
        await api.post(f"/v1/connections/{connection_id}/revoke")


def reseal(go_url: str, authorization_url: str) -> str:
    """A sign-in link for the same flow whose sealed authorization URL is another: what ``/go`` would open if
    the endpoint's name resolved somewhere else by the time the browser arrives (the test holds the key)."""
    sealer = Sealer.from_setting(FAST["FLUIDBOX_CREDENTIAL_KEY"])
    f = parse_qs(urlsplit(go_url).query)["f"][0]
    doc = json.loads(sealer.open(base64.urlsafe_b64decode(f + "=" * (-len(f) % 4)), context=GO_CONTEXT))
    forged = sealer.seal(json.dumps({"f": doc["f"], "u": authorization_url}), context=GO_CONTEXT)
    return go_url.split("?")[0] + "?f=" + base64.urlsafe_b64encode(forged).decode().rstrip("=")


async def test_the_go_leg_admits_the_sign_in_page_again_before_redirecting(
    api: httpx.AsyncClient, auth: AuthorizationServer, mcp: RunningServer, browser: httpx.AsyncClient
) -> None:
    r = await pending(api, mcp.url)
    assert r.status_code == 200, r.text
    connection_id = r.json()["connection"]["id"]
    r = await api.post(f"/v1/connections/{connection_id}/oauth/start")
    assert r.status_code == 200, r.text
    go_url = r.json()["go_url"]
    for target in (PRIVATE + "?state=x", "http://169.254.169.254/latest/meta-data/"):
        r = await browser.get(reseal(go_url, target))
        assert r.status_code == 400, r.text
        assert "location" not in r.headers and "set-cookie" not in r.headers
        assert r.json()["error"].startswith("this sign-in cannot continue: refusing to send a browser to "), r.text
    # The refused opening bound nothing: the real link still opens, in any browser.
    async with httpx.AsyncClient(trust_env=False, follow_redirects=False, timeout=60) as other:
        r = await other.get(go_url)
    assert r.status_code == 302 and r.headers["location"].startswith(auth.issuer), r.headers
    await api.post(f"/v1/connections/{connection_id}/revoke")


async def read_only(stack: Stack, email: str) -> str:
    rc, out, err = await fluidbox(stack, "users", "token", email, "--name", "reader", "--read-only")
    assert rc == 0, out + err
    return str(json.loads(out)["token"])


async def test_a_read_only_token_cannot_mint_a_sign_in_or_a_connection(
    api: httpx.AsyncClient, stack: Stack, mcp: RunningServer
) -> None:
    admin = await add_user(stack, "admin")
    writer, reader = await mint(stack, admin["email"]), await read_only(stack, admin["email"])

    def as_(token: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=stack.api_url, headers={"authorization": f"Bearer {token}"}, timeout=60)

    r = await pending(api, mcp.url)
    assert r.status_code == 200, r.text
    connection_id = r.json()["connection"]["id"]
    slug = unique("ro-oauth")
    made = await api.post("/v1/catalog", json={"slug": slug, "name": "Calc", "url": mcp.url, "auth_mode": "oauth"})
    assert made.status_code == 200, made.text
    async with as_(writer) as w, as_(reader) as ro:
        before = (await w.get("/v1/connections")).json()["connections"]
        for params in ({"connection": connection_id}, {"connection": slug, "owner": "personal"}):
            r = await ro.get("/v1/connections/authorize", params=params)
            assert (r.status_code, r.json()) == (403, {"error": READ_ONLY, "code": "forbidden"}), params
        assert await flows_of(stack, connection_id) == 0, "no flow was minted"
        assert (await w.get("/v1/connections")).json()["connections"] == before, "no connection was made"
        # The writer mints one; the reader still gets no link (it would sign in whoever opens it).
        r = await w.get("/v1/connections/authorize", params={"connection": connection_id})
        assert r.status_code == 200 and r.json()["status"] == "authorize", r.text
        r = await ro.get("/v1/connections/authorize", params={"connection": connection_id})
        assert r.status_code == 403 and r.json()["error"] == READ_ONLY
        assert await flows_of(stack, connection_id) == 1
    await api.post(f"/v1/connections/{connection_id}/revoke")
