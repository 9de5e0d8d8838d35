"""LLM usage metering: per-request reservations, charged usage entries, and each run's spend total.

``session_spend`` is kept by the AFTER INSERT trigger ``usage_entries_spend`` (migration 0010), and
admission is the plpgsql function ``llm_admit`` (migrations 0005, 0009, 0010); neither is a model.
"""

import uuid
from datetime import datetime
from decimal import Decimal
from typing import Literal

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from db.models._columns import BIGINT, NOW, NUMERIC, TEXT, TIMESTAMPTZ, default, one_of

UsageSource = Literal["facade", "litellm_callback", "reservation_timeout"]
ReservationState = Literal["reserved", "charged", "released"]


class UsageEntry(SQLModel, table=True):
    """Tokens and cost charged to a run for one model response (``external_id``: the request id)."""

    __tablename__ = "usage_entries"
    __table_args__ = (
        sa.CheckConstraint(one_of("source", UsageSource), name="usage_entries_source"),
        sa.Index("usage_entries_session", "session_id"),
    )

    id: uuid.UUID = Field(primary_key=True)
    session_id: uuid.UUID = Field(foreign_key="sessions.id")
    model: str = Field(sa_type=TEXT)
    input_tokens: int = Field(sa_type=BIGINT, sa_column_kwargs=default("0"))
    output_tokens: int = Field(sa_type=BIGINT, sa_column_kwargs=default("0"))
    cache_read_tokens: int = Field(sa_type=BIGINT, sa_column_kwargs=default("0"))
    cache_write_tokens: int = Field(sa_type=BIGINT, sa_column_kwargs=default("0"))
    cost_usd: Decimal | None = Field(sa_type=NUMERIC)
    source: UsageSource = Field(sa_type=TEXT)
    external_id: str | None = Field(sa_type=TEXT, unique=True)
    created_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)


class LlmReservation(SQLModel, table=True):
    """One forwarded model request's reservation, moving ``reserved → charged | released`` once."""

    __tablename__ = "llm_reservations"
    __table_args__ = (
        sa.CheckConstraint(one_of("state", ReservationState), name="llm_reservations_state_check"),
        sa.CheckConstraint("reserved_input_tokens >= 0", name="llm_reservations_reserved_input_tokens_check"),
        sa.CheckConstraint("reserved_output_tokens >= 0", name="llm_reservations_reserved_output_tokens_check"),
        sa.Index("llm_reservations_live", "session_id", postgresql_where=sa.text("state = 'reserved'")),
        sa.Index("llm_reservations_due", "expires_at", postgresql_where=sa.text("state = 'reserved'")),
    )

    id: uuid.UUID = Field(primary_key=True)
    tenant_id: uuid.UUID = Field(foreign_key="tenants.id")
    session_id: uuid.UUID = Field(foreign_key="sessions.id")
    model: str = Field(sa_type=TEXT)
    state: ReservationState = Field(sa_type=TEXT, sa_column_kwargs=default("'reserved'"))
    reserved_input_tokens: int = Field(sa_type=BIGINT)
    reserved_output_tokens: int = Field(sa_type=BIGINT)
    reserved_cost_usd: Decimal | None = Field(sa_type=NUMERIC)
    created_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)
    expires_at: datetime = Field(sa_type=TIMESTAMPTZ)
    settled_at: datetime | None = Field(sa_type=TIMESTAMPTZ)
    settle_reason: str | None = Field(sa_type=TEXT)


class RunSpend(SQLModel, table=True):
    """A run's recorded spend in one row (``session_spend``), written only by the usage trigger.

    ``used_cost`` is the sum of priced entries, NULL while none is priced.
    """

    __tablename__ = "session_spend"

    session_id: uuid.UUID = Field(primary_key=True, foreign_key="sessions.id")
    used_tokens: int = Field(sa_type=BIGINT, sa_column_kwargs=default("0"))
    used_cost: Decimal | None = Field(sa_type=NUMERIC)
    entries: int = Field(sa_type=BIGINT, sa_column_kwargs=default("0"))
