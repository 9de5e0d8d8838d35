"""Managed app connections (migration 0013): an account's connection per app, and the flows that sign it in.

A flow's grant waits here, sealed, between the provider's redirect and the account's completion (a completion
proof, or the account's next connect call): a redirect alone never makes a connection usable. The proof is kept
only as its SHA-256 digest.
"""

import uuid
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from db.models._columns import BYTEA, JSONB, NOW, TEXT, TIMESTAMPTZ


class ManagedAppConnection(SQLModel, table=True):
    """The personal OAuth connection serving one account's use of one managed app."""

    __tablename__ = "managed_app_connections"
    __table_args__ = (sa.UniqueConstraint("tenant_id", "user_id", "app_id"),)

    id: uuid.UUID = Field(primary_key=True)
    tenant_id: uuid.UUID = Field(foreign_key="tenants.id")
    user_id: uuid.UUID = Field(foreign_key="users.id")
    app_id: str = Field(sa_type=TEXT)
    connection_id: uuid.UUID = Field(foreign_key="integration_connections.id")
    created_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)
    updated_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)


class ManagedAppFlow(SQLModel, table=True):
    """A managed app's sign-in: the connector flow it extends, the held grant and the completion proof."""

    __tablename__ = "managed_app_flows"
    __table_args__ = (sa.Index("managed_app_flows_managed", "managed_id", "created_at"),)

    flow_id: uuid.UUID = Field(primary_key=True, foreign_key="connector_oauth_flows.id")
    tenant_id: uuid.UUID = Field(foreign_key="tenants.id")
    managed_id: uuid.UUID = Field(foreign_key="managed_app_connections.id")
    user_id: uuid.UUID = Field(foreign_key="users.id")
    redirect_url: str | None = Field(sa_type=TEXT)
    signed_in_at: datetime | None = Field(sa_type=TIMESTAMPTZ)
    credential_sealed: bytes | None = Field(sa_type=BYTEA)
    credential_key_id: str | None = Field(sa_type=TEXT)
    access_token_sealed: bytes | None = Field(sa_type=BYTEA)
    access_token_key_id: str | None = Field(sa_type=TEXT)
    access_expires_at: datetime | None = Field(sa_type=TIMESTAMPTZ)
    oauth: dict[str, Any] | None = Field(sa_type=JSONB)
    proof_hash: str | None = Field(sa_type=TEXT, unique=True)
    proof_expires_at: datetime | None = Field(sa_type=TIMESTAMPTZ)
    proof_used_at: datetime | None = Field(sa_type=TIMESTAMPTZ)
    finished_at: datetime | None = Field(sa_type=TIMESTAMPTZ)
    created_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)
