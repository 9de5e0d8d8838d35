"""The connector catalog: curated global entries (seeded) and tenant custom entries."""

from __future__ import annotations

import uuid
from typing import Any

from core.errors import Conflict
from db.ids import new_id
from db.store import Row, Store, _row, _rows

COLUMNS = (
    "slug", "name", "icon", "description", "categories", "url", "transport", "auth_mode", "auth_hints", "scopes",
    "tool_hints", "sandbox_launch",
)  # fmt: skip
DEFAULTS: dict[str, Any] = {"categories": [], "auth_hints": {}, "scopes": [], "tool_hints": []}


class Catalog:
    def __init__(self, store: Store) -> None:
        self.pool = store.pool

    def _values(self, entry: dict[str, Any]) -> list[Any]:
        return [entry.get(c) if entry.get(c) is not None else DEFAULTS.get(c) for c in COLUMNS]

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

    async def create_custom(self, tenant_id: str, entry: dict[str, Any]) -> Row:
        cols = ", ".join(COLUMNS)
        params = ", ".join(f"${i}" for i in range(3, 3 + len(COLUMNS)))
        async with self.pool.acquire() as conn, conn.transaction():
            clash = await conn.fetchval(
                "SELECT 1 FROM connector_catalog WHERE slug = $1 AND (tenant_id IS NULL OR tenant_id = $2)",
                entry["slug"],
                uuid.UUID(tenant_id),
            )
            if clash:
                raise Conflict(f"a catalog entry with slug '{entry['slug']}' already exists")
            row = _row(
                await conn.fetchrow(
                    f"INSERT INTO connector_catalog (id, tenant_id, {cols}, tier) VALUES ($1, $2, {params}, 'custom') "
                    "RETURNING *",
                    uuid.UUID(new_id()),
                    uuid.UUID(tenant_id),
                    *self._values(entry),
                )
            )
            assert row is not None
            return row

    async def delete(self, entry_id: str) -> None:
        """Used only to undo a one-call create whose connect failed (no orphan entry)."""
        async with self.pool.acquire() as conn:
            await conn.execute("DELETE FROM connector_catalog WHERE id = $1 AND tier = 'custom'", uuid.UUID(entry_id))

    async def visible(self, tenant_id: str) -> list[Row]:
        async with self.pool.acquire() as conn:
            return _rows(
                await conn.fetch(
                    "SELECT * FROM connector_catalog WHERE disabled_at IS NULL "
                    "AND (tenant_id IS NULL OR tenant_id = $1) ORDER BY tier <> 'verified', slug",
                    uuid.UUID(tenant_id),
                )
            )

    async def get(self, tenant_id: str, slug: str) -> Row | None:
        async with self.pool.acquire() as conn:
            return _row(
                await conn.fetchrow(
                    "SELECT * FROM connector_catalog WHERE slug = $1 AND disabled_at IS NULL "
                    "AND (tenant_id IS NULL OR tenant_id = $2)",
                    slug,
                    uuid.UUID(tenant_id),
                )
            )
