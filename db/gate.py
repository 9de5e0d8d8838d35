"""The gate: one tool call's decision in one transaction under the run's row lock (replay check,
``core.gate.decide``, session-scope upgrade, the approval row, its events, a budget stop)."""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg

from core import events as ev
from core.access import access_of
from core.digests import input_digest
from core.gate import GateDecision, decide
from core.redaction import Redactor
from core.states import accepts_work
from db._base import Conn, fetch_model
from db.approvals import DECIDED_ALLOW, DECIDED_DENY, ApprovalRecord, GateOutcome, approval_for_call
from db.ids import new_id
from db.ledger import Ledger
from db.runs import Runs


class Gate:
    def __init__(self, pool: asyncpg.Pool[Any], redactor: Redactor, ledger: Ledger, runs: Runs) -> None:
        self.pool = pool
        self.redactor = redactor
        self.ledger = ledger
        self.runs = runs

    async def decide_call(
        self, run_id: str, tool_call_id: str, tool: str, tool_input: dict[str, Any], via: str | None = None
    ) -> GateOutcome:
        """``via`` ("tool_call": reached through deferred discovery) only labels the events; the decision is
        the target's, exactly as for a direct call."""
        spec = await self.runs.run_spec(run_id)
        digest = input_digest(tool, tool_input)
        rid = uuid.UUID(run_id)
        async with self.pool.acquire() as conn, conn.transaction():
            # The session row lock serializes one run's gate calls: budget counts and seq stay exact.
            session = await conn.fetchrow("SELECT status, gate_calls FROM sessions WHERE id = $1 FOR UPDATE", rid)
            if session is None or not accepts_work(session["status"]):
                return GateOutcome("deny", "session is not active")
            # Separate statements after the lock: under READ COMMITTED they see what a concurrent
            # transaction we waited for committed (an intent, a cancel); a join inside the locking
            # query would keep the pre-wait snapshot of the joined tables.
            existing = await approval_for_call(conn, rid, tool_call_id)
            winding_down = await conn.fetchval(
                "SELECT EXISTS (SELECT 1 FROM session_finalizations WHERE session_id = $1)", rid
            )
            if existing is not None:
                return await self._replay(conn, run_id, existing, tool, digest, access_of(spec, tool))
            if winding_down:
                # A result, a cancel or a budget stop is recorded: no new work starts.
                return GateOutcome("deny", "session is not active")
            count = session["gate_calls"] + 1
            decision = decide(spec, tool, tool_input, registered_calls=count)
            if decision.verdict == "require_approval" and decision.policy and decision.policy.scope_key:
                approved = await conn.fetchval(
                    "SELECT 1 FROM approvals WHERE session_id = $1 AND status = 'approved_session' "
                    "AND scope_key = $2 LIMIT 1",
                    rid,
                    decision.policy.scope_key,
                )
                if approved:
                    decision = GateDecision(
                        verdict="allow",
                        source="session_scope",
                        policy=decision.policy,
                        reason=f"approved for the session ({decision.policy.scope_key})",
                    )
            status = {"allow": "auto_allowed", "deny": "auto_denied"}.get(decision.verdict, "intent")
            policy = decision.policy
            summary = str(self.redactor.redact(ev.summarize(tool, tool_input)).value)
            row = await fetch_model(
                conn,
                ApprovalRecord,
                "INSERT INTO approvals (id, tenant_id, session_id, tool_call_id, tool, summary, input_digest,"
                " risk, scope, scope_key, status, decision_source, decision_reason, decided_at, decided_by,"
                " expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13,"
                " CASE WHEN $11 = 'intent' THEN NULL ELSE now() END,"
                " CASE WHEN $11 = 'intent' THEN NULL ELSE 'gate' END,"
                " CASE WHEN $11 = 'intent' THEN now() + make_interval(secs => $14) END) RETURNING *",
                uuid.UUID(new_id()),
                uuid.UUID(spec.tenant_id),
                rid,
                tool_call_id,
                tool,
                summary,
                digest,
                policy.risk if policy else None,
                policy.scope if policy else None,
                policy.scope_key if policy else None,
                status,
                decision.source,
                decision.reason,
                float(policy.ttl_secs or 600) if policy else 600.0,
            )
            labels = {"via": via} if via else {}
            new = [
                ev.NewEvent(
                    type=ev.TOOL_REQUESTED,
                    data={
                        "tool_call_id": tool_call_id, "tool": tool, "summary": summary, "input_digest": digest,
                        **labels,
                    },
                )
            ]  # fmt: skip
            if decision.verdict != "require_approval":
                data = decision.decision_data(tool_call_id, tool) | labels
                new.append(ev.NewEvent(type=ev.TOOL_DECISION, data=data))
            if decision.budget_exceeded:
                cap = spec.budgets.max_tool_calls
                new.append(
                    ev.NewEvent(
                        type=ev.BUDGET_EXCEEDED,
                        data={"budget": "max_tool_calls", "limit": str(cap), "spent": str(count)},
                    )
                )
                await self.runs.record_finalization(
                    conn, run_id, "budget_exceeded", None, "max_tool_calls budget exceeded", True
                )
            await self.ledger.append(conn, run_id, new, gate_calls=1)
        if decision.verdict == "require_approval":
            return GateOutcome("wait", wait=row)
        return GateOutcome(decision.verdict, decision.reason if decision.verdict == "deny" else None)

    async def _replay(
        self, conn: Conn, run_id: str, row: ApprovalRecord, tool: str, digest: str, access: str | None
    ) -> GateOutcome:
        if row.tool != tool or row.input_digest != digest:
            message = "tool_call_id reused with a different tool or input"
            data = {
                "tool_call_id": row.tool_call_id,
                "tool": tool,
                "verdict": "deny",
                "source": "protocol_violation",
                "reason": message,
                **({"access": access} if access is not None else {}),
            }
            await self.ledger.append(conn, run_id, [ev.NewEvent(type=ev.TOOL_DECISION, data=data)])
            return GateOutcome("deny", message)
        if row.status in DECIDED_ALLOW:
            return GateOutcome("allow")
        if row.status in DECIDED_DENY:
            return GateOutcome("deny", row.decision_reason or "denied")
        return GateOutcome("wait", wait=row)
