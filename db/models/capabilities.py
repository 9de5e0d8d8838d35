"""Capability bundles: versioned sets of sandbox-class MCP servers an agent revision can pin."""

import uuid
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from db.models._columns import JSONB, NOW, TEXT, TIMESTAMPTZ


class CapabilityBundle(SQLModel, table=True):
    """One immutable version of a named bundle (``definition`` and its digest)."""

    __tablename__ = "capability_bundles"
    __table_args__ = (
        sa.UniqueConstraint("tenant_id", "name", "version"),
        sa.CheckConstraint("version > 0", name="capability_bundles_version_check"),
    )

    id: uuid.UUID = Field(primary_key=True)
    tenant_id: uuid.UUID = Field(foreign_key="tenants.id")
    name: str = Field(sa_type=TEXT)
    version: int
    description: str | None = Field(sa_type=TEXT)
    definition: dict[str, Any] = Field(sa_type=JSONB)
    definition_digest: str = Field(sa_type=TEXT)
    created_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)
