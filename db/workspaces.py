"""Workspace archives of runs whose sandbox does not share the worker's disk (see db.models.workspaces)."""

from __future__ import annotations

import uuid

from core.digests import sha256_hex
from db._base import Repository
from db.models.workspaces import WorkspaceArchive


class WorkspaceArchives(Repository):
    async def put(self, run_id: str, kind: str, data: bytes) -> WorkspaceArchive:
        """Store (or replace: a retried provision, a re-sent upload) the run's ``kind`` archive."""
        digest = sha256_hex(data)
        async with self.pool.acquire() as conn:
            created = await conn.fetchval(
                "INSERT INTO workspace_archives (session_id, kind, sha256, size, data) VALUES ($1, $2, $3, $4, $5)"
                " ON CONFLICT (session_id, kind) DO UPDATE SET sha256 = excluded.sha256, size = excluded.size,"
                " data = excluded.data, created_at = now() RETURNING created_at",
                uuid.UUID(run_id),
                kind,
                digest,
                len(data),
                data,
            )
        return WorkspaceArchive(
            session_id=uuid.UUID(run_id), kind=kind, sha256=digest, size=len(data), data=data, created_at=created
        )

    async def get(self, run_id: str, kind: str) -> WorkspaceArchive | None:
        async with self.pool.acquire() as conn:
            row = await conn.fetchrow(
                "SELECT session_id, kind, sha256, size, data, created_at FROM workspace_archives"
                " WHERE session_id = $1 AND kind = $2",
                uuid.UUID(run_id),
                kind,
            )
        return WorkspaceArchive.model_validate(dict(row)) if row is not None else None

    async def drop(self, run_id: str) -> None:
        async with self.pool.acquire() as conn:
            await conn.execute("DELETE FROM workspace_archives WHERE session_id = $1", uuid.UUID(run_id))
