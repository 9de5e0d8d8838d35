"""Tool access classes on connections and catalog entries; tool-definition change quarantine

Revision ID: 0014
Revises: 0013

``integration_connections.access`` is the connection's normalized declaration of which tools read and which
write (``core/access.py``). Connections that existed before this migration were usable for every tool; they
keep working: every tool becomes a **write** whose approval is left to the policy (``{"read": {"tools": []},
"write": {"tools": ["*"], "approval": "policy"}}``), the conservative class (a policy rule on ``access:
write`` catches them) that changes no decision a run used to get. New connections default to nothing
classified (nothing callable) unless the creator declares classes; catalog entries default to read-only.

``connection_approved_tools`` holds, per connection and tool, the last definition (description + input
schema) an admin approved; a snapshot tool whose definition differs is quarantined (not bound into new runs)
until its ``connection_tool_changes`` row is approved. Existing connections' latest snapshots are approved
here (they were already in use); a new connection's first snapshot is approved by the admin who creates it.
"""

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

LEGACY = '{"read": {"tools": []}, "write": {"tools": ["*"], "approval": "policy"}}'
NONE = '{"read": {"tools": []}, "write": {"tools": [], "approval": "always"}}'
READ_ONLY = '{"read": {"tools": ["*"]}, "write": {"tools": [], "approval": "always"}}'

STATEMENTS = [
    f"ALTER TABLE integration_connections ADD COLUMN access jsonb NOT NULL DEFAULT '{LEGACY}'::jsonb",
    f"ALTER TABLE integration_connections ALTER COLUMN access SET DEFAULT '{NONE}'::jsonb",
    f"ALTER TABLE connector_catalog ADD COLUMN access jsonb NOT NULL DEFAULT '{READ_ONLY}'::jsonb",
    """
    CREATE TABLE connection_approved_tools (
        connection_id uuid NOT NULL REFERENCES integration_connections(id),
        tool_name text NOT NULL,
        definition jsonb NOT NULL,
        approved_at timestamptz NOT NULL DEFAULT now(),
        approved_by text NOT NULL,
        change_id uuid,
        PRIMARY KEY (connection_id, tool_name)
    )
    """,
    """
    CREATE TABLE connection_tool_changes (
        id uuid PRIMARY KEY,
        tenant_id uuid NOT NULL REFERENCES tenants(id),
        connection_id uuid NOT NULL REFERENCES integration_connections(id),
        tool_name text NOT NULL,
        kind text NOT NULL CONSTRAINT connection_tool_changes_kind_check CHECK (kind IN ('added', 'changed')),
        snapshot_version integer NOT NULL,
        previous jsonb,
        proposed jsonb NOT NULL,
        status text NOT NULL DEFAULT 'pending' CONSTRAINT connection_tool_changes_status_check
            CHECK (status IN ('pending', 'approved', 'rejected', 'superseded')),
        decided_by text,
        decided_by_user_id uuid REFERENCES users(id),
        decided_at timestamptz,
        created_at timestamptz NOT NULL DEFAULT now()
    )
    """,
    "CREATE INDEX connection_tool_changes_connection ON connection_tool_changes (connection_id, created_at)",
    "CREATE UNIQUE INDEX connection_tool_changes_one_pending ON connection_tool_changes (connection_id, tool_name) "
    "WHERE status = 'pending'",
    # What was in use before quarantine existed is approved as it stands.
    """
    INSERT INTO connection_approved_tools (connection_id, tool_name, definition, approved_by)
    SELECT s.connection_id, t->>'name',
           jsonb_build_object('description', coalesce(t->'description', '""'::jsonb),
                              'input_schema', t->'input_schema'),
           'migration 0014'
    FROM connection_tool_snapshots s
    CROSS JOIN LATERAL jsonb_array_elements(s.tools_json) t
    WHERE s.snapshot_version = (SELECT max(snapshot_version) FROM connection_tool_snapshots x
                                WHERE x.connection_id = s.connection_id)
    """,
]


def upgrade() -> None:
    for statement in STATEMENTS:
        op.execute(statement)


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS connection_tool_changes")
    op.execute("DROP TABLE IF EXISTS connection_approved_tools")
    op.execute("ALTER TABLE connector_catalog DROP COLUMN IF EXISTS access")
    op.execute("ALTER TABLE integration_connections DROP COLUMN IF EXISTS access")
