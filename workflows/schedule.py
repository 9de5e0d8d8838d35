"""ScheduleFireWorkflow: what a subscription's Temporal Schedule starts at each fire time.

It reads the scheduled (nominal) fire time Temporal gives every scheduled start, decides once
whether the fire is late ("missed": first run more than 30 s after it — the worker was down, the
schedule was paused, or this is a backfill), and hands both to one activity that fires through the
same path as an API invoke with the key ``sched:<fire time>``. The decision is an activity input,
so it is in the history and a retried activity never changes its mind.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey

with workflow.unsafe.imports_passed_through():
    from contracts import temporal as c
    from core.schedule import MISSED_AFTER

# Set by Temporal on every workflow a schedule starts (scheduled runs, trigger() and backfills).
SCHEDULED_START = SearchAttributeKey.for_datetime("TemporalScheduledStartTime")
# Infrastructure failures (database down) retry; the fire key makes every retry safe. A domain
# refusal is recorded as a skip by the activity and never retried.
FIRE_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30))


@workflow.defn(name=c.SCHEDULE_FIRE_WORKFLOW)
class ScheduleFireWorkflow:
    @workflow.run
    async def run(self, inp: c.ScheduleFireInput) -> c.ScheduleFireOut:
        info = workflow.info()
        scheduled = info.typed_search_attributes.get(SCHEDULED_START) or info.workflow_start_time
        late = workflow.now() - scheduled > MISSED_AFTER
        result = await workflow.execute_activity(
            c.FIRE_SCHEDULE,
            c.ScheduleFireIn(
                tenant_id=inp.tenant_id,
                subscription_id=inp.subscription_id,
                fire_time=scheduled.isoformat(),
                late=late,
            ),
            result_type=c.ScheduleFireOut,
            start_to_close_timeout=timedelta(seconds=60),
            schedule_to_close_timeout=timedelta(minutes=10),
            retry_policy=FIRE_RETRY,
            summary=f"fire at {scheduled.isoformat()}" + (" (missed)" if late else ""),
        )
        assert isinstance(result, c.ScheduleFireOut)
        return result


WORKFLOWS = [ScheduleFireWorkflow]
