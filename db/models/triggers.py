"""Trigger subscriptions (api, schedule, event) and their invocations.

A subscription is the one object behind the three invocation shapes; its tokens are ``api_tokens`` rows
of kind ``trigger``. ``trigger_invocations`` holds both the idempotency claims and the visible skips: an
invocation is bound to the run it started, or carries a skip reason, never both.
"""

import uuid
from datetime import datetime
from typing import Any, Literal

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from db.models._columns import BYTEA, FALSE, JSONB, NOW, TEXT, TIMESTAMPTZ, TRUE, default, one_of

SubscriptionKind = Literal["api", "schedule", "event"]
InvocationKind = Literal["api", "schedule", "event", "manual"]
ConcurrencyPolicy = Literal["allow", "skip_if_running", "replace"]
MissedRunPolicy = Literal["skip", "catch_up"]
WhenUnavailable = Literal["park", "fail"]


class TriggerSubscription(SQLModel, table=True):
    """What starts runs of an agent, and with which task, workspace, budgets and callback."""

    __tablename__ = "trigger_subscriptions"
    __table_args__ = (
        sa.UniqueConstraint("tenant_id", "name"),
        sa.CheckConstraint(one_of("kind", SubscriptionKind), name="trigger_subscriptions_kind_check"),
        sa.CheckConstraint(
            one_of("concurrency_policy", ConcurrencyPolicy), name="trigger_subscriptions_concurrency_policy_check"
        ),
        sa.CheckConstraint(
            one_of("missed_run_policy", MissedRunPolicy), name="trigger_subscriptions_missed_run_policy_check"
        ),
        sa.CheckConstraint(
            one_of("when_unavailable", WhenUnavailable), name="trigger_subscriptions_when_unavailable_check"
        ),
        # PostgreSQL named these unnamed table checks by position; the names are kept as they are.
        sa.CheckConstraint(
            "(callback_url IS NULL) = (callback_secret_sealed IS NULL)", name="trigger_subscriptions_check"
        ),
        sa.CheckConstraint("kind <> 'schedule' OR schedule_cron IS NOT NULL", name="trigger_subscriptions_check1"),
        sa.CheckConstraint(
            "kind <> 'event' OR (connection_id IS NOT NULL AND event_filter IS NOT NULL)",
            name="trigger_subscriptions_check2",
        ),
    )

    id: uuid.UUID = Field(primary_key=True)
    tenant_id: uuid.UUID = Field(foreign_key="tenants.id")
    name: str = Field(sa_type=TEXT)
    agent_id: uuid.UUID = Field(foreign_key="agents.id")
    kind: SubscriptionKind = Field(sa_type=TEXT)
    enabled: bool = Field(sa_column_kwargs=TRUE)
    task_template: str | None = Field(sa_type=TEXT)
    allow_task_override: bool = Field(sa_column_kwargs=FALSE)
    allow_workspace_override: bool = Field(sa_column_kwargs=FALSE)
    autonomous: bool = Field(sa_column_kwargs=FALSE)
    budgets: dict[str, Any] | None = Field(sa_type=JSONB)
    workspace: dict[str, Any] | None = Field(sa_type=JSONB)
    pinned_revision_id: uuid.UUID | None = Field(foreign_key="agent_revisions.id")
    capabilities: list[str] | None = Field(sa_type=JSONB)
    concurrency_policy: ConcurrencyPolicy = Field(sa_type=TEXT, sa_column_kwargs=default("'allow'"))
    callback_url: str | None = Field(sa_type=TEXT)
    callback_secret_sealed: bytes | None = Field(sa_type=BYTEA)
    callback_key_id: str | None = Field(sa_type=TEXT)
    token_generation: int = Field(sa_column_kwargs=default("1"))
    schedule_cron: str | None = Field(sa_type=TEXT)
    schedule_timezone: str | None = Field(sa_type=TEXT)
    missed_run_policy: MissedRunPolicy | None = Field(sa_type=TEXT)
    connection_id: uuid.UUID | None = Field(foreign_key="integration_connections.id")
    event_filter: dict[str, Any] | None = Field(sa_type=JSONB)
    # Migration 0015: a requirement its runs cannot bind parks the run (``park``) or refuses it (``fail``).
    when_unavailable: WhenUnavailable = Field(default="fail", sa_type=TEXT, sa_column_kwargs=default("'fail'"))
    # Migration 0021: the operator created or last edited it, so its fires may copy a control-plane host path.
    host_paths_allowed: bool = Field(default=False, sa_column_kwargs=FALSE)
    created_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)
    updated_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)


class TriggerInvocation(SQLModel, table=True):
    """One idempotent invocation of a subscription: the run it started, or why it was skipped."""

    __tablename__ = "trigger_invocations"
    __table_args__ = (
        sa.UniqueConstraint("subscription_id", "idempotency_key"),
        sa.CheckConstraint(one_of("kind", InvocationKind), name="trigger_invocations_kind_check"),
        sa.CheckConstraint("session_id IS NULL OR skip_reason IS NULL", name="trigger_invocations_check"),
        sa.Index("trigger_invocations_recent", "subscription_id", sa.text("created_at DESC")),
        sa.Index("trigger_invocations_session", "session_id", postgresql_where=sa.text("session_id IS NOT NULL")),
    )

    id: uuid.UUID = Field(primary_key=True)
    tenant_id: uuid.UUID = Field(foreign_key="tenants.id")
    subscription_id: uuid.UUID = Field(foreign_key="trigger_subscriptions.id")
    idempotency_key: str = Field(sa_type=TEXT)
    kind: InvocationKind = Field(sa_type=TEXT)
    request_digest: str | None = Field(sa_type=TEXT)
    session_id: uuid.UUID | None = Field(foreign_key="sessions.id")
    skip_reason: str | None = Field(sa_type=TEXT)
    catch_up: bool = Field(sa_column_kwargs=FALSE)
    created_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)
