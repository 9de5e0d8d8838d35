"""The ledger: every run's append-only, gapless sequence of redacted events.

Append-only is enforced by the database (trigger ``events_no_update`` from migration 0001), which a
model cannot express; ``seq`` is handed out from ``sessions.event_seq`` under the run's row lock.
"""

import uuid
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from db.models._columns import BIGINT, JSONB, NOW, TEXT, TIMESTAMPTZ, default


class Event(SQLModel, table=True):
    """One ledger entry of a run (``core.events`` defines the types and payloads)."""

    __tablename__ = "events"
    __table_args__ = (sa.UniqueConstraint("session_id", "seq"),)

    event_id: uuid.UUID = Field(primary_key=True)
    session_id: uuid.UUID = Field(foreign_key="sessions.id")
    seq: int = Field(sa_type=BIGINT)
    schema_version: int = Field(sa_column_kwargs=default("1"))
    actor: str = Field(sa_type=TEXT)
    type: str = Field(sa_type=TEXT)
    payload: dict[str, Any] = Field(sa_type=JSONB)
    occurred_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)
    recorded_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)
