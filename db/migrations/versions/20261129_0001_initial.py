"""initial schema: tenants, agents, policies, runs, ledger, approvals, tokens

Revision ID: 0001
Revises:
"""

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

SCHEMA = """
CREATE TABLE tenants (
    id uuid PRIMARY KEY,
    name text NOT NULL UNIQUE,
    slug text NOT NULL UNIQUE,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE policies (
    id uuid PRIMARY KEY,
    tenant_id uuid NOT NULL REFERENCES tenants(id),
    name text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, name)
);

CREATE TABLE policy_versions (
    id uuid PRIMARY KEY,
    policy_id uuid NOT NULL REFERENCES policies(id) ON DELETE CASCADE,
    version integer NOT NULL CHECK (version > 0),
    content jsonb NOT NULL,
    yaml_source text,
    summary text,
    author text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (policy_id, version)
);

CREATE TABLE agents (
    id uuid PRIMARY KEY,
    tenant_id uuid NOT NULL REFERENCES tenants(id),
    name text NOT NULL,
    description text,
    created_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, name)
);

CREATE TABLE agent_revisions (
    id uuid PRIMARY KEY,
    tenant_id uuid NOT NULL REFERENCES tenants(id),
    agent_id uuid NOT NULL REFERENCES agents(id),
    rev integer NOT NULL CHECK (rev > 0),
    harness text NOT NULL,
    runner_image text,
    model text NOT NULL,
    system_prompt text,
    policy_id uuid NOT NULL REFERENCES policies(id),
    budgets jsonb,
    harness_config jsonb NOT NULL DEFAULT '{}'::jsonb,
    capability_bundles jsonb NOT NULL DEFAULT '[]'::jsonb,
    default_workspace jsonb,
    connection_requirements jsonb NOT NULL DEFAULT '[]'::jsonb,
    network jsonb,
    created_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (agent_id, rev)
);

CREATE TABLE sessions (
    id uuid PRIMARY KEY,
    tenant_id uuid NOT NULL REFERENCES tenants(id),
    agent_id uuid NOT NULL REFERENCES agents(id),
    agent_revision_id uuid NOT NULL REFERENCES agent_revisions(id),
    status text NOT NULL,
    status_reason text,
    autonomy text NOT NULL,
    trust_tier text NOT NULL DEFAULT 'trusted',
    task text NOT NULL,
    repo_source jsonb,
    run_spec jsonb NOT NULL,
    trigger jsonb,
    sandbox_handle jsonb,
    budgets jsonb,
    base_commit text,
    result_summary text,
    event_seq bigint NOT NULL DEFAULT 0,
    last_heartbeat_at timestamptz,
    gate_calls integer NOT NULL DEFAULT 0,
    started_at timestamptz,
    finished_at timestamptz,
    invoked_by_kind text NOT NULL DEFAULT 'operator',
    invoked_by_user_id uuid,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX sessions_tenant_created ON sessions (tenant_id, created_at DESC);

CREATE TABLE events (
    event_id uuid PRIMARY KEY,
    session_id uuid NOT NULL REFERENCES sessions(id),
    seq bigint NOT NULL,
    schema_version integer NOT NULL DEFAULT 1,
    actor text NOT NULL,
    type text NOT NULL,
    payload jsonb NOT NULL,
    occurred_at timestamptz NOT NULL DEFAULT now(),
    recorded_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (session_id, seq)
);

-- The ledger is append-only.
CREATE FUNCTION events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the events ledger is append-only';
END $$;
CREATE TRIGGER events_no_update BEFORE UPDATE OR DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION events_append_only();

CREATE TABLE approvals (
    id uuid PRIMARY KEY,
    tenant_id uuid NOT NULL REFERENCES tenants(id),
    session_id uuid NOT NULL REFERENCES sessions(id),
    tool_call_id text NOT NULL,
    tool text NOT NULL,
    summary text,
    input_digest text NOT NULL,
    risk text,
    scope text,
    scope_key text,
    status text NOT NULL,
    decision_source text,
    decision_reason text,
    requested_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz,
    decided_at timestamptz,
    decided_by text,
    UNIQUE (session_id, tool_call_id)
);
CREATE INDEX approvals_pending ON approvals (tenant_id, requested_at) WHERE status = 'pending';

CREATE TABLE artifacts (
    id uuid PRIMARY KEY,
    session_id uuid NOT NULL REFERENCES sessions(id),
    kind text NOT NULL,
    name text NOT NULL,
    content text NOT NULL,
    content_type text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (session_id, kind, name)
);

CREATE TABLE api_tokens (
    id uuid PRIMARY KEY,
    token_sha256 text NOT NULL UNIQUE,
    tenant_id uuid NOT NULL REFERENCES tenants(id),
    kind text NOT NULL,
    session_id uuid REFERENCES sessions(id),
    audience text NOT NULL,
    expires_at timestamptz NOT NULL,
    revoked_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX api_tokens_session ON api_tokens (session_id, audience);

CREATE TABLE session_finalizations (
    session_id uuid PRIMARY KEY REFERENCES sessions(id),
    outcome text NOT NULL,
    summary text,
    reason text,
    needs_quiesce boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE usage_entries (
    id uuid PRIMARY KEY,
    session_id uuid NOT NULL REFERENCES sessions(id),
    model text NOT NULL,
    input_tokens bigint NOT NULL DEFAULT 0,
    output_tokens bigint NOT NULL DEFAULT 0,
    cache_read_tokens bigint NOT NULL DEFAULT 0,
    cache_write_tokens bigint NOT NULL DEFAULT 0,
    cost_usd numeric,
    source text NOT NULL,
    external_id text UNIQUE,
    created_at timestamptz NOT NULL DEFAULT now()
);
"""


def _statements(sql: str) -> list[str]:
    # One statement per execute (the asyncpg driver prepares each); ';' inside $$ bodies is kept.
    out, buf, in_body = [], [], False
    for line in sql.splitlines():
        if line.lstrip().startswith("--"):
            continue
        buf.append(line)
        in_body ^= line.count("$$") % 2 == 1
        if not in_body and line.rstrip().endswith(";"):
            out.append("\n".join(buf).strip())
            buf = []
    return [s for s in out if s]


def upgrade() -> None:
    for statement in _statements(SCHEMA):
        op.execute(statement)


def downgrade() -> None:
    for table in (
        "usage_entries", "session_finalizations", "api_tokens", "artifacts", "approvals", "events",
        "sessions", "agent_revisions", "agents", "policy_versions", "policies", "tenants",
    ):
        op.execute(f"DROP TABLE IF EXISTS {table} CASCADE")
    op.execute("DROP FUNCTION IF EXISTS events_append_only()")
