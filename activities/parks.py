"""Parked runs' steps: park a brokered call, look whether a wait is over, end a wait.

The workflow waits (a signal plus a slow re-check timer); these short, idempotent steps run as local
activities at each wake-up. Whether a connection is usable is decided here from the live row (active, a
credential present: sealed, or its ``credential_env`` set in this worker's environment), never from the
signal that woke the run.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from temporalio import activity

from contracts import temporal as c
from core import events as ev
from db.connections import Connections
from db.ledger import Ledger
from db.parks import UP_FRONT, Parks
from db.runs import Runs


def missing_env(var: str | None) -> str | None:
    """``Missing <VAR>`` when a connection's credential comes from an environment variable that is unset."""
    if var and not os.environ.get(var):
        return f"Missing {var}"
    return None


class ParkActivities:
    def __init__(self, parks: Parks, runs: Runs, ledger: Ledger, connections: Connections) -> None:
        self.parks = parks
        self.runs = runs
        self.ledger = ledger
        self.connections = connections

    async def _out(
        self, run_id: str, tool_call_id: str, state: str | None = None, reason: str | None = None
    ) -> c.ParkOut:
        row = await self.parks.wait_state(run_id, tool_call_id)
        run = await self.runs.get_run(None, run_id)
        assert run is not None
        return c.ParkOut(
            state=state or (row.state if row else "ended"),
            expires_at=row.expires_at.isoformat() if row else "1970-01-01T00:00:00+00:00",
            status=run.status,
            reason=reason or (row.reason if row else None),
        )

    @activity.defn(name=c.PARK_CALL)
    async def park_call(self, inp: c.ParkIn) -> c.ParkOut:
        parked = await self.parks.park_call(inp.run_id, inp.tool_call_id, inp.input_digest, inp.reason)
        row = parked.park
        return c.ParkOut(
            state=row.state, expires_at=row.expires_at.isoformat(), status=parked.status, reason=row.reason
        )

    @activity.defn(name=c.TRY_UNPARK)
    async def try_unpark(self, inp: c.ParkIn) -> c.ParkOut:
        if inp.tool_call_id == UP_FRONT:
            state, _ = await self.parks.unpark_up_front(inp.run_id)
            return await self._out(inp.run_id, UP_FRONT, state if state != "waiting" else None)
        usable, reason = await self._usable(inp.run_id, inp.tool_call_id, inp.input_digest)
        state, _status = await self.parks.unpark_call(inp.run_id, inp.tool_call_id, usable, reason)
        return await self._out(inp.run_id, inp.tool_call_id, state)

    async def _usable(self, run_id: str, tool_call_id: str, digest: str) -> tuple[bool, str | None]:
        row = await self.parks.call_connection(run_id, tool_call_id, digest)
        if row is None:
            return False, "the parked call is gone"
        if row.status != "active":
            return False, f"the bound connection is {row.status}"
        missing = missing_env(row.credential_env)
        if missing:
            return False, missing
        if not row.sealed and not row.credential_env:
            return False, "the bound connection has no credential"
        return True, None

    @activity.defn(name=c.END_PARK)
    async def end_park(self, inp: c.EndParkIn) -> c.ParkOut:
        ended = await self.parks.end(inp.run_id, inp.tool_call_id, inp.outcome)
        waited = ended or await self.parks.wait_state(inp.run_id, inp.tool_call_id)
        what = f"a connection for slot '{waited.slot}'" if waited else "a connection"
        cause = waited.reason if waited else "unknown"
        if inp.outcome == "expired":
            reason = f"waited for {what} until the park expired (budgets.max_park_secs): {cause}"
        else:
            reason = "the run ended while it waited for " + what
        if inp.tool_call_id:
            await self._refuse(inp, reason)
        if inp.outcome == "expired":
            created, _status = await self.runs.request_finalization(inp.run_id, "failed", reason=reason)
            if created:
                await self.ledger.append_events(inp.run_id, [ev.NewEvent(type=ev.RUN_ERROR, data={"message": reason})])
        return await self._out(inp.run_id, inp.tool_call_id, inp.outcome, reason)

    async def _refuse(self, inp: c.EndParkIn, reason: str) -> None:
        """The parked call will never run: its registered claim becomes ``refused`` (once)."""
        taken = await self.connections.take(inp.run_id, inp.tool_call_id, inp.input_digest)
        if taken is None:
            return
        decision = ev.binding_denied(inp.tool_call_id, taken.tool, reason)
        await self.connections.settle(inp.run_id, inp.tool_call_id, inp.input_digest, "refused", None, reason, decision)

    def all(self) -> list[Callable[..., Any]]:
        return [self.park_call, self.try_unpark, self.end_park]


__all__ = ["ParkActivities", "missing_env"]
