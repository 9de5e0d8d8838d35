"""Runs (the ``sessions`` table): creation, the frozen run spec, status transitions, finalization intents,
sandbox capacity, liveness and artifacts."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from core import events as ev
from core.errors import NotFound
from core.runspec import RunSpec
from core.states import RunStatus, check_transition, is_terminal
from db._base import Conn, ReadModel, Repository, Row, as_model, uuid_or_none
from db.ids import new_id
from db.ledger import Ledger
from db.models.runs import Artifact, Run, RunFinalization
from db.tokens import RunTokens

# pg_advisory_xact_lock key serialising sandbox-capacity claims (any constant no other lock uses).
SANDBOX_CAPACITY_LOCK = 0x66627862_0001
WAITING_FOR_CAPACITY = "waiting for sandbox capacity"
# Runs that hold a sandbox or are about to (sessions_live_sandbox_idx covers these statuses).
_LIVE_SANDBOXES = (
    "SELECT count(*) FROM sessions WHERE status IN ('provisioning', 'initializing', 'running', 'awaiting_approval')"
    " OR (status IN ('cancelling', 'finalizing', 'waiting_for_connection') AND sandbox_handle IS NOT NULL)"
)


class LiveRun(ReadModel):
    """A run the liveness sweep watches (``sessions`` joined with its finalization intent)."""

    id: str
    status: str
    sandbox_handle: dict[str, Any] | None
    silent_secs: float | None  # None when the run has no heartbeat, start or update time (never in practice)
    has_intent: bool


class UnfinishedRun(ReadModel):
    """A run not ended yet, as the sweep for runs without a workflow sees it."""

    id: str
    # Still 'created' (or parked up front) with no intent: its starter may not have started its workflow yet,
    # and if it died first the stranded-run check starts it (``stranded``).
    unstarted: bool


class Liveness(ReadModel):
    """One run's liveness: its status, seconds since it was last heard of, and whether an intent exists."""

    status: str
    silent_secs: float
    has_intent: bool


class UsageTotals(ReadModel):
    """A run's LLM usage summed over its entries (zeros when it has none)."""

    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    cost_usd: float
    requests: int


class Runs(Repository):
    def __init__(self, pool: asyncpg.Pool[Any], ledger: Ledger, tokens: RunTokens) -> None:
        super().__init__(pool)
        self.ledger = ledger
        self.tokens = tokens
        self._specs: dict[str, RunSpec] = {}

    async def create_run(
        self, spec: RunSpec, invoked_by_kind: str, also: Callable[[Conn], Awaitable[None]] | None = None
    ) -> Run:
        """Insert the run (and, through ``also``, its frozen bindings) in one transaction."""
        async with self.pool.acquire() as conn, conn.transaction():
            record = await conn.fetchrow(
                "INSERT INTO sessions (id, tenant_id, agent_id, agent_revision_id, status, autonomy, trust_tier, "
                "task, repo_source, run_spec, trigger, budgets, invoked_by_kind) "
                "VALUES ($1,$2,$3,$4,'created',$5,$6,$7,$8,$9,$10,$11,$12) RETURNING *",
                uuid.UUID(spec.run_id),
                uuid.UUID(spec.tenant_id),
                uuid.UUID(spec.agent_id),
                uuid.UUID(spec.agent_revision_id),
                spec.autonomy,
                spec.trust_tier,
                spec.task,
                spec.workspace.model_dump(),
                spec.model_dump(mode="json"),
                spec.invocation.model_dump(mode="json"),
                spec.budgets.model_dump(),
                invoked_by_kind,
            )
            created = ev.NewEvent(
                type=ev.SESSION_CREATED,
                data={"task": spec.task, "agent": spec.agent_name, "autonomy": spec.autonomy},
            )
            new = [created]
            if spec.capabilities:
                new.append(ev.capability_frozen(spec.capabilities))
            await self.ledger.append(conn, spec.run_id, new)
            if also is not None:
                await also(conn)
        run = as_model(Run, record)
        assert run is not None  # INSERT … RETURNING always answers a row
        run.event_seq = 2 if spec.capabilities else 1  # the ledger advanced it after the RETURNING
        return run

    async def get_run(self, tenant_id: str | None, run_id: str) -> Run | None:
        rid = uuid_or_none(run_id)
        if rid is None:
            return None
        if tenant_id is None:
            return await self.one(Run, "SELECT * FROM sessions WHERE id = $1", rid)
        return await self.one(Run, "SELECT * FROM sessions WHERE id = $1 AND tenant_id = $2", rid, uuid.UUID(tenant_id))

    async def list_runs(self, tenant_id: str, limit: int, status: str | None = None) -> list[Run]:
        return await self.many(
            Run,
            "SELECT * FROM sessions WHERE tenant_id = $1 AND ($3::text IS NULL OR status = $3) "
            "ORDER BY created_at DESC, id DESC LIMIT $2",
            uuid.UUID(tenant_id),
            limit,
            status,
        )

    async def run_spec(self, run_id: str) -> RunSpec:
        spec = self._specs.get(run_id)
        if spec is None:
            async with self.pool.acquire() as conn:
                raw = await conn.fetchval("SELECT run_spec FROM sessions WHERE id = $1", uuid.UUID(run_id))
            if raw is None:
                raise NotFound()
            spec = RunSpec.model_validate(raw)
            if len(self._specs) > 4096:
                self._specs.clear()
            if not spec.pending_requirements:  # a parked run's spec gains its bindings once, when it resumes
                self._specs[run_id] = spec  # frozen forever, so caching cannot go stale
        return spec

    async def usage_totals(self, run_id: str) -> UsageTotals:
        async with self.pool.acquire() as conn:
            row = await conn.fetchrow(
                "SELECT coalesce(sum(input_tokens),0) AS input_tokens, coalesce(sum(output_tokens),0) AS output_tokens,"
                " coalesce(sum(cache_read_tokens),0) AS cache_read_tokens,"
                " coalesce(sum(cache_write_tokens),0) AS cache_write_tokens, sum(cost_usd) AS cost_usd,"
                " count(*) AS requests FROM usage_entries WHERE session_id = $1",
                uuid.UUID(run_id),
            )
        assert row is not None  # an aggregate without GROUP BY always answers one row
        return UsageTotals(
            input_tokens=int(row["input_tokens"]),
            output_tokens=int(row["output_tokens"]),
            cache_read_tokens=int(row["cache_read_tokens"]),
            cache_write_tokens=int(row["cache_write_tokens"]),
            cost_usd=float(row["cost_usd"]) if row["cost_usd"] is not None else 0.0,
            requests=int(row["requests"]),
        )

    async def transition(
        self,
        run_id: str,
        to: RunStatus,
        reason: str | None = None,
        extra: list[ev.NewEvent] | None = None,
        *,
        conn: Conn | None = None,
    ) -> tuple[str, str]:
        """Move a run to ``to`` (a no-op when it is already there). Returns (from, to)."""
        if conn is None:
            async with self.pool.acquire() as own, own.transaction():
                return await self.transition(run_id, to, reason, extra, conn=own)
        current = await conn.fetchval("SELECT status FROM sessions WHERE id = $1 FOR UPDATE", uuid.UUID(run_id))
        if current is None:
            raise NotFound()
        if current == to:
            if extra:
                await self.ledger.append(conn, run_id, extra)
            return current, current
        check_transition(current, to)
        await conn.execute(
            "UPDATE sessions SET status = $2, status_reason = $3, updated_at = now(),"
            " started_at = CASE WHEN $2 = 'running' AND started_at IS NULL THEN now() ELSE started_at END,"
            " finished_at = CASE WHEN $4 THEN now() ELSE finished_at END WHERE id = $1",
            uuid.UUID(run_id),
            to.value,
            reason,
            is_terminal(to),
        )
        await self.ledger.append(conn, run_id, [ev.status_changed(current, to.value, reason), *(extra or [])])
        return current, to.value

    async def set_fields(self, run_id: str, **fields: Any) -> None:
        cols = list(fields)
        sets = ", ".join(f"{c} = ${i + 2}" for i, c in enumerate(cols))
        await self.execute(
            f"UPDATE sessions SET {sets}, updated_at = now() WHERE id = $1",
            uuid.UUID(run_id),
            *[fields[c] for c in cols],
        )

    async def heartbeat(self, run_id: str) -> str | None:
        async with self.pool.acquire() as conn:
            status = await conn.fetchval(
                "UPDATE sessions SET last_heartbeat_at = now() WHERE id = $1 RETURNING status", uuid.UUID(run_id)
            )
        return None if status is None else str(status)

    # ---- finalization --------------------------------------------------------------------------

    async def record_finalization(
        self, conn: Conn, run_id: str, outcome: str, summary: str | None, reason: str | None, quiesce: bool
    ) -> bool:
        inserted = await conn.fetchval(
            "INSERT INTO session_finalizations (session_id, outcome, summary, reason, needs_quiesce) "
            "VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING RETURNING true",
            uuid.UUID(run_id),
            outcome,
            summary,
            reason,
            quiesce,
        )
        return bool(inserted)

    async def request_finalization(
        self,
        run_id: str,
        outcome: str,
        *,
        summary: str | None = None,
        reason: str | None = None,
        quiesce: bool = False,
    ) -> tuple[bool, str]:
        """Record the durable wind-down intent. Returns (created, current status)."""
        async with self.pool.acquire() as conn, conn.transaction():
            status = await conn.fetchval("SELECT status FROM sessions WHERE id = $1 FOR UPDATE", uuid.UUID(run_id))
            if status is None:
                raise NotFound()
            if is_terminal(status):
                return False, status
            created = await self.record_finalization(conn, run_id, outcome, summary, reason, quiesce)
            return created, status

    async def claim_sandbox(self, run_id: str, max_live: int) -> tuple[bool, int]:
        """Take one of ``max_live`` sandbox places for a run still ``created`` (it moves to ``provisioning``).

        Returns (claimed, live sandboxes counted). An advisory lock serialises the count and the move, so
        two starts never both take the last place. A run past ``created`` already holds its place. A run
        that must wait keeps ``created`` with a ``status_reason`` saying so (and one ledger message).
        """
        rid = uuid.UUID(run_id)
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", SANDBOX_CAPACITY_LOCK)
            row = await conn.fetchrow("SELECT status, status_reason FROM sessions WHERE id = $1 FOR UPDATE", rid)
            if row is None:
                raise NotFound()
            live = int(await conn.fetchval(_LIVE_SANDBOXES))
            if row["status"] != RunStatus.CREATED:
                return True, live
            if live < max_live:
                await self.transition(run_id, RunStatus.PROVISIONING, conn=conn)
                return True, live + 1
            reason = f"{WAITING_FOR_CAPACITY} ({live} live, max {max_live})"
            await conn.execute("UPDATE sessions SET status_reason = $2 WHERE id = $1", rid, reason)
            if not (row["status_reason"] or "").startswith(WAITING_FOR_CAPACITY):
                await self.ledger.append(conn, run_id, [ev.system_message(reason)])
            return False, live

    async def finalization(self, run_id: str) -> RunFinalization | None:
        return await self.one(
            RunFinalization, "SELECT * FROM session_finalizations WHERE session_id = $1", uuid.UUID(run_id)
        )

    async def set_invoker(self, conn: Conn, run_id: str, user_id: str) -> None:
        """Inside the run's insert transaction: the signed-in user who started it."""
        await conn.execute(
            "UPDATE sessions SET invoked_by_user_id = $2 WHERE id = $1", uuid.UUID(run_id), uuid.UUID(user_id)
        )

    async def stranded(self, older_than_secs: float, limit: int = 100) -> list[str]:
        """Runs still ``created`` (or parked up front) ``older_than_secs`` after their insert with no wind-down
        intent (oldest first):
        the process that inserted them died before starting their workflow. A run waiting for sandbox capacity
        has its workflow (the workflow wrote that reason), so it is not one."""
        async with self.pool.acquire() as conn:
            records = await conn.fetch(
                # A run parked up front (no sandbox yet) also has no workflow if its starter died.
                "SELECT s.id FROM sessions s WHERE (s.status = 'created' OR "
                "(s.status = 'waiting_for_connection' AND s.sandbox_handle IS NULL)) "
                "AND s.created_at < now() - make_interval(secs => $1) "
                "AND coalesce(s.status_reason, '') NOT LIKE $2 "
                "AND NOT EXISTS (SELECT 1 FROM session_finalizations f WHERE f.session_id = s.id) "
                "ORDER BY s.created_at LIMIT $3",
                float(older_than_secs),
                f"{WAITING_FOR_CAPACITY}%",
                limit,
            )
        return [str(r["id"]) for r in records]

    async def live_runs(self) -> list[LiveRun]:
        """Every run the liveness sweep watches: a running or waiting runner, or an intent not acted on yet."""
        return await self.many(
            LiveRun,
            "SELECT s.id::text AS id, s.status, s.sandbox_handle, extract(epoch FROM now() -"
            " coalesce(s.last_heartbeat_at, s.started_at, s.updated_at)) AS silent_secs,"
            " f.outcome IS NOT NULL AS has_intent FROM sessions s"
            " LEFT JOIN session_finalizations f ON f.session_id = s.id"
            " WHERE s.status IN ('running', 'awaiting_approval')"
            " OR (f.outcome IS NOT NULL AND s.status IN ('created', 'provisioning', 'initializing',"
            " 'waiting_for_connection'))",
        )

    async def unfinished_runs(self) -> list[UnfinishedRun]:
        """Every run not in a terminal status: each has a workflow that ends it, or will have one."""
        return await self.many(
            UnfinishedRun,
            "SELECT s.id::text AS id, (s.status = 'created' OR (s.status = 'waiting_for_connection'"
            " AND s.sandbox_handle IS NULL)) AND f.outcome IS NULL AND coalesce(s.status_reason, '') NOT LIKE $1"
            " AS unstarted FROM sessions s LEFT JOIN session_finalizations f ON f.session_id = s.id"
            " WHERE s.status NOT IN ('completed', 'failed', 'cancelled', 'budget_exceeded')",
            f"{WAITING_FOR_CAPACITY}%",
        )

    async def liveness(self, run_id: str) -> Liveness:
        async with self.pool.acquire() as conn:
            row = await conn.fetchrow(
                "SELECT s.status, extract(epoch FROM now() - coalesce(s.last_heartbeat_at, s.started_at,"
                " s.updated_at)) AS silent_secs, f.outcome IS NOT NULL AS has_intent FROM sessions s "
                "LEFT JOIN session_finalizations f ON f.session_id = s.id WHERE s.id = $1",
                uuid.UUID(run_id),
            )
        if row is None:
            raise NotFound()
        return Liveness(status=row["status"], silent_secs=float(row["silent_secs"] or 0), has_intent=row["has_intent"])

    async def finish(
        self,
        run_id: str,
        terminal: RunStatus,
        reason: str | None,
        summary: str | None,
        outcome: str,
        artifacts: list[Row],
        artifact_events: list[ev.NewEvent],
    ) -> tuple[str, str]:
        """finalizing → terminal with artifacts, ``run.result`` and token revocation, in one transaction."""
        rid = uuid.UUID(run_id)
        async with self.pool.acquire() as conn, conn.transaction():
            status = await conn.fetchval("SELECT status FROM sessions WHERE id = $1 FOR UPDATE", rid)
            if status is not None and is_terminal(status):
                return status, status
            for art in artifacts:
                await conn.execute(
                    "INSERT INTO artifacts (id, session_id, kind, name, content, content_type) "
                    "VALUES ($1,$2,$3,$4,$5,$6) ON CONFLICT (session_id, kind, name) DO NOTHING",
                    uuid.UUID(new_id()),
                    rid,
                    art["kind"],
                    art["name"],
                    art["content"],
                    art["content_type"],
                )
            await conn.execute("UPDATE sessions SET result_summary = $2 WHERE id = $1", rid, summary)
            result = ev.NewEvent(
                type=ev.RUN_RESULT, data={"outcome": outcome, **({"summary": summary} if summary else {})}
            )
            await self.ledger.append(conn, run_id, artifact_events)
            moved = await self.transition(run_id, terminal, reason, [result], conn=conn)
            await self.tokens.revoke_tokens(conn, run_id)
            await conn.execute("DELETE FROM session_finalizations WHERE session_id = $1", rid)
            return moved

    async def artifacts(self, run_id: str) -> list[Artifact]:
        return await self.many(
            Artifact, "SELECT * FROM artifacts WHERE session_id = $1 ORDER BY created_at, kind", uuid.UUID(run_id)
        )

    async def has_gate_calls(self, run_id: str) -> bool:
        async with self.pool.acquire() as conn:
            return bool(await conn.fetchval("SELECT gate_calls > 0 FROM sessions WHERE id = $1", uuid.UUID(run_id)))

    async def unfinished_run_ids(self, run_ids: list[str]) -> set[str]:
        """Which of ``run_ids`` exist and are not terminal (a sandbox of any other run is an orphan)."""
        ids = [uuid.UUID(r) for r in run_ids if _is_uuid(r)]
        if not ids:
            return set()
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT id::text AS id FROM sessions WHERE id = ANY($1::uuid[])"
                " AND status NOT IN ('completed', 'failed', 'cancelled', 'budget_exceeded')",
                ids,
            )
        return {r["id"] for r in rows}


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True
