"""connector catalog: global curated entries and tenant custom entries

Revision ID: 0004
Revises: 0003
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE connector_catalog (
            id uuid PRIMARY KEY,
            tenant_id uuid REFERENCES tenants(id),
            slug text NOT NULL,
            name text NOT NULL,
            icon text,
            description text,
            categories jsonb NOT NULL DEFAULT '[]'::jsonb,
            tier text NOT NULL,
            url text,
            transport text NOT NULL DEFAULT 'streamable_http',
            auth_mode text NOT NULL DEFAULT 'api_key',
            auth_hints jsonb NOT NULL DEFAULT '{}'::jsonb,
            scopes jsonb NOT NULL DEFAULT '[]'::jsonb,
            tool_hints jsonb NOT NULL DEFAULT '[]'::jsonb,
            sandbox_launch jsonb,
            disabled_at timestamptz,
            created_at timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    # One slug per scope: global entries, and each tenant's custom ones (which may not shadow a global).
    op.execute("CREATE UNIQUE INDEX connector_catalog_global_slug ON connector_catalog (slug) WHERE tenant_id IS NULL")
    op.execute(
        "CREATE UNIQUE INDEX connector_catalog_tenant_slug ON connector_catalog (tenant_id, slug) "
        "WHERE tenant_id IS NOT NULL"
    )


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS connector_catalog")
