"""OAuth connections end to end on the real stack: oidc-provider (60 s access tokens, rotating refresh tokens), an
MCP server that accepts only that provider's tokens for its own URL, and our browser legs driven over HTTP (the
provider's sign-in form is posted by ``AuthorizationServer.sign_in``).

With the 300 s refresh margin every 60 s access token is already due, so each brokered call refreshes first: the
token the callback obtained is never the one that reaches the server, and every call rotates the refresh token.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from temporalio.client import Client

from cli.stack import Stack
from contracts.temporal import workflow_id
from db.connections import credential_context
from integrations.oauth import OAuthClient
from integrations.sealing import Sealer
from integrations.urls import UrlPolicy
from services.oauth_tokens import access_context
from tests.integration.conftest import FAST
from tests.integration.helpers import (
    events,
    make_agent,
    make_policy,
    start_run,
    unique,
    wait_pending,
    wait_status,
)
from tests.integration.test_broker import BROKER_POLICY, requirement
from tests.mcp_servers import RunningServer, basic, serve
from tests.oauth_servers import AuthorizationServer

pytestmark = pytest.mark.stack

SUPERSEDED = "this authorization was superseded by a newer one — restart the connect flow"
COOKIE = "__Host-fbx_oauth_flow"  # Secure: the stack's public URL is plain http on loopback, a secure context


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def browser_client() -> httpx.AsyncClient:
    """A client that keeps cookies as a browser does and follows no redirect by itself. http on a loopback host is
    a secure context (W3C Secure Contexts), so a browser sends a ``Secure`` cookie back to it; Python's cookie jar
    sends one over https only, so this client marks a loopback host's cookies sendable once it has stored them."""
    client = httpx.AsyncClient(trust_env=False, follow_redirects=False, timeout=60)

    async def secure_context(response: httpx.Response) -> None:
        for cookie in client.cookies.jar:
            if cookie.secure and cookie.domain in LOOPBACK:
                cookie.secure = False

    client.event_hooks["response"] = [secure_context]
    return client


@pytest.fixture
async def browser() -> AsyncIterator[httpx.AsyncClient]:
    async with browser_client() as client:
        yield client


async def create(api: httpx.AsyncClient, url: str) -> dict[str, Any]:
    r = await api.post(
        "/v1/connections",
        json={
            "provider": "mcp_http",
            "access": {"read": True},
            "base_url": url,
            "auth_kind": "oauth",
            "display_name": "protected <calc>",
        },
    )
    assert r.status_code == 200, r.text
    body = dict(r.json())
    assert body["connection"]["status"] == "pending" and body["connection"]["auth_kind"] == "oauth"
    assert body["next"] == f"/v1/connections/{body['connection']['id']}/oauth/start"
    return dict(body["connection"])


async def signed_in(
    api: httpx.AsyncClient, auth: AuthorizationServer, browser: httpx.AsyncClient, connection_id: str
) -> str:
    """Start a flow, open its go_url in ``browser``, sign in at the provider; returns our callback URL."""
    r = await api.post(f"/v1/connections/{connection_id}/oauth/start")
    assert r.status_code == 200, r.text
    go = await browser.get(r.json()["go_url"])
    assert go.status_code == 302, go.text
    assert browser.cookies.get(COOKIE)
    cookie = go.headers["set-cookie"].lower()
    assert cookie.startswith(COOKIE.lower() + "=") and "domain=" not in cookie
    assert "httponly" in cookie and "samesite=lax" in cookie and "path=/" in cookie and "secure" in cookie
    landed = await auth.sign_in(go.headers["location"])
    assert "/v1/oauth/callback?" in landed, landed
    return landed


async def connected(
    api: httpx.AsyncClient, auth: AuthorizationServer, browser: httpx.AsyncClient, url: str
) -> dict[str, Any]:
    connection = await create(api, url)
    page = await browser.get(await signed_in(api, auth, browser, connection["id"]))
    assert page.status_code == 200, page.text
    assert "Connected" in page.text and "protected &lt;calc&gt;" in page.text
    return connection


async def connection_row(api: httpx.AsyncClient, connection_id: str) -> dict[str, Any]:
    r = await api.get(f"/v1/connections/{connection_id}")
    assert r.status_code == 200, r.text
    return dict(r.json()["connection"])


async def grant(stack: Stack, connection_id: str) -> tuple[str, str | None, str]:
    """The connection's (refresh token, access token, client id), unsealed with the stack's key."""
    sealer = Sealer.from_setting(FAST["FLUIDBOX_CREDENTIAL_KEY"])
    conn = await asyncpg.connect(stack.database_url)
    try:
        row = await conn.fetchrow(
            "SELECT c.tenant_id, c.credential_sealed, c.access_token_sealed, r.client_id "
            "FROM integration_connections c JOIN oauth_client_registrations r ON r.id = c.registration_id "
            "WHERE c.id = $1",
            uuid.UUID(connection_id),
        )
    finally:
        await conn.close()
    tenant = str(row["tenant_id"])
    refresh = sealer.open(bytes(row["credential_sealed"]), context=credential_context(tenant)).decode()
    blob = row["access_token_sealed"]
    access = sealer.open(bytes(blob), context=access_context(tenant)).decode() if blob is not None else None
    return refresh, access, str(row["client_id"])


def adding_agent_script() -> list[dict[str, Any]]:
    return [{"tool": "mcp__calc__add", "input": {"a": 2, "b": 3}}]


async def workflow_histories(stack: Stack, run_id: str) -> str:
    """Every Temporal history of the run (following continue-as-new back to the first), as JSON text."""
    client: Client = await Client.connect(stack.temporal_address or "", namespace="default")
    texts: list[str] = []
    run: str | None = None
    while True:
        history = await client.get_workflow_handle(workflow_id(run_id), run_id=run).fetch_history()
        texts.append(history.to_json())
        run = history.events[0].workflow_execution_started_event_attributes.continued_execution_run_id or None
        if run is None:
            return "\n".join(texts)


async def test_an_oauth_connection_signs_in_and_its_runs_call_through_it_without_any_token_leaking(
    api: httpx.AsyncClient, stack: Stack, auth: AuthorizationServer, mcp: RunningServer, browser: httpx.AsyncClient
) -> None:
    connection = await connected(api, auth, browser, mcp.url)
    cid = connection["id"]
    row = await connection_row(api, cid)
    assert row["status"] == "active" and row["authorization_generation"] == 1
    tools = (await api.get(f"/v1/connections/{cid}/tools")).json()["snapshot"]
    assert [t["name"] for t in tools["tools"]] == ["add", "echo"] and tools["authorization_generation"] == 1
    first_refresh, first_access, _ = await grant(stack, cid)

    await auth.clear_requests()
    agent = await make_agent(
        api, adding_agent_script(), policy=await make_policy(api, BROKER_POLICY),
        connection_requirements=[requirement(mcp.url, ["add"])],
    )  # fmt: skip
    run_id = await start_run(api, agent)
    run = await wait_status(api, run_id, {"completed", "failed"})
    evs = await events(api, run_id)
    said = [e["payload"]["data"]["text"] for e in evs if e["type"] == "agent.message"]
    assert "mcp__calc__add → 5" in said, said
    # The server executes only for a token the provider issued for its URL: ours, refreshed before the call
    # (the callback's 60 s token was already inside the margin), with the rotated refresh token stored.
    assert mcp.call_count("add") >= 1
    refreshes = [r for r in await auth.requests() if r["route"] == "token"]
    assert [r["params"].get("grant_type") for r in refreshes] == ["refresh_token"]
    assert refreshes[0]["params"].get("resource") == mcp.url
    refresh, access, _ = await grant(stack, cid)
    assert refresh != first_refresh and access is not None and access != first_access

    refreshed = await api.post(f"/v1/connections/{cid}/tools/refresh")
    assert refreshed.status_code == 200, refreshed.text
    assert refreshed.json()["snapshot"]["version"] == 2

    # No token of any kind anywhere a person or the agent can read.
    latest_refresh, latest_access, _ = await grant(stack, cid)
    secrets_seen = {first_refresh, first_access or "", refresh, access, latest_refresh, latest_access or ""} - {""}
    listed = (await api.get("/v1/connections")).text
    detail = (await api.get(f"/v1/connections/{cid}")).text
    logs = "".join(p.read_text(errors="replace") for p in Path(stack.logs).glob("*.log"))
    sandbox = "".join(p.read_text(errors="replace") for p in (stack.home / "runs").glob("*/sandbox.log"))
    history = await workflow_histories(stack, run_id)
    texts = [listed, detail, refreshed.text, json.dumps(evs), json.dumps(run), logs, sandbox, history]
    for secret in secrets_seen:
        assert all(secret not in text for text in texts)


async def test_a_401_from_the_server_gets_one_retry_with_a_refreshed_token(
    api: httpx.AsyncClient, auth: AuthorizationServer, mcp: RunningServer, browser: httpx.AsyncClient
) -> None:
    await connected(api, auth, browser, mcp.url)
    script = [
        {"tool": "mcp__calc__add", "input": {"a": 40, "b": 2}},
        {"tool": "mcp__calc__add", "input": {"a": 1, "b": 1}},
    ]
    agent = await make_agent(
        api, script, policy=await make_policy(api, BROKER_POLICY),
        connection_requirements=[requirement(mcp.url, ["add"])],
    )  # fmt: skip
    await auth.clear_requests()
    executed, answered = len(mcp.recorder.executions), len(mcp.recorder.http_requests)
    # The server refuses the first call's token once: the broker refreshes past it and sends the call again.
    mcp.recorder.reject_next_calls(1)
    run_id = await start_run(api, agent)
    await wait_status(api, run_id, {"completed", "failed"})
    evs = await events(api, run_id)
    said = [e["payload"]["data"]["text"] for e in evs if e["type"] == "agent.message"]
    assert "mcp__calc__add → 42" in said, said
    brokered = [e["payload"]["data"] for e in evs if e["type"] == "tool.brokered"]
    assert [b["outcome"] for b in brokered] == ["succeeded", "succeeded"]
    assert len(mcp.recorder.executions) - executed == 2
    assert [status for _, status in mcp.recorder.http_requests[answered:]].count(401) == 1
    grants = [r["params"].get("grant_type") for r in await auth.requests() if r["route"] == "token"]
    # Each call refreshes its due 60 s token first; the refused one refreshes once more.
    assert grants == ["refresh_token"] * 3, grants


async def test_a_callback_from_another_browser_is_refused_without_burning_the_flow_and_a_replay_is_refused(
    api: httpx.AsyncClient, auth: AuthorizationServer, mcp: RunningServer, browser: httpx.AsyncClient
) -> None:
    connection = await create(api, mcp.url)
    landed = await signed_in(api, auth, browser, connection["id"])
    async with httpx.AsyncClient(trust_env=False, follow_redirects=False) as stranger:
        refused = await stranger.get(landed)
        assert refused.status_code == 403, refused.text
        stranger.cookies.set(COOKIE, "not-the-browser-that-started")
        refused = await stranger.get(landed)
        assert refused.status_code == 403 and "another browser" in refused.json()["error"]
    assert (await connection_row(api, connection["id"]))["status"] == "pending"
    page = await browser.get(landed)
    assert page.status_code == 200, page.text
    replay = await browser.get(landed)
    assert replay.status_code == 409 and "already completed" in replay.json()["error"]
    assert (await connection_row(api, connection["id"]))["authorization_generation"] == 1


async def test_of_two_concurrent_reauthorizations_exactly_one_wins(
    api: httpx.AsyncClient, auth: AuthorizationServer, mcp: RunningServer, browser: httpx.AsyncClient
) -> None:
    connection = await connected(api, auth, browser, mcp.url)
    # One browser, two flows: the cookie is per browser, so both stay claimable from it.
    first = await signed_in(api, auth, browser, connection["id"])
    second = await signed_in(api, auth, browser, connection["id"])
    answers = await asyncio.gather(browser.get(first), browser.get(second))
    assert sorted(a.status_code for a in answers) == [200, 409], [a.text for a in answers]
    [loser] = [a for a in answers if a.status_code == 409]
    assert loser.json()["error"] == SUPERSEDED
    assert (await connection_row(api, connection["id"]))["authorization_generation"] == 2


async def test_a_reconnect_makes_an_in_flight_runs_next_brokered_call_fail_closed(
    api: httpx.AsyncClient, auth: AuthorizationServer, mcp: RunningServer, browser: httpx.AsyncClient
) -> None:
    connection = await connected(api, auth, browser, mcp.url)
    script = [
        {"tool": "mcp__calc__echo", "input": {"text": "one"}},
        {"tool": "Bash", "input": {"command": "./deploy.sh"}},
        {"tool": "mcp__calc__echo", "input": {"text": "two"}},
    ]
    agent = await make_agent(
        api, script, policy=await make_policy(api, BROKER_POLICY),
        connection_requirements=[{**requirement(mcp.url, ["echo"]), "when_unavailable": "fail"}],
    )  # fmt: skip
    run_id = await start_run(api, agent)
    pending = await wait_pending(api, run_id)
    page = await browser.get(await signed_in(api, auth, browser, connection["id"]))
    assert page.status_code == 200, page.text
    await api.post(f"/v1/approvals/{pending['id']}/decision", json={"decision": "deny"})
    row = await wait_status(api, run_id, {"completed", "failed"})
    assert row["result_summary"].startswith("Replay complete: 1 executed, 2 denied."), row["result_summary"]
    refused = [
        e["payload"]["data"] for e in await events(api, run_id)
        if e["type"] == "tool.decision" and e["payload"]["data"]["source"] == "binding"
    ]  # fmt: skip
    assert [r["reason"] for r in refused] == ["the bound connection was reauthorized since this run started"]


async def test_a_revoked_grant_puts_the_connection_in_error_and_fails_the_call_with_the_reason(
    api: httpx.AsyncClient, stack: Stack, auth: AuthorizationServer, mcp: RunningServer, browser: httpx.AsyncClient
) -> None:
    connection = await connected(api, auth, browser, mcp.url)
    refresh, _, client_id = await grant(stack, connection["id"])
    async with httpx.AsyncClient(trust_env=False) as http:
        r = await http.post(
            auth.metadata["revocation_endpoint"],
            data={"token": refresh, "token_type_hint": "refresh_token", "client_id": client_id},
        )
        assert r.status_code == 200, r.text
    before = mcp.call_count("add")
    agent = await make_agent(
        api, adding_agent_script(), policy=await make_policy(api, BROKER_POLICY),
        connection_requirements=[{**requirement(mcp.url, ["add"]), "when_unavailable": "fail"}],
    )  # fmt: skip
    run_id = await start_run(api, agent)
    await wait_status(api, run_id, {"completed", "failed"})
    refused = [
        e["payload"]["data"] for e in await events(api, run_id)
        if e["type"] == "tool.decision" and e["payload"]["data"]["source"] == "binding"
    ]  # fmt: skip
    assert len(refused) == 1 and refused[0]["reason"].startswith("the bound connection is in error: "), refused
    assert "reconnect it" in refused[0]["reason"]
    assert mcp.call_count("add") == before
    assert (await connection_row(api, connection["id"]))["status"] == "error"


async def test_an_oauth_catalog_entry_connects_in_one_call_and_one_sign_in(
    api: httpx.AsyncClient, auth: AuthorizationServer, mcp: RunningServer, browser: httpx.AsyncClient
) -> None:
    slug = unique("oauthsvc")
    r = await api.post("/v1/catalog", json={"slug": slug, "name": "Calc", "url": mcp.url, "auth_mode": "oauth"})
    assert r.status_code == 200, r.text
    r = await api.post(f"/v1/catalog/{slug}/connect", json={"token": "x"})
    assert r.status_code == 400 and "takes no `token`" in r.json()["error"]
    before = (await api.get("/v1/connections")).json()["connections"]
    unprotected = unique("plain")
    async with serve(basic()) as plain:
        doc = {"slug": unprotected, "name": "P", "url": plain.url, "auth_mode": "oauth"}
        assert (await api.post("/v1/catalog", json=doc)).status_code == 200
        r = await api.post(f"/v1/catalog/{unprotected}/connect", json={})
    assert r.status_code == 400 and "cannot start OAuth" in r.json()["error"], r.text
    assert (await api.get("/v1/connections")).json()["connections"] == before
    r = await api.post(f"/v1/catalog/{slug}/connect", json={})
    assert r.status_code == 200, r.text
    connection, go_url = r.json()["connection"], r.json()["go_url"]
    assert connection["status"] == "pending" and connection["display_name"] == "Calc"
    go = await browser.get(go_url)
    assert go.status_code == 302, go.text
    page = await browser.get(await auth.sign_in(go.headers["location"]))
    assert page.status_code == 200, page.text
    assert (await connection_row(api, connection["id"]))["status"] == "active"
    listed = {c["slug"]: c for c in (await api.get("/v1/catalog")).json()["connectors"]}
    assert listed[slug]["connection"]["id"] == connection["id"]


async def test_a_preregistered_client_id_and_requested_scopes_are_used_on_both_legs(
    api: httpx.AsyncClient, stack: Stack, auth: AuthorizationServer, mcp: RunningServer, browser: httpx.AsyncClient
) -> None:
    # A client registered out of band (here: at the provider's registration endpoint, by someone else).
    oauth = OAuthClient(UrlPolicy(allow_loopback=True))
    own = await oauth.register(await oauth.discover(mcp.url), f"{stack.api_url}/v1/oauth/callback")
    r = await api.post(
        "/v1/connections",
        json={
            "provider": "mcp_http", "access": {"read": True}, "base_url": mcp.url, "auth_kind": "oauth",
            "client_id": own.client_id, "scopes": ["mcp:tools"],
        },
    )  # fmt: skip
    assert r.status_code == 200, r.text
    cid = r.json()["connection"]["id"]
    await auth.clear_requests()
    page = await browser.get(await signed_in(api, auth, browser, cid))
    assert page.status_code == 200, page.text
    seen = await auth.requests()
    authorize = [q["params"] for q in seen if q["route"] == "authorization"]
    token = [q["params"] for q in seen if q["route"] == "token"]
    assert authorize and all(p["client_id"] == own.client_id for p in authorize)
    assert authorize[0]["scope"] == "mcp:tools offline_access", "offline_access is kept when offered"
    assert token and token[0]["client_id"] == own.client_id
    assert (await connection_row(api, cid))["status"] == "active"
    conn = await asyncpg.connect(stack.database_url)
    try:
        source = await conn.fetchval(
            "SELECT r.source FROM integration_connections c JOIN oauth_client_registrations r "
            "ON r.id = c.registration_id WHERE c.id = $1",
            uuid.UUID(cid),
        )
    finally:
        await conn.close()
    assert source == "preregistered"
    r = await api.post("/v1/connections", json={"provider": "mcp_http", "base_url": mcp.url, "auth_kind": "oauth",
                                                 "client_secret": "s"})  # fmt: skip
    assert r.status_code == 400 and "needs the `client_id`" in r.json()["error"]
    r = await api.post("/v1/connections", json={"provider": "mcp_http", "base_url": mcp.url, "auth_kind": "oauth",
                                                 "scopes": ["has space"]})  # fmt: skip
    assert r.status_code == 400 and "scope tokens" in r.json()["error"]


async def test_bad_oauth_requests_are_clear_4xx_errors_that_change_nothing(
    api: httpx.AsyncClient, stack: Stack, mcp: RunningServer, browser: httpx.AsyncClient
) -> None:
    base = {"provider": "mcp_http", "access": {"read": True}, "base_url": mcp.url, "auth_kind": "oauth"}
    r = await api.post("/v1/connections", json={**base, "token": "x"})
    assert r.status_code == 400 and "takes no `token`" in r.json()["error"]
    r = await api.post("/v1/connections", json={**base, "scheme": "Basic"})
    assert r.status_code == 400
    before = len((await api.get("/v1/connections")).json()["connections"])
    r = await api.post("/v1/connections/not-a-connection/oauth/start")
    assert r.status_code == 404
    r = await browser.get(f"{stack.api_url}/v1/oauth/go", params={"f": "forged"})
    assert r.status_code == 400 and r.json()["error"] == "this sign-in link is not valid"
    assert COOKIE not in browser.cookies
    r = await browser.get(f"{stack.api_url}/v1/oauth/callback", params={"code": "x"})
    assert r.status_code == 400 and "state" in r.json()["error"]
    r = await browser.get(f"{stack.api_url}/v1/oauth/callback", params={"code": "x", "state": "unknown"})
    assert r.status_code == 404, r.text
    r = await browser.get(f"{stack.api_url}/.well-known/fluidbox-client.json")
    assert r.status_code == 404, "no Client ID Metadata Document on a plain-http loopback deployment"
    assert len((await api.get("/v1/connections")).json()["connections"]) == before
