"""Every workflow and activity the Temporal contract names is registered exactly once in worker.py's worker.

A missing registration would otherwise show up only as a run that times out in an integration test.
"""

from __future__ import annotations

import sys
import uuid
from collections import Counter
from pathlib import Path

from temporalio import activity, workflow
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from config.settings import Settings
from contracts import temporal as c
from integrations.mcp_pool import SessionPool
from services.context import AppContext
from worker import WORKER_WORKFLOWS, activity_name, build_activities, parse_roles, worker_plan

TEST_SERVER = Path(sys.executable).parent / "temporal-test-server"


def test_every_workflow_the_contract_names_is_registered_exactly_once() -> None:
    names = Counter(workflow._Definition.must_from_class(cls).name for cls in WORKER_WORKFLOWS)
    assert names == Counter(c.ALL_WORKFLOWS)


async def test_every_activity_the_contract_names_is_registered_exactly_once(ctx: AppContext) -> None:
    async with await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=str(TEST_SERVER), data_converter=pydantic_data_converter
    ) as env:
        sessions = SessionPool()
        try:
            activities = build_activities(ctx, sessions)
            names = Counter(activity._Definition.must_from_callable(fn).name for fn in activities)
            assert names == Counter(c.ALL_ACTIVITIES)
            # Temporal accepts the set as one worker's registrations (it refuses duplicate names itself).
            async with Worker(
                env.client, task_queue=f"reg-{uuid.uuid4()}", workflows=WORKER_WORKFLOWS, activities=activities
            ):
                pass
        finally:
            await sessions.aclose()


async def test_a_worker_polls_the_queues_of_the_roles_it_is_given(ctx: AppContext) -> None:
    sessions = SessionPool()
    try:
        split = Settings(task_queue="q-runs", sandbox_task_queue="q-sandbox", broker_task_queue="q-broker")
        activities = build_activities(ctx, sessions)

        def names(plan: dict[str, tuple[bool, list[object]]]) -> dict[str, tuple[bool, set[str]]]:
            return {q: (wf, {activity_name(fn) for fn in fns}) for q, (wf, fns) in plan.items()}  # type: ignore[arg-type]

        every = set(c.ALL_ACTIVITIES)
        sandbox = {c.PROVISION, c.AWAIT_SANDBOX_EXIT, c.FINALIZE, c.SWEEP_LIVENESS}
        # The runs queue hosts the workflows and every activity (local activities, runs started before a split).
        assert names(worker_plan(split, ["runs", "sandbox", "broker"], activities)) == {
            "q-runs": (True, every),
            "q-sandbox": (False, sandbox),
            "q-broker": (False, {c.BROKER_CALL}),
        }
        assert names(worker_plan(split, ["broker"], activities)) == {"q-broker": (False, {c.BROKER_CALL})}
        # Unsplit (the default), all roles share one worker on the runs queue.
        assert names(worker_plan(Settings(task_queue="q"), parse_roles("broker, sandbox,runs"), activities)) == {
            "q": (True, every)
        }
        assert names(worker_plan(Settings(task_queue="q"), ["sandbox"], activities)) == {"q": (False, sandbox)}
    finally:
        await sessions.aclose()
