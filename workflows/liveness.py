"""LivenessSweepWorkflow: one workflow per namespace watches every live run's runner and sandbox.

A run's own workflow waits without polling (a run holds no worker slot and adds no history while it
waits); this one wakes every ``FLUIDBOX_LIVENESS_CHECK_SECS`` and runs one ``sweep_liveness``
activity over all live runs, which records a dead or silent runner's failure and signals that run.
So the cost of liveness is one timer and one activity per period, whatever the number of runs.

A sandbox found not running is looked at again about a second later before its run fails. The
workflow continues as new every ``SWEEPS_PER_HISTORY`` sweeps. Each worker starts it on boot with a
fixed id (an already running sweep is kept).
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from contracts import temporal as c
    from workflows.patches import ROLE_QUEUES

SWEEPS_PER_HISTORY = 200  # about 7 events a sweep: a fresh history every ~1,400 events
RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=20))


@workflow.defn(name=c.LIVENESS_SWEEP_WORKFLOW)
class LivenessSweepWorkflow:
    @workflow.run
    async def run(self, inp: c.SweepInput) -> None:
        suspects = inp.suspects
        for _ in range(SWEEPS_PER_HISTORY):
            out = await workflow.execute_activity(
                c.SWEEP_LIVENESS,
                c.SweepIn(suspects=suspects),
                result_type=c.SweepOut,
                task_queue=_queue(inp),
                start_to_close_timeout=timedelta(minutes=2),
                retry_policy=RETRY,
                summary="look at every live run's runner and sandbox",
            )
            assert isinstance(out, c.SweepOut)
            suspects = out.suspects
            wait = min(1.0, out.next_secs) if suspects else out.next_secs
            await workflow.sleep(timedelta(seconds=wait))
        workflow.continue_as_new(c.SweepInput(suspects=suspects, queue=inp.queue))


def _queue(inp: c.SweepInput) -> str | None:
    """The sandbox task queue when it is one of its own (the sweep asks each sandbox whether it runs)."""
    if not inp.queue or inp.queue == workflow.info().task_queue:
        return None
    workflow.deprecate_patch(ROLE_QUEUES)
    return inp.queue


WORKFLOWS = [LivenessSweepWorkflow]

__all__ = ["WORKFLOWS", "LivenessSweepWorkflow"]
