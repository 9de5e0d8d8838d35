"""Runs waiting for a connection (migration 0015): one row per wait, found by what makes a connection usable.

A run parked before provisioning has ``tool_call_id`` ''; a brokered call parked mid-run names its tool call.
``connection_id`` is set when the wait is on a known connection (revoked, in error, pending its first sign-in,
reauthorized); otherwise the wait is on the requirement's URL (``url_key``) and owner.
"""

import uuid
from datetime import datetime
from typing import Literal

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from db.models._columns import NOW, TEXT, TIMESTAMPTZ, default, one_of

ParkState = Literal["waiting", "resumed", "expired", "ended"]


class RunPark(SQLModel, table=True):
    """One run (or one of its tool calls) waiting for a connection to become usable."""

    __tablename__ = "run_parks"
    __table_args__ = (
        sa.UniqueConstraint("session_id", "tool_call_id", "slot"),
        sa.CheckConstraint(one_of("state", ParkState), name="run_parks_state_check"),
        sa.Index("run_parks_waiting_idx", "tenant_id", "url_key", postgresql_where=sa.text("state = 'waiting'")),
    )

    id: uuid.UUID = Field(primary_key=True)
    tenant_id: uuid.UUID = Field(foreign_key="tenants.id")
    session_id: uuid.UUID = Field(foreign_key="sessions.id")
    tool_call_id: str = Field(sa_type=TEXT, sa_column_kwargs=default("''"))
    slot: str = Field(sa_type=TEXT)
    connection_id: uuid.UUID | None = Field(default=None, foreign_key="integration_connections.id")
    url_key: str = Field(sa_type=TEXT)
    owner_user_id: uuid.UUID | None = None
    reason: str = Field(sa_type=TEXT)
    state: ParkState = Field(sa_type=TEXT, sa_column_kwargs=default("'waiting'"))
    expires_at: datetime = Field(sa_type=TIMESTAMPTZ)
    created_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)
    resolved_at: datetime | None = Field(default=None, sa_type=TIMESTAMPTZ)
