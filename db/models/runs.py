"""Runs (the API and the table call them sessions), their finalization intents and artifacts.

A run's configuration is frozen at creation into ``run_spec`` (``core.runspec.RunSpec`` as JSON);
``event_seq`` is the last ledger ``seq`` handed out, advanced under the run's row lock.
"""

import uuid
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from db.models._columns import BIGINT, FALSE, JSONB, NOW, TEXT, TIMESTAMPTZ, default


class Run(SQLModel, table=True):
    """One governed invocation of an agent revision (``sessions`` row)."""

    __tablename__ = "sessions"
    __table_args__ = (
        sa.Index("sessions_tenant_created", "tenant_id", sa.text("created_at DESC")),
        sa.Index(
            "sessions_invoker",
            "tenant_id",
            "invoked_by_user_id",
            sa.text("created_at DESC"),
            postgresql_where=sa.text("invoked_by_user_id IS NOT NULL"),
        ),
        # Migration 0012: counting live sandboxes (FLUIDBOX_MAX_SANDBOXES) reads only the live runs.
        sa.Index(
            "sessions_live_sandbox_idx",
            "status",
            postgresql_where=sa.text(
                "status IN ('provisioning', 'initializing', 'running', 'awaiting_approval', 'cancelling', 'finalizing')"
            ),
        ),
    )

    id: uuid.UUID = Field(primary_key=True)
    tenant_id: uuid.UUID = Field(foreign_key="tenants.id")
    agent_id: uuid.UUID = Field(foreign_key="agents.id")
    agent_revision_id: uuid.UUID = Field(foreign_key="agent_revisions.id")
    status: str = Field(sa_type=TEXT)
    status_reason: str | None = Field(sa_type=TEXT)
    autonomy: str = Field(sa_type=TEXT)
    trust_tier: str = Field(sa_type=TEXT, sa_column_kwargs=default("'trusted'"))
    task: str = Field(sa_type=TEXT)
    repo_source: dict[str, Any] | None = Field(sa_type=JSONB)
    run_spec: dict[str, Any] = Field(sa_type=JSONB)
    trigger: dict[str, Any] | None = Field(sa_type=JSONB)
    sandbox_handle: dict[str, Any] | None = Field(sa_type=JSONB)
    budgets: dict[str, Any] | None = Field(sa_type=JSONB)
    base_commit: str | None = Field(sa_type=TEXT)
    result_summary: str | None = Field(sa_type=TEXT)
    event_seq: int = Field(sa_type=BIGINT, sa_column_kwargs=default("0"))
    last_heartbeat_at: datetime | None = Field(sa_type=TIMESTAMPTZ)
    gate_calls: int = Field(sa_column_kwargs=default("0"))
    started_at: datetime | None = Field(sa_type=TIMESTAMPTZ)
    finished_at: datetime | None = Field(sa_type=TIMESTAMPTZ)
    invoked_by_kind: str = Field(sa_type=TEXT, sa_column_kwargs=default("'operator'"))
    # No foreign key: the invoker is recorded as it was, whatever happens to the user later.
    invoked_by_user_id: uuid.UUID | None
    # Migration 0015: what a person must do while the run is ``waiting_for_connection`` (None otherwise).
    pending_action: dict[str, Any] | None = Field(default=None, sa_type=JSONB)
    created_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)
    updated_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)


class RunFinalization(SQLModel, table=True):
    """The server's decided end of a run, written before the run is torn down (at most one per run)."""

    __tablename__ = "session_finalizations"

    session_id: uuid.UUID = Field(primary_key=True, foreign_key="sessions.id")
    outcome: str = Field(sa_type=TEXT)
    summary: str | None = Field(sa_type=TEXT)
    reason: str | None = Field(sa_type=TEXT)
    needs_quiesce: bool = Field(sa_column_kwargs=FALSE)
    created_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)


class Artifact(SQLModel, table=True):
    """A named text output of a run (its diff, cost report…), one per (run, kind, name)."""

    __tablename__ = "artifacts"
    __table_args__ = (sa.UniqueConstraint("session_id", "kind", "name"),)

    id: uuid.UUID = Field(primary_key=True)
    session_id: uuid.UUID = Field(foreign_key="sessions.id")
    kind: str = Field(sa_type=TEXT)
    name: str = Field(sa_type=TEXT)
    content: str = Field(sa_type=TEXT)
    content_type: str = Field(sa_type=TEXT)
    created_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)
