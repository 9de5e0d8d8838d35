"""Connection transport ``git``: a sealed credential for cloning private repositories

Revision ID: 0020
Revises: 0019

A ``git`` connection holds no tools: its ``base_url`` is the https prefix of the repositories it may be sent to
(``https://git.example.com/team``) and its credential is the sealed ``credential_sealed`` (``scheme`` ``Basic``
for ``user:token``, ``Bearer`` for a token). A ``git_repository`` workspace names it by id; the control plane
clones with it and the sandbox never receives it.
"""

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

BEFORE = ("mcp_http", "openapi", "http", "stdio", "relay", "sandbox_cli")
TRANSPORTS = (*BEFORE, "git")


def _constraint(transports: tuple[str, ...]) -> str:
    return (
        "ALTER TABLE integration_connections ADD CONSTRAINT integration_connections_transport_check CHECK (transport IN ("
        + ", ".join(f"'{t}'" for t in transports)
        + "))"
    )


def upgrade() -> None:
    op.execute("ALTER TABLE integration_connections DROP CONSTRAINT IF EXISTS integration_connections_transport_check")
    op.execute(_constraint(TRANSPORTS))


def downgrade() -> None:
    op.execute(
        "DELETE FROM connection_tool_snapshots WHERE connection_id IN "
        "(SELECT id FROM integration_connections WHERE transport = 'git')"
    )
    op.execute("DELETE FROM integration_connections WHERE transport = 'git'")
    op.execute("ALTER TABLE integration_connections DROP CONSTRAINT IF EXISTS integration_connections_transport_check")
    op.execute(_constraint(BEFORE))
