"""Connections in process: what each transport refuses, who may make and see what, and a static connection to a
real MCP server (one per module) photographed, reviewed, refreshed and revoked."""

from __future__ import annotations

import secrets
from typing import Any

import pytest

from api.routes import connections as connection_routes
from tests.api.conftest import Api
from tests.api.connections_helpers import (
    TOKEN,
    guarded_server,
    listed,
    member,
    not_returning_their_model,
    open_server,
    refused,
)
from tests.mcp_servers import RunningServer

ORG_ROLE = "creating an organization connection requires the admin or owner role"

# The module's servers, started once for it (tests.api.connections_helpers).
mcp = open_server
guarded = guarded_server


def test_every_handler_returns_the_model_it_declares() -> None:
    assert not_returning_their_model(connection_routes.router) == []


# Each refusal names the field; what the operator sends here is stored nowhere. ``{url}`` is a live MCP server.
REFUSALS: list[tuple[dict[str, Any], int, str]] = [
    ({"provider": "openapi", "transport": "http", "base_url": "{url}"}, 400,
     "`provider` 'openapi' and `transport` 'http' disagree"),
    ({"provider": "smtp", "base_url": "{url}"}, 400, "unsupported provider 'smtp' (supported: mcp_http, openapi"),
    ({"base_url": "{url}", "access": {"read": 5}}, 422, "bad access declaration"),
    # mcp_http
    ({"base_url": "{url}", "tools": []}, 400, "`tools` apply to sandbox_cli connections only"),
    ({"base_url": "{url}", "transport_config": {}}, 400,
     "`transport_config` applies to openapi, http, stdio and relay"),
    ({"token": "t"}, 400, "an mcp_http connection needs a `base_url`"),
    ({"base_url": "{url}"}, 400, "a static connection needs a `token` (or `credential_env`)"),
    ({"base_url": "{url}", "token": ""}, 400, "a static connection needs a `token` (or `credential_env`)"),
    ({"base_url": "{url}", "token": "t", "credential_env": "ACME_MCP_TOKEN"}, 400,
     "give either `token` or `credential_env`, not both"),
    ({"base_url": "{url}", "token": "t", "client_id": "c"}, 400,
     "`client_id`, `client_secret` and `scopes` apply to oauth connections only"),
    ({"base_url": "{url}", "token": "no-colon", "scheme": "Basic"}, 400,
     "a Basic credential must be `email:api_token`"),
    ({"base_url": "{url}", "auth_kind": "oauth", "token": "t"}, 400, "an oauth connection takes no `token`"),
    ({"base_url": "{url}", "auth_kind": "oauth", "client_secret": "s"}, 400,
     "`client_secret` needs the `client_id` it was issued with"),
    ({"base_url": "{url}", "auth_kind": "oauth", "scopes": ["has space"]}, 400, "non-empty OAuth scope tokens"),
    ({"base_url": "{url}", "auth_kind": "oauth", "header_name": "X-Key"}, 400,
     "`header_name` and `scheme` do not apply"),
    # git
    ({"transport": "git", "base_url": "https://git.example.com", "token": "t", "client_id": "c"}, 400,
     "a git connection takes no OAuth settings"),
    ({"transport": "git", "base_url": "https://git.example.com", "token": "t", "tools": []}, 400,
     "a git connection has no tools: it takes no `access`, `tools` or `transport_config`"),
    ({"transport": "git", "base_url": "https://git.example.com", "token": "t", "header_name": "X-Key"}, 400,
     "no `header_name` or `credential_env`"),
    ({"transport": "git", "token": "t"}, 400, "a git connection needs a `base_url`"),
    ({"transport": "git", "base_url": "https://git.example.com"}, 400, "a git connection needs a `token`"),
    ({"transport": "git", "base_url": "ftp://git.example.com", "token": "t"}, 400, "https:// prefix"),
    # relay
    ({"transport": "relay", "base_url": "https://relay.example.com", "token": "t", "scopes": ["a"]}, 400,
     "a relay connection takes no OAuth settings"),
    ({"transport": "relay", "base_url": "https://relay.example.com", "token": "t", "scheme": "Basic"}, 400,
     "a relay connection sends no custom header or scheme"),
    ({"transport": "relay", "token": "t"}, 400, "a relay connection needs a `base_url`"),
    ({"transport": "relay", "base_url": "https://relay.example.com", "token": "t", "tools": []}, 400,
     "a relay connection photographs its tools; it takes no `tools`"),
    ({"transport": "relay", "base_url": "https://relay.example.com", "credential_env": "ACME_MCP_TOKEN"}, 400,
     "it takes no `credential_env`"),
    ({"transport": "relay", "base_url": "https://relay.example.com"}, 400,
     "a relay connection needs the relay's `token`"),
    # sandbox_cli
    ({"transport": "sandbox_cli", "base_url": "sandbox-cli://gh", "token": "t"}, 400,
     "a sandbox_cli connection carries no credential, so it takes no `token`"),
    ({"transport": "sandbox_cli", "base_url": "sandbox-cli://gh", "credential_env": "ACME_MCP_TOKEN"}, 400,
     "so it takes no `credential_env`"),
    ({"transport": "sandbox_cli", "base_url": "sandbox-cli://gh", "transport_config": {"a": 1}}, 400,
     "a sandbox_cli connection declares its `tools`; it has no `transport_config`"),
    ({"transport": "sandbox_cli", "base_url": "https://gh.example.com", "tools": []}, 400,
     "a `base_url` of the form sandbox-cli://<name>"),
    # openapi, http, stdio
    ({"transport": "openapi", "base_url": "{url}", "transport_config": {"auth": {"type": "magic"}}}, 422, "auth"),
    ({"transport": "openapi", "base_url": "{url}", "transport_config": {}}, 422, "document"),
    ({"transport": "http", "base_url": "{url}", "transport_config": {}}, 422,
     "an http connection needs `endpoints` (method, path, arguments, access)"),
    ({"transport": "http", "transport_config": {"endpoints": []}, "token": "t"}, 400,
     "an http connection needs a `base_url`"),
    ({"transport": "http", "base_url": "{url}", "transport_config": {"endpoints": []}}, 400,
     "this connection's auth (bearer) needs a `token`"),
    ({"transport": "http", "base_url": "{url}", "transport_config": {"endpoints": [], "auth": {"type": "basic"}},
      "auth_kind": "oauth"}, 422, "an oauth connection's `auth` must be {type: oauth} (or left out)"),
    ({"transport": "http", "base_url": "{url}", "transport_config": {"endpoints": []}, "client_id": "c"}, 400,
     "`client_id`, `client_secret` and `scopes` apply to oauth connections only"),
    ({"transport": "stdio", "transport_config": {}}, 422, "a stdio connection needs a `command`"),
    ({"transport": "stdio", "transport_config": {"command": "python3"}, "auth_kind": "oauth"}, 400,
     "a stdio connection takes its credential through `credential_env`, not OAuth"),
    ({"transport": "stdio", "base_url": "https://x.example.com", "transport_config": {"command": "python3"}}, 422,
     "a stdio connection's `base_url` (its name for requirements) must start with stdio://"),
]  # fmt: skip


async def test_each_transport_refuses_what_it_cannot_use_naming_it_and_stores_nothing(
    api: Api, mcp: RunningServer
) -> None:
    for body, status, words in REFUSALS:
        sent = {k: v.format(url=mcp.url) if isinstance(v, str) else v for k, v in body.items()}
        r = await api.client.post("/v1/connections", json=sent)
        assert r.status_code == status, (sent, r.text)
        assert words in r.json()["error"], (sent, r.text)
    assert await listed(api.client) == []
    assert mcp.methods == []  # nothing was contacted either


async def test_who_may_make_which_connection(api: Api, mcp: RunningServer) -> None:
    """The operator owns stdio and the control plane's environment; an organization connection needs the admin or
    owner role; a personal one is a signed-in user's; a read-only token changes nothing."""
    admin, _ = await member(api, "admin")
    plain, _ = await member(api)
    reader, _ = await member(api, "admin", read_only=True)
    static = {"base_url": mcp.url, "token": "t"}
    stdio = {"transport": "stdio", "transport_config": {"command": "python3"}}
    cases = [
        (admin, stdio, 403, "a stdio connection runs its command on the control plane's hosts, unsandboxed"),
        (admin, {"base_url": mcp.url, "credential_env": "ACME_MCP_TOKEN"}, 403,
         "`credential_env` reads the control plane's environment: only the operator (admin token) may name one"),
        (plain, static, 403, ORG_ROLE),
        (plain, {**stdio, "owner": "personal"}, 403, "only the operator (admin token) can create one"),
        (plain, {"transport": "git", "base_url": "https://git.example.com", "token": "t"}, 403, ORG_ROLE),
        (plain, {"transport": "relay", "owner": "personal", "base_url": "https://r.example.com", "token": "t"}, 403,
         ORG_ROLE),
        (admin, {"transport": "sandbox_cli", "owner": "personal", "base_url": "sandbox-cli://gh", "tools": []}, 400,
         "a sandbox_cli connection is an organization connection"),
        (api.client, {**static, "owner": "personal"}, 400,
         "a personal connection belongs to a signed-in user; the operator token has none"),
        (reader, static, 403, "this token is read-only"),
    ]  # fmt: skip
    for client, body, status, words in cases:
        refused(await client.post("/v1/connections", json=body), status, words)
    for client in (api.client, admin, plain):
        assert await listed(client) == []
    assert mcp.methods == []


async def test_a_static_connection_is_photographed_reviewed_refreshed_and_revoked(api: Api, mcp: RunningServer) -> None:
    secret = "tok-" + secrets.token_hex(6)
    r = await api.client.post(
        "/v1/connections", json={"base_url": mcp.url, "token": secret, "access": {"read": True}, "display_name": "Calc"}
    )
    assert r.status_code == 200, r.text
    assert secret not in r.text and "next" not in r.json()
    connection, snapshot = r.json()["connection"], r.json()["snapshot"]
    assert (connection["status"], connection["transport"], connection["owner_type"]) == (
        "active", "mcp_http", "organization"
    )  # fmt: skip
    assert snapshot["version"] == 1 and {"add", "echo"} <= {t["name"] for t in snapshot["tools"]}
    assert set(snapshot["tools"][0]) == {"name", "description"}
    cid = connection["id"]

    tools = (await api.client.get(f"/v1/connections/{cid}/tools")).json()["snapshot"]
    add = next(t for t in tools["tools"] if t["name"] == "add")
    assert add == {"name": "add", "description": add["description"], "access": "read", "approval": None,
                   "review": "approved"}  # fmt: skip
    assert (await api.client.get(f"/v1/connections/{cid}")).json() == {"connection": connection}
    assert (await api.client.get(f"/v1/connections/{cid}/tools/changes")).json() == {"changes": []}
    refused(await api.client.post(f"/v1/connections/{cid}/tools/changes/{cid}/approve"), 404, "no such tool change")
    refused(await api.client.post(f"/v1/connections/{cid}/oauth/start"), 400, "this connection does not use OAuth")

    refreshed = await api.client.post(f"/v1/connections/{cid}/tools/refresh")
    assert refreshed.status_code == 200 and refreshed.json()["snapshot"]["version"] == 2, refreshed.text
    authorized = await api.client.get("/v1/connections/authorize", params={"connection": cid})
    assert authorized.json() == {"status": "connected", "connection_id": cid}

    edited = await api.client.patch(f"/v1/connections/{cid}", json={"access": {"read": False}})
    assert edited.status_code == 200 and edited.json()["connection"]["access"]["read"]["tools"] == []
    refused(await api.client.patch(f"/v1/connections/{cid}", json={"access": {"write": 3}}), 422, "access")

    revoked = await api.client.post(f"/v1/connections/{cid}/revoke")
    assert revoked.status_code == 200 and revoked.json()["connection"]["status"] == "revoked"
    refused(await api.client.post(f"/v1/connections/{cid}/revoke"), 409, "")
    refused(await api.client.post(f"/v1/connections/{cid}/tools/refresh"), 400, "connection is revoked")


async def test_a_rejected_credential_stores_nothing_and_a_new_one_is_photographed_first(
    api: Api, guarded: RunningServer
) -> None:
    wrong = await api.client.post("/v1/connections", json={"base_url": guarded.url, "token": "wrong"})
    refused(wrong, 400, "the server rejected this credential (connection rolled back)")
    assert await listed(api.client) == []
    made = await api.client.post("/v1/connections", json={"base_url": guarded.url, "token": TOKEN})
    assert made.status_code == 200, made.text
    cid = made.json()["connection"]["id"]
    generation = made.json()["connection"]["authorization_generation"]
    refused(await api.client.put(f"/v1/connections/{cid}/credential", json={}), 400, "exactly one of `token`")
    again = await api.client.put(f"/v1/connections/{cid}/credential", json={"token": "still-wrong"})
    refused(again, 400, "rejected this credential")
    assert (await api.client.get(f"/v1/connections/{cid}")).json()["connection"] == made.json()["connection"]
    replaced = await api.client.put(f"/v1/connections/{cid}/credential", json={"token": TOKEN})
    assert replaced.status_code == 200, replaced.text
    assert replaced.json()["connection"]["authorization_generation"] == generation + 1
    assert set(replaced.json()) == {"connection", "snapshot"}


async def test_a_personal_connection_is_its_owners_alone(api: Api, mcp: RunningServer) -> None:
    owner, owner_id = await member(api)
    admin, _ = await member(api, "owner")
    r = await owner.post("/v1/connections", json={"base_url": mcp.url, "token": "t", "owner": "personal"})
    assert r.status_code == 200, r.text
    mine = r.json()["connection"]
    assert (mine["owner_type"], mine["owner_user_id"]) == ("user", owner_id)
    cid = mine["id"]
    for other in (api.client, admin):
        for method, path in (("GET", ""), ("GET", "/tools"), ("POST", "/revoke"), ("POST", "/tools/refresh")):
            refused(await other.request(method, f"/v1/connections/{cid}{path}"), 404, "not found")
        assert await listed(other) == []
    assert [c["id"] for c in await listed(owner)] == [cid]
    assert (await owner.post(f"/v1/connections/{cid}/revoke")).json()["connection"]["status"] == "revoked"


async def test_an_organization_connection_is_seen_by_members_and_managed_by_admins(
    api: Api, mcp: RunningServer
) -> None:
    made = await api.client.post("/v1/connections", json={"base_url": mcp.url, "token": "t"})
    cid = made.json()["connection"]["id"]
    plain, _ = await member(api)
    assert [c["id"] for c in await listed(plain)] == [cid]
    refused(await plain.post(f"/v1/connections/{cid}/revoke"), 403, "revoking an organization connection requires")
    refused(
        await plain.patch(f"/v1/connections/{cid}", json={"access": {"read": True}}), 403, "editing an organization"
    )
    assert (await api.client.get(f"/v1/connections/{cid}")).json()["connection"]["status"] == "active"


@pytest.mark.parametrize(
    ("params", "status", "words"),
    [
        ({"connection": "no-such-entry"}, 404, "not found"),
        ({"connection": "sentry", "owner": "personal"}, 409, "a personal connection needs a signed-in user"),
        ({"connection": "github"}, 409, "'github' has no auth definition to start"),
    ],
)
async def test_authorizing_a_catalog_entry_names_what_is_missing(
    api: Api, params: dict[str, str], status: int, words: str
) -> None:
    r = await api.client.get("/v1/connections/authorize", params=params)
    refused(r, status, words)
    if status == 409:
        assert r.json()["status"] == "unavailable" and r.json()["reason"] == r.json()["error"]
    assert await listed(api.client) == []
