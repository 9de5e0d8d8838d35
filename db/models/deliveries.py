"""Result deliveries: one row per (run, webhook destination), retried until delivered or given up."""

import uuid
from datetime import datetime
from typing import Any, Literal

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from db.models._columns import JSONB, NOW, TEXT, TIMESTAMPTZ, default, one_of

DeliveryStatus = Literal["pending", "delivered", "failed", "skipped"]


class Delivery(SQLModel, table=True):
    """A run's result sent to one destination; ``id`` is the receiver's dedup key on every attempt."""

    __tablename__ = "deliveries"
    __table_args__ = (
        sa.UniqueConstraint("session_id", "destination_index"),
        sa.CheckConstraint(one_of("status", DeliveryStatus), name="deliveries_status_check"),
        sa.Index("deliveries_subscription", "subscription_id", sa.text("created_at DESC")),
    )

    id: uuid.UUID = Field(primary_key=True)
    tenant_id: uuid.UUID = Field(foreign_key="tenants.id")
    session_id: uuid.UUID = Field(foreign_key="sessions.id")
    destination_index: int
    # No foreign key: a delivery is history and stays readable whatever happens to the subscription.
    subscription_id: uuid.UUID | None
    destination: dict[str, Any] = Field(sa_type=JSONB)
    url: str = Field(sa_type=TEXT)
    status: DeliveryStatus = Field(sa_type=TEXT, sa_column_kwargs=default("'pending'"))
    attempts: int = Field(sa_column_kwargs=default("0"))
    last_status_code: int | None
    last_error: str | None = Field(sa_type=TEXT)
    payload_digest: str | None = Field(sa_type=TEXT)
    next_attempt_at: datetime | None = Field(sa_type=TIMESTAMPTZ)
    last_attempt_at: datetime | None = Field(sa_type=TIMESTAMPTZ)
    delivered_at: datetime | None = Field(sa_type=TIMESTAMPTZ)
    created_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)
    updated_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)
