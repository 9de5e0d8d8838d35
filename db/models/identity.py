"""Tenancy and identity: orgs (``tenants``), users, org memberships and the auth audit log.

A user belongs to one tenant; the membership row carries the roles and is the kill switch for every
PAT and personal connection of its member. ``auth_audit_log`` is append-only: a trigger in migration
0008 refuses UPDATE, DELETE and TRUNCATE (triggers are not part of the models).
"""

import uuid
from datetime import datetime
from typing import Any, Literal

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from db.models._columns import (
    EMPTY_OBJECT,
    FALSE,
    JSONB,
    NOW,
    TEXT,
    TEXT_ARRAY,
    TIMESTAMPTZ,
    default,
    one_of,
)

TenantStatus = Literal["active", "suspended"]
UserStatus = Literal["active", "deactivated"]
MembershipStatus = Literal["active", "deactivated"]
ActorKind = Literal["operator", "user", "system"]
ROLES = ("member", "approver", "admin", "owner")


class Tenant(SQLModel, table=True):
    """An organization: every other row belongs to exactly one."""

    __tablename__ = "tenants"
    __table_args__ = (sa.CheckConstraint(one_of("status", TenantStatus), name="tenants_status_check"),)

    id: uuid.UUID = Field(primary_key=True)
    name: str = Field(sa_type=TEXT, unique=True)
    slug: str = Field(sa_type=TEXT, unique=True)
    created_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)
    display_name: str | None = Field(sa_type=TEXT)
    status: TenantStatus = Field(sa_type=TEXT, sa_column_kwargs=default("'active'"))


class User(SQLModel, table=True):
    """A person of one tenant: local (unique by email) until an IdP identity is attached."""

    __tablename__ = "users"
    __table_args__ = (
        # The pair is the target of org_memberships' composite key: a membership names a user of its tenant.
        sa.UniqueConstraint("tenant_id", "id"),
        sa.CheckConstraint("(idp_config_id IS NULL) = (subject IS NULL)", name="users_check"),
        sa.CheckConstraint(one_of("status", UserStatus), name="users_status_check"),
        sa.Index(
            "users_local_email",
            "tenant_id",
            "email_normalized",
            unique=True,
            postgresql_where=sa.text("idp_config_id IS NULL"),
        ),
        sa.Index(
            "users_idp_subject",
            "tenant_id",
            "idp_config_id",
            "subject",
            unique=True,
            postgresql_where=sa.text("idp_config_id IS NOT NULL"),
        ),
    )

    id: uuid.UUID = Field(primary_key=True)
    tenant_id: uuid.UUID = Field(foreign_key="tenants.id")
    idp_config_id: uuid.UUID | None
    subject: str | None = Field(sa_type=TEXT)
    email: str = Field(sa_type=TEXT)
    email_normalized: str = Field(sa_type=TEXT)
    email_verified: bool = Field(sa_column_kwargs=FALSE)
    name: str = Field(sa_type=TEXT)
    status: UserStatus = Field(sa_type=TEXT, sa_column_kwargs=default("'active'"))
    last_login_at: datetime | None = Field(sa_type=TIMESTAMPTZ)
    created_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)
    updated_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)


class OrgMembership(SQLModel, table=True):
    """A user's membership of their tenant: roles, and the switch that cuts all their authority."""

    __tablename__ = "org_memberships"
    __table_args__ = (
        sa.UniqueConstraint("tenant_id", "user_id"),
        sa.ForeignKeyConstraint(["tenant_id", "user_id"], ["users.tenant_id", "users.id"]),
        sa.CheckConstraint(
            "cardinality(roles) > 0 AND roles <@ ARRAY[" + ", ".join(f"'{r}'" for r in ROLES) + "]::text[]",
            name="org_memberships_roles_check",
        ),
        sa.CheckConstraint(one_of("status", MembershipStatus), name="org_memberships_status_check"),
    )

    id: uuid.UUID = Field(primary_key=True)
    tenant_id: uuid.UUID = Field(foreign_key="tenants.id")
    user_id: uuid.UUID
    roles: list[str] = Field(sa_type=TEXT_ARRAY, sa_column_kwargs=default("'{member}'"))
    status: MembershipStatus = Field(sa_type=TEXT, sa_column_kwargs=default("'active'"))
    deactivated_at: datetime | None = Field(sa_type=TIMESTAMPTZ)
    created_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)
    updated_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)


class AuthAuditLog(SQLModel, table=True):
    """One authentication or authorization event (append-only)."""

    __tablename__ = "auth_audit_log"
    __table_args__ = (sa.CheckConstraint(one_of("actor_kind", ActorKind), name="auth_audit_log_actor_kind_check"),)

    id: uuid.UUID = Field(primary_key=True)
    tenant_id: uuid.UUID | None = Field(foreign_key="tenants.id")
    actor_kind: ActorKind = Field(sa_type=TEXT)
    actor_id: str | None = Field(sa_type=TEXT)
    action: str = Field(sa_type=TEXT)
    target: str | None = Field(sa_type=TEXT)
    success: bool
    detail: dict[str, Any] = Field(sa_type=JSONB, sa_column_kwargs=EMPTY_OBJECT)
    created_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)
