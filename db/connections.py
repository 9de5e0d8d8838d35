"""Connections, their tool snapshots, per-run bindings and brokered execution claims.

A connection holds one sealed credential and append-only "photographs" of the server's tools. A run
binds each requirement slot to one connection and snapshot at creation (frozen); the broker re-checks
that binding and claims ``(session, tool_call_id, input_digest)`` before any credential is touched.
"""

from __future__ import annotations

import uuid
from typing import Any

from core import events as ev
from core.errors import Conflict, NotFound
from db._base import Conn, Repository, Row, as_row, as_rows
from db.ids import new_id
from db.store import Store

CONNECTION_FIELDS = (
    "id, tenant_id, provider, display_name, base_url, auth_kind, header_name, scheme, status, owner_type, "
    "owner_user_id, created_by_user_id, authorization_generation, metadata, created_at, updated_at"
)
MAX_ATTEMPTS = 3
CLAIM_TTL_SECS = 600.0


def credential_context(tenant_id: str) -> str:
    """The AAD context of a connection credential: a blob moved to another tenant or column fails."""
    return f"{tenant_id}:integration_connections.credential"


class Connections(Repository):
    def __init__(self, store: Store) -> None:
        self.store = store
        super().__init__(store.pool)

    # ---- connections ---------------------------------------------------------------------------

    async def create(
        self, tenant_id: str, fields: Row, sealed: bytes, key_id: str, photo: dict[str, Any]
    ) -> tuple[Row, Row]:
        """Insert the connection and its first snapshot together: a connection never exists unphotographed.
        ``fields["owner_user_id"]`` set makes it a personal connection of that user (owner_type ``user``)."""
        owner = fields.get("owner_user_id")
        async with self.pool.acquire() as conn, conn.transaction():
            row = as_row(
                await conn.fetchrow(
                    "INSERT INTO integration_connections (id, tenant_id, provider, display_name, base_url, "
                    "auth_kind, header_name, scheme, credential_sealed, credential_key_id, status, owner_type, "
                    "owner_user_id, created_by_user_id) "
                    "VALUES ($1,$2,$3,$4,$5,'static',$6,$7,$8,$9,'active',$10,$11,$12) "
                    f"RETURNING {CONNECTION_FIELDS}",
                    uuid.UUID(new_id()),
                    uuid.UUID(tenant_id),
                    fields["provider"],
                    fields["display_name"],
                    fields["base_url"],
                    fields.get("header_name"),
                    fields["scheme"],
                    sealed,
                    key_id,
                    "user" if owner else "organization",
                    uuid.UUID(owner) if owner else None,
                    uuid.UUID(fields["created_by_user_id"]) if fields.get("created_by_user_id") else None,
                )
            )
            assert row is not None
            snapshot = await self._append_snapshot(conn, row["id"], 1, photo)
            return row, snapshot

    async def create_pending_oauth(self, tenant_id: str, fields: Row) -> Row:
        """An ``oauth`` connection waiting for its first sign-in: no credential, no snapshot, not bindable
        (only ``active`` connections bind). ``fields`` as :meth:`create` (no header or scheme)."""
        owner = fields.get("owner_user_id")
        async with self.pool.acquire() as conn:
            row = as_row(
                await conn.fetchrow(
                    "INSERT INTO integration_connections (id, tenant_id, provider, display_name, base_url, "
                    "auth_kind, scheme, status, owner_type, owner_user_id, created_by_user_id) "
                    "VALUES ($1,$2,$3,$4,$5,'oauth','Bearer','pending',$6,$7,$8) "
                    f"RETURNING {CONNECTION_FIELDS}",
                    uuid.UUID(new_id()),
                    uuid.UUID(tenant_id),
                    fields["provider"],
                    fields["display_name"],
                    fields["base_url"],
                    "user" if owner else "organization",
                    uuid.UUID(owner) if owner else None,
                    uuid.UUID(fields["created_by_user_id"]) if fields.get("created_by_user_id") else None,
                )
            )
        assert row is not None
        return row

    async def discard_pending_oauth(self, tenant_id: str, connection_id: str) -> None:
        """Remove an ``oauth`` connection that never signed in (its first sign-in could not even start)."""
        await self.execute(
            "DELETE FROM integration_connections WHERE tenant_id = $1 AND id = $2 AND auth_kind = 'oauth' "
            "AND status = 'pending' AND oauth_activated_at IS NULL",
            uuid.UUID(tenant_id),
            uuid.UUID(connection_id),
        )

    async def all(self, tenant_id: str, viewer_user_id: str | None = None) -> list[Row]:
        """Organization connections plus the viewer's own personal ones (none for the operator)."""
        return await self.rows(
            f"SELECT {CONNECTION_FIELDS} FROM integration_connections WHERE tenant_id = $1 "
            "AND (owner_type = 'organization' OR owner_user_id = $2) ORDER BY created_at DESC",
            uuid.UUID(tenant_id),
            uuid.UUID(viewer_user_id) if viewer_user_id else None,
        )

    async def get(self, tenant_id: str, connection_id: str) -> Row | None:
        try:
            cid = uuid.UUID(connection_id)
        except ValueError:
            return None
        return await self.one_row(
            f"SELECT {CONNECTION_FIELDS} FROM integration_connections WHERE tenant_id = $1 AND id = $2",
            uuid.UUID(tenant_id),
            cid,
        )

    async def credential(self, connection_id: str, generation: int | None = None) -> tuple[bytes, str]:
        """The sealed blob and key id, only while the connection is active (and, for the broker, still
        at the bound authorization generation). Only the broker and refresh paths read it."""
        async with self.pool.acquire() as conn:
            row = await conn.fetchrow(
                "SELECT credential_sealed, credential_key_id FROM integration_connections WHERE id = $1 "
                "AND status = 'active' AND ($2::int IS NULL OR authorization_generation = $2)",
                uuid.UUID(connection_id),
                generation,
            )
        if row is None or row["credential_sealed"] is None:
            raise NotFound()
        return bytes(row["credential_sealed"]), str(row["credential_key_id"])

    async def revoke(self, tenant_id: str, connection_id: str) -> Row:
        async with self.pool.acquire() as conn:
            row = as_row(
                await conn.fetchrow(
                    "UPDATE integration_connections SET status = 'revoked', updated_at = now(), "
                    "credential_sealed = NULL WHERE tenant_id = $1 AND id = $2 AND status <> 'revoked' "
                    f"RETURNING {CONNECTION_FIELDS}",
                    uuid.UUID(tenant_id),
                    uuid.UUID(connection_id),
                )
            )
        if row is None:
            if await self.get(tenant_id, connection_id) is None:
                raise NotFound()
            raise Conflict("connection is already revoked")
        return row

    # ---- snapshots -----------------------------------------------------------------------------

    async def _append_snapshot(self, conn: Conn, connection_id: str, version: int, photo: dict[str, Any]) -> Row:
        row = as_row(
            await conn.fetchrow(
                "INSERT INTO connection_tool_snapshots (id, connection_id, snapshot_version, "
                "authorization_generation, protocol_version, tools_json, tools_digest) "
                "SELECT $1, $2, $3, authorization_generation, $4, $5, $6 FROM integration_connections "
                "WHERE id = $2 RETURNING *",
                uuid.UUID(new_id()),
                uuid.UUID(connection_id),
                version,
                photo["protocol_version"],
                photo["tools"],
                photo["digest"],
            )
        )
        assert row is not None
        return row

    async def refresh(self, connection_id: str, generation: int, photo: dict[str, Any]) -> Row:
        """Append snapshot v+1 unless the connection was reauthorized while it was being photographed."""
        async with self.pool.acquire() as conn, conn.transaction():
            current = await conn.fetchrow(
                "SELECT status, authorization_generation FROM integration_connections WHERE id = $1 FOR UPDATE",
                uuid.UUID(connection_id),
            )
            if current is None:
                raise NotFound()
            if current["status"] != "active":
                raise Conflict(f"connection is {current['status']}")
            if current["authorization_generation"] != generation:
                raise Conflict("the connection was reauthorized during discovery — refresh again")
            version = await conn.fetchval(
                "SELECT coalesce(max(snapshot_version), 0) + 1 FROM connection_tool_snapshots WHERE connection_id = $1",
                uuid.UUID(connection_id),
            )
            return await self._append_snapshot(conn, connection_id, version, photo)

    async def latest_snapshot(self, connection_id: str) -> Row | None:
        return await self.one_row(
            "SELECT * FROM connection_tool_snapshots WHERE connection_id = $1 ORDER BY snapshot_version DESC LIMIT 1",
            uuid.UUID(connection_id),
        )

    # ---- bindings ------------------------------------------------------------------------------

    async def candidates(self, tenant_id: str, owner_user_id: str | None = None) -> list[Row]:
        """Active connections with their latest snapshot, newest first: the organization's, or (with
        ``owner_user_id``) that user's personal ones."""
        return await self.rows(
            "SELECT c.id, c.base_url, c.display_name, c.authorization_generation, c.owner_type, "
            "c.owner_user_id, s.snapshot_version, "
            "s.protocol_version, s.tools_json FROM integration_connections c JOIN LATERAL ("
            " SELECT * FROM connection_tool_snapshots t WHERE t.connection_id = c.id"
            " ORDER BY snapshot_version DESC LIMIT 1) s ON true "
            "WHERE c.tenant_id = $1 AND c.status = 'active' AND CASE WHEN $2::uuid IS NULL "
            "THEN c.owner_type = 'organization' ELSE c.owner_type = 'user' AND c.owner_user_id = $2 END "
            "ORDER BY c.created_at DESC",
            uuid.UUID(tenant_id),
            uuid.UUID(owner_user_id) if owner_user_id else None,
        )

    async def insert_bindings(self, conn: Conn, tenant_id: str, run_id: str, bindings: list[Row]) -> None:
        for b in bindings:
            await conn.execute(
                "INSERT INTO run_resource_bindings (id, tenant_id, session_id, requirement_slot, connection_id, "
                "authority_generation, connection_owner_type, snapshot_version, effective_tools_json, "
                "effective_tools_digest, binding_mode, connection_owner_user_id) "
                "VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12)",
                uuid.UUID(b["binding_id"]),
                uuid.UUID(tenant_id),
                uuid.UUID(run_id),
                b["slot"],
                uuid.UUID(b["connection_id"]),
                b["authorization_generation"],
                b["owner_type"],
                b["snapshot_version"],
                b["tools"],
                b["tools_digest"],
                b["binding_mode"],
                uuid.UUID(b["owner_user_id"]) if b.get("owner_user_id") else None,
            )

    async def unusable_slots(self, run_id: str) -> frozenset[str]:
        """The run's brokered slots whose connection cannot be used now: no longer active, or authorized
        again since the run bound it (the broker would refuse a call; discovery says needsAuthorization)."""
        rows = await self.rows(
            "SELECT b.requirement_slot FROM run_resource_bindings b "
            "JOIN integration_connections c ON c.id = b.connection_id WHERE b.session_id = $1 "
            "AND (c.status <> 'active' OR c.authorization_generation <> b.authority_generation)",
            uuid.UUID(run_id),
        )
        return frozenset(str(r["requirement_slot"]) for r in rows)

    async def dispatch_view(self, run_id: str, tool_call_id: str, digest: str) -> Row | None:
        """Everything the broker checks before a call, read in one statement: the claim, its binding,
        the connection's live state (and sealed credential only while it still matches the binding),
        the run's status, and for a personal binding whether its owner is still an active member."""
        return await self.one_row(
            "SELECT cl.*, b.connection_id, b.authority_generation, b.connection_owner_type, "
            "b.connection_owner_user_id, c.owner_user_id AS live_owner_user_id, "
            "c.status AS connection_status, c.authorization_generation AS live_generation, "
            "c.owner_type AS live_owner_type, c.base_url, c.header_name, c.scheme, c.auth_kind, "
            "(m.status = 'active' AND u.status = 'active') AS owner_active, "
            "CASE WHEN c.status = 'active' AND c.authorization_generation = b.authority_generation "
            "AND (b.connection_owner_user_id IS NULL OR (c.owner_user_id = b.connection_owner_user_id "
            "AND m.status = 'active' AND u.status = 'active')) "
            "THEN c.credential_sealed END AS credential_sealed, s.status AS run_status "
            "FROM tool_execution_claims cl JOIN run_resource_bindings b ON b.id = cl.binding_id "
            "JOIN integration_connections c ON c.id = b.connection_id JOIN sessions s ON s.id = cl.session_id "
            "LEFT JOIN users u ON u.id = b.connection_owner_user_id LEFT JOIN org_memberships m "
            "ON m.user_id = b.connection_owner_user_id AND m.tenant_id = b.tenant_id "
            "WHERE cl.session_id = $1 AND cl.tool_call_id = $2 AND cl.input_digest = $3",
            uuid.UUID(run_id),
            tool_call_id,
            digest,
        )

    # ---- execution claims ----------------------------------------------------------------------

    async def register_claim(
        self, run_id: str, tool_call_id: str, digest: str, binding_id: str, tool: str, tool_input: dict[str, Any]
    ) -> Row:
        """The call's durable record (input kept here, never in the ledger or workflow history)."""
        async with self.pool.acquire() as conn:
            await conn.execute(
                "INSERT INTO tool_execution_claims (session_id, tool_call_id, input_digest, binding_id, tool, input, "
                "state) VALUES ($1,$2,$3,$4,$5,$6,'registered') ON CONFLICT DO NOTHING",
                uuid.UUID(run_id),
                tool_call_id,
                digest,
                uuid.UUID(binding_id),
                tool,
                tool_input,
            )
            return await self._claim(conn, run_id, tool_call_id, digest)

    async def _claim(self, conn: Conn, run_id: str, tool_call_id: str, digest: str) -> Row:
        row = as_row(
            await conn.fetchrow(
                "SELECT * FROM tool_execution_claims WHERE session_id = $1 AND tool_call_id = $2 AND input_digest = $3",
                uuid.UUID(run_id),
                tool_call_id,
                digest,
            )
        )
        if row is None:
            raise NotFound()
        return row

    async def claim(self, run_id: str, tool_call_id: str, digest: str) -> Row | None:
        async with self.pool.acquire() as conn:
            try:
                return await self._claim(conn, run_id, tool_call_id, digest)
            except NotFound:
                return None

    async def expire_stale(self, run_id: str, ttl_secs: float, event_for: Any) -> list[Row]:
        """``claimed`` for longer than ``ttl_secs`` (a dispatcher died mid-call): the outcome is
        unknown, so the claim becomes ``ambiguous`` and is never dispatched again."""
        async with self.pool.acquire() as conn, conn.transaction():
            rows = as_rows(
                await conn.fetch(
                    "UPDATE tool_execution_claims SET state = 'ambiguous', settled_at = now(), "
                    "error = 'dispatcher lost while the call was in flight' WHERE session_id = $1 "
                    "AND state = 'claimed' AND claimed_at < now() - make_interval(secs => $2) RETURNING *",
                    uuid.UUID(run_id),
                    float(ttl_secs),
                )
            )
            if rows:
                await self.store.append(conn, run_id, [event_for(r) for r in rows])
            return rows

    async def take(self, run_id: str, tool_call_id: str, digest: str) -> Row | None:
        """CAS registered|failed_before_send → claimed (attempt + 1); None when someone else holds it
        or its outcome is final. Only the taker may touch the credential."""
        return await self.one_row(
            "UPDATE tool_execution_claims SET state = 'claimed', attempts = attempts + 1, claimed_at = now() "
            "WHERE session_id = $1 AND tool_call_id = $2 AND input_digest = $3 "
            "AND (state = 'registered' OR (state = 'failed_before_send' AND attempts < $4)) RETURNING *",
            uuid.UUID(run_id),
            tool_call_id,
            digest,
            MAX_ATTEMPTS,
        )

    async def settle(
        self,
        run_id: str,
        tool_call_id: str,
        digest: str,
        state: str,
        result: dict[str, Any] | None,
        error: str | None,
        event: ev.NewEvent,
    ) -> Row:
        """claimed → outcome, and the single ``tool.brokered`` event, in one transaction."""
        async with self.pool.acquire() as conn, conn.transaction():
            row = as_row(
                await conn.fetchrow(
                    "UPDATE tool_execution_claims SET state = $4, result = $5, error = $6, settled_at = now() "
                    "WHERE session_id = $1 AND tool_call_id = $2 AND input_digest = $3 AND state = 'claimed' "
                    "RETURNING *",
                    uuid.UUID(run_id),
                    tool_call_id,
                    digest,
                    state,
                    result,
                    error,
                )
            )
            if row is None:
                return await self._claim(conn, run_id, tool_call_id, digest)
            await self.store.append(conn, run_id, [event])
            return row
