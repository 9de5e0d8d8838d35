"""OAuth connect: our client identity at an authorization server, and one-time browser flows (migration 0011).

A dynamic (``dcr``) or metadata-document (``cimd``) registration is reused per (tenant, issuer, redirect
URI); a pre-registered one belongs to the connection it came with. A flow stores its state and browser
cookie as SHA-256 digests and its PKCE verifier sealed; ``consumed_at`` makes it single-use.
"""

import uuid
from datetime import datetime
from typing import Any, Literal

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from db.models._columns import BYTEA, JSONB, NOW, TEXT, TIMESTAMPTZ, default, one_of

RegistrationSource = Literal["dcr", "cimd", "preregistered"]
FlowPurpose = Literal["connection", "managed_app"]


class OAuthClientRegistration(SQLModel, table=True):
    """Our client id (and sealed secrets) at one authorization server."""

    __tablename__ = "oauth_client_registrations"
    __table_args__ = (
        sa.CheckConstraint(one_of("source", RegistrationSource), name="oauth_client_registrations_source_check"),
        sa.Index(
            "oauth_client_registrations_reuse",
            "tenant_id",
            "issuer",
            "redirect_uri",
            unique=True,
            postgresql_where=sa.text("source IN ('dcr', 'cimd')"),
        ),
    )

    id: uuid.UUID = Field(primary_key=True)
    tenant_id: uuid.UUID = Field(foreign_key="tenants.id")
    issuer: str = Field(sa_type=TEXT)
    redirect_uri: str = Field(sa_type=TEXT)
    source: RegistrationSource = Field(sa_type=TEXT)
    client_id: str = Field(sa_type=TEXT)
    token_endpoint_auth_method: str = Field(sa_type=TEXT, sa_column_kwargs=default("'none'"))
    client_secret_sealed: bytes | None = Field(sa_type=BYTEA)
    client_secret_key_id: str | None = Field(sa_type=TEXT)
    registration_access_token_sealed: bytes | None = Field(sa_type=BYTEA)
    registration_access_token_key_id: str | None = Field(sa_type=TEXT)
    registration_client_uri: str | None = Field(sa_type=TEXT)
    created_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)


class ConnectorOAuthFlow(SQLModel, table=True):
    """One browser leg of connecting (or reconnecting) an OAuth connection."""

    __tablename__ = "connector_oauth_flows"
    __table_args__ = (
        sa.Index("connector_oauth_flows_connection", "connection_id", "created_at"),
        sa.CheckConstraint(one_of("purpose", FlowPurpose), name="connector_oauth_flows_purpose_check"),
    )

    id: uuid.UUID = Field(primary_key=True)
    tenant_id: uuid.UUID = Field(foreign_key="tenants.id")
    connection_id: uuid.UUID = Field(foreign_key="integration_connections.id")
    registration_id: uuid.UUID = Field(foreign_key="oauth_client_registrations.id")
    state_hash: str = Field(sa_type=TEXT, unique=True)
    browser_hash: str | None = Field(sa_type=TEXT)
    pkce_verifier_sealed: bytes = Field(sa_type=BYTEA)
    pkce_verifier_key_id: str = Field(sa_type=TEXT)
    resource: str = Field(sa_type=TEXT)
    discovery: dict[str, Any] = Field(sa_type=JSONB)
    expected_generation: int
    created_by_user_id: uuid.UUID | None
    created_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)
    expires_at: datetime = Field(sa_type=TIMESTAMPTZ)
    consumed_at: datetime | None = Field(sa_type=TIMESTAMPTZ)
    # Which callback may claim the flow (migration 0013): the connector one, or the managed-app one.
    purpose: FlowPurpose = Field(sa_type=TEXT, sa_column_kwargs=default("'connection'"))
    # The flow's sign-in link (migration 0015), reused while the flow is pending (``/v1/connections/authorize``).
    challenge_url: str | None = Field(default=None, sa_type=TEXT)
