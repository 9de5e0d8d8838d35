"""The runner plane's tool calls: the gate's answer, deferred discovery, brokered calls and proposed connections.

The ``/internal`` routes parse, check the run token and shape the answer; this module holds the rules:

- **One gate.** Every tool call is decided by ``db.gate`` from PostgreSQL (the run's frozen policy, its
  budgets, an earlier decision of the same tool call id). A call that needs a human is held until its
  approval settles: the approval row is the authority (a human decision is a compare-and-swap there before
  the workflow hears of it), re-read whenever the run's ledger moves, and the workflow's approval wait
  answers when the row does not settle first (expiry, cancellation, the run no longer accepting work).
- **Discovery reads the frozen RunSpec only**, and only for a run whose tool discovery is deferred; a slot
  whose connection cannot be used now is listed as needing authorization, never left out.
- **A brokered call is refused before the gate** unless its tool is one of the run's frozen brokered
  surfaces (a sandbox-class or sandbox CLI tool executes inside the sandbox): nothing is registered and no
  budget is spent.
- **An allowed call is registered once** (its execution claim, keyed by tool call id and input digest, holds
  the input: never the ledger or the workflow history) and **dispatched once per attempt**: the attempt
  number is in the workflow update id, so a duplicate re-attaches to the same execution, and only a proven
  pre-send failure gets a fresh attempt, up to ``MAX_ATTEMPTS``.
- **A lapsed claim is ambiguous, never sent again.** A claim in flight past ``CLAIM_TTL_SECS`` by the
  database's clock lost its dispatcher; retrying its call sweeps the run's lapsed claims to ``ambiguous``,
  each with its ``tool.brokered`` event.
- **A proposed connection** is checked (``core.dynamic_connections``: the agent enables it, the host is
  allowed, no launch field or secret), its URL admitted by the connector URL policy, recorded, gated as
  ``ProposeConnection``, and saved ``pending`` without a credential only once allowed.
"""

from __future__ import annotations

import asyncio
from asyncio import FIRST_COMPLETED
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from core import discovery
from core import events as ev
from core.contract import PermissionRequest, PermissionResponse
from core.digests import input_digest
from core.dynamic_connections import PROPOSE_CONNECTION, check_proposal
from core.errors import BadRequest
from core.runspec import RunSpec
from core.tools import split_mcp
from db.approvals import Approvals
from db.connections import CLAIM_TTL_SECS, MAX_ATTEMPTS, ConnectionRow, Connections
from db.gate import Gate
from db.models.connections import ToolExecutionClaim
from db.runs import Runs
from services.connections import ConnectionService
from services.run_control import RunControl

INACTIVE = PermissionResponse(decision="deny", message="session is not active")
SETTLED_RECHECK_SECS = 2.0  # a held tool call re-reads its approval this often without a wake-up


class Wakeups(Protocol):
    """Wakes a waiter when a run's ledger moves (``api.hub.EventHub``: LISTEN/NOTIFY, fanned out in memory)."""

    def subscribe(self, run_id: str, /) -> AbstractContextManager[asyncio.Event]: ...


@dataclass(frozen=True)
class Refused:
    """The gate did not allow the call (its ``message`` says why); nothing was executed or saved."""

    message: str | None


def stale_claim_event(claim: ToolExecutionClaim) -> ev.NewEvent:
    return ev.NewEvent(
        type="tool.brokered",
        data={
            "tool_call_id": claim.tool_call_id,
            "tool": claim.tool,
            "binding_id": str(claim.binding_id),
            "ok": False,
            "outcome": "ambiguous",
            "error": "dispatcher lost while the call was in flight",
        },
    )


class BrokeredCalls:
    """The runner plane's tool calls; see the module docstring for the rules."""

    def __init__(
        self,
        runs: Runs,
        gates: Gate,
        approvals: Approvals,
        connections: Connections,
        connection_service: ConnectionService,
        run_control: RunControl,
    ) -> None:
        self.runs = runs
        self.gates = gates
        self.approvals = approvals
        self.connections = connections
        self.connection_service = connection_service
        self.run_control = run_control

    # ---- the gate ------------------------------------------------------------------------------

    async def gate(self, run_id: str, req: PermissionRequest, wakeups: Wakeups) -> PermissionResponse:
        """Allow or deny now, or hold until the tool call's approval is settled (a retry re-attaches).

        A held call waits on two things at once: the run's approval update (the workflow owns the wait,
        its expiry and its cancellation) and the approval row itself, re-read whenever the run's ledger
        moves (the decision's ``approval.decided`` wakes it). Answering from the row as soon as it settles
        skips a workflow task on the wake path."""
        outcome = await self.gates.decide_call(run_id, req.tool_call_id, req.tool, req.input, req.via)
        if outcome.verdict == "allow":
            return PermissionResponse(decision="allow")
        if outcome.verdict == "deny":
            return PermissionResponse(decision="deny", message=outcome.message)
        with wakeups.subscribe(run_id) as moved:
            held = asyncio.create_task(self._held_by_workflow(run_id, req))
            try:
                while True:
                    moved.clear()  # before the read: a decision committed after it still wakes the wait
                    settled = await self.approvals.settled_verdict(run_id, req.tool_call_id)
                    if settled is not None:
                        return PermissionResponse(decision=settled.verdict, message=settled.message)
                    woken = asyncio.create_task(moved.wait())
                    try:
                        # The periodic re-read covers a NOTIFY lost while the hub reconnects.
                        await asyncio.wait({held, woken}, timeout=SETTLED_RECHECK_SECS, return_when=FIRST_COMPLETED)
                    finally:
                        woken.cancel()
                    if held.done():
                        return held.result()
            finally:
                held.cancel()
                if held.done() and not held.cancelled():
                    held.exception()  # answered from the row meanwhile: its outcome is not needed, nor logged

    async def _held_by_workflow(self, run_id: str, req: PermissionRequest) -> PermissionResponse:
        verdict = await self.run_control.await_approval(run_id, req.tool_call_id)
        if verdict is None:
            return INACTIVE
        if verdict.decision == "allow":
            return PermissionResponse(decision="allow")
        return PermissionResponse(decision="deny", message=verdict.message or "denied")

    # ---- deferred discovery --------------------------------------------------------------------

    async def _deferred_spec(self, run_id: str) -> RunSpec:
        spec = await self.runs.run_spec(run_id)
        if spec.tool_discovery != "deferred":
            raise BadRequest("this run sees its brokered tools directly: tool discovery is not deferred")
        return spec

    async def search(self, run_id: str, query: str, limit: int) -> list[dict[str, Any]]:
        """``tool_search`` over the run's frozen brokered tools (reads only: nothing is gated or spent)."""
        spec = await self._deferred_spec(run_id)
        return discovery.search(spec, query, limit, await self.connections.unusable_slots(run_id))

    async def describe(self, run_id: str, name: str) -> dict[str, Any]:
        """``tool_describe``: the frozen definition the gate validates a call against."""
        spec = await self._deferred_spec(run_id)
        found = discovery.describe(spec, name, await self.connections.unusable_slots(run_id))
        if found is None:
            raise BadRequest(f"tool '{name}' is not in this run's frozen tool set (names are mcp__<slot>__<tool>)")
        return found

    # ---- brokered calls ------------------------------------------------------------------------

    async def call(self, run_id: str, req: PermissionRequest, wakeups: Wakeups) -> Refused | ToolExecutionClaim:
        """Gate one brokered call, then register and dispatch it; the claim as it stands afterwards (its
        outcome once settled, else in flight). :class:`BadRequest` for a tool that is not brokered here."""
        spec = await self.runs.run_spec(run_id)
        surface = self._surface(spec, req.tool)
        decision = await self.gate(run_id, req, wakeups)
        if decision.decision == "deny":
            return Refused(decision.message)
        digest = input_digest(req.tool, req.input)
        registered = await self.connections.register_claim(
            run_id, req.tool_call_id, digest, surface["binding_id"], req.tool, req.input
        )
        claim = registered.claim
        if registered.lapsed:
            # This call's own claim has been in flight past its TTL (by the database's clock, the one that wrote
            # claimed_at): its dispatcher died, so it becomes ambiguous instead of being re-attached. Other calls'
            # stale claims are swept when they are retried, or settled ambiguous when the run ends; a call whose claim
            # has not lapsed skips the sweep (a transaction of three round trips on every call otherwise).
            await self.connections.expire_stale(run_id, CLAIM_TTL_SECS, stale_claim_event)
            claim = await self.connections.claim(run_id, req.tool_call_id, digest) or claim
        if claim.state in ("registered", "failed_before_send", "claimed") and claim.attempts < MAX_ATTEMPTS:
            # The attempt number is in the update id: a duplicate re-attaches to the same execution,
            # and only a proven pre-send failure ever gets a fresh one.
            attempt = claim.attempts + (0 if claim.state == "claimed" else 1)
            await self.run_control.broker(run_id, req.tool_call_id, digest, attempt)
            claim = await self.connections.claim(run_id, req.tool_call_id, digest) or claim
        return claim

    @staticmethod
    def _surface(spec: RunSpec, tool: str) -> dict[str, Any]:
        """The run's frozen brokered surface ``tool`` goes through; refused before the gate otherwise."""
        split = split_mcp(tool)
        surface = next((b for b in spec.brokered if split and b["slot"] == split[0]), None)
        if (
            split
            and surface is None
            and any(s.get("name") == split[0] for bundle in spec.capabilities for s in bundle.get("servers", []))
        ):
            raise BadRequest(f"tool '{tool}' is sandbox-class — it executes inside the sandbox, not through the broker")
        if surface is not None and surface.get("transport") == "sandbox_cli":
            raise BadRequest(
                f"tool '{tool}' is a sandbox CLI tool — it executes inside the sandbox, not through the broker"
            )
        if surface is None:
            raise BadRequest(
                f"tool '{tool}' is not a brokered tool of this run (brokered tools are mcp__<slot>__<tool>)"
            )
        return surface

    # ---- proposed connections ------------------------------------------------------------------

    async def propose(
        self, run_id: str, tool_call_id: str, connection: dict[str, Any], wakeups: Wakeups
    ) -> Refused | ConnectionRow:
        """Check, admit, record and gate a proposed connection; the saved ``pending`` row once allowed.

        Raises:
            Forbidden: dynamic connections are off for the run's agent.
            BadRequest: the proposal or its URL is refused (the reason is in the message).
        """
        spec = await self.runs.run_spec(run_id)
        proposal = check_proposal(spec.harness_config, connection)
        proposal["base_url"] = (await self.connection_service.admit(proposal["base_url"])).url
        await self.connections.record_proposal(run_id, tool_call_id, proposal)
        request = PermissionRequest(tool_call_id=tool_call_id, tool=PROPOSE_CONNECTION, input=proposal)
        decision = await self.gate(run_id, request, wakeups)
        if decision.decision != "allow":
            return Refused(decision.message)
        row, _ = await self.connections.save_proposal(spec.tenant_id, run_id, tool_call_id, proposal, spec.agent_name)
        return row


__all__ = ["INACTIVE", "SETTLED_RECHECK_SECS", "BrokeredCalls", "Refused", "Wakeups", "stale_claim_event"]
