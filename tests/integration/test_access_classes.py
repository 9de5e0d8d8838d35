"""Tool access classes and tool-definition quarantine, end to end against real MCP servers.

Every brokered tool is read, write or unclassified (then neither listed to the agent nor callable); a
write with ``approval: always`` needs a human in every autonomy mode; a refresh that photographs a new
or changed tool definition keeps it out of new runs until an admin approves the change.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

import asyncpg
import httpx
import pytest

from cli.stack import Stack
from tests.helpers import eventually
from tests.integration.helpers import (
    events,
    issue_token,
    make_agent,
    make_policy,
    start_run,
    wait_pending,
    wait_sandbox_env,
    wait_status,
)
from tests.integration.test_identity import add_user, as_user, mint
from tests.mcp_servers import basic, changing, serve

pytestmark = pytest.mark.stack

ALLOW_MCP: dict[str, Any] = {"defaults": {"tool_action": "deny"}, "tools": [{"match": ["mcp__*"], "action": "allow"}]}


def requirement(url: str, tools: list[str], slot: str = "calc") -> dict[str, Any]:
    return {"slot": slot, "connector": {"url": url}, "required_tools": tools}


async def connect(api: httpx.AsyncClient, url: str, access: Any) -> dict[str, Any]:
    body = {"provider": "mcp_http", "base_url": url, "token": "tok-" + secrets.token_hex(8), "access": access}
    r = await api.post("/v1/connections", json=body)
    assert r.status_code == 200, r.text
    return dict(r.json())


def decisions(evs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["payload"]["data"]["tool"]: e["payload"]["data"] for e in evs if e["type"] == "tool.decision"}


async def test_unclassified_tools_are_denied_and_unlisted_and_a_write_match_wins_over_read(
    api: httpx.AsyncClient,
) -> None:
    async with serve(basic()) as srv:
        # ``echo`` is named by both: write wins. ``fail`` is named by neither: unclassified.
        access = {"read": {"tools": ["add", "echo"]}, "write": {"tools": ["echo"], "approval": "policy"}}
        await connect(api, srv.url, access)
        policy = await make_policy(
            api,
            {
                "defaults": {"tool_action": "deny"},
                "tools": [
                    {"access": "write", "action": "deny", "risk": "this agent never writes"},
                    {"match": ["mcp__*"], "action": "allow"},
                ],
            },
        )
        script = [
            {"tool": "mcp__calc__add", "input": {"a": 2, "b": 3}},
            {"tool": "mcp__calc__echo", "input": {"text": "hi"}},
            {"tool": "mcp__calc__fail", "input": {"text": "x"}},
            {"sleep_ms": 600000},
        ]
        agent = await make_agent(
            api, script, policy=policy, connection_requirements=[requirement(srv.url, ["add", "echo", "fail"])]
        )
        run_id = await start_run(api, agent)

        async def three_decided() -> list[dict[str, Any]] | None:
            evs = await events(api, run_id)
            return evs if len(decisions(evs)) == 3 else None

        evs = await eventually(three_decided, message="the three brokered calls were not decided")
        # What the runner was handed: the unclassified tool is not among its brokered tools.
        listed = json.loads((await wait_sandbox_env(run_id))["FLUIDBOX_CAPABILITIES"])
        assert [t["name"] for t in listed["servers"][0]["tools"]] == ["add", "echo"], "fail is not listed"
        await api.post(f"/v1/sessions/{run_id}/cancel")
        await wait_status(api, run_id, {"cancelled"})

        seen = decisions(evs)
        assert seen["mcp__calc__add"]["verdict"] == "allow" and seen["mcp__calc__add"]["access"] == "read"
        echo = seen["mcp__calc__echo"]
        assert (echo["verdict"], echo["access"], echo["reason"]) == ("deny", "write", "this agent never writes")
        fail = seen["mcp__calc__fail"]
        assert (fail["verdict"], fail["source"], fail["access"]) == ("deny", "access", None)
        assert fail["reason"] == "tool 'fail' has no access class (read or write) on connection 'calc'"
        assert srv.executions == ["add"], "only the allowed read reached the server"

        frozen = (await api.get(f"/v1/sessions/{run_id}")).json()["session"]["run_spec"]["brokered"][0]["tools"]
        assert {t["name"]: (t["access"], t["approval"]) for t in frozen} == {
            "add": ("read", None),
            "echo": ("write", "policy"),
            "fail": (None, None),
        }

        # The policy's matrix shows the agent's brokered tools with their classes.
        detail = (await api.get(f"/v1/policies/{policy}")).json()
        rows = {r["tool"]: r for r in detail["matrix"] if r["server"] == "calc"}
        assert rows["mcp__calc__add"]["access"] == "read" and rows["mcp__calc__add"]["status"]["action"] == "allow"
        assert rows["mcp__calc__echo"]["access"] == "write" and rows["mcp__calc__echo"]["status"]["action"] == "deny"
        assert rows["mcp__calc__fail"]["status"] == {"status": "unclassified", "action": "deny"}


async def test_a_write_that_always_needs_approval_asks_when_supervised_and_is_denied_when_autonomous(
    api: httpx.AsyncClient,
) -> None:
    async with serve(basic()) as srv:
        await connect(api, srv.url, {"read": {"tools": ["add"]}, "write": {"tools": ["echo"], "approval": "always"}})
        # The policy would allow everything, and autonomy would allow approvals: neither opens the write.
        lenient = {**ALLOW_MCP, "autonomy": {"permitted": True, "on_approval_rule": "allow"}}
        policy = await make_policy(api, lenient)
        script = [{"tool": "mcp__calc__echo", "input": {"text": "written"}}]
        agent = await make_agent(api, script, policy=policy, connection_requirements=[requirement(srv.url, ["echo"])])

        supervised = await start_run(api, agent)
        approval = await wait_pending(api, supervised)
        assert approval["tool"] == "mcp__calc__echo" and srv.executions == []
        r = await api.post(f"/v1/approvals/{approval['id']}/decision", json={"decision": "approve"})
        assert r.status_code == 200, r.text
        await wait_status(api, supervised, {"completed"})
        assert srv.executions == ["echo"]
        decided = decisions(await events(api, supervised))["mcp__calc__echo"]
        assert (decided["verdict"], decided["source"], decided["access"]) == ("allow", "human", "write")

        autonomous = await start_run(api, agent, autonomous=True)
        await wait_status(api, autonomous, {"completed"})
        denied = decisions(await events(api, autonomous))["mcp__calc__echo"]
        assert (denied["verdict"], denied["source"], denied["access"]) == ("deny", "access", "write")
        assert "always needs human approval; run is autonomous" in denied["reason"]
        assert srv.executions == ["echo"], "the autonomous run never reached the server"


async def test_catalog_connections_start_read_only_and_writes_are_an_explicit_edit(api: httpx.AsyncClient) -> None:
    async with serve(basic()) as srv:
        slug = "acc-" + secrets.token_hex(4)
        reviewed = {"read": {"tools": ["add", "echo"]}, "write": {"tools": ["echo"], "approval": "always"}}
        bad = await api.post("/v1/catalog", json={"slug": slug, "name": "Calc", "url": srv.url, "access": {"read": 1}})
        assert bad.status_code == 422 and "access.read" in bad.json()["error"]
        assert (await api.get(f"/v1/catalog/{slug}")).status_code == 404, "a refused entry stores nothing"
        r = await api.post("/v1/catalog", json={"slug": slug, "name": "Calc", "url": srv.url, "access": reviewed})
        assert r.status_code == 200, r.text
        assert r.json()["connector"]["access"] == reviewed
        default_slug = "acc-" + secrets.token_hex(4)
        r = await api.post("/v1/catalog", json={"slug": default_slug, "name": "Calc2", "url": srv.url})
        assert r.json()["connector"]["access"] == {
            "read": {"tools": ["*"]},
            "write": {"tools": [], "approval": "always"},
        }

        made = await api.post(f"/v1/catalog/{slug}/connect", json={"token": "tok-" + secrets.token_hex(8)})
        assert made.status_code == 200, made.text
        connection = made.json()["connection"]
        assert connection["access"] == {
            "read": {"tools": ["add", "echo"]},
            "write": {"tools": [], "approval": "always"},
        }
        tools = (await api.get(f"/v1/connections/{connection['id']}/tools")).json()["snapshot"]["tools"]
        classes = {t["name"]: t["access"] for t in tools}
        assert classes["add"] == classes["echo"] == "read" and classes["fail"] is None
        assert {t["review"] for t in tools} == {"approved"}, "the creator approved the first snapshot"

        before = (await api.get(f"/v1/connections/{connection['id']}")).json()["connection"]
        for body, status, named in [
            ({"access": {"write": {"tools": ["echo"], "approval": "maybe"}}}, 422, "access.write.approval"),
            ({"access": {"read": {"tools": ["  "]}}}, 422, "a tool pattern cannot be empty"),
            ({"access": {"read": True}, "display_name": "x"}, 400, "unknown field 'display_name'"),
        ]:
            r = await api.patch(f"/v1/connections/{connection['id']}", json=body)
            assert r.status_code == status and named in r.json()["error"], r.text
        assert (await api.get(f"/v1/connections/{connection['id']}")).json()["connection"] == before

        r = await api.patch(f"/v1/connections/{connection['id']}", json={"access": reviewed})
        assert r.status_code == 200 and r.json()["connection"]["access"] == reviewed
        tools = (await api.get(f"/v1/connections/{connection['id']}/tools")).json()["snapshot"]["tools"]
        assert {t["name"]: (t["access"], t["approval"]) for t in tools}["echo"] == ("write", "always")
        assert (await api.patch("/v1/connections/not-an-id", json={"access": reviewed})).status_code == 404

        # A connection created without a declaration classifies nothing.
        r = await api.post(
            "/v1/connections", json={"provider": "mcp_http", "base_url": srv.url, "token": "t", "access": {"x": 1}}
        )
        assert r.status_code == 422 and "unknown key 'access.x'" in r.json()["error"]


async def test_a_changed_or_new_tool_is_quarantined_until_an_admin_approves_it(
    api: httpx.AsyncClient, stack: Stack
) -> None:
    async with serve(changing()) as srv:
        assert srv.registry is not None
        created = await connect(api, srv.url, {"read": True})
        cid = created["connection"]["id"]
        policy = await make_policy(api, ALLOW_MCP)
        idle = [{"sleep_ms": 600000}]
        alpha_agent = await make_agent(
            api, idle, policy=policy, connection_requirements=[requirement(srv.url, ["alpha"])]
        )
        beta_agent = await make_agent(
            api, idle, policy=policy, connection_requirements=[requirement(srv.url, ["beta"])]
        )
        in_flight = await start_run(api, alpha_agent)
        await wait_status(api, in_flight, {"running"})
        assert (await api.get(f"/v1/connections/{cid}/tools/changes")).json()["changes"] == []

        srv.registry.set_description("alpha", "first tool, now deletes everything")
        srv.registry.alter_schema("beta", {"type": "object", "properties": {"n": {"type": "string"}}})
        srv.registry.add("gamma", "a new tool")
        r = await api.post(f"/v1/connections/{cid}/tools/refresh")
        assert r.status_code == 200, r.text
        assert {t["name"]: t["review"] for t in r.json()["snapshot"]["tools"]} == {
            "alpha": "pending",
            "beta": "pending",
            "gamma": "pending",
        }
        changes = {c["tool"]: c for c in (await api.get(f"/v1/connections/{cid}/tools/changes")).json()["changes"]}
        assert {t: (c["kind"], c["status"]) for t, c in changes.items()} == {
            "alpha": ("changed", "pending"),
            "beta": ("changed", "pending"),
            "gamma": ("added", "pending"),
        }
        assert changes["alpha"]["changed_fields"] == ["description"]
        assert '-  "description": "first tool",' in changes["alpha"]["diff"]
        assert '+  "description": "first tool, now deletes everything",' in changes["alpha"]["diff"]
        assert (
            changes["beta"]["changed_fields"] == ["input_schema"]
            and '+        "type": "string"' in (changes["beta"]["diff"])
        )
        assert changes["gamma"]["previous"] is None

        # New runs do not get a quarantined tool.
        refused = await api.post("/v1/sessions", json={"agent": alpha_agent, "task": "t"})
        assert refused.status_code == 400 and "await an admin's review" in refused.json()["error"], refused.text
        assert "alpha" in refused.json()["error"]

        # The in-flight run keeps the definition it froze, and can still call it.
        spec = (await api.get(f"/v1/sessions/{in_flight}")).json()["session"]["run_spec"]
        assert spec["brokered"][0]["tools"][0]["description"] == "first tool"
        token = await issue_token(stack.database_url or "", in_flight, "tool")
        async with httpx.AsyncClient(
            base_url=stack.api_url, headers={"authorization": f"Bearer {token}"}, timeout=60
        ) as runner:
            body = {"tool_call_id": "q-1", "tool": "mcp__calc__alpha", "input": {"q": "still mine"}}
            answer = (await runner.post(f"/internal/sessions/{in_flight}/tools/call", json=body)).json()
        assert answer["ok"] is True, answer

        # Review: non-admins may look but not decide; bad ids are 404; decisions are recorded.
        member = await add_user(stack, "member")
        async with as_user(stack, await mint(stack, member["email"])) as plain:
            r = await plain.post(f"/v1/connections/{cid}/tools/changes/{changes['alpha']['id']}/approve")
            assert r.status_code == 403, r.text
        assert (await api.post(f"/v1/connections/{cid}/tools/changes/nope/approve")).status_code == 404
        assert (await api.post(f"/v1/connections/{cid}/tools/changes/{cid}/reject")).status_code == 404
        assert (
            await api.post(f"/v1/connections/{secrets.token_hex(16)}/tools/changes/{changes['alpha']['id']}/approve")
        ).status_code == 404

        approved = await api.post(f"/v1/connections/{cid}/tools/changes/{changes['alpha']['id']}/approve")
        assert approved.status_code == 200, approved.text
        assert approved.json()["change"]["status"] == "approved"
        assert approved.json()["change"]["decided_by"] == "operator" and approved.json()["change"]["decided_at"]
        rejected = await api.post(f"/v1/connections/{cid}/tools/changes/{changes['beta']['id']}/reject")
        assert rejected.status_code == 200 and rejected.json()["change"]["status"] == "rejected"
        again = await api.post(f"/v1/connections/{cid}/tools/changes/{changes['alpha']['id']}/approve")
        assert again.status_code == 409 and "already approved" in again.json()["error"]

        # Approved: new runs bind the new definition. Rejected: still quarantined.
        fresh = await start_run(api, alpha_agent)
        frozen = (await api.get(f"/v1/sessions/{fresh}")).json()["session"]["run_spec"]["brokered"][0]
        assert frozen["snapshot_version"] == 2
        assert frozen["tools"][0]["description"] == "first tool, now deletes everything"
        refused = await api.post("/v1/sessions", json={"agent": beta_agent, "task": "t"})
        assert refused.status_code == 400 and "beta" in refused.json()["error"]
        pending = (await api.get(f"/v1/connections/{cid}/tools/changes?status=pending")).json()["changes"]
        assert [c["tool"] for c in pending] == ["gamma"]
        assert (await api.get(f"/v1/connections/{cid}/tools/changes?status=bogus")).status_code == 400

        # A refresh that finds the same pending definition adds nothing; a newer one supersedes it.
        await api.post(f"/v1/connections/{cid}/tools/refresh")
        assert [c["tool"] for c in (await api.get(f"/v1/connections/{cid}/tools/changes?status=pending")).json()[
            "changes"
        ]] == ["gamma"]  # fmt: skip
        srv.registry.set_description("gamma", "a new tool, reworded")
        await api.post(f"/v1/connections/{cid}/tools/refresh")
        gamma = [
            c for c in (await api.get(f"/v1/connections/{cid}/tools/changes")).json()["changes"] if c["tool"] == "gamma"
        ]
        assert sorted(c["status"] for c in gamma) == ["pending", "superseded"]

        conn = await asyncpg.connect(stack.database_url or "")
        try:
            audited = await conn.fetch(
                "SELECT action, actor_kind, detail FROM auth_audit_log WHERE target = $1 ORDER BY created_at", cid
            )
        finally:
            await conn.close()
        assert [(a["action"], a["actor_kind"]) for a in audited] == [
            ("connection.tool_change.approve", "operator"),
            ("connection.tool_change.reject", "operator"),
        ]
        for run_id in (in_flight, fresh):
            await api.post(f"/v1/sessions/{run_id}/cancel")
            await wait_status(api, run_id, {"cancelled"})
