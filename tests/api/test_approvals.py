"""The approvals inbox and human decisions, in process: one decision wins, and only someone with authority
over the call's credential decides it."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from tests.api.conftest import Api
from tests.api.runs_helpers import Member, brokered_agent, make_agent, member, start_run

DEPLOY = {"command": "./deploy.sh"}  # the demo policy holds it for a human


async def pending(api: Api, run_id: str, tool_call_id: str = "tc-1", tool: str = "Bash", **kw: Any) -> str:
    """A pending approval of one tool call of the run, as the gate and the run's workflow open it."""
    outcome = await api.ctx.gates.decide_call(run_id, tool_call_id, tool, kw.get("tool_input", DEPLOY))
    assert outcome.verdict == "wait", outcome.message
    row = await api.ctx.approvals.open_approval(run_id, tool_call_id)
    assert row.status == "pending"
    return str(row.id)


async def inbox(api: Api, who: Member | None = None) -> list[dict[str, Any]]:
    if who is None:
        return list((await api.client.get("/v1/approvals")).json()["approvals"])
    async with api.as_token(who.token) as client:
        return list((await client.get("/v1/approvals")).json()["approvals"])


async def test_one_decision_wins_and_the_run_is_told_once(api: Api) -> None:
    run = await start_run(api, await make_agent(api))
    approval_id = await pending(api, run["id"])
    [shown] = await inbox(api)
    assert (shown["id"], shown["status"], shown["tool"]) == (approval_id, "pending", "Bash")
    assert (shown["authority"], shown["can_decide"]) == ("organization", True)
    assert shown["risk"] == "releases the build to production"

    url = f"/v1/approvals/{approval_id}/decision"
    first, second = await asyncio.gather(
        api.client.post(url, json={"decision": "approve"}), api.client.post(url, json={"decision": "deny"})
    )
    outcomes = sorted([(first.status_code, first.json()), (second.status_code, second.json())], key=lambda o: o[0])
    (won, answer), (lost, refusal) = outcomes
    assert (won, lost) == (200, 409)
    # The loser read the row after the winner committed (then the statuses are named), or raced it to the CAS.
    assert (refusal["error"], refusal["code"]) == ("approval is not pending", "conflict")
    decision = answer["approval"]["status"]
    assert decision in ("approved_once", "denied") and answer["approval"]["decided_by"] == "operator"
    assert api.workflows.signals == [(run["id"], "approval_decided", ("tc-1", decision))]
    assert await inbox(api) == []
    [listed] = (await api.client.get(f"/v1/sessions/{run['id']}/approvals")).json()["approvals"]
    assert listed == answer["approval"]
    # A repeat of the winning decision is late too.
    again = await api.client.post(url, json={"decision": "approve" if decision == "approved_once" else "deny"})
    assert again.json() == {
        "error": "approval is not pending",
        "code": "conflict",
        "approval_status": decision,
        "session_status": "created",
    }


async def test_a_bad_decision_is_refused_and_changes_nothing(api: Api) -> None:
    run = await start_run(api, await make_agent(api))
    approval_id = await pending(api, run["id"])
    for path, body, status, message in [
        (f"/v1/approvals/{approval_id}/decision", {"decision": "maybe"}, 400, "unknown decision 'maybe'"),
        (f"/v1/approvals/{approval_id}/decision", {}, 400, "missing field 'decision'"),
        (f"/v1/approvals/{approval_id}/decision", {"decision": "approve", "why": "x"}, 400, "unknown field 'why'"),
        (f"/v1/approvals/{uuid.uuid4()}/decision", {"decision": "approve"}, 404, "not found"),
        ("/v1/approvals/not-a-uuid/decision", {"decision": "approve"}, 404, "not found"),
    ]:
        r = await api.client.post(path, json=body)
        assert r.status_code == status and message in r.json()["error"], (body, r.text)
        assert set(r.json()) == {"error", "code"}
    assert [a["status"] for a in await inbox(api)] == ["pending"]
    assert api.workflows.signals == []


async def test_a_member_decides_only_what_it_has_authority_over(api: Api) -> None:
    alice, bob, approver = await member(api), await member(api), await member(api, "approver")
    run = await start_run(api, await make_agent(api), alice.token)
    approval_id = await pending(api, run["id"])
    url = f"/v1/approvals/{approval_id}/decision"
    assert await inbox(api, bob) == []
    async with api.as_token(bob.token) as as_bob:
        r = await as_bob.post(url, json={"decision": "approve"})
        assert (r.status_code, r.json()) == (404, {"error": "not found", "code": "not_found"})
    assert [(a["id"], a["can_decide"]) for a in await inbox(api, approver)] == [(approval_id, True)]
    # A credentialless call: the member who invoked the run decides it.
    [mine] = await inbox(api, alice)
    assert (mine["id"], mine["authority"], mine["can_decide"]) == (approval_id, "organization", True)
    async with api.as_token(alice.token) as as_alice:
        r = await as_alice.post(url, json={"decision": "approved_session"})
    assert r.status_code == 200 and r.json()["approval"]["decided_by"] == alice.user_id
    assert r.json()["approval"]["status"] == "approved_session"
    assert api.workflows.signals == [(run["id"], "approval_decided", ("tc-1", "approved_session"))]


async def test_a_call_under_a_personal_credential_is_decided_by_its_owner_only(api: Api) -> None:
    alice, owner = await member(api), await member(api, "owner")
    run = await start_run(api, await brokered_agent(api, alice, policy="demo"), alice.token)
    approval_id = await pending(api, run["id"], tool="mcp__calc__add", tool_input={"a": 1, "b": 2})
    url = f"/v1/approvals/{approval_id}/decision"
    # The operator sees it, marked as not its to decide; an org owner does not see it at all.
    [shown] = await inbox(api)
    assert (shown["id"], shown["authority"], shown["can_decide"]) == (approval_id, "personal", False)
    assert await inbox(api, owner) == []
    refusal = (
        "this approval executes under connection 'Calc', a personal connection — only its owner, who invoked the "
        "run, may decide it"
    )
    async with api.as_token(owner.token) as as_owner:
        for client in (api.client, as_owner):
            r = await client.post(url, json={"decision": "approve"})
            assert (r.status_code, r.json()) == (403, {"error": refusal, "code": "forbidden"})
    assert api.workflows.signals == []
    async with api.as_token(alice.token) as as_alice:
        [mine] = (await as_alice.get("/v1/approvals")).json()["approvals"]
        assert (mine["authority"], mine["can_decide"]) == ("personal", True)
        r = await as_alice.post(url, json={"decision": "deny"})
    assert (r.status_code, r.json()["approval"]["status"]) == (200, "denied")
