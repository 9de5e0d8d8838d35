"""Policies: a named policy per tenant and its append-only numbered versions."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from core.errors import Conflict, NotFound
from db._base import Conn, ReadModel, Repository, fetch_model, fetch_models
from db.ids import new_id
from db.models.policies import Policy


class PolicyRef(ReadModel):
    """A policy named by id and name (what a delete answers)."""

    id: uuid.UUID
    name: str


class PolicyMeta(PolicyRef):
    """A policy at one version; ``updated_at`` is unset on a policy just created."""

    version: int
    updated_at: datetime | None = None


class PolicyHead(ReadModel):
    """A policy's highest version: what a run freezes."""

    policy_id: uuid.UUID
    name: str
    version: int
    content: dict[str, Any]


class PolicyListing(PolicyMeta):
    """A policy in the listing: its head and how many agents' latest revision names it."""

    content: dict[str, Any]
    agents_using: int


class VersionSummary(ReadModel):
    version: int
    author: str
    summary: str | None
    created_at: datetime
    content: dict[str, Any]


class PolicyDetail(ReadModel):
    """A policy, its versions (newest first) and the agents whose latest revision names it."""

    policy: Policy
    versions: list[VersionSummary]
    agents_using: list[str]


class NamedPolicyVersion(ReadModel):
    """One version of a policy, with the policy's name."""

    policy_id: uuid.UUID
    name: str
    version: int
    content: dict[str, Any]
    yaml_source: str | None
    summary: str | None
    author: str
    created_at: datetime


_HEAD = (
    "SELECT p.id AS policy_id, p.name, v.version, v.content FROM policies p "
    "JOIN policy_versions v ON v.policy_id = p.id "
)


async def _lock_by_name(conn: Conn, tenant_id: str, name: str) -> PolicyRef:
    policy = await fetch_model(
        conn,
        PolicyRef,
        "SELECT id, name FROM policies WHERE tenant_id = $1 AND name = $2 FOR UPDATE",
        uuid.UUID(tenant_id),
        name,
    )
    if policy is None:
        raise NotFound()
    return policy


class Policies(Repository):
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

    async def policy_head(self, tenant_id: str, name: str) -> PolicyHead | None:
        return await self.one(
            PolicyHead,
            f"{_HEAD} WHERE p.tenant_id = $1 AND p.name = $2 ORDER BY v.version DESC LIMIT 1",
            uuid.UUID(tenant_id),
            name,
        )

    async def policy_head_by_id(self, conn: Conn, policy_id: str) -> PolicyHead:
        row = await fetch_model(
            conn, PolicyHead, f"{_HEAD} WHERE p.id = $1 ORDER BY v.version DESC LIMIT 1", uuid.UUID(policy_id)
        )
        if row is None:
            raise NotFound("policy not found")
        return row

    async def policy_head_of(self, policy_id: str) -> PolicyHead:
        """The policy's head version, read on a connection of its own."""
        async with self.pool.acquire() as conn:
            return await self.policy_head_by_id(conn, policy_id)

    async def policy_names(self, tenant_id: str) -> dict[str, str]:
        async with self.pool.acquire() as conn:
            rows = await conn.fetch("SELECT id, name FROM policies WHERE tenant_id = $1", uuid.UUID(tenant_id))
            return {str(r["id"]): r["name"] for r in rows}

    async def import_policy(
        self, tenant_id: str, content: dict[str, Any], yaml_source: str | None
    ) -> tuple[PolicyMeta, bool]:
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
                meta = PolicyMeta(
                    id=policy["id"], name=policy["name"], version=head["version"], updated_at=policy["updated_at"]
                )
                return meta, False
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
            return PolicyMeta(id=policy["id"], name=policy["name"], version=version, updated_at=updated), True

    async def list_policies(self, tenant_id: str) -> list[PolicyListing]:
        """Every policy with its head version and content, and how many agents use it now."""
        return await self.many(
            PolicyListing,
            "SELECT p.id, p.name, p.updated_at, h.version, h.content,"
            " (SELECT count(*) FROM agents a WHERE a.tenant_id = p.tenant_id AND (SELECT r.policy_id"
            "  FROM agent_revisions r WHERE r.agent_id = a.id ORDER BY r.rev DESC LIMIT 1) = p.id)"
            " AS agents_using FROM policies p JOIN LATERAL (SELECT version, content FROM policy_versions v"
            " WHERE v.policy_id = p.id ORDER BY version DESC LIMIT 1) h ON true"
            " WHERE p.tenant_id = $1 ORDER BY p.name",
            uuid.UUID(tenant_id),
        )

    async def policy_detail(self, tenant_id: str, name: str) -> PolicyDetail | None:
        """Head, version history (newest first) and the agents whose latest revision names it."""
        async with self.pool.acquire() as conn:
            policy = await fetch_model(
                conn, Policy, "SELECT * FROM policies WHERE tenant_id = $1 AND name = $2", uuid.UUID(tenant_id), name
            )
            if policy is None:
                return None
            versions = await fetch_models(
                conn,
                VersionSummary,
                "SELECT version, author, summary, created_at, content FROM policy_versions"
                " WHERE policy_id = $1 ORDER BY version DESC",
                policy.id,
            )
            agents = await conn.fetch(
                "SELECT a.name FROM agents a WHERE a.tenant_id = $1 AND (SELECT r.policy_id FROM agent_revisions r"
                " WHERE r.agent_id = a.id ORDER BY r.rev DESC LIMIT 1) = $2 ORDER BY a.name",
                uuid.UUID(tenant_id),
                policy.id,
            )
        return PolicyDetail(policy=policy, versions=versions, agents_using=[r["name"] for r in agents])

    async def policy_version(self, tenant_id: str, name: str, version: int) -> NamedPolicyVersion | None:
        return await self.one(
            NamedPolicyVersion,
            "SELECT p.id AS policy_id, p.name, v.version, v.content, v.yaml_source, v.summary, v.author,"
            " v.created_at FROM policies p JOIN policy_versions v"
            " ON v.policy_id = p.id WHERE p.tenant_id = $1 AND p.name = $2 AND v.version = $3",
            uuid.UUID(tenant_id),
            name,
            version,
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
    ) -> PolicyMeta:
        """Optimistic publish: append head+1 only if the head is still ``base_version`` (409 otherwise)."""
        async with self.pool.acquire() as conn, conn.transaction():
            policy = await _lock_by_name(conn, tenant_id, name)
            head = await conn.fetchval("SELECT max(version) FROM policy_versions WHERE policy_id = $1", policy.id)
            if head != base_version:
                raise Conflict(
                    f"the policy moved to v{head} since this draft loaded v{base_version} — reload, "
                    "re-apply your edit, and publish again"
                )
            await conn.execute(
                "INSERT INTO policy_versions (id, policy_id, version, content, yaml_source, summary, author) "
                "VALUES ($1, $2, $3, $4, $5, $6, $7)",
                uuid.UUID(new_id()),
                policy.id,
                head + 1,
                content,
                yaml_source,
                summary,
                author,
            )
            updated = await conn.fetchval(
                "UPDATE policies SET updated_at = now() WHERE id = $1 RETURNING updated_at", policy.id
            )
            return PolicyMeta(id=policy.id, name=policy.name, version=head + 1, updated_at=updated)

    async def create_policy(self, tenant_id: str, content: dict[str, Any], summary: str, author: str) -> PolicyMeta:
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
            return PolicyMeta(id=pid, name=content["name"], version=1)

    async def delete_policy(self, tenant_id: str, name: str) -> PolicyRef:
        async with self.pool.acquire() as conn, conn.transaction():
            policy = await _lock_by_name(conn, tenant_id, name)
            users = await conn.fetchval("SELECT count(*) FROM agent_revisions WHERE policy_id = $1", policy.id)
            if users:
                raise Conflict(
                    f"'{name}' is still named by {users} agent revision(s) — including historical revisions, "
                    "which stay immutable. Point those agents at another policy; historical revisions keep it alive."
                )
            await conn.execute("DELETE FROM policies WHERE id = $1", policy.id)
            return policy
