"""Metered model spend: reservation admission, charging, release, expiry, totals and cost reports.

Every admission runs in one statement holding the run's row lock (``llm_admit``), so concurrent requests
of one run see each other's reservations and the budget arithmetic (``core.usage``) is exact. Settling a
reservation (charge, expiry) locks the reservation row first and the run's row last (appending the
event), for as short as possible: the next admission of the run queues behind that lock.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import asyncpg
import yaml
from pydantic import Field

from core import events as ev
from core.pricing import PriceTable
from core.runspec import RunSpec
from core.states import ACCEPTS_WORK, accepts_work
from core.usage import Spend, Usage, admit, exhausted
from db._base import Conn, ReadModel
from db.ids import new_id
from db.ledger import Ledger
from db.runs import Runs, UsageTotals

log = logging.getLogger("fluidbox.usage")
PRICING_FILE = Path(__file__).resolve().parent.parent / "core" / "pricing.yaml"
MODEL_RESPONSE = "model.response"
# The reference's system note for an answer that came back whole but whose usage could not be read (a public string).
USAGE_UNPARSED = "model stream completed (usage unparsed)"
ACTIVE = sorted(s.value for s in ACCEPTS_WORK)


def load_prices(path: Path = PRICING_FILE) -> PriceTable:
    return PriceTable.from_doc(yaml.safe_load(path.read_text()))


def _money(value: Decimal | None) -> float | None:
    return None if value is None else float(value)


class Reservation(ReadModel):
    """One LLM reservation of a run (its cost as a float, like every other figure we answer)."""

    id: uuid.UUID
    model: str
    state: str
    reserved_input_tokens: int
    reserved_output_tokens: int
    reserved_cost_usd: float | None
    created_at: datetime
    expires_at: datetime
    settled_at: datetime | None
    settle_reason: str | None


class CostLine(ReadModel):
    """Usage of one model from one source (``cost_usd`` is None when any of it was unpriced)."""

    model: str | None
    source: str | None
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    cost_usd: float | None = Field(description="null for an unpriced model")
    requests: int


class LiveReservations(ReadModel):
    """The reservations still held: how many, their token bound and their cost bound."""

    active: int
    tokens: int
    cost_usd: float | None


class CostReport(ReadModel):
    """A run's cost report, every figure read in one snapshot."""

    usage: UsageTotals
    tool_calls: int
    breakdown: list[CostLine]
    reservations: LiveReservations


@dataclass(frozen=True)
class Ask:
    """One model request asking for admission."""

    model: str
    input_tokens: int  # reserved input bound (request body bytes)
    output_tokens: int  # reserved output bound (declared max output)
    reserve: bool = True  # False for free calls (count_tokens): checks only, nothing reserved


@dataclass(frozen=True)
class Verdict:
    """``admitted`` | ``checked`` (no reservation needed) | ``inactive`` | ``exhausted`` | ``refused`` |
    ``unauthorized`` (the caller's token is no longer valid)."""

    kind: str
    reservation_id: str | None = None
    budget: str | None = None  # exhausted: max_tokens | max_cost_usd
    stopped: bool = False  # exhausted: this request recorded the budget stop (signal the workflow)
    code: str | None = None  # refused: llm_reservation_ceiling_exceeded | llm_budget_reservation_exceeded
    message: str | None = None
    cost_estimate: Decimal | None = None


class Metering:
    def __init__(
        self,
        pool: asyncpg.Pool[Any],
        ledger: Ledger,
        runs: Runs,
        prices: PriceTable,
        *,
        ceiling: int = 32,
        ttl_secs: int = 1800,
    ) -> None:
        self.pool = pool
        self.ledger = ledger
        self.runs = runs
        self.prices = prices
        self.ceiling = ceiling
        self.ttl_secs = ttl_secs

    async def admit(self, spec: RunSpec, ask: Ask | None, token_sha256: str | None = None) -> Verdict:
        """Checks in the facade's order under the run's row lock; ``ask=None`` means the body was refused
        (it is reported only after the session and budget checks, and nothing is reserved).

        One round trip: ``llm_admit`` (migrations 0005, 0009) checks the caller's token when given (still
        an unrevoked, unexpired llm token of this run, else ``unauthorized``), locks the run's row, reads
        its spend and inserts the reservation when it fits. ``core.usage`` holds the same rule; it words
        the refusals here.
        """
        caps = spec.budgets
        reserve = ask is not None and ask.reserve
        reservation = new_id()
        cost = self.prices.estimate(ask.model, ask.input_tokens, ask.output_tokens) if ask is not None else None
        async with self.pool.acquire() as conn:
            row = await conn.fetchrow(
                "SELECT * FROM llm_admit($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)",
                uuid.UUID(spec.run_id),
                ACTIVE,
                reserve,
                uuid.UUID(reservation),
                uuid.UUID(spec.tenant_id),
                spec.model,
                ask.input_tokens if ask is not None else 0,
                ask.output_tokens if ask is not None else 0,
                cost,
                caps.max_tokens,
                None if caps.max_cost_usd is None else Decimal(str(caps.max_cost_usd)),
                self.ceiling,
                float(self.ttl_secs),
                token_sha256,
            )
        verdict = row["verdict"]
        if verdict == "unauthorized":
            return Verdict("unauthorized")
        if verdict == "inactive":
            return Verdict("inactive")
        spend = Spend(
            used_tokens=int(row["used_tokens"]),
            used_cost=row["used_cost"],
            live=int(row["live"]),
            live_tokens=int(row["live_tokens"]),
            live_cost=row["live_cost"],
        )
        if verdict == "exhausted":
            budget = exhausted(spend, caps.max_tokens, caps.max_cost_usd) or "max_tokens"
            return Verdict("exhausted", budget=budget, stopped=await self._record_stop(spec.run_id, budget, spend))
        if verdict == "checked":
            return Verdict("checked")
        assert ask is not None
        decision = admit(
            spend,
            ask.input_tokens + ask.output_tokens,
            cost,
            max_tokens=caps.max_tokens,
            max_cost=caps.max_cost_usd,
            ceiling=self.ceiling,
        )
        if decision.admitted != (verdict == "admitted"):
            log.error("llm_admit said %s where core.usage.admit says %s for run %s", verdict, decision, spec.run_id)
        if verdict == "admitted":
            return Verdict("admitted", reservation_id=reservation, cost_estimate=cost)
        return Verdict("refused", code=decision.code or "llm_budget_reservation_exceeded", message=decision.message)

    async def _record_stop(self, run_id: str, budget: str, spend: Spend) -> bool:
        async with self.pool.acquire() as conn, conn.transaction():
            status = await conn.fetchval("SELECT status FROM sessions WHERE id = $1 FOR UPDATE", uuid.UUID(run_id))
            if status is None or not accepts_work(status):
                return False
            return await self._stop(conn, run_id, budget, spend)

    async def _stop(self, conn: Conn, run_id: str, budget: str, spend: Spend) -> bool:
        """Record the budget stop once: the wind-down intent and ``budget.exceeded`` (single emission)."""
        spec = await self.runs.run_spec(run_id)
        limit = spec.budgets.max_cost_usd if budget == "max_cost_usd" else spec.budgets.max_tokens
        spent = f"{spend.used_cost:.6f}" if budget == "max_cost_usd" and spend.used_cost is not None else None
        created = await self.runs.record_finalization(
            conn, run_id, "budget_exceeded", None, f"{budget} budget exceeded", True
        )
        if created:
            data = {"budget": budget, "limit": str(limit), "spent": spent or str(spend.used_tokens)}
            await self.ledger.append(conn, run_id, [ev.NewEvent(type=ev.BUDGET_EXCEEDED, data=data)])
        return created

    async def charge(
        self, run_id: str, reservation_id: str, model: str, usage: Usage, *, latency_ms: int, ttfb_ms: int | None
    ) -> bool:
        """reserved → charged with the metered usage: a ``usage_entries`` row keyed by the reservation id
        and a ``model.response`` event. False when the reservation was already settled (e.g. expired)."""
        cost = self.prices.cost(model, usage)
        rid = uuid.UUID(run_id)
        async with self.pool.acquire() as conn, conn.transaction():
            settled = await conn.fetchval(
                "UPDATE llm_reservations SET state = 'charged', settled_at = now(), settle_reason = 'metered'"
                " WHERE id = $1 AND state = 'reserved' RETURNING id",
                uuid.UUID(reservation_id),
            )
            if settled is None:
                log.warning("usage for reservation %s arrived after it was settled; not charged twice", reservation_id)
                return False
            await self._entry(conn, rid, model, usage, cost, "facade", reservation_id)
            data: dict[str, Any] = {
                "model": model,
                **usage.as_dict(),
                "cost_usd": _money(cost),
                "latency_ms": latency_ms,
                "request_id": reservation_id,
            }
            if ttfb_ms is not None:
                data["ttfb_ms"] = ttfb_ms
            await self.ledger.append(conn, run_id, [ev.NewEvent(type=MODEL_RESPONSE, data=data)])
            return True

    async def _entry(
        self, conn: Conn, rid: uuid.UUID, model: str, usage: Usage, cost: Decimal | None, source: str, external: str
    ) -> None:
        await conn.execute(
            "INSERT INTO usage_entries (id, session_id, model, input_tokens, output_tokens, cache_read_tokens,"
            " cache_write_tokens, cost_usd, source, external_id) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10)"
            " ON CONFLICT (external_id) DO NOTHING",
            uuid.UUID(new_id()),
            rid,
            model,
            usage.input_tokens,
            usage.output_tokens,
            usage.cache_read_tokens,
            usage.cache_write_tokens,
            cost,
            source,
            external,
        )

    async def release(self, run_id: str, reservation_id: str, reason: str) -> None:
        """reserved → released: only on proof the request was never served (nothing was spent)."""
        async with self.pool.acquire() as conn:
            await conn.execute(
                "UPDATE llm_reservations SET state = 'released', settled_at = now(), settle_reason = $2"
                " WHERE id = $1 AND state = 'reserved'",
                uuid.UUID(reservation_id),
                reason,
            )

    async def unmetered(self, run_id: str, reservation_id: str, why: str) -> None:
        """No usage could be read (a broken stream, or an upstream error that may still have been billed):
        the reservation stays held (never zero)."""
        note = (
            f"model request without a usage report ({why}); reservation {reservation_id} stays held and is "
            f"charged conservatively when it expires"
        )
        await self.ledger.append_events(run_id, [ev.system_message(note)])

    async def unparsed(self, run_id: str) -> None:
        """The answer came back whole but carried no usage we could parse: the reservation stays held (never
        zero) until expiry charges it, and the run's ledger says so in the reference's words."""
        await self.ledger.append_events(run_id, [ev.system_message(USAGE_UNPARSED)])

    async def expire_due(self, limit: int = 100) -> int:
        """Charge every expired reservation as its whole reservation (``source='reservation_timeout'``)
        with an ``agent.message`` notice. Safe on many replicas: each conversion is a CAS."""
        async with self.pool.acquire() as conn:
            due = await conn.fetch(
                "SELECT id, session_id FROM llm_reservations WHERE state = 'reserved' AND expires_at < now()"
                " ORDER BY expires_at LIMIT $1",
                limit,
            )
        converted = 0
        for row in due:
            async with self.pool.acquire() as conn, conn.transaction():
                res = await conn.fetchrow(
                    "UPDATE llm_reservations SET state = 'charged', settled_at = now(), settle_reason = 'expired'"
                    " WHERE id = $1 AND state = 'reserved' AND expires_at < now() RETURNING *",
                    row["id"],
                )
                if res is None:
                    continue
                usage = Usage(input_tokens=res["reserved_input_tokens"], output_tokens=res["reserved_output_tokens"])
                cost = res["reserved_cost_usd"]
                await self._entry(
                    conn, res["session_id"], res["model"], usage, cost, "reservation_timeout", str(res["id"])
                )
                price = "unpriced" if cost is None else f"${cost:.6f}"
                note = (
                    f"a model request never reported its usage (reservation {res['id']}); charged conservatively "
                    f"as its whole reservation: {usage.total} tokens, {price}"
                )
                await self.ledger.append(conn, str(res["session_id"]), [ev.system_message(note)])
                converted += 1
        return converted

    async def reservations(self, run_id: str) -> list[Reservation]:
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT id, model, state, reserved_input_tokens, reserved_output_tokens, reserved_cost_usd,"
                " created_at, expires_at, settled_at, settle_reason FROM llm_reservations WHERE session_id = $1"
                " ORDER BY created_at, id",
                uuid.UUID(run_id),
            )
        return [
            Reservation.model_validate({**dict(r), "reserved_cost_usd": _money(r["reserved_cost_usd"])}) for r in rows
        ]

    async def report(self, run_id: str) -> CostReport:
        """The cost report: totals, per model and source, live reservations, and registered tool calls."""
        rid = uuid.UUID(run_id)
        # One snapshot for every figure: a reservation converted between two reads would otherwise show
        # in neither the breakdown nor the live reservations, or in both.
        async with self.pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
            by = await conn.fetch(
                "SELECT model, source, sum(input_tokens) AS input_tokens, sum(output_tokens) AS output_tokens,"
                " sum(cache_read_tokens) AS cache_read_tokens, sum(cache_write_tokens) AS cache_write_tokens,"
                " sum(cost_usd) AS cost_usd, count(*) AS requests, bool_or(cost_usd IS NULL) AS unpriced"
                " FROM usage_entries WHERE session_id = $1 GROUP BY model, source ORDER BY model, source",
                rid,
            )
            live = await conn.fetchrow(
                "SELECT count(*) AS active, coalesce(sum(reserved_input_tokens + reserved_output_tokens), 0)"
                " AS tokens, sum(reserved_cost_usd) AS cost_usd FROM llm_reservations"
                " WHERE session_id = $1 AND state = 'reserved'",
                rid,
            )
            tool_calls = await conn.fetchval("SELECT count(*) FROM approvals WHERE session_id = $1", rid)
        breakdown = [
            CostLine(
                model=r["model"],
                source=r["source"],
                input_tokens=int(r["input_tokens"]),
                output_tokens=int(r["output_tokens"]),
                cache_read_tokens=int(r["cache_read_tokens"]),
                cache_write_tokens=int(r["cache_write_tokens"]),
                cost_usd=None if r["unpriced"] else _money(r["cost_usd"]),
                requests=int(r["requests"]),
            )
            for r in by
        ]
        costs = [r["cost_usd"] for r in by if r["cost_usd"] is not None]
        totals = UsageTotals(
            input_tokens=sum(line.input_tokens for line in breakdown),
            output_tokens=sum(line.output_tokens for line in breakdown),
            cache_read_tokens=sum(line.cache_read_tokens for line in breakdown),
            cache_write_tokens=sum(line.cache_write_tokens for line in breakdown),
            cost_usd=float(sum(costs)) if costs else 0.0,
            requests=sum(line.requests for line in breakdown),
        )
        return CostReport(
            usage=totals,
            tool_calls=int(tool_calls),
            breakdown=breakdown,
            reservations=LiveReservations(
                active=int(live["active"]), tokens=int(live["tokens"]), cost_usd=_money(live["cost_usd"])
            ),
        )
