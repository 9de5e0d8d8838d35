"""The connector catalog: curated global entries (no tenant) and each tenant's custom ones."""

import uuid
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from db.models._columns import EMPTY_ARRAY, EMPTY_OBJECT, JSONB, NOW, TEXT, TIMESTAMPTZ, default


class ConnectorCatalogEntry(SQLModel, table=True):
    """How to connect to one kind of server: transport, auth mode, hints, optional sandbox launch."""

    __tablename__ = "connector_catalog"
    __table_args__ = (
        # One slug per scope: the global entries, and each tenant's custom ones.
        sa.Index("connector_catalog_global_slug", "slug", unique=True, postgresql_where=sa.text("tenant_id IS NULL")),
        sa.Index(
            "connector_catalog_tenant_slug",
            "tenant_id",
            "slug",
            unique=True,
            postgresql_where=sa.text("tenant_id IS NOT NULL"),
        ),
    )

    id: uuid.UUID = Field(primary_key=True)
    tenant_id: uuid.UUID | None = Field(foreign_key="tenants.id")
    slug: str = Field(sa_type=TEXT)
    name: str = Field(sa_type=TEXT)
    icon: str | None = Field(sa_type=TEXT)
    description: str | None = Field(sa_type=TEXT)
    categories: list[Any] = Field(sa_type=JSONB, sa_column_kwargs=EMPTY_ARRAY)
    tier: str = Field(sa_type=TEXT)
    url: str | None = Field(sa_type=TEXT)
    transport: str = Field(sa_type=TEXT, sa_column_kwargs=default("'streamable_http'"))
    auth_mode: str = Field(sa_type=TEXT, sa_column_kwargs=default("'api_key'"))
    auth_hints: dict[str, Any] = Field(sa_type=JSONB, sa_column_kwargs=EMPTY_OBJECT)
    scopes: list[Any] = Field(sa_type=JSONB, sa_column_kwargs=EMPTY_ARRAY)
    tool_hints: list[Any] = Field(sa_type=JSONB, sa_column_kwargs=EMPTY_ARRAY)
    sandbox_launch: dict[str, Any] | None = Field(sa_type=JSONB)
    # Reviewed read/write tool patterns (migration 0014; ``core/access.py``). A connection made from the
    # entry gets its read patterns and no writes: enabling writes is an explicit edit of the connection.
    access: dict[str, Any] = Field(
        sa_type=JSONB,
        sa_column_kwargs={
            "server_default": sa.text(
                """'{"read": {"tools": ["*"]}, "write": {"tools": [], "approval": "always"}}'::jsonb"""
            )
        },
    )
    transport_config: dict[str, Any] | None = Field(sa_type=JSONB)  # migration 0017
    disabled_at: datetime | None = Field(sa_type=TIMESTAMPTZ)
    created_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)
