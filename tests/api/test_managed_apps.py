"""Managed app connections in process (``/v1/mcp-oauth/catalog``): who may call, and one sign-in from connect to a
usable personal connection against a real authorization server (npm oidc-provider) and an MCP server it protects
(one each per module). The provider's form is posted by ``AuthorizationServer.sign_in``; the client's allowed
callback location is a URL nothing listens on: the test reads the redirect that would go there."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from api.routes import managed_apps as managed_routes
from tests.api.conftest import Api
from tests.api.connections_helpers import (
    app_with,
    authorization,
    listed,
    member,
    not_returning_their_model,
    oauth_protected,
    refused,
)
from tests.mcp_servers import RunningServer
from tests.oauth_servers import AuthorizationServer

APP = "managed-calc"
ALLOWED = "http://127.0.0.1:9/app/callback"
SURFACE = "/v1/mcp-oauth/catalog"

# The module's servers, started once for it (tests.api.connections_helpers).
auth = authorization
mcp = oauth_protected


def test_every_handler_returns_the_model_it_declares() -> None:
    assert not_returning_their_model(managed_routes.router) == []


async def test_without_managed_apps_configured_the_surface_answers_503(api: Api) -> None:
    user, _ = await member(api)
    refused(await user.get(SURFACE), 503, "managed app connections are not configured on this deployment")


async def test_an_account_connects_an_app_through_one_sign_in(
    api: Api, tmp_path: Path, auth: AuthorizationServer, mcp: RunningServer
) -> None:
    settings = {"managed_apps": [APP], "managed_app_redirect_urls": [ALLOWED]}
    async with app_with(api, tmp_path, **settings) as managed:
        entry = {"slug": APP, "name": "Calc", "icon": "https://example.com/calc.png", "url": mcp.url,
                 "auth_mode": "oauth", "scopes": ["mcp:tools"]}  # fmt: skip
        assert (await managed.client.post("/v1/catalog", json=entry)).status_code == 200
        refused(await managed.client.get(SURFACE), 403, "managed app connections belong to an account")
        user, user_id = await member(managed)
        reader, _ = await member(managed, read_only=True)
        offered = {"app_id": APP, "name": "Calc", "icon": "https://example.com/calc.png", "description": None,
                   "scopes": ["mcp:tools"], "connected": False}  # fmt: skip
        assert (await reader.get(SURFACE)).json() == {"apps": [offered]}
        refused(await reader.post(f"{SURFACE}/{APP}/connect", json={}), 403, "read-only")
        refused(await user.post(f"{SURFACE}/nope/connect", json={}), 404, "unknown app 'nope'")
        refused(await user.get(f"{SURFACE}/callback"), 400, "this is the provider's redirect target")
        assert (await user.get(f"{SURFACE}/connections")).json() == {"connections": []}

        started = await user.post(f"{SURFACE}/{APP}/connect", json={"redirect_url": ALLOWED})
        assert started.status_code == 200, started.text
        assert set(started.json()) == {"status", "authorization_url", "connection"}
        assert started.json()["status"] == "redirect"
        pending = started.json()["connection"]
        assert pending["server_id"] == pending["id"] and pending["owner_user_id"] == user_id

        landed = urlsplit(await auth.sign_in(started.json()["authorization_url"]))
        async with managed.as_token(None) as browser:
            back = await browser.get(f"{landed.path}?{landed.query}")
        assert back.status_code == 302, back.text
        proof = parse_qs(urlsplit(back.headers["location"]).query)["completion_proof"][0]
        [seen] = (await user.get(f"{SURFACE}/connections")).json()["connections"]
        assert (seen["app_id"], seen["status"], seen["server_id"]) == (APP, "PROVISIONING", pending["id"])

        done = await user.post(f"{SURFACE}/connect/complete", json={"completion_proof": proof})
        assert done.status_code == 200, done.text
        assert set(done.json()) == {"status", "connection"} and done.json()["status"] == "connected"
        assert done.json()["connection"]["status"] == "active"
        assert (await user.get(SURFACE)).json()["apps"][0]["connected"] is True
        assert [c["id"] for c in await listed(user)] == [pending["id"]]  # the account's personal connection
        assert await listed(managed.client) == []
