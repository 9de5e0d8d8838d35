"""Agents: a named agent per tenant and its append-only revisions (what a run freezes)."""

import uuid
from datetime import datetime
from typing import Any, Literal

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from db.models._columns import EMPTY_ARRAY, EMPTY_OBJECT, JSONB, NOW, TEXT, TIMESTAMPTZ, default, one_of

ToolDiscovery = Literal["eager", "deferred", "auto"]


class Agent(SQLModel, table=True):
    """An agent's identity; its configuration lives in revisions."""

    __tablename__ = "agents"
    __table_args__ = (sa.UniqueConstraint("tenant_id", "name"),)

    id: uuid.UUID = Field(primary_key=True)
    tenant_id: uuid.UUID = Field(foreign_key="tenants.id")
    name: str = Field(sa_type=TEXT)
    description: str | None = Field(sa_type=TEXT)
    created_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)


class AgentRevision(SQLModel, table=True):
    """One immutable configuration of an agent: harness, model, policy, budgets, capabilities."""

    __tablename__ = "agent_revisions"
    __table_args__ = (
        sa.UniqueConstraint("agent_id", "rev"),
        sa.CheckConstraint("rev > 0", name="agent_revisions_rev_check"),
        sa.CheckConstraint(one_of("tool_discovery", ToolDiscovery), name="agent_revisions_tool_discovery_check"),
    )

    id: uuid.UUID = Field(primary_key=True)
    tenant_id: uuid.UUID = Field(foreign_key="tenants.id")
    agent_id: uuid.UUID = Field(foreign_key="agents.id")
    rev: int
    harness: str = Field(sa_type=TEXT)
    runner_image: str | None = Field(sa_type=TEXT)
    model: str = Field(sa_type=TEXT)
    system_prompt: str | None = Field(sa_type=TEXT)
    policy_id: uuid.UUID = Field(foreign_key="policies.id")
    budgets: dict[str, Any] | None = Field(sa_type=JSONB)
    harness_config: dict[str, Any] = Field(sa_type=JSONB, sa_column_kwargs=EMPTY_OBJECT)
    capability_bundles: list[Any] = Field(sa_type=JSONB, sa_column_kwargs=EMPTY_ARRAY)
    default_workspace: dict[str, Any] | None = Field(sa_type=JSONB)
    connection_requirements: list[Any] = Field(sa_type=JSONB, sa_column_kwargs=EMPTY_ARRAY)
    network: dict[str, Any] | None = Field(sa_type=JSONB)
    # How runs see brokered tools: every schema, or tool_search/describe/call (auto: deferred above a threshold).
    tool_discovery: ToolDiscovery = Field(sa_type=TEXT, sa_column_kwargs=default("'eager'"))
    created_at: datetime = Field(sa_type=TIMESTAMPTZ, sa_column_kwargs=NOW)
