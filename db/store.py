"""The composition of the repositories under ``db/``, one per aggregate, over one pool.

``Store`` is a small container: it builds the repositories every process shares (``store.runs``,
``store.approvals``, ``store.ledger`` …) and callers use them directly. The aggregates whose repositories
take the store (triggers, deliveries, identity, OAuth, managed apps, connections, catalog, capabilities) are
built where they are used, from it. The one name still forwarded, ``append``, is for ``db/connections.py``.

Conventions: the ledger's ``seq`` is assigned under the session row lock in the inserting
transaction (gapless); every event payload passes the redactor; every decision is a compare-and-swap
so exactly one writer wins and emits events.
"""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg

from core.errors import InvalidTransition
from core.redaction import Redactor
from db._base import Conn, Row
from db.agents import Agents
from db.approvals import DECIDED_ALLOW, DECIDED_DENY, Approvals, GateOutcome
from db.gate import Gate
from db.ids import new_id
from db.ledger import NOTIFY_CHANNEL, Ledger
from db.policies import Policies
from db.runs import Runs
from db.tokens import RunTokens


class Store:
    def __init__(self, pool: asyncpg.Pool[Any], redactor: Redactor) -> None:
        self.pool = pool
        self.redactor = redactor
        self.ledger = Ledger(pool, redactor)
        self.tokens = RunTokens(pool)
        self.policies = Policies(pool)
        self.agents = Agents(pool)
        self.runs = Runs(pool, self.ledger, self.tokens)
        self.gates = Gate(pool, redactor, self.ledger, self.runs)
        self.approvals = Approvals(pool, self.ledger, self.runs)

        # db/connections.py (being reshaped separately) still appends through the old single-class name.
        self.append = self.ledger.append

    async def boot_tenant(self) -> str:
        async with self.pool.acquire() as conn:
            await conn.execute(
                "INSERT INTO tenants (id, name, slug) VALUES ($1, 'default', 'default') ON CONFLICT DO NOTHING",
                uuid.UUID(new_id()),
            )
            return str(await conn.fetchval("SELECT id FROM tenants WHERE slug = 'default'"))


__all__ = [
    "DECIDED_ALLOW",
    "DECIDED_DENY",
    "NOTIFY_CHANNEL",
    "Conn",
    "GateOutcome",
    "InvalidTransition",
    "Row",
    "Store",
]
