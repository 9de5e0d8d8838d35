"""OAuth connect: client registrations, one-time connector flows, the connection's OAuth columns

Revision ID: 0011
Revises: 0010

``oauth_client_registrations`` holds our client identity at one authorization server. Dynamic (``dcr``) and
metadata-document (``cimd``) identities are reused per (tenant, issuer, redirect URI): a partial unique index makes
the first registration win a race and every later flow reuse it. A pre-registered identity belongs to the
connection it came with, so it never takes that slot. Secrets (client secret, registration access token) are sealed
with their key id beside them, like connection credentials.

``connector_oauth_flows`` is one browser leg: the state and the browser cookie are stored only as SHA-256 digests,
the PKCE verifier sealed, what discovery found (``discovery``: endpoints and resource, no secret) and the
connection's authorization generation when the flow started (the activation's
compare-and-swap input). ``consumed_at`` makes a flow single-use; ``expires_at`` bounds it (600 s by default).

``integration_connections`` gains ``oauth`` (what discovery found: issuer, endpoints, resource, scope; no secret),
``registration_id`` and ``oauth_activated_at``: an activation wins only if the connection is still at the flow's
generation and was not activated since the flow started, so of two concurrent re-authorizations exactly one wins.
``access_token_sealed`` / ``access_expires_at`` share the current access token between API and worker processes, so
a refresh (serialized by a row lock) happens once per expiry, not once per process; ``credential_sealed`` holds
the refresh token of an OAuth connection.
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

STATEMENTS = [
    """
    CREATE TABLE oauth_client_registrations (
        id uuid PRIMARY KEY,
        tenant_id uuid NOT NULL REFERENCES tenants(id),
        issuer text NOT NULL,
        redirect_uri text NOT NULL,
        source text NOT NULL CHECK (source IN ('dcr', 'cimd', 'preregistered')),
        client_id text NOT NULL,
        token_endpoint_auth_method text NOT NULL DEFAULT 'none',
        client_secret_sealed bytea,
        client_secret_key_id text,
        registration_access_token_sealed bytea,
        registration_access_token_key_id text,
        registration_client_uri text,
        created_at timestamptz NOT NULL DEFAULT now()
    )
    """,
    "CREATE UNIQUE INDEX oauth_client_registrations_reuse ON oauth_client_registrations "
    "(tenant_id, issuer, redirect_uri) WHERE source IN ('dcr', 'cimd')",
    "ALTER TABLE integration_connections ADD COLUMN oauth jsonb",
    "ALTER TABLE integration_connections ADD COLUMN registration_id uuid REFERENCES oauth_client_registrations(id)",
    "ALTER TABLE integration_connections ADD COLUMN oauth_activated_at timestamptz",
    "ALTER TABLE integration_connections ADD COLUMN access_token_sealed bytea",
    "ALTER TABLE integration_connections ADD COLUMN access_token_key_id text",
    "ALTER TABLE integration_connections ADD COLUMN access_expires_at timestamptz",
    """
    CREATE TABLE connector_oauth_flows (
        id uuid PRIMARY KEY,
        tenant_id uuid NOT NULL REFERENCES tenants(id),
        connection_id uuid NOT NULL REFERENCES integration_connections(id),
        registration_id uuid NOT NULL REFERENCES oauth_client_registrations(id),
        state_hash text NOT NULL UNIQUE,
        browser_hash text,
        pkce_verifier_sealed bytea NOT NULL,
        pkce_verifier_key_id text NOT NULL,
        resource text NOT NULL,
        discovery jsonb NOT NULL,
        expected_generation integer NOT NULL,
        created_by_user_id uuid,
        created_at timestamptz NOT NULL DEFAULT now(),
        expires_at timestamptz NOT NULL,
        consumed_at timestamptz
    )
    """,
    "CREATE INDEX connector_oauth_flows_connection ON connector_oauth_flows (connection_id, created_at)",
]


def upgrade() -> None:
    for statement in STATEMENTS:
        op.execute(statement)


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS connector_oauth_flows")
    for column in ("access_expires_at", "access_token_key_id", "access_token_sealed", "oauth_activated_at"):
        op.execute(f"ALTER TABLE integration_connections DROP COLUMN IF EXISTS {column}")
    op.execute("ALTER TABLE integration_connections DROP COLUMN IF EXISTS registration_id")
    op.execute("ALTER TABLE integration_connections DROP COLUMN IF EXISTS oauth")
    op.execute("DROP TABLE IF EXISTS oauth_client_registrations")
