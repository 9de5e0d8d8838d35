"""Faults and the runner plane: retries re-attach, reused ids, lost runners, a killed worker, a lost workflow."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess

import httpx
import pytest
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import DeleteWorkflowExecutionRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from activities.runs import WORKFLOW_LOST, WORKFLOW_TERMINATED
from cli.stack import Stack
from config.settings import Settings
from contracts.temporal import workflow_id
from core.runspec import InvocationContext
from db.engine import create_pool
from sandbox import hostfs
from services.runs import RunRequest
from tests.helpers import context_over, eventually
from tests.integration.conftest import FAST
from tests.integration.helpers import (
    TERMINAL,
    events,
    issue_token,
    make_agent,
    make_policy,
    own_stack,
    run_row,
    start_run,
    types,
    wait_pending,
    wait_sandbox_env,
    wait_status,
)
from worker import run_activities

pytestmark = pytest.mark.stack

DEPLOY = [{"tool": "Bash", "input": {"command": "./deploy.sh"}}]
IDLE = [{"sleep_ms": 600000}]


def process_alive(pid: int) -> bool:
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def runner_client(stack: Stack, token: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=stack.api_url, headers={"authorization": f"Bearer {token}"}, timeout=60)


async def test_a_retried_permission_reattaches_to_the_same_approval(api: httpx.AsyncClient, stack: Stack) -> None:
    run_id = await start_run(api, await make_agent(api, DEPLOY))
    pending = await wait_pending(api, run_id)
    tool = await issue_token(stack.database_url or "", run_id, "tool")
    async with runner_client(stack, tool) as runner:
        body = {"tool_call_id": "rp_001", "tool": "Bash", "input": {"command": "./deploy.sh"}}
        retry = asyncio.create_task(runner.post(f"/internal/sessions/{run_id}/permission", json=body))
        await asyncio.sleep(0)  # let the retry reach the server before the decision
        await asyncio.wait({retry}, timeout=0.5)
        assert not retry.done(), "a retry must wait for the same human decision"
        r = await api.post(f"/v1/approvals/{pending['id']}/decision", json={"decision": "approve"})
        assert r.status_code == 200
        answer = await asyncio.wait_for(retry, 30)
        assert answer.json() == {"decision": "allow"}
        # After the decision a further retry gets the recorded verdict at once.
        again = await runner.post(f"/internal/sessions/{run_id}/permission", json=body)
        assert again.json() == {"decision": "allow"}
    await wait_status(api, run_id, {"completed"})
    approvals = (await api.get(f"/v1/sessions/{run_id}/approvals")).json()["approvals"]
    assert len(approvals) == 1
    evs = await events(api, run_id)
    assert types(evs).count("approval.requested") == 1 and types(evs).count("tool.requested") == 1


async def test_a_reused_tool_call_id_with_other_input_is_denied_and_changes_nothing(
    api: httpx.AsyncClient, stack: Stack
) -> None:
    run_id = await start_run(api, await make_agent(api, DEPLOY))
    pending = await wait_pending(api, run_id)
    tool = await issue_token(stack.database_url or "", run_id, "tool")
    async with runner_client(stack, tool) as runner:
        body = {"tool_call_id": "rp_001", "tool": "Bash", "input": {"command": "./deploy.sh --force"}}
        r = await runner.post(f"/internal/sessions/{run_id}/permission", json=body)
        assert r.json() == {"decision": "deny", "message": "tool_call_id reused with a different tool or input"}
    approvals = (await api.get(f"/v1/sessions/{run_id}/approvals")).json()["approvals"]
    assert [(a["id"], a["status"]) for a in approvals] == [(pending["id"], "pending")]
    violation = [e for e in await events(api, run_id) if e["payload"]["data"].get("source") == "protocol_violation"]
    assert len(violation) == 1
    await api.post(f"/v1/approvals/{pending['id']}/decision", json={"decision": "deny"})
    await wait_status(api, run_id, {"completed"})


async def test_run_tokens_are_audience_scoped(api: httpx.AsyncClient, stack: Stack) -> None:
    run_id = await start_run(api, await make_agent(api, IDLE))
    await wait_status(api, run_id, {"running"})
    tool = await issue_token(stack.database_url or "", run_id, "tool")
    control = await issue_token(stack.database_url or "", run_id, "control")
    body = {"tool_call_id": "x1", "tool": "Read", "input": {"file_path": "/workspace/app.py"}}
    async with runner_client(stack, control) as as_control, runner_client(stack, tool) as as_tool:
        wrong = await as_control.post(f"/internal/sessions/{run_id}/permission", json=body)
        assert (wrong.status_code, wrong.json()) == (403, {"error": "wrong_audience"})
        wrong = await as_tool.post(f"/internal/sessions/{run_id}/heartbeat")
        assert (wrong.status_code, wrong.json()) == (403, {"error": "wrong_audience"})
        assert (await as_tool.post(f"/internal/sessions/{run_id}/permission", json=body)).json() == {
            "decision": "allow"
        }
        # A run token never opens the public API, and the admin token never opens the runner plane.
        assert (await as_control.get("/v1/sessions")).status_code == 401
        other = await api.post(f"/internal/sessions/{run_id}/heartbeat")
        assert other.status_code == 401
    async with runner_client(stack, "fbx_sess_" + "0" * 32) as forged:
        assert (await forged.post(f"/internal/sessions/{run_id}/heartbeat")).status_code == 401
    assert (await api.post(f"/v1/sessions/{run_id}/cancel")).json() == {"cancelled": True}
    await wait_status(api, run_id, {"cancelled"})
    # After the run ends its tokens are revoked.
    async with runner_client(stack, control) as as_control:
        assert (await as_control.post(f"/internal/sessions/{run_id}/heartbeat")).status_code == 401
        late = await as_control.post(f"/internal/sessions/{run_id}/result", json={"outcome": "completed"})
        assert late.json() == {"ok": True, "note": "already terminal"}


async def test_a_killed_runner_fails_the_run_with_a_reason(api: httpx.AsyncClient) -> None:
    run_id = await start_run(api, await make_agent(api, IDLE))
    await wait_status(api, run_id, {"running"})
    env = await wait_sandbox_env(run_id)
    os.kill(int(env["__pid__"]), signal.SIGKILL)
    row = await wait_status(api, run_id, {"failed", "completed", "cancelled"})
    assert row["status"] == "failed"
    assert row["status_reason"] == "sandbox died (runner exited without reporting a result)"
    errors = [e for e in await events(api, run_id) if e["type"] == "run.error"]
    assert [e["payload"]["data"]["message"] for e in errors] == [row["status_reason"]]


async def test_a_runner_that_stops_heartbeating_fails_the_run(api: httpx.AsyncClient) -> None:
    run_id = await start_run(api, await make_agent(api, IDLE))
    await wait_status(api, run_id, {"running"})
    env = await wait_sandbox_env(run_id)
    os.kill(int(env["__pid__"]), signal.SIGSTOP)  # alive but silent: a hung runner
    row = await wait_status(api, run_id, {"failed", "completed", "cancelled"})
    assert row["status"] == "failed"
    assert row["status_reason"].startswith("runner stopped heartbeating")
    assert not process_alive(int(env["__pid__"])), "finalization must destroy the sandbox"


async def test_killing_the_worker_mid_run_loses_nothing(api: httpx.AsyncClient, stack: Stack) -> None:
    run_id = await start_run(api, await make_agent(api, [*DEPLOY, {"say": "after the deploy"}]))
    pending = await wait_pending(api, run_id)
    stack.kill_process("worker")
    try:
        r = await api.post(f"/v1/approvals/{pending['id']}/decision", json={"decision": "approve"})
        assert r.status_code == 200
    finally:
        stack.start_worker()
    row = await wait_status(api, run_id, {"completed", "failed"}, timeout=90)
    assert row["status"] == "completed", row["status_reason"]
    assert row["result_summary"] == "Replay complete: 1 executed, 0 denied."
    evs = await events(api, run_id)
    assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1))
    for kind in ("tool.requested", "approval.requested", "approval.decided", "tool.decision", "run.result"):
        assert types(evs).count(kind) == 1, kind
    diff = (await api.get(f"/v1/sessions/{run_id}/outputs")).json()["diff"]
    assert diff.count("+deployed") == 1


async def test_a_decision_whose_signal_was_lost_still_reaches_the_run(api: httpx.AsyncClient, stack: Stack) -> None:
    """The decision's CAS commits but the signal never arrives (an API crash between the two)."""
    from db.engine import create_pool

    run_id = await start_run(api, await make_agent(api, DEPLOY))
    pending = await wait_pending(api, run_id)
    pool = await create_pool(stack.database_url or "", min_size=1, max_size=1)
    try:
        ctx = context_over(pool)
        spec = await ctx.runs.run_spec(run_id)
        await ctx.approvals.decide_approval(spec.tenant_id, pending["id"], "approved_once", "operator")
    finally:
        await pool.close()
    # FLUIDBOX_APPROVAL_RECHECK_SECS is 1 s in the test stack: the workflow re-reads the row.
    row = await wait_status(api, run_id, {"completed", "failed"}, timeout=60)
    assert row["result_summary"] == "Replay complete: 1 executed, 0 denied."
    assert types(await events(api, run_id)).count("approval.decided") == 1


async def test_concurrent_duplicates_of_a_new_tool_call_register_one_intent(
    api: httpx.AsyncClient, stack: Stack
) -> None:
    run_id = await start_run(api, await make_agent(api, IDLE))
    await wait_status(api, run_id, {"running"})
    tool = await issue_token(stack.database_url or "", run_id, "tool")
    async with runner_client(stack, tool) as runner:
        body = {"tool_call_id": "same-1", "tool": "Read", "input": {"file_path": "/workspace/app.py"}}
        answers = await asyncio.gather(
            *[runner.post(f"/internal/sessions/{run_id}/permission", json=body) for _ in range(8)]
        )
    assert {(a.status_code, a.text) for a in answers} == {(200, '{"decision":"allow"}')}
    evs = await events(api, run_id)
    assert types(evs).count("tool.requested") == 1 and types(evs).count("tool.decision") == 1
    await api.post(f"/v1/sessions/{run_id}/cancel")
    await wait_status(api, run_id, {"cancelled"})


async def test_the_gateway_socket_serves_only_the_runner_plane_and_tokens_stay_with_their_run(
    api: httpx.AsyncClient, stack: Stack
) -> None:
    socket_path = stack.home / "gateway" / "api.sock"
    async with httpx.AsyncClient(
        transport=httpx.AsyncHTTPTransport(uds=str(socket_path)), base_url="http://fluidbox"
    ) as gw:
        for path in ("/v1/health", "/v1/sessions", "/docs", "/openapi.json"):
            r = await gw.get(path, headers={"authorization": api.headers["authorization"]})
            assert (r.status_code, r.json()) == (404, {"error": "not found", "code": "not_found"}), path
    one = await start_run(api, await make_agent(api, IDLE))
    two = await start_run(api, await make_agent(api, IDLE))
    await wait_status(api, one, {"running"})
    await wait_status(api, two, {"running"})
    token_one = await issue_token(stack.database_url or "", one, "tool")
    async with runner_client(stack, token_one) as runner:
        body = {"tool_call_id": "x", "tool": "Read", "input": {"file_path": "/workspace/a"}}
        other = await runner.post(f"/internal/sessions/{two}/permission", json=body)
        assert (other.status_code, other.json()) == (404, {"error": "not found", "code": "not_found"})
    assert "tool.requested" not in types(await events(api, two))
    for run_id in (one, two):
        await api.post(f"/v1/sessions/{run_id}/cancel")
        await wait_status(api, run_id, {"cancelled"})


async def test_a_cancelled_run_accepts_no_new_tool_call(api: httpx.AsyncClient, stack: Stack) -> None:
    run_id = await start_run(api, await make_agent(api, IDLE))
    await wait_status(api, run_id, {"running"})
    tool = await issue_token(stack.database_url or "", run_id, "tool")
    assert (await api.post(f"/v1/sessions/{run_id}/cancel")).json() == {"cancelled": True}
    async with runner_client(stack, tool) as runner:
        body = {"tool_call_id": "after-cancel", "tool": "Read", "input": {"file_path": "/workspace/a"}}
        r = await runner.post(f"/internal/sessions/{run_id}/permission", json=body)
        assert r.json() == {"decision": "deny", "message": "session is not active"}
    await wait_status(api, run_id, {"cancelled"})
    assert "tool.requested" not in types(await events(api, run_id))


async def test_approval_summaries_are_redacted_like_the_ledger(api: httpx.AsyncClient) -> None:
    secret = "ghp_" + "s" * 36
    run_id = await start_run(
        api, await make_agent(api, [{"tool": "Bash", "input": {"command": f"./deploy.sh --token {secret}"}}])
    )
    pending = await wait_pending(api, run_id)
    assert secret not in pending["summary"] and "‹redacted›" in pending["summary"]
    inbox = (await api.get("/v1/approvals")).text
    assert secret not in inbox
    await api.post(f"/v1/approvals/{pending['id']}/decision", json={"decision": "deny"})
    await wait_status(api, run_id, {"completed"})


async def test_the_runner_plane_answers_liveness_on_the_gateway_socket(stack: Stack) -> None:
    socket_path = stack.home / "gateway" / "api.sock"
    async with httpx.AsyncClient(
        transport=httpx.AsyncHTTPTransport(uds=str(socket_path)), base_url="http://fluidbox"
    ) as gw:
        r = await gw.get("/internal/health")
        assert (r.status_code, r.json()) == (200, {"status": "ok"})


async def test_a_retried_provisioning_replaces_the_sandbox_an_interrupted_attempt_left(
    api: httpx.AsyncClient, stack: Stack
) -> None:
    """The worker dies after starting a sandbox but before recording it; the retry must not leave that
    sandbox running with revoked tokens and a rebuilt workspace under it."""
    import uuid

    from temporalio.testing import ActivityEnvironment

    from config.settings import Settings
    from contracts import temporal as c
    from db.engine import create_pool
    from sandbox.registry import make_provider

    stack.kill_process("worker")  # nothing else provisions this run while we drive the activity
    pool = await create_pool(stack.database_url or "", min_size=1, max_size=4)
    try:
        run_id = await start_run(api, await make_agent(api, IDLE))
        settings = Settings(home=stack.home, database_url=stack.database_url, heartbeat_secs=0.5, replay_delay_ms=0)
        acts = run_activities(context_over(pool, settings), make_provider())
        env = ActivityEnvironment()
        assert (await env.run(acts.provision, c.RunRef(run_id=run_id))).status == "running"
        first = (await run_row(api, run_id))["sandbox_handle"]
        # The crash window: the sandbox started, its handle was never recorded.
        async with pool.acquire() as conn:
            await conn.execute(
                "UPDATE sessions SET sandbox_handle = NULL, status = 'initializing' WHERE id = $1", uuid.UUID(run_id)
            )
        assert (await env.run(acts.provision, c.RunRef(run_id=run_id))).status == "running"
        second = (await run_row(api, run_id))["sandbox_handle"]
        assert second["pid"] != first["pid"]
        assert not process_alive(first["pid"]), "the orphaned sandbox must be gone"
        said = [e["payload"]["data"]["text"] for e in await events(api, run_id) if e["type"] == "agent.message"]
        assert "replaced a sandbox left by an interrupted provisioning attempt" in said
    finally:
        await pool.close()
        stack.start_worker()

    # The replacement holds the live tokens: its heartbeats land.
    async def heartbeated() -> bool:
        return (await run_row(api, run_id))["last_heartbeat_at"] is not None

    await eventually(heartbeated, timeout=30, message="the replacement sandbox never heartbeated")
    await api.post(f"/v1/sessions/{run_id}/cancel")
    row = await wait_status(api, run_id, {"cancelled", "failed"}, timeout=90)
    assert row["status"] == "cancelled"


async def test_a_run_whose_starter_died_before_starting_its_workflow_is_started_by_the_api(
    api: httpx.AsyncClient, stack: Stack
) -> None:
    # The first half of run creation, exactly as every entry point does it, then the process "dies":
    # the run row (and its idempotency claim, for triggers) is committed, its workflow never started.
    pool = await create_pool(stack.database_url or "", min_size=1, max_size=2)
    try:
        # No Temporal here: this half never reaches it.
        ctx = context_over(pool, Settings(temporal_address=stack.temporal_address, task_queue=stack.task_queue))
        agent = await make_agent(api, [{"sleep_ms": 1}])
        tenant_id = await ctx.identity.boot_tenant()
        spec = await ctx.run_factory.prepare(tenant_id, RunRequest(agent=agent, task="stranded"), InvocationContext())
        await ctx.runs.create_run(spec, invoked_by_kind="operator")
    finally:
        await pool.close()
    assert (await run_row(api, spec.run_id))["status"] == "created"
    # The API's stranded-run check (FLUIDBOX_STRANDED_AFTER_SECS=3 in the test stack) starts it.
    row = await wait_status(api, spec.run_id, {"completed", "failed"}, timeout=60)
    assert row["status"] == "completed"


async def test_more_tool_calls_awaiting_approval_than_temporal_holds_in_flight_wait_their_turn(
    api: httpx.AsyncClient, stack: Stack
) -> None:
    # Temporal holds at most 10 updates in flight per workflow, and each approval wait is one. An 11th
    # parallel call is told to retry (429, which the runner retries with the same tool_call_id), never denied.
    run_id = await start_run(api, await make_agent(api, IDLE))
    await wait_status(api, run_id, {"running"})
    tool = await issue_token(stack.database_url or "", run_id, "tool")

    def ask(n: int) -> dict[str, object]:
        return {"tool_call_id": f"par_{n:02d}", "tool": "Bash", "input": {"command": f"./deploy.sh {n}"}}

    async with runner_client(stack, tool) as runner:
        url = f"/internal/sessions/{run_id}/permission"
        waiting = [asyncio.create_task(runner.post(url, json=ask(n))) for n in range(10)]

        async def statuses() -> dict[str, str]:
            listed = (await api.get(f"/v1/sessions/{run_id}/approvals")).json()["approvals"]
            return {a["tool_call_id"]: a["status"] for a in listed}

        # 'pending' is written inside each approval's update: ten pending = ten updates in flight.
        async def ten_pending() -> bool:
            return list((await statuses()).values()).count("pending") >= 10

        await eventually(ten_pending, timeout=30, message="ten approvals never became pending")
        extra = await runner.post(url, json=ask(10))
        assert extra.status_code == 429, extra.text
        assert "retry" in extra.json()["error"] and "approval" in extra.json()["error"]
        assert not any(t.done() for t in waiting)
        # The gate registered the 11th call (not yet pending: no update holds it). Once a slot frees, the
        # runner's retry with the same tool_call_id opens that very approval and gets its decision.
        assert (await statuses())["par_10"] != "pending"
        approvals = (await api.get(f"/v1/sessions/{run_id}/approvals")).json()["approvals"]
        by_call = {a["tool_call_id"]: a for a in approvals}
        r = await api.post(f"/v1/approvals/{by_call['par_00']['id']}/decision", json={"decision": "approve"})
        assert r.status_code == 200
        assert (await asyncio.wait_for(waiting[0], 30)).json() == {"decision": "allow"}
        retried = asyncio.create_task(runner.post(url, json=ask(10)))

        async def retry_opened() -> bool:
            assert not retried.done(), f"the retry ended without opening its approval: {retried}"
            return (await statuses())["par_10"] == "pending"

        await eventually(retry_opened, timeout=30, message="the retry never opened its approval")
        r = await api.post(f"/v1/approvals/{by_call['par_10']['id']}/decision", json={"decision": "approve"})
        assert r.status_code == 200
        assert (await asyncio.wait_for(retried, 30)).json() == {"decision": "allow"}
        assert len((await api.get(f"/v1/sessions/{run_id}/approvals")).json()["approvals"]) == 11  # no second one
        await api.post(f"/v1/sessions/{run_id}/cancel")
        answers = await asyncio.wait_for(asyncio.gather(*waiting[1:]), 60)
        assert all(a.json()["decision"] == "deny" for a in answers)
    await wait_status(api, run_id, {"cancelled"})


async def test_a_run_whose_workflow_was_terminated_from_the_temporal_ui_is_ended_by_the_sweep() -> None:
    async with own_stack("fbxw-", {**FAST, "FLUIDBOX_SANDBOX_ORPHAN_SWEEP_SECS": "0.5"}) as (stack, api):
        agent = await make_agent(api, IDLE)
        lost, live = await asyncio.gather(*(start_run(api, agent, workspace=None) for _ in range(2)))
        await asyncio.gather(*(wait_status(api, run, {"running"}) for run in (lost, live)))
        lost_pid, live_pid = [int((await wait_sandbox_env(run))["__pid__"]) for run in (lost, live)]
        temporal = await Client.connect(stack.temporal_address or "", namespace="default")

        # What an operator does in the Temporal UI; the runner keeps working and heartbeating.
        await temporal.get_workflow_handle(workflow_id(lost)).terminate(reason="cleaning up")

        row = await wait_status(api, lost, TERMINAL)
        assert (row["status"], row["status_reason"]) == ("failed", WORKFLOW_TERMINATED)
        errors = [e["payload"]["data"]["message"] for e in await events(api, lost) if e["type"] == "run.error"]
        assert errors == [WORKFLOW_TERMINATED]
        assert not process_alive(lost_pid), "the run's sandbox must be destroyed"
        # The same sweep looked at the other run, whose workflow runs: it goes on.
        assert (await run_row(api, live))["status"] == "running" and process_alive(live_pid)


async def test_cancelling_a_run_whose_workflow_is_gone_ends_it() -> None:
    # An hour between the sweeps that look for such runs: only the cancel can end these two.
    async with own_stack("fbxc-", {**FAST, "FLUIDBOX_SANDBOX_ORPHAN_SWEEP_SECS": "3600"}) as (stack, api):
        agent = await make_agent(api, IDLE)
        terminated, deleted = await asyncio.gather(*(start_run(api, agent, workspace=None) for _ in range(2)))
        await asyncio.gather(*(wait_status(api, run, {"running"}) for run in (terminated, deleted)))
        pids = [int((await wait_sandbox_env(run))["__pid__"]) for run in (terminated, deleted)]
        temporal = await Client.connect(stack.temporal_address or "", namespace="default")
        await temporal.get_workflow_handle(workflow_id(terminated)).terminate(reason="cleaning up")
        # Deleted, as from the UI, or as if Temporal's data were lost: Temporal no longer knows the workflow.
        await temporal.workflow_service.delete_workflow_execution(
            DeleteWorkflowExecutionRequest(
                namespace="default", workflow_execution=WorkflowExecution(workflow_id=workflow_id(deleted))
            )
        )

        async def forgotten() -> bool:
            try:
                await temporal.get_workflow_handle(workflow_id(deleted)).describe()
            except RPCError as err:
                return err.status == RPCStatusCode.NOT_FOUND
            return False

        await eventually(forgotten, timeout=30, message="Temporal still knows the deleted workflow")

        for run in (terminated, deleted):
            assert (await api.post(f"/v1/sessions/{run}/cancel")).json() == {"cancelled": True}
        rows = await asyncio.gather(*(wait_status(api, run, TERMINAL) for run in (terminated, deleted)))
        assert [(r["status"], r["status_reason"]) for r in rows] == [("cancelled", "cancelled by user")] * 2
        for run, why in ((terminated, WORKFLOW_TERMINATED), (deleted, WORKFLOW_LOST)):
            said = [e["payload"]["data"]["text"] for e in await events(api, run) if e["type"] == "agent.message"]
            assert why in said, said
        assert not any(process_alive(pid) for pid in pids), "their sandboxes must be destroyed"


async def test_every_workflow_missing_at_once_looks_like_the_wrong_temporal_and_ends_no_run() -> None:
    """A worker pointed at another Temporal (address, namespace) finds no run's workflow: the sweep must not take
    that for every workflow deleted and fail every run; it says what to check, and a cancel still ends a run."""
    async with own_stack("fbxn-", {**FAST, "FLUIDBOX_SANDBOX_ORPHAN_SWEEP_SECS": "0.5"}) as (stack, api):
        agent = await make_agent(api, IDLE)
        runs = await asyncio.gather(*(start_run(api, agent, workspace=None) for _ in range(3)))
        await asyncio.gather(*(wait_status(api, run, {"running"}) for run in runs))
        temporal = await Client.connect(stack.temporal_address or "", namespace="default")
        for run in runs:
            await temporal.workflow_service.delete_workflow_execution(
                DeleteWorkflowExecutionRequest(
                    namespace="default", workflow_execution=WorkflowExecution(workflow_id=workflow_id(run))
                )
            )
        log = stack.logs / "worker.log"
        said = "none of the 3 started runs has a workflow in Temporal namespace 'default'"

        async def warned() -> bool:
            return said in log.read_text(errors="replace")

        await eventually(warned, timeout=60, message="no warning logged")
        rows = await asyncio.gather(*(run_row(api, run) for run in runs))
        assert [r["status"] for r in rows] == ["running"] * 3
        assert (await api.post(f"/v1/sessions/{runs[0]}/cancel")).json() == {"cancelled": True}
        row = await wait_status(api, runs[0], TERMINAL)
        assert (row["status"], row["status_reason"]) == ("cancelled", "cancelled by user")
        for run in runs[1:]:
            await api.post(f"/v1/sessions/{run}/cancel")
            await wait_status(api, run, TERMINAL)


# Issue 24: the workspace an agent leaves cannot keep its run from ending.
NEST_DEEP = (
    "python3 -c 'import os\n"
    "def nest(top, depth, name):\n"
    "    fd = os.open(top, os.O_RDONLY)\n"
    "    for _ in range(depth):\n"
    "        os.mkdir(name, dir_fd=fd); inner = os.open(name, os.O_RDONLY, dir_fd=fd); os.close(fd); fd = inner\n"
    '    os.close(os.open("bottom.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)); os.close(fd)\n'
    'nest(".", 1500, "d")\n'
    'os.mkdir("long"); nest("long", 30, "l" * 200)\n'
    "'"
)


async def test_runs_leaving_a_15_terabyte_sparse_file_or_a_1500_deep_tree_end_with_their_diff(
    api: httpx.AsyncClient, stack: Stack
) -> None:
    # Finding 4: the diff read 15 TiB; finding 5: the hand-back recursed. Either left the run finalizing for ever.
    policy = await make_policy(api, {"defaults": {"tool_action": "allow"}})
    sparse = await start_run(
        api, await make_agent(api, [{"tool": "Bash", "input": {"command": "truncate -s 15T huge.bin"}}], policy=policy)
    )
    deep = await start_run(
        api, await make_agent(api, [{"tool": "Bash", "input": {"command": NEST_DEEP}}], policy=policy)
    )

    try:
        for run_id in (sparse, deep):
            row = await wait_status(api, run_id, {"completed", "failed", "cancelled"}, timeout=120)
            assert (row["status"], row["status_reason"]) == ("completed", None), row
        out = (await api.get(f"/v1/sessions/{sparse}/outputs")).json()
        assert "diff --git a/huge.bin b/huge.bin\nnew file mode 100644" in out["diff"]
        assert f"+(fluidbox: file not read: {15 << 40} bytes (" in out["diff"] and "not hashed)" in out["diff"]
        out = (await api.get(f"/v1/sessions/{deep}/outputs")).json()
        assert "+(fluidbox: directory not walked: deeper than 200 levels)" in out["diff"]
        assert "l" * 200 + "/bottom.txt" in out["diff"]
        # The tree the sandbox left is the control plane's again, however deep (GNU find walks any depth).
        ws = stack.home.resolve() / "runs" / deep / "workspace"
        found = subprocess.run(["find", str(ws), "!", "-uid", str(os.geteuid())], capture_output=True, check=True)
        assert found.stdout == b""
    finally:
        # Not left to the stack's teardown: shutil.rmtree recurses, and a 1,500-deep tree is past its reach.
        await asyncio.to_thread(hostfs.remove_tree, str(stack.home.resolve() / "runs" / deep))


async def test_a_run_whose_collection_never_came_back_twice_ends_without_a_diff_saying_why(
    api: httpx.AsyncClient, stack: Stack
) -> None:
    # Finding 4: a finalize attempt that never returns from collecting (timed out, its worker killed) was retried
    # for ever. The run is parked on an approval; its directory then records two such attempts, as two killed
    # workers would have left it.
    run_id = await start_run(api, await make_agent(api, DEPLOY))
    pending = await wait_pending(api, run_id)
    (stack.home.resolve() / "runs" / run_id / ".collect-attempts").write_text("2")
    r = await api.post(f"/v1/approvals/{pending['id']}/decision", json={"decision": "deny"})
    assert r.status_code == 200, r.text

    row = await wait_status(api, run_id, {"completed", "failed", "cancelled"})
    why = "diff unavailable: collecting the workspace did not finish in 2 attempts"
    assert (row["status"], row["status_reason"]) == ("completed", why)
    out = (await api.get(f"/v1/sessions/{run_id}/outputs")).json()
    assert out["diff"] == f"({why})\n"
    missing = [e["payload"]["data"] for e in await events(api, run_id) if e["type"] == "artifact.missing"]
    assert [(m["kind"], m["fallback"]) for m in missing] == [("diff", "none")]
