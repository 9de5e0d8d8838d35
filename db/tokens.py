"""Run-scoped bearer tokens: minted per audience at provision, stored as sha256, revoked at the end."""

from __future__ import annotations

import uuid

from core.tokens import BOOTSTRAP_AUDIENCE, RUN_AUDIENCES, session_token, token_digest
from db._base import Conn, ReadModel, Repository
from db.ids import new_id


class RunTokenGrant(ReadModel):
    """What a run-scoped token grants, and whether it still does (its run's status included)."""

    session_id: uuid.UUID
    tenant_id: uuid.UUID
    audience: str
    revoked: bool
    expired: bool
    status: str


class RunTokens(Repository):
    async def mint_tokens(self, tenant_id: str, run_id: str, ttl_secs: int, randoms: dict[str, str]) -> dict[str, str]:
        """Mint the run's four audience tokens; a retried provision revokes the earlier set first."""
        tokens = {aud.value: session_token(randoms[aud.value]) for aud in RUN_AUDIENCES}
        async with self.pool.acquire() as conn, conn.transaction():
            await self.revoke_tokens(conn, run_id)
            for audience, token in tokens.items():
                await self._insert_token(conn, tenant_id, run_id, audience, token, ttl_secs)
        return tokens

    async def burn_bootstrap(self, token: str) -> RunTokenGrant | None:
        """Spend a one-time bootstrap credential: exactly one caller gets its grant, every later one None."""
        return await self.one(
            RunTokenGrant,
            "WITH burnt AS (UPDATE api_tokens SET revoked_at = now() WHERE token_sha256 = $1 AND audience = $2"
            " AND revoked_at IS NULL AND expires_at > now() RETURNING session_id, tenant_id, audience)"
            " SELECT b.session_id, b.tenant_id, b.audience, false AS revoked, false AS expired, s.status"
            " FROM burnt b JOIN sessions s ON s.id = b.session_id",
            token_digest(token),
            BOOTSTRAP_AUDIENCE,
        )

    async def issue_token(self, tenant_id: str, run_id: str, audience: str, ttl_secs: int, random_hex: str) -> str:
        """One more run-scoped token (operator tooling and tests); the runner's own stay valid."""
        token = session_token(random_hex)
        async with self.pool.acquire() as conn:
            await self._insert_token(conn, tenant_id, run_id, audience, token, ttl_secs)
        return token

    async def _insert_token(self, conn: Conn, tenant_id: str, run_id: str, audience: str, token: str, ttl: int) -> None:
        await conn.execute(
            "INSERT INTO api_tokens (id, token_sha256, tenant_id, kind, session_id, audience, expires_at) "
            "VALUES ($1, $2, $3, 'session', $4, $5, now() + make_interval(secs => $6))",
            uuid.UUID(new_id()),
            token_digest(token),
            uuid.UUID(tenant_id),
            uuid.UUID(run_id),
            audience,
            float(ttl),
        )

    async def resolve_token(self, token: str) -> RunTokenGrant | None:
        return await self.one(
            RunTokenGrant,
            "SELECT t.session_id, t.tenant_id, t.audience, t.revoked_at IS NOT NULL AS revoked,"
            " t.expires_at < now() AS expired, s.status FROM api_tokens t "
            "JOIN sessions s ON s.id = t.session_id WHERE t.token_sha256 = $1",
            token_digest(token),
        )

    async def revoke_tokens(self, conn: Conn, run_id: str) -> None:
        await conn.execute(
            "UPDATE api_tokens SET revoked_at = now() WHERE session_id = $1 AND revoked_at IS NULL", uuid.UUID(run_id)
        )

    async def renew_tokens(self, run_id: str, ttl_secs: int) -> None:
        await self.execute(
            "UPDATE api_tokens SET expires_at = now() + make_interval(secs => $2) "
            "WHERE session_id = $1 AND revoked_at IS NULL",
            uuid.UUID(run_id),
            float(ttl_secs),
        )
