"""The connector catalog, the probe, and one-call custom connect — against real MCP servers."""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import httpx
import pytest

from tests.integration.helpers import unique
from tests.mcp_servers import RunningServer, basic, bearer, serve
from tests.oauth_servers import AuthorizationServer

pytestmark = pytest.mark.stack


async def test_curated_entries_are_seeded_and_custom_ones_are_tenant_scoped(api: httpx.AsyncClient) -> None:
    connectors = {c["slug"]: c for c in (await api.get("/v1/catalog")).json()["connectors"]}
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
    made = await api.post("/v1/catalog", json={"slug": slug, "name": "Ours", "url": "https://93.184.216.34/mcp"})
    assert made.status_code == 200 and made.json()["connector"]["tier"] == "custom"
    dup = await api.post("/v1/catalog", json={"slug": "sentry", "name": "Shadow"})
    assert (dup.status_code, dup.json()) == (
        409,
        {"error": "a catalog entry with slug 'sentry' already exists", "code": "conflict"},
    )
    bad = await api.post("/v1/catalog", json={"slug": slug + "-x", "name": "Inner", "url": "http://10.0.0.8/mcp"})
    assert bad.status_code == 400 and "private" in bad.json()["error"]
    assert (await api.get(f"/v1/catalog/{slug}")).json()["connector"]["name"] == "Ours"
    assert (await api.get("/v1/catalog/no-such-entry")).status_code == 404


async def test_an_api_key_entry_connects_and_a_rejected_key_rolls_back(api: httpx.AsyncClient) -> None:
    token = "tok-" + secrets.token_hex(8)
    async with serve(bearer(token)) as srv:
        slug = unique("svc")
        await api.post("/v1/catalog", json={"slug": slug, "name": "Svc", "url": srv.url, "auth_mode": "api_key"})
        before = (await api.get("/v1/connections")).json()["connections"]
        wrong = await api.post(f"/v1/catalog/{slug}/connect", json={"token": "nope-" + secrets.token_hex(4)})
        assert wrong.status_code == 400 and "rolled back" in wrong.json()["error"]
        assert (await api.get("/v1/connections")).json()["connections"] == before
        ok = await api.post(f"/v1/catalog/{slug}/connect", json={"token": token})
        assert ok.status_code == 200 and token not in ok.text
        assert {t["name"] for t in ok.json()["snapshot"]["tools"]} >= {"add", "echo"}
        listed = {c["slug"]: c for c in (await api.get("/v1/catalog")).json()["connectors"]}
        assert listed[slug]["connection"]["id"] == ok.json()["connection"]["id"]
    # An OAuth entry whose server cannot be reached (this suite runs offline) is refused with nothing stored;
    # tests/integration/test_oauth_connections.py connects one that can.
    before = (await api.get("/v1/connections")).json()["connections"]
    oauth = await api.post("/v1/catalog/linear/connect", json={})
    assert oauth.status_code == 400 and "mcp.linear.app" in oauth.json()["error"]
    assert (await api.get("/v1/connections")).json()["connections"] == before


async def test_an_in_image_entry_connects_as_a_sandbox_bundle(api: httpx.AsyncClient) -> None:
    name = unique("wsinfo").replace("-", "_")
    r = await api.post("/v1/catalog/workspace-info/connect", json={"bundle_name": name})
    assert r.status_code == 200 and r.json()["bundle"]["name"] == name
    listed = [b for b in (await api.get("/v1/capabilities")).json()["bundles"] if b["name"] == name]
    assert listed and listed[0]["classes"] == ["sandbox"] and listed[0]["tool_count"] == 1


async def test_an_in_image_entry_connected_without_a_name_is_the_bundle_named_after_its_slug(
    api: httpx.AsyncClient,
) -> None:
    r = await api.post("/v1/catalog/workspace-info/connect", json={})
    assert r.status_code == 200, r.text
    bundle = r.json()["bundle"]
    assert bundle["name"] == "workspace-info"
    listed = {c["slug"]: c for c in (await api.get("/v1/catalog")).json()["connectors"]}
    assert listed["workspace-info"]["bundle"] == bundle  # the newest bundle of that name, under its entry
    assert listed["sentry"]["bundle"] is None
    names = {b["name"] for b in (await api.get("/v1/capabilities")).json()["bundles"]}
    assert "workspace-info" in names and "workspace_info" not in names


async def test_probe_of_an_address_the_admission_refuses_is_unreachable_with_the_reason(
    api: httpx.AsyncClient,
) -> None:
    before = (await api.get("/v1/connections")).json()
    r = await api.post("/v1/mcp/probe", json={"url": "http://10.0.0.8/mcp"})
    assert r.status_code == 200, r.text
    body = r.json()
    notes = body.pop("notes")
    assert body == {
        "url": "http://10.0.0.8/mcp", "transport": "streamable_http", "reachable": False, "auth_mode": None,
        "oauth_available": False, "static_possible": False, "tools_preview": [], "tools_truncated": False,
        "oauth": None, "auth_hints": {},
    }  # fmt: skip
    assert len(notes) == 1 and "private" in notes[0], notes
    assert (await api.get("/v1/connections")).json() == before


async def test_probe_names_the_authorization_server_an_oauth_server_signs_in_with(
    api: httpx.AsyncClient, auth: AuthorizationServer, mcp: RunningServer
) -> None:
    found = (await api.post("/v1/mcp/probe", json={"url": mcp.url})).json()
    assert (found["reachable"], found["auth_mode"], found["oauth_available"]) == (True, "oauth", True)
    assert found["oauth"]["issuer"] == auth.issuer
    assert found["oauth"]["authorization_endpoint"] == auth.metadata["authorization_endpoint"]
    assert found["tools_preview"] == [] and found["auth_hints"] == {}


async def test_probe_of_a_catalogued_server_gives_its_entrys_credential_hints(api: httpx.AsyncClient) -> None:
    async with serve(bearer("secret-" + secrets.token_hex(4))) as srv:
        slug = unique("hinted")
        hints = {"header_name": "X-Api-Key", "scheme": "", "help": "An API key from the settings page."}
        made = await api.post("/v1/catalog", json={"slug": slug, "name": "Hinted", "url": srv.url, "auth_hints": hints})
        assert made.status_code == 200, made.text
        found = (await api.post("/v1/mcp/probe", json={"url": srv.url})).json()
    assert (found["auth_mode"], found["oauth_available"], found["auth_hints"]) == ("api_key", False, hints)
    assert any("no OAuth sign-in" in n for n in found["notes"]), found["notes"]


async def test_probe_detects_auth_and_previews_tools_without_storing_anything(api: httpx.AsyncClient) -> None:
    before = (await api.get("/v1/connections")).json()
    async with serve(basic()) as open_srv, serve(bearer("secret-" + secrets.token_hex(4))) as closed_srv:
        opened = (await api.post("/v1/mcp/probe", json={"url": open_srv.url})).json()
        assert (opened["reachable"], opened["auth_mode"]) == (True, "none")
        assert {t["name"] for t in opened["tools_preview"]} >= {"add", "echo"}
        closed = (await api.post("/v1/mcp/probe", json={"url": closed_srv.url})).json()
        assert (closed["reachable"], closed["auth_mode"], closed["tools_preview"]) == (True, "api_key", [])
        url = open_srv.url
    gone = (await api.post("/v1/mcp/probe", json={"url": url})).json()
    assert gone["reachable"] is False
    assert (await api.get("/v1/connections")).json() == before


async def test_one_call_connect_leaves_no_orphan_entry_when_it_fails(api: httpx.AsyncClient) -> None:
    token = "tok-" + secrets.token_hex(8)
    async with serve(bearer(token)) as srv:
        name = unique("Team Server")
        failed = await api.post("/v1/mcp/servers", json={"url": srv.url, "name": name, "token": "wrong-token-1"})
        assert failed.status_code == 400
        slugs = {c["slug"] for c in (await api.get("/v1/catalog")).json()["connectors"]}
        assert name.lower().replace(" ", "-") not in slugs
        made = await api.post("/v1/mcp/servers", json={"url": srv.url, "name": name, "token": token})
        assert made.status_code == 200, made.text
        assert made.json()["connector"]["slug"] == name.lower().replace(" ", "-")
        assert made.json()["connection"]["status"] == "active" and token not in made.text


async def slugs(api: httpx.AsyncClient) -> list[str]:
    return sorted(c["slug"] for c in (await api.get("/v1/catalog")).json()["connectors"])


async def test_a_duplicate_slug_is_409_whatever_else_the_body_says_and_changes_nothing(api: httpx.AsyncClient) -> None:
    slug = unique("dup")
    assert (await api.post("/v1/catalog", json={"slug": slug, "name": "First"})).status_code == 200
    before = (await api.get("/v1/catalog")).json()
    # Re-posting an entry names the duplicate, even when its URL is one the admission would refuse.
    for taken in ("sentry", slug):
        r = await api.post("/v1/catalog", json={"slug": taken, "name": "Again", "url": "http://10.0.0.8/mcp"})
        assert (r.status_code, r.json()) == (
            409,
            {"error": f"a catalog entry with slug '{taken}' already exists", "code": "conflict"},
        )
    assert (await api.get("/v1/catalog")).json() == before
    # Simultaneous creates of one new slug: the unique index decides, and every loser gets the same 409.
    racing = unique("race")
    results = await asyncio.gather(
        *[api.post("/v1/catalog", json={"slug": racing, "name": f"Racer {i}"}) for i in range(6)]
    )
    assert sorted(r.status_code for r in results) == [200, 409, 409, 409, 409, 409], [r.text for r in results]
    for r in results:
        if r.status_code == 409:
            assert r.json() == {"error": f"a catalog entry with slug '{racing}' already exists", "code": "conflict"}
    winner = next(r.json()["connector"] for r in results if r.status_code == 200)
    assert (await api.get(f"/v1/catalog/{racing}")).json()["connector"]["name"] == winner["name"]
    assert (await slugs(api)).count(racing) == 1


LAUNCH = {
    "command": "python3",
    "args": ["-m", "lint_mcp"],
    "tools": [{"name": "check", "description": "lint a file", "input_schema": {"type": "object"}}],
}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
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
    ],
)
async def test_a_stdio_entry_needs_a_sandbox_launch_with_declared_tools(
    api: httpx.AsyncClient, extra: dict[str, Any], message: str
) -> None:
    before = (await api.get("/v1/catalog")).json()
    slug = unique("stdio")
    r = await api.post("/v1/catalog", json={"slug": slug, "name": "In image", "auth_mode": "none", **extra})
    assert r.status_code == 400 and message.format(slug=slug) in r.json()["error"], r.text
    assert (await api.get(f"/v1/catalog/{slug}")).status_code == 404
    assert (await api.get("/v1/catalog")).json() == before


async def test_a_stdio_entry_with_its_launch_connects_as_a_bundle_with_its_tools(api: httpx.AsyncClient) -> None:
    slug = unique("stdio")
    body = {"slug": slug, "name": "Lint", "transport": "stdio", "auth_mode": "none", "sandbox_launch": LAUNCH}
    made = await api.post("/v1/catalog", json=body)
    assert made.status_code == 200, made.text
    assert made.json()["connector"]["sandbox_launch"] == LAUNCH
    name = unique("lint").replace("-", "_")
    bundle = (await api.post(f"/v1/catalog/{slug}/connect", json={"bundle_name": name})).json()["bundle"]
    detail = (await api.get(f"/v1/capabilities/{bundle['id']}")).json()
    assert detail["servers"][0]["name"] == slug
    assert detail["servers"][0]["tools"] == [{"name": "check", "description": "lint a file"}]
