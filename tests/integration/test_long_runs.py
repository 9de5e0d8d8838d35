"""Long runs move to a fresh workflow history (continue-as-new): a stack of its own that moves every 2 updates.

Temporal caps a workflow run at 2,000 updates (each approval wait and each brokered call is one) and
51,200 history events. Here the threshold is 2, so a run with five approvals moves at least twice,
once with an approval pending across the move, and must look exactly like a run that never moved.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import datetime, timedelta

import httpx
import pytest
from temporalio.client import Client, WorkflowExecutionStatus

from cli.stack import Stack
from contracts.temporal import workflow_id
from tests.helpers import eventually
from tests.integration.conftest import FAST
from tests.integration.helpers import (
    approve_in_turn,
    events,
    issue_token,
    make_agent,
    make_policy,
    own_stack,
    start_run,
    types,
    wait_status,
)

pytestmark = pytest.mark.stack

MOVE_AFTER = 2
STEPS = 5


@pytest.fixture(scope="module")
async def moving() -> AsyncIterator[tuple[Stack, httpx.AsyncClient]]:
    async with own_stack("fbxm-", {**FAST, "FLUIDBOX_RUN_MOVE_AFTER_UPDATES": str(MOVE_AFTER)}) as stack:
        yield stack


async def test_a_run_with_more_updates_than_one_history_holds_moves_and_completes_unchanged(
    moving: tuple[Stack, httpx.AsyncClient],
) -> None:
    stack, api = moving
    policy = await make_policy(api, {"defaults": {"tool_action": "approve"}})
    script = [{"tool": "Bash", "input": {"command": f"echo step-{n}"}} for n in range(STEPS)]
    run_id = await start_run(api, await make_agent(api, script, policy=policy), workspace=None)
    await approve_in_turn(api, run_id, STEPS)
    row = await wait_status(api, run_id, {"completed", "failed"}, timeout=90)
    evs = await events(api, run_id)
    assert row["status"] == "completed", [e["payload"] for e in evs if e["type"] in ("run.error", "status.changed")]

    # Every step was asked once, approved once and ran: the moves left no trace in the ledger.
    assert types(evs).count("approval.requested") == STEPS
    decisions = [e["payload"]["data"] for e in evs if e["type"] == "tool.decision"]
    assert [(d["verdict"], d["source"]) for d in decisions] == [("allow", "human")] * STEPS
    said = "\n".join(e["payload"]["data"].get("text", "") for e in evs if e["type"] == "agent.message")
    assert all(f"step-{n}" in said for n in range(STEPS))

    # Temporal shows the moves: several runs under the run's workflow id, all but the last continued as new
    # (listing is eventually consistent, and the workflow returns just after the run's row says completed).
    client = await Client.connect(stack.temporal_address or "", namespace="default")
    statuses: list[str] = []

    async def one_completed_after_moves() -> bool:
        runs = [w async for w in client.list_workflows(f'WorkflowId = "{workflow_id(run_id)}"')]
        statuses[:] = sorted(str(w.status.name) for w in runs if w.status is not None)
        done = statuses.count(WorkflowExecutionStatus.COMPLETED.name) == 1
        return done and statuses.count(WorkflowExecutionStatus.CONTINUED_AS_NEW.name) == len(runs) - 1

    await eventually(one_completed_after_moves, timeout=30, message=lambda: str(statuses))
    assert len(statuses) >= 1 + (STEPS - 1) // MOVE_AFTER, statuses


async def test_an_approval_pending_across_a_move_stays_the_same_approval(
    moving: tuple[Stack, httpx.AsyncClient],
) -> None:
    # Three tool calls wait on approval at once (as a model's parallel tool calls would); deciding two of
    # them moves the run while the third still waits. The runner's request for it never notices.
    stack, api = moving
    run_id = await start_run(api, await make_agent(api, [{"sleep_ms": 600000}]), workspace=None)
    await wait_status(api, run_id, {"running"})
    tool = await issue_token(stack.database_url or "", run_id, "tool")
    url = f"/internal/sessions/{run_id}/permission"

    def ask(n: int) -> dict[str, object]:
        return {"tool_call_id": f"mv_{n}", "tool": "Bash", "input": {"command": f"./deploy.sh {n}"}}

    async with httpx.AsyncClient(
        base_url=stack.api_url, headers={"authorization": f"Bearer {tool}"}, timeout=90
    ) as runner:
        waiting = [asyncio.create_task(runner.post(url, json=ask(n))) for n in range(3)]

        async def three_pending() -> dict[str, dict[str, object]] | None:
            listed = (await api.get(f"/v1/sessions/{run_id}/approvals")).json()["approvals"]
            pending = {str(a["tool_call_id"]): a for a in listed if a["status"] == "pending"}
            return pending if len(pending) >= 3 else None

        rows = await eventually(three_pending, timeout=30, message="three approvals never became pending")
        for n in (0, 1):
            r = await api.post(f"/v1/approvals/{rows[f'mv_{n}']['id']}/decision", json={"decision": "approve"})
            assert r.status_code == 200
            assert (await asyncio.wait_for(waiting[n], 60)).json() == {"decision": "allow"}
        client = await Client.connect(stack.temporal_address or "", namespace="default")

        async def moved() -> bool:  # the run moves once two updates were answered
            runs = [w async for w in client.list_workflows(f'WorkflowId = "{workflow_id(run_id)}"')]
            return any(w.status == WorkflowExecutionStatus.CONTINUED_AS_NEW for w in runs)

        await eventually(moved, timeout=30, message="the run never moved")
        assert not waiting[2].done()
        r = await api.post(f"/v1/approvals/{rows['mv_2']['id']}/decision", json={"decision": "deny"})
        assert r.status_code == 200
        assert (await asyncio.wait_for(waiting[2], 60)).json()["decision"] == "deny"
    listed = (await api.get(f"/v1/sessions/{run_id}/approvals")).json()["approvals"]
    assert sorted((a["tool_call_id"], a["status"]) for a in listed) == [
        ("mv_0", "approved_once"),
        ("mv_1", "approved_once"),
        ("mv_2", "denied"),
    ]
    assert types(await events(api, run_id)).count("approval.requested") == 3
    await api.post(f"/v1/sessions/{run_id}/cancel")
    await wait_status(api, run_id, {"cancelled"})


async def test_a_moved_run_keeps_its_wall_clock_deadline(moving: tuple[Stack, httpx.AsyncClient]) -> None:
    # The wall clock is the workflow's timer: a move must carry its deadline, not start a fresh budget.
    stack, api = moving
    budget = 20
    policy = await make_policy(api, {"defaults": {"tool_action": "approve"}})
    # Five approvals move the run twice: a resumed run that reset the deadline would hand a new one on.
    script = [{"tool": "Bash", "input": {"command": f"echo {n}"}} for n in range(5)] + [{"sleep_ms": 600000}]
    agent = await make_agent(api, script, policy=policy)
    run_id = await start_run(api, agent, workspace=None, budgets={"max_wall_clock_secs": budget})
    await approve_in_turn(api, run_id, 5)
    row = await wait_status(api, run_id, {"budget_exceeded", "failed", "completed"}, timeout=90)
    assert row["status"] == "budget_exceeded", row
    exceeded = [e["payload"]["data"] for e in await events(api, run_id) if e["type"] == "budget.exceeded"]
    assert [e["budget"] for e in exceeded] == ["max_wall_clock_secs"]

    client = await Client.connect(stack.temporal_address or "", namespace="default")
    runs = sorted(
        [w async for w in client.list_workflows(f'WorkflowId = "{workflow_id(run_id)}"')], key=lambda w: w.start_time
    )
    inputs = []
    for w in runs:
        history = await client.get_workflow_handle(w.id, run_id=w.run_id).fetch_history()
        started = history.events[0].workflow_execution_started_event_attributes
        inputs.append(json.loads(started.input.payloads[0].data))
    assert len(inputs) >= 3 and inputs[0]["deadline"] is None  # the first run fixes it when supervision starts
    resumed = inputs[1:]
    assert all(i["resumed"] for i in resumed)
    deadlines = {i["deadline"] for i in resumed}
    assert len(deadlines) == 1, deadlines  # every move carries the same one
    # ... fixed before the last run began, so that run did not get a fresh budget of its own.
    deadline = datetime.fromisoformat(deadlines.pop())
    assert deadline < runs[-1].start_time + timedelta(seconds=budget)
