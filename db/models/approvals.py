"""Approvals: a tool call waiting for (or decided by) a human, one per (run, tool call)."""

import uuid
from datetime import datetime

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from db.models._columns import NOW, TEXT, TIMESTAMPTZ


class Approval(SQLModel, table=True):
    """A request for a decision on one tool call; decided once, by compare-and-swap on ``status``."""

    __tablename__ = "approvals"
    __table_args__ = (
        sa.UniqueConstraint("session_id", "tool_call_id"),
        sa.Index("approvals_pending", "tenant_id", "requested_at", postgresql_where=sa.text("status = 'pending'")),
    )

    id: uuid.UUID = Field(primary_key=True)
    tenant_id: uuid.UUID = Field(foreign_key="tenants.id")
    session_id: uuid.UUID = Field(foreign_key="sessions.id")
    tool_call_id: str = Field(sa_type=TEXT)
    tool: str = Field(sa_type=TEXT)
    summary: str | None = Field(sa_type=TEXT)
    input_digest: str = Field(sa_type=TEXT)
    risk: str | None = Field(sa_type=TEXT)
    scope: str | None = Field(sa_type=TEXT)
    scope_key: str | None = Field(sa_type=TEXT)
    status: str = Field(sa_type=TEXT)
    decision_source: str | None = Field(sa_type=TEXT)
    decision_reason: str | None = Field(sa_type=TEXT)
    requested_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)
    expires_at: datetime | None = Field(sa_type=TIMESTAMPTZ)
    decided_at: datetime | None = Field(sa_type=TIMESTAMPTZ)
    decided_by: str | None = Field(sa_type=TEXT)
