"""Runs outlive their control plane: sandboxes survive a stop, runners ride out the gateway's absence.

A whole stack is stopped and started again (PostgreSQL, Temporal, worker, API) while its runs wait on
approvals; after the restart every approval is decided and every run completes, each tool once. A
runner whose gateway stays away for longer than ``FLUIDBOX_GATEWAY_STALENESS_SECS`` gives up, and its
run fails with a reason naming that. A sandbox whose run ended (or that its database never knew) while the
stack was down is reaped when it comes back.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import httpx
import pytest

from cli.stack import admin_token
from core.ports import SandboxHandle, SandboxSpec
from core.states import RunStatus
from db.engine import create_pool
from sandbox.bubblewrap import BubblewrapProvider
from tests.helpers import context_over, eventually
from tests.integration.conftest import FAST
from tests.integration.helpers import (
    TERMINAL,
    events,
    make_agent,
    make_policy,
    own_stack,
    pending_approvals,
    process_alive,
    run_row,
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


async def end_behind_the_stack(database_url: str, run_id: str, reason: str) -> None:
    """End a run in PostgreSQL the way finalization does, but without tearing its sandbox down."""
    pool = await create_pool(database_url, min_size=1, max_size=1)
    try:
        runs = context_over(pool).runs
        await runs.request_finalization(run_id, "failed", reason=reason, quiesce=False)
        await runs.transition(run_id, RunStatus.FINALIZING, reason)
        await runs.finish(run_id, RunStatus.FAILED, reason, None, "failed", [], [])
    finally:
        await pool.close()


async def start_unknown_sandbox(home: Path) -> SandboxHandle:
    """A sandbox under the stack's runs directory for a run its database never had (a worker of an earlier
    database, or one that died between starting the sandbox and recording its run)."""
    run_id = str(uuid.uuid4())
    run_dir = home / "runs" / run_id
    (run_dir / "workspace").mkdir(parents=True)
    spec = SandboxSpec(
        run_id=run_id,
        workspace_dir=str(run_dir / "workspace"),
        socket_dir=str(run_dir),
        argv=["/bin/sleep", "600"],
        log_path=str(run_dir / "sandbox.log"),
    )
    return await BubblewrapProvider().create(spec)


async def test_a_restarted_stack_reaps_the_sandboxes_of_ended_and_unknown_runs_and_spares_live_ones() -> None:
    env = {**FAST, "FLUIDBOX_GATEWAY_STALENESS_SECS": "300"}
    async with own_stack("fbxo-", env) as (stack, api):
        agent = await make_agent(api, [{"sleep_ms": 600000}])
        ended, live = await asyncio.gather(*(start_run(api, agent, workspace=None) for _ in range(2)))
        await asyncio.gather(*(wait_status(api, run, {"running"}) for run in (ended, live)))
        ended_pid, live_pid = [int((await wait_sandbox_env(run))["__pid__"]) for run in (ended, live)]
        unknown = await start_unknown_sandbox(stack.home)
        unknown_pid = int(unknown.extra["child_pid"])

        # The control plane stops; behind it one run ends (its row says failed, its sandbox still runs).
        stack.stop_process("api")
        stack.stop_process("worker")
        await end_behind_the_stack(stack.database_url or "", ended, "ended while the control plane was down")
        stack.stop(destroy_sandboxes=False)
        assert all(process_alive(pid) for pid in (ended_pid, live_pid, unknown_pid)), "a stop must leave sandboxes"
        await stack.start()

        await wait_gone(ended_pid, timeout=60)
        await wait_gone(unknown_pid, timeout=60)
        assert process_alive(live_pid), "the sandbox of a live run was reaped"
        assert not (stack.home / "runs" / ended / "sandbox.pid").exists()

        token = admin_token(stack.home)[0]
        async with httpx.AsyncClient(
            base_url=stack.api_url, headers={"authorization": f"Bearer {token}"}, timeout=60
        ) as again:
            assert (await again.post(f"/v1/sessions/{live}/cancel")).json() == {"cancelled": True}
            row = await wait_status(again, live, TERMINAL, timeout=90)
            assert (row["status"], row["status_reason"]) == ("cancelled", "cancelled by user")
            assert (await run_row(again, ended))["status"] == "failed"
