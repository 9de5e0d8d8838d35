"""Bearer tokens of every kind, stored as sha256 only.

``kind`` tells them apart: run-scoped tokens (a ``session_id`` and an ``audience``: runner, llm…),
trigger tokens (a ``subscription_id``, no run, never expiring until revoked) and personal access
tokens (``pat``: a membership, a user, a name and a display prefix). The CHECKs keep each shape.
"""

import uuid
from datetime import datetime

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from db.models._columns import NOW, TEXT, TIMESTAMPTZ


class ApiToken(SQLModel, table=True):
    """One issued token: what it may do (kind, audience), whose it is, and when it stops working."""

    __tablename__ = "api_tokens"
    __table_args__ = (
        sa.CheckConstraint(
            "kind <> 'trigger' OR (subscription_id IS NOT NULL AND session_id IS NULL)",
            name="api_tokens_trigger_shape",
        ),
        sa.CheckConstraint(
            "kind <> 'pat' OR (membership_id IS NOT NULL AND user_id IS NOT NULL AND name IS NOT NULL"
            " AND display_prefix IS NOT NULL AND session_id IS NULL AND subscription_id IS NULL)",
            name="api_tokens_pat_shape",
        ),
        sa.Index("api_tokens_session", "session_id", "audience"),
        sa.Index("api_tokens_subscription", "subscription_id", postgresql_where=sa.text("subscription_id IS NOT NULL")),
        sa.Index("api_tokens_membership", "membership_id", postgresql_where=sa.text("membership_id IS NOT NULL")),
    )

    id: uuid.UUID = Field(primary_key=True)
    token_sha256: str = Field(sa_type=TEXT, unique=True)
    tenant_id: uuid.UUID = Field(foreign_key="tenants.id")
    kind: str = Field(sa_type=TEXT)
    session_id: uuid.UUID | None = Field(foreign_key="sessions.id")
    audience: str = Field(sa_type=TEXT)
    expires_at: datetime = Field(sa_type=TIMESTAMPTZ)
    revoked_at: datetime | None = Field(sa_type=TIMESTAMPTZ)
    created_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)
    subscription_id: uuid.UUID | None = Field(foreign_key="trigger_subscriptions.id")
    membership_id: uuid.UUID | None = Field(foreign_key="org_memberships.id")
    user_id: uuid.UUID | None = Field(foreign_key="users.id")
    name: str | None = Field(sa_type=TEXT)
    display_prefix: str | None = Field(sa_type=TEXT)
    last_used_at: datetime | None = Field(sa_type=TIMESTAMPTZ)
