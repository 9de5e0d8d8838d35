"""The FastAPI app factory: one composition root for the HTTP front door."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import yaml
from fastapi import FastAPI

from api import errors
from api.deps import Services
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
from core.digests import sha256_hex
from core.policy import parse_policy
from core.redaction import Redactor
from db.capabilities import Capabilities
from db.catalog import Catalog
from db.connections import Connections
from db.engine import create_pool
from db.store import Store
from db.usage import Metering, load_prices
from integrations.catalog import check_entries
from integrations.oauth import OAuthClient, client_metadata_document_url
from integrations.sealing import Sealer, sealer_from_settings
from integrations.urls import UrlPolicy
from services.managed_apps import ManagedApps
from services.oauth_connect import OAuthConnect
from services.oauth_tokens import AccessTokens

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


async def seed_policies(store: Store, tenant_id: str) -> None:
    """Boot seed: every ``policies/*.yaml`` becomes v1 of its policy if absent."""
    for path in sorted(POLICY_DIR.glob("*.yaml")):
        text = path.read_text()
        doc = yaml.safe_load(text)
        parse_policy(doc)  # a seeded policy must pass the same strict parse as an authored one
        await store.policies.seed_policy(tenant_id, doc, text)


async def start_stranded_runs(svc: Services) -> None:
    """Every API process: runs left 'created' without a workflow (their starter died) get one."""
    settings = svc.settings
    while True:
        await asyncio.sleep(settings.stranded_check_secs)
        try:
            await svc.runs.start_stranded(settings.stranded_after_secs)
        except Exception:
            log.warning("the stranded-run check failed; retrying", exc_info=True)


def managed_apps(svc: Services, sealer: Sealer, client: OAuthClient, policy: UrlPolicy) -> ManagedApps:
    """The managed app surface: the connector OAuth legs with the managed callback as their redirect URI."""
    legs = OAuthConnect(
        svc.store,
        sealer,
        client,
        policy,
        redirect_uri=f"{svc.public_base}/v1/mcp-oauth/catalog/callback",
        metadata_document_url=client_metadata_document_url(svc.public_base),
    )
    return ManagedApps(
        svc.store,
        sealer,
        svc.catalog,
        legs,
        policy,
        app_ids=svc.settings.managed_apps,
        redirect_urls=svc.settings.managed_app_redirect_urls,
        access_tokens=svc.access_tokens,
    )


def create_app(settings: Settings) -> FastAPI:
    admin = settings.require_admin_token()
    if not settings.database_url:
        raise RuntimeError("FLUIDBOX_DATABASE_URL is not set")

    sealer = sealer_from_settings(*settings.credential_keys())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool = await create_pool(settings.database_url or "", max_size=40)
        store = Store(pool, Redactor((admin, *settings.llm_secrets())))
        tenant_id = await store.boot_tenant()
        await seed_policies(store, tenant_id)
        catalog = Catalog(store)
        await catalog.seed(check_entries(yaml.safe_load(CATALOG_FILE.read_text())))
        hub = EventHub(settings.database_url or "")
        await hub.start()
        ceiling, ttl = settings.llm_max_concurrent_reservations, settings.llm_reservation_ttl_secs
        metering = Metering(store, load_prices(), ceiling=ceiling, ttl_secs=ttl)
        connector_policy = UrlPolicy(allow_loopback=settings.allow_loopback_connectors)
        svc = Services(
            settings=settings,
            store=store,
            tenant_id=tenant_id,
            hub=hub,
            admin_digest=sha256_hex(admin),
            connections=Connections(store),
            capabilities=Capabilities(store),
            catalog=catalog,
            url_policy=connector_policy,
            sealer=sealer,
            metering=metering,
        )
        if sealer is not None:
            oauth_client = OAuthClient(connector_policy)
            svc.access_tokens = AccessTokens(store, sealer, oauth_client)
            svc.oauth = OAuthConnect(
                store,
                sealer,
                oauth_client,
                connector_policy,
                redirect_uri=f"{svc.public_base}/v1/oauth/callback",
                metadata_document_url=client_metadata_document_url(svc.public_base),
            )
            app.state.managed_apps = managed_apps(svc, sealer, oauth_client, connector_policy)
        app.state.services = svc
        sweeper = asyncio.create_task(llm.sweep_reservations(metering, settings.llm_sweep_secs))
        reviver = asyncio.create_task(start_stranded_runs(svc))
        try:
            yield
        finally:
            sweeper.cancel()
            reviver.cancel()
            await llm.close_facade(app)
            await hub.stop()
            await pool.close()

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
