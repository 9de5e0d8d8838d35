"""Trigger subscriptions: API invocation, schedules and event shapes, with shown-once secrets.

Management routes take the admin token; ``invoke`` and the run poll take the subscription's own
trigger token and nothing else. Every run goes through ``services.triggers.TriggerService.fire``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import secrets
import uuid
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import asyncpg
from fastapi import APIRouter, Body, Depends, Header
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from api.deps import Principal, PrincipalDep, Services, ServicesDep, TriggerDep
from api.routes.agents import workspace_doc
from api.routes.connections import sealer_of
from api.schemas import WorkspaceIn
from core.errors import BadRequest, Conflict, DomainError, Forbidden, NotFound, Unavailable
from core.policy import Budgets
from core.schedule import validate_schedule
from core.triggers import (
    callback_context,
    callback_secret,
    check_idempotency_key,
    check_name,
    check_policy,
    check_template,
    context_variables,
    event_filter,
    request_digest,
    subscription_kind,
    trigger_token,
)
from db.deliveries import Deliveries
from db.ids import new_id
from db.store import Row
from db.triggers import Triggers
from integrations.urls import UrlPolicy, UrlRefused
from services.schedules import FireTimes, Schedules
from services.triggers import FireOutcome, Overrides

log = logging.getLogger("fluidbox.api.triggers")
router = APIRouter(prefix="/v1/triggers", tags=["triggers"])

PATCHABLE = (
    "name",
    "task_template",
    "allow_task_override",
    "allow_workspace_override",
    "concurrency_policy",
    "callback_url",
    "schedule",
)
DISABLED = "trigger subscription is disabled"
IN_FLIGHT = "an invocation with this Idempotency-Key is being created — retry shortly"
EVENT_ONLY = "this automation runs from repository events and cannot be fired manually"


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


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
    callback_url: str | None = Field(default=None, max_length=2048)
    schedule: ScheduleChange | None = None


class InvokeIn(_Body):
    task: str | None = None
    context: dict[str, Any] | None = None
    workspace: dict[str, Any] | None = None


# ---- views -------------------------------------------------------------------------------------

SECRET_COLUMNS = ("callback_secret_sealed", "callback_key_id")


def _json(value: Any) -> Any:
    return value.isoformat() if isinstance(value, dt.datetime) else value


def public(row: Row) -> dict[str, Any]:
    """A subscription as the API shows it: never the sealed secret, only whether one exists."""
    out = {k: _json(v) for k, v in row.items() if k not in SECRET_COLUMNS}
    out["trigger_kind"] = row["kind"]
    out["has_callback_secret"] = row.get("callback_secret_sealed") is not None
    return out


def schedule_view(row: Row, times: FireTimes | None) -> dict[str, Any] | None:
    if row["kind"] != "schedule":
        return None
    return {
        "subscription_id": str(row["id"]),
        "cron": row["schedule_cron"],
        "timezone": row["schedule_timezone"],
        "missed_run_policy": row["missed_run_policy"],
        "next_fire_at": _json(times.next_fire_at) if times else None,
        "last_fired_at": _json(times.last_fired_at) if times else None,
    }


async def _times(svc: Services, row: Row) -> FireTimes | None:
    """The Temporal Schedule is the clock, so its fire times are read from it, not stored."""
    if row["kind"] != "schedule":
        return None
    try:
        return await Schedules(svc.temporal, svc.settings).fire_times(str(row["id"]))
    except DomainError:
        # Reading a subscription must not fail because the engine is down; the times are unknown.
        log.warning("could not read the Temporal Schedule of subscription %s", row["id"], exc_info=True)
        return None


async def schedule_of(svc: Services, row: Row) -> dict[str, Any] | None:
    return schedule_view(row, await _times(svc, row))


def base_url(svc: Services) -> str:
    return (svc.settings.public_url or svc.settings.api_url).rstrip("/")


def urls(svc: Services, subscription_id: str) -> dict[str, Any]:
    base = base_url(svc)
    return {
        "base_url": base,
        "invoke_url": f"{base}/v1/triggers/{subscription_id}/invoke",
        "poll_url_template": f"{base}/v1/triggers/{subscription_id}/runs/{{session_id}}",
        "ingress_url": None,
    }


async def _subscription(svc: Services, tenant_id: str, subscription_id: str) -> Row:
    row = await Triggers(svc.store).get(tenant_id, subscription_id)
    if row is None:
        raise NotFound()
    return row


# ---- helpers -----------------------------------------------------------------------------------


async def _admit_callback(svc: Services, url: str) -> str:
    try:
        admitted = await UrlPolicy(allow_loopback=svc.settings.allow_loopback_callbacks).admit(url)
    except UrlRefused as err:
        raise BadRequest(f"callback_url: {err}") from None
    return admitted.url


def _seal_new_secret(svc: Services, subscription_id: str) -> tuple[str, bytes, str]:
    sealer = sealer_of(svc)
    secret = callback_secret(secrets.token_hex(32))
    return secret, sealer.seal(secret, context=callback_context(subscription_id)), sealer.key_id


def _schedule_sync(svc: Services, row: Row) -> Callable[[Row], Awaitable[None]] | None:
    """Inside the subscription's transaction: make the Temporal Schedule match the row, so a
    Temporal failure stores nothing (503) instead of leaving the two disagreeing."""
    if row["kind"] != "schedule":
        return None

    async def sync(new_row: Row) -> None:
        try:
            await Schedules(svc.temporal, svc.settings).upsert(new_row)
        except DomainError:
            raise
        except Exception as exc:
            log.exception("could not sync the Temporal Schedule of subscription %s", new_row["id"])
            raise Unavailable("the workflow engine is unavailable; the schedule was not changed") from exc

    return sync


async def _check_capabilities(svc: Services, agent_id: str, keep: list[str] | None) -> None:
    if keep is None:
        return
    async with svc.store.pool.acquire() as conn:
        revision = await svc.store.latest_revision(conn, agent_id)
    pinned = {p["name"] for p in (revision.capability_bundles if revision else [])}
    extra = sorted(set(keep) - pinned)
    if extra:
        raise BadRequest(f"capabilities can only narrow: {', '.join(extra)} not attached to this agent's revision")


async def trigger_manager(who: PrincipalDep) -> Principal:
    """Managing subscriptions: the operator, or a member with the admin or owner role (spec §0.4)."""
    if not who.mutates_resources:
        raise Forbidden("managing trigger subscriptions requires the admin or owner role")
    return who


ManagerDep = Annotated[Principal, Depends(trigger_manager)]


async def _event_connection(svc: Services, tenant_id: str, connection_id: str) -> str:
    try:
        uuid.UUID(connection_id)
    except ValueError:
        raise BadRequest(f"unknown connection {connection_id}") from None
    row = await svc.connections.get(tenant_id, connection_id)
    if row is None or row.get("owner_type", "organization") != "organization":
        # A personal connection is its owner's alone (and invisible to everyone else).
        raise BadRequest(f"unknown connection {connection_id}")
    if row["status"] != "active":
        raise BadRequest(f"connection {connection_id} is {row['status']} — reconnect it first")
    return connection_id


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


@router.post("", summary="Create a trigger subscription (token and callback secret shown once)")
async def create_trigger(body: TriggerCreate, op: ManagerDep, svc: ServicesDep) -> dict[str, Any]:
    """Returns the ``fbx_trig_`` token and, with a callback_url, the ``fbx_whsec_`` secret — never again."""
    kind = subscription_kind(body.schedule is not None, body.connection is not None)
    if kind != "event" and (body.events is not None or body.repositories is not None or body.publish is not None):
        raise BadRequest("events, repositories and publish apply to event subscriptions (set `connection`)")
    check_name(body.name)
    check_policy(body.concurrency_policy)
    check_template(kind, body.task_template, body.allow_task_override)
    agent = await svc.store.find_agent(op.tenant_id, body.agent)
    if agent is None:
        raise BadRequest(f"unknown agent '{body.agent}'")
    agent_id = str(agent.id)
    await _check_capabilities(svc, agent_id, body.capabilities)
    sid = new_id()
    fields: dict[str, Any] = {
        "id": sid,
        "name": body.name,
        "agent_id": agent_id,
        "kind": kind,
        "task_template": body.task_template or None,
        "allow_task_override": body.allow_task_override,
        "allow_workspace_override": body.allow_workspace_override,
        "autonomous": body.autonomous,
        "budgets": body.budgets.model_dump() if body.budgets else None,
        "workspace": workspace_doc(body.workspace),
        "capabilities": body.capabilities,
        "concurrency_policy": body.concurrency_policy,
    }
    if body.schedule is not None:
        validate_schedule(
            body.schedule.cron, body.schedule.timezone, body.schedule.missed_run_policy, now=dt.datetime.now(dt.UTC)
        )
        fields.update(
            schedule_cron=body.schedule.cron,
            schedule_timezone=body.schedule.timezone or "UTC",
            missed_run_policy=body.schedule.missed_run_policy or "skip",
        )
    if body.connection is not None:
        fields["connection_id"] = await _event_connection(svc, op.tenant_id, body.connection)
        fields["event_filter"] = event_filter(body.events, body.repositories, body.publish)
    secret = None
    if body.callback_url:
        sealer_of(svc)  # 503 before anything else when custody is off
        fields["callback_url"] = await _admit_callback(svc, body.callback_url)
        secret, fields["callback_secret_sealed"], fields["callback_key_id"] = _seal_new_secret(svc, sid)
    token = trigger_token(secrets.token_hex(32))
    sync = _schedule_sync(svc, {"kind": kind})
    row = await Triggers(svc.store).create(op.tenant_id, fields, token, before_commit=sync)
    return {
        "subscription": public(row),
        "schedule": await schedule_of(svc, row),
        "token": token,
        "callback_secret": secret,
        "ingress_path": None,
        **urls(svc, sid),
    }


@router.get("", summary="List trigger subscriptions (never a secret)")
async def list_triggers(op: ManagerDep, svc: ServicesDep) -> dict[str, Any]:
    """Ordered by name; schedules listed alongside."""
    rows = await Triggers(svc.store).all(op.tenant_id)
    scheduled = [r for r in rows if r["kind"] == "schedule"]
    views = await asyncio.gather(*(schedule_of(svc, r) for r in scheduled))
    return {
        "subscriptions": [public(r) for r in rows],
        "schedules": [v for v in views if v is not None],
        "base_url": base_url(svc),
    }


@router.get("/{subscription_id}", summary="A subscription with its recent runs, deliveries and invocations")
async def get_trigger(subscription_id: str, op: ManagerDep, svc: ServicesDep) -> dict[str, Any]:
    """Sessions (20), deliveries (20), invocations incl. skip rows (30); never a secret."""
    row = await _subscription(svc, op.tenant_id, subscription_id)
    db = Triggers(svc.store)
    try:
        deliveries = await db.deliveries(str(row["id"]), 20)
    except (asyncpg.UndefinedTableError, asyncpg.UndefinedColumnError):
        log.warning("the deliveries table is not readable yet; listing none")
        deliveries = []
    return {
        "subscription": public(row),
        "schedule": await schedule_of(svc, row),
        "sessions": [{k: _json(v) for k, v in r.items()} for r in await db.runs(str(row["id"]), 20)],
        "deliveries": [{k: _json(v) for k, v in r.items()} for r in deliveries],
        "invocations": [{k: _json(v) for k, v in r.items()} for r in await db.invocations(str(row["id"]), 30)],
        **urls(svc, str(row["id"])),
    }


@router.patch("/{subscription_id}", summary="Edit a subscription (kind and agent are immutable)")
async def patch_trigger(
    subscription_id: str, op: ManagerDep, svc: ServicesDep, body: dict[str, Any] = Body(...)
) -> dict[str, Any]:
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
    row = await _subscription(svc, op.tenant_id, subscription_id)
    sid = str(row["id"])
    given = patch.model_fields_set
    changes: dict[str, Any] = {}
    for field in ("name", "task_template", "allow_task_override", "allow_workspace_override"):
        if field in given:
            value = getattr(patch, field)
            if value is None and field != "task_template":
                raise BadRequest(f"{field} cannot be null")
            changes[field] = value
    if "name" in changes:
        check_name(changes["name"])
    if "concurrency_policy" in given:
        changes["concurrency_policy"] = check_policy(patch.concurrency_policy or "")
    template = changes.get("task_template", row["task_template"]) or None
    if "task_template" in changes:
        changes["task_template"] = template
    check_template(row["kind"], template, bool(changes.get("allow_task_override", row["allow_task_override"])))
    if "schedule" in given:
        if row["kind"] != "schedule" or patch.schedule is None:
            raise BadRequest("schedule applies only to schedule subscriptions")
        cron = patch.schedule.cron or row["schedule_cron"]
        timezone = patch.schedule.timezone or row["schedule_timezone"]
        policy = patch.schedule.missed_run_policy or row["missed_run_policy"]
        validate_schedule(cron, timezone, policy, now=dt.datetime.now(dt.UTC))
        changes.update(schedule_cron=cron, schedule_timezone=timezone, missed_run_policy=policy)
    secret = None
    if "callback_url" in given:
        if not patch.callback_url:
            changes.update(callback_url=None, callback_secret_sealed=None, callback_key_id=None)
        else:
            sealer_of(svc)
            url = await _admit_callback(svc, patch.callback_url)
            if url != row["callback_url"]:
                changes["callback_url"] = url
                secret, changes["callback_secret_sealed"], changes["callback_key_id"] = _seal_new_secret(svc, sid)
    if not changes:
        return {"subscription": public(row), "schedule": await schedule_of(svc, row), "callback_secret": None}
    sync = _schedule_sync(svc, row) if "schedule" in given or "name" in changes else None
    new = await Triggers(svc.store).update(op.tenant_id, sid, changes, loaded_at=row["updated_at"], before_commit=sync)
    return {"subscription": public(new), "schedule": await schedule_of(svc, new), "callback_secret": secret}


async def _set_enabled(svc: Services, tenant_id: str, subscription_id: str, enabled: bool) -> dict[str, Any]:
    row = await _subscription(svc, tenant_id, subscription_id)
    if row["enabled"] == enabled:
        return {"subscription": public(row)}
    new = await Triggers(svc.store).update(
        tenant_id,
        str(row["id"]),
        {"enabled": enabled},
        loaded_at=row["updated_at"],
        before_commit=_schedule_sync(svc, row),
    )
    return {"subscription": public(new)}


@router.post("/{subscription_id}/enable", summary="Enable a subscription")
async def enable_trigger(subscription_id: str, op: ManagerDep, svc: ServicesDep) -> dict[str, Any]:
    """A schedule resumes (its missed-run policy decides about the gap)."""
    return await _set_enabled(svc, op.tenant_id, subscription_id, True)


@router.post("/{subscription_id}/disable", summary="Disable a subscription")
async def disable_trigger(subscription_id: str, op: ManagerDep, svc: ServicesDep) -> dict[str, Any]:
    """Invokes get 409; a schedule is paused and its clock does not advance."""
    return await _set_enabled(svc, op.tenant_id, subscription_id, False)


@router.post("/{subscription_id}/rotate_token", summary="Mint a new trigger token and revoke the old ones")
async def rotate_token(subscription_id: str, op: ManagerDep, svc: ServicesDep) -> dict[str, Any]:
    """The new token (shown once) still polls runs created before the rotation."""
    row = await _subscription(svc, op.tenant_id, subscription_id)
    token = trigger_token(secrets.token_hex(32))
    new, revoked = await Triggers(svc.store).rotate_token(op.tenant_id, str(row["id"]), token)
    return {"token": token, "revoked": revoked, "subscription": public(new), **urls(svc, str(row["id"]))}


@router.post("/{subscription_id}/run-now", summary="Fire an api or schedule subscription now")
async def run_now(subscription_id: str, op: ManagerDep, svc: ServicesDep) -> dict[str, Any]:
    """``{{fire_time}}`` renders as now; the concurrency policy applies."""
    row = await _subscription(svc, op.tenant_id, subscription_id)
    if row["kind"] == "event":
        raise BadRequest(EVENT_ONLY)
    outcome = await svc.triggers.fire(
        op.tenant_id,
        str(row["id"]),
        kind="manual",
        idempotency_key=f"run-now:{uuid.uuid4()}",
        variables={"fire_time": _now_iso()},
    )
    if outcome.run is None:
        raise _refusal(outcome)
    return {"session_id": str(outcome.run["id"]), "status": outcome.run["status"]}


# ---- the trigger-token plane -------------------------------------------------------------------


@router.post("/{subscription_id}/invoke", summary="Invoke a subscription (trigger token only)")
async def invoke(
    subscription_id: str,
    principal: TriggerDep,
    svc: ServicesDep,
    body: InvokeIn | None = None,
    idempotency_key: str | None = Header(default=None),
) -> dict[str, Any]:
    """Same ``Idempotency-Key`` → the same run with ``replay: true``; with another body → 422."""
    body = body or InvokeIn()
    key = check_idempotency_key(idempotency_key) if idempotency_key is not None else f"auto-{uuid.uuid4()}"
    variables = context_variables(body.context)
    row = await _subscription(svc, principal.tenant_id, principal.subscription_id)
    if row["kind"] == "event":
        raise BadRequest(EVENT_ONLY)
    if row["kind"] == "schedule":
        # The clock is the server's: a caller cannot make an invoke pass for another fire time.
        variables["fire_time"] = _now_iso()
    if body.task is not None and not row["allow_task_override"]:
        raise BadRequest("this subscription does not allow task override")
    if body.workspace is not None and not row["allow_workspace_override"]:
        raise BadRequest("this subscription does not allow workspace override")
    outcome = await svc.triggers.fire(
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
    sid = str(outcome.run["id"])
    return {
        "session_id": sid,
        "status": outcome.run["status"],
        "replay": outcome.outcome == "replay",
        "poll_url": f"/v1/triggers/{principal.subscription_id}/runs/{sid}",
    }


@router.get("/{subscription_id}/runs/{session_id}", summary="Poll a run this subscription created")
async def poll_run(subscription_id: str, session_id: str, principal: TriggerDep, svc: ServicesDep) -> dict[str, Any]:
    """The ``run.finished`` document with ``delivery_id`` and ``attempt`` null; 404 for any other run."""
    run = await Triggers(svc.store).run_of(principal.subscription_id, session_id)
    if run is None:
        raise NotFound()
    return await Deliveries(svc.store).result_body(str(run["id"]))
