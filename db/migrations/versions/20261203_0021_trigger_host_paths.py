"""Trigger subscriptions: ``host_paths_allowed``, whether the operator put a host-path workspace in place

Revision ID: 0021
Revises: 0020

A ``local_copy`` or ``file://`` workspace names a path on the control plane's host, and the host belongs to
the operator token alone. A subscription records whether the operator created (or last edited) it; only then
may its fires copy a host path, whether the subscription names it or the agent revision's default does.
Existing rows start at false: one an admin member stored before this rule fires no host path until the
operator edits it.
"""

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE trigger_subscriptions ADD COLUMN host_paths_allowed boolean NOT NULL DEFAULT false")


def downgrade() -> None:
    op.execute("ALTER TABLE trigger_subscriptions DROP COLUMN host_paths_allowed")
