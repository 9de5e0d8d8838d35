"""The connector OAuth browser legs in process: the flow cookie a browser keeps (``__Host-``, ``Secure``, also on a
loopback http origin), the refusal where no browser would keep it, and the Client ID Metadata Document. One real
authorization server (npm oidc-provider) and one MCP server protected by it serve the module."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from api.routes import oauth as oauth_routes
from integrations.oauth import client_metadata_document
from tests.api.conftest import Api
from tests.api.connections_helpers import (
    app_with,
    authorization,
    listed,
    not_returning_their_model,
    oauth_protected,
    refused,
)
from tests.mcp_servers import RunningServer
from tests.oauth_servers import AuthorizationServer

COOKIE = "__Host-fbx_oauth_flow"
PUBLIC_HTTPS = "https://fluidbox.example.com"

# The module's servers, started once for it (tests.api.connections_helpers).
auth = authorization
mcp = oauth_protected


def test_every_handler_returns_the_model_it_declares() -> None:
    assert not_returning_their_model(oauth_routes.router) == []


def local(url: str) -> str:
    """``url`` as a request to the in-process app (its path and query)."""
    parts = urlsplit(url)
    return f"{parts.path}?{parts.query}"


async def test_the_flow_cookie_is_host_prefixed_and_secure_on_a_loopback_http_origin(
    api: Api, auth: AuthorizationServer, mcp: RunningServer
) -> None:
    """The public URL is http://127.0.0.1:8787: a browser treats it as a secure context and keeps the cookie."""
    made = await api.client.post(
        "/v1/connections",
        json={"base_url": mcp.url, "auth_kind": "oauth", "access": {"read": True}, "display_name": "Calc"},
    )
    assert made.status_code == 200, made.text
    cid = made.json()["connection"]["id"]
    started = await api.client.post(f"/v1/connections/{cid}/oauth/start")
    assert started.status_code == 200, started.text
    async with api.as_token(None) as browser:
        go = await browser.get(local(started.json()["go_url"]))
        assert go.status_code == 302, go.text
        cookie = go.headers["set-cookie"]
        name, _, rest = cookie.partition("=")
        value, *attributes = [part.strip() for part in rest.split(";")]
        assert name == COOKIE and value
        assert {a.lower() for a in attributes} == {"httponly", "max-age=600", "path=/", "samesite=lax", "secure"}
        landed = await auth.sign_in(go.headers["location"])
        # Another browser (no cookie) is refused and the flow stays usable for the one that opened it.
        refused(await browser.get(local(landed)), 403, "another browser")
        page = await browser.get(local(landed), headers={"cookie": f"{COOKIE}={value}"})
    assert page.status_code == 200 and "<h1>Connected</h1>" in page.text, page.text
    assert (await api.client.get(f"/v1/connections/{cid}")).json()["connection"]["status"] == "active"


async def test_a_plain_http_public_url_off_loopback_refuses_the_sign_in_link_before_binding_anything(
    api: Api, tmp_path: Path
) -> None:
    async with app_with(api, tmp_path, public_url="http://fluidbox.example.com:8787") as other:
        async with other.as_token(None) as browser:
            r = await browser.get("/v1/oauth/go", params={"f": "anything"})
    refused(r, 400, "this sign-in cannot finish here", "plain http", "FLUIDBOX_PUBLIC_URL")
    assert "set-cookie" not in r.headers
    async with api.as_token(None) as browser:  # loopback: the link itself is what is refused
        forged = await browser.get("/v1/oauth/go", params={"f": "forged"})
        assert (forged.status_code, forged.json()["error"]) == (400, "this sign-in link is not valid")
        assert "set-cookie" not in forged.headers
        refused(await browser.get("/v1/oauth/callback", params={"code": "x"}), 400, "state")
        refused(await browser.get("/v1/oauth/callback", params={"code": "x", "state": "unknown"}), 404, "")
    assert await listed(api.client) == []


@pytest.mark.parametrize(
    ("url", "secure"),
    [
        ("https://fluidbox.example.com", True),
        ("http://127.0.0.1:8787", True),
        ("http://127.8.0.1", True),
        ("http://localhost:8787", True),
        ("http://fluidbox.localhost", True),
        ("http://[::1]:8787", True),
        ("http://fluidbox.example.com", False),
        ("http://10.0.0.8:8787", False),
        ("http://localhost.example.com", False),
    ],
)
def test_which_public_urls_browsers_keep_a_secure_cookie_from(url: str, secure: bool) -> None:
    assert oauth_routes.secure_context(url) is secure


async def test_the_client_document_has_a_schema_and_is_served_only_for_a_public_https_url(
    api: Api, tmp_path: Path
) -> None:
    path = "/.well-known/fluidbox-client.json"
    refused(await api.client.get(path), 404, "not found")  # loopback http: no authorization server could fetch it
    async with app_with(api, tmp_path, public_url=PUBLIC_HTTPS) as other:
        served = await other.client.get(path)
        schema = (await other.client.get("/openapi.json")).json()["paths"][path]["get"]["responses"]["200"]
    assert served.status_code == 200 and served.headers["cache-control"] == "public, max-age=300"
    document = client_metadata_document(PUBLIC_HTTPS)
    assert served.content == json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()
    assert served.json()["client_id"] == f"{PUBLIC_HTTPS}{path}"
    assert schema["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ClientMetadataDocument"}
