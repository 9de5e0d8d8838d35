"""Users, org memberships and personal access tokens (PATs).

A membership is the kill switch: every PAT use re-checks, in the same statement that finds the
token, that the token is live and that its user, membership and tenant are all still active. A PAT
is ``fbx_pat_`` + 64 hex characters, stored only as its sha256 and shown once, when minted. Every
accepted membership mutation writes ``auth_audit_log`` in its own transaction.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import asyncpg

from core.errors import BadRequest, Conflict, NotFound
from core.tokens import token_digest
from db._base import Conn, ReadModel, Repository, fetch_model, known_id
from db.ids import new_id
from db.models.runs import Run

PAT_PREFIX = "fbx_pat_"
ROLES: tuple[str, ...] = ("member", "approver", "admin", "owner")
PAT_DEFAULT_SECS = 90 * 86400
PAT_MIN_SECS = 60
PAT_MAX_SECS = 365 * 86400
MAX_TOKEN_NAME = 100
# How stale ``last_used_at`` may get before a use writes it again (a write per request is waste).
LAST_USED_GRANULARITY_SECS = 60

MEMBER_FIELDS = (
    "m.id, m.tenant_id, m.user_id, m.roles, m.status, m.deactivated_at, m.created_at, m.updated_at, "
    "u.email, u.name, u.status AS user_status"
)
PAT_FIELDS = "id, name, display_prefix, expires_at, last_used_at, revoked_at, created_at"


def normalize_email(email: str) -> str:
    return email.strip().lower()


def check_roles(roles: Iterable[str]) -> list[str]:
    """A non-empty subset of member/approver/admin/owner, in canonical order; anything else is a 400."""
    wanted = list(roles)
    unknown = sorted(set(wanted) - set(ROLES))
    if unknown:
        raise BadRequest(f"unknown role(s) {', '.join(unknown)} (roles: {', '.join(ROLES)})")
    if not wanted:
        raise BadRequest(f"roles must name at least one of {', '.join(ROLES)}")
    return [r for r in ROLES if r in wanted]


def clamp_expiry(expires_in: int | None) -> int:
    """PAT lifetime in seconds: default 90 days, clamped to 60 s … 365 days."""
    if expires_in is None:
        return PAT_DEFAULT_SECS
    return max(PAT_MIN_SECS, min(PAT_MAX_SECS, int(expires_in)))


class Org(ReadModel):
    """An org (``tenants``) as the admin API names it: ``display_name`` falls back to ``name``."""

    id: uuid.UUID
    slug: str
    name: str
    display_name: str
    status: str
    created_at: datetime


class Member(ReadModel):
    """A membership with its user's email, name and status (``org_memberships`` joined with ``users``)."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    user_id: uuid.UUID
    roles: list[str]
    status: str
    deactivated_at: datetime | None
    created_at: datetime
    updated_at: datetime
    email: str
    name: str
    user_status: str


class Pat(ReadModel):
    """A personal access token as its owner may see it (never the token, nor its digest)."""

    id: uuid.UUID
    name: str | None
    display_prefix: str | None
    expires_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None
    created_at: datetime


class PatPrincipal(ReadModel):
    """The live member behind a PAT: whose it is, their roles, and their org."""

    token_id: uuid.UUID
    tenant_id: uuid.UUID
    membership_id: uuid.UUID
    user_id: uuid.UUID
    roles: list[str]
    email: str
    name: str
    org_slug: str
    org_display_name: str
    read_only: bool


class Identity(Repository):
    async def boot_tenant(self) -> str:
        """The boot organization (slug ``default``), created on first use: the operator's and the embedded stack's."""
        async with self.pool.acquire() as conn:
            await conn.execute(
                "INSERT INTO tenants (id, name, slug) VALUES ($1, 'default', 'default') ON CONFLICT DO NOTHING",
                uuid.UUID(new_id()),
            )
            return str(await conn.fetchval("SELECT id FROM tenants WHERE slug = 'default'"))

    # ---- orgs ----------------------------------------------------------------------------------

    async def org(self, slug: str) -> Org | None:
        return await self.one(
            Org,
            "SELECT id, slug, name, coalesce(display_name, name) AS display_name, status, created_at "
            "FROM tenants WHERE slug = $1",
            slug,
        )

    async def _audit(
        self, conn: Conn, tenant_id: str | None, actor: tuple[str, str | None], action: str, target: str, **detail: Any
    ) -> None:
        await conn.execute(
            "INSERT INTO auth_audit_log (id, tenant_id, actor_kind, actor_id, action, target, success, detail) "
            "VALUES ($1, $2, $3, $4, $5, $6, true, $7)",
            uuid.UUID(new_id()),
            uuid.UUID(tenant_id) if tenant_id else None,
            actor[0],
            actor[1],
            action,
            target,
            detail,
        )

    # ---- users and memberships -----------------------------------------------------------------

    async def add_user(
        self, tenant_id: str, email: str, name: str, roles: Iterable[str], *, actor: tuple[str, str | None]
    ) -> Member:
        """A local user (no IdP identity yet) and their active membership, in one transaction."""
        canonical = check_roles(roles)
        address = email.strip()
        if "@" not in address or len(address) > 320:
            raise BadRequest(f"'{email}' is not an email address")
        if not name.strip():
            raise BadRequest("a user needs a name")
        async with self.pool.acquire() as conn, conn.transaction():
            try:
                user_id = await conn.fetchval(
                    "INSERT INTO users (id, tenant_id, email, email_normalized, name) VALUES ($1,$2,$3,$4,$5) "
                    "RETURNING id",
                    uuid.UUID(new_id()),
                    uuid.UUID(tenant_id),
                    address,
                    normalize_email(address),
                    name.strip(),
                )
            except asyncpg.UniqueViolationError:
                raise Conflict(f"a user with email '{address}' already exists in this org") from None
            membership_id = await conn.fetchval(
                "INSERT INTO org_memberships (id, tenant_id, user_id, roles) VALUES ($1,$2,$3,$4) RETURNING id",
                uuid.UUID(new_id()),
                uuid.UUID(tenant_id),
                user_id,
                canonical,
            )
            await self._audit(conn, tenant_id, actor, "user.add", str(membership_id), email=address, roles=canonical)
            return await self._member(conn, tenant_id, str(membership_id))

    async def _member(self, conn: Conn, tenant_id: str, membership_id: str) -> Member:
        mid = known_id(membership_id)
        row = await fetch_model(
            conn,
            Member,
            f"SELECT {MEMBER_FIELDS} FROM org_memberships m JOIN users u ON u.id = m.user_id "
            "WHERE m.tenant_id = $1 AND m.id = $2",
            uuid.UUID(tenant_id),
            mid,
        )
        if row is None:
            raise NotFound()
        return row

    async def member(self, tenant_id: str, membership_id: str) -> Member:
        async with self.pool.acquire() as conn:
            return await self._member(conn, tenant_id, membership_id)

    async def member_by_email(self, tenant_id: str, email: str) -> Member | None:
        return await self.one(
            Member,
            f"SELECT {MEMBER_FIELDS} FROM org_memberships m JOIN users u ON u.id = m.user_id "
            "WHERE m.tenant_id = $1 AND u.email_normalized = $2 ORDER BY u.created_at LIMIT 1",
            uuid.UUID(tenant_id),
            normalize_email(email),
        )

    async def members(self, tenant_id: str) -> list[Member]:
        return await self.many(
            Member,
            f"SELECT {MEMBER_FIELDS} FROM org_memberships m JOIN users u ON u.id = m.user_id "
            "WHERE m.tenant_id = $1 ORDER BY u.email_normalized",
            uuid.UUID(tenant_id),
        )

    async def deactivate(self, tenant_id: str, membership_id: str, *, actor: tuple[str, str | None]) -> Member:
        """The kill switch: from the next request on, the member's PATs are 401 and brokered calls
        under their personal connections are denied, including in runs already in flight."""
        async with self.pool.acquire() as conn, conn.transaction():
            current = await self._member(conn, tenant_id, membership_id)
            if current.status == "deactivated":
                raise Conflict("membership is already deactivated")
            await conn.execute(
                "UPDATE org_memberships SET status = 'deactivated', deactivated_at = now(), updated_at = now() "
                "WHERE id = $1",
                uuid.UUID(membership_id),
            )
            await self._audit(conn, tenant_id, actor, "membership.deactivate", membership_id)
            return await self._member(conn, tenant_id, membership_id)

    async def set_roles(
        self, tenant_id: str, membership_id: str, roles: Iterable[str], *, actor: tuple[str, str | None]
    ) -> Member:
        canonical = check_roles(roles)
        async with self.pool.acquire() as conn, conn.transaction():
            before = await self._member(conn, tenant_id, membership_id)
            await conn.execute(
                "UPDATE org_memberships SET roles = $2, updated_at = now() WHERE id = $1",
                uuid.UUID(membership_id),
                canonical,
            )
            await self._audit(
                conn, tenant_id, actor, "membership.roles", membership_id, before=before.roles, after=canonical
            )
            return await self._member(conn, tenant_id, membership_id)

    # ---- personal access tokens ----------------------------------------------------------------

    async def mint_pat(
        self,
        tenant_id: str,
        membership_id: str,
        name: str,
        expires_in: int | None,
        *,
        actor: tuple[str, str | None],
        read_only: bool = False,
    ) -> tuple[str, Pat]:
        """A new PAT for an active membership: the token (shown once, never stored) and its row. A ``read_only``
        token (audience ``read``) is refused on every method that may change something."""
        label = name.strip()
        if not label or len(label) > MAX_TOKEN_NAME:
            raise BadRequest(f"a token name must be 1 to {MAX_TOKEN_NAME} characters")
        token = PAT_PREFIX + secrets.token_hex(32)
        async with self.pool.acquire() as conn, conn.transaction():
            member = await self._member(conn, tenant_id, membership_id)
            if member.status != "active" or member.user_status != "active":
                raise Conflict("the membership is deactivated; it cannot get new tokens")
            row = await fetch_model(
                conn,
                Pat,
                "INSERT INTO api_tokens (id, token_sha256, tenant_id, kind, audience, expires_at, membership_id, "
                "user_id, name, display_prefix) VALUES ($1, $2, $3, 'pat', $9, "
                "now() + make_interval(secs => $4), $5, $6, $7, $8) "
                f"RETURNING {PAT_FIELDS}",
                uuid.UUID(new_id()),
                token_digest(token),
                uuid.UUID(tenant_id),
                float(clamp_expiry(expires_in)),
                uuid.UUID(membership_id),
                member.user_id,
                label,
                token[: len(PAT_PREFIX) + 8],
                "read" if read_only else "all",
            )
            assert row is not None
            await self._audit(conn, tenant_id, actor, "pat.mint", str(row.id), membership_id=membership_id, name=label)
        return token, row

    async def resolve_pat(self, token: str) -> PatPrincipal | None:
        """The live principal behind a PAT, or None: unknown, revoked or expired token, or a user,
        membership or tenant that is no longer active. One statement, which also touches
        ``last_used_at`` at most once a minute."""
        if not token.startswith(PAT_PREFIX):
            return None
        return await self.one(
            PatPrincipal,
            "WITH hit AS ("
            " SELECT t.id AS token_id, t.tenant_id, t.membership_id, t.user_id, t.last_used_at, m.roles,"
            " t.audience, u.email, u.name, n.slug AS org_slug,"
            " coalesce(n.display_name, n.name) AS org_display_name"
            " FROM api_tokens t JOIN org_memberships m ON m.id = t.membership_id"
            " JOIN users u ON u.id = t.user_id JOIN tenants n ON n.id = t.tenant_id"
            " WHERE t.token_sha256 = $1 AND t.kind = 'pat' AND t.revoked_at IS NULL AND t.expires_at > now()"
            " AND m.status = 'active' AND u.status = 'active' AND n.status = 'active'"
            " AND m.user_id = t.user_id AND m.tenant_id = t.tenant_id),"
            " touch AS (UPDATE api_tokens SET last_used_at = now() WHERE id = (SELECT token_id FROM hit)"
            " AND (last_used_at IS NULL OR last_used_at < now() - make_interval(secs => $2)))"
            " SELECT token_id, tenant_id, membership_id, user_id, roles, email, name, org_slug,"
            " org_display_name, audience = 'read' AS read_only FROM hit",
            token_digest(token),
            float(LAST_USED_GRANULARITY_SECS),
        )

    async def revoke_pat(self, tenant_id: str, token_id: str, *, actor: tuple[str, str | None]) -> Pat:
        """Revoke one PAT (from the next request on it is 401); 409 the second time."""
        tid = known_id(token_id)
        async with self.pool.acquire() as conn, conn.transaction():
            row = await fetch_model(
                conn,
                Pat,
                "UPDATE api_tokens SET revoked_at = now() WHERE id = $1 AND tenant_id = $2 AND kind = 'pat' "
                f"AND revoked_at IS NULL RETURNING {PAT_FIELDS}",
                tid,
                uuid.UUID(tenant_id),
            )
            if row is None:
                exists = await conn.fetchval(
                    "SELECT 1 FROM api_tokens WHERE id = $1 AND tenant_id = $2 AND kind = 'pat'",
                    tid,
                    uuid.UUID(tenant_id),
                )
                raise Conflict("token is already revoked") if exists else NotFound("no such personal access token")
            await self._audit(conn, tenant_id, actor, "pat.revoke", token_id)
            return row

    async def tokens(self, membership_id: str) -> list[Pat]:
        """The member's PATs (never the token itself), newest first."""
        return await self.many(
            Pat,
            f"SELECT {PAT_FIELDS} FROM api_tokens WHERE kind = 'pat' AND membership_id = $1 ORDER BY created_at DESC",
            uuid.UUID(membership_id),
        )

    # ---- run visibility ------------------------------------------------------------------------

    async def runs_invoked_by(self, tenant_id: str, user_id: str, limit: int, status: str | None = None) -> list[Run]:
        """What a plain member may list: only the runs they invoked (filtered in SQL)."""
        return await self.many(
            Run,
            "SELECT * FROM sessions WHERE tenant_id = $1 AND invoked_by_user_id = $2 "
            "AND ($4::text IS NULL OR status = $4) ORDER BY created_at DESC, id DESC LIMIT $3",
            uuid.UUID(tenant_id),
            uuid.UUID(user_id),
            limit,
            status,
        )
