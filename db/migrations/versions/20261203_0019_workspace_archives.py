"""Workspace archives for sandboxes that do not share the worker's disk (the Kubernetes provider)

Revision ID: 0019
Revises: 0018

The runner downloads the prepared tree (``initial``) over the runner plane and uploads its final state
(``final``); any worker rebuilds the diff from the two. Rows go with their run (CASCADE) and are
deleted when the run's artifacts are recorded.
"""

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE workspace_archives (
            session_id uuid NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
            kind text NOT NULL,
            sha256 text NOT NULL,
            size bigint NOT NULL,
            data bytea NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (session_id, kind),
            CONSTRAINT workspace_archives_kind CHECK (kind IN ('initial', 'final'))
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE workspace_archives")
