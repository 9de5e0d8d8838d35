"""Managed app connections: one personal OAuth connection per (account, app), and the sign-ins that feed it.

:meth:`ManagedAppRecords.connection_for` makes or returns the account's connection for an app in one transaction
(the unique (tenant, user, app) row decides concurrent calls; a revoked connection is replaced by a new pending one,
any other keeps its id, so its bindings and the policy rules naming it survive a new sign-in). A sign-in's flow
(``connector_oauth_flows`` with purpose ``managed_app``) gets a ``managed_app_flows`` row that holds the grant the
callback obtained, sealed, until the account completes it; the completion proof handed to the client's
``redirect_url`` is stored only as a digest and is taken once (:meth:`ManagedAppRecords.take_proof`).

Times are the database's (``now()``), so every API replica agrees on a proof's expiry.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from core.errors import Conflict, Forbidden, NotFound
from db._base import ReadModel, Repository, Row, fetch_model
from db.connections import CONNECTION_FIELDS, ConnectionRow, NewConnection, insert_connection
from db.ids import new_id

__all__ = ["PROOF_TTL", "HeldGrant", "ManagedAppRecords", "ManagedFlow", "SpentProof"]

PROOF_TTL = timedelta(minutes=5)

_C_FIELDS = ", ".join(f"c.{f.strip()}" for f in CONNECTION_FIELDS.split(","))
_HELD = (
    "f.flow_id, f.tenant_id, f.managed_id, f.user_id, f.redirect_url, f.signed_in_at, f.credential_sealed, "
    "f.credential_key_id, f.access_token_sealed, f.access_token_key_id, f.access_expires_at, f.oauth, "
    "o.connection_id, o.registration_id, o.expected_generation, o.created_at AS flow_created_at, o.resource, "
    "o.discovery"
)


class HeldGrant(ReadModel):
    """A signed-in flow whose grant is waiting: sealed tokens, ``oauth`` document, and what activation compares."""

    flow_id: uuid.UUID
    tenant_id: uuid.UUID
    managed_id: uuid.UUID
    user_id: uuid.UUID
    redirect_url: str | None
    signed_in_at: datetime | None
    credential_sealed: bytes | None
    credential_key_id: str | None
    access_token_sealed: bytes | None
    access_token_key_id: str | None
    access_expires_at: datetime | None
    oauth: dict[str, Any] | None
    connection_id: uuid.UUID
    registration_id: uuid.UUID
    expected_generation: int
    flow_created_at: datetime
    resource: str
    discovery: dict[str, Any]


class SpentProof(HeldGrant):
    """A held grant looked up by its completion proof, with the proof's state."""

    used: bool
    expired: bool


class ManagedFlow(ReadModel):
    """A managed sign-in's app and destination (no secrets)."""

    flow_id: uuid.UUID
    tenant_id: uuid.UUID
    user_id: uuid.UUID
    redirect_url: str | None
    app_id: str
    connection_id: uuid.UUID


class AppConnection(ReadModel):
    """An account's connection to one app, and whether a signed-in grant is waiting to be completed."""

    app_id: str
    provisioning: bool
    connection: ConnectionRow


class ManagedAppRecords(Repository):
    async def accounts_connections(self, tenant_id: str, user_id: str) -> list[AppConnection]:
        """Every app this account has a connection row for: the connection (``c.*`` public fields), ``app_id``,
        and ``provisioning`` (a signed-in grant is waiting to be completed). Reads only."""
        rows = await self.rows(
            f"SELECT m.app_id, {_C_FIELDS}, EXISTS (SELECT 1 FROM managed_app_flows f "
            " JOIN connector_oauth_flows o ON o.id = f.flow_id "
            " WHERE f.managed_id = m.id AND o.connection_id = m.connection_id "
            " AND f.signed_in_at IS NOT NULL AND f.finished_at IS NULL) AS provisioning "
            "FROM managed_app_connections m JOIN integration_connections c ON c.id = m.connection_id "
            "WHERE m.tenant_id = $1 AND m.user_id = $2 ORDER BY m.app_id",
            uuid.UUID(tenant_id),
            uuid.UUID(user_id),
        )
        return [
            AppConnection(
                app_id=r["app_id"], provisioning=r["provisioning"], connection=ConnectionRow.model_validate(r)
            )
            for r in rows
        ]

    async def connection_for(self, tenant_id: str, user_id: str, app_id: str, fields: Row) -> tuple[ConnectionRow, str]:
        """The account's connection for ``app_id`` and its managed row id, creating a pending personal OAuth
        connection (``fields``: ``display_name``, ``base_url``) when there is none or the last was revoked."""
        tid, uid = uuid.UUID(tenant_id), uuid.UUID(user_id)
        try:
            async with self.pool.acquire() as conn, conn.transaction():
                managed = await conn.fetchrow(
                    "SELECT m.id, m.connection_id, c.status FROM managed_app_connections m "
                    "JOIN integration_connections c ON c.id = m.connection_id "
                    "WHERE m.tenant_id = $1 AND m.user_id = $2 AND m.app_id = $3 FOR UPDATE OF m",
                    tid,
                    uid,
                    app_id,
                )
                if managed is not None and managed["status"] != "revoked":
                    row = await fetch_model(
                        conn,
                        ConnectionRow,
                        f"SELECT {CONNECTION_FIELDS} FROM integration_connections WHERE id = $1",
                        managed["connection_id"],
                    )
                    return _require(row), str(managed["id"])
                new = NewConnection(
                    provider="mcp_http",
                    display_name=fields["display_name"],
                    base_url=fields["base_url"],
                    auth_kind="oauth",
                    owner_user_id=user_id,
                    created_by_user_id=user_id,
                    access=fields["access"],
                )
                created = await insert_connection(conn, tenant_id, new, status="pending")
                # Two first calls at once both get here; the unique (tenant, user, app) row lets one in, and the
                # other's insert waits for that commit, then writes nothing: it rolls back and reads the winner's.
                managed_id = await conn.fetchval(
                    "INSERT INTO managed_app_connections (id, tenant_id, user_id, app_id, connection_id) "
                    "VALUES ($1,$2,$3,$4,$5) ON CONFLICT (tenant_id, user_id, app_id) DO UPDATE "
                    "SET connection_id = EXCLUDED.connection_id, updated_at = now() "
                    "WHERE (SELECT status FROM integration_connections "
                    "WHERE id = managed_app_connections.connection_id) = 'revoked' RETURNING id",
                    uuid.UUID(new_id()),
                    tid,
                    uid,
                    app_id,
                    created.id,
                )
                if managed_id is None:
                    raise _LostRace()
                return created, str(managed_id)
        except _LostRace:
            return await self.connection_for(tenant_id, user_id, app_id, fields)

    async def record_flow(
        self, tenant_id: str, flow_id: str, managed_id: str, user_id: str, redirect_url: str | None
    ) -> None:
        """Attach a started connector flow to the account's managed row (who, and where the browser goes after)."""
        await self.execute(
            "INSERT INTO managed_app_flows (flow_id, tenant_id, managed_id, user_id, redirect_url) "
            "VALUES ($1,$2,$3,$4,$5)",
            uuid.UUID(flow_id),
            uuid.UUID(tenant_id),
            uuid.UUID(managed_id),
            uuid.UUID(user_id),
            redirect_url,
        )

    async def flow(self, flow_id: str) -> ManagedFlow | None:
        """A managed flow's app and destination (no secrets)."""
        return await self.one(
            ManagedFlow,
            "SELECT f.flow_id, f.tenant_id, f.user_id, f.redirect_url, m.app_id, m.connection_id "
            "FROM managed_app_flows f JOIN managed_app_connections m ON m.id = f.managed_id "
            "WHERE f.flow_id = $1",
            uuid.UUID(flow_id),
        )

    async def hold(
        self,
        flow_id: str,
        *,
        credential: tuple[bytes, str],
        access: tuple[bytes, str, datetime | None],
        oauth: dict[str, Any],
        proof_hash: str | None,
    ) -> None:
        """Keep a redeemed grant (sealed) until the account completes it; record the proof digest, if any."""
        await self.execute(
            "UPDATE managed_app_flows SET signed_in_at = now(), credential_sealed = $2, credential_key_id = $3, "
            "access_token_sealed = $4, access_token_key_id = $5, access_expires_at = $6, oauth = $7, "
            "proof_hash = $8, proof_expires_at = CASE WHEN $8::text IS NULL THEN NULL "
            "ELSE now() + $9::interval END WHERE flow_id = $1 AND signed_in_at IS NULL",
            uuid.UUID(flow_id),
            credential[0],
            credential[1],
            access[0],
            access[1],
            access[2],
            oauth,
            proof_hash,
            PROOF_TTL,
        )

    async def waiting(self, tenant_id: str, managed_id: str, connection_id: str) -> HeldGrant | None:
        """The newest signed-in, unfinished grant of the account's current connection, if any."""
        return await self.one(
            HeldGrant,
            f"SELECT {_HELD} FROM managed_app_flows f JOIN connector_oauth_flows o ON o.id = f.flow_id "
            "WHERE f.tenant_id = $1 AND f.managed_id = $2 AND o.connection_id = $3 "
            "AND f.signed_in_at IS NOT NULL AND f.finished_at IS NULL ORDER BY f.signed_in_at DESC LIMIT 1",
            uuid.UUID(tenant_id),
            uuid.UUID(managed_id),
            uuid.UUID(connection_id),
        )

    async def take_proof(
        self, tenant_id: str, user_id: str, proof_hash: str, expected_connection_id: str | None
    ) -> HeldGrant:
        """Spend a completion proof: exactly once, by the account that started the sign-in, within its lifetime,
        and only when ``expected_connection_id`` (if given) is the connection it completes. Every refusal leaves
        the proof as it was: :class:`NotFound` (unknown, or expired), :class:`Conflict` (already used, or another
        connection than expected), :class:`Forbidden` (another account)."""
        async with self.pool.acquire() as conn, conn.transaction():
            row = await fetch_model(
                conn,
                SpentProof,
                f"SELECT {_HELD}, f.proof_used_at IS NOT NULL AS used, f.proof_expires_at <= now() AS expired "
                "FROM managed_app_flows f JOIN connector_oauth_flows o ON o.id = f.flow_id "
                "WHERE f.proof_hash = $1 AND f.tenant_id = $2 FOR UPDATE OF f",
                proof_hash,
                uuid.UUID(tenant_id),
            )
            if row is None:
                raise NotFound("this completion proof is unknown")
            if str(row.user_id) != user_id:
                raise Forbidden("this completion proof was issued to another account")
            if row.used:
                raise Conflict("this completion proof was already used; read the connection's status instead")
            if row.expired:
                raise NotFound("this completion proof expired (they last five minutes); connect the app again")
            if expected_connection_id is not None and str(row.connection_id) != expected_connection_id:
                raise Conflict(
                    "expected_server_id does not match the connection this sign-in completes "
                    f"({row.connection_id}); nothing was changed"
                )
            await conn.execute("UPDATE managed_app_flows SET proof_used_at = now() WHERE flow_id = $1", row.flow_id)
        return row

    async def finish(self, flow_id: str) -> None:
        """The grant was made the connection's (or lost to a newer sign-in): drop the held copy."""
        await self.execute(
            "UPDATE managed_app_flows SET finished_at = now(), credential_sealed = NULL, credential_key_id = NULL, "
            "access_token_sealed = NULL, access_token_key_id = NULL WHERE flow_id = $1",
            uuid.UUID(flow_id),
        )

    async def refreshed(
        self, flow_id: str, access: tuple[bytes, str, datetime | None], credential: tuple[bytes, str] | None
    ) -> None:
        """Store a held grant's refreshed access token (and rotated refresh token) before it is completed."""
        await self.execute(
            "UPDATE managed_app_flows SET access_token_sealed = $2, access_token_key_id = $3, "
            "access_expires_at = $4, credential_sealed = coalesce($5, credential_sealed), "
            "credential_key_id = coalesce($6, credential_key_id) "
            "WHERE flow_id = $1 AND finished_at IS NULL",
            uuid.UUID(flow_id),
            access[0],
            access[1],
            access[2],
            credential[0] if credential else None,
            credential[1] if credential else None,
        )


class _LostRace(Exception):
    """A concurrent call made the account's connection first (rolls our pending row back)."""


def _require(row: ConnectionRow | None) -> ConnectionRow:
    if row is None:
        raise NotFound()
    return row
