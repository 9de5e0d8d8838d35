"""Result deliveries: one row per (run, webhook destination), its attempts and its final outcome.

The row is enqueued when the run turns terminal (idempotent: unique per destination index), updated
after every attempt, and closed exactly once by a compare-and-swap from ``pending`` that writes the
``callback.delivered`` / ``callback.failed`` ledger event in the same transaction.
"""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg

from core import events as ev
from core.redaction import Redactor
from core.runspec import RunSpec
from db._base import ReadModel, Repository, fetch_model, fetch_models
from db.ids import new_id
from db.ledger import Ledger
from db.models.deliveries import Delivery
from db.runs import Runs

TERMINAL = frozenset({"delivered", "failed", "skipped"})
WEBHOOK = "webhook"


def callback_secret_context(subscription_id: str) -> str:
    """The AAD context the subscription's callback secret is sealed under (shared contract)."""
    return f"subscription:{subscription_id}:callback"


def webhook_destinations(spec: RunSpec) -> list[tuple[int, dict[str, Any]]]:
    """``(index in result_destinations, destination)`` for every signed-webhook destination."""
    return [(i, d) for i, d in enumerate(spec.result_destinations) if d.get("kind") == WEBHOOK]


def _iso(value: Any) -> Any:
    return value.isoformat() if hasattr(value, "isoformat") else value


class PublishAuthority(ReadModel):
    """A subscription's publish binding as it stands now (``trigger_subscriptions``, read, never written)."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    enabled: bool
    token_generation: int
    callback_url: str | None
    callback_secret_sealed: bytes | None


class Deliveries(Repository):
    def __init__(self, pool: asyncpg.Pool[Any], ledger: Ledger, runs: Runs, redactor: Redactor) -> None:
        super().__init__(pool)
        self.ledger = ledger
        self.runs = runs
        self.redactor = redactor

    async def enqueue(self, spec: RunSpec) -> list[Delivery]:
        """Insert a pending row per webhook destination (a retry inserts nothing); return them all."""
        rid = uuid.UUID(spec.run_id)
        async with self.pool.acquire() as conn, conn.transaction():
            for index, dest in webhook_destinations(spec):
                sub = dest.get("subscription_id")
                await conn.execute(
                    "INSERT INTO deliveries (id, tenant_id, session_id, destination_index, subscription_id, "
                    "destination, url) VALUES ($1,$2,$3,$4,$5,$6,$7) "
                    "ON CONFLICT (session_id, destination_index) DO NOTHING",
                    uuid.UUID(new_id()),
                    uuid.UUID(spec.tenant_id),
                    rid,
                    index,
                    uuid.UUID(str(sub)) if sub else None,
                    dest,
                    str(dest.get("url") or ""),
                )
            return await fetch_models(
                conn, Delivery, "SELECT * FROM deliveries WHERE session_id = $1 ORDER BY destination_index", rid
            )

    async def get(self, delivery_id: str) -> Delivery | None:
        return await self.one(Delivery, "SELECT * FROM deliveries WHERE id = $1", uuid.UUID(delivery_id))

    async def for_run(self, run_id: str) -> list[Delivery]:
        return await self.many(
            Delivery, "SELECT * FROM deliveries WHERE session_id = $1 ORDER BY destination_index", uuid.UUID(run_id)
        )

    async def for_subscription(self, subscription_id: str, limit: int = 20) -> list[Delivery]:
        return await self.many(
            Delivery,
            "SELECT * FROM deliveries WHERE subscription_id = $1 ORDER BY created_at DESC, id LIMIT $2",
            uuid.UUID(subscription_id),
            limit,
        )

    async def subscription(self, subscription_id: str) -> PublishAuthority | None:
        """The publish authority as it stands now (H3's ``trigger_subscriptions``; read, never written)."""
        return await self.one(
            PublishAuthority,
            "SELECT id, tenant_id, enabled, token_generation, callback_url, callback_secret_sealed "
            "FROM trigger_subscriptions WHERE id = $1",
            uuid.UUID(subscription_id),
        )

    async def record_attempt(
        self,
        delivery_id: str,
        attempt: int,
        *,
        status_code: int | None,
        error: str | None,
        payload_digest: str | None,
        retry_in_secs: int | None,
    ) -> None:
        """Stamp one finished attempt (its number, answer, redacted error and the next try) on a pending row."""
        await self.execute(
            "UPDATE deliveries SET attempts = greatest(attempts, $2), last_status_code = $3, last_error = $4,"
            " payload_digest = coalesce($5, payload_digest), last_attempt_at = now(),"
            " next_attempt_at = CASE WHEN $6::integer IS NULL THEN NULL"
            "   ELSE now() + make_interval(secs => $6::integer) END,"
            " updated_at = now() WHERE id = $1 AND status = 'pending'",
            uuid.UUID(delivery_id),
            attempt,
            status_code,
            self.redactor.redact(error).value if error else None,
            payload_digest,
            retry_in_secs,
        )

    async def close(
        self, delivery_id: str, status: str, attempts: int, error: str | None, event: ev.NewEvent
    ) -> Delivery | None:
        """pending → ``status`` with its ledger event, once. ``None`` when it was already closed."""
        if status not in TERMINAL:
            raise ValueError(f"not a final delivery status: {status}")
        async with self.pool.acquire() as conn, conn.transaction():
            row = await fetch_model(
                conn,
                Delivery,
                "UPDATE deliveries SET status = $2, last_error = coalesce($3, last_error),"
                " attempts = greatest(attempts, $4), next_attempt_at = NULL, updated_at = now(),"
                " delivered_at = CASE WHEN $2 = 'delivered' THEN now() ELSE delivered_at END"
                " WHERE id = $1 AND status = 'pending' RETURNING *",
                uuid.UUID(delivery_id),
                status,
                self.redactor.redact(error).value if error else None,
                attempts,
            )
            if row is not None:
                await self.ledger.append(conn, str(row.session_id), [event])
            return row

    async def result_body(
        self, run_id: str, delivery_id: str | None = None, attempt: int | None = None
    ) -> dict[str, Any]:
        """The ``run.finished`` body (domain §10), also the trigger poll response (ids null there)."""
        rid = uuid.UUID(run_id)
        async with self.pool.acquire() as conn:
            run = await conn.fetchrow("SELECT * FROM sessions WHERE id = $1", rid)
            if run is None:
                raise LookupError(f"run {run_id} does not exist")
            tool_calls = await conn.fetchval("SELECT count(*) FROM approvals WHERE session_id = $1", rid)
            arts = await conn.fetch(
                "SELECT id, kind, name, content_type, content FROM artifacts WHERE session_id = $1 "
                "ORDER BY created_at, kind, name",
                rid,
            )
        usage = await self.runs.usage_totals(run_id)
        spec = run["run_spec"] or {}
        return {
            "event": "run.finished",
            "delivery_id": delivery_id,
            "attempt": attempt,
            "run": {
                "id": str(run["id"]),
                "status": run["status"],
                "status_reason": run["status_reason"],
                "agent_id": str(run["agent_id"]),
                "agent_revision_id": str(run["agent_revision_id"]),
                "agent_name": spec.get("agent_name"),
                "task": run["task"],
                "summary": run["result_summary"],
                "invocation": run["trigger"],
                "created_at": _iso(run["created_at"]),
                "started_at": _iso(run["started_at"]),
                "finished_at": _iso(run["finished_at"]),
            },
            "usage": {
                "input_tokens": usage.input_tokens,
                "output_tokens": usage.output_tokens,
                "cache_read_tokens": usage.cache_read_tokens,
                "cache_write_tokens": usage.cache_write_tokens,
                "cost_usd": usage.cost_usd,
                "requests": usage.requests,
                "tool_calls": int(tool_calls or 0),
            },
            "artifacts": [
                {
                    "id": str(a["id"]),
                    "kind": a["kind"],
                    "name": a["name"],
                    "content_type": a["content_type"],
                    "content": a["content"],
                }
                for a in arts
            ],
        }
