"""Managed app connections (``/v1/mcp-oauth/catalog``) end to end: npm oidc-provider, an MCP server that accepts only
its tokens, users with personal access tokens, and a second API process of the session's stack configured with
managed apps (same database, Temporal and worker; the session's own API has none configured, so it answers 503).

The provider's sign-in form is posted over HTTP (``AuthorizationServer.sign_in``); the client's allowed callback
location is a URL nothing listens on: the tests read the redirect that would go there.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import asyncpg
import httpx
import pytest

from cli.stack import Stack, free_port
from core.tokens import token_digest
from tests.integration.helpers import events, make_agent, make_policy, wait_status
from tests.integration.test_identity import BROKER_POLICY, add_user, as_user, mint
from tests.integration.test_oauth_connections import browser_client, connected, grant
from tests.mcp_servers import RunningServer, serve
from tests.oauth_servers import AuthorizationServer, protected

pytestmark = pytest.mark.stack

APP = "managed-calc"
LATER = "managed-later"  # its server is started (and stopped) by the test that uses it
ALLOWED = "http://127.0.0.1:9/app/callback"
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Managed:
    url: str
    log: Path


@pytest.fixture(scope="module")
async def managed(stack: Stack) -> AsyncIterator[Managed]:
    """A second API process of the session's stack with managed apps configured (its log joins the stack's)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **stack.env,
        "FLUIDBOX_BIND": f"127.0.0.1:{port}",
        "FLUIDBOX_PUBLIC_URL": url,
        "FLUIDBOX_GATEWAY_SOCKET": tempfile.mkdtemp(prefix="fbxm-") + "/api.sock",
        "FLUIDBOX_MANAGED_APPS": json.dumps([APP, LATER]),
        "FLUIDBOX_MANAGED_APP_REDIRECT_URLS": json.dumps([ALLOWED]),
    }
    log = stack.logs / "managed-api.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "api.serve"], env=env, cwd=str(ROOT), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        async with httpx.AsyncClient(timeout=2) as probe:
            for _ in range(600):  # bounded: 30 s
                try:
                    if (await probe.get(f"{url}/v1/health")).status_code == 200:
                        break
                except httpx.TransportError:
                    await asyncio.sleep(0.05)
                assert proc.poll() is None, log.read_text()[-2000:]
        yield Managed(url, log)
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
async def operator(stack: Stack, admin: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=stack.api_url, headers={"authorization": f"Bearer {admin}"}, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
async def app(operator: httpx.AsyncClient, mcp: RunningServer) -> str:
    """The managed app: a catalog OAuth entry for the module's protected MCP server."""
    r = await operator.post(
        "/v1/catalog",
        json={"slug": APP, "name": "Calc", "icon": "https://example.com/calc.png", "url": mcp.url,
              "auth_mode": "oauth", "scopes": ["mcp:tools"]},
    )  # fmt: skip
    assert r.status_code == 200, r.text
    return APP


async def user(stack: Stack, managed: Managed, *, read_only: bool = False) -> tuple[httpx.AsyncClient, dict[str, Any]]:
    member = await add_user(stack)
    token = await mint(stack, member["email"])
    client = httpx.AsyncClient(base_url=managed.url, headers={"authorization": f"Bearer {token}"}, timeout=60)
    return client, {**member, "token": token}


async def read_only_token(stack: Stack, email: str) -> str:
    from tests.integration.test_identity import fluidbox

    rc, out, err = await fluidbox(stack, "users", "token", email, "--name", "reader", "--read-only")
    assert rc == 0, out + err
    return str(json.loads(out)["token"])


async def signed_in(auth: AuthorizationServer, managed: Managed, client: httpx.AsyncClient, app: str) -> str:
    """Connect with the allowed redirect_url, sign in at the provider, follow our callback; returns the proof."""
    r = await client.post(f"/v1/mcp-oauth/catalog/{app}/connect", json={"redirect_url": ALLOWED})
    assert r.status_code == 200 and r.json()["status"] == "redirect", r.text
    landed = await auth.sign_in(r.json()["authorization_url"])
    assert landed.startswith(f"{managed.url}/v1/mcp-oauth/catalog/callback?"), landed
    async with httpx.AsyncClient(trust_env=False, follow_redirects=False) as browser:
        back = await browser.get(landed)
        assert back.status_code == 302, back.text
        replay = await browser.get(landed)
        assert replay.status_code == 409 and "already completed" in replay.json()["error"]
    location = back.headers["location"]
    assert location.startswith(ALLOWED + "?"), location
    query = parse_qs(urlsplit(location).query)
    assert query["app_id"] == [app]
    return query["completion_proof"][0]


async def statuses(client: httpx.AsyncClient) -> dict[str, dict[str, Any]]:
    r = await client.get("/v1/mcp-oauth/catalog/connections")
    assert r.status_code == 200, r.text
    return {c["app_id"]: c for c in r.json()["connections"]}


async def test_without_managed_apps_configured_the_surface_answers_503(stack: Stack, api: httpx.AsyncClient) -> None:
    member = await add_user(stack)
    async with as_user(stack, await mint(stack, member["email"])) as client:
        for method, path in [("GET", ""), ("GET", "/connections"), ("POST", "/managed-calc/connect")]:
            r = await client.request(method, f"/v1/mcp-oauth/catalog{path}")
            assert r.status_code == 503 and "FLUIDBOX_MANAGED_APPS" in r.json()["error"], r.text
    r = await api.get("/v1/mcp-oauth/catalog/callback", params={"state": "x", "code": "y"})
    assert r.status_code == 503


async def test_connect_is_idempotent_and_a_completion_proof_is_single_use_bound_and_checked(
    stack: Stack, managed: Managed, app: str, auth: AuthorizationServer, mcp: RunningServer
) -> None:
    alice, alice_row = await user(stack, managed)
    bob, _ = await user(stack, managed)
    reader = httpx.AsyncClient(
        base_url=managed.url,
        headers={"authorization": f"Bearer {await read_only_token(stack, alice_row['email'])}"},
        timeout=60,
    )
    async with alice, bob, reader:
        listed = await reader.get("/v1/mcp-oauth/catalog")
        assert listed.status_code == 200, listed.text
        [entry] = [a for a in listed.json()["apps"] if a["app_id"] == app]
        assert (entry["name"], entry["icon"], entry["scopes"], entry["connected"]) == (
            "Calc", "https://example.com/calc.png", ["mcp:tools"], False,
        )  # fmt: skip
        r = await reader.post(f"/v1/mcp-oauth/catalog/{app}/connect", json={})
        assert r.status_code == 403 and "read-only" in r.json()["error"]
        r = await reader.post("/v1/connections", json={"provider": "mcp_http", "base_url": mcp.url, "token": "x"})
        assert r.status_code == 403 and "read-only" in r.json()["error"], "read-only everywhere, not just here"

        for bad in ["https://evil.example/app/callback", ALLOWED + "/deeper", "http://127.0.0.1:9/app/callback#f"]:
            r = await alice.post(f"/v1/mcp-oauth/catalog/{app}/connect", json={"redirect_url": bad})
            assert r.status_code == 400 and "allowed callback location" in r.json()["error"], r.text
        r = await alice.post("/v1/mcp-oauth/catalog/nope/connect", json={})
        assert r.status_code == 404 and "unknown app" in r.json()["error"]
        assert await statuses(alice) == {}, "refused connects change nothing"

        first = await alice.post(f"/v1/mcp-oauth/catalog/{app}/connect", json={"redirect_url": ALLOWED})
        again = await alice.post(f"/v1/mcp-oauth/catalog/{app}/connect")
        assert first.json()["status"] == again.json()["status"] == "redirect"
        assert first.json()["connection"]["id"] == again.json()["connection"]["id"], "one connection per app"
        server_id = first.json()["connection"]["server_id"]

        proof = await signed_in(auth, managed, alice, app)
        # Signed in, not usable: the redirect alone never makes the connection usable, and reading repairs nothing.
        for _ in range(2):
            seen = (await statuses(alice))[app]
            assert (seen["status"], seen["connection"]["status"]) == ("PROVISIONING", "pending")
        conn = await asyncpg.connect(stack.database_url)
        try:
            stored = await conn.fetch("SELECT proof_hash FROM managed_app_flows WHERE proof_hash IS NOT NULL")
        finally:
            await conn.close()
        assert token_digest(proof) in {r["proof_hash"] for r in stored}, "the proof is stored as its digest only"

        complete = "/v1/mcp-oauth/catalog/connect/complete"
        r = await bob.post(complete, json={"completion_proof": proof})
        assert r.status_code == 403 and "another account" in r.json()["error"]
        r = await alice.post(complete, json={"completion_proof": proof, "expected_server_id": str(uuid.uuid4())})
        assert r.status_code == 409 and "expected_server_id" in r.json()["error"]
        r = await reader.post(complete, json={"completion_proof": proof})
        assert r.status_code == 403
        assert (await statuses(alice))[app]["status"] == "PROVISIONING", "refusals spent nothing"

        r = await alice.post(complete, json={"completion_proof": proof, "expected_server_id": server_id})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["status"] == "connected" and body["connection"]["server_id"] == server_id
        assert body["connection"]["status"] == "active" and body["connection"]["owner_user_id"] == alice_row["user_id"]
        r = await alice.post(complete, json={"completion_proof": proof})
        assert r.status_code == 409 and "already used" in r.json()["error"]

        r = await alice.post(f"/v1/mcp-oauth/catalog/{app}/connect", json={"redirect_url": ALLOWED})
        assert r.json() == {"status": "connected", "connection": body["connection"]} or (
            r.json()["status"] == "connected" and r.json()["connection"]["id"] == server_id
            and "authorization_url" not in r.json()
        )  # fmt: skip
        assert (await statuses(alice))[app]["status"] == "connected"
        assert [a["connected"] for a in (await reader.get("/v1/mcp-oauth/catalog")).json()["apps"]
                if a["app_id"] == app] == [True]  # fmt: skip
        assert await statuses(bob) == {}, "a connection belongs to the account that made it"


async def test_an_expired_proof_is_refused_and_the_accounts_next_connect_completes_the_sign_in(
    stack: Stack, managed: Managed, app: str, auth: AuthorizationServer
) -> None:
    carol, _ = await user(stack, managed)
    async with carol:
        proof = await signed_in(auth, managed, carol, app)
        conn = await asyncpg.connect(stack.database_url)
        try:  # five minutes pass
            await conn.execute(
                "UPDATE managed_app_flows SET proof_expires_at = now() - interval '1 second' WHERE proof_hash = $1",
                token_digest(proof),
            )
        finally:
            await conn.close()
        r = await carol.post("/v1/mcp-oauth/catalog/connect/complete", json={"completion_proof": proof})
        assert r.status_code == 404 and "expired" in r.json()["error"], r.text
        assert (await statuses(carol))[app]["status"] == "PROVISIONING"
        r = await carol.post(f"/v1/mcp-oauth/catalog/{app}/connect")
        assert r.status_code == 200 and r.json()["status"] == "connected", r.text


async def test_a_sign_in_whose_server_cannot_be_set_up_yet_is_provisioning_until_a_later_call(
    stack: Stack, operator: httpx.AsyncClient, managed: Managed, auth: AuthorizationServer
) -> None:
    dave, _ = await user(stack, managed)
    async with dave:
        async with serve(protected(auth)) as later:
            port = int(urlsplit(later.url).port or 0)
            r = await operator.post("/v1/catalog", json={"slug": LATER, "name": "Later", "url": later.url,
                                                          "auth_mode": "oauth"})  # fmt: skip
            assert r.status_code == 200, r.text
            r = await dave.post(f"/v1/mcp-oauth/catalog/{LATER}/connect")
            landed = await auth.sign_in(r.json()["authorization_url"])
            async with httpx.AsyncClient(trust_env=False, follow_redirects=False) as browser:
                page = await browser.get(landed)
            assert page.status_code == 200 and "Signed in" in page.text, page.text
        # The server is down now: setup cannot finish, the grant stays held.
        r = await dave.post(f"/v1/mcp-oauth/catalog/{LATER}/connect")
        assert r.status_code == 200 and r.json()["status"] == "PROVISIONING", r.text
        assert "could not be set up yet" in r.json()["reason"]
        assert (await statuses(dave))[LATER]["status"] == "PROVISIONING"
        async with serve(protected(auth), port=port):
            r = await dave.post(f"/v1/mcp-oauth/catalog/{LATER}/connect")
            assert r.status_code == 200 and r.json()["status"] == "connected", r.text
            assert (await statuses(dave))[LATER]["status"] == "connected"


async def test_a_run_calls_through_a_managed_connection_and_a_new_sign_in_keeps_the_connection(
    stack: Stack, operator: httpx.AsyncClient, managed: Managed, app: str, auth: AuthorizationServer,
    mcp: RunningServer,
) -> None:  # fmt: skip
    erin, erin_row = await user(stack, managed)
    async with erin:
        proof = await signed_in(auth, managed, erin, app)
        r = await erin.post("/v1/mcp-oauth/catalog/connect/complete", json={"completion_proof": proof})
        assert r.status_code == 200 and r.json()["status"] == "connected", r.text
        cid = r.json()["connection"]["id"]
        # ``fail``: this test is about the call failing closed (API runs park by default: test_parked.py).
        requirement = {"slot": "calc", "connector": {"url": mcp.url}, "required_tools": ["add"],
                       "binding_mode": "invoking_user", "when_unavailable": "fail"}  # fmt: skip
        agent = await make_agent(
            operator, [{"tool": "mcp__calc__add", "input": {"a": 2, "b": 3}}],
            policy=await make_policy(operator, BROKER_POLICY), connection_requirements=[requirement],
        )  # fmt: skip
        texts: list[str] = []
        async with as_user(stack, erin_row["token"]) as runs:

            async def run() -> tuple[str, list[dict[str, Any]]]:
                r = await runs.post("/v1/sessions", json={"agent": agent, "task": "t"})
                assert r.status_code == 200, r.text
                run_id = str(r.json()["session"]["id"])
                assert r.json()["session"]["run_spec"]["brokered"][0]["connection_id"] == cid
                texts.append(json.dumps(await wait_status(runs, run_id, {"completed", "failed"})))
                evs = await events(runs, run_id)
                texts.append(json.dumps(evs))
                return run_id, evs

            first_run, evs = await run()
            said = [e["payload"]["data"]["text"] for e in evs if e["type"] == "agent.message"]
            assert "mcp__calc__add → 5" in said, said
            first_refresh, first_access, client_id = await grant(stack, cid)

            # The provider drops the grant; the connection goes to error on the next call; the account signs in
            # again and gets the same connection (its id, bindings and rules) at the next generation.
            async with httpx.AsyncClient(trust_env=False) as http:
                r = await http.post(auth.metadata["revocation_endpoint"],
                                    data={"token": first_refresh, "client_id": client_id})  # fmt: skip
                assert r.status_code == 200
            await run()
            assert (await statuses(erin))[app]["status"] == "error"
            proof = await signed_in(auth, managed, erin, app)
            r = await erin.post("/v1/mcp-oauth/catalog/connect/complete",
                                json={"completion_proof": proof, "expected_server_id": cid})  # fmt: skip
            assert r.status_code == 200, r.text
            texts.append(r.text)
            assert r.json()["connection"]["id"] == cid and r.json()["connection"]["authorization_generation"] == 2
            _, evs = await run()
            said = [e["payload"]["data"]["text"] for e in evs if e["type"] == "agent.message"]
            assert "mcp__calc__add → 5" in said, said
            conn = await asyncpg.connect(stack.database_url)
            try:
                bound = await conn.fetchval(
                    "SELECT count(*) FROM run_resource_bindings WHERE session_id = $1 AND connection_id = $2",
                    uuid.UUID(first_run),
                    uuid.UUID(cid),
                )
            finally:
                await conn.close()
            assert bound == 1, "the first run's binding history is still there"

        # Canary: no token of any kind (access, refresh, completion proof) in responses, the ledger or any log.
        refresh, access, _ = await grant(stack, cid)
        texts += [(await statuses(erin)).__repr__(), (await erin.get("/v1/mcp-oauth/catalog")).text]
        logs = "".join(p.read_text(errors="replace") for p in Path(stack.logs).glob("*.log"))
        for secret in {first_refresh, first_access or "", refresh, access or "", proof} - {""}:
            assert all(secret not in text for text in [*texts, logs])


async def test_revoking_an_oauth_connection_revokes_its_grant_at_the_provider(
    stack: Stack, api: httpx.AsyncClient, auth: AuthorizationServer, mcp: RunningServer
) -> None:
    async with browser_client() as browser:
        connection = await connected(api, auth, browser, mcp.url)
    refresh, _, client_id = await grant(stack, connection["id"])
    r = await api.post(f"/v1/connections/{connection['id']}/revoke")
    assert r.status_code == 200 and r.json()["connection"]["status"] == "revoked", r.text
    async with httpx.AsyncClient(trust_env=False) as http:
        r = await http.post(
            auth.metadata["token_endpoint"],
            data={"grant_type": "refresh_token", "refresh_token": refresh, "client_id": client_id,
                  "resource": mcp.url},
        )  # fmt: skip
    assert r.status_code == 400 and r.json()["error"] == "invalid_grant", r.text
