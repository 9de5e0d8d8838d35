"""Run control: the one owner of what the control plane tells a run's workflow.

Every message the control plane sends to a running ``RunWorkflow`` goes through here: start, the
"write to PostgreSQL, then signal" steps (cancel, the runner's result, a human approval decision), the
budget stop, and the two updates the runner plane waits on (approval waits and brokered calls).

The order is always the same: the intent or decision is committed in PostgreSQL first, the signal only
wakes the workflow. A lost signal therefore costs latency, never correctness (the workflow re-reads
approvals on a slow timer; the liveness sweep re-signals a run whose intent exists), so signal failures
are logged, not raised.

The seam: :class:`RunControl` holds the PostgreSQL half and talks to the workflows through a
:class:`RunWorkflows`. :class:`TemporalRunWorkflows` is the real one, and translates Temporal's errors into
``core.errors`` so routes never see a Temporal type; :class:`InMemoryRunWorkflows` records what it is told,
for the in-process API tier (``tests/api``) and for embedders' tests. Both keep one contract, tested as such
(``tests/services/test_run_workflows.py``): a second start of one run raises :class:`WorkflowExists`; a
signal to a run with no workflow is not an error; an approval wait for one answers None, and a brokered call
for one raises ``BadRequest``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from config.settings import Settings
from contracts import temporal as c
from core.errors import BadRequest, TooBusy, Unavailable
from core.redaction import scrub_text
from core.runspec import RunSpec
from core.states import is_terminal
from db.approvals import ApprovalRecord, Approvals, ApprovalWithAuthority
from db.connections import ConnectionRow
from db.parks import Parks
from db.runs import Runs
from workflows.run import RunWorkflow

log = logging.getLogger("fluidbox.services.run_control")

T = TypeVar("T")
MOVE_PATIENCE_SECS = 60.0
# Temporal holds at most 10 updates in flight per workflow: approval waits and brokered calls each use one.
BUSY = (
    "too many tool calls of this run are waiting on an approval or a brokered call (the workflow engine holds 10 "
    "at a time); retry with the same tool_call_id"
)
UNAVAILABLE = "the workflow engine is unavailable; retry with the same tool_call_id"


def timing(settings: Settings) -> c.Timing:
    return c.Timing(
        liveness_check_secs=settings.liveness_check_secs,
        heartbeat_stale_secs=settings.heartbeat_stale_secs,
        quiesce_secs=settings.quiesce_secs,
        approval_recheck_secs=settings.approval_recheck_secs,
        capacity_recheck_secs=settings.capacity_recheck_secs,
        move_after_updates=settings.run_move_after_updates,
    )


def queues(settings: Settings) -> c.Queues | None:
    """The run's sandbox and broker task queues when configured apart from the runs queue (else None)."""
    if not settings.sandbox_task_queue and not settings.broker_task_queue:
        return None
    return c.Queues(sandbox=settings.sandbox_task_queue, broker=settings.broker_task_queue)


async def while_moving(call: Callable[[], Awaitable[T]], moved: Callable[[T], bool]) -> T:
    """Run a workflow update again while the run moves to a fresh history (continue-as-new): refused
    with ``RunMoving``, or an approval wait answered ``moved``. A move takes a workflow task or two; past
    MOVE_PATIENCE_SECS the caller gets 503 and retries with the same tool_call_id."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + MOVE_PATIENCE_SECS
    pause = 0.02
    while True:
        try:
            result = await call()
        except WorkflowUpdateFailedError as exc:
            cause = exc.cause
            if not (isinstance(cause, ApplicationError) and cause.type == c.RUN_MOVING):
                raise
        else:
            if not moved(result):
                return result
        if loop.time() > deadline:
            raise Unavailable("the run is moving to a fresh workflow history; retry with the same tool_call_id")
        await asyncio.sleep(pause)
        pause = min(pause * 2, 1.0)


class WorkflowExists(Exception):
    """The run's workflow was started already (a second start of one run id)."""


class RunWorkflows(Protocol):
    """What the control plane tells runs' workflows (the Temporal side of :class:`RunControl`)."""

    async def start(self, spec: RunSpec, settings: Settings) -> None:
        """Start the run's workflow. Raises :class:`WorkflowExists` when it has one."""

    async def cancel(self, run_id: str) -> None:
        """Wake the run to act on its wind-down intent (a cancel, a budget stop)."""

    async def runner_finished(self, run_id: str) -> None:
        """Wake the run to act on the runner's recorded result."""

    async def approval_decided(self, run_id: str, tool_call_id: str, status: str) -> None:
        """Tell the run a human decided this tool call's approval."""

    async def connection_ready(self, run_ids: list[str]) -> None:
        """Wake runs parked on a connection that may be usable now."""

    async def await_approval(self, run_id: str, tool_call_id: str) -> c.ApprovalVerdict | None:
        """Hold until a human decides; None when the run no longer accepts work.

        Raises:
            TooBusy: the workflow already holds its maximum of in-flight updates.
            Unavailable: the workflow engine is unreachable, or the run kept moving.
        """

    async def broker(self, run_id: str, tool_call_id: str, digest: str, attempt: int) -> None:
        """Execute one brokered call attempt in the run's workflow (its outcome lands in the claim row).

        Raises:
            BadRequest: the run has no workflow.
            TooBusy / Unavailable: as for :meth:`await_approval`.
        """


class TemporalRunWorkflows:
    """:class:`RunWorkflows` over a Temporal client (connected lazily, on first use)."""

    def __init__(self, temporal: Callable[[], Awaitable[Client]]) -> None:
        self.temporal = temporal

    async def handle(self, run_id: str) -> WorkflowHandle[Any, Any]:
        client = await self.temporal()
        handle: WorkflowHandle[Any, Any] = client.get_workflow_handle(c.workflow_id(run_id))
        return handle

    async def start(self, spec: RunSpec, settings: Settings) -> None:
        """Start the run's workflow (id = ``run-<run id>``). A spec with pending requirements starts parked
        (``waiting_for_connection``)."""
        client = await self.temporal()
        parked = bool(spec.pending_requirements)
        try:
            await client.start_workflow(
                RunWorkflow.run,
                c.RunInput(
                    run_id=spec.run_id,
                    agent_name=spec.agent_name,
                    max_wall_clock_secs=spec.budgets.max_wall_clock_secs,
                    timing=timing(settings),
                    parked=parked,
                    queues=queues(settings),
                    sandbox_limit=settings.max_sandboxes > 0,
                ),
                id=c.workflow_id(spec.run_id),
                task_queue=settings.task_queue,
                id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                search_attributes=TypedSearchAttributes(
                    [
                        SearchAttributePair(c.RUN_STATUS, "waiting_for_connection" if parked else "created"),
                        SearchAttributePair(c.AGENT_NAME, spec.agent_name),
                    ]
                ),
                static_summary=scrub_text(f"{spec.agent_name}: {spec.task[:120]}"),
            )
        except WorkflowAlreadyStartedError as exc:
            raise WorkflowExists(spec.run_id) from exc

    async def _signal(self, run_id: str, signal: Any, arg: Any = None) -> None:
        handle = await self.handle(run_id)
        try:
            if arg is None:
                await handle.signal(signal)
            else:
                await handle.signal(signal, arg)
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise

    async def cancel(self, run_id: str) -> None:
        await self._signal(run_id, RunWorkflow.cancel)

    async def runner_finished(self, run_id: str) -> None:
        await self._signal(run_id, RunWorkflow.runner_finished)

    async def approval_decided(self, run_id: str, tool_call_id: str, status: str) -> None:
        await self._signal(
            run_id, RunWorkflow.approval_decided, c.ApprovalDecided(tool_call_id=tool_call_id, status=status)
        )

    async def connection_ready(self, run_ids: list[str]) -> None:
        for run_id in run_ids:
            try:
                await self._signal(run_id, c.CONNECTION_READY_SIGNAL)
            except Exception:
                log.warning("connection-ready signal for run %s not delivered", run_id, exc_info=True)

    async def await_approval(self, run_id: str, tool_call_id: str) -> c.ApprovalVerdict | None:
        try:
            handle = await self.handle(run_id)
            return await while_moving(
                lambda: handle.execute_update(
                    RunWorkflow.await_approval,
                    c.ApprovalWait(tool_call_id=tool_call_id),
                    id=f"approval:{tool_call_id}",
                ),
                lambda v: v.decision == "moved",
            )
        except WorkflowUpdateFailedError as exc:
            log.info("approval wait for %s/%s ended: %s", run_id, tool_call_id, exc)
            return None
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return None
            if exc.status == RPCStatusCode.RESOURCE_EXHAUSTED:
                raise TooBusy(BUSY) from exc
            # The workflow engine is unreachable: a transient failure the runner retries with the same id.
            log.warning("approval wait for %s/%s could not reach Temporal: %s", run_id, tool_call_id, exc)
            raise Unavailable(UNAVAILABLE) from exc

    async def broker(self, run_id: str, tool_call_id: str, digest: str, attempt: int) -> None:
        # The attempt number is in the update id: a duplicate re-attaches to the same execution.
        try:
            handle = await self.handle(run_id)
            await while_moving(
                lambda: handle.execute_update(
                    RunWorkflow.broker_call,
                    c.BrokerCall(tool_call_id=tool_call_id, input_digest=digest),
                    id=f"broker:{tool_call_id}:{digest}:{attempt}",
                ),
                lambda _: False,
            )
        except WorkflowUpdateFailedError as exc:
            log.warning("brokered call %s/%s did not complete: %s", run_id, tool_call_id, exc)
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                raise BadRequest("session is not active") from exc
            if exc.status == RPCStatusCode.RESOURCE_EXHAUSTED:
                raise TooBusy(BUSY) from exc
            raise Unavailable(UNAVAILABLE) from exc


class InMemoryRunWorkflows:
    """:class:`RunWorkflows` that records what it is told and runs nothing: the in-process API tier's seam.

    ``started`` holds each started spec; ``signals`` each message as ``(run_id, name, detail)``. An approval
    wait answers what ``verdicts`` holds for its tool call id (None: the run accepts no more work); a
    brokered call is recorded in ``brokered`` and leaves its claim row as it was."""

    def __init__(self) -> None:
        self.started: dict[str, RunSpec] = {}
        self.signals: list[tuple[str, str, Any]] = []
        self.verdicts: dict[str, c.ApprovalVerdict] = {}
        self.brokered: list[tuple[str, str, str, int]] = []

    async def start(self, spec: RunSpec, settings: Settings) -> None:
        if spec.run_id in self.started:
            raise WorkflowExists(spec.run_id)
        self.started[spec.run_id] = spec

    async def cancel(self, run_id: str) -> None:
        self.signals.append((run_id, "cancel", None))

    async def runner_finished(self, run_id: str) -> None:
        self.signals.append((run_id, "runner_finished", None))

    async def approval_decided(self, run_id: str, tool_call_id: str, status: str) -> None:
        self.signals.append((run_id, "approval_decided", (tool_call_id, status)))

    async def connection_ready(self, run_ids: list[str]) -> None:
        self.signals.extend((run_id, "connection_ready", None) for run_id in run_ids)

    async def await_approval(self, run_id: str, tool_call_id: str) -> c.ApprovalVerdict | None:
        return self.verdicts.get(tool_call_id)

    async def broker(self, run_id: str, tool_call_id: str, digest: str, attempt: int) -> None:
        if run_id not in self.started:
            raise BadRequest("session is not active")
        self.brokered.append((run_id, tool_call_id, digest, attempt))


class RunControl:
    """Start a run's workflow and talk to it; see the module docstring for the ordering rule."""

    def __init__(
        self, runs: Runs, approvals: Approvals, parks: Parks, workflows: RunWorkflows, settings: Settings
    ) -> None:
        self.runs = runs
        self.approvals = approvals
        self.parks = parks
        self.workflows = workflows
        self.settings = settings

    async def start(self, spec: RunSpec) -> None:
        """Start the run's workflow. Raises :class:`WorkflowExists` when it has one."""
        await self.workflows.start(spec, self.settings)

    # ---- write to PostgreSQL, then signal -------------------------------------------------------

    async def cancel(self, run_id: str, reason: str = "cancelled by user") -> bool:
        """Record the cancellation intent; True when this call created it (then the run is woken)."""
        created, _ = await self.runs.request_finalization(run_id, "cancelled", reason=reason, quiesce=True)
        if created:
            try:
                await self.workflows.cancel(run_id)
            except Exception:
                # The intent is durable; the liveness sweep sees it on its next check.
                log.warning("cancel signal for run %s not delivered", run_id, exc_info=True)
        return created

    async def record_result(
        self, run_id: str, outcome: str, *, summary: str | None, reason: str | None
    ) -> tuple[bool, str]:
        """Record the runner's outcome as the wind-down intent and wake the run when this call created it.
        Returns ``(created, status)`` as ``Runs.request_finalization`` does."""
        created, status = await self.runs.request_finalization(run_id, outcome, summary=summary, reason=reason)
        if created and not is_terminal(status):
            try:
                await self.workflows.runner_finished(run_id)
            except Exception:
                log.warning("result signal for run %s not delivered; the sweep will see the intent", run_id)
        return created, status

    async def decide_approval(
        self,
        tenant_id: str,
        approval_id: str,
        decision: str,
        decided_by: str,
        authorize: Callable[[ApprovalWithAuthority], None],
    ) -> ApprovalRecord:
        """The compare-and-swap in PostgreSQL (exactly one winner), then the signal to the run."""
        row = await self.approvals.decide_approval(tenant_id, approval_id, decision, decided_by, authorize)
        try:
            await self.workflows.approval_decided(str(row.session_id), row.tool_call_id, decision)
        except Exception:
            # Settled in PostgreSQL already; the workflow's slow re-read picks it up.
            log.warning("approval signal for run %s not delivered", row.session_id, exc_info=True)
        return row

    async def wake_parked(self, tenant_id: str, connection: ConnectionRow) -> int:
        """``connection`` may be usable now (signed in, a new credential, reactivated): signal every run
        waiting on it, found in PostgreSQL (``run_parks``). Each run checks the live row itself, so a signal
        that is early, doubled or lost costs latency only (a parked run re-checks on a slow timer)."""
        run_ids = await self.parks.waiting_on(tenant_id, connection)
        if not run_ids:
            return 0
        try:
            await self.workflows.connection_ready(run_ids)
        except Exception:
            log.warning("could not wake %d parked run(s)", len(run_ids), exc_info=True)
            return 0
        return len(run_ids)

    async def wake_for_budget(self, run_id: str) -> None:
        """Wake the run whose budget-exceeded intent is already recorded (the sweep would also find it)."""
        try:
            await self.workflows.cancel(run_id)
        except Exception:
            log.warning("budget-stop signal for run %s not delivered; the sweep will see the intent", run_id)

    async def wake_cancelled(self, run_ids: list[str]) -> None:
        """Wake runs whose cancellation intents are committed already; a lost signal is picked up by the
        liveness sweep on its next check."""
        for run_id in run_ids:
            with contextlib.suppress(Exception):
                await self.workflows.cancel(run_id)

    # ---- updates the runner plane waits on -----------------------------------------------------

    async def await_approval(self, run_id: str, tool_call_id: str) -> c.ApprovalVerdict | None:
        """Hold until a human decides (re-attaching on retry: the update id is the tool call's).
        None when the run no longer accepts work (see :meth:`RunWorkflows.await_approval`)."""
        return await self.workflows.await_approval(run_id, tool_call_id)

    async def broker(self, run_id: str, tool_call_id: str, digest: str, attempt: int) -> None:
        """Execute one brokered call attempt in the run's workflow (see :meth:`RunWorkflows.broker`)."""
        await self.workflows.broker(run_id, tool_call_id, digest, attempt)


__all__ = [
    "BUSY",
    "MOVE_PATIENCE_SECS",
    "InMemoryRunWorkflows",
    "RunControl",
    "RunWorkflows",
    "TemporalRunWorkflows",
    "WorkflowExists",
    "queues",
    "timing",
    "while_moving",
]
