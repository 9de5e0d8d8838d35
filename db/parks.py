"""Parked runs: recording a wait for a connection, finding who waits on a connection, ending a wait.

A wait is a ``run_parks`` row (the durable record; nothing is found in memory) plus the run's
``pending_action`` and the status ``waiting_for_connection``. Every step is idempotent and takes the run's
row lock, so a replayed activity, two signals or a double-fired callback change nothing twice. A parked
brokered call keeps its execution claim ``registered``: resuming it is the broker's claim CAS again, so the
call executes at most once whatever wakes it.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import asyncpg

from core import events as ev
from core.bindings import covering, freeze_binding, park_secs, pending_action, url_key
from core.runspec import RunSpec
from core.states import RunStatus
from db._base import Conn, ReadModel, Repository, as_model, as_models, as_row
from db.connections import ConnectionRow, Connections
from db.ids import new_id
from db.ledger import Ledger
from db.models.parks import RunPark
from db.runs import Runs

UP_FRONT = ""  # tool_call_id of a park before provisioning


class ParkedCall(ReadModel):
    """A parked call's wait and the run's status once it parked."""

    park: RunPark
    status: str


class CallConnection(ReadModel):
    """What decides whether a parked call's connection is usable again."""

    id: uuid.UUID
    status: str
    sealed: bool
    credential_env: str | None


class Parks(Repository):
    def __init__(self, pool: asyncpg.Pool[Any], ledger: Ledger, runs: Runs, connections: Connections) -> None:
        super().__init__(pool)
        self.ledger = ledger
        self.runs = runs
        self.connections = connections

    # ---- parking -------------------------------------------------------------------------------

    async def park_up_front(self, conn: Conn, spec: RunSpec) -> dict[str, Any]:
        """In the creating transaction: one wait per pending requirement, ``connection.required`` for each,
        the run ``waiting_for_connection`` with the first one's pending action. Returns that action."""
        ttl = park_secs(spec.budgets.max_park_secs)
        expires_at = await conn.fetchval("SELECT now() + make_interval(secs => $1)", float(ttl))
        actions: list[dict[str, Any]] = []
        new: list[ev.NewEvent] = []
        for req in spec.pending_requirements:
            url = req["connector"]["url"]
            await conn.execute(
                "INSERT INTO run_parks (id, tenant_id, session_id, tool_call_id, slot, connection_id, url_key, "
                "owner_user_id, reason, expires_at) VALUES ($1,$2,$3,'',$4,$5,$6,$7,$8,$9)",
                uuid.UUID(new_id()),
                uuid.UUID(spec.tenant_id),
                uuid.UUID(spec.run_id),
                req["slot"],
                uuid.UUID(req["connection_id"]) if req.get("connection_id") else None,
                url_key(url),
                uuid.UUID(req["owner_user_id"]) if req.get("owner_user_id") else None,
                req["reason"],
                expires_at,
            )
            action = pending_action(
                slot=req["slot"],
                url=url,
                reason=req["reason"],
                expires_at=expires_at.isoformat(),
                connection_id=req.get("connection_id"),
            )
            actions.append(action)
            new.append(ev.NewEvent(type=ev.CONNECTION_REQUIRED, data=action))
        await self.runs.transition(spec.run_id, RunStatus.WAITING_FOR_CONNECTION, actions[0]["reason"], new, conn=conn)
        await conn.execute("UPDATE sessions SET pending_action = $2 WHERE id = $1", uuid.UUID(spec.run_id), actions[0])
        return actions[0]

    async def park_call(self, run_id: str, tool_call_id: str, digest: str, reason: str) -> ParkedCall:
        """Park one brokered call (idempotent): its wait, ``authorization.required``, the run waiting."""
        spec = await self.runs.run_spec(run_id)
        ttl = park_secs(spec.budgets.max_park_secs)
        async with self.pool.acquire() as conn, conn.transaction():
            status = await conn.fetchval("SELECT status FROM sessions WHERE id = $1 FOR UPDATE", uuid.UUID(run_id))
            claim = await conn.fetchrow(
                "SELECT cl.tool, b.requirement_slot, b.connection_id, c.base_url FROM tool_execution_claims cl "
                "JOIN run_resource_bindings b ON b.id = cl.binding_id "
                "JOIN integration_connections c ON c.id = b.connection_id "
                "WHERE cl.session_id = $1 AND cl.tool_call_id = $2 AND cl.input_digest = $3",
                uuid.UUID(run_id),
                tool_call_id,
                digest,
            )
            assert claim is not None  # the broker parked this very claim
            existing = as_model(
                RunPark,
                await conn.fetchrow(
                    "SELECT * FROM run_parks WHERE session_id = $1 AND tool_call_id = $2 AND state = 'waiting'",
                    uuid.UUID(run_id),
                    tool_call_id,
                ),
            )
            if existing is not None:
                return ParkedCall(park=existing, status=status)
            row = as_model(
                RunPark,
                await conn.fetchrow(
                    "INSERT INTO run_parks (id, tenant_id, session_id, tool_call_id, slot, connection_id, url_key, "
                    "reason, expires_at) VALUES ($1,$2,$3,$4,$5,$6,$7,$8, now() + make_interval(secs => $9)) "
                    "ON CONFLICT (session_id, tool_call_id, slot) DO UPDATE SET state = 'waiting', "
                    "reason = EXCLUDED.reason, expires_at = EXCLUDED.expires_at, resolved_at = NULL RETURNING *",
                    uuid.UUID(new_id()),
                    uuid.UUID(spec.tenant_id),
                    uuid.UUID(run_id),
                    tool_call_id,
                    claim["requirement_slot"],
                    claim["connection_id"],
                    url_key(claim["base_url"]),
                    reason,
                    float(ttl),
                ),
            )
            assert row is not None
            action = pending_action(
                slot=row.slot,
                url=claim["base_url"],
                reason=reason,
                expires_at=row.expires_at.isoformat(),
                connection_id=str(claim["connection_id"]),
                tool_call_id=tool_call_id,
            )
            required = ev.NewEvent(
                type=ev.AUTHORIZATION_REQUIRED,
                data={**action, "tool": claim["tool"], "challenge": action["authorization_url"]},
            )
            if status in (RunStatus.RUNNING, RunStatus.AWAITING_APPROVAL):
                await self.runs.transition(run_id, RunStatus.WAITING_FOR_CONNECTION, reason, [required], conn=conn)
                status = RunStatus.WAITING_FOR_CONNECTION.value
            else:
                await self.ledger.append(conn, run_id, [required])
            if status == RunStatus.WAITING_FOR_CONNECTION:
                await conn.execute("UPDATE sessions SET pending_action = $2 WHERE id = $1", uuid.UUID(run_id), action)
            return ParkedCall(park=row, status=status)

    async def credential_rejected(
        self, run_id: str, tool_call_id: str, digest: str, connection_id: str, generation: int
    ) -> None:
        """The upstream answered 401 to a static credential: nothing ran, so the call's claim goes back to
        ``registered`` without using up an attempt (the resume takes it again, once, and a runner re-posting
        the held call re-attaches to the same brokering), and the connection, if it is still active at the
        generation that was refused, goes to ``error`` (the reason is the park's, on the run) so that no run
        keeps sending a dead credential: every call on it parks until an admin supplies a new one (next
        generation)."""
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "UPDATE tool_execution_claims SET state = 'registered', attempts = greatest(attempts - 1, 0) "
                "WHERE session_id = $1 AND tool_call_id = $2 "
                "AND input_digest = $3 AND state = 'claimed'",
                uuid.UUID(run_id),
                tool_call_id,
                digest,
            )
            await conn.execute(
                "UPDATE integration_connections SET status = 'error', updated_at = now() "
                "WHERE id = $1 AND authorization_generation = $2 AND status = 'active' AND auth_kind = 'static'",
                uuid.UUID(connection_id),
                generation,
            )

    # ---- resuming ------------------------------------------------------------------------------

    async def wait_state(self, run_id: str, tool_call_id: str) -> RunPark | None:
        """The newest wait of ``tool_call_id`` ('' for the up-front waits: the soonest to expire)."""
        return await self.one(
            RunPark,
            "SELECT * FROM run_parks WHERE session_id = $1 AND tool_call_id = $2 "
            "ORDER BY (state = 'waiting') DESC, expires_at LIMIT 1",
            uuid.UUID(run_id),
            tool_call_id,
        )

    async def unpark_up_front(self, run_id: str) -> tuple[str, str | None]:
        """Bind every pending requirement now if each has a usable connection: the spec gets its surfaces,
        the bindings are inserted and the run goes back to ``created``, in one transaction. Returns
        ``(state, reason)``: ``resumed``, or ``waiting`` with the first requirement still unbindable."""
        async with self.pool.acquire() as conn:
            raw = await conn.fetchval("SELECT run_spec FROM sessions WHERE id = $1", uuid.UUID(run_id))
        spec = RunSpec.model_validate(raw)
        bound: list[dict[str, Any]] = []
        for req in spec.pending_requirements:
            owner = req.get("owner_user_id")
            cands = await self.connections.candidates(spec.tenant_id, owner)
            chosen = covering(cands, req["connector"]["url"], list(req["required_tools"]))
            if chosen is None:
                return "waiting", None
            clean = {k: v for k, v in req.items() if k not in ("owner_user_id", "connection_id", "reason")}
            bound.append(freeze_binding(clean, chosen, new_id(), "park"))
        async with self.pool.acquire() as conn, conn.transaction():
            status = await conn.fetchval("SELECT status FROM sessions WHERE id = $1 FOR UPDATE", uuid.UUID(run_id))
            if status != RunStatus.WAITING_FOR_CONNECTION:
                # Bound by an earlier attempt of this step (``created`` since), or closing meanwhile.
                return ("resumed" if status == RunStatus.CREATED else "ended"), None
            done = spec.model_copy(update={"brokered": [*spec.brokered, *bound], "pending_requirements": []})
            await self.connections.insert_bindings(conn, spec.tenant_id, run_id, bound)
            await conn.execute(
                "UPDATE sessions SET run_spec = $2, pending_action = NULL WHERE id = $1",
                uuid.UUID(run_id),
                done.model_dump(mode="json"),
            )
            await conn.execute(
                "UPDATE run_parks SET state = 'resumed', resolved_at = now() WHERE session_id = $1 "
                "AND tool_call_id = '' AND state = 'waiting'",
                uuid.UUID(run_id),
            )
            resumed = ev.NewEvent(
                type=ev.CONNECTION_RESUMED,
                data={"slots": {b["slot"]: b["connection_id"] for b in bound}},
            )
            await self.runs.transition(
                run_id, RunStatus.CREATED, "every connection requirement is bound", [resumed], conn=conn
            )
        return "resumed", None

    async def unpark_call(self, run_id: str, tool_call_id: str, usable: bool, reason: str | None) -> tuple[str, str]:
        """Resume a parked call whose connection is usable again (``usable``, decided by the caller from the
        live row and the environment). A reauthorized connection moves the binding to its new generation
        when its latest snapshot still lists every frozen tool (else the call stays parked). Returns
        ``(state, run status)``."""
        async with self.pool.acquire() as conn, conn.transaction():
            status = str(await conn.fetchval("SELECT status FROM sessions WHERE id = $1 FOR UPDATE", uuid.UUID(run_id)))
            park = as_row(
                await conn.fetchrow(
                    "SELECT * FROM run_parks WHERE session_id = $1 AND tool_call_id = $2 "
                    "ORDER BY (state = 'waiting') DESC, created_at DESC LIMIT 1",
                    uuid.UUID(run_id),
                    tool_call_id,
                )
            )
            if park is None or park["state"] != "waiting":
                return (park["state"] if park else "ended"), status
            if not usable:
                if reason and reason != park["reason"]:
                    await conn.execute("UPDATE run_parks SET reason = $2 WHERE id = $1", park["id"], reason)
                return "waiting", status
            live = await conn.fetchrow(
                "SELECT b.id AS binding_id, b.authority_generation, b.effective_tools_json, "
                "c.authorization_generation, s.tools_json FROM run_resource_bindings b "
                "JOIN integration_connections c ON c.id = b.connection_id JOIN LATERAL (SELECT tools_json FROM "
                "connection_tool_snapshots t WHERE t.connection_id = c.id ORDER BY snapshot_version DESC LIMIT 1) s "
                "ON true WHERE b.session_id = $1 AND b.requirement_slot = $2",
                uuid.UUID(run_id),
                park["slot"],
            )
            assert live is not None
            new: list[ev.NewEvent] = []
            if live["authority_generation"] != live["authorization_generation"]:
                frozen = {t["name"] for t in live["effective_tools_json"]}
                if not frozen <= {t["name"] for t in live["tools_json"]}:
                    return "waiting", status
                await conn.execute(
                    "UPDATE run_resource_bindings SET authority_generation = $2 WHERE id = $1",
                    live["binding_id"],
                    live["authorization_generation"],
                )
            await conn.execute("UPDATE run_parks SET state = 'resumed', resolved_at = now() WHERE id = $1", park["id"])
            new.append(
                ev.NewEvent(
                    type=ev.CONNECTION_RESUMED,
                    data={
                        "tool_call_id": tool_call_id,
                        "slot": park["slot"],
                        "connection_id": str(park["connection_id"]) if park["connection_id"] else None,
                        "authorization_generation": live["authorization_generation"],
                    },
                )
            )
            others = await conn.fetchval(
                "SELECT count(*) FROM run_parks WHERE session_id = $1 AND state = 'waiting'", uuid.UUID(run_id)
            )
            if status == RunStatus.WAITING_FOR_CONNECTION and not others:
                await conn.execute("UPDATE sessions SET pending_action = NULL WHERE id = $1", uuid.UUID(run_id))
                await self.runs.transition(run_id, RunStatus.RUNNING, "the connection is usable again", new, conn=conn)
                status = RunStatus.RUNNING.value
            else:
                await self.ledger.append(conn, run_id, new)
            return "resumed", status

    async def end(self, run_id: str, tool_call_id: str, outcome: str) -> RunPark | None:
        """End the waits of ``tool_call_id`` (expired: the TTL passed; ended: the run is closing)."""
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.fetchval("SELECT status FROM sessions WHERE id = $1 FOR UPDATE", uuid.UUID(run_id))
            rows = as_models(
                RunPark,
                await conn.fetch(
                    "UPDATE run_parks SET state = $3, resolved_at = now() WHERE session_id = $1 "
                    "AND tool_call_id = $2 AND state = 'waiting' RETURNING *",
                    uuid.UUID(run_id),
                    tool_call_id,
                    outcome,
                ),
            )
            if rows:
                await conn.execute("UPDATE sessions SET pending_action = NULL WHERE id = $1", uuid.UUID(run_id))
                await self.ledger.append(
                    conn,
                    run_id,
                    [
                        ev.NewEvent(
                            type=ev.CONNECTION_WAIT_ENDED,
                            data={
                                "tool_call_id": tool_call_id or None,
                                "slot": r.slot,
                                "outcome": outcome,
                                "reason": r.reason,
                            },
                        )
                        for r in rows
                    ],
                )
            return rows[0] if rows else None

    async def call_connection(self, run_id: str, tool_call_id: str, digest: str) -> CallConnection | None:
        """The connection bound to a parked call, as far as its usability goes (None: the call is gone)."""
        return await self.one(
            CallConnection,
            "SELECT c.id, c.status, c.credential_sealed IS NOT NULL AS sealed, c.credential_env "
            "FROM tool_execution_claims cl JOIN run_resource_bindings b ON b.id = cl.binding_id "
            "JOIN integration_connections c ON c.id = b.connection_id "
            "WHERE cl.session_id = $1 AND cl.tool_call_id = $2 AND cl.input_digest = $3",
            uuid.UUID(run_id),
            tool_call_id,
            digest,
        )

    # ---- who waits -----------------------------------------------------------------------------

    async def waiting_on(self, tenant_id: str, connection: ConnectionRow) -> list[str]:
        """Runs waiting on ``connection``: by id, or (no connection known when they parked) by URL and owner."""
        records = await self.rows(
            "SELECT DISTINCT session_id FROM run_parks WHERE tenant_id = $1 AND state = 'waiting' AND "
            "(connection_id = $2 OR (connection_id IS NULL AND url_key = $3 "
            "AND owner_user_id IS NOT DISTINCT FROM $4))",
            uuid.UUID(tenant_id),
            connection.id,
            url_key(connection.base_url),
            connection.owner_user_id,
        )
        return [str(r["session_id"]) for r in records]

    async def connection_env(self, connection_id: str) -> str | None:
        """The environment variable a static connection's credential comes from, if it declares one."""
        async with self.pool.acquire() as conn:
            value = await conn.fetchval(
                "SELECT credential_env FROM integration_connections WHERE id = $1", uuid.UUID(connection_id)
            )
        return str(value) if value else None


class Challenges(Repository):
    """A pending OAuth flow's sign-in link, kept so asking to authorize again reuses it (``/authorize``)."""

    async def save(self, flow_id: str, url: str) -> None:
        await self.execute("UPDATE connector_oauth_flows SET challenge_url = $2 WHERE id = $1", uuid.UUID(flow_id), url)

    async def pending(self, connection_id: str, generation: int) -> str | None:
        """The link of a flow for this connection that nobody completed yet and that still has a minute."""
        async with self.pool.acquire() as conn:
            value = await conn.fetchval(
                "SELECT challenge_url FROM connector_oauth_flows WHERE connection_id = $1 AND consumed_at IS NULL "
                "AND purpose = 'connection' AND challenge_url IS NOT NULL AND expected_generation = $2 "
                "AND expires_at > now() + interval '60 seconds' ORDER BY created_at DESC LIMIT 1",
                uuid.UUID(connection_id),
                generation,
            )
        return str(value) if value else None


async def end_all(conn: Conn, run_id: str) -> None:
    """A finalizing run waits for nothing any more."""
    await conn.execute("UPDATE sessions SET pending_action = NULL WHERE id = $1", uuid.UUID(run_id))
    await conn.execute(
        "UPDATE run_parks SET state = 'ended', resolved_at = now() WHERE session_id = $1 AND state = 'waiting'",
        uuid.UUID(run_id),
    )


def iso(value: datetime) -> str:
    return value.isoformat()


__all__ = ["UP_FRONT", "Challenges", "Parks", "end_all", "iso"]
