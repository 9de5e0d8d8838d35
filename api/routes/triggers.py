"""Trigger subscriptions: API invocation, schedules and event shapes, with shown-once secrets.

Management routes take the admin token; ``invoke`` and the run poll take the subscription's own
trigger token and nothing else. Every run goes through ``services.triggers.TriggerService.fire``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, Header
from pydantic import Field, ValidationError

from api import responses as out
from api.deps import ContextDep, Principal, PrincipalDep, TriggerDep
from api.errors import errors
from api.schemas import WorkspaceIn, _Body
from core.errors import BadRequest, Conflict, DomainError, Forbidden, NotFound
from core.policy import Budgets
from core.triggers import check_idempotency_key, context_variables, request_digest
from db.models.triggers import TriggerSubscription
from services.context import AppContext
from services.subscriptions import ScheduleDraft, SubscriptionDraft
from services.triggers import FireOutcome, Overrides

router = APIRouter(prefix="/v1/triggers", tags=["triggers"])

PATCHABLE = (
    "name",
    "task_template",
    "allow_task_override",
    "allow_workspace_override",
    "concurrency_policy",
    "when_unavailable",
    "callback_url",
    "schedule",
)
DISABLED = "trigger subscription is disabled"
IN_FLIGHT = "an invocation with this Idempotency-Key is being created — retry shortly"
EVENT_ONLY = "this automation runs from repository events and cannot be fired manually"


class ScheduleIn(_Body):
    cron: str = Field(min_length=1, max_length=200)
    timezone: str | None = "UTC"
    missed_run_policy: str | None = "skip"


class TriggerCreate(_Body):
    agent: str = Field(min_length=1, max_length=200)
    name: str = Field(min_length=1, max_length=200)
    task_template: str | None = None
    allow_task_override: bool = False
    allow_workspace_override: bool = False
    autonomous: bool = False
    budgets: Budgets | None = None
    workspace: WorkspaceIn | None = None
    callback_url: str | None = Field(default=None, max_length=2048)
    concurrency_policy: str = "allow"
    when_unavailable: Literal["park", "fail"] = "fail"
    schedule: ScheduleIn | None = None
    connection: str | None = None
    repositories: list[str] | None = Field(default=None, max_length=100)
    events: list[str] | None = Field(default=None, max_length=10)
    publish: list[str] | None = Field(default=None, max_length=10)
    capabilities: list[str] | None = Field(default=None, max_length=64)


class ScheduleChange(_Body):
    cron: str | None = Field(default=None, min_length=1, max_length=200)
    timezone: str | None = None
    missed_run_policy: str | None = None


class TriggerPatch(_Body):
    name: str | None = Field(default=None, min_length=1, max_length=200)
    task_template: str | None = None
    allow_task_override: bool | None = None
    allow_workspace_override: bool | None = None
    concurrency_policy: str | None = None
    when_unavailable: Literal["park", "fail"] | None = None
    callback_url: str | None = Field(default=None, max_length=2048)
    schedule: ScheduleChange | None = None


class InvokeIn(_Body):
    task: str | None = None
    context: dict[str, Any] | None = None
    workspace: dict[str, Any] | None = None


# ---- views -------------------------------------------------------------------------------------


async def schedule_of(ctx: AppContext, row: TriggerSubscription) -> out.ScheduleView | None:
    """A schedule's clock, read from its Temporal Schedule; other kinds have none."""
    if row.kind != "schedule":
        return None
    return out.ScheduleView.of(row, await ctx.subscriptions.fire_times(row))


def base_url(ctx: AppContext) -> str:
    return (ctx.settings.public_url or ctx.settings.api_url).rstrip("/")


async def _subscription(ctx: AppContext, tenant_id: str, subscription_id: str) -> TriggerSubscription:
    return await ctx.subscriptions.get(tenant_id, subscription_id)


# ---- helpers -----------------------------------------------------------------------------------


async def trigger_manager(who: PrincipalDep) -> Principal:
    """Managing subscriptions: the operator, or a member with the admin or owner role (spec §0.4)."""
    if not who.mutates_resources:
        raise Forbidden("managing trigger subscriptions requires the admin or owner role")
    return who


ManagerDep = Annotated[Principal, Depends(trigger_manager)]


def _now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _refusal(outcome: FireOutcome) -> DomainError:
    """The 409 for a fire that created no run (domain §11 wording)."""
    if outcome.outcome == "in_flight":
        return Conflict(IN_FLIGHT)
    reason = outcome.reason or "skipped"
    if outcome.earlier:
        return Conflict(f"this Idempotency-Key was skipped ({reason}) — use a new key to retry")
    if reason == "disabled":
        return Conflict(DISABLED)
    if reason == "overlap":
        return Conflict(
            f"skipped: run {outcome.active_run_id} from this subscription is still active "
            "(concurrency_policy=skip_if_running)"
        )
    return Conflict(f"skipped ({reason})")


# ---- management (admin) ------------------------------------------------------------------------


@router.post(
    "",
    summary="Create a trigger subscription (token and callback secret shown once)",
    response_model=out.TriggerCreated,
    responses=errors(401, 403, 409, 422, 503),
)
async def create_trigger(body: TriggerCreate, op: ManagerDep, ctx: ContextDep) -> out.TriggerCreated:
    """Returns the ``fbx_trig_`` token and, with a callback_url, the ``fbx_whsec_`` secret — never again."""
    draft = SubscriptionDraft(
        **body.model_dump(exclude={"budgets", "workspace", "schedule"}),
        budgets=body.budgets.model_dump() if body.budgets else None,
        workspace=body.workspace,
        schedule=ScheduleDraft(**body.schedule.model_dump()) if body.schedule is not None else None,
    )
    created = await ctx.subscriptions.create(op.tenant_id, draft, operator=op.is_operator)
    row = created.row
    return out.TriggerCreated.at(
        base_url(ctx),
        str(row.id),
        subscription=out.SubscriptionPublic.of(row),
        schedule=await schedule_of(ctx, row),
        token=created.token,
        callback_secret=created.callback_secret,
        ingress_path=None,
    )


@router.get(
    "",
    summary="List trigger subscriptions (never a secret)",
    response_model=out.TriggerList,
    responses=errors(401, 403),
)
async def list_triggers(op: ManagerDep, ctx: ContextDep) -> out.TriggerList:
    """Ordered by name; schedules listed alongside."""
    rows = await ctx.trigger_records.all(op.tenant_id)
    scheduled = [r for r in rows if r.kind == "schedule"]
    views = await asyncio.gather(*(schedule_of(ctx, r) for r in scheduled))
    return out.TriggerList(
        subscriptions=[out.SubscriptionPublic.of(r) for r in rows],
        schedules=[v for v in views if v is not None],
        base_url=base_url(ctx),
    )


@router.get(
    "/{subscription_id}",
    summary="A subscription with its recent runs, deliveries and invocations",
    response_model=out.TriggerDetail,
    responses=errors(401, 403, 404),
)
async def get_trigger(subscription_id: str, op: ManagerDep, ctx: ContextDep) -> out.TriggerDetail:
    """Sessions (20), deliveries (20), invocations incl. skip rows (30); never a secret."""
    row = await _subscription(ctx, op.tenant_id, subscription_id)
    db = ctx.trigger_records
    sid = str(row.id)
    return out.TriggerDetail.at(
        base_url(ctx),
        sid,
        subscription=out.SubscriptionPublic.of(row),
        schedule=await schedule_of(ctx, row),
        sessions=[out.TriggerRun.model_validate(r) for r in await db.runs(sid, 20)],
        deliveries=[out.TriggerDelivery.model_validate(d) for d in await db.deliveries(sid, 20)],
        invocations=[out.TriggerInvocation.model_validate(i) for i in await db.invocations(sid, 30)],
    )


@router.patch(
    "/{subscription_id}",
    summary="Edit a subscription (kind and agent are immutable)",
    response_model=out.TriggerPatched,
    responses=errors(401, 403, 404, 409, 422, 503),
)
async def patch_trigger(
    subscription_id: str, op: ManagerDep, ctx: ContextDep, body: dict[str, Any] = Body(...)
) -> out.TriggerPatched:
    """Unknown fields → 400 listing the mutable set; a concurrent edit → 409. A new callback_url
    mints a new secret, returned once; ``""`` clears the callback."""
    unknown = sorted(set(body) - set(PATCHABLE))
    if unknown:
        raise BadRequest(f"cannot change {', '.join(unknown)}: mutable fields are {', '.join(PATCHABLE)}")
    try:
        patch = TriggerPatch.model_validate(body)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "body"
        raise BadRequest(f"invalid request: {where}: {first.get('msg')}") from None
    given: dict[str, Any] = {field: getattr(patch, field) for field in patch.model_fields_set}
    if patch.schedule is not None:
        given["schedule"] = ScheduleDraft(**patch.schedule.model_dump())
    patched = await ctx.subscriptions.patch(op.tenant_id, subscription_id, given, operator=op.is_operator)
    new = patched.row
    return out.TriggerPatched(
        subscription=out.SubscriptionPublic.of(new),
        schedule=await schedule_of(ctx, new),
        callback_secret=patched.callback_secret,
    )


async def _set_enabled(ctx: AppContext, tenant_id: str, subscription_id: str, enabled: bool) -> out.SubscriptionOut:
    row = await ctx.subscriptions.set_enabled(tenant_id, subscription_id, enabled)
    return out.SubscriptionOut(subscription=out.SubscriptionPublic.of(row))


@router.post(
    "/{subscription_id}/enable",
    summary="Enable a subscription",
    response_model=out.SubscriptionOut,
    responses=errors(401, 403, 404, 409, 503),
)
async def enable_trigger(subscription_id: str, op: ManagerDep, ctx: ContextDep) -> out.SubscriptionOut:
    """A schedule resumes (its missed-run policy decides about the gap)."""
    return await _set_enabled(ctx, op.tenant_id, subscription_id, True)


@router.post(
    "/{subscription_id}/disable",
    summary="Disable a subscription",
    response_model=out.SubscriptionOut,
    responses=errors(401, 403, 404, 409, 503),
)
async def disable_trigger(subscription_id: str, op: ManagerDep, ctx: ContextDep) -> out.SubscriptionOut:
    """Invokes get 409; a schedule is paused and its clock does not advance."""
    return await _set_enabled(ctx, op.tenant_id, subscription_id, False)


@router.post(
    "/{subscription_id}/rotate_token",
    summary="Mint a new trigger token and revoke the old ones",
    response_model=out.TokenRotated,
    responses=errors(401, 403, 404),
)
async def rotate_token(subscription_id: str, op: ManagerDep, ctx: ContextDep) -> out.TokenRotated:
    """The new token (shown once) still polls runs created before the rotation."""
    new, token, revoked = await ctx.subscriptions.rotate_token(op.tenant_id, subscription_id)
    return out.TokenRotated.at(
        base_url(ctx), str(new.id), token=token, revoked=revoked, subscription=out.SubscriptionPublic.of(new)
    )


@router.post(
    "/{subscription_id}/run-now",
    summary="Fire an api or schedule subscription now",
    response_model=out.RunStarted,
    responses=errors(401, 403, 404, 409, 422, 503),
)
async def run_now(subscription_id: str, op: ManagerDep, ctx: ContextDep) -> out.RunStarted:
    """``{{fire_time}}`` renders as now; the concurrency policy applies."""
    row = await _subscription(ctx, op.tenant_id, subscription_id)
    if row.kind == "event":
        raise BadRequest(EVENT_ONLY)
    outcome = await ctx.triggers.fire(
        op.tenant_id,
        str(row.id),
        kind="manual",
        idempotency_key=f"run-now:{uuid.uuid4()}",
        variables={"fire_time": _now_iso()},
    )
    if outcome.run is None:
        raise _refusal(outcome)
    return out.RunStarted(session_id=str(outcome.run.id), status=outcome.run.status)


# ---- the trigger-token plane -------------------------------------------------------------------


@router.post(
    "/{subscription_id}/invoke",
    summary="Invoke a subscription (trigger token only)",
    response_model=out.Invoked,
    responses=errors(401, 403, 404, 409, 422, 503),
)
async def invoke(
    subscription_id: str,
    principal: TriggerDep,
    ctx: ContextDep,
    body: InvokeIn | None = None,
    idempotency_key: str | None = Header(default=None),
) -> out.Invoked:
    """Same ``Idempotency-Key`` → the same run with ``replay: true``; with another body → 422."""
    body = body or InvokeIn()
    key = check_idempotency_key(idempotency_key) if idempotency_key is not None else f"auto-{uuid.uuid4()}"
    variables = context_variables(body.context)
    row = await _subscription(ctx, principal.tenant_id, principal.subscription_id)
    if row.kind == "event":
        raise BadRequest(EVENT_ONLY)
    if row.kind == "schedule":
        # The clock is the server's: a caller cannot make an invoke pass for another fire time.
        variables["fire_time"] = _now_iso()
    if body.task is not None and not row.allow_task_override:
        raise BadRequest("this subscription does not allow task override")
    if body.workspace is not None and not row.allow_workspace_override:
        raise BadRequest("this subscription does not allow workspace override")
    outcome = await ctx.triggers.fire(
        principal.tenant_id,
        principal.subscription_id,
        kind="api",
        idempotency_key=key,
        variables=variables,
        body_digest=request_digest(body.task, body.context, body.workspace),
        overrides=Overrides(task=body.task, workspace=body.workspace),
    )
    if outcome.run is None:
        raise _refusal(outcome)
    sid = str(outcome.run.id)
    return out.Invoked(
        session_id=sid,
        status=outcome.run.status,
        replay=outcome.outcome == "replay",
        poll_url=f"/v1/triggers/{principal.subscription_id}/runs/{sid}",
    )


@router.get(
    "/{subscription_id}/runs/{session_id}",
    summary="Poll a run this subscription created",
    response_model=out.RunFinished,
    responses=errors(401, 404),
)
async def poll_run(subscription_id: str, session_id: str, principal: TriggerDep, ctx: ContextDep) -> out.RunFinished:
    """The ``run.finished`` document with ``delivery_id`` and ``attempt`` null; 404 for any other run."""
    run = await ctx.trigger_records.run_of(principal.subscription_id, session_id)
    if run is None:
        raise NotFound()
    # The document a webhook delivers (built once, in db.deliveries), typed as the poll's answer.
    return out.RunFinished.model_validate(await ctx.deliveries.result_body(str(run.id)))
