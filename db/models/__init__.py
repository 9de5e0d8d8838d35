"""The schema's single source of truth: one ``table=True`` SQLModel per table, a module per aggregate.

Importing this package registers every table on ``SQLModel.metadata``, which alembic's autogenerate
compares against (``db/migrations/env.py``) and ``tests/db/test_models_match_migrations.py`` holds
equal to what the migrations build. Repositories return these models (or read models beside them).

What a model cannot express stays in the migrations and is listed below, so the drift test can tell
"deliberately not modelled" from "forgotten": plpgsql functions and the triggers that run them.
"""

from db.models._columns import NAMING_CONVENTION
from db.models.agents import Agent, AgentRevision
from db.models.approvals import Approval
from db.models.capabilities import CapabilityBundle
from db.models.catalog import ConnectorCatalogEntry
from db.models.connections import (
    ConnectionApprovedTool,
    ConnectionToolChange,
    ConnectionToolSnapshot,
    IntegrationConnection,
    RunResourceBinding,
    ToolExecutionClaim,
)
from db.models.deliveries import Delivery
from db.models.identity import AuthAuditLog, OrgMembership, Tenant, User
from db.models.ledger import Event
from db.models.managed_apps import ManagedAppConnection, ManagedAppFlow
from db.models.oauth import ConnectorOAuthFlow, OAuthClientRegistration
from db.models.parks import RunPark
from db.models.policies import Policy, PolicyVersion
from db.models.runs import Artifact, Run, RunFinalization
from db.models.tokens import ApiToken
from db.models.triggers import TriggerInvocation, TriggerSubscription
from db.models.usage import LlmReservation, RunSpend, UsageEntry
from db.models.workspaces import WorkspaceArchive

# Functions and triggers the migrations create (name → migration that last defined it).
MIGRATION_ONLY_FUNCTIONS: dict[str, str] = {
    "events_append_only": "0001",  # the ledger refuses UPDATE and DELETE
    "auth_audit_append_only": "0008",  # auth_audit_log refuses UPDATE, DELETE and TRUNCATE
    "llm_admit": "0010",  # LLM admission in one round trip (db/usage.py)
    "usage_entries_spend": "0010",  # keeps session_spend current
}
MIGRATION_ONLY_TRIGGERS: dict[str, str] = {
    "events.events_no_update": "0001",
    "auth_audit_log.auth_audit_no_update": "0008",
    "auth_audit_log.auth_audit_no_truncate": "0008",
    "usage_entries.usage_entries_spend": "0010",
}

__all__ = [
    "MIGRATION_ONLY_FUNCTIONS",
    "MIGRATION_ONLY_TRIGGERS",
    "NAMING_CONVENTION",
    "Agent",
    "AgentRevision",
    "ApiToken",
    "Approval",
    "Artifact",
    "AuthAuditLog",
    "CapabilityBundle",
    "ConnectionApprovedTool",
    "ConnectionToolChange",
    "ConnectionToolSnapshot",
    "ConnectorCatalogEntry",
    "ConnectorOAuthFlow",
    "Delivery",
    "Event",
    "IntegrationConnection",
    "LlmReservation",
    "ManagedAppConnection",
    "ManagedAppFlow",
    "OAuthClientRegistration",
    "OrgMembership",
    "Policy",
    "PolicyVersion",
    "Run",
    "RunFinalization",
    "RunPark",
    "RunResourceBinding",
    "RunSpend",
    "Tenant",
    "ToolExecutionClaim",
    "TriggerInvocation",
    "TriggerSubscription",
    "UsageEntry",
    "User",
    "WorkspaceArchive",
]
