"""RunWorkflow on Temporal's time-skipping test server, with its activities replaced by test doubles
registered under the contract's names: approval expiry, the wall-clock budget, cancel, and a move to a
fresh history (continue-as-new) while an approval waits. Hours of workflow time pass in seconds.

The doubles keep the run's state the way PostgreSQL would (the wind-down intent, the approval rows) and
record every call, so each test reads what the workflow asked for.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType, IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateStage
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from contracts import temporal as c
from services.run_control import while_moving
from tests.helpers import eventually
from workflows.run import RunWorkflow

TEST_SERVER = Path(sys.executable).parent / "temporal-test-server"
APPROVAL_TTL = timedelta(hours=1)
TERMINAL = {"completed": "completed", "cancelled": "cancelled", "budget_exceeded": "budget_exceeded"}


@dataclass
class FakeRun:
    """Activity doubles for one run, registered under the contract's names."""

    intent: c.FinalizationIn | None = None
    approvals: dict[str, c.ApprovalRow] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)

    def _called(self) -> None:
        self.calls.append(activity.info().activity_type)

    @activity.defn(name=c.CLAIM_SANDBOX)
    async def claim_sandbox(self, ref: c.RunRef) -> c.ClaimOut:
        self._called()
        return c.ClaimOut(claimed=True, live=1)

    @activity.defn(name=c.PROVISION)
    async def provision(self, ref: c.RunRef) -> c.StatusOut:
        self._called()
        return c.StatusOut(status="running")

    @activity.defn(name=c.REQUEST_FINALIZATION)
    async def request_finalization(self, inp: c.FinalizationIn) -> c.StatusOut:
        self._called()
        if self.intent is None:
            self.intent = inp
        return c.StatusOut(status="running")

    @activity.defn(name=c.BEGIN_FINALIZE)
    async def begin_finalize(self, ref: c.RunRef) -> c.BeginFinalizeOut:
        self._called()
        quiesce = self.intent is not None and self.intent.quiesce
        return c.BeginFinalizeOut(status="cancelling" if quiesce else "finalizing", needs_quiesce=quiesce)

    @activity.defn(name=c.AWAIT_SANDBOX_EXIT)
    async def await_sandbox_exit(self, inp: c.SandboxExitIn) -> c.StatusOut:
        self._called()
        return c.StatusOut(status="finalizing")

    @activity.defn(name=c.FINALIZE)
    async def finalize(self, ref: c.RunRef) -> c.StatusOut:
        self._called()
        outcome = self.intent.outcome if self.intent else "failed"
        return c.StatusOut(status=TERMINAL.get(outcome, "failed"))

    @activity.defn(name=c.OPEN_APPROVAL)
    async def open_approval(self, inp: c.ApprovalIn) -> c.ApprovalRow:
        self._called()
        if inp.tool_call_id not in self.approvals:  # idempotent, as the real one: a moved wait opens again
            expires = activity.info().current_attempt_scheduled_time + APPROVAL_TTL
            self.approvals[inp.tool_call_id] = c.ApprovalRow(
                approval_id=f"a-{inp.tool_call_id}", status="pending", expires_at=expires.isoformat()
            )
        return self.approvals[inp.tool_call_id]

    @activity.defn(name=c.READ_APPROVAL)
    async def read_approval(self, inp: c.ApprovalIn) -> c.ApprovalRow:
        self._called()
        return self.approvals[inp.tool_call_id]

    @activity.defn(name=c.EXPIRE_APPROVAL)
    async def expire_approval(self, inp: c.ApprovalIn) -> c.ApprovalRow:
        self._called()
        row = self.approvals[inp.tool_call_id].model_copy(update={"status": "expired", "reason": "approval expired"})
        self.approvals[inp.tool_call_id] = row
        return row

    @activity.defn(name=c.RESUME_AFTER_APPROVAL)
    async def resume_after_approval(self, ref: c.RunRef) -> c.StatusOut:
        self._called()
        return c.StatusOut(status="running")

    def all(self) -> list[Callable[..., Any]]:
        return [
            self.claim_sandbox,
            self.provision,
            self.request_finalization,
            self.begin_finalize,
            self.await_sandbox_exit,
            self.finalize,
            self.open_approval,
            self.read_approval,
            self.expire_approval,
            self.resume_after_approval,
        ]


@dataclass
class Env:
    env: WorkflowEnvironment
    fake: FakeRun
    task_queue: str

    @property
    def client(self) -> Client:
        return self.env.client

    async def start(self, **timing: Any) -> WorkflowHandle[Any, str]:
        """Start a run as RunControl.start does (the doubles stand in for PostgreSQL and the sandbox)."""
        run_id = str(uuid.uuid4())
        max_wall_clock = timing.pop("max_wall_clock_secs", None)
        sandbox_limit = timing.pop("sandbox_limit", True)
        return await self.client.start_workflow(
            RunWorkflow.run,
            c.RunInput(
                run_id=run_id,
                agent_name="test-agent",
                max_wall_clock_secs=max_wall_clock,
                timing=c.Timing(**timing),
                sandbox_limit=sandbox_limit,
            ),
            id=c.workflow_id(run_id),
            task_queue=self.task_queue,
        )

    async def cancel(self, handle: WorkflowHandle[Any, str]) -> None:
        """What RunControl.cancel does: record the intent first, then signal."""
        self.fake.intent = c.FinalizationIn(run_id="x", outcome="cancelled", reason="cancelled by user", quiesce=True)
        await handle.signal(RunWorkflow.cancel)


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    fake = FakeRun()
    task_queue = f"run-{uuid.uuid4()}"
    async with await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=str(TEST_SERVER), data_converter=pydantic_data_converter
    ) as temporal:
        # The run upserts RunStatus; the deployed namespace defines it (cli/stack.py), the test server must too.
        await temporal.client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(
                namespace=temporal.client.namespace,
                search_attributes={name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD for name in c.SEARCH_ATTRIBUTES},
            )
        )
        async with Worker(temporal.client, task_queue=task_queue, workflows=[RunWorkflow], activities=fake.all()):
            yield Env(temporal, fake, task_queue)


async def running(handle: WorkflowHandle[Any, str]) -> None:
    async def provisioned() -> bool:
        return await handle.query(RunWorkflow.status) == "running"

    await eventually(provisioned, timeout=30, message="the run never reached running")


async def test_an_approval_nobody_decides_expires_at_its_ttl_and_denies_the_call(env: Env) -> None:
    handle = await env.start(approval_recheck_secs=600)
    await running(handle)
    wait = await handle.start_update(
        RunWorkflow.await_approval,
        c.ApprovalWait(tool_call_id="t1"),
        id="approval:t1",
        wait_for_stage=WorkflowUpdateStage.ACCEPTED,
    )
    await env.env.sleep(APPROVAL_TTL + timedelta(minutes=1))  # skipped, not slept
    verdict = await wait.result()
    assert verdict == c.ApprovalVerdict(decision="deny", message="approval expired")
    assert env.fake.calls.count(c.EXPIRE_APPROVAL) == 1
    # Re-read every 10 minutes while pending: the slow path for a lost signal.
    assert env.fake.calls.count(c.READ_APPROVAL) == 5
    await env.cancel(handle)
    assert await handle.result() == "cancelled"


async def test_the_wall_clock_budget_ends_the_run_budget_exceeded(env: Env) -> None:
    started = datetime.now(UTC)
    handle = await env.start(max_wall_clock_secs=6 * 3600)
    assert await handle.result() == "budget_exceeded"  # waiting on the result skips time
    assert env.fake.intent is not None
    assert env.fake.intent.budget == "max_wall_clock_secs" and env.fake.intent.limit == str(6 * 3600)
    assert env.fake.calls[-3:] == [c.BEGIN_FINALIZE, c.AWAIT_SANDBOX_EXIT, c.FINALIZE]  # quiesced first
    assert datetime.now(UTC) - started < timedelta(minutes=1)


async def test_a_cancel_quiesces_the_sandbox_and_ends_the_run_cancelled(env: Env) -> None:
    handle = await env.start()
    await running(handle)
    await env.cancel(handle)
    assert await handle.result() == "cancelled"
    assert env.fake.calls == [
        c.CLAIM_SANDBOX,
        c.PROVISION,
        c.BEGIN_FINALIZE,
        c.AWAIT_SANDBOX_EXIT,
        c.FINALIZE,
    ]


async def test_a_run_without_a_sandbox_maximum_provisions_at_once_in_the_worker(env: Env) -> None:
    handle = await env.start(sandbox_limit=False)
    await running(handle)
    await env.cancel(handle)
    assert await handle.result() == "cancelled"
    # No place to take, and provisioning ran in this worker: no activity task for Temporal to dispatch.
    assert env.fake.calls[:2] == [c.PROVISION, c.BEGIN_FINALIZE]
    history = [e async for e in handle.fetch_history_events()]
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
    assert c.PROVISION not in scheduled and c.CLAIM_SANDBOX not in scheduled
    assert scheduled == [c.BEGIN_FINALIZE, c.AWAIT_SANDBOX_EXIT, c.FINALIZE]


async def test_a_run_that_moves_to_a_fresh_history_keeps_its_pending_approval(env: Env) -> None:
    handle = await env.start(move_after_updates=1, approval_recheck_secs=600)
    await running(handle)
    first_run = (await handle.describe()).run_id
    pending = await handle.start_update(
        RunWorkflow.await_approval,
        c.ApprovalWait(tool_call_id="waits"),
        id="approval:waits",
        wait_for_stage=WorkflowUpdateStage.ACCEPTED,
    )
    # One answered update reaches move_after_updates: the run continues as new.
    decided = await handle.start_update(
        RunWorkflow.await_approval,
        c.ApprovalWait(tool_call_id="first"),
        id="approval:first",
        wait_for_stage=WorkflowUpdateStage.ACCEPTED,
    )
    await handle.signal(RunWorkflow.approval_decided, c.ApprovalDecided(tool_call_id="first", status="approved_once"))
    assert (await decided.result()).decision == "allow"
    assert (await pending.result()).decision == "moved"  # the caller waits again, on the new run

    async def moved() -> bool:
        return (await handle.describe()).run_id != first_run

    await eventually(moved, timeout=30, message="the run did not continue as new")
    await handle.signal(RunWorkflow.approval_decided, c.ApprovalDecided(tool_call_id="waits", status="approved_once"))
    # What the runner plane does (RunControl.await_approval): the same update id, again, until it is not "moved".
    again = await while_moving(
        lambda: handle.execute_update(
            RunWorkflow.await_approval, c.ApprovalWait(tool_call_id="waits"), id="approval:waits"
        ),
        lambda v: v.decision == "moved",
    )
    assert again.decision == "allow"
    assert env.fake.calls.count(c.PROVISION) == 1  # the continued run did not provision again
    await env.cancel(handle)
    assert await handle.result() == "cancelled"
