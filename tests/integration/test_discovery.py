"""Deferred tool discovery end to end (replay harness): a 300-tool MCP server, real gate, real broker, real ledger.

A deferred run's sandbox is handed no schema at all: the agent searches and describes through the control plane
(answered from the frozen RunSpec) and reaches a tool with ``tool_call``, which the gate judges as the target.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

import httpx
import pytest

from tests.integration.helpers import (
    events,
    make_agent,
    make_policy,
    start_run,
    wait_pending,
    wait_sandbox_env,
    wait_status,
)
from tests.llm_upstream import Upstream, text, tool_use
from tests.mcp_servers import MANY_NOUNS, MANY_VERBS, many_tool, many_tools, serve

pytestmark = pytest.mark.stack

ALL_TOOLS = [f"{verb}_{noun}" for noun in MANY_NOUNS for verb in MANY_VERBS]
FROZEN = [name for name in ALL_TOOLS if name != "archive_zone"]  # the server has it; the run does not
POLICY: dict[str, Any] = {
    "defaults": {"tool_action": "deny"},
    "tools": [
        {"match": ["mcp__big__delete_*"], "action": "deny", "risk": "deletes are never automatic"},
        {"match": ["mcp__big__archive_*"], "action": "approve"},
        {"match": ["mcp__big__*"], "action": "allow"},
    ],
}


def search(query: str) -> dict[str, Any]:
    return {"tool": "tool_search", "input": {"query": query, "limit": 5}}


def describe(name: str) -> dict[str, Any]:
    return {"tool": "tool_describe", "input": {"name": name}}


def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"tool": "tool_call", "input": {"name": name, "arguments": arguments}}


async def connect(api: httpx.AsyncClient, url: str) -> dict[str, Any]:
    r = await api.post(
        "/v1/connections",
        json={
            "provider": "mcp_http",
            "base_url": url,
            "token": "tok-" + secrets.token_hex(8),
            "access": {"read": True},
        },
    )
    assert r.status_code == 200, r.text
    return dict(r.json())


async def discovery_agent(
    api: httpx.AsyncClient,
    url: str,
    script: list[dict[str, Any]],
    mode: str,
    tools: list[str] = FROZEN,
    when_unavailable: str = "park",
) -> str:
    requirement = {
        "slot": "big",
        "connector": {"url": url},
        "required_tools": tools,
        "when_unavailable": when_unavailable,
    }
    return await make_agent(
        api,
        policy=await make_policy(api, POLICY),
        tool_discovery=mode,
        harness_config={"script": script, "delay_ms": 0},
        connection_requirements=[requirement],
    )


async def said(api: httpx.AsyncClient, run_id: str) -> list[str]:
    evs = await events(api, run_id)
    return [e["payload"]["data"]["text"] for e in evs if e["type"] == "agent.message" and e["actor"] == "agent"]


def answer(text: str, tool: str) -> Any:
    head, _, body = text.partition(" → ")
    assert head == tool, text
    return json.loads(body)


def by_call(evs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {e["payload"]["data"]["tool_call_id"]: e["payload"]["data"] for e in evs if e["type"] == kind}


async def test_a_deferred_run_finds_describes_and_calls_tools_of_a_300_tool_server_through_the_gate(
    api: httpx.AsyncClient,
) -> None:
    async with serve(many_tools()) as srv:
        created = await connect(api, srv.url)
        assert len(created["snapshot"]["tools"]) == 300
        script = [
            search("archive an invoice"),  # rp_001
            describe("mcp__big__archive_invoice"),  # rp_002
            call("mcp__big__get_invoice", {"invoice_id": "inv-7"}),  # rp_003: allowed
            call("mcp__big__delete_invoice", {"invoice_id": "inv-7"}),  # rp_004: policy deny on the target
            call("mcp__big__archive_invoice", {"invoice_id": "inv-7", "reason": "paid"}),  # rp_005: approval
            call("mcp__big__get_invoice", {"invoice_id": 7}),  # rp_006: breaks the target's frozen schema
            call("mcp__big__archive_zone", {"zone_id": "z-1"}),  # rp_007: on the server, not frozen
            describe("mcp__big__archive_zone"),  # rp_008
            search("archive zone"),  # rp_009
            call("Bash", {"command": "echo hi"}),  # rp_010: tool_call reaches brokered tools only
        ]
        agent = await discovery_agent(api, srv.url, script, "deferred")
        run_id = await start_run(api, agent)

        pending = await wait_pending(api, run_id)
        # The approval names the target, under the agent's tool_call id.
        assert (pending["tool"], pending["tool_call_id"]) == ("mcp__big__archive_invoice", "rp_005")
        # The sandbox was handed no schema: discovery is answered by the control plane.
        env = await wait_sandbox_env(run_id)
        assert env.get("FLUIDBOX_TOOL_DISCOVERY") == "deferred" and "FLUIDBOX_CAPABILITIES" not in env
        r = await api.post(f"/v1/approvals/{pending['id']}/decision", json={"decision": "approve"})
        assert r.status_code == 200, r.text
        row = await wait_status(api, run_id, {"completed", "failed"})
        assert srv.calls == [
            ("get_invoice", {"invoice_id": "inv-7"}),
            ("archive_invoice", {"invoice_id": "inv-7", "reason": "paid"}),
        ], "the denied, invalid, unfrozen and non-brokered calls never reached the server"

    assert row["status"] == "completed" and row["run_spec"]["tool_discovery"] == "deferred"
    assert len(row["run_spec"]["brokered"][0]["tools"]) == 299
    messages = await said(api, run_id)
    found = answer(messages[0], "tool_search")["tools"]
    assert found[0] == {
        "name": "mcp__big__archive_invoice",
        "description": "Archive an invoice: it leaves the active list but can be restored.",
        "connection": "big",
        "access": "read",
        "needsAuthorization": False,
    }
    described = answer(messages[1], "tool_describe")
    frozen = {t["name"]: t for t in row["run_spec"]["brokered"][0]["tools"]}
    assert described["input_schema"] == frozen["archive_invoice"]["input_schema"]
    assert described["input_schema"] == many_tool("archive", "invoice").input_schema, "the server's own schema"
    assert messages[2] == 'mcp__big__get_invoice → get_invoice:{"invoice_id": "inv-7"}'
    assert messages[3].startswith("mcp__big__delete_invoice denied:")
    assert messages[5].startswith("mcp__big__get_invoice denied: arguments rejected by frozen schema: /invoice_id")
    assert "not in this run's frozen tool set" in messages[6]
    assert messages[7].startswith("tool_describe failed: tool 'mcp__big__archive_zone' is not in this run's frozen")
    assert "mcp__big__archive_zone" not in [t["name"] for t in answer(messages[8], "tool_search")["tools"]]
    assert "is not a brokered tool of this run" in messages[9]

    # The ledger names the target of every tool_call, exactly as for a direct call, and notes the route.
    evs = await events(api, run_id)
    requested, decided = by_call(evs, "tool.requested"), by_call(evs, "tool.decision")
    assert {k: v["tool"] for k, v in requested.items()} == {
        "rp_003": "mcp__big__get_invoice",
        "rp_004": "mcp__big__delete_invoice",
        "rp_005": "mcp__big__archive_invoice",
        "rp_006": "mcp__big__get_invoice",
        "rp_007": "mcp__big__archive_zone",
    }, "search and describe are reads of the frozen spec, never gated; a non-brokered target is refused before"
    assert {v.get("via") for v in requested.values()} == {"tool_call"}
    assert {k: (v["verdict"], v["source"]) for k, v in decided.items()} == {
        "rp_003": ("allow", "policy"),
        "rp_004": ("deny", "policy"),
        "rp_005": ("allow", "human"),
        "rp_006": ("deny", "schema"),
        "rp_007": ("deny", "capability"),
    }
    brokered = by_call(evs, "tool.brokered")
    assert {k: v["tool"] for k, v in brokered.items()} == {
        "rp_003": "mcp__big__get_invoice",
        "rp_005": "mcp__big__archive_invoice",
    }


async def test_a_revoked_connection_is_listed_as_needing_authorization_not_omitted(api: httpx.AsyncClient) -> None:
    async with serve(many_tools()) as srv:
        created = await connect(api, srv.url)
        script = [
            call("mcp__big__archive_ticket", {"ticket_id": "t-1"}),  # held for approval: the revoke lands meanwhile
            search("ticket"),
            describe("mcp__big__get_ticket"),
        ]
        # ``fail``: the revoked call is refused (a parked call would hold the script before its search).
        agent = await discovery_agent(api, srv.url, script, "deferred", when_unavailable="fail")
        run_id = await start_run(api, agent)
        pending = await wait_pending(api, run_id)
        r = await api.post(f"/v1/connections/{created['connection']['id']}/revoke")
        assert r.status_code == 200, r.text
        await api.post(f"/v1/approvals/{pending['id']}/decision", json={"decision": "approve"})
        await wait_status(api, run_id, {"completed", "failed"})
        assert srv.call_count() == 0
    messages = await said(api, run_id)
    found = answer(messages[1], "tool_search")["tools"]
    assert len(found) == 5 and all(t["needsAuthorization"] is True for t in found)
    assert answer(messages[2], "tool_describe")["needsAuthorization"] is True


async def test_auto_defers_above_the_threshold_and_eager_runs_are_unchanged(api: httpx.AsyncClient) -> None:
    async with serve(many_tools()) as srv:
        await connect(api, srv.url)
        script = [search("fetch one invoice"), call("mcp__big__get_invoice", {"invoice_id": "i-1"})]
        runs = {}
        for label, mode, tools in (
            ("auto-40", "auto", FROZEN[:40]),
            ("auto-41", "auto", FROZEN[:41]),
            ("eager", "eager", FROZEN),
        ):
            agent = await discovery_agent(api, srv.url, script, mode, tools)
            runs[label] = await start_run(api, agent)
        rows = {label: await wait_status(api, run_id, {"completed", "failed"}) for label, run_id in runs.items()}

    modes = {label: row["run_spec"]["tool_discovery"] for label, row in rows.items()}
    assert modes == {"auto-40": "eager", "auto-41": "deferred", "eager": "eager"}
    for label, run_id in runs.items():
        messages = await said(api, run_id)
        if modes[label] == "deferred":
            assert answer(messages[0], "tool_search")["tools"][0]["name"] == "mcp__big__get_invoice"
        else:
            # An eager run sees every schema directly; discovery is not offered to it.
            assert messages[0] == (
                "tool_search failed: this run sees its brokered tools directly: tool discovery is not deferred"
            )
        # tool_call reaches the same gated broker in every mode.
        assert messages[1] == 'mcp__big__get_invoice → get_invoice:{"invoice_id": "i-1"}'


async def test_the_claude_harness_discovers_and_calls_through_its_three_mcp_tools(
    api: httpx.AsyncClient, llm_upstream: Upstream
) -> None:
    discovery = "mcp__fluidbox_tools__"
    llm_upstream.push(
        tool_use(discovery + "tool_search", {"query": "fetch one invoice"}, id="toolu_search"),
        tool_use(discovery + "tool_describe", {"name": "mcp__big__get_invoice"}, id="toolu_describe"),
        tool_use(discovery + "tool_call", {"name": "mcp__big__delete_invoice", "arguments": {"invoice_id": "i-9"}},
                 id="toolu_delete"),
        tool_use(discovery + "tool_call", {"name": "mcp__big__get_invoice", "arguments": {"invoice_id": "i-9"}},
                 id="toolu_get"),
        text("Invoice i-9 fetched."),
    )  # fmt: skip
    async with serve(many_tools()) as srv:
        await connect(api, srv.url)
        agent = await make_agent(
            api,
            policy=await make_policy(api, POLICY),
            harness="claude-agent-sdk",
            model="claude-haiku-4-5",
            tool_discovery="deferred",
            connection_requirements=[{"slot": "big", "connector": {"url": srv.url}, "required_tools": FROZEN}],
        )
        run_id = await start_run(api, agent)
        row = await wait_status(api, run_id, {"completed", "failed"}, timeout=120)
        evs = await events(api, run_id)
        assert row["status"] == "completed", [e["payload"] for e in evs if e["type"] == "run.error"]
        assert srv.calls == [("get_invoice", {"invoice_id": "i-9"})], "the policy deny on the target sent nothing"

    bodies = [r.body for r in llm_upstream.requests if r.path == "/v1/messages" and isinstance(r.body, dict)]
    offered = {t["name"] for t in bodies[0].get("tools", [])}
    assert {discovery + n for n in ("tool_search", "tool_describe", "tool_call")} <= offered
    assert not any(name.startswith("mcp__big__") for name in offered), "no brokered schema is in the prompt"
    results = {
        block["tool_use_id"]: block
        for message in bodies[-1]["messages"] if message["role"] == "user" and isinstance(message["content"], list)
        for block in message["content"] if block.get("type") == "tool_result"
    }  # fmt: skip

    def text_of(tool_use_id: str) -> str:
        content = results[tool_use_id]["content"]  # the tool's own text first; the CLI may append reminders
        return content if isinstance(content, str) else str(content[0].get("text", ""))

    assert json.loads(text_of("toolu_search"))["tools"][0]["name"] == "mcp__big__get_invoice"
    assert json.loads(text_of("toolu_describe"))["input_schema"] == many_tool("get", "invoice").input_schema
    assert results["toolu_delete"].get("is_error") is True and "fluidbox denied this call" in text_of("toolu_delete")
    assert text_of("toolu_get").startswith("get_invoice:")
    # The gate judged the targets, under the model's own tool_use ids; the ledger names them.
    requested = by_call(evs, "tool.requested")
    assert {k: (v["tool"], v.get("via")) for k, v in requested.items()} == {
        "toolu_delete": ("mcp__big__delete_invoice", "tool_call"),
        "toolu_get": ("mcp__big__get_invoice", "tool_call"),
    }
    decided = by_call(evs, "tool.decision")
    assert {k: v["verdict"] for k, v in decided.items()} == {"toolu_delete": "deny", "toolu_get": "allow"}
    completed = by_call(evs, "tool.completed")
    assert (completed["toolu_get"]["tool"], completed["toolu_get"]["via"]) == ("mcp__big__get_invoice", "tool_call")
    assert completed["toolu_search"]["tool"] == discovery + "tool_search"


async def test_tool_discovery_is_validated_and_inherited_by_later_revisions(api: httpx.AsyncClient) -> None:
    r = await api.post("/v1/agents", json={"name": "disc-bad", "harness": "replay", "tool_discovery": "lazy"})
    assert r.status_code == 400 and "tool_discovery" in r.text
    assert (await api.get("/v1/agents/disc-bad")).status_code == 404, "a refused request changes nothing"
    agent = await make_agent(api, [{"say": "hi"}], tool_discovery="auto")
    r = await api.post(f"/v1/agents/{agent}/revisions", json={"system_prompt": "be brief"})
    assert r.status_code == 200 and r.json()["revision"]["tool_discovery"] == "auto"
    r = await api.post(f"/v1/agents/{agent}/revisions", json={"tool_discovery": "eager"})
    revisions = (await api.get(f"/v1/agents/{agent}")).json()["revisions"]
    assert [rev["tool_discovery"] for rev in revisions] == ["auto", "auto", "eager"]
