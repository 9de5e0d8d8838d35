"""Managed app connections: an account's connection per catalog app, the flows that sign it in, completion proofs

Revision ID: 0013
Revises: 0012

``managed_app_connections`` ties one account (a user of a tenant) and one managed app (a catalog slug) to the
personal OAuth connection that serves it; the unique (tenant, user, app) makes concurrent connect calls share one
connection, and reconnecting keeps the row (and so the connection's id, its bindings and its policy rules).

``managed_app_flows`` extends a ``connector_oauth_flows`` row started for a managed app: who started it, where the
browser goes afterwards (``redirect_url``), the grant the callback obtained but has not made usable yet (sealed, as
the connection's own columns are) and the completion proof handed to that ``redirect_url``, stored only as its
SHA-256 digest, single use (``proof_used_at``), bound to ``user_id`` and expiring at ``proof_expires_at``.

``connector_oauth_flows.purpose`` keeps the two callbacks apart: the connector callback claims only ``connection``
flows (with the browser cookie), the managed-app callback only ``managed_app`` flows.
"""

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

STATEMENTS = [
    "ALTER TABLE connector_oauth_flows ADD COLUMN purpose text NOT NULL DEFAULT 'connection' "
    "CONSTRAINT connector_oauth_flows_purpose_check CHECK (purpose IN ('connection', 'managed_app'))",
    """
    CREATE TABLE managed_app_connections (
        id uuid PRIMARY KEY,
        tenant_id uuid NOT NULL REFERENCES tenants(id),
        user_id uuid NOT NULL REFERENCES users(id),
        app_id text NOT NULL,
        connection_id uuid NOT NULL REFERENCES integration_connections(id),
        created_at timestamptz NOT NULL DEFAULT now(),
        updated_at timestamptz NOT NULL DEFAULT now(),
        UNIQUE (tenant_id, user_id, app_id)
    )
    """,
    """
    CREATE TABLE managed_app_flows (
        flow_id uuid PRIMARY KEY REFERENCES connector_oauth_flows(id),
        tenant_id uuid NOT NULL REFERENCES tenants(id),
        managed_id uuid NOT NULL REFERENCES managed_app_connections(id),
        user_id uuid NOT NULL REFERENCES users(id),
        redirect_url text,
        signed_in_at timestamptz,
        credential_sealed bytea,
        credential_key_id text,
        access_token_sealed bytea,
        access_token_key_id text,
        access_expires_at timestamptz,
        oauth jsonb,
        proof_hash text UNIQUE,
        proof_expires_at timestamptz,
        proof_used_at timestamptz,
        finished_at timestamptz,
        created_at timestamptz NOT NULL DEFAULT now()
    )
    """,
    "CREATE INDEX managed_app_flows_managed ON managed_app_flows (managed_id, created_at)",
]


def upgrade() -> None:
    for statement in STATEMENTS:
        op.execute(statement)


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS managed_app_flows")
    op.execute("DROP TABLE IF EXISTS managed_app_connections")
    op.execute("ALTER TABLE connector_oauth_flows DROP COLUMN IF EXISTS purpose")
