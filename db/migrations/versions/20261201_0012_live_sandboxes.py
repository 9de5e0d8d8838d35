"""A partial index over the runs that hold (or are about to hold) a sandbox

Revision ID: 0012
Revises: 0011

``claim_sandbox`` counts live sandboxes under an advisory lock on every run start when
``FLUIDBOX_MAX_SANDBOXES`` is set; the index keeps that count proportional to the live runs, not to
every run ever recorded.
"""

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "CREATE INDEX sessions_live_sandbox_idx ON sessions (status) WHERE status IN "
        "('provisioning', 'initializing', 'running', 'awaiting_approval', 'cancelling', 'finalizing')"
    )


def downgrade() -> None:
    op.execute("DROP INDEX sessions_live_sandbox_idx")
