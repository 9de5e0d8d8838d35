"""The connector catalog: curated global entries (seeded) and tenant custom entries."""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg

from core.access import READ_ONLY, parse_access
from core.errors import Conflict
from db._base import Conn, Repository, as_model
from db.ids import new_id
from db.models.catalog import ConnectorCatalogEntry

COLUMNS = (
    "slug", "name", "icon", "description", "categories", "url", "transport", "auth_mode", "auth_hints", "scopes",
    "tool_hints", "sandbox_launch", "access", "transport_config",
)  # fmt: skip
DEFAULTS: dict[str, Any] = {"categories": [], "auth_hints": {}, "scopes": [], "tool_hints": [], "access": READ_ONLY}


def duplicate_slug(slug: str) -> str:
    return f"a catalog entry with slug '{slug}' already exists"


class Catalog(Repository):
    def _values(self, entry: dict[str, Any]) -> list[Any]:
        values = {c: entry.get(c) if entry.get(c) is not None else DEFAULTS.get(c) for c in COLUMNS}
        values["access"] = parse_access(values["access"], f"catalog entry '{entry.get('slug')}'.access")
        return list(values.values())

    async def seed(self, entries: list[dict[str, Any]]) -> None:
        """Curated entries are global and refreshed from the shipped file on every boot."""
        cols = ", ".join(COLUMNS)
        params = ", ".join(f"${i}" for i in range(2, 2 + len(COLUMNS)))
        updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in COLUMNS if c != "slug")
        async with self.pool.acquire() as conn, conn.transaction():
            for entry in entries:
                await conn.execute(
                    f"INSERT INTO connector_catalog (id, {cols}, tier) VALUES ($1, {params}, 'verified') "
                    f"ON CONFLICT (slug) WHERE tenant_id IS NULL DO UPDATE SET {updates}",
                    uuid.UUID(new_id()),
                    *self._values(entry),
                )

    async def create_custom(self, tenant_id: str, entry: dict[str, Any]) -> ConnectorCatalogEntry:
        """A tenant's custom entry; a slug already used globally or by this tenant is a ``Conflict``.

        The pre-check names the common case; the unique indexes decide a race between two creates of
        one slug (the loser's insert fails and is the same 409, never a 500).
        """
        cols = ", ".join(COLUMNS)
        params = ", ".join(f"${i}" for i in range(3, 3 + len(COLUMNS)))
        duplicate = Conflict(duplicate_slug(entry["slug"]))
        try:
            async with self.pool.acquire() as conn, conn.transaction():
                if await self._taken(conn, tenant_id, entry["slug"]):
                    raise duplicate
                row = as_model(
                    ConnectorCatalogEntry,
                    await conn.fetchrow(
                        f"INSERT INTO connector_catalog (id, tenant_id, {cols}, tier) "
                        f"VALUES ($1, $2, {params}, 'custom') RETURNING *",
                        uuid.UUID(new_id()),
                        uuid.UUID(tenant_id),
                        *self._values(entry),
                    ),
                )
        except asyncpg.UniqueViolationError:
            raise duplicate from None
        assert row is not None
        return row

    @staticmethod
    async def _taken(conn: Conn, tenant_id: str, slug: str) -> bool:
        found = await conn.fetchval(
            "SELECT 1 FROM connector_catalog WHERE slug = $1 AND (tenant_id IS NULL OR tenant_id = $2)",
            slug,
            uuid.UUID(tenant_id),
        )
        return bool(found)

    async def slug_taken(self, tenant_id: str, slug: str) -> bool:
        """Whether ``slug`` is used globally or by this tenant (disabled entries included)."""
        async with self.pool.acquire() as conn:
            return await self._taken(conn, tenant_id, slug)

    async def delete(self, entry_id: uuid.UUID) -> None:
        """Used only to undo a one-call create whose connect failed (no orphan entry)."""
        await self.execute("DELETE FROM connector_catalog WHERE id = $1 AND tier = 'custom'", entry_id)

    async def visible(self, tenant_id: str) -> list[ConnectorCatalogEntry]:
        return await self.many(
            ConnectorCatalogEntry,
            "SELECT * FROM connector_catalog WHERE disabled_at IS NULL "
            "AND (tenant_id IS NULL OR tenant_id = $1) ORDER BY tier <> 'verified', slug",
            uuid.UUID(tenant_id),
        )

    async def get(self, tenant_id: str, slug: str) -> ConnectorCatalogEntry | None:
        return await self.one(
            ConnectorCatalogEntry,
            "SELECT * FROM connector_catalog WHERE slug = $1 AND disabled_at IS NULL "
            "AND (tenant_id IS NULL OR tenant_id = $2)",
            slug,
            uuid.UUID(tenant_id),
        )
