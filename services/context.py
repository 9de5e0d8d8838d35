"""The composition root: one process's object graph, built once and shared by the API and the worker.

:func:`build_context` wires the settings, the pool, the redactor, the sealer, the outbound URL policies,
every repository (one per aggregate, each given only what it uses) and every service. It does no I/O: the
Temporal client is connected on first use through ``temporal``, and nothing is read from the database.
``api.app.create_app`` and ``worker.run_worker`` each build one; a test builds its own and hands it in, with
``workflows`` an :class:`~services.run_control.InMemoryRunWorkflows` when it runs no Temporal server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from temporalio.client import Client

from config.settings import Settings
from config.temporal import connect_client
from core.digests import sha256_hex
from core.pricing import PriceTable
from core.redaction import Redactor
from db._base import Pool
from db.agents import Agents
from db.approvals import Approvals
from db.capabilities import Capabilities
from db.catalog import Catalog
from db.connections import Connections
from db.deliveries import Deliveries
from db.gate import Gate
from db.identity import Identity
from db.ledger import Ledger
from db.managed_apps import ManagedAppRecords
from db.oauth import OAuthRecords
from db.parks import Challenges, Parks
from db.policies import Policies
from db.runs import Runs
from db.tokens import RunTokens
from db.triggers import Triggers
from db.usage import Metering, load_prices
from db.workspaces import WorkspaceArchives
from integrations.oauth import OAuthClient, client_metadata_document_url
from integrations.sealing import Sealer, sealer_from_settings
from integrations.urls import UrlPolicy
from services.brokered_calls import BrokeredCalls
from services.catalog import CatalogService
from services.connections import ConnectionService
from services.managed_apps import ManagedApps
from services.oauth_connect import OAuthConnect
from services.oauth_tokens import AccessTokens
from services.run_control import RunControl, RunWorkflows, TemporalRunWorkflows
from services.runs import RunFactory
from services.schedules import Schedules
from services.subscriptions import SubscriptionService
from services.triggers import TriggerService

TemporalSource = Callable[[], Awaitable[Client]]


def redactor_for(settings: Settings) -> Redactor:
    """The redactor every ledger write passes: it scrubs the admin token and every model key this process holds."""
    admin = settings.admin_token.get_secret_value() if settings.admin_token else ""
    return Redactor(tuple(s for s in (admin, *settings.llm_secrets()) if s))


def lazy_temporal(settings: Settings) -> TemporalSource:
    """A Temporal client connected on first use (once, however many callers race), then shared."""
    client: Client | None = None
    lock = asyncio.Lock()

    async def get() -> Client:
        nonlocal client
        if client is None:
            async with lock:
                if client is None:
                    client = await connect_client(settings)
        return client

    return get


@dataclass(frozen=True)
class AppContext:
    """Everything a request handler, an activity or a service is built from (see the module docstring)."""

    settings: Settings
    pool: Pool
    redactor: Redactor
    sealer: Sealer | None
    url_policy: UrlPolicy  # connectors: MCP servers, OpenAPI documents, OAuth servers, git remotes
    callback_policy: UrlPolicy  # result webhooks
    temporal: TemporalSource
    # repositories
    ledger: Ledger
    tokens: RunTokens
    policies: Policies
    agents: Agents
    runs: Runs
    gates: Gate
    approvals: Approvals
    connections: Connections
    capabilities: Capabilities
    catalog: Catalog
    identity: Identity
    trigger_records: Triggers
    deliveries: Deliveries
    parks: Parks
    challenges: Challenges
    oauth_records: OAuthRecords
    managed_app_records: ManagedAppRecords
    archives: WorkspaceArchives
    metering: Metering
    # services
    workflows: RunWorkflows
    run_control: RunControl
    run_factory: RunFactory
    schedules: Schedules
    subscriptions: SubscriptionService
    triggers: TriggerService
    oauth_client: OAuthClient
    access_tokens: AccessTokens | None  # OAuth connect and access tokens exist only with a sealer
    oauth: OAuthConnect | None
    connection_service: ConnectionService
    catalog_service: CatalogService
    managed_apps: ManagedApps | None
    brokered_calls: BrokeredCalls

    @property
    def public_base(self) -> str:
        """The browser-facing base URL of this deployment (no trailing slash)."""
        return public_base(self.settings)

    @property
    def admin_digest(self) -> str:
        """The operator token's SHA-256 (empty when no token is configured: nothing then matches it)."""
        token = self.settings.admin_token.get_secret_value() if self.settings.admin_token else ""
        return sha256_hex(token) if token else ""


def public_base(settings: Settings) -> str:
    return (settings.public_url or settings.api_url).rstrip("/")


def build_context(
    settings: Settings,
    pool: Pool,
    *,
    temporal: TemporalSource | None = None,
    workflows: RunWorkflows | None = None,
    sealer: Sealer | None = None,
    redactor: Redactor | None = None,
    prices: PriceTable | None = None,
) -> AppContext:
    """Wire one process's graph over ``pool`` (no I/O). Unset arguments come from ``settings``: the sealer from
    the credential keys, the redactor from the secrets this process holds, Temporal connected lazily."""
    temporal = temporal or lazy_temporal(settings)
    sealer = sealer if sealer is not None else sealer_from_settings(*settings.credential_keys())
    redactor = redactor or redactor_for(settings)
    url_policy = UrlPolicy(allow_loopback=settings.allow_loopback_connectors)
    callback_policy = UrlPolicy(allow_loopback=settings.allow_loopback_callbacks)
    base = public_base(settings)

    ledger = Ledger(pool, redactor)
    tokens = RunTokens(pool)
    runs = Runs(pool, ledger, tokens)
    connections = Connections(pool, ledger)
    parks = Parks(pool, ledger, runs, connections)
    agents = Agents(pool)
    policies = Policies(pool)
    approvals = Approvals(pool, ledger, runs)
    capabilities = Capabilities(pool)
    catalog = Catalog(pool)
    oauth_records = OAuthRecords(pool, connections)
    trigger_records = Triggers(pool, runs)
    challenges = Challenges(pool)
    managed_app_records = ManagedAppRecords(pool)

    workflows = workflows or TemporalRunWorkflows(temporal)
    run_control = RunControl(runs, approvals, parks, workflows, settings)
    run_factory = RunFactory(agents, policies, runs, parks, connections, capabilities, settings, run_control)
    schedules = Schedules(temporal, settings)
    gates = Gate(pool, redactor, ledger, runs)
    oauth_client = OAuthClient(url_policy)
    access_tokens = AccessTokens(oauth_records, sealer, oauth_client) if sealer is not None else None
    oauth, managed_apps = None, None
    if sealer is not None:
        metadata_url = client_metadata_document_url(base)

        def legs(callback: str) -> OAuthConnect:
            return OAuthConnect(
                oauth_records, connections, sealer, oauth_client, url_policy,
                redirect_uri=f"{base}{callback}", metadata_document_url=metadata_url,
            )  # fmt: skip

        oauth = legs("/v1/oauth/callback")
        # The managed app surface: the connector OAuth legs with the managed callback as their redirect URI.
        managed_apps = ManagedApps(
            managed_app_records, oauth_records, connections, sealer, catalog, legs("/v1/mcp-oauth/catalog/callback"),
            url_policy, app_ids=settings.managed_apps, redirect_urls=settings.managed_app_redirect_urls,
            access_tokens=access_tokens,
        )  # fmt: skip
    connection_service = ConnectionService(
        connections, parks, challenges, url_policy, sealer, oauth, access_tokens, base
    )
    return AppContext(
        settings=settings,
        pool=pool,
        redactor=redactor,
        sealer=sealer,
        url_policy=url_policy,
        callback_policy=callback_policy,
        temporal=temporal,
        ledger=ledger,
        tokens=tokens,
        policies=policies,
        agents=agents,
        runs=runs,
        gates=gates,
        approvals=approvals,
        connections=connections,
        capabilities=capabilities,
        catalog=catalog,
        identity=Identity(pool),
        trigger_records=trigger_records,
        deliveries=Deliveries(pool, ledger, runs, redactor),
        parks=parks,
        challenges=challenges,
        oauth_records=oauth_records,
        managed_app_records=managed_app_records,
        archives=WorkspaceArchives(pool),
        metering=Metering(
            pool,
            ledger,
            runs,
            prices or load_prices(),
            ceiling=settings.llm_max_concurrent_reservations,
            ttl_secs=settings.llm_reservation_ttl_secs,
        ),
        workflows=workflows,
        run_control=run_control,
        run_factory=run_factory,
        schedules=schedules,
        subscriptions=SubscriptionService(trigger_records, agents, connections, schedules, callback_policy, sealer),
        triggers=TriggerService(trigger_records, agents, runs, run_factory),
        oauth_client=oauth_client,
        access_tokens=access_tokens,
        oauth=oauth,
        connection_service=connection_service,
        catalog_service=CatalogService(
            catalog, capabilities, connections, connection_service, run_control, url_policy, oauth_client
        ),
        managed_apps=managed_apps,
        brokered_calls=BrokeredCalls(runs, gates, approvals, connections, connection_service, run_control),
    )


__all__ = ["AppContext", "TemporalSource", "build_context", "lazy_temporal", "public_base", "redactor_for"]
