"""The schedule fire activity: one scheduled fire → TriggerService.fire, or a visible missed skip.

Exactly-once comes from the key ``sched:<fire time>``: a retried activity, a second worker, or a
backfill that overlaps a regular fire all claim the same key and get the first outcome back. Before
a fire it asks the service for a gap nothing recorded (fires dropped while an earlier fire stayed
open through an outage) and applies the missed-run policy to its oldest fire time first.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

from temporalio import activity
from temporalio.exceptions import ApplicationError

from contracts import temporal as c
from core.errors import NotFound
from core.schedule import DEFAULT_MISSED_RUN_POLICY, fire_key, fire_time_text
from core.triggers import FireOutcome
from db.models.triggers import TriggerSubscription
from db.triggers import Triggers


def _out(outcome: FireOutcome, catch_up: bool) -> c.ScheduleFireOut:
    return c.ScheduleFireOut(
        outcome=outcome.outcome,
        session_id=outcome.session_id,
        reason=outcome.reason,
        catch_up=catch_up and outcome.outcome == "created",
    )


class Firing(Protocol):
    """The one firing path (``services.triggers.TriggerService``, injected by the worker)."""

    @property
    def db(self) -> Triggers: ...

    async def fire(
        self,
        tenant_id: str,
        subscription_id: str,
        *,
        kind: Literal["schedule"],
        idempotency_key: str,
        variables: dict[str, str],
        catch_up: bool = False,
    ) -> FireOutcome: ...

    async def record_skip(
        self, tenant_id: str, subscription_id: str, *, kind: Literal["schedule"], idempotency_key: str, reason: str
    ) -> FireOutcome: ...

    async def unaccounted_fire(
        self, sub: TriggerSubscription, fire_time: datetime, *, recorded_before: datetime, now: datetime
    ) -> datetime | None: ...


class ScheduleActivities:
    def __init__(self, triggers: Firing) -> None:
        self.triggers = triggers

    @activity.defn(name=c.FIRE_SCHEDULE)
    async def fire_schedule(self, inp: c.ScheduleFireIn) -> c.ScheduleFireOut:
        at = datetime.fromisoformat(inp.fire_time)
        sub = await self.triggers.db.get(inp.tenant_id, inp.subscription_id)
        if sub is None:
            return c.ScheduleFireOut(outcome="gone", reason="the subscription was deleted")
        # A fire that stayed open through an outage absorbed the fires behind it (overlap SKIP): the
        # first of them is missed with nothing recorded. Account for it before this fire.
        gap = await self.triggers.unaccounted_fire(
            sub, at, recorded_before=activity.info().scheduled_time, now=datetime.now(UTC)
        )
        if inp.late:
            # A late fire and a gap right before it are one outage: handled once, at its oldest time.
            return await self._missed(inp, sub, at if gap is None else gap)
        if gap is not None:
            missed = await self._missed(inp, sub, gap)
            if missed.outcome == "gone":
                return missed
        return await self._fire(inp, at, catch_up=False)

    async def _missed(self, inp: c.ScheduleFireIn, sub: TriggerSubscription, at: datetime) -> c.ScheduleFireOut:
        """Apply the subscription's missed-run policy to the fire time ``at``."""
        if (sub.missed_run_policy or DEFAULT_MISSED_RUN_POLICY) == "skip":
            skipped = await self.triggers.record_skip(
                inp.tenant_id, inp.subscription_id, kind="schedule", idempotency_key=fire_key(at), reason="missed"
            )
            return _out(skipped, False)
        return await self._fire(inp, at, catch_up=True)

    async def _fire(self, inp: c.ScheduleFireIn, at: datetime, *, catch_up: bool) -> c.ScheduleFireOut:
        key = fire_key(at)
        try:
            outcome = await self.triggers.fire(
                inp.tenant_id,
                inp.subscription_id,
                kind="schedule",
                idempotency_key=key,
                variables={"fire_time": fire_time_text(at)},
                catch_up=catch_up,
            )
        except NotFound:
            return c.ScheduleFireOut(outcome="gone", reason="the subscription was deleted")
        if outcome.outcome == "in_flight":
            # Another attempt holds the claim unbound; retry until it binds (or becomes stealable).
            raise ApplicationError(f"the fire {key} is being created by another attempt", type="FireInFlight")
        return _out(outcome, catch_up)

    def all(self) -> list[Callable[..., Any]]:
        return [self.fire_schedule]
