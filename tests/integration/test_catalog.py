"""The connector catalog, the probe, and one-call custom connect — against real MCP servers."""

from __future__ import annotations

import secrets

import httpx
import pytest

from tests.integration.helpers import unique
from tests.mcp_servers import basic, bearer, serve

pytestmark = pytest.mark.stack


async def test_curated_entries_are_seeded_and_custom_ones_are_tenant_scoped(api: httpx.AsyncClient) -> None:
    connectors = {c["slug"]: c for c in (await api.get("/v1/catalog")).json()["connectors"]}
    assert {"sentry", "stripe", "linear", "notion", "workspace-info"} <= set(connectors)
    assert connectors["sentry"]["auth_mode"] == "api_key" and connectors["sentry"]["tier"] == "verified"
    assert connectors["linear"]["auth_mode"] == "oauth" and connectors["linear"]["connectable"] is False
    assert connectors["workspace-info"]["sandbox_launch"]["command"] == "python3"
    slug = unique("custom")
    made = await api.post("/v1/catalog", json={"slug": slug, "name": "Ours", "url": "https://93.184.216.34/mcp"})
    assert made.status_code == 200 and made.json()["connector"]["tier"] == "custom"
    dup = await api.post("/v1/catalog", json={"slug": "sentry", "name": "Shadow"})
    assert (dup.status_code, dup.json()) == (409, {"error": "a catalog entry with slug 'sentry' already exists"})
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
    oauth = await api.post("/v1/catalog/linear/connect", json={})
    assert oauth.status_code == 400 and "OAuth" in oauth.json()["error"]


async def test_an_in_image_entry_connects_as_a_sandbox_bundle(api: httpx.AsyncClient) -> None:
    name = unique("wsinfo").replace("-", "_")
    r = await api.post("/v1/catalog/workspace-info/connect", json={"bundle_name": name})
    assert r.status_code == 200 and r.json()["bundle"]["name"] == name
    listed = [b for b in (await api.get("/v1/capabilities")).json()["bundles"] if b["name"] == name]
    assert listed and listed[0]["classes"] == ["sandbox"] and listed[0]["tool_count"] == 1


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
