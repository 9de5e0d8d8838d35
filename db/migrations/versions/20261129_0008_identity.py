"""users, org memberships and personal access tokens; personal connection ownership

Revision ID: 0008
Revises: 0007

A user belongs to one tenant (org); their ``org_memberships`` row carries the roles and is the kill
switch: deactivating it makes every PAT of the member answer 401 and cuts the member's personal
connections out of runs already in flight (the broker re-checks it before each brokered call).
PATs are ``api_tokens`` rows of kind ``pat`` (sha256 only, always expiring). Users added by the local
admin command have no IdP identity yet (``idp_config_id``/``subject`` NULL) and are unique by email;
SSO-provisioned users will be unique by ``(tenant_id, idp_config_id, subject)``.
"""

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

STATEMENTS = [
    "ALTER TABLE tenants ADD COLUMN display_name text",
    "ALTER TABLE tenants ADD COLUMN status text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'suspended'))",
    """
    CREATE TABLE users (
        id uuid PRIMARY KEY,
        tenant_id uuid NOT NULL REFERENCES tenants(id),
        idp_config_id uuid,
        subject text,
        email text NOT NULL,
        email_normalized text NOT NULL,
        email_verified boolean NOT NULL DEFAULT false,
        name text NOT NULL,
        status text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'deactivated')),
        last_login_at timestamptz,
        created_at timestamptz NOT NULL DEFAULT now(),
        updated_at timestamptz NOT NULL DEFAULT now(),
        UNIQUE (tenant_id, id),
        CHECK ((idp_config_id IS NULL) = (subject IS NULL))
    )
    """,
    "CREATE UNIQUE INDEX users_local_email ON users (tenant_id, email_normalized) WHERE idp_config_id IS NULL",
    "CREATE UNIQUE INDEX users_idp_subject ON users (tenant_id, idp_config_id, subject) WHERE idp_config_id IS NOT NULL",
    """
    CREATE TABLE org_memberships (
        id uuid PRIMARY KEY,
        tenant_id uuid NOT NULL REFERENCES tenants(id),
        user_id uuid NOT NULL,
        roles text[] NOT NULL DEFAULT '{member}'
            CHECK (cardinality(roles) > 0 AND roles <@ ARRAY['member', 'approver', 'admin', 'owner']::text[]),
        status text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'deactivated')),
        deactivated_at timestamptz,
        created_at timestamptz NOT NULL DEFAULT now(),
        updated_at timestamptz NOT NULL DEFAULT now(),
        UNIQUE (tenant_id, user_id),
        FOREIGN KEY (tenant_id, user_id) REFERENCES users (tenant_id, id)
    )
    """,
    "ALTER TABLE api_tokens ADD COLUMN membership_id uuid REFERENCES org_memberships(id)",
    "ALTER TABLE api_tokens ADD COLUMN user_id uuid REFERENCES users(id)",
    "ALTER TABLE api_tokens ADD COLUMN name text",
    "ALTER TABLE api_tokens ADD COLUMN display_prefix text",
    "ALTER TABLE api_tokens ADD COLUMN last_used_at timestamptz",
    """
    ALTER TABLE api_tokens ADD CONSTRAINT api_tokens_pat_shape CHECK (
        kind <> 'pat' OR (membership_id IS NOT NULL AND user_id IS NOT NULL AND name IS NOT NULL
                          AND display_prefix IS NOT NULL AND session_id IS NULL AND subscription_id IS NULL)
    )
    """,
    "CREATE INDEX api_tokens_membership ON api_tokens (membership_id) WHERE membership_id IS NOT NULL",
    # Who created a connection; a personal connection's owner is owner_user_id (owner_type 'user').
    "ALTER TABLE integration_connections ADD COLUMN created_by_user_id uuid REFERENCES users(id)",
    "ALTER TABLE integration_connections ADD CONSTRAINT integration_connections_owner CHECK ("
    " (owner_type = 'organization' AND owner_user_id IS NULL) OR (owner_type = 'user' AND owner_user_id IS NOT NULL))",
    "ALTER TABLE integration_connections ADD CONSTRAINT integration_connections_owner_fk "
    "FOREIGN KEY (owner_user_id) REFERENCES users(id)",
    # The frozen binding names whose credential it is, so the broker can check that owner is still a member.
    "ALTER TABLE run_resource_bindings ADD COLUMN connection_owner_user_id uuid REFERENCES users(id)",
    """
    CREATE TABLE auth_audit_log (
        id uuid PRIMARY KEY,
        tenant_id uuid REFERENCES tenants(id),
        actor_kind text NOT NULL CHECK (actor_kind IN ('operator', 'user', 'system')),
        actor_id text,
        action text NOT NULL,
        target text,
        success boolean NOT NULL,
        detail jsonb NOT NULL DEFAULT '{}'::jsonb,
        created_at timestamptz NOT NULL DEFAULT now()
    )
    """,
    """
    CREATE FUNCTION auth_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION 'auth_audit_log is append-only';
    END $$
    """,
    "CREATE TRIGGER auth_audit_no_update BEFORE UPDATE OR DELETE ON auth_audit_log "
    "FOR EACH ROW EXECUTE FUNCTION auth_audit_append_only()",
    "CREATE TRIGGER auth_audit_no_truncate BEFORE TRUNCATE ON auth_audit_log "
    "FOR EACH STATEMENT EXECUTE FUNCTION auth_audit_append_only()",
    "CREATE INDEX sessions_invoker ON sessions (tenant_id, invoked_by_user_id, created_at DESC) "
    "WHERE invoked_by_user_id IS NOT NULL",
]


def upgrade() -> None:
    for statement in STATEMENTS:
        op.execute(statement)


def downgrade() -> None:
    for statement in (
        "DROP INDEX IF EXISTS sessions_invoker",
        "DROP TABLE IF EXISTS auth_audit_log",
        "DROP FUNCTION IF EXISTS auth_audit_append_only()",
        "ALTER TABLE run_resource_bindings DROP COLUMN IF EXISTS connection_owner_user_id",
        "ALTER TABLE integration_connections DROP CONSTRAINT IF EXISTS integration_connections_owner_fk",
        "ALTER TABLE integration_connections DROP CONSTRAINT IF EXISTS integration_connections_owner",
        "ALTER TABLE integration_connections DROP COLUMN IF EXISTS created_by_user_id",
        "ALTER TABLE api_tokens DROP CONSTRAINT IF EXISTS api_tokens_pat_shape",
        "DROP INDEX IF EXISTS api_tokens_membership",
        "ALTER TABLE api_tokens DROP COLUMN IF EXISTS last_used_at",
        "ALTER TABLE api_tokens DROP COLUMN IF EXISTS display_prefix",
        "ALTER TABLE api_tokens DROP COLUMN IF EXISTS name",
        "ALTER TABLE api_tokens DROP COLUMN IF EXISTS user_id",
        "ALTER TABLE api_tokens DROP COLUMN IF EXISTS membership_id",
        "DROP TABLE IF EXISTS org_memberships",
        "DROP TABLE IF EXISTS users",
        "ALTER TABLE tenants DROP COLUMN IF EXISTS status",
        "ALTER TABLE tenants DROP COLUMN IF EXISTS display_name",
    ):
        op.execute(statement)
