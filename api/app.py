"""The FastAPI app factory: one composition root for the HTTP front door."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import yaml
from fastapi import FastAPI

from api import errors
from api.guard import RequestGuard
from api.hub import EventHub
from api.routes import admin as admin_routes
from api.routes import (
    agents,
    approvals,
    auth,
    capabilities,
    catalog,
    connections,
    deliveries,
    health,
    internal,
    llm,
    policies,
    sessions,
    triggers,
    usage,
    workspaces,
)
from api.routes import managed_apps as managed_app_routes
from api.routes import oauth as oauth_routes
from config.settings import Settings
from core.policy import parse_policy
from db.engine import create_pool
from integrations.catalog import check_entries
from services.context import AppContext, build_context

log = logging.getLogger("fluidbox.api")
POLICY_DIR = Path(__file__).resolve().parent.parent / "policies"
CATALOG_FILE = Path(__file__).resolve().parent.parent / "catalog" / "connectors.yaml"

TAGS = [
    {"name": "sessions", "description": "Runs: create, inspect, cancel, outputs, the ledger and its stream."},
    {"name": "approvals", "description": "Human decisions on tool calls a policy holds for approval."},
    {"name": "agents", "description": "Agents and their append-only revisions."},
    {"name": "policies", "description": "Policy documents (versioned; runs freeze a snapshot)."},
    {"name": "connections", "description": "Custodied credentials for MCP servers and their tool snapshots."},
    {"name": "catalog", "description": "Curated and custom MCP connectors, probing and one-call connect."},
    {"name": "capabilities", "description": "Versioned bundles of sandbox-class MCP servers agents can pin."},
    {"name": "triggers", "description": "Trigger subscriptions: API invocation, schedules and events."},
    {"name": "deliveries", "description": "Signed result webhooks sent when runs finish."},
    {"name": "internal", "description": "The runner plane, reached from inside sandboxes."},
    {"name": "health", "description": "Liveness and readiness."},
    {"name": "auth", "description": "The caller (operator or user) and its personal access tokens."},
    {"name": "admin", "description": "Operator surface: org members, deactivation and roles."},
    {"name": "managed-apps", "description": "An embedding product's app connections: list, connect, complete."},
]


async def seed_policies(ctx: AppContext, tenant_id: str) -> None:
    """Boot seed: every ``policies/*.yaml`` becomes v1 of its policy if absent."""
    for path in sorted(POLICY_DIR.glob("*.yaml")):
        text = path.read_text()
        doc = yaml.safe_load(text)
        parse_policy(doc)  # a seeded policy must pass the same strict parse as an authored one
        await ctx.policies.seed_policy(tenant_id, doc, text)


async def start_stranded_runs(ctx: AppContext) -> None:
    """Every API process: runs left 'created' without a workflow (their starter died) get one."""
    settings = ctx.settings
    while True:
        await asyncio.sleep(settings.stranded_check_secs)
        try:
            await ctx.run_factory.start_stranded(settings.stranded_after_secs)
        except Exception:
            log.warning("the stranded-run check failed; retrying", exc_info=True)


def create_app(settings: Settings, *, context: AppContext | None = None) -> FastAPI:
    """The API. Its lifespan opens a pool and builds the process's context over it, or uses ``context`` (a
    test's, built over a pool the test owns and closes); either way it boots the default organization, seeds
    policies and the catalog, and starts the ledger's LISTEN hub."""
    settings.require_admin_token()
    if not settings.database_url:
        raise RuntimeError("FLUIDBOX_DATABASE_URL is not set")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            ctx = context
            if ctx is None:
                pool = await create_pool(settings.database_url or "", max_size=40)
                stack.push_async_callback(pool.close)
                ctx = build_context(settings, pool)
            tenant_id = await ctx.identity.boot_tenant()
            await seed_policies(ctx, tenant_id)
            await ctx.catalog.seed(check_entries(yaml.safe_load(CATALOG_FILE.read_text())))
            hub = EventHub(settings.database_url or "")
            await hub.start()
            stack.push_async_callback(hub.stop)
            app.state.context, app.state.boot_tenant, app.state.hub = ctx, tenant_id, hub
            stack.push_async_callback(llm.close_facade, app)
            for task in (
                asyncio.create_task(llm.sweep_reservations(ctx.metering, settings.llm_sweep_secs)),
                asyncio.create_task(start_stranded_runs(ctx)),
            ):
                stack.callback(task.cancel)
            yield

    app = FastAPI(
        title="fluidbox",
        version="0.1.0",
        summary="The open control plane for AI agents, on Temporal.",
        openapi_tags=TAGS,
        lifespan=lifespan,
        generate_unique_id_function=lambda r: f"{r.tags[0]}-{r.name}" if r.tags else r.name,
    )
    errors.install(app)

    app.add_middleware(
        RequestGuard,
        limit=settings.max_request_body_bytes,
        llm_limit=settings.llm_max_request_body_bytes,
        facade=llm.serve,
        workspace_limit=settings.workspace_archive_max_mb * 1024 * 1024,
        large_bodies=settings.max_concurrent_large_bodies,
        large_body_wait_secs=settings.large_body_wait_secs,
    )

    routers = (health, agents, policies, connections, catalog, capabilities, sessions, approvals, triggers, deliveries)
    for module in (*routers, usage, internal, workspaces, llm):
        app.include_router(module.router)
    for module in (auth, admin_routes, oauth_routes, managed_app_routes):
        app.include_router(module.router)
    return app
