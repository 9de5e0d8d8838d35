"""RunWorkflow: one durable workflow per run.

provision → supervise (signals, approval updates, the wall-clock timer) → finalize. Every side effect
is an activity called by name; the workflow only decides what happens next.

A long run moves to a fresh history (continue-as-new) after ``Timing.move_after_updates`` answered
updates or when Temporal suggests it: Temporal allows 2,000 updates and 51,200 events per run. While it moves it
refuses new updates (``RunMoving``), answers its approval waits ``moved`` (the caller waits again with
the same update, on the new run), lets brokered calls finish, then continues as new with the wall-clock
deadline, the status and any unconsumed approval decisions. The new run skips provisioning.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TypeVar, cast

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from contracts import temporal as c
    from workflows.patches import (
        CAPACITY_IF_LIMITED,
        LIVENESS_BY_SWEEP,
        LOCAL_APPROVAL_STEPS,
        LOCAL_PROVISION,
        PARK_ON_BROKER_QUEUE,
        PARKED_RUNS,
        ROLE_QUEUES,
        SANDBOX_CAPACITY,
    )

M = TypeVar("M")
SHORT = timedelta(seconds=60)
RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=20))
PROVISION_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=3)
FINALIZE_HEARTBEAT = timedelta(seconds=60)
ALLOWED = frozenset({"approved_once", "approved_session", "auto_allowed"})


@workflow.defn(name=c.RUN_WORKFLOW)
class RunWorkflow:
    @workflow.init
    def __init__(self, inp: c.RunInput) -> None:
        # The input is known before any handler runs: a continued run's first task may carry an update.
        self._inp = inp
        self._wake = False
        self._closing = False
        self._decisions: dict[str, str] = dict(inp.decisions)
        self._status = inp.status or "created"
        self._brokering = 0  # brokered calls executing right now
        # Updates this run has answered for good (not "moved"). Counting answers rather than starts keeps a
        # run with more waits in flight than the threshold from moving again before anything was decided.
        self._updates = 0
        self._moving = False  # continuing as new: new updates are refused, approval waits answer "moved"
        # Parked runs: connection_ready signals seen, calls parked now, and the wall clock paused so far.
        self._ready = 0
        self._parked = 0
        self._parked_since: datetime | None = None
        self._paused = timedelta(0)
        self._clock_changed = False

    # ---- messages ------------------------------------------------------------------------------

    @workflow.signal
    def runner_finished(self) -> None:
        """The runner posted /result (the intent is already in PostgreSQL)."""
        self._wake = True

    @workflow.signal(name=c.SWEEP_SIGNAL)
    def liveness_failed(self) -> None:
        """The liveness sweep found the run's intent (it recorded one for a dead or silent runner)."""
        self._wake = True

    @workflow.signal
    def cancel(self) -> None:
        """A user asked to cancel (the intent is already in PostgreSQL)."""
        self._wake = True

    @workflow.signal(name=c.CONNECTION_READY_SIGNAL)
    def connection_ready(self) -> None:
        """A connection this run may be parked on became usable (the run re-checks the database)."""
        self._ready += 1

    @workflow.signal
    def approval_decided(self, decided: c.ApprovalDecided) -> None:
        self._decisions[decided.tool_call_id] = decided.status

    @workflow.update
    async def broker_call(self, call: c.BrokerCall) -> c.BrokerOut:
        """Execute one allowed brokered call in the control plane. Update id carries the attempt."""
        self._brokering += 1
        try:
            inp = c.BrokerIn(run_id=self._inp.run_id, tool_call_id=call.tool_call_id, input_digest=call.input_digest)
            queue = self._queue(c.BROKER_ROLE)
            if queue is not None:
                out = await self._broker_on_queue(queue, inp, f"brokered call {call.tool_call_id}")
                if out.state == "parked":
                    workflow.deprecate_patch(PARK_ON_BROKER_QUEUE)
                    out = await self._park_call(call, out, queue)
                return out
            out = await self._broker_here(inp, f"brokered call {call.tool_call_id}")
            if out.state == "parked":
                workflow.deprecate_patch(PARKED_RUNS)
                out = await self._park_call(call, out)
            return out
        finally:
            self._brokering -= 1
            self._updates += 1

    async def _broker_on_queue(self, queue: str, inp: c.BrokerIn, summary: str) -> c.BrokerOut:
        # The broker task queue of its own: brokered calls scale with outbound traffic, not with runs.
        result = await workflow.execute_activity(
            c.BROKER_CALL,
            inp,
            result_type=c.BrokerOut,
            task_queue=queue,
            # No broker worker polling: the call fails before it was sent, and the caller may retry it.
            schedule_to_start_timeout=timedelta(minutes=1),
            start_to_close_timeout=timedelta(minutes=2),
            retry_policy=RetryPolicy(maximum_attempts=1),
            summary=summary,
        )
        return cast(c.BrokerOut, result)

    @broker_call.validator
    def _validate_broker_call(self, call: c.BrokerCall) -> None:
        self._accepting()

    @workflow.query
    def status(self) -> str:
        return self._status

    @workflow.update
    async def await_approval(self, wait: c.ApprovalWait) -> c.ApprovalVerdict:
        """Hold one tool call until a human decides or its TTL passes. Update id = tool_call_id."""
        ref = c.ApprovalIn(run_id=self._inp.run_id, tool_call_id=wait.tool_call_id)
        row = await self._quick(c.OPEN_APPROVAL, ref, c.ApprovalRow)
        if row.status == "pending":
            self._set_status("awaiting_approval")
            decided = await self._wait_for_decision(ref, row)
            if decided is None:
                return c.ApprovalVerdict(decision="moved")
            row = decided
            resumed = await self._quick(c.RESUME_AFTER_APPROVAL, c.RunRef(run_id=self._inp.run_id), c.StatusOut)
            if not self._closing:
                self._set_status(resumed.status)  # still awaiting_approval while another call waits
        self._updates += 1
        if row.status in ALLOWED:
            return c.ApprovalVerdict(decision="allow")
        return c.ApprovalVerdict(decision="deny", message=row.reason or "denied by a human")

    @await_approval.validator
    def _validate_approval(self, wait: c.ApprovalWait) -> None:
        self._accepting()

    def _accepting(self) -> None:
        if self._closing:
            raise ApplicationError("session is not active", type="SessionNotActive")
        if self._moving:
            raise ApplicationError("the run is moving to a fresh workflow history; retry", type=c.RUN_MOVING)

    async def _wait_for_decision(self, ref: c.ApprovalIn, row: c.ApprovalRow) -> c.ApprovalRow | None:
        """The decided row, or None when the run is moving (the wait resumes on the new run)."""
        deadline = datetime.fromisoformat(row.expires_at) if row.expires_at else workflow.now()
        recheck = self._inp.timing.approval_recheck_secs
        while True:
            remaining = (deadline - workflow.now()).total_seconds()
            if remaining > 0:
                try:
                    await workflow.wait_condition(
                        lambda: ref.tool_call_id in self._decisions or self._closing or self._moving,
                        timeout=min(recheck, remaining),
                    )
                except TimeoutError:
                    pass
            if ref.tool_call_id in self._decisions:
                status = self._decisions[ref.tool_call_id]
                return c.ApprovalRow(approval_id=row.approval_id, status=status, reason=f"human decision: {status}")
            if self._closing:
                return c.ApprovalRow(approval_id=row.approval_id, status="denied", reason="session is not active")
            if self._moving:
                return None
            if (deadline - workflow.now()).total_seconds() <= 0:
                return await self._act(c.EXPIRE_APPROVAL, ref, c.ApprovalRow)
            # A slow re-read: a decision whose signal was lost still reaches the run.
            current = await self._quick(c.READ_APPROVAL, ref, c.ApprovalRow)
            if current.status != "pending":
                return current

    # ---- the run -------------------------------------------------------------------------------

    @workflow.run
    async def run(self, inp: c.RunInput) -> str:
        ref = c.RunRef(run_id=inp.run_id)
        if inp.resumed:
            # Continued as new: the sandbox runs, the ledger has everything; pick up where the last run was.
            await self._supervise()
            return await self._finalize()
        if inp.parked:
            workflow.deprecate_patch(PARKED_RUNS)
            if not await self._wait_for_connection():
                return await self._finalize()  # expired or cancelled while it waited; nothing was provisioned
        workflow.deprecate_patch(SANDBOX_CAPACITY)
        if self._limited() and not await self._wait_for_capacity():
            return await self._finalize()  # cancelled while it waited
        try:
            out = await self._provision(ref)
            self._set_status(out.status)
        except (ActivityError, ApplicationError) as err:
            # A local activity's failure reaches the workflow as the activity's own ApplicationError (not
            # wrapped in an ActivityError as a scheduled activity's is); both fail the run, never the workflow.
            await self._fail(f"provisioning failed: {_cause(err)}")
        else:
            await self._supervise()
        return await self._finalize()

    def _limited(self) -> bool:
        """Whether the run takes a sandbox place first: only under a sandbox maximum."""
        if self._inp.sandbox_limit:
            return True
        workflow.deprecate_patch(CAPACITY_IF_LIMITED)
        return False

    async def _provision(self, ref: c.RunRef) -> c.StatusOut:
        """Provision the sandbox: on the sandbox task queue when it has one, else in this worker.

        In this worker it is a local activity: the result comes back in the workflow task that asked for it,
        so a run's start costs Temporal one workflow task and one activity task (schedule, dispatch, start,
        complete) fewer. Provisioning is idempotent (a retry finds the sandbox by its pidfile) and does not
        heartbeat; a worker lost meanwhile reruns it, as it would rerun the activity."""
        if self._queue(c.SANDBOX_ROLE) is None:
            workflow.deprecate_patch(LOCAL_PROVISION)
            result = await workflow.execute_local_activity(
                c.PROVISION,
                ref,
                result_type=c.StatusOut,
                start_to_close_timeout=timedelta(minutes=5),
                retry_policy=PROVISION_RETRY,
                summary="provision",
            )
            return cast(c.StatusOut, result)
        return await self._act(
            c.PROVISION, ref, c.StatusOut, timeout=timedelta(minutes=5), retry=PROVISION_RETRY, sandbox=True
        )

    async def _wait_for_capacity(self) -> bool:
        """Take a sandbox place, waiting on timers (never in an activity) while none is free.

        False when the run was cancelled meanwhile. The wait starts at 1 s and doubles up to
        ``capacity_recheck_secs``; the run's status stays ``created`` with a reason saying it waits.
        """
        wait = 1.0
        while True:
            out = await workflow.execute_local_activity(
                c.CLAIM_SANDBOX,
                c.RunRef(run_id=self._inp.run_id),
                result_type=c.ClaimOut,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RETRY,
                summary="take a sandbox place",
            )
            if out.claimed:
                return True
            try:
                await workflow.wait_condition(lambda: self._wake, timeout=timedelta(seconds=wait))
            except TimeoutError:
                pass
            if self._wake:
                return False
            wait = min(wait * 2, self._inp.timing.capacity_recheck_secs)

    async def _supervise(self) -> None:
        workflow.deprecate_patch(LIVENESS_BY_SWEEP)
        await self._watch()

    async def _watch(self) -> None:
        """Wait for a wake-up (result, cancel, the liveness sweep), the wall clock or a move; no timer per check.

        Nothing here polls: the runner's /result and a cancel signal the workflow, and the one
        LivenessSweepWorkflow of the namespace records a dead or silent runner's failure and signals.
        A waiting run adds nothing to its history and holds no worker slot.
        """
        budget = self._inp.max_wall_clock_secs
        base = self._deadline(budget)
        while True:
            # The wall clock is paused while a brokered call is parked: the time waited is added back.
            deadline = base + self._paused if base else None
            parked = self._parked > 0
            remaining = (deadline - workflow.now()).total_seconds() if deadline and not parked else None
            if remaining is not None and remaining <= 0:
                await self._exceed_wall_clock(budget)
                return
            self._clock_changed = False
            try:
                await workflow.wait_condition(
                    lambda: self._wake or self._should_move() or self._clock_changed,
                    timeout=timedelta(seconds=remaining) if remaining is not None else None,
                )
            except TimeoutError:
                continue  # the top of the loop ends the run on its budget; it never moves on the way out
            if self._wake:
                return
            if self._clock_changed and not self._should_move():
                continue  # a call parked or resumed: the deadline moved
            await self._move(base)

    # ---- parked runs -----------------------------------------------------------------------------

    async def _wait_for_connection(self) -> bool:
        """Parked before provisioning: wait (signal + timer, never an activity) until every requirement binds.

        False when the park expired (the run ends failed with the reason) or the run was cancelled meanwhile.
        """
        self._set_status("waiting_for_connection")
        park = c.ParkIn(run_id=self._inp.run_id)
        out = await self._quick(c.TRY_UNPARK, park, c.ParkOut)
        ended = await self._wait_unparked(park, out)
        if ended is None:
            self._set_status("created")
            return True
        return False

    async def _park_call(self, call: c.BrokerCall, out: c.BrokerOut, queue: str | None = None) -> c.BrokerOut:
        """Park one brokered call: nothing was sent and its claim is still ``registered``. When the connection
        is usable again the same claim is executed (the claim CAS makes that at most once); on expiry or
        close the claim is refused. The run's wall clock is paused for as long as any call is parked."""
        park = c.ParkIn(
            run_id=self._inp.run_id,
            tool_call_id=call.tool_call_id,
            input_digest=call.input_digest,
            reason=out.reason or "",
        )
        parked = await self._quick(c.PARK_CALL, park, c.ParkOut)
        self._set_status(parked.status)
        self._pause_clock(+1)
        try:
            ended = await self._wait_unparked(park, parked)
        finally:
            self._pause_clock(-1)
        if ended is not None:
            return c.BrokerOut(state="refused", reason=ended)
        again = c.BrokerIn(run_id=self._inp.run_id, tool_call_id=call.tool_call_id, input_digest=call.input_digest)
        summary = f"brokered call {call.tool_call_id} (resumed)"
        if queue is not None:  # where it was brokered (only reached under PARK_ON_BROKER_QUEUE)
            resumed = await self._broker_on_queue(queue, again, summary)
        else:
            resumed = await self._broker_here(again, summary)
        if resumed.state == "parked":  # unusable again at once: park again (a new wait with a new TTL)
            return await self._park_call(call, resumed, queue)
        return resumed

    async def _broker_here(self, inp: c.BrokerIn, summary: str) -> c.BrokerOut:
        """One brokered call as a local activity: it runs in the worker that holds this workflow task, saving a
        task round trip on every call, and is still recorded (a marker) in the history."""
        result = await workflow.execute_local_activity(
            c.BROKER_CALL,
            inp,
            result_type=c.BrokerOut,
            start_to_close_timeout=timedelta(minutes=2),
            # Never retried by Temporal: after the claim is taken, a retry could send twice.
            retry_policy=RetryPolicy(maximum_attempts=1),
            summary=summary,
        )
        return cast(c.BrokerOut, result)

    async def _wait_unparked(self, park: c.ParkIn, out: c.ParkOut) -> str | None:
        """None once the wait is over (the run was moved back to work); else why it ended."""
        recheck = self._inp.timing.approval_recheck_secs
        while out.state == "waiting":
            expires = datetime.fromisoformat(out.expires_at)
            remaining = (expires - workflow.now()).total_seconds()
            seen = self._ready
            if remaining > 0:
                try:
                    await workflow.wait_condition(
                        lambda seen=seen: self._ready != seen or self._wake or self._closing,  # type: ignore[misc]
                        timeout=min(recheck, remaining),
                    )
                except TimeoutError:
                    pass
            if self._wake or self._closing or (expires - workflow.now()).total_seconds() <= 0:
                outcome = "ended" if (self._wake or self._closing) else "expired"
                end = c.EndParkIn(
                    run_id=park.run_id, tool_call_id=park.tool_call_id, input_digest=park.input_digest, outcome=outcome
                )
                done = await self._quick(c.END_PARK, end, c.ParkOut)
                if outcome == "expired" and park.tool_call_id:
                    self._wake = True  # the run ends: its intent is recorded
                return done.reason or "the wait for the connection ended"
            # A signal or the slow re-check (a lost signal still reaches the run): is it usable now?
            out = await self._quick(c.TRY_UNPARK, park, c.ParkOut)
        if out.state != "resumed":
            return out.reason or "the wait for the connection ended"
        if park.tool_call_id and not self._closing:
            self._set_status(out.status)
        return None

    def _pause_clock(self, step: int) -> None:
        self._parked += step
        if step > 0 and self._parked == 1:
            self._parked_since = workflow.now()
            self._clock_changed = True
        elif step < 0 and self._parked == 0 and self._parked_since is not None:
            self._paused += workflow.now() - self._parked_since
            self._parked_since = None
            self._clock_changed = True

    async def _exceed_wall_clock(self, budget: int | None) -> None:
        await self._act(
            c.REQUEST_FINALIZATION,
            c.FinalizationIn(
                run_id=self._inp.run_id,
                outcome="budget_exceeded",
                reason="max_wall_clock_secs budget exceeded",
                budget="max_wall_clock_secs",
                limit=str(budget),
                spent=str(budget),
            ),
            c.StatusOut,
        )

    def _deadline(self, budget: int | None) -> datetime | None:
        if self._inp.deadline:
            return datetime.fromisoformat(self._inp.deadline)
        return workflow.now() + timedelta(seconds=budget) if budget else None

    def _should_move(self) -> bool:
        return self._updates >= self._inp.timing.move_after_updates or workflow.info().is_continue_as_new_suggested()

    async def _move(self, deadline: datetime | None) -> None:
        """Continue as new: refuse new updates, release approval waits, let brokered calls finish."""
        self._moving = True
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(
            c.RunInput(
                run_id=self._inp.run_id,
                agent_name=self._inp.agent_name,
                max_wall_clock_secs=self._inp.max_wall_clock_secs,
                timing=self._inp.timing,
                resumed=True,
                deadline=(deadline + self._paused).isoformat() if deadline else None,
                status=self._status,
                decisions=self._decisions,
                queues=self._inp.queues,
            )
        )

    async def _fail(self, reason: str) -> None:
        await self._act(
            c.REQUEST_FINALIZATION,
            c.FinalizationIn(run_id=self._inp.run_id, outcome="failed", reason=reason, error=reason),
            c.StatusOut,
        )

    async def _finalize(self) -> str:
        ref = c.RunRef(run_id=self._inp.run_id)
        begun = await self._act(c.BEGIN_FINALIZE, ref, c.BeginFinalizeOut)
        self._set_status(begun.status)
        self._closing = True  # pending approval waits now answer deny; new brokered calls are refused
        # A brokered call already executing finishes and records its real outcome before teardown.
        await workflow.wait_condition(lambda: self._brokering == 0)
        if begun.needs_quiesce:
            await self._act(
                c.AWAIT_SANDBOX_EXIT,
                c.SandboxExitIn(run_id=self._inp.run_id, timeout_secs=self._inp.timing.quiesce_secs),
                c.StatusOut,
                timeout=timedelta(seconds=self._inp.timing.quiesce_secs + 60),
                heartbeat=timedelta(seconds=20),
                sandbox=True,
            )
        # It heartbeats: a worker lost mid-way is seen in a minute. A retry after attempts that never came back
        # from collecting the workspace ends the run without a diff (activities/runs.py), so this ends.
        done = await self._act(
            c.FINALIZE, ref, c.StatusOut, timeout=timedelta(minutes=5), heartbeat=FINALIZE_HEARTBEAT, sandbox=True
        )
        self._set_status(done.status)
        await workflow.wait_condition(workflow.all_handlers_finished)
        return str(done.status)

    # ---- helpers -------------------------------------------------------------------------------

    def _queue(self, role: str) -> str | None:
        """The task queue of a role's activities when it is one of its own, else None (this workflow's queue)."""
        queues = self._inp.queues
        name = (queues.sandbox if role == c.SANDBOX_ROLE else queues.broker) if queues is not None else None
        if not name or name == workflow.info().task_queue:
            return None
        workflow.deprecate_patch(ROLE_QUEUES)
        return name

    def _set_status(self, status: str) -> None:
        if status != self._status:
            self._status = status
            workflow.upsert_search_attributes([c.RUN_STATUS.value_set(status)])

    async def _quick(self, name: str, arg: object, result_type: type[M]) -> M:
        """A short idempotent step as a local activity: it runs in the worker that holds this workflow
        task, so an approval wake costs no task-queue round trip."""
        workflow.deprecate_patch(LOCAL_APPROVAL_STEPS)
        result = await workflow.execute_local_activity(
            name,
            arg,
            result_type=result_type,
            start_to_close_timeout=SHORT,
            retry_policy=RETRY,
            summary=name.replace("_", " "),
        )
        return cast(M, result)

    async def _act(
        self,
        name: str,
        arg: object,
        result_type: type[M],
        *,
        timeout: timedelta = SHORT,
        heartbeat: timedelta | None = None,
        retry: RetryPolicy = RETRY,
        sandbox: bool = False,
    ) -> M:
        result = await workflow.execute_activity(
            name,
            arg,
            result_type=result_type,
            task_queue=self._queue(c.SANDBOX_ROLE) if sandbox else None,
            start_to_close_timeout=timeout,
            heartbeat_timeout=heartbeat,
            retry_policy=retry,
            summary=name.replace("_", " "),
        )
        return cast(M, result)


def _cause(err: ActivityError | ApplicationError) -> str:
    cause = err if isinstance(err, ApplicationError) else err.cause
    return str(cause.message if isinstance(cause, ApplicationError) else cause or err)


WORKFLOWS = [RunWorkflow]

__all__ = ["WORKFLOWS", "RunWorkflow"]
