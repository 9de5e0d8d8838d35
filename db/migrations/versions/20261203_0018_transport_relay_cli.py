"""Connection transports ``relay`` and ``sandbox_cli``

Revision ID: 0018
Revises: 0017

Migration 0017 gave every connection its ``transport`` and ``transport_config``; this one admits two more
transports in the column's check constraint (the ``IF NOT EXISTS`` guards are harmless after 0017).

- ``relay``: an HTTPS device relay in front of an MCP server (``base_url`` is the relay; its credential is the
  sealed ``credential_sealed``; ``transport_config`` holds the bounded ``timeout_s`` and, optionally, the PEM of
  the CA that issued the relay's certificate — public data, never a key).
- ``sandbox_cli``: a reviewed CLI inside the run's sandbox image; ``transport_config.tools`` declares each tool's
  command, argument template and argument schema. No credential (these tools run with none).
"""

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

TRANSPORTS = ("mcp_http", "openapi", "http", "stdio", "relay", "sandbox_cli")

STATEMENTS = [
    "ALTER TABLE integration_connections ADD COLUMN IF NOT EXISTS transport text NOT NULL DEFAULT 'mcp_http'",
    "ALTER TABLE integration_connections ADD COLUMN IF NOT EXISTS transport_config jsonb NOT NULL DEFAULT '{}'::jsonb",
    "ALTER TABLE integration_connections DROP CONSTRAINT IF EXISTS integration_connections_transport_check",
    "ALTER TABLE integration_connections ADD CONSTRAINT integration_connections_transport_check CHECK (transport IN ("
    + ", ".join(f"'{t}'" for t in TRANSPORTS)
    + "))",
]


def upgrade() -> None:
    for statement in STATEMENTS:
        op.execute(statement)


def downgrade() -> None:
    op.execute("DELETE FROM integration_connections WHERE transport IN ('relay', 'sandbox_cli')")
    op.execute("ALTER TABLE integration_connections DROP CONSTRAINT IF EXISTS integration_connections_transport_check")
