"""capability bundles (sandbox-class MCP servers), append-only versions

Revision ID: 0003
Revises: 0002
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE capability_bundles (
            id uuid PRIMARY KEY,
            tenant_id uuid NOT NULL REFERENCES tenants(id),
            name text NOT NULL,
            version integer NOT NULL CHECK (version > 0),
            description text,
            definition jsonb NOT NULL,
            definition_digest text NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now(),
            UNIQUE (tenant_id, name, version)
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS capability_bundles")
