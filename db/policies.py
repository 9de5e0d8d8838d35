"""Policies: a named policy per tenant and its append-only numbered versions."""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg

from core.errors import Conflict, NotFound
from db._base import Conn, Row, as_row, as_rows
from db.ids import new_id


class Policies:
    def __init__(self, pool: asyncpg.Pool[Any]) -> None:
        self.pool = pool

    async def seed_policy(self, tenant_id: str, content: dict[str, Any], yaml_source: str | None) -> None:
        """Create a seeded policy at v1 if it does not exist yet (operator edits are never overwritten)."""
        async with self.pool.acquire() as conn, conn.transaction():
            pid = uuid.UUID(new_id())
            inserted = await conn.fetchval(
                "INSERT INTO policies (id, tenant_id, name) VALUES ($1, $2, $3) "
                "ON CONFLICT (tenant_id, name) DO NOTHING RETURNING id",
                pid,
                uuid.UUID(tenant_id),
                content["name"],
            )
            if inserted is not None:
                await conn.execute(
                    "INSERT INTO policy_versions (id, policy_id, version, content, yaml_source, summary, author) "
                    "VALUES ($1, $2, 1, $3, $4, 'seeded', 'seed')",
                    uuid.UUID(new_id()),
                    pid,
                    content,
                    yaml_source,
                )

    async def policy_head(self, tenant_id: str, name: str) -> Row | None:
        async with self.pool.acquire() as conn:
            return as_row(
                await conn.fetchrow(
                    "SELECT p.id AS policy_id, p.name, v.version, v.content FROM policies p "
                    "JOIN policy_versions v ON v.policy_id = p.id WHERE p.tenant_id = $1 AND p.name = $2 "
                    "ORDER BY v.version DESC LIMIT 1",
                    uuid.UUID(tenant_id),
                    name,
                )
            )

    async def policy_head_by_id(self, conn: Conn, policy_id: str) -> Row:
        row = as_row(
            await conn.fetchrow(
                "SELECT p.id AS policy_id, p.name, v.version, v.content FROM policies p "
                "JOIN policy_versions v ON v.policy_id = p.id WHERE p.id = $1 ORDER BY v.version DESC LIMIT 1",
                uuid.UUID(policy_id),
            )
        )
        if row is None:
            raise NotFound("policy not found")
        return row

    async def policy_names(self, tenant_id: str) -> dict[str, str]:
        async with self.pool.acquire() as conn:
            rows = await conn.fetch("SELECT id, name FROM policies WHERE tenant_id = $1", uuid.UUID(tenant_id))
            return {str(r["id"]): r["name"] for r in rows}

    async def import_policy(self, tenant_id: str, content: dict[str, Any], yaml_source: str | None) -> tuple[Row, bool]:
        """Create the policy or append a version; byte-equal content appends nothing."""
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "INSERT INTO policies (id, tenant_id, name) VALUES ($1, $2, $3) "
                "ON CONFLICT (tenant_id, name) DO NOTHING",
                uuid.UUID(new_id()),
                uuid.UUID(tenant_id),
                content["name"],
            )
            policy = await conn.fetchrow(
                "SELECT * FROM policies WHERE tenant_id = $1 AND name = $2 FOR UPDATE",
                uuid.UUID(tenant_id),
                content["name"],
            )
            head = await conn.fetchrow(
                "SELECT version, content FROM policy_versions WHERE policy_id = $1 ORDER BY version DESC LIMIT 1",
                policy["id"],
            )
            if head is not None and head["content"] == content:
                row = {"id": str(policy["id"]), "name": policy["name"], "version": head["version"]}
                return {**row, "updated_at": policy["updated_at"]}, False
            version = (head["version"] if head else 0) + 1
            await conn.execute(
                "INSERT INTO policy_versions (id, policy_id, version, content, yaml_source, summary, author) "
                "VALUES ($1, $2, $3, $4, $5, 'imported', 'api')",
                uuid.UUID(new_id()),
                policy["id"],
                version,
                content,
                yaml_source,
            )
            updated = await conn.fetchval(
                "UPDATE policies SET updated_at = now() WHERE id = $1 RETURNING updated_at", policy["id"]
            )
            return {"id": str(policy["id"]), "name": policy["name"], "version": version, "updated_at": updated}, True

    async def list_policies(self, tenant_id: str) -> list[Row]:
        """Every policy with its head version and content, and how many agents use it now."""
        async with self.pool.acquire() as conn:
            return as_rows(
                await conn.fetch(
                    "SELECT p.id, p.name, p.updated_at, h.version, h.content,"
                    " (SELECT count(*) FROM agents a WHERE a.tenant_id = p.tenant_id AND (SELECT r.policy_id"
                    "  FROM agent_revisions r WHERE r.agent_id = a.id ORDER BY r.rev DESC LIMIT 1) = p.id)"
                    " AS agents_using FROM policies p JOIN LATERAL (SELECT version, content FROM policy_versions v"
                    " WHERE v.policy_id = p.id ORDER BY version DESC LIMIT 1) h ON true"
                    " WHERE p.tenant_id = $1 ORDER BY p.name",
                    uuid.UUID(tenant_id),
                )
            )

    async def policy_detail(self, tenant_id: str, name: str) -> Row | None:
        """Head, version history (newest first) and the agents whose latest revision names it."""
        async with self.pool.acquire() as conn:
            policy = as_row(
                await conn.fetchrow(
                    "SELECT * FROM policies WHERE tenant_id = $1 AND name = $2", uuid.UUID(tenant_id), name
                )
            )
            if policy is None:
                return None
            versions = as_rows(
                await conn.fetch(
                    "SELECT version, author, summary, created_at, content FROM policy_versions"
                    " WHERE policy_id = $1 ORDER BY version DESC",
                    uuid.UUID(policy["id"]),
                )
            )
            agents = await conn.fetch(
                "SELECT a.name FROM agents a WHERE a.tenant_id = $1 AND (SELECT r.policy_id FROM agent_revisions r"
                " WHERE r.agent_id = a.id ORDER BY r.rev DESC LIMIT 1) = $2 ORDER BY a.name",
                uuid.UUID(tenant_id),
                uuid.UUID(policy["id"]),
            )
        return {**policy, "versions": versions, "agents_using": [r["name"] for r in agents]}

    async def policy_version(self, tenant_id: str, name: str, version: int) -> Row | None:
        async with self.pool.acquire() as conn:
            return as_row(
                await conn.fetchrow(
                    "SELECT p.id AS policy_id, p.name, v.* FROM policies p JOIN policy_versions v"
                    " ON v.policy_id = p.id WHERE p.tenant_id = $1 AND p.name = $2 AND v.version = $3",
                    uuid.UUID(tenant_id),
                    name,
                    version,
                )
            )

    async def append_policy_version(
        self,
        tenant_id: str,
        name: str,
        content: dict[str, Any],
        *,
        base_version: int,
        summary: str,
        author: str,
        yaml_source: str | None = None,
    ) -> Row:
        """Optimistic publish: append head+1 only if the head is still ``base_version`` (409 otherwise)."""
        async with self.pool.acquire() as conn, conn.transaction():
            policy = await conn.fetchrow(
                "SELECT id, name FROM policies WHERE tenant_id = $1 AND name = $2 FOR UPDATE",
                uuid.UUID(tenant_id),
                name,
            )
            if policy is None:
                raise NotFound()
            head = await conn.fetchval("SELECT max(version) FROM policy_versions WHERE policy_id = $1", policy["id"])
            if head != base_version:
                raise Conflict(
                    f"the policy moved to v{head} since this draft loaded v{base_version} — reload, "
                    "re-apply your edit, and publish again"
                )
            await conn.execute(
                "INSERT INTO policy_versions (id, policy_id, version, content, yaml_source, summary, author) "
                "VALUES ($1, $2, $3, $4, $5, $6, $7)",
                uuid.UUID(new_id()),
                policy["id"],
                head + 1,
                content,
                yaml_source,
                summary,
                author,
            )
            updated = await conn.fetchval(
                "UPDATE policies SET updated_at = now() WHERE id = $1 RETURNING updated_at", policy["id"]
            )
            return {"id": str(policy["id"]), "name": policy["name"], "version": head + 1, "updated_at": updated}

    async def create_policy(self, tenant_id: str, content: dict[str, Any], summary: str, author: str) -> Row:
        """A new policy identity with its v1 (409 when the name exists)."""
        async with self.pool.acquire() as conn, conn.transaction():
            pid = await conn.fetchval(
                "INSERT INTO policies (id, tenant_id, name) VALUES ($1, $2, $3) "
                "ON CONFLICT (tenant_id, name) DO NOTHING RETURNING id",
                uuid.UUID(new_id()),
                uuid.UUID(tenant_id),
                content["name"],
            )
            if pid is None:
                raise Conflict(f"a policy named '{content['name']}' already exists")
            await conn.execute(
                "INSERT INTO policy_versions (id, policy_id, version, content, summary, author) "
                "VALUES ($1, $2, 1, $3, $4, $5)",
                uuid.UUID(new_id()),
                pid,
                content,
                summary,
                author,
            )
            return {"id": str(pid), "name": content["name"], "version": 1}

    async def delete_policy(self, tenant_id: str, name: str) -> Row:
        async with self.pool.acquire() as conn, conn.transaction():
            policy = await conn.fetchrow(
                "SELECT id, name FROM policies WHERE tenant_id = $1 AND name = $2 FOR UPDATE",
                uuid.UUID(tenant_id),
                name,
            )
            if policy is None:
                raise NotFound()
            users = await conn.fetchval("SELECT count(*) FROM agent_revisions WHERE policy_id = $1", policy["id"])
            if users:
                raise Conflict(
                    f"'{name}' is still named by {users} agent revision(s) — including historical revisions, "
                    "which stay immutable. Point those agents at another policy; historical revisions keep it alive."
                )
            await conn.execute("DELETE FROM policies WHERE id = $1", policy["id"])
            return {"id": str(policy["id"]), "name": policy["name"]}
