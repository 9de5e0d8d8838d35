"""The system of record. Every SQL statement the control plane runs lives here.

Conventions: the ledger's ``seq`` is assigned under the session row lock in the inserting
transaction (gapless); every event payload passes the redactor; every decision is a compare-and-swap
so exactly one writer wins and emits events.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import asyncpg

from core import events as ev
from core.digests import input_digest
from core.errors import Conflict, InvalidTransition, NotFound
from core.gate import GateDecision, decide
from core.redaction import Redactor
from core.runspec import RunSpec
from core.states import RunStatus, accepts_work, check_transition, is_terminal
from core.tokens import RUN_AUDIENCES, session_token, token_digest
from db.ids import new_id

Conn = Any  # asyncpg.Connection or a pool proxy (asyncpg types are not generic at runtime)
Row = dict[str, Any]
NOTIFY_CHANNEL = "fluidbox_events"
# pg_advisory_xact_lock key serialising sandbox-capacity claims (any constant no other lock uses).
SANDBOX_CAPACITY_LOCK = 0x66627862_0001
WAITING_FOR_CAPACITY = "waiting for sandbox capacity"
# Runs that hold a sandbox or are about to (sessions_live_sandbox_idx covers these statuses).
_LIVE_SANDBOXES = (
    "SELECT count(*) FROM sessions WHERE status IN ('provisioning', 'initializing', 'running', 'awaiting_approval')"
    " OR (status IN ('cancelling', 'finalizing') AND sandbox_handle IS NOT NULL)"
)

DECIDED_ALLOW = frozenset({"auto_allowed", "approved_once", "approved_session"})
DECIDED_DENY = frozenset({"auto_denied", "denied", "expired"})


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


def _row(record: asyncpg.Record | None) -> Row | None:
    if record is None:
        return None
    return {k: (str(v) if isinstance(v, uuid.UUID) else v) for k, v in record.items()}


def _rows(records: Iterable[asyncpg.Record]) -> list[Row]:
    return [r for rec in records if (r := _row(rec)) is not None]


class GateOutcome:
    """What /permission answers: a verdict now, or the approval the runner must wait on."""

    def __init__(self, verdict: str, message: str | None = None, *, wait: Row | None = None) -> None:
        self.verdict = verdict  # allow | deny | wait
        self.message = message
        self.wait = wait  # the intent/pending approval row when verdict == "wait"


class Store:
    def __init__(self, pool: asyncpg.Pool[Any], redactor: Redactor) -> None:
        self.pool = pool
        self.redactor = redactor
        self._specs: dict[str, RunSpec] = {}

    # ---- tenancy -------------------------------------------------------------------------------

    async def boot_tenant(self) -> str:
        async with self.pool.acquire() as conn:
            await conn.execute(
                "INSERT INTO tenants (id, name, slug) VALUES ($1, 'default', 'default') ON CONFLICT DO NOTHING",
                uuid.UUID(new_id()),
            )
            return str(await conn.fetchval("SELECT id FROM tenants WHERE slug = 'default'"))

    # ---- policies ------------------------------------------------------------------------------

    async def seed_policy(self, tenant_id: str, content: dict[str, Any], yaml_source: str | None) -> None:
        """Create a seeded policy at v1 if it does not exist yet (operator edits are never overwritten)."""
        async with self.pool.acquire() as conn, conn.transaction():
            pid = uuid.UUID(new_id())
            inserted = await conn.fetchval(
                "INSERT INTO policies (id, tenant_id, name) VALUES ($1, $2, $3) "
                "ON CONFLICT (tenant_id, name) DO NOTHING RETURNING id",
                pid,
                uuid.UUID(tenant_id),
                content["name"],
            )
            if inserted is not None:
                await conn.execute(
                    "INSERT INTO policy_versions (id, policy_id, version, content, yaml_source, summary, author) "
                    "VALUES ($1, $2, 1, $3, $4, 'seeded', 'seed')",
                    uuid.UUID(new_id()),
                    pid,
                    content,
                    yaml_source,
                )

    async def policy_head(self, tenant_id: str, name: str) -> Row | None:
        async with self.pool.acquire() as conn:
            return _row(
                await conn.fetchrow(
                    "SELECT p.id AS policy_id, p.name, v.version, v.content FROM policies p "
                    "JOIN policy_versions v ON v.policy_id = p.id WHERE p.tenant_id = $1 AND p.name = $2 "
                    "ORDER BY v.version DESC LIMIT 1",
                    uuid.UUID(tenant_id),
                    name,
                )
            )

    async def policy_head_by_id(self, conn: Conn, policy_id: str) -> Row:
        row = _row(
            await conn.fetchrow(
                "SELECT p.id AS policy_id, p.name, v.version, v.content FROM policies p "
                "JOIN policy_versions v ON v.policy_id = p.id WHERE p.id = $1 ORDER BY v.version DESC LIMIT 1",
                uuid.UUID(policy_id),
            )
        )
        if row is None:
            raise NotFound("policy not found")
        return row

    async def policy_names(self, tenant_id: str) -> dict[str, str]:
        async with self.pool.acquire() as conn:
            rows = await conn.fetch("SELECT id, name FROM policies WHERE tenant_id = $1", uuid.UUID(tenant_id))
            return {str(r["id"]): r["name"] for r in rows}

    async def import_policy(self, tenant_id: str, content: dict[str, Any], yaml_source: str | None) -> tuple[Row, bool]:
        """Create the policy or append a version; byte-equal content appends nothing."""
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "INSERT INTO policies (id, tenant_id, name) VALUES ($1, $2, $3) "
                "ON CONFLICT (tenant_id, name) DO NOTHING",
                uuid.UUID(new_id()),
                uuid.UUID(tenant_id),
                content["name"],
            )
            policy = await conn.fetchrow(
                "SELECT * FROM policies WHERE tenant_id = $1 AND name = $2 FOR UPDATE",
                uuid.UUID(tenant_id),
                content["name"],
            )
            head = await conn.fetchrow(
                "SELECT version, content FROM policy_versions WHERE policy_id = $1 ORDER BY version DESC LIMIT 1",
                policy["id"],
            )
            if head is not None and head["content"] == content:
                row = {"id": str(policy["id"]), "name": policy["name"], "version": head["version"]}
                return {**row, "updated_at": policy["updated_at"]}, False
            version = (head["version"] if head else 0) + 1
            await conn.execute(
                "INSERT INTO policy_versions (id, policy_id, version, content, yaml_source, summary, author) "
                "VALUES ($1, $2, $3, $4, $5, 'imported', 'api')",
                uuid.UUID(new_id()),
                policy["id"],
                version,
                content,
                yaml_source,
            )
            updated = await conn.fetchval(
                "UPDATE policies SET updated_at = now() WHERE id = $1 RETURNING updated_at", policy["id"]
            )
            return {"id": str(policy["id"]), "name": policy["name"], "version": version, "updated_at": updated}, True

    async def list_policies(self, tenant_id: str) -> list[Row]:
        """Every policy with its head version and content, and how many agents use it now."""
        async with self.pool.acquire() as conn:
            return _rows(
                await conn.fetch(
                    "SELECT p.id, p.name, p.updated_at, h.version, h.content,"
                    " (SELECT count(*) FROM agents a WHERE a.tenant_id = p.tenant_id AND (SELECT r.policy_id"
                    "  FROM agent_revisions r WHERE r.agent_id = a.id ORDER BY r.rev DESC LIMIT 1) = p.id)"
                    " AS agents_using FROM policies p JOIN LATERAL (SELECT version, content FROM policy_versions v"
                    " WHERE v.policy_id = p.id ORDER BY version DESC LIMIT 1) h ON true"
                    " WHERE p.tenant_id = $1 ORDER BY p.name",
                    uuid.UUID(tenant_id),
                )
            )

    async def policy_detail(self, tenant_id: str, name: str) -> Row | None:
        """Head, version history (newest first) and the agents whose latest revision names it."""
        async with self.pool.acquire() as conn:
            policy = _row(
                await conn.fetchrow(
                    "SELECT * FROM policies WHERE tenant_id = $1 AND name = $2", uuid.UUID(tenant_id), name
                )
            )
            if policy is None:
                return None
            versions = _rows(
                await conn.fetch(
                    "SELECT version, author, summary, created_at, content FROM policy_versions"
                    " WHERE policy_id = $1 ORDER BY version DESC",
                    uuid.UUID(policy["id"]),
                )
            )
            agents = await conn.fetch(
                "SELECT a.name FROM agents a WHERE a.tenant_id = $1 AND (SELECT r.policy_id FROM agent_revisions r"
                " WHERE r.agent_id = a.id ORDER BY r.rev DESC LIMIT 1) = $2 ORDER BY a.name",
                uuid.UUID(tenant_id),
                uuid.UUID(policy["id"]),
            )
        return {**policy, "versions": versions, "agents_using": [r["name"] for r in agents]}

    async def policy_version(self, tenant_id: str, name: str, version: int) -> Row | None:
        async with self.pool.acquire() as conn:
            return _row(
                await conn.fetchrow(
                    "SELECT p.id AS policy_id, p.name, v.* FROM policies p JOIN policy_versions v"
                    " ON v.policy_id = p.id WHERE p.tenant_id = $1 AND p.name = $2 AND v.version = $3",
                    uuid.UUID(tenant_id),
                    name,
                    version,
                )
            )

    async def append_policy_version(
        self,
        tenant_id: str,
        name: str,
        content: dict[str, Any],
        *,
        base_version: int,
        summary: str,
        author: str,
        yaml_source: str | None = None,
    ) -> Row:
        """Optimistic publish: append head+1 only if the head is still ``base_version`` (409 otherwise)."""
        async with self.pool.acquire() as conn, conn.transaction():
            policy = await conn.fetchrow(
                "SELECT id, name FROM policies WHERE tenant_id = $1 AND name = $2 FOR UPDATE",
                uuid.UUID(tenant_id),
                name,
            )
            if policy is None:
                raise NotFound()
            head = await conn.fetchval("SELECT max(version) FROM policy_versions WHERE policy_id = $1", policy["id"])
            if head != base_version:
                raise Conflict(
                    f"the policy moved to v{head} since this draft loaded v{base_version} — reload, "
                    "re-apply your edit, and publish again"
                )
            await conn.execute(
                "INSERT INTO policy_versions (id, policy_id, version, content, yaml_source, summary, author) "
                "VALUES ($1, $2, $3, $4, $5, $6, $7)",
                uuid.UUID(new_id()),
                policy["id"],
                head + 1,
                content,
                yaml_source,
                summary,
                author,
            )
            updated = await conn.fetchval(
                "UPDATE policies SET updated_at = now() WHERE id = $1 RETURNING updated_at", policy["id"]
            )
            return {"id": str(policy["id"]), "name": policy["name"], "version": head + 1, "updated_at": updated}

    async def create_policy(self, tenant_id: str, content: dict[str, Any], summary: str, author: str) -> Row:
        """A new policy identity with its v1 (409 when the name exists)."""
        async with self.pool.acquire() as conn, conn.transaction():
            pid = await conn.fetchval(
                "INSERT INTO policies (id, tenant_id, name) VALUES ($1, $2, $3) "
                "ON CONFLICT (tenant_id, name) DO NOTHING RETURNING id",
                uuid.UUID(new_id()),
                uuid.UUID(tenant_id),
                content["name"],
            )
            if pid is None:
                raise Conflict(f"a policy named '{content['name']}' already exists")
            await conn.execute(
                "INSERT INTO policy_versions (id, policy_id, version, content, summary, author) "
                "VALUES ($1, $2, 1, $3, $4, $5)",
                uuid.UUID(new_id()),
                pid,
                content,
                summary,
                author,
            )
            return {"id": str(pid), "name": content["name"], "version": 1}

    async def delete_policy(self, tenant_id: str, name: str) -> Row:
        async with self.pool.acquire() as conn, conn.transaction():
            policy = await conn.fetchrow(
                "SELECT id, name FROM policies WHERE tenant_id = $1 AND name = $2 FOR UPDATE",
                uuid.UUID(tenant_id),
                name,
            )
            if policy is None:
                raise NotFound()
            users = await conn.fetchval("SELECT count(*) FROM agent_revisions WHERE policy_id = $1", policy["id"])
            if users:
                raise Conflict(
                    f"'{name}' is still named by {users} agent revision(s) — including historical revisions, "
                    "which stay immutable. Point those agents at another policy; historical revisions keep it alive."
                )
            await conn.execute("DELETE FROM policies WHERE id = $1", policy["id"])
            return {"id": str(policy["id"]), "name": policy["name"]}

    # ---- agents --------------------------------------------------------------------------------

    _REVISION_COLUMNS = (
        "harness",
        "runner_image",
        "model",
        "system_prompt",
        "policy_id",
        "budgets",
        "harness_config",
        "capability_bundles",
        "default_workspace",
        "connection_requirements",
        "network",
    )

    async def _insert_revision(self, conn: Conn, tenant_id: str, agent_id: str, fields: Row) -> Row:
        rev = await conn.fetchval(
            "SELECT coalesce(max(rev), 0) + 1 FROM agent_revisions WHERE agent_id = $1", uuid.UUID(agent_id)
        )
        cols = ", ".join(self._REVISION_COLUMNS)
        params = ", ".join(f"${i}" for i in range(5, 5 + len(self._REVISION_COLUMNS)))
        defaults: Row = {"harness_config": {}, "capability_bundles": [], "connection_requirements": []}
        values = [fields.get(c) if fields.get(c) is not None else defaults.get(c) for c in self._REVISION_COLUMNS]
        values[4] = uuid.UUID(values[4])  # policy_id
        record = await conn.fetchrow(
            f"INSERT INTO agent_revisions (id, tenant_id, agent_id, rev, {cols}) "
            f"VALUES ($1, $2, $3, $4, {params}) RETURNING *",
            uuid.UUID(new_id()),
            uuid.UUID(tenant_id),
            uuid.UUID(agent_id),
            rev,
            *values,
        )
        return _row(record) or {}

    async def create_agent(self, tenant_id: str, name: str, description: str | None, fields: Row) -> tuple[Row, Row]:
        async with self.pool.acquire() as conn, conn.transaction():
            agent = _row(
                await conn.fetchrow(
                    "INSERT INTO agents (id, tenant_id, name, description) VALUES ($1, $2, $3, $4) "
                    "ON CONFLICT (tenant_id, name) DO NOTHING RETURNING *",
                    uuid.UUID(new_id()),
                    uuid.UUID(tenant_id),
                    name,
                    description,
                )
            )
            if agent is None:
                raise Conflict(f"an agent named '{name}' already exists")
            revision = await self._insert_revision(conn, tenant_id, agent["id"], fields)
            return agent, revision

    async def list_agents(self, tenant_id: str) -> list[Row]:
        async with self.pool.acquire() as conn:
            return _rows(
                await conn.fetch("SELECT * FROM agents WHERE tenant_id = $1 ORDER BY name", uuid.UUID(tenant_id))
            )

    async def find_agent(self, tenant_id: str, ref: str) -> Row | None:
        async with self.pool.acquire() as conn:
            return await self._find_agent(conn, tenant_id, ref)

    async def _find_agent(self, conn: Conn, tenant_id: str, ref: str) -> Row | None:
        try:
            agent_id: uuid.UUID | None = uuid.UUID(ref)
        except ValueError:
            agent_id = None
        if agent_id is not None:
            found = await conn.fetchrow(
                "SELECT * FROM agents WHERE tenant_id = $1 AND id = $2", uuid.UUID(tenant_id), agent_id
            )
            if found is not None:
                return _row(found)
        return _row(
            await conn.fetchrow("SELECT * FROM agents WHERE tenant_id = $1 AND name = $2", uuid.UUID(tenant_id), ref)
        )

    async def revisions(self, agent_id: str) -> list[Row]:
        async with self.pool.acquire() as conn:
            return _rows(
                await conn.fetch("SELECT * FROM agent_revisions WHERE agent_id = $1 ORDER BY rev", uuid.UUID(agent_id))
            )

    async def latest_revision(self, conn: Conn, agent_id: str) -> Row | None:
        return _row(
            await conn.fetchrow(
                "SELECT * FROM agent_revisions WHERE agent_id = $1 ORDER BY rev DESC LIMIT 1", uuid.UUID(agent_id)
            )
        )

    async def append_revision(self, tenant_id: str, agent_id: str, changes: Row) -> Row:
        """Omitted fields inherit from the latest revision; the revision itself is never edited."""
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT id FROM agents WHERE id = $1 FOR UPDATE", uuid.UUID(agent_id))
            latest = await self.latest_revision(conn, agent_id)
            base = {c: latest[c] for c in self._REVISION_COLUMNS} if latest else {}
            base.update(changes)
            return await self._insert_revision(conn, tenant_id, agent_id, base)

    # ---- runs ----------------------------------------------------------------------------------

    async def create_run(
        self, spec: RunSpec, invoked_by_kind: str, also: Callable[[Conn], Awaitable[None]] | None = None
    ) -> Row:
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
            await self.append(conn, spec.run_id, new)
            if also is not None:
                await also(conn)
        row = _row(record) or {}
        row["event_seq"] = 2 if spec.capabilities else 1
        return row

    async def get_run(self, tenant_id: str | None, run_id: str) -> Row | None:
        try:
            rid = uuid.UUID(run_id)
        except ValueError:
            return None
        async with self.pool.acquire() as conn:
            if tenant_id is None:
                return _row(await conn.fetchrow("SELECT * FROM sessions WHERE id = $1", rid))
            return _row(
                await conn.fetchrow(
                    "SELECT * FROM sessions WHERE id = $1 AND tenant_id = $2", rid, uuid.UUID(tenant_id)
                )
            )

    async def list_runs(self, tenant_id: str, limit: int) -> list[Row]:
        async with self.pool.acquire() as conn:
            return _rows(
                await conn.fetch(
                    "SELECT * FROM sessions WHERE tenant_id = $1 ORDER BY created_at DESC, id DESC LIMIT $2",
                    uuid.UUID(tenant_id),
                    limit,
                )
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
            self._specs[run_id] = spec  # frozen forever, so caching cannot go stale
        return spec

    async def usage_totals(self, run_id: str) -> Row:
        async with self.pool.acquire() as conn:
            row = await conn.fetchrow(
                "SELECT coalesce(sum(input_tokens),0) AS input_tokens, coalesce(sum(output_tokens),0) AS output_tokens,"
                " coalesce(sum(cache_read_tokens),0) AS cache_read_tokens,"
                " coalesce(sum(cache_write_tokens),0) AS cache_write_tokens, sum(cost_usd) AS cost_usd,"
                " count(*) AS requests FROM usage_entries WHERE session_id = $1",
                uuid.UUID(run_id),
            )
        out = dict(row) if row else {}
        out["cost_usd"] = float(out["cost_usd"]) if out.get("cost_usd") is not None else 0.0
        return {k: (int(v) if k != "cost_usd" else v) for k, v in out.items()}

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
                await self.append(conn, run_id, extra)
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
        await self.append(conn, run_id, [ev.status_changed(current, to.value, reason), *(extra or [])])
        return current, to.value

    async def set_fields(self, run_id: str, **fields: Any) -> None:
        cols = list(fields)
        sets = ", ".join(f"{c} = ${i + 2}" for i, c in enumerate(cols))
        async with self.pool.acquire() as conn:
            await conn.execute(
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

    # ---- the ledger ----------------------------------------------------------------------------

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

    async def append_events(self, run_id: str, new: list[ev.NewEvent]) -> int:
        async with self.pool.acquire() as conn, conn.transaction():
            return await self.append(conn, run_id, new)

    async def events_after(self, run_id: str, after: int, limit: int) -> list[Row]:
        async with self.pool.acquire() as conn:
            return _rows(
                await conn.fetch(
                    "SELECT event_id, session_id, seq, actor, type, payload, occurred_at FROM events "
                    "WHERE session_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
                    uuid.UUID(run_id),
                    after,
                    limit,
                )
            )

    # ---- tokens --------------------------------------------------------------------------------

    async def mint_tokens(self, tenant_id: str, run_id: str, ttl_secs: int, randoms: dict[str, str]) -> dict[str, str]:
        """Mint the run's four audience tokens; a retried provision revokes the earlier set first."""
        tokens = {aud.value: session_token(randoms[aud.value]) for aud in RUN_AUDIENCES}
        async with self.pool.acquire() as conn, conn.transaction():
            await self.revoke_tokens(conn, run_id)
            for audience, token in tokens.items():
                await self._insert_token(conn, tenant_id, run_id, audience, token, ttl_secs)
        return tokens

    async def issue_token(self, tenant_id: str, run_id: str, audience: str, ttl_secs: int, random_hex: str) -> str:
        """One more run-scoped token (operator tooling and tests); the runner's own stay valid."""
        token = session_token(random_hex)
        async with self.pool.acquire() as conn:
            await self._insert_token(conn, tenant_id, run_id, audience, token, ttl_secs)
        return token

    async def _insert_token(self, conn: Conn, tenant_id: str, run_id: str, audience: str, token: str, ttl: int) -> None:
        await conn.execute(
            "INSERT INTO api_tokens (id, token_sha256, tenant_id, kind, session_id, audience, expires_at) "
            "VALUES ($1, $2, $3, 'session', $4, $5, now() + make_interval(secs => $6))",
            uuid.UUID(new_id()),
            token_digest(token),
            uuid.UUID(tenant_id),
            uuid.UUID(run_id),
            audience,
            float(ttl),
        )

    async def resolve_token(self, token: str) -> Row | None:
        async with self.pool.acquire() as conn:
            return _row(
                await conn.fetchrow(
                    "SELECT t.session_id, t.tenant_id, t.audience, t.revoked_at IS NOT NULL AS revoked,"
                    " t.expires_at < now() AS expired, s.status FROM api_tokens t "
                    "JOIN sessions s ON s.id = t.session_id WHERE t.token_sha256 = $1",
                    token_digest(token),
                )
            )

    async def revoke_tokens(self, conn: Conn, run_id: str) -> None:
        await conn.execute(
            "UPDATE api_tokens SET revoked_at = now() WHERE session_id = $1 AND revoked_at IS NULL", uuid.UUID(run_id)
        )

    async def renew_tokens(self, run_id: str, ttl_secs: int) -> None:
        async with self.pool.acquire() as conn:
            await conn.execute(
                "UPDATE api_tokens SET expires_at = now() + make_interval(secs => $2) "
                "WHERE session_id = $1 AND revoked_at IS NULL",
                uuid.UUID(run_id),
                float(ttl_secs),
            )

    # ---- the gate ------------------------------------------------------------------------------

    async def gate(self, run_id: str, tool_call_id: str, tool: str, tool_input: dict[str, Any]) -> GateOutcome:
        spec = await self.run_spec(run_id)
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
            existing = _row(
                await conn.fetchrow(
                    "SELECT * FROM approvals WHERE session_id = $1 AND tool_call_id = $2",
                    rid,
                    tool_call_id,
                )
            )
            winding_down = await conn.fetchval(
                "SELECT EXISTS (SELECT 1 FROM session_finalizations WHERE session_id = $1)", rid
            )
            if existing is not None:
                return await self._replay(conn, run_id, existing, tool, digest)
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
            row = _row(
                await conn.fetchrow(
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
            )
            new = [
                ev.NewEvent(
                    type=ev.TOOL_REQUESTED,
                    data={"tool_call_id": tool_call_id, "tool": tool, "summary": summary, "input_digest": digest},
                )
            ]
            if decision.verdict != "require_approval":
                new.append(ev.NewEvent(type=ev.TOOL_DECISION, data=decision.decision_data(tool_call_id, tool)))
            if decision.budget_exceeded:
                cap = spec.budgets.max_tool_calls
                new.append(
                    ev.NewEvent(
                        type=ev.BUDGET_EXCEEDED,
                        data={"budget": "max_tool_calls", "limit": str(cap), "spent": str(count)},
                    )
                )
                await self._request_finalization(
                    conn, run_id, "budget_exceeded", None, "max_tool_calls budget exceeded", True
                )
            await self.append(conn, run_id, new, gate_calls=1)
        if decision.verdict == "require_approval":
            return GateOutcome("wait", wait=row)
        return GateOutcome(decision.verdict, decision.reason if decision.verdict == "deny" else None)

    async def _replay(self, conn: Conn, run_id: str, row: Row, tool: str, digest: str) -> GateOutcome:
        if row["tool"] != tool or row["input_digest"] != digest:
            message = "tool_call_id reused with a different tool or input"
            data = {
                "tool_call_id": row["tool_call_id"],
                "tool": tool,
                "verdict": "deny",
                "source": "protocol_violation",
                "reason": message,
            }
            await self.append(conn, run_id, [ev.NewEvent(type=ev.TOOL_DECISION, data=data)])
            return GateOutcome("deny", message)
        if row["status"] in DECIDED_ALLOW:
            return GateOutcome("allow")
        if row["status"] in DECIDED_DENY:
            return GateOutcome("deny", row["decision_reason"] or "denied")
        return GateOutcome("wait", wait=row)

    # ---- approvals -----------------------------------------------------------------------------

    async def open_approval(self, run_id: str, tool_call_id: str) -> Row:
        """intent → pending (idempotent), ``approval.requested``, and running → awaiting_approval."""
        rid = uuid.UUID(run_id)
        async with self.pool.acquire() as conn, conn.transaction():
            status = await conn.fetchval("SELECT status FROM sessions WHERE id = $1 FOR UPDATE", rid)
            row = _row(
                await conn.fetchrow(
                    "UPDATE approvals SET status = 'pending', requested_at = now(),"
                    " expires_at = now() + (expires_at - requested_at)"
                    " WHERE session_id = $1 AND tool_call_id = $2 AND status = 'intent' RETURNING *",
                    rid,
                    tool_call_id,
                )
            )
            if row is None:
                existing = _row(
                    await conn.fetchrow(
                        "SELECT * FROM approvals WHERE session_id = $1 AND tool_call_id = $2", rid, tool_call_id
                    )
                )
                if existing is None:
                    raise NotFound("no such tool call")
                return existing
            if not accepts_work(status):
                # The run stopped accepting work while this call was registered: deny it once.
                return await self._settle(conn, row, "denied", "system", "session_terminal", "session is not active")
            await self.append(
                conn,
                run_id,
                [
                    ev.NewEvent(
                        type=ev.APPROVAL_REQUESTED,
                        data={
                            "approval_id": row["id"],
                            "tool_call_id": tool_call_id,
                            "tool": row["tool"],
                            "summary": row["summary"],
                            "risk": row["risk"],
                            "expires_at": row["expires_at"].isoformat(),
                        },
                    )
                ],
            )
            if status == RunStatus.RUNNING:
                await self.transition(run_id, RunStatus.AWAITING_APPROVAL, conn=conn)
            return row

    async def _settle(self, conn: Conn, row: Row, decision: str, decided_by: str, source: str, reason: str) -> Row:
        settled = _row(
            await conn.fetchrow(
                "UPDATE approvals SET status = $2, decided_at = now(), decided_by = $3, decision_source = $4,"
                " decision_reason = $5 WHERE id = $1 AND status IN ('pending', 'intent') RETURNING *",
                uuid.UUID(row["id"]),
                decision,
                decided_by,
                source,
                reason,
            )
        )
        if settled is None:
            raise Conflict("approval is not pending")
        verdict = "allow" if decision in DECIDED_ALLOW else "deny"
        new = []
        if row["status"] == "pending":
            new.append(
                ev.NewEvent(
                    type=ev.APPROVAL_DECIDED,
                    actor="human" if source == "human" else "system",
                    data={
                        "approval_id": row["id"],
                        "tool_call_id": row["tool_call_id"],
                        "decision": decision,
                        "decided_by": decided_by,
                    },
                )
            )
        new.append(
            ev.NewEvent(
                type=ev.TOOL_DECISION,
                data={
                    "tool_call_id": row["tool_call_id"],
                    "tool": row["tool"],
                    "verdict": verdict,
                    "source": source,
                    "reason": reason,
                },
            )
        )
        await self.append(conn, row["session_id"], new)
        return settled

    async def decide_approval(
        self,
        tenant_id: str,
        approval_id: str,
        decision: str,
        decided_by: str,
        authorize: Callable[[Row], None] | None = None,
    ) -> Row:
        """The human decision: a CAS pending → decision; only the winner writes events.
        ``authorize`` sees the row with its authority facts (``APPROVAL_AUTHORITY_COLUMNS``) and raises
        to refuse before anything is written."""
        try:
            aid = uuid.UUID(approval_id)
        except ValueError:
            raise NotFound() from None
        async with self.pool.acquire() as conn, conn.transaction():
            row = _row(
                await conn.fetchrow(
                    f"{_APPROVALS_WITH_AUTHORITY} WHERE a.id = $1 AND a.tenant_id = $2", aid, uuid.UUID(tenant_id)
                )
            )
            if row is None:
                raise NotFound()
            if authorize is not None:
                authorize(row)
            if row["status"] != "pending":
                session_status = await conn.fetchval(
                    "SELECT status FROM sessions WHERE id = $1", uuid.UUID(row["session_id"])
                )
                raise Conflict(
                    "approval is not pending", approval_status=str(row["status"]), session_status=str(session_status)
                )
            # Lock order (session, then approval) matches the gate's, so concurrent deciders queue here.
            status = await conn.fetchval(
                "SELECT status FROM sessions WHERE id = $1 FOR UPDATE", uuid.UUID(row["session_id"])
            )
            if not accepts_work(status):
                # The runner has already been told no; a late approval must not record an allow.
                raise Conflict(
                    "approval is not pending", approval_status=str(row["status"]), session_status=str(status)
                )
            return await self._settle(conn, row, decision, decided_by, "human", f"human:{decided_by}")

    async def expire_approval(self, approval_id: str) -> Row:
        async with self.pool.acquire() as conn, conn.transaction():
            row = _row(await conn.fetchrow("SELECT * FROM approvals WHERE id = $1", uuid.UUID(approval_id)))
            if row is None:
                raise NotFound()
            await conn.execute("SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE", uuid.UUID(row["session_id"]))
            try:
                return await self._settle(conn, row, "expired", "timeout", "human", "human:timeout")
            except Conflict:
                return _row(await conn.fetchrow("SELECT * FROM approvals WHERE id = $1", uuid.UUID(approval_id))) or row

    async def deny_open_approvals(self, run_id: str, reason: str) -> None:
        """Settle every undecided call of a run that stopped accepting work (single emission via CAS)."""
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE", uuid.UUID(run_id))
            rows = _rows(
                await conn.fetch(
                    "SELECT * FROM approvals WHERE session_id = $1 AND status IN ('pending', 'intent')",
                    uuid.UUID(run_id),
                )
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
            await self.append(conn, run_id, new)

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
                await self.transition(run_id, RunStatus.RUNNING, conn=conn)

    async def list_approvals(self, tenant_id: str, *, run_id: str | None = None) -> list[Row]:
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
            return _rows(records)

    # ---- finalization --------------------------------------------------------------------------

    async def _request_finalization(
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
            created = await self._request_finalization(conn, run_id, outcome, summary, reason, quiesce)
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
                await self.append(conn, run_id, [ev.system_message(reason)])
            return False, live

    async def finalization(self, run_id: str) -> Row | None:
        async with self.pool.acquire() as conn:
            return _row(
                await conn.fetchrow("SELECT * FROM session_finalizations WHERE session_id = $1", uuid.UUID(run_id))
            )

    async def live_runs(self) -> list[Row]:
        """Every run the liveness sweep watches: a running or waiting runner, or an intent not acted on yet."""
        async with self.pool.acquire() as conn:
            return _rows(
                await conn.fetch(
                    "SELECT s.id::text AS id, s.status, s.sandbox_handle, extract(epoch FROM now() -"
                    " coalesce(s.last_heartbeat_at, s.started_at, s.updated_at)) AS silent_secs,"
                    " f.outcome IS NOT NULL AS has_intent FROM sessions s"
                    " LEFT JOIN session_finalizations f ON f.session_id = s.id"
                    " WHERE s.status IN ('running', 'awaiting_approval')"
                    " OR (f.outcome IS NOT NULL AND s.status IN ('created', 'provisioning', 'initializing'))"
                )
            )

    async def liveness(self, run_id: str) -> Row:
        async with self.pool.acquire() as conn:
            row = await conn.fetchrow(
                "SELECT s.status, extract(epoch FROM now() - coalesce(s.last_heartbeat_at, s.started_at,"
                " s.updated_at)) AS silent_secs, f.outcome IS NOT NULL AS has_intent FROM sessions s "
                "LEFT JOIN session_finalizations f ON f.session_id = s.id WHERE s.id = $1",
                uuid.UUID(run_id),
            )
        if row is None:
            raise NotFound()
        return {"status": row["status"], "silent_secs": float(row["silent_secs"] or 0), "has_intent": row["has_intent"]}

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
            await self.append(conn, run_id, artifact_events)
            moved = await self.transition(run_id, terminal, reason, [result], conn=conn)
            await self.revoke_tokens(conn, run_id)
            await conn.execute("DELETE FROM session_finalizations WHERE session_id = $1", rid)
            return moved

    async def artifacts(self, run_id: str) -> list[Row]:
        async with self.pool.acquire() as conn:
            return _rows(
                await conn.fetch(
                    "SELECT * FROM artifacts WHERE session_id = $1 ORDER BY created_at, kind", uuid.UUID(run_id)
                )
            )

    async def has_gate_calls(self, run_id: str) -> bool:
        async with self.pool.acquire() as conn:
            return bool(await conn.fetchval("SELECT gate_calls > 0 FROM sessions WHERE id = $1", uuid.UUID(run_id)))


__all__ = ["DECIDED_ALLOW", "DECIDED_DENY", "GateOutcome", "InvalidTransition", "Store"]
