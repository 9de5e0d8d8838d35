"""Transports: every connection names the provider that speaks to it, and that provider's configuration

Revision ID: 0017
Revises: 0016

``integration_connections.transport`` picks the provider behind one connection model (``mcp_http``: MCP over
Streamable HTTP, the only one before; ``openapi``; ``http``; ``stdio``; more arrive with later migrations), and
``transport_config`` holds what that provider needs that is not a secret: the OpenAPI document's URL and digest,
operation filters and the auth definition; the declared HTTP endpoints; the stdio command, arguments, working
directory and explicit environment. A credential never goes here: it stays sealed in ``credential_sealed``.

``connector_catalog.transport_config`` lets a catalog entry carry the same trusted configuration (a stdio
command is accepted only from an admin or a catalog entry).
"""

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

STATEMENTS = [
    "ALTER TABLE integration_connections ADD COLUMN transport text NOT NULL DEFAULT 'mcp_http'",
    "ALTER TABLE integration_connections ADD COLUMN transport_config jsonb NOT NULL DEFAULT '{}'::jsonb",
    "ALTER TABLE connector_catalog ADD COLUMN transport_config jsonb",
]


def upgrade() -> None:
    for statement in STATEMENTS:
        op.execute(statement)


def downgrade() -> None:
    op.execute("ALTER TABLE connector_catalog DROP COLUMN IF EXISTS transport_config")
    op.execute("ALTER TABLE integration_connections DROP COLUMN IF EXISTS transport_config")
    op.execute("ALTER TABLE integration_connections DROP COLUMN IF EXISTS transport")
