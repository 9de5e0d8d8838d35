"""Parked runs: runs waiting for a connection, the pending action they show, environment credentials

Revision ID: 0015
Revises: 0014

``run_parks`` is the durable record of one wait: a run parked before provisioning (``tool_call_id`` '') or one
brokered tool call parked mid-run, on a connection (``connection_id``) or, when no connection exists yet, on the
requirement's URL (``url_key``, normalised) and owner. Whatever makes a connection usable finds the runs to wake
here, never in memory. ``sessions.pending_action`` is what the API shows while the run waits.

``integration_connections.credential_env`` names the environment variable a connection takes its static
credential from (``<PROVIDER>_MCP_TOKEN``); ``connector_oauth_flows.challenge_url`` keeps a pending flow's sign-in
link so asking to authorize again reuses it instead of minting another flow. ``trigger_subscriptions.when_unavailable``
is what a subscription's runs do when a requirement cannot be bound: ``fail`` (as before) or ``park``.
"""

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

STATEMENTS = [
    "ALTER TABLE sessions ADD COLUMN pending_action jsonb",
    "ALTER TABLE integration_connections ADD COLUMN credential_env text",
    "ALTER TABLE connector_oauth_flows ADD COLUMN challenge_url text",
    "ALTER TABLE trigger_subscriptions ADD COLUMN when_unavailable text NOT NULL DEFAULT 'fail' "
    "CONSTRAINT trigger_subscriptions_when_unavailable_check CHECK (when_unavailable IN ('park', 'fail'))",
    """
    CREATE TABLE run_parks (
        id uuid PRIMARY KEY,
        tenant_id uuid NOT NULL REFERENCES tenants(id),
        session_id uuid NOT NULL REFERENCES sessions(id),
        tool_call_id text NOT NULL DEFAULT '',
        slot text NOT NULL,
        connection_id uuid REFERENCES integration_connections(id),
        url_key text NOT NULL,
        owner_user_id uuid,
        reason text NOT NULL,
        state text NOT NULL DEFAULT 'waiting'
            CONSTRAINT run_parks_state_check CHECK (state IN ('waiting', 'resumed', 'expired', 'ended')),
        expires_at timestamptz NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now(),
        resolved_at timestamptz,
        UNIQUE (session_id, tool_call_id, slot)
    )
    """,
    "CREATE INDEX run_parks_waiting_idx ON run_parks (tenant_id, url_key) WHERE state = 'waiting'",
]


def upgrade() -> None:
    for statement in STATEMENTS:
        op.execute(statement)


def downgrade() -> None:
    op.execute("DROP TABLE run_parks")
    op.execute("ALTER TABLE trigger_subscriptions DROP COLUMN when_unavailable")
    op.execute("ALTER TABLE connector_oauth_flows DROP COLUMN challenge_url")
    op.execute("ALTER TABLE integration_connections DROP COLUMN credential_env")
    op.execute("ALTER TABLE sessions DROP COLUMN pending_action")
