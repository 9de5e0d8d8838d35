"""The Temporal contract: workflow and activity names, their input/output models, signal and update
payloads, search attributes and workflow ids.

The client side (``services``), the workflows and the activities all import this one module, so a name
or a payload shape is defined once. Import-light: pydantic and ``temporalio.common`` only, because the
workflow sandbox passes it through. Recorded histories (``tests/workflows/histories``) pin the names
and shapes: change them only with a workflow patch and new histories.
"""

from __future__ import annotations

from pydantic import BaseModel, Field
from temporalio.common import SearchAttributeKey

# Workflow type names (each class's @workflow.defn name): a caller that must not import the workflow
# module (an activity starting a delivery) starts it by name.
RUN_WORKFLOW = "RunWorkflow"
DELIVERY_WORKFLOW = "DeliveryWorkflow"
SCHEDULE_FIRE_WORKFLOW = "ScheduleFireWorkflow"
LIVENESS_SWEEP_WORKFLOW = "LivenessSweepWorkflow"
ALL_WORKFLOWS = (RUN_WORKFLOW, DELIVERY_WORKFLOW, SCHEDULE_FIRE_WORKFLOW, LIVENESS_SWEEP_WORKFLOW)

RUN_STATUS = SearchAttributeKey.for_keyword("RunStatus")
AGENT_NAME = SearchAttributeKey.for_keyword("AgentName")
SEARCH_ATTRIBUTES = {"RunStatus": "Keyword", "AgentName": "Keyword"}

CLAIM_SANDBOX = "claim_sandbox"  # a local activity: a place under FLUIDBOX_MAX_SANDBOXES, or "wait"
PROVISION = "provision_run"
# Runs started before liveness moved to workflow timers still run this long activity until they end.
SWEEP_LIVENESS = "sweep_liveness"  # one look at every live run (LivenessSweepWorkflow)
REQUEST_FINALIZATION = "request_finalization"
BEGIN_FINALIZE = "begin_finalize"
AWAIT_SANDBOX_EXIT = "await_sandbox_exit"
FINALIZE = "finalize_run"
OPEN_APPROVAL = "open_approval"
READ_APPROVAL = "read_approval"
EXPIRE_APPROVAL = "expire_approval"
RESUME_AFTER_APPROVAL = "resume_after_approval"
BROKER_CALL = "broker_call"
# Parked runs: a brokered call parked mid-run, a look at whether the wait is over, and its end (expiry or close).
PARK_CALL = "park_call"
TRY_UNPARK = "try_unpark"
END_PARK = "end_park"

RUN_ACTIVITIES = (
    CLAIM_SANDBOX,
    PROVISION,
    SWEEP_LIVENESS,
    REQUEST_FINALIZATION,
    BEGIN_FINALIZE,
    AWAIT_SANDBOX_EXIT,
    FINALIZE,
    OPEN_APPROVAL,
    READ_APPROVAL,
    EXPIRE_APPROVAL,
    RESUME_AFTER_APPROVAL,
    BROKER_CALL,
    PARK_CALL,
    TRY_UNPARK,
    END_PARK,
)


# RunWorkflow's signal "a connection a parked run waits for may be usable now" (sent by name; the run checks
# the database, so a signal that arrives early, twice or never changes only latency).
CONNECTION_READY_SIGNAL = "connection_ready"

# The workflow rejects new updates with this error type while it moves to a fresh history (continue-as-new);
# callers retry the same update, which then lands on the new run.
RUN_MOVING = "RunMoving"


def workflow_id(run_id: str) -> str:
    return f"run-{run_id}"


class Timing(BaseModel):
    liveness_check_secs: float = 5.0
    heartbeat_stale_secs: float = 60.0
    quiesce_secs: float = 30.0
    approval_recheck_secs: float = 30.0
    # A run waiting for sandbox capacity looks again after 1 s, doubling up to this.
    capacity_recheck_secs: float = 5.0
    # Continue-as-new after this many updates (approval waits, brokered calls); Temporal allows 2,000 per run.
    move_after_updates: int = 1500


# The task-queue roles a worker can poll (``fluidbox worker --queues runs,sandbox,broker``).
RUNS_ROLE = "runs"  # workflows, their database steps, deliveries and schedule fires
SANDBOX_ROLE = "sandbox"  # provisioning, sandbox exit, finalization (diff + destroy), the liveness sweep
BROKER_ROLE = "broker"  # brokered MCP calls (the control plane's outbound calls with sealed credentials)
ROLES = (RUNS_ROLE, SANDBOX_ROLE, BROKER_ROLE)
# workflow.patched id: sandbox and broker activities go to their own task queues when those are configured.
ROLE_QUEUES = "role-task-queues"


class Queues(BaseModel):
    """Where a run's sandbox and brokered-call activities go; None: the workflow's own task queue.

    Frozen into the workflow input when the run starts (workflow code reads no settings) and carried over
    when the run continues as new."""

    sandbox: str | None = None
    broker: str | None = None


class RunInput(BaseModel):
    run_id: str
    agent_name: str
    max_wall_clock_secs: int | None = None
    timing: Timing = Field(default_factory=Timing)
    # Set when the run continues as new: it is already provisioned; the wall clock keeps its deadline.
    resumed: bool = False
    deadline: str | None = None  # ISO 8601, UTC
    status: str | None = None
    decisions: dict[str, str] = Field(default_factory=dict)  # approval decisions signalled, not yet consumed
    # Parked before provisioning (a requirement could not be bound): wait for the connection first.
    parked: bool = False
    queues: Queues | None = None  # absent in runs started before task queues were split
    # False: no FLUIDBOX_MAX_SANDBOXES when the run started, so there is no place to take before provisioning.
    sandbox_limit: bool = True


class RunRef(BaseModel):
    run_id: str


class ClaimOut(BaseModel):
    claimed: bool
    live: int  # sandboxes counted live (0 when no maximum is configured)


class StatusOut(BaseModel):
    status: str


# The one workflow that watches every live run's runner and sandbox (started by each worker, one per namespace).
LIVENESS_SWEEP_ID = "fluidbox-liveness-sweep"
# RunWorkflow's signal for "the sweep recorded an intent" (sent by name from the sweep activity).
SWEEP_SIGNAL = "liveness_failed"


class SweepInput(BaseModel):
    suspects: list[str] = Field(default_factory=list)  # runs whose sandbox was not running at the last sweep
    queue: str | None = None  # the sandbox task queue the sweep activity runs on (None: the workflow's own)


class SweepIn(BaseModel):
    suspects: list[str] = Field(default_factory=list)


class SweepOut(BaseModel):
    suspects: list[str] = Field(default_factory=list)  # to look at again soon (a first "not running")
    failed: int = 0  # runs this sweep ended (dead or silent runner)
    woken: int = 0  # runs with an intent whose workflow was signalled again (a lost signal)
    next_secs: float = 5.0  # the worker's FLUIDBOX_LIVENESS_CHECK_SECS


class FinalizationIn(BaseModel):
    run_id: str
    outcome: str
    reason: str | None = None
    quiesce: bool = True
    budget: str | None = None  # set for budget.exceeded
    limit: str | None = None
    spent: str | None = None
    error: str | None = None  # set for run.error


class BeginFinalizeOut(BaseModel):
    status: str
    needs_quiesce: bool


class SandboxExitIn(BaseModel):
    run_id: str
    timeout_secs: float


class ApprovalIn(BaseModel):
    run_id: str
    tool_call_id: str


class ApprovalRow(BaseModel):
    approval_id: str
    status: str
    expires_at: str | None = None  # ISO 8601
    reason: str | None = None


# Workflow message payloads.
class ApprovalWait(BaseModel):
    tool_call_id: str


class ApprovalVerdict(BaseModel):
    decision: str  # allow | deny | moved (the run moved to a new history: wait again with the same update)
    message: str | None = None


class ApprovalDecided(BaseModel):
    tool_call_id: str
    status: str  # approved_once | approved_session | denied


class BrokerCall(BaseModel):
    """A brokered call to execute; its input lives in the claim row, never in workflow history."""

    tool_call_id: str
    input_digest: str


class BrokerIn(BaseModel):
    run_id: str
    tool_call_id: str
    input_digest: str


class BrokerOut(BaseModel):
    state: str  # the claim's state after this attempt; "parked": nothing was sent, the connection is not usable
    reason: str | None = None  # why the call parked


class ParkIn(BaseModel):
    """One wait of a run: ``tool_call_id`` '' for a run parked before provisioning."""

    run_id: str
    tool_call_id: str = ""
    input_digest: str = ""
    reason: str = ""


class ParkOut(BaseModel):
    state: str  # waiting | resumed | expired | ended
    expires_at: str  # ISO 8601, UTC
    status: str  # the run's status after the step
    reason: str | None = None


class EndParkIn(BaseModel):
    run_id: str
    tool_call_id: str = ""
    input_digest: str = ""
    outcome: str  # expired (the run ends with the reason) | ended (the run is closing anyway)


# Result deliveries (signed webhooks): one DeliveryWorkflow per (run, webhook destination).
DELIVER_WEBHOOK = "deliver_webhook"
CLOSE_DELIVERY = "close_delivery"


def delivery_workflow_id(run_id: str, index: int) -> str:
    return f"delivery:{run_id}:{index}"


class DeliveryInput(BaseModel):
    delivery_id: str  # the x-fluidbox-delivery dedup key, the same on every attempt
    run_id: str
    index: int  # position in the run's result_destinations


class DeliveryAttemptIn(BaseModel):
    delivery_id: str
    attempt: int  # 1-based
    retry_in_secs: int | None = None  # the wait before the next attempt if this one fails; None = last


class DeliveryAttemptOut(BaseModel):
    outcome: str  # delivered | retry | failed (permanent, e.g. URL refused) | skipped (authority gone)
    status_code: int | None = None
    error: str | None = None


class DeliveryClose(BaseModel):
    delivery_id: str
    status: str  # delivered | failed | skipped
    attempts: int
    error: str | None = None


# Schedules: a Temporal Schedule per schedule-kind subscription starts ScheduleFireWorkflow.
FIRE_SCHEDULE = "fire_schedule"


class ScheduleFireInput(BaseModel):
    """The schedule action's argument (fixed per subscription; the fire time comes from Temporal)."""

    tenant_id: str
    subscription_id: str


class ScheduleFireIn(BaseModel):
    tenant_id: str
    subscription_id: str
    fire_time: str  # ISO 8601 UTC, the scheduled (nominal) time
    late: bool  # the workflow first ran more than 30 s after fire_time (decided once, in history)


class ScheduleFireOut(BaseModel):
    outcome: str  # created | replay | skipped | gone
    session_id: str | None = None
    reason: str | None = None
    catch_up: bool = False


# Every activity name of the contract: worker.py registers each exactly once (tests/test_registration.py).
ALL_ACTIVITIES = (*RUN_ACTIVITIES, DELIVER_WEBHOOK, CLOSE_DELIVERY, FIRE_SCHEDULE)
