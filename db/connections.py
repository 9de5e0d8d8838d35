"""Connections, their tool snapshots, per-run bindings and brokered execution claims.

A connection holds one sealed credential and append-only "photographs" of the server's tools. A run
binds each requirement slot to one connection and snapshot at creation (frozen); the broker re-checks
that binding and claims ``(session, tool_call_id, input_digest)`` before any credential is touched.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal
from urllib.parse import urlsplit

import asyncpg
from pydantic import Field

from core import events as ev
from core.access import NONE, classify, definition
from core.errors import Conflict, NotFound
from db._base import Conn, ReadModel, Repository, as_model, fetch_model, fetch_models, uuid_or_none
from db.ids import new_id
from db.ledger import Ledger
from db.models.connections import (
    ConnectionApprovedTool,
    ConnectionToolChange,
    ConnectionToolSnapshot,
    ToolExecutionClaim,
)

CONNECTION_FIELDS = (
    "id, tenant_id, provider, display_name, base_url, auth_kind, header_name, scheme, status, owner_type, "
    "owner_user_id, created_by_user_id, authorization_generation, metadata, created_at, updated_at, access, "
    "transport, transport_config"
)
MAX_ATTEMPTS = 3
CLAIM_TTL_SECS = 600.0


@dataclass(frozen=True)
class RegisteredClaim:
    """A brokered call's execution claim as :meth:`Connections.register_claim` found or made it."""

    claim: ToolExecutionClaim
    lapsed: bool
    """``claimed`` for longer than :data:`CLAIM_TTL_SECS` by the database's clock: its dispatcher is presumed
    lost, and :meth:`Connections.expire_stale` will settle it ``ambiguous``."""


ClaimOutcome = Literal["succeeded", "failed_upstream", "failed_before_send", "ambiguous", "refused"]
"""What a ``claimed`` execution claim settles as: the transport's outcome, or ``refused`` (nothing was sent)."""


def same_origin(a: str, b: str) -> bool:
    """Scheme, host and path (trailing slash ignored) agree: the binding's notion of "the same server"."""
    pa, pb = urlsplit(a), urlsplit(b)
    return (pa.scheme.lower(), pa.netloc.lower(), pa.path.rstrip("/")) == (
        pb.scheme.lower(),
        pb.netloc.lower(),
        pb.path.rstrip("/"),
    )


def credential_context(tenant_id: str) -> str:
    """The AAD context of a connection credential: a blob moved to another tenant or column fails."""
    return f"{tenant_id}:integration_connections.credential"


class ConnectionRow(ReadModel):
    """A connection as every layer above ``db/`` sees it: the columns of :data:`CONNECTION_FIELDS`, never
    the sealed credential (only :meth:`Connections.credential` reads that)."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    provider: str
    display_name: str
    base_url: str
    auth_kind: str
    header_name: str | None
    scheme: str
    status: str
    owner_type: str
    owner_user_id: uuid.UUID | None
    created_by_user_id: uuid.UUID | None
    authorization_generation: int
    metadata: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    access: dict[str, Any] = Field(description="Which tools read and which write (normalized; see docs/api.md).")
    transport: str = Field(
        description="`mcp_http`, `openapi`, `http`, `stdio`, `relay`, `sandbox_cli` or `git` (who speaks to the server;"
        " a `git` connection is a credential for cloning private repositories)."
    )
    transport_config: dict[str, Any] = Field(
        description="The transport's non-secret configuration (a stdio environment's values are never shown)."
    )


class BindingCandidate(ReadModel):
    """An active connection a run may bind, with its latest snapshot and the tool definitions an admin approved
    (what :mod:`core.bindings` chooses among; it satisfies ``core.bindings.Candidate``)."""

    id: uuid.UUID
    base_url: str
    display_name: str
    authorization_generation: int
    owner_type: str
    owner_user_id: uuid.UUID | None
    access: dict[str, Any]
    transport: str
    snapshot_version: int
    protocol_version: str
    tools_json: list[dict[str, Any]]
    approved: dict[str, Any] = Field(description="Tool name → the definition an admin approved.")


class DispatchView(ReadModel):
    """What the broker checks before a brokered call: the claim's call, its frozen binding, the connection's live
    state and the run's status (:meth:`Connections.dispatch_view`)."""

    tool: str
    input: dict[str, Any]
    binding_id: uuid.UUID
    connection_id: uuid.UUID
    authority_generation: int
    connection_owner_type: str
    connection_owner_user_id: uuid.UUID | None
    live_owner_user_id: uuid.UUID | None
    connection_status: str
    live_generation: int
    live_owner_type: str
    base_url: str
    header_name: str | None
    scheme: str
    auth_kind: str
    transport: str
    transport_config: dict[str, Any]
    owner_active: bool | None = Field(description="A personal binding's owner is still an active member.")
    credential_sealed: bytes | None = Field(
        repr=False, description="Only while the connection still matches the binding (None otherwise)."
    )
    credential_env: str | None = Field(description="The environment variable an env-backed credential is read from.")
    run_status: str


@dataclass(frozen=True)
class NewConnection:
    """What a new connection is made of (its credential, if it stores one, is passed sealed beside it)."""

    provider: str
    display_name: str
    base_url: str
    auth_kind: str = "static"
    header_name: str | None = None
    scheme: str = "Bearer"
    transport: str = "mcp_http"
    transport_config: dict[str, Any] = field(default_factory=dict)
    owner_user_id: str | None = None
    created_by_user_id: str | None = None
    access: dict[str, Any] | None = None
    credential_env: str | None = None
    """A static credential that is configuration (this variable of the processes using it), not stored."""
    metadata: dict[str, Any] = field(default_factory=dict)


async def insert_connection(
    conn: Conn, tenant_id: str, new: NewConnection, *, status: str, credential: tuple[bytes, str] | None = None
) -> ConnectionRow:
    """Insert one connection in the caller's transaction (``new.owner_user_id`` set: a personal one)."""
    owner = new.owner_user_id
    row = await fetch_model(
        conn,
        ConnectionRow,
        "INSERT INTO integration_connections (id, tenant_id, provider, display_name, base_url, auth_kind, "
        "header_name, scheme, credential_sealed, credential_key_id, credential_env, status, owner_type, "
        "owner_user_id, created_by_user_id, transport, transport_config, access, metadata) "
        "VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$18,$19) "
        f"RETURNING {CONNECTION_FIELDS}",
        uuid.UUID(new_id()),
        uuid.UUID(tenant_id),
        new.provider,
        new.display_name,
        new.base_url,
        new.auth_kind,
        new.header_name,
        new.scheme,
        credential[0] if credential else None,
        credential[1] if credential else None,
        new.credential_env,
        status,
        "user" if owner else "organization",
        uuid.UUID(owner) if owner else None,
        uuid.UUID(new.created_by_user_id) if new.created_by_user_id else None,
        new.transport,
        new.transport_config,
        new.access or NONE,
        new.metadata,
    )
    assert row is not None
    return row


class Connections(Repository):
    def __init__(self, pool: asyncpg.Pool[Any], ledger: Ledger) -> None:
        super().__init__(pool)
        self.ledger = ledger

    # ---- connections ---------------------------------------------------------------------------

    async def create(
        self,
        tenant_id: str,
        new: NewConnection,
        photo: dict[str, Any] | None,
        credential: tuple[bytes, str] | None = None,
    ) -> tuple[ConnectionRow, ConnectionToolSnapshot | None]:
        """Insert the connection and, with ``photo``, its first snapshot in the same transaction: an active
        connection never exists unphotographed. Without ``photo`` it is ``pending`` (an ``oauth`` one waiting for
        its first sign-in): no snapshot, not bindable (only ``active`` connections bind).

        ``credential`` is the sealed credential and its key id; none for a connection whose credential is
        configuration (``new.credential_env``), for one without any, and for a pending one."""
        async with self.pool.acquire() as conn, conn.transaction():
            status = "active" if photo is not None else "pending"
            row = await insert_connection(conn, tenant_id, new, status=status, credential=credential)
            if photo is None:
                return row, None
            return row, await self._append_snapshot(conn, row.id, 1, photo)

    async def record_proposal(self, run_id: str, tool_call_id: str, data: dict[str, Any]) -> None:
        """Append ``connection.proposed`` once per (run, tool call): a runner re-attaching after a dropped
        connection repeats the request, not the event."""
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1 || ':' || $2))", run_id, tool_call_id)
            seen = await conn.fetchval(
                "SELECT EXISTS (SELECT 1 FROM events WHERE session_id = $1 AND type = 'connection.proposed' "
                "AND payload->'data'->>'tool_call_id' = $2)",
                uuid.UUID(run_id),
                tool_call_id,
            )
            if not seen:
                event = ev.NewEvent(
                    type="connection.proposed", actor="agent", data={"tool_call_id": tool_call_id, **data}
                )
                await self.ledger.append(conn, run_id, [event])

    async def save_proposal(
        self, tenant_id: str, run_id: str, tool_call_id: str, proposal: dict[str, str], agent: str
    ) -> tuple[ConnectionRow, bool]:
        """Save an approved dynamic-connection proposal once per (run, tool call): a ``pending`` connection with
        no credential (a human authorizes it before anything can bind to it), and the ``connection.saved`` event,
        in one transaction. Returns the row and whether this call created it."""
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1 || ':' || $2))", run_id, tool_call_id)
            existing = await fetch_model(
                conn,
                ConnectionRow,
                f"SELECT {CONNECTION_FIELDS} FROM integration_connections WHERE tenant_id = $1 "
                "AND metadata->>'proposed_in' = $2 AND metadata->>'proposed_call' = $3",
                uuid.UUID(tenant_id),
                run_id,
                tool_call_id,
            )
            if existing is not None:
                return existing, False
            transport = proposal["transport"]
            new = NewConnection(
                provider=transport,
                display_name=proposal["display_name"],
                base_url=proposal["base_url"],
                auth_kind="oauth" if transport == "mcp_http" else "none",
                transport=transport,
                metadata={"proposed_in": run_id, "proposed_call": tool_call_id, "proposed_by_agent": agent},
            )
            row = await insert_connection(conn, tenant_id, new, status="pending")
            event = ev.NewEvent(
                type="connection.saved",
                data={
                    "tool_call_id": tool_call_id,
                    "connection_id": str(row.id),
                    "transport": transport,
                    "base_url": proposal["base_url"],
                    "status": "pending",
                },
            )
            await self.ledger.append(conn, run_id, [event])
            return row, True

    async def discard_pending_oauth(self, tenant_id: str, connection_id: str) -> None:
        """Remove an ``oauth`` connection that never signed in (its first sign-in could not even start)."""
        await self.execute(
            "DELETE FROM integration_connections WHERE tenant_id = $1 AND id = $2 AND auth_kind = 'oauth' "
            "AND status = 'pending' AND oauth_activated_at IS NULL",
            uuid.UUID(tenant_id),
            uuid.UUID(connection_id),
        )

    async def all(self, tenant_id: str, viewer_user_id: str | None = None) -> list[ConnectionRow]:
        """Organization connections plus the viewer's own personal ones (none for the operator)."""
        return await self.many(
            ConnectionRow,
            f"SELECT {CONNECTION_FIELDS} FROM integration_connections WHERE tenant_id = $1 "
            "AND (owner_type = 'organization' OR owner_user_id = $2) ORDER BY created_at DESC",
            uuid.UUID(tenant_id),
            uuid.UUID(viewer_user_id) if viewer_user_id else None,
        )

    async def get(self, tenant_id: str, connection_id: str) -> ConnectionRow | None:
        cid = uuid_or_none(connection_id)
        if cid is None:
            return None
        return await self.one(
            ConnectionRow,
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

    async def set_access(self, tenant_id: str, connection_id: str, access: dict[str, Any]) -> ConnectionRow:
        """Replace the connection's (normalized) access declaration; runs already bound keep theirs."""
        row = await self.one(
            ConnectionRow,
            "UPDATE integration_connections SET access = $3, updated_at = now() WHERE tenant_id = $1 AND id = $2 "
            f"RETURNING {CONNECTION_FIELDS}",
            uuid.UUID(tenant_id),
            uuid.UUID(connection_id),
            access,
        )
        if row is None:
            raise NotFound()
        return row

    async def revoke(self, tenant_id: str, connection_id: str) -> ConnectionRow:
        row = await self.one(
            ConnectionRow,
            "UPDATE integration_connections SET status = 'revoked', updated_at = now(), "
            "credential_sealed = NULL WHERE tenant_id = $1 AND id = $2 AND status <> 'revoked' "
            f"RETURNING {CONNECTION_FIELDS}",
            uuid.UUID(tenant_id),
            uuid.UUID(connection_id),
        )
        if row is None:
            if await self.get(tenant_id, connection_id) is None:
                raise NotFound()
            raise Conflict("connection is already revoked")
        return row

    async def replace_credential(
        self,
        tenant_id: str,
        connection_id: str,
        credential: tuple[bytes, str] | None,
        credential_env: str | None,
        photo: dict[str, Any],
    ) -> ConnectionRow:
        """Give a static connection a new credential (sealed, or from ``credential_env``): it becomes active
        again (a revocation undone) at the next authorization generation, with the new photograph. Runs bound
        under the old generation fail closed, or wait and move to the new one if they parked."""
        async with self.pool.acquire() as conn, conn.transaction():
            row = await fetch_model(
                conn,
                ConnectionRow,
                "UPDATE integration_connections SET status = 'active', credential_sealed = $3, "
                "credential_key_id = $4, credential_env = $5, authorization_generation = "
                "authorization_generation + 1, updated_at = now() "
                "WHERE tenant_id = $1 AND id = $2 AND auth_kind = 'static' "
                f"RETURNING {CONNECTION_FIELDS}",
                uuid.UUID(tenant_id),
                uuid.UUID(connection_id),
                credential[0] if credential else None,
                credential[1] if credential else None,
                credential_env,
            )
            if row is None:
                raise NotFound()
            await self._append_snapshot(conn, row.id, None, photo)
            return row

    # ---- snapshots -----------------------------------------------------------------------------

    async def _append_snapshot(
        self, conn: Conn, connection_id: uuid.UUID, version: int | None, photo: dict[str, Any]
    ) -> ConnectionToolSnapshot:
        """Insert snapshot ``version`` (None: the next one) and screen its tools against the approved
        definitions (see :meth:`_screen`), in the caller's transaction."""
        if version is None:
            version = await conn.fetchval(
                "SELECT coalesce(max(snapshot_version), 0) + 1 FROM connection_tool_snapshots WHERE connection_id = $1",
                connection_id,
            )
        row = await fetch_model(
            conn,
            ConnectionToolSnapshot,
            "INSERT INTO connection_tool_snapshots (id, connection_id, snapshot_version, "
            "authorization_generation, protocol_version, tools_json, tools_digest) "
            "SELECT $1, $2, $3, authorization_generation, $4, $5, $6 FROM integration_connections "
            "WHERE id = $2 RETURNING *",
            uuid.UUID(new_id()),
            connection_id,
            version,
            photo["protocol_version"],
            photo["tools"],
            photo["digest"],
        )
        assert row is not None and version is not None
        await self._screen(conn, connection_id, version, photo["tools"])
        return row

    async def _screen(self, conn: Conn, connection_id: uuid.UUID, version: int, tools: list[dict[str, Any]]) -> None:
        """Quarantine what an admin has not seen. The first snapshot is approved as it stands (by whoever
        created the connection); later, a tool whose definition differs from its approved one, or a new
        tool, gets one ``pending`` change (a newer definition supersedes an older pending one; a definition
        already rejected is not proposed again), and a tool back at its approved definition (or gone) has
        nothing pending."""
        cid = connection_id
        if version == 1:
            creator = await conn.fetchval(
                "SELECT coalesce('user:' || created_by_user_id::text, 'operator') FROM integration_connections "
                "WHERE id = $1",
                cid,
            )
            for tool in tools:
                await conn.execute(
                    "INSERT INTO connection_approved_tools (connection_id, tool_name, definition, approved_by) "
                    "VALUES ($1,$2,$3,$4) ON CONFLICT (connection_id, tool_name) DO UPDATE SET "
                    "definition = EXCLUDED.definition, approved_by = EXCLUDED.approved_by, approved_at = now(), "
                    "change_id = NULL",
                    cid,
                    tool["name"],
                    definition(tool),
                    f"{creator} (connection created)",
                )
            return
        approved = {
            r["tool_name"]: r["definition"]
            for r in await conn.fetch(
                "SELECT tool_name, definition FROM connection_approved_tools WHERE connection_id = $1", cid
            )
        }
        pending = {
            r["tool_name"]: r
            for r in await conn.fetch(
                "SELECT id, tool_name, proposed FROM connection_tool_changes WHERE connection_id = $1 "
                "AND status = 'pending'",
                cid,
            )
        }
        # A definition an admin already rejected is not proposed again (it stays quarantined).
        rejected = {
            r["tool_name"]: r["proposed"]
            for r in await conn.fetch(
                "SELECT DISTINCT ON (tool_name) tool_name, proposed FROM connection_tool_changes "
                "WHERE connection_id = $1 AND status = 'rejected' ORDER BY tool_name, decided_at DESC",
                cid,
            )
        }
        listed = {t["name"] for t in tools}
        stale = [r["id"] for name, r in pending.items() if name not in listed]
        fresh: list[tuple[str, dict[str, Any]]] = []
        for tool in tools:
            name, proposed = tool["name"], definition(tool)
            held = pending.get(name)
            if approved.get(name) == proposed or rejected.get(name) == proposed:
                if held is not None:
                    stale.append(held["id"])
            elif held is None or held["proposed"] != proposed:
                if held is not None:
                    stale.append(held["id"])
                fresh.append((name, proposed))
        if stale:
            await conn.execute(
                "UPDATE connection_tool_changes SET status = 'superseded', decided_at = now(), "
                "decided_by = 'refresh' WHERE id = ANY($1::uuid[]) AND status = 'pending'",
                stale,
            )
        for name, proposed in fresh:
            await conn.execute(
                "INSERT INTO connection_tool_changes (id, tenant_id, connection_id, tool_name, kind, "
                "snapshot_version, previous, proposed) SELECT $1, tenant_id, id, $2, $3, $4, $5, $6 "
                "FROM integration_connections WHERE id = $7",
                uuid.UUID(new_id()),
                name,
                "changed" if name in approved else "added",
                version,
                approved.get(name),
                proposed,
                cid,
            )

    async def refresh(self, connection_id: str, generation: int, photo: dict[str, Any]) -> ConnectionToolSnapshot:
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
            return await self._append_snapshot(conn, uuid.UUID(connection_id), None, photo)

    # ---- tool-definition changes (quarantine) ----------------------------------------------------

    async def tool_changes(self, connection_id: str, status: str | None = None) -> list[ConnectionToolChange]:
        """Newest first; ``status`` narrows (``pending`` is what awaits review)."""
        return await self.many(
            ConnectionToolChange,
            "SELECT * FROM connection_tool_changes WHERE connection_id = $1 AND ($2::text IS NULL OR status = $2) "
            "ORDER BY created_at DESC, tool_name",
            uuid.UUID(connection_id),
            status,
        )

    async def tool_change(self, connection_id: str, change_id: str) -> ConnectionToolChange | None:
        cid = uuid_or_none(change_id)
        if cid is None:
            return None
        return await self.one(
            ConnectionToolChange,
            "SELECT * FROM connection_tool_changes WHERE connection_id = $1 AND id = $2",
            uuid.UUID(connection_id),
            cid,
        )

    async def approved_tools(self, connection_id: str) -> list[ConnectionApprovedTool]:
        return await self.many(
            ConnectionApprovedTool,
            "SELECT * FROM connection_approved_tools WHERE connection_id = $1 ORDER BY tool_name",
            uuid.UUID(connection_id),
        )

    async def decide_tool_change(
        self,
        tenant_id: str,
        connection_id: str,
        change_id: str,
        decision: str,
        actor: tuple[str, str | None],
    ) -> ConnectionToolChange:
        """CAS ``pending`` → ``approved`` | ``rejected`` (who and when), audited in the same transaction.
        Approving makes the proposed definition the approved one: new runs bind the tool again.
        A change that is no longer pending (decided, or superseded by a newer refresh) is a 409."""
        kind, actor_id = actor
        by = f"{kind}:{actor_id}" if actor_id else kind
        async with self.pool.acquire() as conn, conn.transaction():
            row = as_model(
                ConnectionToolChange,
                await conn.fetchrow(
                    "UPDATE connection_tool_changes SET status = $4, decided_by = $5, decided_by_user_id = $6, "
                    "decided_at = now() WHERE tenant_id = $1 AND connection_id = $2 AND id = $3 "
                    "AND status = 'pending' RETURNING *",
                    uuid.UUID(tenant_id),
                    uuid.UUID(connection_id),
                    uuid.UUID(change_id),
                    decision,
                    by,
                    uuid.UUID(actor_id) if kind == "user" and actor_id else None,
                ),
            )
            if row is None:
                current = await self.tool_change(connection_id, change_id)
                if current is None:
                    raise NotFound()
                raise Conflict(f"this tool change is already {current.status}")
            if decision == "approved":
                await conn.execute(
                    "INSERT INTO connection_approved_tools (connection_id, tool_name, definition, approved_by, "
                    "change_id) VALUES ($1,$2,$3,$4,$5) ON CONFLICT (connection_id, tool_name) DO UPDATE SET "
                    "definition = EXCLUDED.definition, approved_by = EXCLUDED.approved_by, approved_at = now(), "
                    "change_id = EXCLUDED.change_id",
                    row.connection_id,
                    row.tool_name,
                    row.proposed,
                    by,
                    row.id,
                )
            await conn.execute(
                "INSERT INTO auth_audit_log (id, tenant_id, actor_kind, actor_id, action, target, success, detail) "
                "VALUES ($1, $2, $3, $4, $5, $6, true, $7)",
                uuid.UUID(new_id()),
                uuid.UUID(tenant_id),
                kind,
                actor_id,
                f"connection.tool_change.{'approve' if decision == 'approved' else 'reject'}",
                connection_id,
                {"change_id": change_id, "tool": row.tool_name, "kind": row.kind},
            )
            return row

    async def latest_snapshot(self, connection_id: str) -> ConnectionToolSnapshot | None:
        return await self.one(
            ConnectionToolSnapshot,
            "SELECT * FROM connection_tool_snapshots WHERE connection_id = $1 ORDER BY snapshot_version DESC LIMIT 1",
            uuid.UUID(connection_id),
        )

    # ---- bindings ------------------------------------------------------------------------------

    async def candidates(self, tenant_id: str, owner_user_id: str | None = None) -> list[BindingCandidate]:
        """Active connections with their latest snapshot, newest first: the organization's, or (with
        ``owner_user_id``) that user's personal ones."""
        return await self.many(
            BindingCandidate,
            "SELECT c.id, c.base_url, c.display_name, c.authorization_generation, c.owner_type, "
            "c.owner_user_id, c.access, c.transport, s.snapshot_version, s.protocol_version, s.tools_json, "
            "(SELECT coalesce(jsonb_object_agg(a.tool_name, a.definition), '{}'::jsonb) "
            " FROM connection_approved_tools a WHERE a.connection_id = c.id) AS approved "
            "FROM integration_connections c JOIN LATERAL ("
            " SELECT * FROM connection_tool_snapshots t WHERE t.connection_id = c.id"
            " ORDER BY snapshot_version DESC LIMIT 1) s ON true "
            "WHERE c.tenant_id = $1 AND c.status = 'active' AND CASE WHEN $2::uuid IS NULL "
            "THEN c.owner_type = 'organization' ELSE c.owner_type = 'user' AND c.owner_user_id = $2 END "
            "ORDER BY c.created_at DESC",
            uuid.UUID(tenant_id),
            uuid.UUID(owner_user_id) if owner_user_id else None,
        )

    async def requirement_classes(
        self, tenant_id: str, policy_id: str | None = None
    ) -> dict[str, tuple[str | None, str | None]]:
        """``mcp__<slot>__<tool>`` → ``(access, approval)`` for every required tool of the tenant's agents'
        latest revisions (those naming ``policy_id``, when given), classified by the organization
        connection a run would bind now (the newest active one to the URL); ``(None, None)`` when none
        classifies it. What the policy matrix shows; runs freeze their own at creation."""
        async with self.pool.acquire() as conn:
            revisions = await conn.fetch(
                "SELECT DISTINCT ON (r.agent_id) r.policy_id, r.connection_requirements FROM agent_revisions r "
                "WHERE r.tenant_id = $1 ORDER BY r.agent_id, r.rev DESC",
                uuid.UUID(tenant_id),
            )
            connections = await conn.fetch(
                "SELECT base_url, access FROM integration_connections WHERE tenant_id = $1 AND status = 'active' "
                "AND owner_type = 'organization' ORDER BY created_at DESC",
                uuid.UUID(tenant_id),
            )
        out: dict[str, tuple[str | None, str | None]] = {}
        for revision in revisions:
            if policy_id is not None and str(revision["policy_id"]) != policy_id:
                continue
            for req in revision["connection_requirements"] or []:
                url = (req.get("connector") or {}).get("url", "")
                decl = next((c["access"] for c in connections if same_origin(c["base_url"], url)), None)
                for name in req.get("required_tools") or []:
                    out[f"mcp__{req['slot']}__{name}"] = classify(decl, name)
        return out

    async def insert_bindings(
        self, conn: Conn, tenant_id: str, run_id: str, bindings: Sequence[Mapping[str, Any]]
    ) -> None:
        """Record the run's frozen surfaces (``RunSpec.brokered`` entries, as ``core.bindings`` froze them)."""
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

    async def dispatch_view(self, run_id: str, tool_call_id: str, digest: str) -> DispatchView | None:
        """Everything the broker checks before a call, read in one statement: the claim, its binding,
        the connection's live state (and sealed credential only while it still matches the binding),
        the run's status, and for a personal binding whether its owner is still an active member."""
        return await self.one(
            DispatchView,
            "SELECT cl.tool, cl.input, cl.binding_id, b.connection_id, b.authority_generation, "
            "b.connection_owner_type, b.connection_owner_user_id, c.owner_user_id AS live_owner_user_id, "
            "c.status AS connection_status, c.authorization_generation AS live_generation, "
            "c.owner_type AS live_owner_type, c.base_url, c.header_name, c.scheme, c.auth_kind, "
            "c.transport, c.transport_config, c.credential_env, "
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
    ) -> RegisteredClaim:
        """The call's durable record (input kept here, never in the ledger or workflow history), and whether it
        has been ``claimed`` for longer than :data:`CLAIM_TTL_SECS`: the same test :meth:`expire_stale` makes,
        on the same clock (the database's ``now()``, which also wrote ``claimed_at``), so no other host's clock
        takes part in deciding that a dispatcher was lost."""
        # One round trip: the new claim, or (a retried call) the one already registered under this digest.
        async with self.pool.acquire() as conn:
            record = await conn.fetchrow(
                "WITH i AS (INSERT INTO tool_execution_claims (session_id, tool_call_id, input_digest, binding_id, "
                "tool, input, state) VALUES ($1,$2,$3,$4,$5,$6,'registered') ON CONFLICT DO NOTHING RETURNING *), "
                "r AS (SELECT * FROM i UNION ALL SELECT * FROM tool_execution_claims WHERE session_id = $1 "
                "AND tool_call_id = $2 AND input_digest = $3 AND NOT EXISTS (SELECT 1 FROM i)) "
                "SELECT r.*, coalesce(r.state = 'claimed' AND r.claimed_at < now() - make_interval(secs => $7), "
                "false) AS lapsed FROM r",
                uuid.UUID(run_id),
                tool_call_id,
                digest,
                uuid.UUID(binding_id),
                tool,
                tool_input,
                CLAIM_TTL_SECS,
            )
        if record is None:
            # A concurrent registration of the same call committed after this statement's snapshot: read it now
            # (it was registered a moment ago, so it has not lapsed).
            row = await self.claim(run_id, tool_call_id, digest)
            if row is None:
                raise NotFound()
            return RegisteredClaim(row, lapsed=False)
        return RegisteredClaim(ToolExecutionClaim.model_validate(dict(record.items())), lapsed=record["lapsed"])

    async def claim(self, run_id: str, tool_call_id: str, digest: str) -> ToolExecutionClaim | None:
        return await self.one(
            ToolExecutionClaim,
            "SELECT * FROM tool_execution_claims WHERE session_id = $1 AND tool_call_id = $2 AND input_digest = $3",
            uuid.UUID(run_id),
            tool_call_id,
            digest,
        )

    async def expire_stale(
        self, run_id: str, ttl_secs: float, event_for: Callable[[ToolExecutionClaim], ev.NewEvent]
    ) -> list[ToolExecutionClaim]:
        """``claimed`` for longer than ``ttl_secs`` (a dispatcher died mid-call): the outcome is
        unknown, so the claim becomes ``ambiguous`` and is never dispatched again."""
        async with self.pool.acquire() as conn, conn.transaction():
            rows = await fetch_models(
                conn,
                ToolExecutionClaim,
                "UPDATE tool_execution_claims SET state = 'ambiguous', settled_at = now(), "
                "error = 'dispatcher lost while the call was in flight' WHERE session_id = $1 "
                "AND state = 'claimed' AND claimed_at < now() - make_interval(secs => $2) RETURNING *",
                uuid.UUID(run_id),
                float(ttl_secs),
            )
            if rows:
                await self.ledger.append(conn, run_id, [event_for(r) for r in rows])
            return rows

    async def take(self, run_id: str, tool_call_id: str, digest: str) -> ToolExecutionClaim | None:
        """CAS registered|failed_before_send → claimed (attempt + 1); None when someone else holds it
        or its outcome is final. Only the taker may touch the credential."""
        return await self.one(
            ToolExecutionClaim,
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
        state: ClaimOutcome,
        result: dict[str, Any] | None,
        error: str | None,
        event: ev.NewEvent,
    ) -> ToolExecutionClaim:
        """Settle a brokered call, the one way to: its claim ``claimed`` → ``state`` with ``result``/``error``
        and ``event`` (its single ``tool.brokered``, or the refusal's decision) appended, redacted, at the run's
        next seq, in one statement (atomic, NOTIFY at commit). Only a claim still ``claimed`` moves, and only
        then is the event written; the row is returned as it now stands. :class:`NotFound`: no such claim."""
        row = await self.ledger._settle_claim(run_id, tool_call_id, digest, state, result, error, event)
        if row is None:
            raise NotFound()
        return row
