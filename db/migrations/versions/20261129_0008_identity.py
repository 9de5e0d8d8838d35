"""users, org memberships and personal access tokens; personal connection ownership

Revision ID: 0008
Revises: 0007
"""

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("SELECT 1")  # filled in by the identity work


def downgrade() -> None:
    pass
