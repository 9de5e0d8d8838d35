"""One Temporal Schedule per schedule-kind trigger subscription.

The schedule (id ``trigger:<subscription id>``, visible in the Temporal UI with a memo and a note
naming the subscription) starts ScheduleFireWorkflow at each fire time; that workflow fires the run
through TriggerService.fire with the key ``sched:<fire time>``.

Missed runs, built from two Temporal behaviours and one rule of ours:

* overlap policy SKIP: while a fire workflow is still open (the worker is down, so it cannot run),
  Temporal drops the later fire times of the gap; after a Temporal outage its catch-up likewise
  starts only the oldest missed time. So a gap reaches us as exactly ONE late fire, keyed at its
  oldest missed time.
* a disabled subscription's schedule is paused (it does not advance); the pause note records when.
  Re-enabling unpauses it and backfills the paused interval with overlap SKIP, which again starts
  only the oldest missed fire time of that interval.
* the fire workflow calls a fire "missed" when it first runs more than 30 s late; the activity then
  applies the subscription's ``missed_run_policy``: ``skip`` records one skip row, ``catch_up``
  fires one run marked ``catch_up: true``. Duplicates (a backfill overlapping a regular fire, a
  retried activity) share the fire key and collapse into a replay.
* a fire that had decided "on time" and stayed open through an outage makes SKIP drop the whole
  gap with no late fire; the next fire's activity finds the first fire time nothing accounts for
  (``TriggerService.unaccounted_fire``) and applies the same policy to it once (docs/decisions.md).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleBackfill,
    ScheduleDescription,
    ScheduleHandle,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleState,
    ScheduleUpdate,
    ScheduleUpdateInput,
)
from temporalio.service import RPCError, RPCStatusCode

from config.settings import Settings
from contracts import temporal as c
from core.errors import BadRequest, Unavailable
from core.schedule import DEFAULT_TIMEZONE, fire_time_text, temporal_crons
from db.models.triggers import TriggerSubscription
from workflows.schedule import ScheduleFireWorkflow

# Fires the Temporal server itself missed (it was down) are caught up within this window; older
# ones are dropped by Temporal. Either way at most one fire per gap reaches us (overlap SKIP).
CATCHUP_WINDOW = timedelta(days=365)
_DISABLED_AT = re.compile(r"disabled at (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?\+00:00)$")


def schedule_id(subscription_id: str) -> str:
    return f"trigger:{subscription_id}"


def fire_workflow_id(subscription_id: str) -> str:
    """The action's workflow id; Temporal appends ``-<fire time>`` to it for each fire."""
    return f"trigger-fire:{subscription_id}"


def disabled_note(at: datetime) -> str:
    return f"fluidbox: subscription disabled at {at.astimezone(UTC).isoformat()}"


def disabled_since(note: str | None) -> datetime | None:
    """When the schedule was paused by a disable, from its note (None: created disabled, or unknown)."""
    found = _DISABLED_AT.search(note or "")
    return datetime.fromisoformat(found.group(1)) if found else None


@dataclass
class Schedules:
    temporal: Callable[[], Awaitable[Client]]
    settings: Settings

    def build(self, sub: TriggerSubscription, state: ScheduleState) -> Schedule:
        """The Temporal Schedule of a subscription row (cron and timezone already validated)."""
        sub_id = str(sub.id)
        return Schedule(
            action=ScheduleActionStartWorkflow(
                ScheduleFireWorkflow.run,
                c.ScheduleFireInput(tenant_id=str(sub.tenant_id), subscription_id=sub_id),
                id=fire_workflow_id(sub_id),
                task_queue=self.settings.task_queue,
                # No execution timeout: a fire whose worker is down waits for it (overlap SKIP holds
                # back the fires behind it), so the gap is reported at its oldest missed time.
                static_summary=f"trigger '{sub.name}' fire",
            ),
            spec=ScheduleSpec(
                cron_expressions=temporal_crons(str(sub.schedule_cron)),
                time_zone_name=sub.schedule_timezone or DEFAULT_TIMEZONE,
            ),
            policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP, catchup_window=CATCHUP_WINDOW),
            state=state,
        )

    async def _client(self) -> Client:
        try:
            return await self.temporal()
        except Exception as exc:
            raise Unavailable("the workflow engine is unavailable; the schedule was not changed") from exc

    async def upsert(self, sub: TriggerSubscription) -> None:
        """Create or update the schedule of a schedule-kind subscription row; paused iff not enabled.

        Re-enabling a paused schedule unpauses it and backfills the paused interval, so the missed-run
        policy sees the oldest fire time it missed. Disabling again keeps the original pause time.
        """
        if sub.kind != "schedule":
            raise BadRequest("only schedule subscriptions have a schedule")
        client = await self._client()
        handle = client.get_schedule_handle(schedule_id(str(sub.id)))
        enabled = bool(sub.enabled)
        try:
            try:
                desc = await handle.describe()
            except RPCError as exc:
                if exc.status != RPCStatusCode.NOT_FOUND:
                    raise
                await self._create(client, sub)
                return
            await self._update(handle, desc, sub, enabled)
        except RPCError as exc:
            if exc.status == RPCStatusCode.INVALID_ARGUMENT:
                raise BadRequest(f"the schedule was refused by the workflow engine: {exc.message}") from exc
            raise Unavailable(f"the workflow engine refused the schedule change: {exc.message}") from exc

    async def _create(self, client: Client, sub: TriggerSubscription) -> None:
        # Created disabled: nothing was missed before its first enable (no time in the note).
        state = ScheduleState(paused=not sub.enabled, note="fluidbox: subscription created disabled")
        if sub.enabled:
            state = ScheduleState(note="fluidbox: subscription enabled")
        await client.create_schedule(
            schedule_id(str(sub.id)),
            self.build(sub, state),
            memo={
                "subscription_id": str(sub.id),
                "subscription_name": str(sub.name),
                "tenant_id": str(sub.tenant_id),
            },
        )

    async def _update(
        self, handle: ScheduleHandle, desc: ScheduleDescription, sub: TriggerSubscription, enabled: bool
    ) -> None:
        current = desc.schedule.state
        paused_since = disabled_since(current.note) if current.paused else None
        if paused_since is not None and desc.info.recent_actions:
            # A fire Temporal took just before the pause landed is not missed.
            last = max(a.scheduled_at for a in desc.info.recent_actions)
            paused_since = max(paused_since, last + timedelta(milliseconds=1))

        now = datetime.now(UTC)
        # A disable pauses in the same request that rewrites the schedule: an update followed by a separate
        # pause could be applied in the other order by the server, leaving the stale "enabled" state in place.
        # An enable keeps the pause here; the backfill and unpause below run once the new spec is in place.
        state = (
            ScheduleState(paused=True, note=disabled_note(now))
            if not enabled and not current.paused
            else ScheduleState(paused=current.paused, note=current.note)
        )

        def updater(_: ScheduleUpdateInput) -> ScheduleUpdate:
            return ScheduleUpdate(schedule=self.build(sub, state))

        await handle.update(updater)
        if enabled and current.paused:
            if paused_since is not None and paused_since < now:
                # Backfilled while still paused, so no regular fire can crowd it out: with overlap
                # SKIP only the oldest fire time of the interval starts; it is late, and the fire
                # activity applies the missed-run policy to it.
                await handle.backfill(
                    ScheduleBackfill(start_at=paused_since, end_at=now, overlap=ScheduleOverlapPolicy.SKIP)
                )
            await handle.unpause(note="fluidbox: subscription enabled")

    async def delete(self, subscription_id: str) -> None:
        """Delete the subscription's schedule (a missing one is fine)."""
        client = await self._client()
        try:
            await client.get_schedule_handle(schedule_id(subscription_id)).delete()
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise Unavailable(f"the workflow engine could not delete the schedule: {exc.message}") from exc

    async def _description(self, subscription_id: str) -> ScheduleDescription | None:
        client = await self._client()
        try:
            return await client.get_schedule_handle(schedule_id(subscription_id)).describe()
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return None
            raise Unavailable(f"the workflow engine could not describe the schedule: {exc.message}") from exc

    async def describe(self, subscription_id: str) -> dict[str, Any] | None:
        """What the schedule looks like in Temporal (None if it does not exist): for API responses."""
        desc = await self._description(subscription_id)
        if desc is None:
            return None
        return {
            "schedule_id": desc.id,
            "paused": desc.schedule.state.paused,
            "note": desc.schedule.state.note,
            "next_fire_times": [fire_time_text(t) for t in desc.info.next_action_times[:5]],
            "recent_fires": [
                {"fire_time": fire_time_text(a.scheduled_at), "started_at": a.started_at.isoformat()}
                for a in desc.info.recent_actions[-5:]
            ],
        }

    async def fire_times(self, subscription_id: str) -> FireTimes | None:
        """The schedule's next and last fire, as Temporal holds them (None if there is no schedule)."""
        desc = await self._description(subscription_id)
        if desc is None:
            return None
        return fire_times(desc)


@dataclass(frozen=True)
class FireTimes:
    """``next_fire_at``: the next time the schedule starts a fire (None while paused: a disabled
    subscription does not advance). ``last_fired_at``: the fire time of the latest fire Temporal
    started (regular, triggered or backfilled), None before the first."""

    next_fire_at: datetime | None
    last_fired_at: datetime | None


def fire_times(desc: ScheduleDescription) -> FireTimes:
    upcoming = desc.info.next_action_times
    recent = desc.info.recent_actions
    return FireTimes(
        next_fire_at=None if desc.schedule.state.paused or not upcoming else min(upcoming),
        last_fired_at=max((a.scheduled_at for a in recent), default=None),
    )
