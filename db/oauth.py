"""OAuth connect records: reusable client registrations and one-time connector flows.

A registration is our client identity at one authorization server; dynamic (``dcr``) and metadata-document
(``cimd``) ones are shared by every flow of the tenant with the same (issuer, redirect URI), and the first one
saved wins a race (:meth:`OAuthRecords.save_registration` returns the winner). A flow is one browser leg, kept
only as digests of its ``state`` and of the browser cookie, the sealed PKCE verifier and the connection's
authorization generation when it started. The callback claims it exactly once, and only from the browser that
opened it: the cookie digest is part of the claim's predicate, so a different browser is refused and the flow is
not burned (:meth:`OAuthRecords.claim_flow`). Times are the database's (``now()``), so every API replica agrees.

Secrets arrive sealed (``integrations.sealing``) with their key id; digests arrive as hex (``core.tokens``).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from core.errors import Conflict, Forbidden, NotFound
from db._base import ReadModel, Repository, fetch_model, known_id
from db.connections import CONNECTION_FIELDS, ConnectionRow, Connections
from db.ids import new_id
from db.models.connections import ConnectionToolSnapshot
from db.models.oauth import OAuthClientRegistration

__all__ = [
    "FLOW_TTL",
    "SUPERSEDED",
    "ClaimedFlow",
    "FlowTarget",
    "GrantLock",
    "GrantMaterial",
    "LockedGrant",
    "OAuthFlow",
    "OAuthRecords",
    "OAuthSettings",
    "flow_verifier_context",
    "registration_secret_context",
]

FLOW_TTL = timedelta(seconds=600)
SUPERSEDED = "this authorization was superseded by a newer one — restart the connect flow"

REGISTRATION_FIELDS = (
    "id, tenant_id, issuer, redirect_uri, source, client_id, token_endpoint_auth_method, registration_client_uri, "
    "created_at"
)
REGISTRATION_SECRETS = (
    "client_secret_sealed, client_secret_key_id, registration_access_token_sealed, registration_access_token_key_id"
)
FLOW_FIELDS = (
    "id, tenant_id, connection_id, registration_id, resource, discovery, expected_generation, created_by_user_id, "
    "created_at, "
    "expires_at, consumed_at, browser_hash IS NOT NULL AS browser_bound"
)


def registration_secret_context(tenant_id: str, column: str) -> str:
    """The sealing context of a registration secret (``client_secret`` or ``registration_access_token``)."""
    return f"{tenant_id}:oauth_client_registrations.{column}"


def flow_verifier_context(tenant_id: str) -> str:
    """The sealing context of a flow's PKCE verifier."""
    return f"{tenant_id}:connector_oauth_flows.pkce_verifier"


class FlowTarget(ReadModel):
    """What activating a flow's grant compares: the connection, its generation and registration, and when the
    flow started."""

    connection_id: uuid.UUID
    registration_id: uuid.UUID
    expected_generation: int
    created_at: datetime


class OAuthFlow(FlowTarget):
    """One browser leg (``connector_oauth_flows``) without its digests or sealed verifier."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    resource: str
    discovery: dict[str, Any]
    created_by_user_id: uuid.UUID | None
    expires_at: datetime
    consumed_at: datetime | None
    browser_bound: bool


class ClaimedFlow(OAuthFlow):
    """A flow just claimed by its callback, with the sealed PKCE verifier the code exchange needs."""

    pkce_verifier_sealed: bytes
    pkce_verifier_key_id: str


class OAuthSettings(ReadModel):
    """An oauth connection's ``oauth`` document and registration (not in the public connection fields)."""

    oauth: dict[str, Any] | None
    registration_id: uuid.UUID | None


class GrantMaterial(ReadModel):
    """What revoking a connection's grant at its authorization server needs."""

    credential_sealed: bytes
    oauth: dict[str, Any] | None
    registration_id: uuid.UUID


class LockedGrant(ReadModel):
    """A connection's grant as read under its row lock."""

    status: str
    authorization_generation: int
    credential_sealed: bytes | None
    access_token_sealed: bytes | None
    access_expires_at: datetime | None
    oauth: dict[str, Any] | None
    registration_id: uuid.UUID | None


class OAuthRecords(Repository):
    def __init__(self, pool: asyncpg.Pool[Any], connections: Connections) -> None:
        super().__init__(pool)
        self._connections = connections

    # ---- registrations -------------------------------------------------------------------------

    async def reusable_registration(
        self, tenant_id: str, issuer: str, redirect_uri: str
    ) -> OAuthClientRegistration | None:
        """The tenant's dynamic or metadata-document registration for (issuer, redirect URI), if any."""
        return await self.one(
            OAuthClientRegistration,
            f"SELECT {REGISTRATION_FIELDS}, {REGISTRATION_SECRETS} FROM oauth_client_registrations "
            "WHERE tenant_id = $1 AND issuer = $2 AND redirect_uri = $3 AND source IN ('dcr', 'cimd')",
            uuid.UUID(tenant_id),
            issuer,
            redirect_uri,
        )

    async def save_registration(
        self,
        tenant_id: str,
        fields: dict[str, Any],
        *,
        client_secret: tuple[bytes, str] | None = None,
        registration_access_token: tuple[bytes, str] | None = None,
    ) -> tuple[OAuthClientRegistration, bool]:
        """Store a registration; returns ``(row, created)``.

        ``fields``: ``issuer``, ``redirect_uri``, ``source``, ``client_id``, ``token_endpoint_auth_method``,
        ``registration_client_uri?``. Secrets are ``(sealed blob, key id)``. For ``dcr``/``cimd``, when another
        registration for the same (tenant, issuer, redirect URI) already exists (a concurrent flow registered
        first), nothing is written and that one is returned with ``created=False``: the caller uses it and drops
        its own.
        """
        secret = client_secret or (None, None)
        access = registration_access_token or (None, None)
        async with self.pool.acquire() as conn, conn.transaction():
            row = await fetch_model(
                conn,
                OAuthClientRegistration,
                "INSERT INTO oauth_client_registrations (id, tenant_id, issuer, redirect_uri, source, client_id, "
                "token_endpoint_auth_method, client_secret_sealed, client_secret_key_id, "
                "registration_access_token_sealed, registration_access_token_key_id, registration_client_uri) "
                "VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12) "
                "ON CONFLICT (tenant_id, issuer, redirect_uri) WHERE source IN ('dcr', 'cimd') DO NOTHING "
                f"RETURNING {REGISTRATION_FIELDS}, {REGISTRATION_SECRETS}",
                uuid.UUID(new_id()),
                uuid.UUID(tenant_id),
                fields["issuer"],
                fields["redirect_uri"],
                fields["source"],
                fields["client_id"],
                fields.get("token_endpoint_auth_method") or "none",
                secret[0],
                secret[1],
                access[0],
                access[1],
                fields.get("registration_client_uri"),
            )
        if row is not None:
            return row, True
        existing = await self.reusable_registration(tenant_id, fields["issuer"], fields["redirect_uri"])
        if existing is None:  # the winner cannot disappear: registrations are never deleted
            raise Conflict("a concurrent client registration could not be read back")
        return existing, False

    async def registration(self, tenant_id: str, registration_id: str) -> OAuthClientRegistration | None:
        """One registration with its sealed secrets."""
        return await self.one(
            OAuthClientRegistration,
            f"SELECT {REGISTRATION_FIELDS}, {REGISTRATION_SECRETS} FROM oauth_client_registrations "
            "WHERE tenant_id = $1 AND id = $2",
            uuid.UUID(tenant_id),
            uuid.UUID(registration_id),
        )

    async def connection_settings(self, tenant_id: str, connection_id: str) -> OAuthSettings:
        """An oauth connection's ``oauth`` document and ``registration_id`` (not in the public connection fields)."""
        row = await self.one(
            OAuthSettings,
            "SELECT oauth, registration_id FROM integration_connections WHERE tenant_id = $1 AND id = $2",
            uuid.UUID(tenant_id),
            uuid.UUID(connection_id),
        )
        if row is None:
            raise NotFound()
        return row

    async def grant_material(self, tenant_id: str, connection_id: str) -> GrantMaterial | None:
        """An oauth connection's sealed refresh token, ``oauth`` document and registration (to revoke its grant at
        the authorization server), or None when it has no grant."""
        return await self.one(
            GrantMaterial,
            "SELECT credential_sealed, oauth, registration_id FROM integration_connections "
            "WHERE tenant_id = $1 AND id = $2 AND auth_kind = 'oauth' AND credential_sealed IS NOT NULL "
            "AND registration_id IS NOT NULL",
            uuid.UUID(tenant_id),
            uuid.UUID(connection_id),
        )

    async def configure_pending(
        self, tenant_id: str, connection_id: str, *, oauth: dict[str, Any], registration_id: str | None
    ) -> None:
        """Record a pending connection's requested scopes and pre-registered identity before its first sign-in."""
        await self.execute(
            "UPDATE integration_connections SET oauth = $3, registration_id = $4, updated_at = now() "
            "WHERE tenant_id = $1 AND id = $2 AND auth_kind = 'oauth' AND status = 'pending'",
            uuid.UUID(tenant_id),
            uuid.UUID(connection_id),
            oauth,
            uuid.UUID(registration_id) if registration_id else None,
        )

    # ---- flows ---------------------------------------------------------------------------------

    async def start_flow(
        self,
        tenant_id: str,
        connection_id: str,
        registration_id: str,
        *,
        state_hash: str,
        verifier: tuple[bytes, str],
        resource: str,
        expected_generation: int,
        discovery: dict[str, Any] | None = None,
        created_by_user_id: str | None = None,
        ttl: timedelta = FLOW_TTL,
        purpose: str = "connection",
    ) -> OAuthFlow:
        """Record a new browser leg; it expires ``ttl`` after now (database time). ``discovery`` is what the
        callback needs to redeem the code (endpoints, resource; nothing secret). ``purpose`` names the callback
        that may claim it (``connection`` or ``managed_app``)."""
        async with self.pool.acquire() as conn:
            row = await fetch_model(
                conn,
                OAuthFlow,
                "INSERT INTO connector_oauth_flows (id, tenant_id, connection_id, registration_id, state_hash, "
                "pkce_verifier_sealed, pkce_verifier_key_id, resource, discovery, expected_generation, "
                "created_by_user_id, expires_at, purpose) "
                "VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11, now() + $12::interval, $13) "
                f"RETURNING {FLOW_FIELDS}",
                uuid.UUID(new_id()),
                uuid.UUID(tenant_id),
                uuid.UUID(connection_id),
                uuid.UUID(registration_id),
                state_hash,
                verifier[0],
                verifier[1],
                resource,
                discovery or {},
                expected_generation,
                uuid.UUID(created_by_user_id) if created_by_user_id else None,
                ttl,
                purpose,
            )
        assert row is not None
        return row

    async def bind_browser(self, flow_id: str, browser_hash: str) -> OAuthFlow:
        """Tie a live flow to the browser that opened its link (``/v1/oauth/go``).

        Opening the link again from the same browser is fine; from another browser it is :class:`Forbidden`.
        An unknown, expired or used flow is :class:`NotFound` / :class:`Conflict`.
        """
        fid = known_id(flow_id, "this sign-in link is unknown")
        async with self.pool.acquire() as conn:
            row = await fetch_model(
                conn,
                OAuthFlow,
                "UPDATE connector_oauth_flows SET browser_hash = $2 WHERE id = $1 AND consumed_at IS NULL "
                "AND expires_at > now() AND (browser_hash IS NULL OR browser_hash = $2) AND purpose = 'connection' "
                f"RETURNING {FLOW_FIELDS}",
                fid,
                browser_hash,
            )
            if row is not None:
                return row
            raise await self._refusal(conn, "id = $1 AND purpose = 'connection'", fid)

    async def claim_flow(
        self, state_hash: str, browser_hash: str | None, *, purpose: str = "connection"
    ) -> ClaimedFlow:
        """Consume the flow whose ``state`` digest this is, exactly once, from the browser bound to it.

        Returns the flow with its sealed verifier. Refusals change nothing: :class:`NotFound` (unknown or
        expired), :class:`Conflict` (already used), :class:`Forbidden` (another browser, or no cookie; the
        flow stays usable from the right one). A flow of another ``purpose`` is unknown to this callback.
        ``managed_app`` flows have no browser cookie (their grant is held until the account completes it), so
        ``browser_hash`` is not part of their claim.
        """
        async with self.pool.acquire() as conn:
            row = await fetch_model(
                conn,
                ClaimedFlow,
                "UPDATE connector_oauth_flows SET consumed_at = now() WHERE state_hash = $1 "
                "AND consumed_at IS NULL AND expires_at > now() AND purpose = $3 "
                "AND ($3 = 'managed_app' OR browser_hash = $2) "
                f"RETURNING {FLOW_FIELDS}, pkce_verifier_sealed, pkce_verifier_key_id",
                state_hash,
                browser_hash,
                purpose,
            )
            if row is not None:
                return row
            raise await self._refusal(conn, "state_hash = $1 AND purpose = $2", state_hash, purpose)

    # ---- the connection ------------------------------------------------------------------------

    async def activate(
        self,
        tenant_id: str,
        flow: FlowTarget,
        *,
        credential: tuple[bytes, str],
        oauth: dict[str, Any],
        photo: dict[str, Any],
        access: tuple[bytes, str, datetime | None] | None = None,
    ) -> tuple[ConnectionRow, ConnectionToolSnapshot]:
        """Make the flow's connection active under its new grant and append the photograph taken with it.

        A compare-and-swap: it wins only while the connection is still at the flow's ``expected_generation`` and
        has not been activated since the flow started (so of two concurrent re-authorizations exactly one wins; the
        other gets :data:`SUPERSEDED` as a :class:`Conflict`). Activating a connection that was active before bumps
        ``authorization_generation``, so bindings frozen under the old grant fail closed. ``credential`` is the
        sealed refresh token; ``oauth`` the non-secret grant description (issuer, endpoints, resource, scope);
        ``access`` the first access token (sealed, key id, expiry), shared with every process that needs it.
        """
        access_blob, access_key, access_expiry = access or (None, None, None)
        async with self.pool.acquire() as conn, conn.transaction():
            row = await fetch_model(
                conn,
                ConnectionRow,
                "UPDATE integration_connections SET status = 'active', credential_sealed = $5, "
                "credential_key_id = $6, oauth = $7, registration_id = $8, "
                "authorization_generation = authorization_generation "
                "+ CASE WHEN oauth_activated_at IS NULL THEN 0 ELSE 1 END, "
                "oauth_activated_at = clock_timestamp(), updated_at = now(), "
                "access_token_sealed = $9, access_token_key_id = $10, access_expires_at = $11 "
                "WHERE tenant_id = $1 AND id = $2 AND auth_kind = 'oauth' AND status <> 'revoked' "
                "AND authorization_generation = $3 AND (oauth_activated_at IS NULL OR oauth_activated_at < $4) "
                f"RETURNING {CONNECTION_FIELDS}",
                uuid.UUID(tenant_id),
                flow.connection_id,
                flow.expected_generation,
                flow.created_at,
                credential[0],
                credential[1],
                oauth,
                flow.registration_id,
                access_blob,
                access_key,
                access_expiry,
            )
            if row is None:
                status = await conn.fetchval(
                    "SELECT status FROM integration_connections WHERE tenant_id = $1 AND id = $2",
                    uuid.UUID(tenant_id),
                    flow.connection_id,
                )
                if status is None:
                    raise NotFound()
                if status == "revoked":
                    raise Conflict("connection is revoked")
                raise Conflict(SUPERSEDED)
            snapshot = await self._connections._append_snapshot(conn, row.id, None, photo)
            return row, snapshot

    @asynccontextmanager
    async def locked_grant(self, tenant_id: str, connection_id: str, generation: int) -> AsyncIterator[GrantLock]:
        """Hold the connection's row lock for one refresh (across every API and worker process).

        Yields the grant (sealed refresh and access tokens, ``oauth``, the registration with its sealed secrets)
        while the connection is active at ``generation``; otherwise raises :class:`Conflict` (re-authorized) or
        :class:`NotFound` (revoked, in error, gone). Writes made through the lock commit when the block exits.
        """
        async with self.pool.acquire() as conn, conn.transaction():
            row = await fetch_model(
                conn,
                LockedGrant,
                "SELECT c.status, c.authorization_generation, c.credential_sealed, c.access_token_sealed, "
                "c.access_expires_at, c.oauth, c.registration_id FROM integration_connections c "
                "WHERE c.tenant_id = $1 AND c.id = $2 AND c.auth_kind = 'oauth' FOR UPDATE",
                uuid.UUID(tenant_id),
                uuid.UUID(connection_id),
            )
            if row is None or row.status != "active" or row.credential_sealed is None:
                raise NotFound("the connection is not active")
            if row.authorization_generation != generation:
                raise Conflict("the connection was re-authorized; this binding is stale")
            registration = await fetch_model(
                conn,
                OAuthClientRegistration,
                f"SELECT {REGISTRATION_FIELDS}, {REGISTRATION_SECRETS} FROM oauth_client_registrations WHERE id = $1",
                row.registration_id,
            )
            assert registration is not None  # registrations are never deleted
            yield GrantLock(conn, connection_id, row, registration)

    async def store_rotated(self, connection_id: str, generation: int, credential: tuple[bytes, str]) -> bool:
        """Replace the sealed refresh token after the server rotated it; ``False`` (nothing written) when the
        connection is no longer active at ``generation`` (revoked, or re-authorized meanwhile)."""
        async with self.pool.acquire() as conn:
            done = await conn.fetchval(
                "UPDATE integration_connections SET credential_sealed = $3, credential_key_id = $4, updated_at = now() "
                "WHERE id = $1 AND authorization_generation = $2 AND status = 'active' RETURNING true",
                uuid.UUID(connection_id),
                generation,
                credential[0],
                credential[1],
            )
        return bool(done)

    async def mark_error(self, connection_id: str, generation: int, reason: str) -> bool:
        """A refresh failed for good (``invalid_grant``): the connection goes to ``error`` with the provider's
        reason in ``oauth.last_error``, unless it was re-authorized or revoked meanwhile (``False``)."""
        async with self.pool.acquire() as conn:
            done = await conn.fetchval(
                "UPDATE integration_connections SET status = 'error', credential_sealed = NULL, updated_at = now(), "
                "access_token_sealed = NULL, access_expires_at = NULL, "
                "oauth = coalesce(oauth, '{}'::jsonb) || jsonb_build_object('last_error', $3::text) "
                "WHERE id = $1 AND authorization_generation = $2 AND status = 'active' RETURNING true",
                uuid.UUID(connection_id),
                generation,
                reason,
            )
        return bool(done)

    @staticmethod
    async def _refusal(conn: Any, predicate: str, *values: object) -> Exception:
        """Why a flow could not be bound or claimed (read after the conditional update found nothing)."""
        row = await conn.fetchrow(
            "SELECT consumed_at IS NOT NULL AS used, expires_at <= now() AS expired "
            f"FROM connector_oauth_flows WHERE {predicate}",
            *values,
        )
        if row is None:
            return NotFound("this sign-in is unknown; start the connection again")
        if row["used"]:
            return Conflict("this sign-in was already completed; start the connection again")
        if row["expired"]:
            return NotFound("this sign-in expired; start the connection again")
        return Forbidden("this sign-in was started in another browser; finish it there or start again")


class GrantLock:
    """One connection's grant under its row lock (see :meth:`OAuthRecords.locked_grant`)."""

    def __init__(self, conn: Any, connection_id: str, row: LockedGrant, registration: OAuthClientRegistration) -> None:
        self._conn = conn
        self.connection_id = connection_id
        self.row = row
        self.registration = registration

    async def save(self, *, access: tuple[bytes, str, datetime | None], refresh: tuple[bytes, str] | None) -> None:
        """Store a refreshed access token and, when the server rotated it, the new refresh token."""
        await self._conn.execute(
            "UPDATE integration_connections SET access_token_sealed = $2, access_token_key_id = $3, "
            "access_expires_at = $4, credential_sealed = coalesce($5, credential_sealed), "
            "credential_key_id = coalesce($6, credential_key_id), updated_at = now() WHERE id = $1",
            uuid.UUID(self.connection_id),
            access[0],
            access[1],
            access[2],
            refresh[0] if refresh else None,
            refresh[1] if refresh else None,
        )

    async def fail(self, reason: str) -> None:
        """The grant is gone for good: ``error`` status, no tokens kept, the provider's reason recorded."""
        await self._conn.execute(
            "UPDATE integration_connections SET status = 'error', credential_sealed = NULL, "
            "access_token_sealed = NULL, access_expires_at = NULL, updated_at = now(), "
            "oauth = coalesce(oauth, '{}'::jsonb) || jsonb_build_object('last_error', $2::text) WHERE id = $1",
            uuid.UUID(self.connection_id),
            reason,
        )
