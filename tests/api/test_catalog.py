"""The connector catalog in process: seeded and custom entries and their refusals, connecting an entry (a sealed
connection against a real MCP server, or a sandbox bundle), the probe, and one-call custom server connect. Real
MCP servers (one of each kind per module) and, for the probe of an OAuth server, a real authorization server
(npm oidc-provider) with an MCP server it protects."""

from __future__ import annotations

import asyncio
import secrets
import socket
import uuid
from typing import Any

from api.routes import catalog as catalog_routes
from tests.api.conftest import Api
from tests.api.connections_helpers import (
    TOKEN,
    authorization,
    guarded_server,
    listed,
    not_returning_their_model,
    oauth_protected,
    open_server,
    refused,
)
from tests.mcp_servers import RunningServer
from tests.oauth_servers import AuthorizationServer

# The module's servers, started once for it (tests.api.connections_helpers).
open_srv = open_server
closed_srv = guarded_server
auth = authorization
signed = oauth_protected


def refusing_url() -> str:
    """A loopback URL nothing listens on (the port was free a moment ago)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/mcp"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_every_handler_returns_the_model_it_declares() -> None:
    assert not_returning_their_model(catalog_routes.router) == []


async def test_curated_entries_are_seeded_and_custom_ones_are_tenant_scoped(api: Api) -> None:
    connectors = {c["slug"]: c for c in (await api.client.get("/v1/catalog")).json()["connectors"]}
    assert {"github", "sentry", "stripe", "linear", "atlassian", "notion", "workspace-info"} <= set(connectors)
    github, atlassian = connectors["github"], connectors["atlassian"]
    assert (github["url"], github["auth_mode"], github["connectable"]) == (
        "https://api.githubcopilot.com/mcp/", "api_key", True
    )  # fmt: skip
    assert (atlassian["url"], atlassian["auth_mode"]) == ("https://mcp.atlassian.com/v1/mcp/authv2", "oauth")
    assert github["access"]["write"]["tools"] and atlassian["access"]["write"]["approval"] == "always"
    assert connectors["sentry"]["auth_mode"] == "api_key" and connectors["sentry"]["tier"] == "verified"
    assert connectors["linear"]["auth_mode"] == "oauth" and connectors["linear"]["connectable"] is False
    assert connectors["workspace-info"]["sandbox_launch"]["command"] == "python3"
    slug = unique("custom")
    made = await api.client.post("/v1/catalog", json={"slug": slug, "name": "Ours", "url": "https://93.184.216.34/mcp"})
    assert made.status_code == 200 and made.json()["connector"]["tier"] == "custom"
    dup = await api.client.post("/v1/catalog", json={"slug": "sentry", "name": "Shadow"})
    assert (dup.status_code, dup.json()) == (
        409,
        {"error": "a catalog entry with slug 'sentry' already exists", "code": "conflict"},
    )
    bad = await api.client.post(
        "/v1/catalog", json={"slug": slug + "-x", "name": "Inner", "url": "http://10.0.0.8/mcp"}
    )
    assert bad.status_code == 400 and "private" in bad.json()["error"]
    assert (await api.client.get(f"/v1/catalog/{slug}")).json()["connector"]["name"] == "Ours"
    assert (await api.client.get("/v1/catalog/no-such-entry")).status_code == 404


async def test_an_api_key_entry_connects_and_a_rejected_key_rolls_back(api: Api, closed_srv: RunningServer) -> None:
    slug = unique("svc")
    await api.client.post(
        "/v1/catalog", json={"slug": slug, "name": "Svc", "url": closed_srv.url, "auth_mode": "api_key"}
    )
    before = (await api.client.get("/v1/connections")).json()["connections"]
    wrong = await api.client.post(f"/v1/catalog/{slug}/connect", json={"token": "nope-" + secrets.token_hex(4)})
    assert wrong.status_code == 400 and "rolled back" in wrong.json()["error"]
    assert (await api.client.get("/v1/connections")).json()["connections"] == before
    ok = await api.client.post(f"/v1/catalog/{slug}/connect", json={"token": TOKEN})
    assert ok.status_code == 200 and TOKEN not in ok.text
    assert set(ok.json()) == {"connection", "snapshot"}
    assert {t["name"] for t in ok.json()["snapshot"]["tools"]} >= {"add", "echo"}
    listed = {c["slug"]: c for c in (await api.client.get("/v1/catalog")).json()["connectors"]}
    assert listed[slug]["connection"]["id"] == ok.json()["connection"]["id"]
    # An OAuth entry whose server cannot be reached (this suite runs offline) is refused with nothing stored;
    # tests/integration/test_oauth_connections.py connects one that can.
    before = (await api.client.get("/v1/connections")).json()["connections"]
    oauth = await api.client.post("/v1/catalog/linear/connect", json={})
    assert oauth.status_code == 400 and "mcp.linear.app" in oauth.json()["error"]
    assert (await api.client.get("/v1/connections")).json()["connections"] == before


async def test_an_in_image_entry_connects_as_a_sandbox_bundle(api: Api) -> None:
    name = unique("wsinfo").replace("-", "_")
    r = await api.client.post("/v1/catalog/workspace-info/connect", json={"bundle_name": name})
    assert r.status_code == 200 and r.json()["bundle"]["name"] == name
    listed = [b for b in (await api.client.get("/v1/capabilities")).json()["bundles"] if b["name"] == name]
    assert listed and listed[0]["classes"] == ["sandbox"] and listed[0]["tool_count"] == 1


async def test_an_in_image_entry_connected_without_a_name_is_the_bundle_named_after_its_slug(
    api: Api,
) -> None:
    r = await api.client.post("/v1/catalog/workspace-info/connect", json={})
    assert r.status_code == 200, r.text
    bundle = r.json()["bundle"]
    assert bundle["name"] == "workspace-info"
    listed = {c["slug"]: c for c in (await api.client.get("/v1/catalog")).json()["connectors"]}
    assert listed["workspace-info"]["bundle"] == bundle  # the newest bundle of that name, under its entry
    assert listed["sentry"]["bundle"] is None
    names = {b["name"] for b in (await api.client.get("/v1/capabilities")).json()["bundles"]}
    assert "workspace-info" in names and "workspace_info" not in names


async def test_probe_of_an_address_the_admission_refuses_is_unreachable_with_the_reason(
    api: Api,
) -> None:
    before = (await api.client.get("/v1/connections")).json()
    r = await api.client.post("/v1/mcp/probe", json={"url": "http://10.0.0.8/mcp"})
    assert r.status_code == 200, r.text
    body = r.json()
    notes = body.pop("notes")
    assert body == {
        "url": "http://10.0.0.8/mcp", "transport": "streamable_http", "reachable": False, "auth_mode": None,
        "oauth_available": False, "static_possible": False, "tools_preview": [], "tools_truncated": False,
        "oauth": None, "auth_hints": {},
    }  # fmt: skip
    assert len(notes) == 1 and "private" in notes[0], notes
    assert (await api.client.get("/v1/connections")).json() == before


async def test_probe_names_the_authorization_server_an_oauth_server_signs_in_with(
    api: Api, auth: AuthorizationServer, signed: RunningServer
) -> None:
    found = (await api.client.post("/v1/mcp/probe", json={"url": signed.url})).json()
    assert (found["reachable"], found["auth_mode"], found["oauth_available"]) == (True, "oauth", True)
    assert found["oauth"]["issuer"] == auth.issuer
    assert found["oauth"]["authorization_endpoint"] == auth.metadata["authorization_endpoint"]
    assert found["tools_preview"] == [] and found["auth_hints"] == {}
    assert await listed(api.client) == []


async def test_probe_of_a_catalogued_server_gives_its_entrys_credential_hints(
    api: Api, closed_srv: RunningServer
) -> None:
    slug = unique("hinted")
    hints = {"header_name": "X-Api-Key", "scheme": "", "help": "An API key from the settings page."}
    entry = {"slug": slug, "name": "Hinted", "url": closed_srv.url, "auth_hints": hints}
    made = await api.client.post("/v1/catalog", json=entry)
    assert made.status_code == 200, made.text
    found = (await api.client.post("/v1/mcp/probe", json={"url": closed_srv.url})).json()
    assert (found["auth_mode"], found["oauth_available"], found["auth_hints"]) == ("api_key", False, hints)
    assert any("no OAuth sign-in" in n for n in found["notes"]), found["notes"]


async def test_probe_detects_auth_and_previews_tools_without_storing_anything(
    api: Api, open_srv: RunningServer, closed_srv: RunningServer
) -> None:
    before = (await api.client.get("/v1/connections")).json()
    opened = (await api.client.post("/v1/mcp/probe", json={"url": open_srv.url})).json()
    assert (opened["reachable"], opened["auth_mode"], opened["static_possible"]) == (True, "none", True)
    assert {t["name"] for t in opened["tools_preview"]} >= {"add", "echo"}
    assert opened["tools_truncated"] is False and opened["notes"][-1].startswith("negotiated MCP ")
    closed = (await api.client.post("/v1/mcp/probe", json={"url": closed_srv.url})).json()
    assert (closed["reachable"], closed["auth_mode"], closed["tools_preview"]) == (True, "api_key", [])
    gone = (await api.client.post("/v1/mcp/probe", json={"url": refusing_url()})).json()
    assert gone["reachable"] is False and gone["notes"]
    assert (await api.client.get("/v1/connections")).json() == before


async def test_one_call_connect_leaves_no_orphan_entry_when_it_fails(api: Api, closed_srv: RunningServer) -> None:
    name = unique("Team Server")
    failed = await api.client.post("/v1/mcp/servers", json={"url": closed_srv.url, "name": name, "token": "wrong-1"})
    assert failed.status_code == 400
    slugs = {c["slug"] for c in (await api.client.get("/v1/catalog")).json()["connectors"]}
    assert name.lower().replace(" ", "-") not in slugs
    for body, words in (
        ({"auth_mode": "oauth"}, "only api_key servers can be connected in one call today"),
        ({}, "an api_key server needs a `token`"),
        ({"token": TOKEN, "owner": "personal"}, "the operator token has none"),
        ({"token": TOKEN, "name": "!!!"}, "`name` must contain letters or digits"),
    ):
        refused(
            await api.client.post("/v1/mcp/servers", json={"url": closed_srv.url, "name": name, **body}), 400, words
        )
    assert {c["slug"] for c in (await api.client.get("/v1/catalog")).json()["connectors"]} == slugs
    made = await api.client.post("/v1/mcp/servers", json={"url": closed_srv.url, "name": name, "token": TOKEN})
    assert made.status_code == 200, made.text
    assert made.json()["connector"]["slug"] == name.lower().replace(" ", "-")
    assert made.json()["connection"]["status"] == "active" and TOKEN not in made.text


ECHO_TOOL = {
    "name": "echo_args",
    "command": "printf",
    "args": ["[%s]\\n", "{text}"],
    "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}, "additionalProperties": False},
}


async def test_connecting_an_entry_is_refused_in_the_catalogs_words_and_stores_nothing(
    api: Api, closed_srv: RunningServer
) -> None:
    entries = {
        "relay": {"url": "https://93.184.216.34/mcp", "transport": "relay", "auth_mode": "api_key"},
        "cli": {"url": "sandbox-cli://echo", "transport": "sandbox_cli", "auth_mode": "none",
                "transport_config": {"tools": [ECHO_TOOL]}},
        "keyed": {"url": closed_srv.url, "auth_mode": "api_key"},
        "signin": {"url": closed_srv.url, "auth_mode": "oauth"},
        "nowhere": {"auth_mode": "api_key"},
    }  # fmt: skip
    for slug, entry in entries.items():
        r = await api.client.post("/v1/catalog", json={"slug": slug, "name": slug.title(), **entry})
        assert r.status_code == 200, r.text
    cases = [
        ("relay", {"token": "t", "client_id": "c"}, "'relay' (relay) takes no OAuth settings"),
        ("relay", {}, "'relay' is a relay: it needs the relay's credential as `token`"),
        ("cli", {"scopes": ["a"]}, "'cli' (sandbox_cli) takes no OAuth settings"),
        ("cli", {"token": "t"}, "'cli' is a sandbox CLI: it takes no `token` (its tools run inside the sandbox"),
        ("keyed", {}, "'keyed' needs a `token`"),
        ("keyed", {"token": ""}, "'keyed' needs a `token`"),
        ("signin", {"token": "t"}, "'signin' connects with OAuth: it takes no `token`"),
        ("signin", {"client_secret": "s"}, "`client_secret` needs the `client_id` it was issued with"),
        ("nowhere", {"token": "t"}, "'nowhere' has no URL to connect to"),
        ("keyed", {"token": TOKEN, "owner": "personal"}, "the operator token has none"),
    ]
    for slug, body, words in cases:
        refused(await api.client.post(f"/v1/catalog/{slug}/connect", json=body), 400, words)
    refused(await api.client.post("/v1/catalog/no-such-entry/connect", json={}), 404, "not found")
    assert await listed(api.client) == []
    cli = await api.client.post("/v1/catalog/cli/connect", json={})
    assert cli.status_code == 200, cli.text
    assert cli.json()["connection"]["base_url"] == "sandbox-cli://echo"
    assert [t["name"] for t in cli.json()["snapshot"]["tools"]] == ["echo_args"]


async def slugs(api: Api) -> list[str]:
    return sorted(c["slug"] for c in (await api.client.get("/v1/catalog")).json()["connectors"])


async def test_a_duplicate_slug_is_409_whatever_else_the_body_says_and_changes_nothing(api: Api) -> None:
    slug = unique("dup")
    assert (await api.client.post("/v1/catalog", json={"slug": slug, "name": "First"})).status_code == 200
    before = (await api.client.get("/v1/catalog")).json()
    # Re-posting an entry names the duplicate, even when its URL is one the admission would refuse.
    for taken in ("sentry", slug):
        r = await api.client.post("/v1/catalog", json={"slug": taken, "name": "Again", "url": "http://10.0.0.8/mcp"})
        assert (r.status_code, r.json()) == (
            409,
            {"error": f"a catalog entry with slug '{taken}' already exists", "code": "conflict"},
        )
    assert (await api.client.get("/v1/catalog")).json() == before
    # Simultaneous creates of one new slug: the unique index decides, and every loser gets the same 409.
    racing = unique("race")
    results = await asyncio.gather(
        *[api.client.post("/v1/catalog", json={"slug": racing, "name": f"Racer {i}"}) for i in range(6)]
    )
    assert sorted(r.status_code for r in results) == [200, 409, 409, 409, 409, 409], [r.text for r in results]
    for r in results:
        if r.status_code == 409:
            assert r.json() == {"error": f"a catalog entry with slug '{racing}' already exists", "code": "conflict"}
    winner = next(r.json()["connector"] for r in results if r.status_code == 200)
    assert (await api.client.get(f"/v1/catalog/{racing}")).json()["connector"]["name"] == winner["name"]
    assert (await slugs(api)).count(racing) == 1


LAUNCH = {
    "command": "python3",
    "args": ["-m", "lint_mcp"],
    "tools": [{"name": "check", "description": "lint a file", "input_schema": {"type": "object"}}],
}


STDIO_REFUSALS: list[tuple[dict[str, Any], str]] = [
    ({"transport": "stdio"}, "a stdio catalog entry needs `sandbox_launch`"),
    ({"transport": "stdio", "sandbox_launch": None}, "a stdio catalog entry needs `sandbox_launch`"),
    (
        {"transport": "stdio", "sandbox_launch": {"command": "python3"}},
        "invalid sandbox_launch: sandbox server '{slug}' declares no tools",
    ),
    (
        {"transport": "stdio", "sandbox_launch": {**LAUNCH, "tools": []}},
        "invalid sandbox_launch: sandbox server '{slug}' declares no tools",
    ),
    (
        {"transport": "stdio", "sandbox_launch": {**LAUNCH, "command": None}},
        "invalid sandbox_launch: sandbox server '{slug}' needs a `command`",
    ),
]


async def test_a_stdio_entry_needs_a_sandbox_launch_with_declared_tools(api: Api) -> None:
    before = (await api.client.get("/v1/catalog")).json()
    for extra, message in STDIO_REFUSALS:
        slug = unique("stdio")
        r = await api.client.post("/v1/catalog", json={"slug": slug, "name": "In image", "auth_mode": "none", **extra})
        assert r.status_code == 400 and message.format(slug=slug) in r.json()["error"], r.text
        assert (await api.client.get(f"/v1/catalog/{slug}")).status_code == 404
    assert (await api.client.get("/v1/catalog")).json() == before


async def test_a_stdio_entry_with_its_launch_connects_as_a_bundle_with_its_tools(api: Api) -> None:
    slug = unique("stdio")
    body = {"slug": slug, "name": "Lint", "transport": "stdio", "auth_mode": "none", "sandbox_launch": LAUNCH}
    made = await api.client.post("/v1/catalog", json=body)
    assert made.status_code == 200, made.text
    assert made.json()["connector"]["sandbox_launch"] == LAUNCH
    name = unique("lint").replace("-", "_")
    bundle = (await api.client.post(f"/v1/catalog/{slug}/connect", json={"bundle_name": name})).json()["bundle"]
    detail = (await api.client.get(f"/v1/capabilities/{bundle['id']}")).json()
    assert detail["servers"][0]["name"] == slug
    assert detail["servers"][0]["tools"] == [{"name": "check", "description": "lint a file"}]
