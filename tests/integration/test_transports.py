"""OpenAPI, HTTP and stdio MCP connections end to end: created through the API, frozen into a run, called by a
governed agent through the gate and the broker, exactly once, with the credential never leaking."""

from __future__ import annotations

import asyncio
import json
import secrets
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.stack import Stack
from tests.http_apis import RunningApp, serve_items
from tests.integration.helpers import events, issue_token, make_agent, make_policy, start_run, wait_status
from tests.integration.test_oauth_connections import browser, grant, signed_in, workflow_histories
from tests.integrations.test_transports import EVERYTHING
from tests.oauth_servers import AuthorizationServer

pytestmark = pytest.mark.stack
__all__ = ["browser"]  # the fixture, shared with the OAuth connection tests

POLICY: dict[str, Any] = {
    "defaults": {"tool_action": "deny"},
    "tools": [{"match": ["mcp__*"], "action": "allow"}],
}


async def connect_openapi(api: httpx.AsyncClient, app: RunningApp, token: str, **config: Any) -> dict[str, Any]:
    r = await api.post(
        "/v1/connections",
        json={
            "transport": "openapi",
            "base_url": app.url,
            "token": token,
            # Reads as their methods say; the one write the tests make is left to the policy.
            "access": {"write": {"tools": ["createItem"], "approval": "policy"}},
            "transport_config": {"document_url": app.url + "/openapi.json", **config},
        },
    )
    assert r.status_code == 200, r.text
    assert token not in r.text
    return dict(r.json())


async def connect_stdio(api: httpx.AsyncClient, name: str, **config: Any) -> dict[str, Any]:
    r = await api.post(
        "/v1/connections",
        json={
            "transport": "stdio",
            "display_name": name,
            "access": {"read": True},
            "transport_config": {"command": "node", "args": [str(EVERYTHING), "stdio"], **config},
        },
    )
    assert r.status_code == 200, r.text
    return dict(r.json())


def requirement(slot: str, url: str, tools: list[str]) -> dict[str, Any]:
    return {"slot": slot, "connector": {"url": url}, "required_tools": tools}


async def test_a_governed_run_calls_an_openapi_tool_and_a_stdio_tool_and_the_credential_never_leaks(
    api: httpx.AsyncClient, stack: Stack
) -> None:
    canary = "canary-" + secrets.token_hex(16)
    name = "ev-" + secrets.token_hex(4)
    async with serve_items() as app:
        created = await connect_openapi(api, app, canary)
        assert created["connection"]["transport"] == "openapi"
        tools = {t["name"]: t for t in created["snapshot"]["tools"]}
        assert tools["getItem"]["access"] == "read" and tools["createItem"]["access"] == "write"
        stdio = await connect_stdio(api, name, credential_env="EV_TOKEN")
        assert stdio["connection"]["base_url"] == f"stdio://{name}"
        script = [
            {"tool": "mcp__items__whoAmI", "input": {}},
            {"tool": "mcp__items__createItem", "input": {"store": "s1", "body": {"title": "from the agent"}}},
            {"tool": "mcp__items__getItem", "input": {"store": "s1", "item_id": "not-a-number"}},
            {"tool": "mcp__ev__echo", "input": {"message": "; rm -rf /"}},
        ]
        agent = await make_agent(
            api, script, policy=await make_policy(api, POLICY),
            connection_requirements=[requirement("items", app.url, ["whoAmI", "createItem", "getItem"]),
                                     requirement("ev", f"stdio://{name}", ["echo"])],
        )  # fmt: skip
        run_id = await start_run(api, agent)
        row = await wait_status(api, run_id, {"completed", "failed"})
        assert row["result_summary"] == "Replay complete: 3 executed, 1 denied.", row["result_summary"]
        # The schema violation was denied by the gate: the API saw exactly the two valid calls.
        assert [(r["method"], r["path"]) for r in app.seen.requests] == [
            ("GET", "/whoami"), ("POST", "/stores/s1/items"),
        ]  # fmt: skip
        assert app.seen.requests[0]["headers"]["authorization"] == f"Bearer {canary}"
        evs = await events(api, run_id)
        said = [e["payload"]["data"]["text"] for e in evs if e["type"] == "agent.message"]
        assert any(t.startswith("mcp__ev__echo → Echo: ; rm -rf /") for t in said), said
        assert any("from the agent" in t for t in said)
        brokered = [e["payload"]["data"] for e in evs if e["type"] == "tool.brokered"]
        assert sorted(b["tool"] for b in brokered) == ["mcp__ev__echo", "mcp__items__createItem", "mcp__items__whoAmI"]
        assert all(b["outcome"] == "succeeded" for b in brokered)
        denied = [
            e["payload"]["data"]
            for e in evs
            if e["type"] == "tool.decision" and e["payload"]["data"]["verdict"] == "deny"
        ]
        assert denied and denied[0]["source"] == "schema"
        # The API echoed the credential back (whoAmI): the broker scrubbed it before the ledger and the sandbox.
        logs = "".join(p.read_text(errors="replace") for p in Path(stack.logs).glob("*.log"))
        sandbox = "".join(
            p.read_text(errors="replace") for p in (stack.home / "runs" / run_id).rglob("*") if p.is_file()
        )
        history = await workflow_histories(stack, run_id)
        listed = (await api.get("/v1/connections")).text
        for text in (json.dumps(evs), json.dumps(row), logs, sandbox, history, listed):
            assert canary not in text


async def test_duplicate_calls_execute_exactly_once_on_every_transport(api: httpx.AsyncClient, stack: Stack) -> None:
    name = "ev-" + secrets.token_hex(4)
    async with serve_items() as app:
        await connect_openapi(api, app, "tok-" + secrets.token_hex(8))
        endpoints = [{"name": "create", "method": "POST", "path": "/stores/{store}/items",
                      "arguments": {"type": "object", "properties": {"store": {"type": "string"},
                                    "title": {"type": "string"}}, "required": ["store", "title"]}}]  # fmt: skip
        r = await api.post(
            "/v1/connections",
            json={"transport": "http", "base_url": app.url + "/", "token": "tok-http-1",
                  # A POST is a write by default, and a default write always asks a human: left to the policy.
                  "access": {"write": {"tools": ["create"], "approval": "policy"}},
                  "transport_config": {"endpoints": endpoints}},
        )  # fmt: skip
        assert r.status_code == 200, r.text
        await connect_stdio(api, name)
        agent = await make_agent(
            api, [{"sleep_ms": 600000}], policy=await make_policy(api, POLICY),
            connection_requirements=[requirement("items", app.url, ["createItem"]),
                                     requirement("plain", app.url + "/", ["create"]),
                                     requirement("ev", f"stdio://{name}", ["echo"])],
        )  # fmt: skip
        run_id = await start_run(api, agent)
        await wait_status(api, run_id, {"running"})
        token = await issue_token(stack.database_url or "", run_id, "tool")
        calls = [
            ("mcp__items__createItem", {"store": "once", "body": {"title": "t"}}),
            ("mcp__plain__create", {"store": "plain", "title": "t"}),
            ("mcp__ev__echo", {"message": "once"}),
        ]
        async with httpx.AsyncClient(
            base_url=stack.api_url, headers={"authorization": f"Bearer {token}"}, timeout=60
        ) as runner:
            for i, (tool, args) in enumerate(calls):
                body = {"tool_call_id": f"dup-{i}", "tool": tool, "input": args}
                answers = await asyncio.gather(
                    *[runner.post(f"/internal/sessions/{run_id}/tools/call", json=body) for _ in range(4)]
                )
                assert len({a.text for a in answers}) == 1, "duplicates get byte-identical answers"
                assert answers[0].json()["ok"] is True, answers[0].text
        assert app.seen.count("/stores/once/") == 1 and app.seen.count("/stores/plain/") == 1
        evs = await events(api, run_id)
        brokered = [e["payload"]["data"]["tool"] for e in evs if e["type"] == "tool.brokered"]
        assert sorted(brokered) == sorted(t for t, _ in calls), "one execution (and one ledger entry) per call"
        await api.post(f"/v1/sessions/{run_id}/cancel")
        await wait_status(api, run_id, {"cancelled"})


async def test_stdio_and_openapi_configuration_is_checked_and_nothing_is_stored(api: httpx.AsyncClient) -> None:
    before = (await api.get("/v1/connections")).json()["connections"]
    r = await api.post(
        "/v1/connections", json={"transport": "stdio", "owner": "personal", "transport_config": {"command": "node"}}
    )
    assert r.status_code == 400 and "the operator token has none" in r.json()["error"]
    r = await api.post("/v1/connections", json={"transport": "stdio", "transport_config": {"args": ["x"]}})
    assert r.status_code == 422 and "`command`" in r.json()["error"]
    r = await api.post(
        "/v1/connections", json={"transport": "stdio", "transport_config": {"command": "node", "cwd": "relative"}}
    )
    assert r.status_code == 422 and "`cwd`" in r.json()["error"]
    r = await api.post(
        "/v1/connections",
        json={"transport": "openapi", "token": "t", "transport_config": {"document_url": "http://10.1.2.3/o.json"}},
    )
    assert r.status_code == 400 and "private" in r.json()["error"]
    r = await api.post(
        "/v1/connections",
        json={
            "transport": "openapi",
            "token": "t",
            "base_url": "http://127.0.0.1:1",
            "transport_config": {"document": {"openapi": "3.0.3"}},
        },
    )
    assert r.status_code == 400 and "invalid OpenAPI document" in r.json()["error"]
    r = await api.post(
        "/v1/connections",
        json={"transport": "openapi", "token": "t", "transport_config": {"document": {}, "auth": {"type": "magic"}}},
    )
    assert r.status_code == 422 and "auth.type" in r.json()["error"]
    for config, field in (
        ({"document": {}, "include": ["x"]}, "`include`"),
        ({"document": {}, "access": {"op": "admin"}}, "`access`"),
        ({"document": [1]}, "`document`"),
        ({"document": {}, "max_response_bytes": "big"}, "`max_response_bytes`"),
        ({"document": {}, "command": "sh"}, "unknown openapi field(s): command"),
    ):
        r = await api.post("/v1/connections", json={"transport": "openapi", "token": "t", "transport_config": config})
        assert r.status_code == 422 and field in r.json()["error"], (config, r.text)
    assert (await api.get("/v1/connections")).json()["connections"] == before


async def test_a_members_openapi_document_cannot_read_the_admin_token_through_a_ref(stack: Stack, admin: str) -> None:
    """The attack of issue 24: a plain member's personal connection whose parameter schema is a ``$ref`` to the
    operator's token file. The document is refused before any validator reads anything; the token never comes back
    (uploaded as an object or as text; a served document and a refresh take the same path, tested without the
    stack in tests/integrations/test_documents.py)."""
    from tests.integration.test_identity import add_user, as_user, mint

    token_file = stack.home / "admin-token"
    assert token_file.read_text().strip() == admin
    member = await add_user(stack)
    doc: dict[str, Any] = {
        "openapi": "3.0.3",
        "info": {"title": "t", "version": "1"},
        "paths": {"/a": {"get": {"operationId": "a", "responses": {"200": {"description": "ok"}},
                                 "parameters": [{"name": "q", "in": "query",
                                                 "schema": {"$ref": f"file://{token_file}"}}]}}},
    }  # fmt: skip
    async with as_user(stack, await mint(stack, member["email"])) as me, serve_items() as app:
        before = (await me.get("/v1/connections")).json()["connections"]
        for config in ({"document": doc}, {"document": json.dumps(doc)}):
            r = await me.post(
                "/v1/connections",
                json={"transport": "openapi", "owner": "personal", "token": "t", "base_url": app.url,
                      "transport_config": config},
            )  # fmt: skip
            assert r.status_code == 400, r.text
            assert "does not point inside the document" in r.json()["error"]
            assert admin not in r.text and admin[8:24] not in r.text
        assert (await me.get("/v1/connections")).json()["connections"] == before


async def test_an_admin_member_cannot_run_a_host_command_or_read_the_host_environment(
    stack: Stack, tmp_path: Path
) -> None:
    """Issue 24, finding 3: creating a stdio connection ran its command at once, as root and unsandboxed, for an
    admin-role member, even when the create was then refused. Now nothing runs unless the operator asks."""
    from tests.integration.test_identity import add_user, as_user, mint

    marker = tmp_path / "ran-as-host"
    command = {"command": "/bin/sh", "args": ["-c", f"id > {marker}"]}
    admin_member = await add_user(stack, "admin")
    async with as_user(stack, await mint(stack, admin_member["email"])) as member:
        before = (await member.get("/v1/connections")).json()["connections"]
        for extra in ({}, {"owner": "personal"}, {"display_name": "x", "access": {"read": True}}):
            r = await member.post("/v1/connections", json={"transport": "stdio", "transport_config": command, **extra})
            assert r.status_code == 403, r.text
            assert "only the operator (admin token) can create one" in r.json()["error"]
        r = await member.post(
            "/v1/connections",
            json={"base_url": "https://mcp.example.com/mcp", "credential_env": "GITHUB_MCP_TOKEN"},
        )
        assert r.status_code == 403 and "reads the control plane's environment" in r.json()["error"], r.text
        assert (await member.get("/v1/connections")).json()["connections"] == before
    assert not marker.exists(), "the command ran on the host"


async def test_stopping_the_worker_ends_its_stdio_processes() -> None:
    from tests.helpers import eventually
    from tests.integration.conftest import FAST
    from tests.integration.helpers import own_stack
    from tests.integrations.test_transports import _none_left, server_pids

    marker = "fbx-shutdown-" + secrets.token_hex(4)
    async with own_stack("fbxs-", dict(FAST)) as (st, api):
        r = await api.post(
            "/v1/connections",
            json={"transport": "stdio", "display_name": marker, "access": {"read": True},
                  "transport_config": {"command": "node", "args": [str(EVERYTHING), "stdio", marker]}},
        )  # fmt: skip
        assert r.status_code == 200, r.text
        agent = await make_agent(
            api, [{"tool": "mcp__ev__echo", "input": {"message": "hi"}}], policy=await make_policy(api, POLICY),
            connection_requirements=[requirement("ev", f"stdio://{marker}", ["echo"])],
        )  # fmt: skip
        run_id = await start_run(api, agent)
        row = await wait_status(api, run_id, {"completed", "failed"})
        assert row["status"] == "completed", row
        assert len(server_pids(marker)) == 1, "the worker keeps its stdio process between calls"
        st.stop_process("worker")
        assert await eventually(lambda: _none_left(marker), timeout=30)


async def test_an_openapi_connection_signs_in_with_oauth_and_its_tool_runs_with_the_access_token(
    api: httpx.AsyncClient, stack: Stack, auth: AuthorizationServer, browser: httpx.AsyncClient
) -> None:
    async with serve_items(auth) as app:
        r = await api.post(
            "/v1/connections",
            json={"transport": "openapi", "auth_kind": "oauth", "display_name": "items over oauth",
                  "base_url": app.url, "transport_config": {"document_url": app.url + "/openapi.json"}},
        )  # fmt: skip
        assert r.status_code == 200, r.text
        connection = r.json()["connection"]
        assert connection["status"] == "pending" and connection["transport"] == "openapi"
        page = await browser.get(await signed_in(api, auth, browser, connection["id"]))
        assert page.status_code == 200 and "Connected" in page.text, page.text
        tools = (await api.get(f"/v1/connections/{connection['id']}/tools")).json()["snapshot"]["tools"]
        assert {t["name"] for t in tools} >= {"getItem", "createItem"}
        agent = await make_agent(
            api, [{"tool": "mcp__items__getItem", "input": {"store": "o", "item_id": 5}}],
            policy=await make_policy(api, POLICY),
            connection_requirements=[requirement("items", app.url, ["getItem"])],
        )  # fmt: skip
        run_id = await start_run(api, agent)
        row = await wait_status(api, run_id, {"completed", "failed"})
        assert row["result_summary"] == "Replay complete: 1 executed, 0 denied.", row["result_summary"]
        calls = [q for q in app.seen.requests if q["path"] == "/stores/o/items/5"]
        assert len(calls) == 1 and calls[0]["headers"]["authorization"].startswith("Bearer ey")
        _, access, _ = await grant(stack, connection["id"])
        evs = json.dumps(await events(api, run_id))
        assert access is not None and access not in evs and access not in json.dumps(row)


async def test_the_cli_creates_openapi_and_stdio_connections(api: httpx.AsyncClient, stack: Stack, admin: str) -> None:
    import os
    import subprocess
    import sys

    fluidbox = str(Path(sys.executable).parent / "fluidbox")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLUIDBOX_")}
    env |= {
        "FLUIDBOX_URL": stack.api_url,
        "FLUIDBOX_ADMIN_TOKEN": admin,
        "ITEMS_KEY": "cli-secret-" + secrets.token_hex(8),
    }

    def run(*args: str) -> str:
        done = subprocess.run([fluidbox, "connections", *args], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done.stdout

    async with serve_items() as app:
        made = json.loads(
            await asyncio.to_thread(
                run, "create", "--transport", "openapi", "--base-url", app.url,
                "--document-url", app.url + "/openapi.json", "--auth", "header:X-Items-Key", "--token-env", "ITEMS_KEY",
            )
        )  # fmt: skip
        assert made["connection"]["transport"] == "openapi" and env["ITEMS_KEY"] not in json.dumps(made)
        assert made["connection"]["transport_config"]["auth"] == {
            "type": "api_key",
            "in": "header",
            "name": "X-Items-Key",
        }
        name = "cli-ev-" + secrets.token_hex(3)
        stdio = json.loads(
            await asyncio.to_thread(
                run, "create", "--transport", "stdio", "--name", name, "--command", "node",
                "--arg", str(EVERYTHING), "--arg", "stdio",
            )
        )  # fmt: skip
        assert stdio["connection"]["base_url"] == f"stdio://{name}"
        listed = await asyncio.to_thread(run, "list")
        assert f"openapi  active  {app.url}" in listed and f"stdio  active  stdio://{name}" in listed
        tools = json.loads(await asyncio.to_thread(run, "tools", made["connection"]["id"]))
        assert any(t["name"] == "getItem" and t["access"] == "read" for t in tools["snapshot"]["tools"])


async def test_a_run_parked_for_a_stdio_connection_resumes_when_an_admin_creates_it(api: httpx.AsyncClient) -> None:
    """Parking is transport-blind: creating the connection the run waits for (here stdio) wakes it."""
    name = "late-" + secrets.token_hex(4)
    agent = await make_agent(
        api, [{"tool": "mcp__ev__echo", "input": {"message": "after the wait"}}], policy=await make_policy(api, POLICY),
        connection_requirements=[{**requirement("ev", f"stdio://{name}", ["echo"]), "when_unavailable": "park"}],
    )  # fmt: skip
    r = await api.post("/v1/sessions", json={"agent": agent, "task": "echo"})
    assert r.status_code == 200 and r.json()["session"]["status"] == "waiting_for_connection", r.text
    run_id = r.json()["session"]["id"]
    assert r.json()["session"]["pending_action"]["url"] == f"stdio://{name}"
    await connect_stdio(api, name)
    done = await wait_status(api, run_id, {"completed", "failed"})
    assert done["status"] == "completed", done
    evs = await events(api, run_id)
    assert [e["payload"]["data"]["tool"] for e in evs if e["type"] == "tool.brokered"] == ["mcp__ev__echo"]
