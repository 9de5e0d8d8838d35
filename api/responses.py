"""Response shapes of the public API, one section per resource (request bodies are in ``api.schemas``).

Every route declares one of these as its ``response_model``, so ``/openapi.json`` types every answer and
FastAPI validates each response against it. They are plain pydantic models over the rows the
repositories return: a field a row does not have is an error at the edge, never a silent ``null``.

Two rules keep the wire bytes what clients already parse:

- times are ``datetime.isoformat()`` (``…+00:00``, ``Timestamp``), except where the API has always
  answered pydantic's ``…Z`` (members and personal access tokens: ``ZTimestamp``);
- a field that an answer carries only sometimes has a default, and its route sets
  ``response_model_exclude_unset=True``, so absent stays absent and ``null`` stays ``null``.

Where a value is a document whose shape belongs to another module (a frozen RunSpec, a policy's
content, a ledger payload, a tool's JSON schema), it is typed as a JSON object, not re-declared here.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import asdict
from typing import Annotated, Any, Literal, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, WithJsonSchema, model_validator

from core.access import definition_diff
from core.digests import document_digest
from core.policy import Policy as CorePolicy
from core.policy_views import ExtraTools, autonomy_summary, overview
from core.redaction import scrub_text
from db import policies as stored
from db.approvals import ApprovalRecord
from db.connections import MAX_ATTEMPTS, ConnectionRow
from db.models.agents import AgentRevision
from db.models.capabilities import CapabilityBundle
from db.models.catalog import ConnectorCatalogEntry
from db.models.connections import ConnectionToolChange, ConnectionToolSnapshot, ToolExecutionClaim
from db.models.triggers import TriggerSubscription
from db.runs import UsageTotals
from db.usage import CostLine
from services.catalog import EntryConnected, Listed, ProbeFindings
from services.connections import ToolReview
from services.managed_apps import ManagedApp as App
from services.managed_apps import Outcome
from services.schedules import FireTimes

Timestamp = Annotated[
    dt.datetime,
    PlainSerializer(lambda v: v.isoformat(), return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "format": "date-time"}),
]
ZTimestamp = dt.datetime
Json = dict[str, Any]


class _Out(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _ids_as_text(cls, data: Any) -> Any:
        """Typed rows (table models) carry ``uuid.UUID`` ids; every id in an answer is their text."""
        if isinstance(data, BaseModel) and not isinstance(data, _Out):
            data = data.model_dump()
        if isinstance(data, dict):
            return {k: str(v) if isinstance(v, uuid.UUID) else v for k, v in data.items()}
        return data


# ---- health --------------------------------------------------------------------------------------


class Health(_Out):
    status: str


class Readiness(_Out):
    status: str = Field(description="ready | not ready")
    db: bool
    temporal: bool
    provider: str


class HarnessModel(_Out):
    id: str
    display_name: str
    hint: str


class Harness(_Out):
    id: str
    display_name: str
    hint: str
    default_model: str
    models: list[HarnessModel]
    available: bool


class NetworkSupport(_Out):
    enforcer: str
    supports_egress_grants: bool


class Harnesses(_Out):
    harnesses: list[Harness]
    network: NetworkSupport


# ---- sessions (runs) -----------------------------------------------------------------------------


class SessionPublic(_Out):
    id: str
    tenant_id: str
    agent_id: str
    agent_revision_id: str
    status: str
    status_reason: str | None
    autonomy: str
    trust_tier: str
    task: str
    repo_source: Json | None
    run_spec: Json = Field(description="The frozen RunSpec.")
    trigger: Json | None = Field(description="The InvocationContext.")
    sandbox_handle: Json | None
    budgets: Json | None
    base_commit: str | None
    result_summary: str | None
    event_seq: int
    last_heartbeat_at: Timestamp | None
    started_at: Timestamp | None
    finished_at: Timestamp | None
    invoked_by_kind: str
    invoked_by_user_id: str | None
    pending_action: Json | None = Field(
        default=None,
        description="While `waiting_for_connection`: {type: mcp_connect, slot, connection_id, url, reason, "
        "authorization_url, how, tool_call_id, expires_at}.",
    )
    created_at: Timestamp
    updated_at: Timestamp


class SessionOut(_Out):
    session: SessionPublic


class SessionList(_Out):
    sessions: list[SessionPublic]


class SessionDetail(_Out):
    session: SessionPublic
    usage: UsageTotals


class Cancelled(_Out):
    cancelled: bool = Field(description="false when the run was already terminal or already winding down")


class ArtifactPublic(_Out):
    id: str
    session_id: str
    kind: str
    name: str
    content: str
    content_type: str
    created_at: Timestamp


class ArtifactList(_Out):
    artifacts: list[ArtifactPublic]


class Outputs(_Out):
    status: str
    diff: str | None
    summary: str | None
    gate_consulted: bool
    artifacts: list[ArtifactPublic]


class EventPublic(_Out):
    event_id: str
    session_id: str
    seq: int
    actor: str
    type: str
    payload: Json = Field(description='Always {"type": "<dot.name>", "data": {...}}.')
    occurred_at: Timestamp


class EventList(_Out):
    events: list[EventPublic]


class Reservations(_Out):
    active: int
    tokens: int
    cost_usd: float | None


class CostReport(_Out):
    usage: UsageTotals
    tool_calls: int
    breakdown: list[CostLine]
    reservations: Reservations


class DeliveryPublic(_Out):
    id: str
    session_id: str
    subscription_id: str | None
    destination: Json
    status: str
    attempts: int
    last_status_code: int | None
    last_error: str | None
    payload_digest: str | None
    next_attempt_at: Timestamp | None
    last_attempt_at: Timestamp | None
    delivered_at: Timestamp | None
    created_at: Timestamp
    updated_at: Timestamp


class DeliveryList(_Out):
    deliveries: list[DeliveryPublic]


# ---- approvals -----------------------------------------------------------------------------------


class ApprovalPublic(_Out):
    id: str
    session_id: str
    tool_call_id: str
    tool: str
    summary: str | None
    input_digest: str
    risk: str | None
    scope: str | None
    scope_key: str | None
    status: str
    requested_at: Timestamp
    expires_at: Timestamp | None
    decided_at: Timestamp | None
    decided_by: str | None

    @classmethod
    def of(cls, row: ApprovalRecord, **extra: Any) -> Self:
        """An approval as the API shows it. The stored scope key stays exact (redacting it would make two
        different secrets compare equal and widen a session approval); the answer is scrubbed."""
        data = row.model_dump()
        for key in ("summary", "scope_key"):
            if isinstance(data[key], str):
                data[key] = scrub_text(data[key])
        return cls.model_validate(data | extra)


class ApprovalList(_Out):
    approvals: list[ApprovalPublic]


class InboxApproval(ApprovalPublic):
    authority: str = Field(description="personal | organization | unclassifiable")
    can_decide: bool

    @classmethod
    def shown(cls, row: ApprovalRecord, authority: str, can_decide: bool) -> Self:
        """A pending approval in the caller's inbox, with whose authority it executes under."""
        return cls.of(row, authority=authority, can_decide=can_decide)


class Inbox(_Out):
    approvals: list[InboxApproval]


class ApprovalOut(_Out):
    approval: ApprovalPublic


# ---- agents --------------------------------------------------------------------------------------


class AgentPublic(_Out):
    id: str
    tenant_id: str
    name: str
    description: str | None
    created_at: Timestamp


class RevisionPublic(_Out):
    id: str
    agent_id: str
    rev: int
    harness: str
    runner_image: str | None
    model: str
    system_prompt: str | None
    policy_id: str
    policy: str | None = Field(description="The policy's name.")
    budgets: Json | None
    harness_config: Json
    capability_bundles: list[Json]
    default_workspace: Json | None
    connection_requirements: list[Json]
    network: Json | None
    tool_discovery: Literal["eager", "deferred", "auto"] = Field(
        description="How runs see brokered tools (frozen per run as eager or deferred)."
    )
    created_at: Timestamp

    @classmethod
    def of(cls, row: AgentRevision, policy_names: dict[str, str]) -> RevisionPublic:
        """A revision with its policy's name (``policy_names``: the tenant's, by policy id)."""
        return cls.model_validate({**row.model_dump(), "policy": policy_names.get(str(row.policy_id))})


class AgentCreated(_Out):
    agent: AgentPublic
    revision: RevisionPublic


class AgentList(_Out):
    agents: list[AgentPublic]


class AgentDetail(_Out):
    agent: AgentPublic
    revisions: list[RevisionPublic]


class RevisionOut(_Out):
    revision: RevisionPublic


# ---- policies ------------------------------------------------------------------------------------


class PolicyMeta(_Out):
    id: str
    name: str
    version: int
    updated_at: Timestamp | None = Field(default=None, description="Absent when unknown.")

    @classmethod
    def of(cls, row: stored.PolicyMeta, **more: Any) -> Self:
        """``updated_at`` is left unset, so absent on the wire, when the row does not know it (just created)."""
        if row.updated_at is not None:
            more["updated_at"] = row.updated_at
        return cls(id=str(row.id), name=row.name, version=row.version, **more)


class PolicyOut(_Out):
    policy: PolicyMeta


class PolicyImported(_Out):
    policy: PolicyMeta
    appended: bool


class PolicySummary(PolicyMeta):
    autonomy_summary: Json
    agents_using: int

    @classmethod
    def listing(cls, row: stored.PolicyListing) -> PolicySummary:
        summary = autonomy_summary(CorePolicy.model_validate(row.content))
        return cls.of(row, autonomy_summary=summary, agents_using=row.agents_using)


class PolicyList(_Out):
    policies: list[PolicySummary]


class PolicyValid(_Out):
    valid: bool
    name: str


class MatrixRow(_Out):
    tool: str
    group: str | None
    server: str | None
    status: Json = Field(description="The tagged verdict of the policy for this tool.")
    access: Literal["read", "write"] | None = Field(
        default=None, description="A brokered tool's access class (null: unclassified, the gate denies it)."
    )
    approval: Literal["always", "policy"] | None = Field(
        default=None, description="For a write: `always` asks a human on every call, `policy` leaves it to the rules."
    )


class PolicyOverview(_Out):
    autonomy_summary: Json
    defaults: Json
    budgets: Json
    approvals: Json
    egress: Any
    matrix: list[MatrixRow]


class PolicyPreviewOut(PolicyOverview):
    content: Json

    @classmethod
    def of(cls, policy: CorePolicy, tools: ExtraTools) -> PolicyPreviewOut:
        """A draft's verdicts on its built-in tools and ``tools`` (brokered names with their access classes)."""
        return cls(content=policy.model_dump(mode="json", exclude_none=True), **overview(policy, tools))


class VersionMeta(_Out):
    version: int
    author: str
    summary: str | None
    created_at: Timestamp


class PolicyDetail(PolicyOverview):
    policy: PolicyMeta
    content: Json
    versions: list[VersionMeta]
    agents_using: list[str] = Field(description="Names of the agents whose latest revision uses it.")

    @classmethod
    def of(cls, detail: stored.PolicyDetail, tools: ExtraTools) -> PolicyDetail:
        """The head (``versions`` is newest first) and what it does to every tool."""
        head, row = detail.versions[0], detail.policy
        at_head = stored.PolicyMeta(id=row.id, name=row.name, version=head.version, updated_at=row.updated_at)
        return cls(
            policy=PolicyMeta.of(at_head),
            content=head.content,
            versions=[VersionMeta.model_validate(v) for v in detail.versions],
            agents_using=detail.agents_using,
            **overview(CorePolicy.model_validate(head.content), tools),
        )


class PolicyRef(_Out):
    id: str
    name: str


class PolicyVersionOut(_Out):
    policy: PolicyRef
    version: VersionMeta
    content: Json
    yaml: str

    @classmethod
    def of(cls, row: stored.NamedPolicyVersion) -> PolicyVersionOut:
        """``yaml`` is the imported source when there is one, otherwise generated from the content."""
        return cls(
            policy=PolicyRef(id=str(row.policy_id), name=row.name),
            version=VersionMeta.model_validate(row),
            content=row.content,
            yaml=row.yaml_source or yaml.safe_dump(row.content, sort_keys=False, allow_unicode=True),
        )


class PolicyDeleted(_Out):
    deleted: PolicyRef


# ---- connections ---------------------------------------------------------------------------------


class ConnectionPublic(_Out, ConnectionRow):
    """A connection; never its credential (sealed at rest, never returned)."""

    created_at: Timestamp
    updated_at: Timestamp

    @classmethod
    def of(cls, row: ConnectionRow) -> Self:
        """The row as the API shows it (it holds no credential): a stdio environment's values and an uploaded
        OpenAPI document, which only its tools matter for, are not shown either."""
        return cls.model_validate(cls.shown(row))

    @staticmethod
    def shown(row: ConnectionRow) -> Json:
        return row.model_dump() | {"transport_config": _shown_config(row.transport_config)}


def _shown_config(transport_config: Json) -> Json:
    config = dict(transport_config)
    if isinstance(config.get("env"), dict):
        config["env"] = {name: "…" for name in config["env"]}
    if "document" in config:
        config["document"] = "(uploaded)"
    return config


class ProposalResult(_Out):
    """A dynamic-connection proposal's outcome: saved (``pending`` until a human authorizes it) or refused."""

    ok: bool
    denied: bool | None = None
    message: str | None = None
    connection_id: str | None = None
    status: str | None = None


class ToolRef(_Out):
    name: str
    description: str | None


class SnapshotPublic(_Out):
    version: int
    protocol_version: str
    tools_digest: str
    discovered_at: Timestamp
    authorization_generation: int
    tools: list[Json] = Field(
        description="Names and descriptions (with input schemas where asked for); OpenAPI and HTTP tools also carry "
        "`access` (`read` or `write`)."
    )

    @classmethod
    def of(
        cls, row: ConnectionToolSnapshot, *, reviews: dict[str, ToolReview] | None = None, with_schemas: bool = False
    ) -> SnapshotPublic:
        """The snapshot's tools by name and description (their schemas too ``with_schemas``), each with its review
        (access class, approval, review state) when ``reviews`` are given."""
        tools = row.tools_json if with_schemas else [_tool_ref(t) for t in row.tools_json]
        if reviews is not None:
            tools = [tool | _review(reviews[tool["name"]]) for tool in tools]
        return cls(
            version=row.snapshot_version,
            protocol_version=row.protocol_version,
            tools_digest=row.tools_digest,
            discovered_at=row.discovered_at,
            authorization_generation=row.authorization_generation,
            tools=tools,
        )


def _tool_ref(tool: Json) -> Json:
    return {"name": tool["name"], "description": tool.get("description")} | (
        {"access": tool["access"]} if "access" in tool else {}
    )


def _review(review: ToolReview) -> Json:
    return {"access": review.access, "approval": review.approval, "review": review.review}


class ConnectionOut(_Out):
    connection: ConnectionPublic


class ConnectionList(_Out):
    connections: list[ConnectionPublic]


class SnapshotOut(_Out):
    snapshot: SnapshotPublic


class ToolChangePublic(_Out):
    """A new or changed tool definition a refresh photographed (quarantined while ``pending``)."""

    id: str
    connection_id: str
    tool: str
    kind: Literal["added", "changed"]
    snapshot_version: int
    status: Literal["pending", "approved", "rejected", "superseded"]
    changed_fields: list[str] = Field(description="`description` and/or `input_schema`.")
    diff: str = Field(description="Unified diff of the approved and the proposed definition (indented JSON).")
    previous: Json | None = Field(description="The approved definition (null for a new tool).")
    proposed: Json
    decided_by: str | None = Field(description="`operator`, `user:<id>`, or `refresh` (superseded).")
    decided_at: Timestamp | None
    created_at: Timestamp

    @classmethod
    def of(cls, change: ConnectionToolChange) -> ToolChangePublic:
        fields, diff = definition_diff(change.previous, change.proposed)
        return cls.model_validate(
            {
                "id": change.id,
                "connection_id": change.connection_id,
                "tool": change.tool_name,
                "kind": change.kind,
                "snapshot_version": change.snapshot_version,
                "status": change.status,
                "changed_fields": fields,
                "diff": diff,
                "previous": change.previous,
                "proposed": change.proposed,
                "decided_by": change.decided_by,
                "decided_at": change.decided_at,
                "created_at": change.created_at,
            }
        )


class ToolChangeList(_Out):
    changes: list[ToolChangePublic]


class ToolChangeOut(_Out):
    change: ToolChangePublic


class ConnectionCreated(_Out):
    """A static connection comes with its first snapshot; an oauth one with the ``next`` step (sign-in)."""

    connection: ConnectionPublic
    snapshot: SnapshotPublic | None = None
    next: str | None = None


class GoUrl(_Out):
    go_url: str


class ConnectionAuthorize(_Out):
    """``GET /v1/connections/authorize``: connected, or the sign-in link to open (reused while pending)."""

    status: Literal["authorize", "connected"]
    url: str | None = Field(default=None, description="The sign-in link (status authorize).")
    connection_id: str | None = None


class ClientMetadataDocument(_Out):
    """Our OAuth Client ID Metadata Document: its URL is this deployment's ``client_id`` (a public client using
    PKCE and refresh tokens)."""

    client_id: str
    client_name: str
    client_uri: str
    redirect_uris: list[str]
    grant_types: list[str]
    response_types: list[str]
    token_endpoint_auth_method: str
    application_type: str


# ---- catalog -------------------------------------------------------------------------------------


class CatalogEntryPublic(_Out):
    id: str
    tenant_id: str | None
    slug: str
    name: str
    icon: str | None
    description: str | None
    categories: list[Any]
    tier: str
    url: str | None
    transport: str
    auth_mode: str
    auth_hints: Json
    scopes: list[Any]
    tool_hints: list[Any]
    access: Json = Field(
        description="Reviewed read/write tool patterns; a connection made from the entry gets the read patterns "
        "and no writes (enabling writes is an explicit PATCH of the connection)."
    )
    sandbox_launch: Json | None
    transport_config: Json | None = None
    """openapi / http / stdio: the transport configuration (trusted: a stdio command runs on worker hosts)."""
    created_at: Timestamp

    @classmethod
    def of(cls, entry: ConnectorCatalogEntry) -> CatalogEntryPublic:
        return cls.model_validate(_entry(entry))


def _entry(entry: ConnectorCatalogEntry) -> Json:
    return entry.model_dump(exclude={"disabled_at"})


class BundleRef(_Out):
    id: str
    name: str
    version: int

    @classmethod
    def of(cls, row: CapabilityBundle) -> BundleRef:
        return cls(id=str(row.id), name=row.name, version=row.version)


class CatalogListed(CatalogEntryPublic):
    connection: ConnectionPublic | None = Field(description="The connection that covers this entry, if any.")
    bundle: BundleRef | None = Field(
        description="The newest capability bundle named after the entry's slug (what connecting an in-image "
        "entry publishes), if any."
    )
    connectable: bool

    @classmethod
    def of_listing(cls, listed: Listed) -> CatalogListed:
        entry, bundle = listed.entry, listed.bundle
        return cls.model_validate(
            _entry(entry)
            | {
                "connection": None if listed.connection is None else ConnectionPublic.of(listed.connection),
                "bundle": None if bundle is None else BundleRef(id=bundle[0], name=entry.slug, version=bundle[1]),
                "connectable": listed.connectable,
            }
        )


class CatalogList(_Out):
    connectors: list[CatalogListed]


class CatalogEntryOut(_Out):
    connector: CatalogEntryPublic


class CatalogConnected(_Out):
    """An in-image server → ``bundle``; api_key → ``connection`` + ``snapshot``; oauth → ``connection`` +
    ``go_url``."""

    bundle: BundleRef | None = None
    connection: ConnectionPublic | None = None
    snapshot: SnapshotPublic | None = None
    go_url: str | None = None

    @classmethod
    def of(cls, done: EntryConnected) -> CatalogConnected:
        """Only what the outcome has is set (the route answers without the rest)."""
        shown: dict[str, Any] = {}
        if done.bundle is not None:
            shown["bundle"] = BundleRef.of(done.bundle)
        if done.connection is not None:
            shown["connection"] = ConnectionPublic.of(done.connection)
        if done.snapshot is not None:
            shown["snapshot"] = SnapshotPublic.of(done.snapshot)
        if done.go_url is not None:
            shown["go_url"] = done.go_url
        return cls(**shown)


class ProbeOAuth(_Out):
    """The authorization server the connect flow would sign in with (from its own discovery)."""

    issuer: str
    authorization_endpoint: str
    scopes_supported: list[str] | None


class Probe(_Out):
    url: str
    transport: str
    reachable: bool
    auth_mode: str | None
    oauth_available: bool
    static_possible: bool
    tools_preview: list[ToolRef]
    tools_truncated: bool
    oauth: ProbeOAuth | None
    auth_hints: Json = Field(
        description="How to present a credential (header_name, scheme, help): the catalog entry's for this URL, "
        "else {}."
    )
    notes: list[str]

    @classmethod
    def of(cls, found: ProbeFindings) -> Probe:
        return cls.model_validate(asdict(found))


class ServerAdded(_Out):
    connector: CatalogEntryPublic
    connection: ConnectionPublic
    snapshot: SnapshotPublic


# ---- capabilities --------------------------------------------------------------------------------


class BundleSummary(_Out):
    id: str
    name: str
    version: int
    description: str | None
    definition_digest: str
    server_count: int
    tool_count: int
    classes: list[str]
    created_at: Timestamp

    @classmethod
    def of(cls, row: CapabilityBundle) -> BundleSummary:
        servers = row.definition["servers"]
        return cls(
            id=str(row.id),
            name=row.name,
            version=row.version,
            description=row.description,
            definition_digest=row.definition_digest,
            server_count=len(servers),
            tool_count=sum(len(s.get("tools", [])) for s in servers),
            classes=sorted({s["class"] for s in servers}),
            created_at=row.created_at,
        )


class BundleOut(_Out):
    bundle: BundleSummary


class BundleList(_Out):
    bundles: list[BundleSummary]


class BundleServer(_Out):
    name: str
    class_: str = Field(alias="class")
    tool_count: int
    tools_digest: str
    tools: list[ToolRef]

    @classmethod
    def of(cls, server: Json) -> BundleServer:
        """A published server by its tools' names and descriptions (their schemas are in each run's RunSpec)."""
        tools = server.get("tools", [])
        return cls.model_validate(
            {
                "name": server["name"],
                "class": server["class"],
                "tool_count": len(tools),
                "tools_digest": document_digest(tools),
                "tools": [{"name": t["name"], "description": t.get("description", "")} for t in tools],
            }
        )


class BundleDetail(_Out):
    bundle: BundleSummary
    servers: list[BundleServer]

    @classmethod
    def of(cls, row: CapabilityBundle) -> BundleDetail:
        return cls(bundle=BundleSummary.of(row), servers=[BundleServer.of(s) for s in row.definition["servers"]])


# ---- triggers ------------------------------------------------------------------------------------


class SubscriptionPublic(_Out):
    """A trigger subscription; never its sealed callback secret, only whether one exists."""

    id: str
    tenant_id: str
    name: str
    agent_id: str
    kind: str
    trigger_kind: str
    enabled: bool
    task_template: str | None
    allow_task_override: bool
    allow_workspace_override: bool
    autonomous: bool
    budgets: Json | None
    workspace: Json | None
    pinned_revision_id: str | None
    capabilities: list[str] | None
    concurrency_policy: str
    when_unavailable: str = Field(default="fail", description="park | fail: what its runs do without a connection")
    callback_url: str | None
    has_callback_secret: bool
    token_generation: int
    schedule_cron: str | None
    schedule_timezone: str | None
    missed_run_policy: str | None
    connection_id: str | None
    event_filter: Json | None
    created_at: Timestamp
    updated_at: Timestamp

    @classmethod
    def of(cls, row: TriggerSubscription) -> SubscriptionPublic:
        """Never the sealed secret (nor the id of the key that sealed it), only whether one exists."""
        shown = row.model_dump(exclude={"callback_secret_sealed", "callback_key_id"})
        return cls.model_validate(
            {**shown, "trigger_kind": row.kind, "has_callback_secret": row.callback_secret_sealed is not None}
        )


class ScheduleView(_Out):
    subscription_id: str
    cron: str | None
    timezone: str | None
    missed_run_policy: str | None
    next_fire_at: Timestamp | None = Field(description="Read from the Temporal Schedule; null when unknown.")
    last_fired_at: Timestamp | None

    @classmethod
    def of(cls, row: TriggerSubscription, times: FireTimes | None) -> ScheduleView:
        """A schedule subscription's clock; ``times`` None when the Temporal Schedule could not be read."""
        return cls(
            subscription_id=str(row.id),
            cron=row.schedule_cron,
            timezone=row.schedule_timezone,
            missed_run_policy=row.missed_run_policy,
            next_fire_at=times.next_fire_at if times else None,
            last_fired_at=times.last_fired_at if times else None,
        )


class TriggerUrls(_Out):
    base_url: str
    invoke_url: str
    poll_url_template: str
    ingress_url: str | None

    @classmethod
    def at(cls, base_url: str, subscription_id: str, **more: Any) -> Self:
        """Where a subscription is invoked and its runs polled, under the API's public ``base_url``, with the
        fields (``more``) of the answer that extends these."""
        return cls(
            base_url=base_url,
            invoke_url=f"{base_url}/v1/triggers/{subscription_id}/invoke",
            poll_url_template=f"{base_url}/v1/triggers/{subscription_id}/runs/{{session_id}}",
            ingress_url=None,
            **more,
        )


class TriggerCreated(TriggerUrls):
    subscription: SubscriptionPublic
    schedule: ScheduleView | None
    token: str = Field(description="The fbx_trig_ token, shown once.")
    callback_secret: str | None = Field(description="The fbx_whsec_ secret, shown once (with a callback_url).")
    ingress_path: str | None


class TriggerList(_Out):
    subscriptions: list[SubscriptionPublic]
    schedules: list[ScheduleView]
    base_url: str


class TriggerRun(_Out):
    id: str
    status: str
    status_reason: str | None
    task: str
    invoked_by_kind: str
    created_at: Timestamp
    finished_at: Timestamp | None
    idempotency_key: str
    invocation_kind: str


class TriggerDelivery(_Out):
    id: str
    session_id: str
    url: str
    status: str
    attempts: int
    last_status_code: int | None
    last_error: str | None
    created_at: Timestamp
    delivered_at: Timestamp | None


class TriggerInvocation(_Out):
    id: str
    idempotency_key: str
    kind: str
    session_id: str | None
    skip_reason: str | None
    catch_up: bool
    created_at: Timestamp


class TriggerDetail(TriggerUrls):
    subscription: SubscriptionPublic
    schedule: ScheduleView | None
    sessions: list[TriggerRun] = Field(description="The 20 newest runs it created.")
    deliveries: list[TriggerDelivery] = Field(description="The 20 newest result deliveries.")
    invocations: list[TriggerInvocation] = Field(description="The 30 newest invocations, skipped ones included.")


class TriggerPatched(_Out):
    subscription: SubscriptionPublic
    schedule: ScheduleView | None
    callback_secret: str | None = Field(description="A new secret, shown once, when callback_url changed.")


class SubscriptionOut(_Out):
    subscription: SubscriptionPublic


class TokenRotated(TriggerUrls):
    token: str
    revoked: int = Field(description="How many earlier tokens were revoked.")
    subscription: SubscriptionPublic


class RunStarted(_Out):
    session_id: str
    status: str


class Invoked(RunStarted):
    replay: bool = Field(description="true when the Idempotency-Key named an earlier invocation")
    poll_url: str


class FinishedRun(_Out):
    id: str
    status: str
    status_reason: str | None
    agent_id: str
    agent_revision_id: str
    agent_name: str | None
    task: str
    summary: str | None
    invocation: Json | None
    created_at: str
    started_at: str | None
    finished_at: str | None


class FinishedUsage(UsageTotals):
    tool_calls: int


class FinishedArtifact(_Out):
    id: str
    kind: str
    name: str
    content_type: str
    content: str


class RunFinished(_Out):
    """The ``run.finished`` document (as a webhook delivers it; ids null when polled)."""

    event: str
    delivery_id: str | None
    attempt: int | None
    run: FinishedRun
    usage: FinishedUsage
    artifacts: list[FinishedArtifact]


# ---- identity ------------------------------------------------------------------------------------


class OrgRef(_Out):
    slug: str | None
    display_name: str | None


class UserRef(_Out):
    email: str | None
    name: str | None


class Me(_Out):
    """``{"operator": true}`` for the admin token; otherwise the member behind the PAT."""

    operator: bool | None = None
    user_id: str | None = None
    membership_id: str | None = None
    org: OrgRef | None = None
    user: UserRef | None = None
    roles: list[str] | None = None
    auth_kind: str | None = None


class PatPublic(_Out):
    id: str
    name: str
    display_prefix: str
    expires_at: ZTimestamp | None
    last_used_at: ZTimestamp | None
    revoked_at: ZTimestamp | None
    created_at: ZTimestamp


class PatList(_Out):
    tokens: list[PatPublic]


class PatMinted(_Out):
    token: str
    pat: PatPublic


class PatRevoked(_Out):
    revoked: bool
    id: str


class MemberPublic(_Out):
    id: str
    tenant_id: str
    user_id: str
    email: str
    name: str | None
    roles: list[str]
    status: str
    user_status: str
    deactivated_at: ZTimestamp | None
    created_at: ZTimestamp
    updated_at: ZTimestamp


class MemberList(_Out):
    members: list[MemberPublic]


class MemberOut(_Out):
    member: MemberPublic


# ---- runner plane --------------------------------------------------------------------------------


class Ok(_Out):
    ok: bool
    note: str | None = Field(default=None, description="already terminal | finalizing")


class LlmUsageAck(_Out):
    """The LiteLLM usage callback's answer: ``{"ok": true}`` for the master key, else
    ``{"ignored": "unauthenticated"}``. Nothing is recorded either way (the facade meters usage)."""

    ok: bool | None = None
    ignored: str | None = Field(default=None, description="unauthenticated")


class EventAccepted(_Out):
    seq: int | None
    dropped: str | None = Field(default=None, description="The event type dropped (tool.requested).")


class BrokeredResult(_Out):
    ok: bool
    result: Any = None
    denied: bool | None = None
    message: str | None = None
    error: str | None = None

    @classmethod
    def refused(cls, message: str | None) -> Self:
        """The gate denied the call, or its server refused it."""
        return cls(ok=False, denied=True, message=message)

    @classmethod
    def of(cls, claim: ToolExecutionClaim) -> Self:
        """A brokered call's answer from its execution claim as it stands."""
        state = claim.state
        if state in ("succeeded", "failed_upstream"):
            # Definitive outcomes: upstream failure travels as result.is_error (MCP convention).
            return cls(ok=True, result=claim.result)
        if state == "refused":
            return cls.refused(claim.error)
        if state == "ambiguous":
            return cls(ok=False, error="brokered call outcome ambiguous — not retried")
        if state == "failed_before_send":
            if claim.attempts >= MAX_ATTEMPTS:
                return cls(
                    ok=False,
                    error=f"brokered dispatch failed before send on {claim.attempts} attempts — not retried "
                    "(execution attempts exhausted)",
                )
            return cls(ok=False, error=claim.error)
        return cls(ok=False, error="execution in flight; retry later")


class DiscoveredTool(_Out):
    name: str = Field(description="The canonical mcp__<slot>__<tool> name tool_call and tool_describe take.")
    description: str = Field(description="One line (tool_search) or the whole frozen description (tool_describe).")
    connection: str = Field(description="The requirement slot the tool is bound through.")
    access: Literal["read", "write"] | None = Field(description="The tool's access class; null when undeclared.")
    needsAuthorization: bool = Field(description="The slot's connection cannot be used until someone authorizes it.")


class ToolSearchResult(_Out):
    tools: list[DiscoveredTool]


class ToolDescription(DiscoveredTool):
    input_schema: Json | None = Field(description="The frozen input schema (null when the snapshot had none).")


class Renewed(_Out):
    renewed: bool
    ttl_secs: int


# ---- managed app connections (/v1/mcp-oauth/catalog) ------------------------------------------------


class ManagedConnectionPublic(ConnectionPublic):
    """A managed app's connection: ``server_id`` is the connection's id."""

    server_id: str

    @classmethod
    def of(cls, row: ConnectionRow) -> Self:
        return cls.model_validate(cls.shown(row) | {"server_id": str(row.id)})


class ManagedApp(_Out):
    app_id: str
    name: str
    icon: str | None
    description: str | None
    scopes: list[str]
    connected: bool

    @classmethod
    def of(cls, app: App, *, connected: bool) -> ManagedApp:
        """An offered app (its URL and access patterns are the deployment's, not shown)."""
        return cls.model_validate(asdict(app) | {"connected": connected})


class ManagedApps(_Out):
    apps: list[ManagedApp]


class ManagedAppConnection(_Out):
    app_id: str
    status: str  # connected | PROVISIONING | pending | error | revoked
    server_id: str
    connection: ManagedConnectionPublic


class ManagedAppConnections(_Out):
    connections: list[ManagedAppConnection]


class ManagedConnectOutcome(_Out):
    """``connected`` (with the connection), ``redirect`` (with ``authorization_url``) or ``PROVISIONING``."""

    status: Literal["connected", "redirect", "PROVISIONING"]
    authorization_url: str | None = None
    connection: ManagedConnectionPublic | None = None
    reason: str | None = None

    @classmethod
    def of(cls, outcome: Outcome) -> ManagedConnectOutcome:
        """Only what the outcome has is set (the route answers without the rest)."""
        shown: dict[str, Any] = {"status": outcome.status}
        if outcome.status == "redirect":
            shown["authorization_url"] = outcome.authorization_url
        if outcome.connection is not None:
            shown["connection"] = ManagedConnectionPublic.of(outcome.connection)
        if outcome.reason is not None:
            shown["reason"] = outcome.reason
        return cls(**shown)
