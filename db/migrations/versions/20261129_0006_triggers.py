"""trigger subscriptions, tokens, invocations and schedules (issue 6)

Revision ID: 0006
Revises: 0005
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# One subscription object for the three invocation shapes (api, schedule, event). Trigger tokens
# live in api_tokens (kind 'trigger', subscription_id set, no session, never expiring until revoked).
# trigger_invocations holds the idempotency claims AND the visible skip rows: a claim is bound to
# the run in the run's own transaction, or carries a skip reason, never both.
STATEMENTS = [
    """
    CREATE TABLE trigger_subscriptions (
        id uuid PRIMARY KEY,
        tenant_id uuid NOT NULL REFERENCES tenants(id),
        name text NOT NULL,
        agent_id uuid NOT NULL REFERENCES agents(id),
        kind text NOT NULL CHECK (kind IN ('api', 'schedule', 'event')),
        enabled boolean NOT NULL DEFAULT true,
        task_template text,
        allow_task_override boolean NOT NULL DEFAULT false,
        allow_workspace_override boolean NOT NULL DEFAULT false,
        autonomous boolean NOT NULL DEFAULT false,
        budgets jsonb,
        workspace jsonb,
        pinned_revision_id uuid REFERENCES agent_revisions(id),
        capabilities jsonb,
        concurrency_policy text NOT NULL DEFAULT 'allow'
            CHECK (concurrency_policy IN ('allow', 'skip_if_running', 'replace')),
        callback_url text,
        callback_secret_sealed bytea,
        callback_key_id text,
        token_generation integer NOT NULL DEFAULT 1,
        schedule_cron text,
        schedule_timezone text,
        missed_run_policy text CHECK (missed_run_policy IN ('skip', 'catch_up')),
        connection_id uuid REFERENCES integration_connections(id),
        event_filter jsonb,
        created_at timestamptz NOT NULL DEFAULT now(),
        updated_at timestamptz NOT NULL DEFAULT now(),
        UNIQUE (tenant_id, name),
        CHECK ((callback_url IS NULL) = (callback_secret_sealed IS NULL)),
        CHECK (kind <> 'schedule' OR schedule_cron IS NOT NULL),
        CHECK (kind <> 'event' OR (connection_id IS NOT NULL AND event_filter IS NOT NULL))
    )
    """,
    "ALTER TABLE api_tokens ADD COLUMN subscription_id uuid REFERENCES trigger_subscriptions(id)",
    """
    ALTER TABLE api_tokens ADD CONSTRAINT api_tokens_trigger_shape
        CHECK (kind <> 'trigger' OR (subscription_id IS NOT NULL AND session_id IS NULL))
    """,
    "CREATE INDEX api_tokens_subscription ON api_tokens (subscription_id) WHERE subscription_id IS NOT NULL",
    """
    CREATE TABLE trigger_invocations (
        id uuid PRIMARY KEY,
        tenant_id uuid NOT NULL REFERENCES tenants(id),
        subscription_id uuid NOT NULL REFERENCES trigger_subscriptions(id),
        idempotency_key text NOT NULL,
        kind text NOT NULL CHECK (kind IN ('api', 'schedule', 'event', 'manual')),
        request_digest text,
        session_id uuid REFERENCES sessions(id),
        skip_reason text,
        catch_up boolean NOT NULL DEFAULT false,
        created_at timestamptz NOT NULL DEFAULT now(),
        UNIQUE (subscription_id, idempotency_key),
        CHECK (session_id IS NULL OR skip_reason IS NULL)
    )
    """,
    "CREATE INDEX trigger_invocations_recent ON trigger_invocations (subscription_id, created_at DESC)",
    "CREATE INDEX trigger_invocations_session ON trigger_invocations (session_id) WHERE session_id IS NOT NULL",
]


def upgrade() -> None:
    for statement in STATEMENTS:
        op.execute(statement)


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS trigger_invocations")
    op.execute("ALTER TABLE api_tokens DROP CONSTRAINT IF EXISTS api_tokens_trigger_shape")
    op.execute("ALTER TABLE api_tokens DROP COLUMN IF EXISTS subscription_id")
    op.execute("DROP TABLE IF EXISTS trigger_subscriptions")
