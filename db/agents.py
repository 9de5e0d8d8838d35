"""Agents: a named agent per tenant and its append-only revisions (what a run freezes)."""

from __future__ import annotations

import uuid
from typing import Any

from core.errors import Conflict
from db._base import Conn, Repository, as_model, fetch_model
from db.ids import new_id
from db.models.agents import Agent, AgentRevision


class Agents(Repository):
    # What a revision configures: every column but its identity and its place in the agent's history.
    _REVISION_COLUMNS = tuple(
        f for f in AgentRevision.model_fields if f not in ("id", "tenant_id", "agent_id", "rev", "created_at")
    )
    _POLICY_ID = _REVISION_COLUMNS.index("policy_id")

    async def _insert_revision(
        self, conn: Conn, tenant_id: str, agent_id: str, fields: dict[str, Any]
    ) -> AgentRevision:
        rev = await conn.fetchval(
            "SELECT coalesce(max(rev), 0) + 1 FROM agent_revisions WHERE agent_id = $1", uuid.UUID(agent_id)
        )
        cols = ", ".join(self._REVISION_COLUMNS)
        params = ", ".join(f"${i}" for i in range(5, 5 + len(self._REVISION_COLUMNS)))
        defaults: dict[str, Any] = {
            "harness_config": {},
            "capability_bundles": [],
            "connection_requirements": [],
            "tool_discovery": "eager",
        }
        values = [fields.get(c) if fields.get(c) is not None else defaults.get(c) for c in self._REVISION_COLUMNS]
        values[self._POLICY_ID] = uuid.UUID(str(values[self._POLICY_ID]))
        record = await conn.fetchrow(
            f"INSERT INTO agent_revisions (id, tenant_id, agent_id, rev, {cols}) "
            f"VALUES ($1, $2, $3, $4, {params}) RETURNING *",
            uuid.UUID(new_id()),
            uuid.UUID(tenant_id),
            uuid.UUID(agent_id),
            rev,
            *values,
        )
        revision = as_model(AgentRevision, record)
        assert revision is not None  # INSERT … RETURNING always answers a row
        return revision

    async def create_agent(
        self, tenant_id: str, name: str, description: str | None, fields: dict[str, Any]
    ) -> tuple[Agent, AgentRevision]:
        async with self.pool.acquire() as conn, conn.transaction():
            agent = await fetch_model(
                conn,
                Agent,
                "INSERT INTO agents (id, tenant_id, name, description) VALUES ($1, $2, $3, $4) "
                "ON CONFLICT (tenant_id, name) DO NOTHING RETURNING *",
                uuid.UUID(new_id()),
                uuid.UUID(tenant_id),
                name,
                description,
            )
            if agent is None:
                raise Conflict(f"an agent named '{name}' already exists")
            revision = await self._insert_revision(conn, tenant_id, str(agent.id), fields)
            return agent, revision

    async def list_agents(self, tenant_id: str) -> list[Agent]:
        return await self.many(Agent, "SELECT * FROM agents WHERE tenant_id = $1 ORDER BY name", uuid.UUID(tenant_id))

    async def find_agent(self, tenant_id: str, ref: str) -> Agent | None:
        async with self.pool.acquire() as conn:
            return await self._find_agent(conn, tenant_id, ref)

    async def _find_agent(self, conn: Conn, tenant_id: str, ref: str) -> Agent | None:
        try:
            agent_id: uuid.UUID | None = uuid.UUID(ref)
        except ValueError:
            agent_id = None
        if agent_id is not None:
            found = await conn.fetchrow(
                "SELECT * FROM agents WHERE tenant_id = $1 AND id = $2", uuid.UUID(tenant_id), agent_id
            )
            if found is not None:
                return as_model(Agent, found)
        return await fetch_model(
            conn, Agent, "SELECT * FROM agents WHERE tenant_id = $1 AND name = $2", uuid.UUID(tenant_id), ref
        )

    async def revisions(self, agent_id: str) -> list[AgentRevision]:
        return await self.many(
            AgentRevision, "SELECT * FROM agent_revisions WHERE agent_id = $1 ORDER BY rev", uuid.UUID(agent_id)
        )

    async def latest_revision(self, conn: Conn, agent_id: str) -> AgentRevision | None:
        return await fetch_model(
            conn,
            AgentRevision,
            "SELECT * FROM agent_revisions WHERE agent_id = $1 ORDER BY rev DESC LIMIT 1",
            uuid.UUID(agent_id),
        )

    async def latest_revision_of(self, agent_id: str) -> AgentRevision | None:
        """The agent's latest revision, read on a connection of its own."""
        async with self.pool.acquire() as conn:
            return await self.latest_revision(conn, agent_id)

    async def append_revision(self, tenant_id: str, agent_id: str, changes: dict[str, Any]) -> AgentRevision:
        """Omitted fields inherit from the latest revision; the revision itself is never edited."""
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT id FROM agents WHERE id = $1 FOR UPDATE", uuid.UUID(agent_id))
            latest = await self.latest_revision(conn, agent_id)
            base = latest.model_dump(include=set(self._REVISION_COLUMNS)) if latest else {}
            base.update(changes)
            return await self._insert_revision(conn, tenant_id, agent_id, base)
