"""The Temporal worker: the composition root for workflows and activities.

Run: ``python worker.py`` (``fluidbox up`` starts it). Stops gracefully on SIGTERM / SIGINT.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.worker import Worker

from activities.broker import BrokerActivities
from activities.delivery import DeliveryActivities
from activities.runs import RunActivities, precompile_code
from activities.schedules import ScheduleActivities
from config.settings import Settings, get_settings
from config.temporal import connect_client
from contracts import temporal as c
from core.redaction import Redactor
from db.capabilities import Capabilities
from db.connections import Connections
from db.deliveries import Deliveries
from db.engine import create_pool
from db.store import Store
from integrations.mcp_pool import SessionPool
from integrations.oauth import OAuthClient
from integrations.sealing import sealer_from_settings
from integrations.urls import UrlPolicy
from sandbox.manifests import PodPolicy
from sandbox.registry import make_provider
from services.oauth_tokens import AccessTokens
from services.triggers import TriggerService
from workflows.delivery import DeliveryWorkflow
from workflows.liveness import LivenessSweepWorkflow
from workflows.run import WORKFLOWS
from workflows.schedule import ScheduleFireWorkflow

log = logging.getLogger("fluidbox.worker")


def redactor_for(settings: Settings) -> Redactor:
    secrets = [settings.admin_token.get_secret_value()] if settings.admin_token else []
    return Redactor((*secrets, *settings.llm_secrets()))


# Every workflow this worker hosts (tests/test_registration.py checks them against the contract).
WORKER_WORKFLOWS: list[type] = [*WORKFLOWS, DeliveryWorkflow, ScheduleFireWorkflow, LivenessSweepWorkflow]


def pod_policy(settings: Settings) -> PodPolicy:
    """The Kubernetes provider's deployment-wide Pod settings (unused by bubblewrap)."""
    return PodPolicy(
        namespace=settings.kube_namespace,
        default_image=settings.runner_image,
        runtime_class=settings.kube_runtime_class,
        cpu_millis=settings.sandbox_cpu_millis,
        memory_mb=settings.sandbox_memory_mb or 2048,
        ephemeral_mb=settings.sandbox_ephemeral_mb,
        control_namespace=settings.kube_control_namespace,
        control_port=settings.kube_control_port,
        allow_dns=settings.kube_allow_dns,
    )


def build_activities(
    settings: Settings, store: Store, client: Client, sessions: SessionPool
) -> list[Callable[..., Any]]:
    """Every activity this worker hosts, with its dependencies injected (no I/O happens here)."""
    provider = make_provider(
        settings.sandbox_provider,
        bwrap_path=settings.bwrap_path,
        limits_mode=settings.sandbox_limits,
        memory_mb=settings.sandbox_memory_mb,
        pids=settings.sandbox_pids,
        syscall_filter=settings.sandbox_syscall_filter,
        sandbox_user=settings.sandbox_user,
        pod_policy=pod_policy(settings),
        kube_config=str(settings.kube_config) if settings.kube_config else None,
    )
    acts = RunActivities(store, provider, settings)
    broker_sealer = sealer_from_settings(*settings.credential_keys())
    connector_policy = UrlPolicy(allow_loopback=settings.allow_loopback_connectors)
    broker = BrokerActivities(
        Connections(store),
        broker_sealer,
        connector_policy,
        sessions,
        AccessTokens(store, broker_sealer, OAuthClient(connector_policy)) if broker_sealer is not None else None,
    )
    delivery = DeliveryActivities(
        Deliveries(store),
        sealer_from_settings(*settings.credential_keys()),
        UrlPolicy(allow_loopback=settings.allow_loopback_callbacks),
    )

    async def temporal() -> Client:
        return client

    schedules = ScheduleActivities(
        TriggerService(
            store,
            Connections(store),
            Capabilities(store),
            settings,
            temporal,
            sealer_from_settings(*settings.credential_keys()),
        )
    )
    return [*acts.all(), *broker.all(), *delivery.all(), *schedules.all()]


async def run_worker(settings: Settings, stop: asyncio.Event) -> None:
    if not settings.database_url:
        raise SystemExit("FLUIDBOX_DATABASE_URL is not set (fluidbox up sets it for the embedded database)")
    pool = await create_pool(settings.database_url, min_size=1, max_size=10)
    client = await connect_client(settings)
    store = Store(pool, redactor_for(settings))
    sessions = SessionPool()
    await asyncio.to_thread(precompile_code)
    worker = Worker(
        client,
        task_queue=settings.task_queue,
        workflows=WORKER_WORKFLOWS,
        activities=build_activities(settings, store, client, sessions),
        graceful_shutdown_timeout=timedelta(seconds=5),
        max_concurrent_activities=settings.worker_max_activities,
        max_concurrent_local_activities=settings.worker_max_local_activities,
        max_concurrent_workflow_tasks=settings.worker_max_workflow_tasks,
        max_cached_workflows=settings.worker_max_cached_workflows,
    )
    log.info("worker polling task queue %s on %s", settings.task_queue, settings.temporal_target)
    async with worker:
        await start_liveness_sweep(client, settings)
        await stop.wait()
    await sessions.aclose()
    await pool.close()


async def start_liveness_sweep(client: Client, settings: Settings) -> None:
    """The one workflow that watches every live run; a sweep already running (another worker's) is kept."""
    await client.start_workflow(
        LivenessSweepWorkflow.run,
        c.SweepInput(),
        id=c.LIVENESS_SWEEP_ID,
        task_queue=settings.task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        static_summary="watches every live run's runner and sandbox",
    )


def main() -> None:
    logging.basicConfig(level=os.environ.get("FLUIDBOX_LOG_LEVEL", "INFO"), format="%(asctime)s %(name)s %(message)s")
    settings = get_settings()

    async def _main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_worker(settings, stop)

    asyncio.run(_main())
    # The Temporal core threads can abort at interpreter exit (sdk-python#300): leave at once.
    os._exit(0)


if __name__ == "__main__":
    main()
