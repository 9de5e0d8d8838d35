"""The ledger: append redacted events to a run (gapless ``seq`` under the run's row lock, NOTIFY at commit)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import asyncpg

from core import events as ev
from core.redaction import Redactor
from db._base import Conn, ReadModel, Repository, as_model
from db.ids import new_id
from db.models.connections import ToolExecutionClaim

NOTIFY_CHANNEL = "fluidbox_events"


class LedgerEvent(ReadModel):
    """One ledger entry as it is read back (a page of these is a catch-up or a stream batch, so it is a
    plain pydantic model: validating the ``Event`` table model costs far more per row)."""

    event_id: uuid.UUID
    session_id: uuid.UUID
    seq: int
    actor: str
    type: str
    payload: dict[str, Any]
    occurred_at: datetime


class Ledger(Repository):
    def __init__(self, pool: asyncpg.Pool[Any], redactor: Redactor) -> None:
        super().__init__(pool)
        self.redactor = redactor

    async def append(self, conn: Conn, run_id: str, new: list[ev.NewEvent], *, gate_calls: int = 0) -> int:
        """Append events atomically with the caller's transaction; returns the last seq.

        One statement: bump the session's counter (the row lock makes seq gapless), insert the
        redacted events numbered from it, and NOTIFY (delivered at commit).
        """
        if not new:
            return 0
        docs = [
            {"id": new_id(), "actor": e.actor, "type": e.type, "payload": self.redactor.redact(e.payload()).value}
            for e in new
        ]
        last = await conn.fetchval(
            """
            WITH s AS (
                UPDATE sessions SET event_seq = event_seq + $3, gate_calls = gate_calls + $4
                WHERE id = $1 RETURNING event_seq
            ), e AS (
                INSERT INTO events (event_id, session_id, seq, actor, type, payload)
                SELECT (x.value->>'id')::uuid, $1, s.event_seq - $3 + x.ord, x.value->>'actor',
                       x.value->>'type', x.value->'payload'
                FROM s, jsonb_array_elements($2::jsonb) WITH ORDINALITY AS x(value, ord)
            )
            SELECT event_seq FROM s, pg_notify($5, $1::text || ':' || s.event_seq)
            """,
            uuid.UUID(run_id),
            docs,
            len(docs),
            gate_calls,
            NOTIFY_CHANNEL,
        )
        return int(last)

    async def _settle_claim(
        self,
        run_id: str,
        tool_call_id: str,
        digest: str,
        state: str,
        result: dict[str, Any] | None,
        error: str | None,
        event: ev.NewEvent,
    ) -> ToolExecutionClaim | None:
        """The statement behind :meth:`db.connections.Connections.settle`, the one way to settle a claim (call
        that). It lives here because every write to ``events`` does: the claim's CAS, the event under the run's
        row lock and the NOTIFY in one round trip. None when there is no such claim."""
        doc = {"id": new_id(), "actor": event.actor, "type": event.type,
               "payload": self.redactor.redact(event.payload()).value}  # fmt: skip
        async with self.pool.acquire() as conn:
            row = await conn.fetchrow(
                """
                WITH c AS (
                    UPDATE tool_execution_claims SET state = $4, result = $5, error = $6, settled_at = now()
                    WHERE session_id = $1 AND tool_call_id = $2 AND input_digest = $3 AND state = 'claimed'
                    RETURNING *
                ), s AS (
                    UPDATE sessions SET event_seq = event_seq + 1 WHERE id = $1 AND EXISTS (SELECT 1 FROM c)
                    RETURNING event_seq
                ), e AS (
                    INSERT INTO events (event_id, session_id, seq, actor, type, payload)
                    SELECT ($7::jsonb->>'id')::uuid, $1, s.event_seq, $7::jsonb->>'actor', $7::jsonb->>'type',
                           $7::jsonb->'payload'
                    FROM s
                ), n AS (
                    SELECT pg_notify($8, $1::text || ':' || s.event_seq) FROM s
                )
                SELECT c.* FROM c, (SELECT count(*) FROM n) AS notified
                UNION ALL
                SELECT t.* FROM tool_execution_claims t
                WHERE t.session_id = $1 AND t.tool_call_id = $2 AND t.input_digest = $3 AND NOT EXISTS (SELECT 1 FROM c)
                """,
                uuid.UUID(run_id),
                tool_call_id,
                digest,
                state,
                result,
                error,
                doc,
                NOTIFY_CHANNEL,
            )
        return as_model(ToolExecutionClaim, row)

    async def append_events(self, run_id: str, new: list[ev.NewEvent]) -> int:
        async with self.pool.acquire() as conn, conn.transaction():
            return await self.append(conn, run_id, new)

    async def events_after(self, run_id: str, after: int, limit: int) -> list[LedgerEvent]:
        return await self.many(
            LedgerEvent,
            "SELECT event_id, session_id, seq, actor, type, payload, occurred_at FROM events "
            "WHERE session_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
            uuid.UUID(run_id),
            after,
            limit,
        )
