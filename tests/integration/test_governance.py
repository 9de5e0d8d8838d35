"""Governance end to end: frozen snapshots, budgets, session-scoped approvals, autonomy refusals."""

from __future__ import annotations

import httpx
import pytest

from tests.integration.helpers import events, make_agent, make_policy, start_run, types, wait_pending, wait_status

pytestmark = pytest.mark.stack

DEPLOY = {"tool": "Bash", "input": {"command": "./deploy.sh"}}


async def test_editing_the_policy_mid_run_changes_nothing_for_that_run_and_everything_for_the_next(
    api: httpx.AsyncClient,
) -> None:
    policy = await make_policy(api, {"defaults": {"tool_action": "approve"}})
    agent = await make_agent(api, [DEPLOY, {**DEPLOY, "input": {"command": "./deploy.sh again"}}], policy=policy)
    first = await start_run(api, agent)
    pending = await wait_pending(api, first)
    # While the first run waits, the policy starts denying every shell command.
    stricter = {
        "name": policy,
        "defaults": {"tool_action": "approve"},
        "tools": [{"match": ["Bash"], "action": "deny"}],
    }
    r = await api.post(
        f"/v1/policies/{policy}/publish", json={"content": stricter, "summary": "no shell", "base_version": 1}
    )
    assert r.status_code == 200
    await api.post(f"/v1/approvals/{pending['id']}/decision", json={"decision": "approve"})
    # The first run's second command is still judged by v1 (approve), not v2 (deny).
    second_call = None
    for _ in range(300):
        rows = (await api.get(f"/v1/sessions/{first}/approvals")).json()["approvals"]
        second_call = next((a for a in rows if a["tool_call_id"] == "rp_002"), None)
        if second_call and second_call["status"] == "pending":
            break
        await wait_status(api, first, {"running", "awaiting_approval"})
    assert second_call is not None and second_call["status"] == "pending"
    await api.post(f"/v1/approvals/{second_call['id']}/decision", json={"decision": "approve"})
    row = await wait_status(api, first, {"completed"})
    assert row["result_summary"] == "Replay complete: 2 executed, 0 denied."
    assert row["run_spec"]["policy_version"] == 1
    # The next run freezes v2 and is denied at once, without a human.
    second = await start_run(api, agent)
    row = await wait_status(api, second, {"completed"})
    assert row["run_spec"]["policy_version"] == 2
    assert row["result_summary"].startswith("Replay complete: 0 executed, 2 denied.")
    assert "approval.requested" not in types(await events(api, second))


async def test_exceeding_the_tool_call_budget_ends_the_run_as_budget_exceeded(api: httpx.AsyncClient) -> None:
    policy = await make_policy(api, {"defaults": {"tool_action": "allow"}, "budgets": {"max_tool_calls": 2}})
    script = [{"tool": "Bash", "input": {"command": f"echo {i}"}} for i in range(4)] + [{"sleep_ms": 600000}]
    run_id = await start_run(api, await make_agent(api, script, policy=policy))
    row = await wait_status(api, run_id, {"budget_exceeded", "completed", "failed"})
    assert (row["status"], row["status_reason"]) == ("budget_exceeded", "max_tool_calls budget exceeded")
    evs = await events(api, run_id)
    exceeded = [e["payload"]["data"] for e in evs if e["type"] == "budget.exceeded"]
    assert exceeded == [{"budget": "max_tool_calls", "limit": "2", "spent": "3"}]
    third = next(e for e in evs if e["type"] == "tool.decision" and e["payload"]["data"]["tool_call_id"] == "rp_003")
    assert (third["payload"]["data"]["verdict"], third["payload"]["data"]["reason"]) == (
        "deny",
        "tool-call budget exceeded",
    )
    assert "run.quiesce_requested" in types(evs)


async def test_a_per_run_budget_can_only_tighten_and_the_wall_clock_cap_is_a_timer(api: httpx.AsyncClient) -> None:
    run_id = await start_run(
        api, await make_agent(api, [{"sleep_ms": 600000}]), budgets={"max_wall_clock_secs": 3, "max_tool_calls": 500}
    )
    created = (await api.get(f"/v1/sessions/{run_id}")).json()["session"]
    # The demo policy caps tool calls at 100 (its default budget); 500 cannot loosen it.
    assert created["run_spec"]["budgets"]["max_tool_calls"] == 100
    assert created["run_spec"]["budgets"]["max_wall_clock_secs"] == 3
    row = await wait_status(api, run_id, {"budget_exceeded", "completed", "failed"})
    assert (row["status"], row["status_reason"]) == ("budget_exceeded", "max_wall_clock_secs budget exceeded")
    exceeded = [e["payload"]["data"] for e in await events(api, run_id) if e["type"] == "budget.exceeded"]
    assert exceeded[0]["budget"] == "max_wall_clock_secs"


async def test_a_session_scoped_approval_allows_the_same_command_later_but_nothing_wider(
    api: httpx.AsyncClient,
) -> None:
    policy = await make_policy(
        api,
        {
            "tools": [
                {"match": ["Bash"], "action": "allow", "approval_scope": "session",
                 "shell": {"allow_prefixes": ["ls"], "on_no_match": "approve"}},
            ]
        },
    )  # fmt: skip
    script = [DEPLOY, DEPLOY, {"tool": "Bash", "input": {"command": "./deploy.sh --prod"}}]
    run_id = await start_run(api, await make_agent(api, script, policy=policy))
    pending = await wait_pending(api, run_id)
    await api.post(f"/v1/approvals/{pending['id']}/decision", json={"decision": "approved_session"})
    wider = await wait_pending(api, run_id)
    assert wider["tool_call_id"] == "rp_003" and wider["scope_key"] == "Bash:command:./deploy.sh --prod"
    await api.post(f"/v1/approvals/{wider['id']}/decision", json={"decision": "deny"})
    row = await wait_status(api, run_id, {"completed"})
    assert row["result_summary"].startswith("Replay complete: 2 executed, 1 denied.")
    decisions = {
        e["payload"]["data"]["tool_call_id"]: e["payload"]["data"]["source"]
        for e in await events(api, run_id)
        if e["type"] == "tool.decision"
    }
    assert decisions == {"rp_001": "human", "rp_002": "session_scope", "rp_003": "human"}


async def test_autonomy_on_a_policy_that_forbids_it_is_refused_at_creation(api: httpx.AsyncClient) -> None:
    agent = await make_agent(api, [{"say": "hi"}], policy="governed")
    before = len((await api.get("/v1/sessions", params={"limit": 500})).json()["sessions"])
    r = await api.post("/v1/sessions", json={"agent": agent, "task": "t", "autonomous": True})
    assert (r.status_code, r.json()) == (
        400,
        {"error": "policy does not permit autonomous runs", "code": "bad_request"},
    )
    assert len((await api.get("/v1/sessions", params={"limit": 500})).json()["sessions"]) == before
