"""Policies: a named policy per tenant and its append-only numbered versions."""

import uuid
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from db.models._columns import JSONB, NOW, TEXT, TIMESTAMPTZ


class Policy(SQLModel, table=True):
    """A policy's identity; its content lives in versions (the highest one is the head)."""

    __tablename__ = "policies"
    __table_args__ = (sa.UniqueConstraint("tenant_id", "name"),)

    id: uuid.UUID = Field(primary_key=True)
    tenant_id: uuid.UUID = Field(foreign_key="tenants.id")
    name: str = Field(sa_type=TEXT)
    created_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)
    updated_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)


class PolicyVersion(SQLModel, table=True):
    """One immutable version of a policy document (parsed ``content``, and the YAML it came from)."""

    __tablename__ = "policy_versions"
    __table_args__ = (
        sa.UniqueConstraint("policy_id", "version"),
        sa.CheckConstraint("version > 0", name="policy_versions_version_check"),
    )

    id: uuid.UUID = Field(primary_key=True)
    policy_id: uuid.UUID = Field(foreign_key="policies.id", ondelete="CASCADE")
    version: int
    content: dict[str, Any] = Field(sa_type=JSONB)
    yaml_source: str | None = Field(sa_type=TEXT)
    summary: str | None = Field(sa_type=TEXT)
    author: str = Field(sa_type=TEXT)
    created_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)
