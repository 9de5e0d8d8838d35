"""LLM usage metering: reservations and usage entries (issue 5)

Revision ID: 0005
Revises: 0004
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("SELECT 1")  # filled in by the usage work


def downgrade() -> None:
    pass
