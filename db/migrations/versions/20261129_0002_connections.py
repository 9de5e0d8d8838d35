"""connections, tool snapshots, run bindings and brokered execution claims

Revision ID: 0002
Revises: 0001
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

STATEMENTS = [
    """
    CREATE TABLE integration_connections (
        id uuid PRIMARY KEY,
        tenant_id uuid NOT NULL REFERENCES tenants(id),
        provider text NOT NULL,
        display_name text NOT NULL,
        base_url text NOT NULL,
        auth_kind text NOT NULL DEFAULT 'static',
        header_name text,
        scheme text NOT NULL DEFAULT 'Bearer',
        credential_sealed bytea,
        credential_key_id text,
        status text NOT NULL,
        owner_type text NOT NULL DEFAULT 'organization',
        owner_user_id uuid,
        authorization_generation integer NOT NULL DEFAULT 1,
        metadata jsonb NOT NULL DEFAULT '{}'::jsonb,
        created_at timestamptz NOT NULL DEFAULT now(),
        updated_at timestamptz NOT NULL DEFAULT now()
    )
    """,
    "CREATE INDEX integration_connections_url ON integration_connections (tenant_id, base_url) WHERE status = 'active'",
    """
    CREATE TABLE connection_tool_snapshots (
        id uuid PRIMARY KEY,
        connection_id uuid NOT NULL REFERENCES integration_connections(id),
        snapshot_version integer NOT NULL CHECK (snapshot_version > 0),
        authorization_generation integer NOT NULL,
        protocol_version text NOT NULL,
        tools_json jsonb NOT NULL,
        tools_digest text NOT NULL,
        discovered_at timestamptz NOT NULL DEFAULT now(),
        UNIQUE (connection_id, snapshot_version)
    )
    """,
    """
    CREATE TABLE run_resource_bindings (
        id uuid PRIMARY KEY,
        tenant_id uuid NOT NULL REFERENCES tenants(id),
        session_id uuid NOT NULL REFERENCES sessions(id),
        requirement_slot text NOT NULL,
        slot_kind text NOT NULL DEFAULT 'mcp',
        connection_id uuid NOT NULL REFERENCES integration_connections(id),
        authority_generation integer NOT NULL,
        connection_owner_type text NOT NULL,
        snapshot_version integer NOT NULL,
        effective_tools_json jsonb NOT NULL,
        effective_tools_digest text NOT NULL,
        binding_mode text NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now(),
        UNIQUE (session_id, slot_kind, requirement_slot)
    )
    """,
    """
    CREATE TABLE tool_execution_claims (
        session_id uuid NOT NULL REFERENCES sessions(id),
        tool_call_id text NOT NULL,
        input_digest text NOT NULL,
        binding_id uuid NOT NULL REFERENCES run_resource_bindings(id),
        tool text NOT NULL,
        input jsonb NOT NULL,
        state text NOT NULL,
        attempts integer NOT NULL DEFAULT 0,
        result jsonb,
        error text,
        created_at timestamptz NOT NULL DEFAULT now(),
        claimed_at timestamptz,
        settled_at timestamptz,
        PRIMARY KEY (session_id, tool_call_id, input_digest)
    )
    """,
]


def upgrade() -> None:
    for statement in STATEMENTS:
        op.execute(statement)


def downgrade() -> None:
    for table in ("tool_execution_claims", "run_resource_bindings", "connection_tool_snapshots", "integration_connections"):
        op.execute(f"DROP TABLE IF EXISTS {table}")
