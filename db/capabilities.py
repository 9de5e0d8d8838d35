"""Capability bundles: versioned definitions of sandbox-class MCP servers (append-only)."""

from __future__ import annotations

import uuid
from typing import Any

from db._base import Repository, as_model, as_models, uuid_or_none
from db.ids import new_id
from db.models.capabilities import CapabilityBundle


class Capabilities(Repository):
    async def publish(
        self, tenant_id: str, name: str, description: str | None, definition: Any, digest: str
    ) -> CapabilityBundle:
        """Append version max+1 of ``name`` (v1 for a new name), under a per-name advisory lock."""
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1 || ':' || $2))", tenant_id, name)
            version = await conn.fetchval(
                "SELECT coalesce(max(version), 0) + 1 FROM capability_bundles WHERE tenant_id = $1 AND name = $2",
                uuid.UUID(tenant_id),
                name,
            )
            row = as_model(
                CapabilityBundle,
                await conn.fetchrow(
                    "INSERT INTO capability_bundles (id, tenant_id, name, version, description, definition, "
                    "definition_digest) VALUES ($1,$2,$3,$4,$5,$6,$7) RETURNING *",
                    uuid.UUID(new_id()),
                    uuid.UUID(tenant_id),
                    name,
                    version,
                    description,
                    definition,
                    digest,
                ),
            )
            assert row is not None
            return row

    async def all(self, tenant_id: str) -> list[CapabilityBundle]:
        return await self.many(
            CapabilityBundle,
            "SELECT * FROM capability_bundles WHERE tenant_id = $1 ORDER BY name, version DESC",
            uuid.UUID(tenant_id),
        )

    async def get(self, tenant_id: str, bundle_id: str) -> CapabilityBundle | None:
        bid = uuid_or_none(bundle_id)
        if bid is None:
            return None
        return await self.one(
            CapabilityBundle,
            "SELECT * FROM capability_bundles WHERE tenant_id = $1 AND id = $2",
            uuid.UUID(tenant_id),
            bid,
        )

    async def resolve(self, tenant_id: str, name: str, version: int | None) -> CapabilityBundle | None:
        """``name`` → its newest version now; ``name@N`` → exactly N."""
        return await self.one(
            CapabilityBundle,
            "SELECT * FROM capability_bundles WHERE tenant_id = $1 AND name = $2 "
            "AND ($3::int IS NULL OR version = $3) ORDER BY version DESC LIMIT 1",
            uuid.UUID(tenant_id),
            name,
            version,
        )

    async def newest(self, tenant_id: str, names: list[str]) -> dict[str, tuple[str, int]]:
        """The newest version of each of ``names`` that has one: name → (bundle id, version), no definitions."""
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT DISTINCT ON (name) name, id, version FROM capability_bundles"
                " WHERE tenant_id = $1 AND name = ANY($2::text[]) ORDER BY name, version DESC",
                uuid.UUID(tenant_id),
                names,
            )
        return {r["name"]: (str(r["id"]), int(r["version"])) for r in rows}

    async def by_ids(self, ids: list[str]) -> dict[str, CapabilityBundle]:
        """The bundles of ``ids``, by id text."""
        if not ids:
            return {}
        async with self.pool.acquire() as conn:
            rows = as_models(
                CapabilityBundle,
                await conn.fetch(
                    "SELECT * FROM capability_bundles WHERE id = ANY($1::uuid[])", [uuid.UUID(i) for i in ids]
                ),
            )
        return {str(r.id): r for r in rows}
