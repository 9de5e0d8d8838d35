"""Runs outlive their control plane: sandboxes survive a stop, runners ride out the gateway's absence.

A whole stack is stopped and started again (PostgreSQL, Temporal, worker, API) while its runs wait on
approvals; after the restart every approval is decided and every run completes, each tool once. A
runner whose gateway stays away for longer than ``FLUIDBOX_GATEWAY_STALENESS_SECS`` gives up, and its
run fails with a reason naming that.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from cli.stack import admin_token
from tests.helpers import eventually
from tests.integration.conftest import FAST
from tests.integration.helpers import (
    TERMINAL,
    events,
    make_agent,
    make_policy,
    own_stack,
    pending_approvals,
    process_alive,
    start_run,
    wait_sandbox_env,
    wait_status,
)

pytestmark = pytest.mark.stack

RUNS = 4
APPEND = [{"tool": "Bash", "input": {"command": "echo ran >> ran.txt"}}]


async def wait_gone(pid: int, timeout: float = 60) -> None:
    async def gone() -> bool:
        return not process_alive(pid)

    await eventually(gone, timeout=timeout, message=f"process {pid} still runs")


async def test_runs_waiting_on_approvals_complete_after_the_whole_stack_restarts() -> None:
    env = {**FAST, "FLUIDBOX_GATEWAY_STALENESS_SECS": "300"}
    async with own_stack("fbxr-", env) as (stack, api):
        policy = await make_policy(api, {"defaults": {"tool_action": "approve"}})
        agent = await make_agent(api, APPEND, policy=policy)
        runs = await asyncio.gather(*(start_run(api, agent, workspace=None) for _ in range(RUNS)))
        pending = await pending_approvals(api, RUNS)
        pids = [int((await wait_sandbox_env(run))["__pid__"]) for run in runs]

        stack.stop(destroy_sandboxes=False)
        assert all(process_alive(pid) for pid in pids), "a stop must leave sandboxes running"
        await stack.start()

        token = admin_token(stack.home)[0]
        async with httpx.AsyncClient(
            base_url=stack.api_url, headers={"authorization": f"Bearer {token}"}, timeout=60
        ) as again:
            for approval in pending:
                r = await again.post(f"/v1/approvals/{approval['id']}/decision", json={"decision": "approve"})
                assert r.status_code == 200, r.text
            rows = await asyncio.gather(*(wait_status(again, run, TERMINAL, timeout=180) for run in runs))
            assert [row["status"] for row in rows] == ["completed"] * RUNS, [r["status_reason"] for r in rows]
            for run in runs:
                evs = await events(again, run)
                decisions = [e["payload"]["data"] for e in evs if e["type"] == "tool.decision"]
                assert [(d["verdict"], d["source"]) for d in decisions] == [("allow", "human")]
                diff = (await again.get(f"/v1/sessions/{run}/outputs")).json()["diff"]
                assert diff.count("+ran") == 1, diff  # the approved command ran once, not again after the restart
            # A decision on an approval of a run that has ended answers 409 with the run's state.
            late = await again.post(f"/v1/approvals/{pending[0]['id']}/decision", json={"decision": "deny"})
            assert late.status_code == 409
            assert (late.json()["approval_status"], late.json()["session_status"]) == ("approved_once", "completed")


async def test_a_runner_whose_gateway_stays_away_past_the_staleness_window_gives_up_and_says_why() -> None:
    env = {**FAST, "FLUIDBOX_GATEWAY_STALENESS_SECS": "2"}
    async with own_stack("fbxg-", env) as (stack, api):
        run = await start_run(api, await make_agent(api, [{"sleep_ms": 600000}]), workspace=None)
        await wait_status(api, run, {"running"})
        pid = int((await wait_sandbox_env(run))["__pid__"])
        stack.stop_process("api")
        await wait_gone(pid)  # the runner gave up on its own
        await stack.start_api()
        async with httpx.AsyncClient(
            base_url=stack.api_url, headers={"authorization": f"Bearer {admin_token(stack.home)[0]}"}, timeout=60
        ) as again:
            row = await wait_status(again, run, TERMINAL)
        assert row["status"] == "failed"
        assert row["status_reason"] == (
            "runner gave up: control plane unreachable for longer than FLUIDBOX_GATEWAY_STALENESS_SECS (2s)"
        )
