"""A held tool call is answered from its approval row, not only by the run's workflow update.

``gate()`` waits on two things at once: the run's approval update (which needs a worker to run a
workflow task) and the approval row (re-read when the run's ledger moves). With the worker stopped
only the row can answer, so this proves the second path end to end.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from cli.stack import Stack
from tests.helpers import eventually
from tests.integration.helpers import (
    events,
    issue_token,
    make_agent,
    start_run,
    types,
    wait_pending,
    wait_status,
)

pytestmark = pytest.mark.stack

DEPLOY_THEN_SAY = [{"tool": "Bash", "input": {"command": "./deploy.sh"}}, {"say": "after the deploy"}]


async def test_a_decision_reaches_the_held_runner_while_the_worker_is_stopped(
    api: httpx.AsyncClient, stack: Stack
) -> None:
    run_id = await start_run(api, await make_agent(api, DEPLOY_THEN_SAY))
    pending = await wait_pending(api, run_id)
    tool = await issue_token(stack.database_url or "", run_id, "tool")
    stack.kill_process("worker")  # no workflow task can run, so the approval update stays outstanding
    try:
        async with httpx.AsyncClient(
            base_url=stack.api_url, headers={"authorization": f"Bearer {tool}"}, timeout=60
        ) as runner:
            # The same call the runner in the sandbox is holding: a retry re-attaches to its approval.
            body = {"tool_call_id": "rp_001", "tool": "Bash", "input": {"command": "./deploy.sh"}}
            held = asyncio.create_task(runner.post(f"/internal/sessions/{run_id}/permission", json=body))
            r = await api.post(f"/v1/approvals/{pending['id']}/decision", json={"decision": "approve"})
            assert r.status_code == 200, r.text
            answer = await asyncio.wait_for(held, timeout=30)
        assert (answer.status_code, answer.json()) == (200, {"decision": "allow"})

        async def runner_went_on() -> bool:
            evs = await events(api, run_id)
            said = [e["payload"]["data"].get("text") for e in evs if e["type"] == "agent.message"]
            return "after the deploy" in said

        # The sandboxed runner got the same answer from the row: it ran the tool and said its next line.
        await eventually(runner_went_on, timeout=30, message="the held runner never went on")
    finally:
        stack.start_worker()
    row = await wait_status(api, run_id, {"completed", "failed"}, timeout=90)
    assert row["status"] == "completed", row["status_reason"]
    assert row["result_summary"] == "Replay complete: 1 executed, 0 denied."
    evs = await events(api, run_id)
    assert types(evs).count("approval.decided") == 1
    diff = (await api.get(f"/v1/sessions/{run_id}/outputs")).json()["diff"]
    assert diff.count("+deployed") == 1
