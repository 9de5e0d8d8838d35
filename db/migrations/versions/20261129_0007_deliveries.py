"""result deliveries (signed webhooks) (issue 6)

Revision ID: 0007
Revises: 0006
"""

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("SELECT 1")  # filled in by the deliveries work


def downgrade() -> None:
    pass
