"""Dynamic connections: an agent proposes a URL-backed connection; it is saved only after a human approves,
only for hosts in the agent's ``allowedHosts``, and never with a command or a secret. Proposals, approvals and
saves are ledger events."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.integration.helpers import events, make_agent, make_policy, start_run, unique, wait_pending, wait_status

pytestmark = pytest.mark.stack

POLICY: dict[str, Any] = {
    "defaults": {"tool_action": "deny"},
    "tools": [{"match": ["ProposeConnection"], "action": "allow"}],
}


def said(evs: list[dict[str, Any]]) -> list[str]:
    return [e["payload"]["data"]["text"] for e in evs if e["type"] == "agent.message"]


async def saved_with(api: httpx.AsyncClient, url: str) -> list[dict[str, Any]]:
    return [c for c in (await api.get("/v1/connections")).json()["connections"] if c["base_url"] == url]


async def dynamic_agent(api: httpx.AsyncClient, script: list[dict[str, Any]], **dynamic: Any) -> str:
    config: dict[str, Any] = {"script": script}
    if dynamic:
        config["dynamic_connections"] = dynamic
    return await make_agent(api, policy=await make_policy(api, POLICY), harness_config=config)


async def test_a_proposal_is_saved_only_after_a_human_approves_and_refusals_name_their_reason(
    api: httpx.AsyncClient,
) -> None:
    path = unique("mcp")
    url = f"http://localhost:9/{path}"
    script = [
        {"tool": "ProposeConnection", "input": {"base_url": url, "command": "npx", "args": ["evil-server"]}},
        {"tool": "ProposeConnection", "input": {"base_url": url, "token": "s3cret-canary"}},
        {"tool": "ProposeConnection", "input": {"base_url": f"http://127.0.0.1:9/{path}"}},
        {"tool": "ProposeConnection", "input": {"transport": "stdio", "base_url": url}},
        {"tool": "ProposeConnection", "input": {"base_url": url + "?api_key=abc"}},
        {"tool": "ProposeConnection", "input": {"transport": "mcp_http", "base_url": url, "display_name": "docs"}},
    ]
    agent = await dynamic_agent(api, script, enabled=True, allowedHosts=["localhost"])
    run_id = await start_run(api, agent, workspace=None)
    approval = await wait_pending(api, run_id)
    assert approval["tool"] == "ProposeConnection"
    assert await saved_with(api, url) == [], "nothing is saved before the human decides"
    texts = said(await events(api, run_id))
    refusals = [t for t in texts if t.startswith("ProposeConnection refused")]
    assert len(refusals) == 5, texts
    assert "can never carry args, command" in refusals[0]
    assert "can never carry a secret (token)" in refusals[1]
    assert "host '127.0.0.1' is not in this agent's allowedHosts (localhost)" in refusals[2]
    assert "transport 'stdio' cannot be proposed" in refusals[3]
    assert "can never carry a secret (query parameter api_key)" in refusals[4]
    r = await api.post(f"/v1/approvals/{approval['id']}/decision", json={"decision": "approve"})
    assert r.status_code == 200, r.text
    row = await wait_status(api, run_id, {"completed", "failed"})
    assert row["result_summary"] == "Replay complete: 1 executed, 5 denied."
    [saved] = await saved_with(api, url)
    assert (saved["status"], saved["transport"], saved["display_name"]) == ("pending", "mcp_http", "docs")
    assert saved["metadata"]["proposed_in"] == run_id
    evs = await events(api, run_id)
    kinds = [e["type"] for e in evs if e["type"].startswith(("connection.", "approval."))]
    assert kinds == ["connection.proposed", "approval.requested", "approval.decided", "connection.saved"], kinds
    assert [e["payload"]["data"]["connection_id"] for e in evs if e["type"] == "connection.saved"] == [saved["id"]]
    assert "s3cret-canary" not in str(evs)


async def test_a_denied_proposal_saves_nothing(api: httpx.AsyncClient) -> None:
    url = f"http://localhost:9/{unique('mcp')}"
    agent = await dynamic_agent(
        api, [{"tool": "ProposeConnection", "input": {"base_url": url}}], enabled=True, allowedHosts=["localhost"]
    )
    run_id = await start_run(api, agent, workspace=None)
    approval = await wait_pending(api, run_id)
    r = await api.post(f"/v1/approvals/{approval['id']}/decision", json={"decision": "deny"})
    assert r.status_code == 200, r.text
    row = await wait_status(api, run_id, {"completed", "failed"})
    assert row["result_summary"] == "Replay complete: 0 executed, 1 denied."
    assert await saved_with(api, url) == []
    assert "connection.saved" not in [e["type"] for e in await events(api, run_id)]


async def test_dynamic_connections_are_off_by_default(api: httpx.AsyncClient) -> None:
    url = f"http://localhost:9/{unique('mcp')}"
    agent = await dynamic_agent(api, [{"tool": "ProposeConnection", "input": {"base_url": url}}])
    run_id = await start_run(api, agent, workspace=None)
    row = await wait_status(api, run_id, {"completed", "failed"})
    assert row["result_summary"] == "Replay complete: 0 executed, 1 denied."
    texts = said(await events(api, run_id))
    assert any("dynamic connections are off for this agent" in t for t in texts), texts
    assert await saved_with(api, url) == []
    bad = await api.post(
        "/v1/agents",
        json={
            "name": unique("a"),
            "harness": "replay",
            "harness_config": {"dynamic_connections": {"allowedHosts": ["a b"]}},
        },
    )
    assert bad.status_code == 400 and "is not a host name" in bad.text
