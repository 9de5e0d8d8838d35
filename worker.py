"""The Temporal worker: the composition root for workflows and activities.

Run: ``python worker.py [--queues runs,sandbox,broker]`` or ``fluidbox worker`` (``fluidbox up`` starts it).
Stops gracefully on SIGTERM / SIGINT.

A worker polls the task queues of the roles it is given (default ``FLUIDBOX_WORKER_QUEUES``, all three):

- ``runs`` (``FLUIDBOX_TASK_QUEUE``): every workflow, and every activity. The runs queue is the home of a run:
  its short steps run here as local activities, and runs started before the queues were split (or with no
  separate queues configured) schedule everything here, so a runs worker can always finish them.
- ``sandbox`` (``FLUIDBOX_SANDBOX_TASK_QUEUE``): provisioning, waiting for the sandbox to exit, finalization
  (diff, destroy) and the liveness sweep: the work that needs the sandbox provider.
- ``broker`` (``FLUIDBOX_BROKER_TASK_QUEUE``): brokered MCP calls, made with sealed credentials.

Roles that share a queue name share one Temporal ``Worker``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.worker import Worker

from activities.broker import BrokerActivities
from activities.delivery import DeliveryActivities
from activities.parks import ParkActivities
from activities.runs import RunActivities, precompile_code
from activities.schedules import ScheduleActivities
from config.settings import Settings, get_settings
from config.temporal import check_temporal_settings, connect_client
from contracts import temporal as c
from core.ports import ExecutionProvider
from db.engine import create_pool
from integrations.mcp_pool import SessionPool
from integrations.transports import TransportDeps, Transports
from sandbox.registry import make_provider
from services.context import AppContext, build_context
from workflows.delivery import DeliveryWorkflow
from workflows.liveness import LivenessSweepWorkflow
from workflows.run import WORKFLOWS
from workflows.schedule import ScheduleFireWorkflow

log = logging.getLogger("fluidbox.worker")


# Every workflow this worker hosts (tests/test_registration.py checks them against the contract).
WORKER_WORKFLOWS: list[type] = [*WORKFLOWS, DeliveryWorkflow, ScheduleFireWorkflow, LivenessSweepWorkflow]
# The activities a role's own task queue serves (the runs queue serves every activity, see the module docstring).
ROLE_ACTIVITIES: dict[str, frozenset[str]] = {
    c.SANDBOX_ROLE: frozenset({c.PROVISION, c.AWAIT_SANDBOX_EXIT, c.FINALIZE, c.SWEEP_LIVENESS}),
    c.BROKER_ROLE: frozenset({c.BROKER_CALL}),
}


def parse_roles(text: str) -> list[str]:
    """``runs,sandbox,broker`` (any non-empty subset, any order) → the roles, in the canonical order."""
    given = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [part for part in given if part not in c.ROLES]
    if unknown or not given:
        raise ValueError(
            f"unknown task queue role(s) {', '.join(map(repr, unknown))}" if unknown else "no task queue role given"
        )
    return [role for role in c.ROLES if role in given]


def worker_plan(
    settings: Settings, roles: list[str], activities: list[Callable[..., Any]]
) -> dict[str, tuple[bool, list[Callable[..., Any]]]]:
    """Task queue → (hosts the workflows, activities), for the roles this worker polls."""
    plan: dict[str, tuple[bool, list[Callable[..., Any]]]] = {}
    for role in roles:
        queue = settings.queue_for(role)
        names = None if role == c.RUNS_ROLE else ROLE_ACTIVITIES[role]
        chosen = [fn for fn in activities if names is None or activity_name(fn) in names]
        workflows, held = plan.get(queue, (False, []))
        have = {activity_name(fn) for fn in held}
        plan[queue] = (
            workflows or role == c.RUNS_ROLE,
            [*held, *(fn for fn in chosen if activity_name(fn) not in have)],
        )
    return plan


def activity_name(fn: Callable[..., Any]) -> str:
    return activity._Definition.must_from_callable(fn).name or ""


def run_activities(ctx: AppContext, provider: ExecutionProvider) -> RunActivities:
    """A run's steps (provision, finalize, the liveness sweep…) over ``provider``."""
    return RunActivities(
        runs=ctx.runs, ledger=ctx.ledger, tokens=ctx.tokens, approvals=ctx.approvals, connections=ctx.connections,
        archives=ctx.archives, deliveries=ctx.deliveries, provider=provider, settings=ctx.settings,
        sealer=ctx.sealer, url_policy=ctx.url_policy,
    )  # fmt: skip


def build_activities(
    ctx: AppContext, sessions: SessionPool, transports: Transports | None = None
) -> list[Callable[..., Any]]:
    """Every activity this worker hosts, with its dependencies injected from the context (no I/O happens here)."""
    settings = ctx.settings
    provider = make_provider(settings.sandbox)
    runs = run_activities(ctx, provider)
    broker = BrokerActivities(
        ctx.connections, ctx.parks, ctx.runs, ctx.sealer, ctx.url_policy, sessions, ctx.access_tokens, transports
    )
    delivery = DeliveryActivities(ctx.deliveries, ctx.sealer, ctx.callback_policy)
    schedules = ScheduleActivities(ctx.triggers)
    parks = ParkActivities(ctx.parks, ctx.runs, ctx.ledger, ctx.connections)
    return [*runs.all(), *broker.all(), *parks.all(), *delivery.all(), *schedules.all()]


async def run_worker(settings: Settings, stop: asyncio.Event, roles: list[str] | None = None) -> None:
    if not settings.database_url:
        raise SystemExit("FLUIDBOX_DATABASE_URL is not set (fluidbox up sets it for the embedded database)")
    roles = roles or parse_roles(settings.worker_queues)
    pool = await create_pool(settings.database_url, min_size=1, max_size=10)
    client = await connect_client(settings)

    async def temporal() -> Client:
        return client

    ctx = build_context(settings, pool, temporal=temporal)
    sessions = SessionPool()
    # Every transport's provider (stdio MCP processes live here, one per connection); closed at shutdown.
    transports = Transports(TransportDeps(ctx.url_policy, sessions))
    await asyncio.to_thread(precompile_code)
    plan = worker_plan(settings, roles, build_activities(ctx, sessions, transports))
    workers = [
        Worker(
            client,
            task_queue=queue,
            workflows=WORKER_WORKFLOWS if hosts_workflows else [],
            activities=activities,
            graceful_shutdown_timeout=timedelta(seconds=5),
            max_concurrent_activities=settings.worker_max_activities,
            max_concurrent_local_activities=settings.worker_max_local_activities,
            max_concurrent_workflow_tasks=settings.worker_max_workflow_tasks,
            max_cached_workflows=settings.worker_max_cached_workflows,
        )
        for queue, (hosts_workflows, activities) in plan.items()
    ]
    log.info("worker polling task queues %s (%s) on %s", ", ".join(plan), ",".join(roles), settings.temporal_target)
    async with contextlib.AsyncExitStack() as running:
        for worker in workers:
            await running.enter_async_context(worker)
        await start_liveness_sweep(client, settings)
        await stop.wait()
    await transports.aclose()
    await sessions.aclose()
    await pool.close()


async def start_liveness_sweep(client: Client, settings: Settings) -> None:
    """The one workflow that watches every live run; a sweep already running (another worker's) is kept."""
    await client.start_workflow(
        LivenessSweepWorkflow.run,
        c.SweepInput(queue=settings.queue_for(c.SANDBOX_ROLE)),
        id=c.LIVENESS_SWEEP_ID,
        task_queue=settings.task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        static_summary="watches every live run's runner and sandbox",
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="worker.py", description="The fluidbox Temporal worker.")
    parser.add_argument(
        "--queues", help="task queue roles to poll: runs,sandbox,broker (default: FLUIDBOX_WORKER_QUEUES)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("FLUIDBOX_LOG_LEVEL", "INFO"), format="%(asctime)s %(name)s %(message)s")
    settings = get_settings()
    try:
        roles = parse_roles(args.queues or settings.worker_queues)
        check_temporal_settings(settings)
    except ValueError as exc:  # TemporalSettingsError is one
        raise SystemExit(f"fluidbox worker: {exc}") from None

    async def _main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_worker(settings, stop, roles)

    asyncio.run(_main())
    # The Temporal core threads can abort at interpreter exit (sdk-python#300): leave at once.
    os._exit(0)


if __name__ == "__main__":
    main()
