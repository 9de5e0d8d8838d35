"""The composition of the repositories under ``db/``, one per aggregate, over one pool.

``Store`` builds them and, for the call sites written against the single class it used to be, exposes
their methods under the old names (``store.gate`` is ``store.gates.decide_call``). New code should use
the repositories (``store.approvals``, ``store.runs`` …).

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

        # The single class's names, delegated.
        self.seed_policy = self.policies.seed_policy
        self.policy_head = self.policies.policy_head
        self.policy_head_by_id = self.policies.policy_head_by_id
        self.policy_names = self.policies.policy_names
        self.import_policy = self.policies.import_policy
        self.list_policies = self.policies.list_policies
        self.policy_detail = self.policies.policy_detail
        self.policy_version = self.policies.policy_version
        self.append_policy_version = self.policies.append_policy_version
        self.create_policy = self.policies.create_policy
        self.delete_policy = self.policies.delete_policy

        self.create_agent = self.agents.create_agent
        self.list_agents = self.agents.list_agents
        self.find_agent = self.agents.find_agent
        self.revisions = self.agents.revisions
        self.latest_revision = self.agents.latest_revision
        self.append_revision = self.agents.append_revision

        self.create_run = self.runs.create_run
        self.get_run = self.runs.get_run
        self.list_runs = self.runs.list_runs
        self.run_spec = self.runs.run_spec
        self.usage_totals = self.runs.usage_totals
        self.transition = self.runs.transition
        self.set_fields = self.runs.set_fields
        self.heartbeat = self.runs.heartbeat
        self.request_finalization = self.runs.request_finalization
        self.claim_sandbox = self.runs.claim_sandbox
        self.finalization = self.runs.finalization
        self.live_runs = self.runs.live_runs
        self.liveness = self.runs.liveness
        self.finish = self.runs.finish
        self.artifacts = self.runs.artifacts
        self.has_gate_calls = self.runs.has_gate_calls

        self.append = self.ledger.append
        self.append_events = self.ledger.append_events
        self.events_after = self.ledger.events_after

        self.mint_tokens = self.tokens.mint_tokens
        self.issue_token = self.tokens.issue_token
        self.resolve_token = self.tokens.resolve_token
        self.revoke_tokens = self.tokens.revoke_tokens
        self.renew_tokens = self.tokens.renew_tokens

        self.gate = self.gates.decide_call

        self.open_approval = self.approvals.open_approval
        self.decide_approval = self.approvals.decide_approval
        self.expire_approval = self.approvals.expire_approval
        self.deny_open_approvals = self.approvals.deny_open_approvals
        self.settle_inflight_claims = self.approvals.settle_inflight_claims
        self.settled_verdict = self.approvals.settled_verdict
        self.resume_after_approval = self.approvals.resume_after_approval
        self.list_approvals = self.approvals.list_approvals

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
