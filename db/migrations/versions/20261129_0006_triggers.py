"""trigger subscriptions, tokens, invocations and schedules (issue 6)

Revision ID: 0006
Revises: 0005
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("SELECT 1")  # filled in by the triggers work


def downgrade() -> None:
    pass
