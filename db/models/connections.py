"""Connections to credentialed MCP servers, their tool snapshots, and what a run froze of them.

A run binds each connection requirement to one connection at creation (``run_resource_bindings``, with
the tools it may call); a brokered call is claimed once per (run, tool call, input) in
``tool_execution_claims`` so a retried request never executes twice.
"""

import uuid
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from db.models._columns import BYTEA, EMPTY_OBJECT, JSONB, NOW, TEXT, TIMESTAMPTZ, default

# A connection created without a declaration classifies nothing (so nothing is callable).
ACCESS_NONE = """'{"read": {"tools": []}, "write": {"tools": [], "approval": "always"}}'::jsonb"""


class IntegrationConnection(SQLModel, table=True):
    """A tenant's (or one user's) connection to a server, with its sealed credential."""

    __tablename__ = "integration_connections"
    __table_args__ = (
        sa.Index("integration_connections_url", "tenant_id", "base_url", postgresql_where=sa.text("status = 'active'")),
        sa.CheckConstraint(
            "(owner_type = 'organization' AND owner_user_id IS NULL)"
            " OR (owner_type = 'user' AND owner_user_id IS NOT NULL)",
            name="integration_connections_owner",
        ),
        sa.ForeignKeyConstraint(["owner_user_id"], ["users.id"], name="integration_connections_owner_fk"),
        sa.CheckConstraint(
            "transport IN ('mcp_http', 'openapi', 'http', 'stdio', 'relay', 'sandbox_cli', 'git')",
            name="integration_connections_transport_check",
        ),
    )

    id: uuid.UUID = Field(primary_key=True)
    tenant_id: uuid.UUID = Field(foreign_key="tenants.id")
    provider: str = Field(sa_type=TEXT)
    display_name: str = Field(sa_type=TEXT)
    base_url: str = Field(sa_type=TEXT)
    auth_kind: str = Field(sa_type=TEXT, sa_column_kwargs=default("'static'"))
    header_name: str | None = Field(sa_type=TEXT)
    scheme: str = Field(sa_type=TEXT, sa_column_kwargs=default("'Bearer'"))
    credential_sealed: bytes | None = Field(sa_type=BYTEA)
    credential_key_id: str | None = Field(sa_type=TEXT)
    status: str = Field(sa_type=TEXT)
    owner_type: str = Field(sa_type=TEXT, sa_column_kwargs=default("'organization'"))
    owner_user_id: uuid.UUID | None
    authorization_generation: int = Field(sa_column_kwargs=default("1"))
    # ``metadata`` is SQLAlchemy's own attribute on every model, so the column is mapped as ``metadata_``.
    metadata_: dict[str, Any] = Field(sa_column=sa.Column("metadata", JSONB, nullable=False, **EMPTY_OBJECT))
    created_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)
    updated_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)
    created_by_user_id: uuid.UUID | None = Field(foreign_key="users.id")
    # OAuth (migration 0011): what discovery found (no secret), our registration, the last activation, and
    # the current access token shared by every process (``credential_sealed`` holds the refresh token).
    oauth: dict[str, Any] | None = Field(sa_type=JSONB)
    registration_id: uuid.UUID | None = Field(foreign_key="oauth_client_registrations.id")
    oauth_activated_at: datetime | None = Field(sa_type=TIMESTAMPTZ)
    access_token_sealed: bytes | None = Field(sa_type=BYTEA)
    access_token_key_id: str | None = Field(sa_type=TEXT)
    access_expires_at: datetime | None = Field(sa_type=TIMESTAMPTZ)
    # Which tools read and which write (migration 0014; normalized, see ``core/access.py``).
    access: dict[str, Any] = Field(sa_type=JSONB, sa_column_kwargs={"server_default": sa.text(ACCESS_NONE)})
    # Transports (migrations 0017/0018): which provider speaks to the server, and its non-secret configuration.
    transport: str = Field(sa_type=TEXT, sa_column_kwargs=default("'mcp_http'"))
    transport_config: dict[str, Any] = Field(sa_type=JSONB, sa_column_kwargs=EMPTY_OBJECT)
    # Migration 0015: the environment variable the static credential comes from (``<PROVIDER>_MCP_TOKEN``).
    credential_env: str | None = Field(default=None, sa_type=TEXT)


class ConnectionToolSnapshot(SQLModel, table=True):
    """The tools a connection listed at one moment, numbered per connection."""

    __tablename__ = "connection_tool_snapshots"
    __table_args__ = (
        sa.UniqueConstraint("connection_id", "snapshot_version"),
        sa.CheckConstraint("snapshot_version > 0", name="connection_tool_snapshots_snapshot_version_check"),
    )

    id: uuid.UUID = Field(primary_key=True)
    connection_id: uuid.UUID = Field(foreign_key="integration_connections.id")
    snapshot_version: int
    authorization_generation: int
    protocol_version: str = Field(sa_type=TEXT)
    tools_json: list[dict[str, Any]] = Field(sa_type=JSONB)
    tools_digest: str = Field(sa_type=TEXT)
    discovered_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)


class RunResourceBinding(SQLModel, table=True):
    """A run's frozen choice of connection (and its tools) for one requirement slot."""

    __tablename__ = "run_resource_bindings"
    __table_args__ = (sa.UniqueConstraint("session_id", "slot_kind", "requirement_slot"),)

    id: uuid.UUID = Field(primary_key=True)
    tenant_id: uuid.UUID = Field(foreign_key="tenants.id")
    session_id: uuid.UUID = Field(foreign_key="sessions.id")
    requirement_slot: str = Field(sa_type=TEXT)
    slot_kind: str = Field(sa_type=TEXT, sa_column_kwargs=default("'mcp'"))
    connection_id: uuid.UUID = Field(foreign_key="integration_connections.id")
    authority_generation: int
    connection_owner_type: str = Field(sa_type=TEXT)
    snapshot_version: int
    effective_tools_json: list[dict[str, Any]] = Field(sa_type=JSONB)
    effective_tools_digest: str = Field(sa_type=TEXT)
    binding_mode: str = Field(sa_type=TEXT)
    created_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)
    connection_owner_user_id: uuid.UUID | None = Field(foreign_key="users.id")


class ToolExecutionClaim(SQLModel, table=True):
    """The once-only claim on executing one brokered tool call, and its settled result."""

    __tablename__ = "tool_execution_claims"

    session_id: uuid.UUID = Field(primary_key=True, foreign_key="sessions.id")
    tool_call_id: str = Field(primary_key=True, sa_type=TEXT)
    input_digest: str = Field(primary_key=True, sa_type=TEXT)
    binding_id: uuid.UUID = Field(foreign_key="run_resource_bindings.id")
    tool: str = Field(sa_type=TEXT)
    input: dict[str, Any] = Field(sa_type=JSONB)
    state: str = Field(sa_type=TEXT)
    attempts: int = Field(sa_column_kwargs=default("0"))
    result: Any = Field(sa_type=JSONB, nullable=True)
    error: str | None = Field(sa_type=TEXT)
    created_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)
    claimed_at: datetime | None = Field(sa_type=TIMESTAMPTZ)
    settled_at: datetime | None = Field(sa_type=TIMESTAMPTZ)


class ConnectionApprovedTool(SQLModel, table=True):
    """The last definition (description + input schema) of one tool an admin approved on a connection.

    A snapshot tool whose definition differs (or that has none here) is quarantined: runs do not bind it."""

    __tablename__ = "connection_approved_tools"

    connection_id: uuid.UUID = Field(primary_key=True, foreign_key="integration_connections.id")
    tool_name: str = Field(primary_key=True, sa_type=TEXT)
    definition: dict[str, Any] = Field(sa_type=JSONB)
    approved_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)
    approved_by: str = Field(sa_type=TEXT)
    change_id: uuid.UUID | None


class ConnectionToolChange(SQLModel, table=True):
    """A new or changed tool definition a refresh photographed, waiting for (or settled by) an admin."""

    __tablename__ = "connection_tool_changes"
    __table_args__ = (
        sa.CheckConstraint("kind IN ('added', 'changed')", name="connection_tool_changes_kind_check"),
        sa.CheckConstraint(
            "status IN ('pending', 'approved', 'rejected', 'superseded')", name="connection_tool_changes_status_check"
        ),
        sa.Index("connection_tool_changes_connection", "connection_id", "created_at"),
        sa.Index(
            "connection_tool_changes_one_pending",
            "connection_id",
            "tool_name",
            unique=True,
            postgresql_where=sa.text("status = 'pending'"),
        ),
    )

    id: uuid.UUID = Field(primary_key=True)
    tenant_id: uuid.UUID = Field(foreign_key="tenants.id")
    connection_id: uuid.UUID = Field(foreign_key="integration_connections.id")
    tool_name: str = Field(sa_type=TEXT)
    kind: str = Field(sa_type=TEXT)
    snapshot_version: int
    previous: dict[str, Any] | None = Field(sa_type=JSONB)
    proposed: dict[str, Any] = Field(sa_type=JSONB)
    status: str = Field(sa_type=TEXT, sa_column_kwargs=default("'pending'"))
    decided_by: str | None = Field(sa_type=TEXT)
    decided_by_user_id: uuid.UUID | None = Field(foreign_key="users.id")
    decided_at: datetime | None = Field(sa_type=TIMESTAMPTZ)
    created_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)
