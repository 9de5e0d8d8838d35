"""Approvals: intent → pending → decided, each decision a compare-and-swap so exactly one writer wins
and emits the events; a listing joins the authority facts a decider must see."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

import asyncpg

from core import events as ev
from core.access import access_of
from core.errors import Conflict, NotFound
from core.states import RunStatus, accepts_work
from db._base import Conn, ReadModel, as_model, as_models, fetch_model, fetch_models, known_id
from db.ledger import Ledger
from db.runs import Runs

# An approval row plus the frozen facts that say whose authority its call would execute under:
# for ``mcp__<slot>__<tool>``, the run's binding of that slot (the run_resource_bindings row, and the
# run_spec.brokered entry it was written from) and its connection; and who invoked the run.
APPROVAL_AUTHORITY_COLUMNS = (
    "brokered_slot",
    "spec_owner_type",
    "spec_owner_user_id",
    "binding_owner_type",
    "binding_owner_user_id",
    "binding_connection_id",
    "connection_found",
    "connection_display_name",
    "run_invoked_by_user_id",
)
_APPROVALS_WITH_AUTHORITY = (
    "SELECT a.*, t.slot AS brokered_slot, sb.e->>'owner_type' AS spec_owner_type,"
    " sb.e->>'owner_user_id' AS spec_owner_user_id, b.connection_owner_type AS binding_owner_type,"
    " b.connection_owner_user_id AS binding_owner_user_id, b.connection_id AS binding_connection_id,"
    " (c.id IS NOT NULL) AS connection_found, c.display_name AS connection_display_name,"
    " s.invoked_by_user_id AS run_invoked_by_user_id "
    "FROM approvals a JOIN sessions s ON s.id = a.session_id "
    "CROSS JOIN LATERAL (SELECT CASE WHEN a.tool LIKE 'mcp!_!_%!_!_%' ESCAPE '!'"
    " THEN split_part(substr(a.tool, 6), '__', 1) END AS slot) t "
    "LEFT JOIN LATERAL (SELECT x.e FROM jsonb_array_elements(COALESCE(s.run_spec->'brokered', '[]'::jsonb)) x(e)"
    " WHERE x.e->>'slot' = t.slot LIMIT 1) sb ON true "
    "LEFT JOIN run_resource_bindings b ON b.session_id = a.session_id AND b.slot_kind = 'mcp'"
    " AND b.requirement_slot = t.slot "
    "LEFT JOIN integration_connections c ON c.id = b.connection_id "
)


class ApprovalRecord(ReadModel):
    """An ``approvals`` row. A plain pydantic model rather than the ``Approval`` table class: the gate
    reads and writes one on every tool call, and validating the SQLModel class costs ~150 us a row."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    session_id: uuid.UUID
    tool_call_id: str
    tool: str
    summary: str | None
    input_digest: str
    risk: str | None
    scope: str | None
    scope_key: str | None
    status: str
    decision_source: str | None
    decision_reason: str | None
    requested_at: datetime
    expires_at: datetime | None
    decided_at: datetime | None
    decided_by: str | None


class ApprovalWithAuthority(ApprovalRecord):
    """An approval with the frozen facts of whose authority its call would execute under."""

    brokered_slot: str | None
    spec_owner_type: str | None
    spec_owner_user_id: str | None
    binding_owner_type: str | None
    binding_owner_user_id: uuid.UUID | None
    binding_connection_id: uuid.UUID | None
    connection_found: bool
    connection_display_name: str | None
    run_invoked_by_user_id: uuid.UUID | None


DECIDED_ALLOW = frozenset({"auto_allowed", "approved_once", "approved_session"})
DECIDED_DENY = frozenset({"auto_denied", "denied", "expired"})


async def approval_for_call(conn: Conn, run_id: uuid.UUID, tool_call_id: str) -> ApprovalRecord | None:
    """The approval row of one tool call of a run, read on ``conn`` (inside the caller's transaction)."""
    return await fetch_model(
        conn,
        ApprovalRecord,
        "SELECT * FROM approvals WHERE session_id = $1 AND tool_call_id = $2",
        run_id,
        tool_call_id,
    )


class GateOutcome:
    """What /permission answers: a verdict now, or the approval the runner must wait on."""

    def __init__(self, verdict: str, message: str | None = None, *, wait: ApprovalRecord | None = None) -> None:
        self.verdict = verdict  # allow | deny | wait
        self.message = message
        self.wait = wait  # the intent/pending approval row when verdict == "wait"


class Approvals:
    def __init__(self, pool: asyncpg.Pool[Any], ledger: Ledger, runs: Runs) -> None:
        self.pool = pool
        self.ledger = ledger
        self.runs = runs

    async def open_approval(self, run_id: str, tool_call_id: str) -> ApprovalRecord:
        """intent → pending (idempotent), ``approval.requested``, and running → awaiting_approval."""
        rid = uuid.UUID(run_id)
        async with self.pool.acquire() as conn, conn.transaction():
            status = await conn.fetchval("SELECT status FROM sessions WHERE id = $1 FOR UPDATE", rid)
            row = await fetch_model(
                conn,
                ApprovalRecord,
                "UPDATE approvals SET status = 'pending', requested_at = now(),"
                " expires_at = now() + (expires_at - requested_at)"
                " WHERE session_id = $1 AND tool_call_id = $2 AND status = 'intent' RETURNING *",
                rid,
                tool_call_id,
            )
            if row is None:
                existing = await approval_for_call(conn, rid, tool_call_id)
                if existing is None:
                    raise NotFound("no such tool call")
                return existing
            if not accepts_work(status):
                # The run stopped accepting work while this call was registered: deny it once.
                return await self._settle(conn, row, "denied", "system", "session_terminal", "session is not active")
            await self.ledger.append(
                conn,
                run_id,
                [
                    ev.NewEvent(
                        type=ev.APPROVAL_REQUESTED,
                        data={
                            "approval_id": str(row.id),
                            "tool_call_id": tool_call_id,
                            "tool": row.tool,
                            "summary": row.summary,
                            "risk": row.risk,
                            "expires_at": row.expires_at.isoformat() if row.expires_at else None,
                        },
                    )
                ],
            )
            if status == RunStatus.RUNNING:
                await self.runs.transition(run_id, RunStatus.AWAITING_APPROVAL, conn=conn)
            return row

    async def _settle(
        self, conn: Conn, row: ApprovalRecord, decision: str, decided_by: str, source: str, reason: str
    ) -> ApprovalRecord:
        settled = await fetch_model(
            conn,
            ApprovalRecord,
            "UPDATE approvals SET status = $2, decided_at = now(), decided_by = $3, decision_source = $4,"
            " decision_reason = $5 WHERE id = $1 AND status IN ('pending', 'intent') RETURNING *",
            row.id,
            decision,
            decided_by,
            source,
            reason,
        )
        if settled is None:
            raise Conflict("approval is not pending")
        verdict = "allow" if decision in DECIDED_ALLOW else "deny"
        access = (
            access_of(await self.runs.run_spec(str(row.session_id)), row.tool) if row.tool.startswith("mcp__") else None
        )
        new = []
        if row.status == "pending":
            new.append(
                ev.NewEvent(
                    type=ev.APPROVAL_DECIDED,
                    actor="human" if source == "human" else "system",
                    data={
                        "approval_id": str(row.id),
                        "tool_call_id": row.tool_call_id,
                        "decision": decision,
                        "decided_by": decided_by,
                    },
                )
            )
        new.append(
            ev.NewEvent(
                type=ev.TOOL_DECISION,
                data={
                    "tool_call_id": row.tool_call_id,
                    "tool": row.tool,
                    "verdict": verdict,
                    "source": source,
                    "reason": reason,
                    # A brokered tool's class; a built-in tool (Bash, Write, …) has none to record.
                    **({"access": access} if access is not None else {}),
                },
            )
        )
        await self.ledger.append(conn, str(row.session_id), new)
        return settled

    async def decide_approval(
        self,
        tenant_id: str,
        approval_id: str,
        decision: str,
        decided_by: str,
        authorize: Callable[[ApprovalWithAuthority], None] | None = None,
    ) -> ApprovalRecord:
        """The human decision: a CAS pending → decision; only the winner writes events.
        ``authorize`` sees the row with its authority facts (``ApprovalWithAuthority``) and raises
        to refuse before anything is written."""
        aid = known_id(approval_id)
        async with self.pool.acquire() as conn, conn.transaction():
            row = await fetch_model(
                conn,
                ApprovalWithAuthority,
                f"{_APPROVALS_WITH_AUTHORITY} WHERE a.id = $1 AND a.tenant_id = $2",
                aid,
                uuid.UUID(tenant_id),
            )
            if row is None:
                raise NotFound()
            if authorize is not None:
                authorize(row)
            if row.status != "pending":
                session_status = await conn.fetchval("SELECT status FROM sessions WHERE id = $1", row.session_id)
                raise Conflict(
                    "approval is not pending", approval_status=row.status, session_status=str(session_status)
                )
            # Lock order (session, then approval) matches the gate's, so concurrent deciders queue here.
            status = await conn.fetchval("SELECT status FROM sessions WHERE id = $1 FOR UPDATE", row.session_id)
            if not accepts_work(status):
                # The runner has already been told no; a late approval must not record an allow.
                raise Conflict("approval is not pending", approval_status=row.status, session_status=str(status))
            return await self._settle(conn, row, decision, decided_by, "human", f"human:{decided_by}")

    async def expire_approval(self, approval_id: str) -> ApprovalRecord:
        async with self.pool.acquire() as conn, conn.transaction():
            row = await fetch_model(
                conn, ApprovalRecord, "SELECT * FROM approvals WHERE id = $1", uuid.UUID(approval_id)
            )
            if row is None:
                raise NotFound()
            await conn.execute("SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE", row.session_id)
            try:
                return await self._settle(conn, row, "expired", "timeout", "human", "human:timeout")
            except Conflict:
                current = await conn.fetchrow("SELECT * FROM approvals WHERE id = $1", uuid.UUID(approval_id))
                return as_model(ApprovalRecord, current) or row

    async def deny_open_approvals(self, run_id: str, reason: str) -> None:
        """Settle every undecided call of a run that stopped accepting work (single emission via CAS)."""
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE", uuid.UUID(run_id))
            rows = await fetch_models(
                conn,
                ApprovalRecord,
                "SELECT * FROM approvals WHERE session_id = $1 AND status IN ('pending', 'intent')",
                uuid.UUID(run_id),
            )
            for row in rows:
                await self._settle(conn, row, "denied", "system", "session_terminal", reason)

    async def settle_inflight_claims(self, run_id: str) -> None:
        """A run that ends with a brokered call still ``claimed`` cannot learn its outcome: ambiguous."""
        async with self.pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(
                "UPDATE tool_execution_claims SET state = 'ambiguous', settled_at = now(), "
                "error = 'the run ended while the call was in flight' WHERE session_id = $1 AND state = 'claimed' "
                "RETURNING tool_call_id, tool, binding_id",
                uuid.UUID(run_id),
            )
            new = [
                ev.NewEvent(
                    type="tool.brokered",
                    data={
                        "tool_call_id": r["tool_call_id"],
                        "tool": r["tool"],
                        "binding_id": str(r["binding_id"]),
                        "ok": False,
                        "outcome": "ambiguous",
                        "error": "the run ended while the call was in flight",
                    },
                )
                for r in rows
            ]
            await self.ledger.append(conn, run_id, new)

    async def settled_verdict(self, run_id: str, tool_call_id: str) -> GateOutcome | None:
        """The verdict a held tool call gets once its approval is settled in PostgreSQL; None while it waits.

        Worded as the run's workflow words it (``human decision: denied``, the recorded reason otherwise),
        and ``session is not active`` once the run stopped accepting work, as the workflow answers then."""
        async with self.pool.acquire() as conn:
            row = await conn.fetchrow(
                "SELECT a.status, a.decision_source, a.decision_reason, s.status AS session_status"
                " FROM approvals a JOIN sessions s ON s.id = a.session_id"
                " WHERE a.session_id = $1 AND a.tool_call_id = $2",
                uuid.UUID(run_id),
                tool_call_id,
            )
        if row is None or row["status"] in ("intent", "pending"):
            return None
        if not accepts_work(row["session_status"]):
            return GateOutcome("deny", "session is not active")
        if row["status"] in DECIDED_ALLOW:
            return GateOutcome("allow")
        if row["decision_source"] == "human" and row["status"] != "expired":
            return GateOutcome("deny", f"human decision: {row['status']}")
        return GateOutcome("deny", row["decision_reason"] or "denied by a human")

    async def resume_after_approval(self, run_id: str) -> None:
        async with self.pool.acquire() as conn, conn.transaction():
            status = await conn.fetchval("SELECT status FROM sessions WHERE id = $1 FOR UPDATE", uuid.UUID(run_id))
            pending = await conn.fetchval(
                "SELECT count(*) FROM approvals WHERE session_id = $1 AND status = 'pending'", uuid.UUID(run_id)
            )
            if status == RunStatus.AWAITING_APPROVAL and pending == 0:
                await self.runs.transition(run_id, RunStatus.RUNNING, conn=conn)

    async def list_approvals(self, tenant_id: str, *, run_id: str | None = None) -> list[ApprovalWithAuthority]:
        """A run's approvals, or the tenant's pending ones; each with its authority facts."""
        async with self.pool.acquire() as conn:
            if run_id is not None:
                records = await conn.fetch(
                    f"{_APPROVALS_WITH_AUTHORITY} WHERE a.session_id = $1 AND a.tenant_id = $2"
                    " ORDER BY a.requested_at, a.id",
                    uuid.UUID(run_id),
                    uuid.UUID(tenant_id),
                )
            else:
                records = await conn.fetch(
                    f"{_APPROVALS_WITH_AUTHORITY} WHERE a.tenant_id = $1 AND a.status = 'pending'"
                    " ORDER BY a.requested_at, a.id",
                    uuid.UUID(tenant_id),
                )
            return as_models(ApprovalWithAuthority, records)
