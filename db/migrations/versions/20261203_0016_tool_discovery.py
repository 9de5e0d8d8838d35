"""Agent revisions choose how runs see brokered tools: ``tool_discovery`` eager | deferred | auto

Revision ID: 0016
Revises: 0015

``eager`` (the default, and every existing revision) hands the agent every frozen brokered schema; ``deferred``
hands it ``tool_search`` / ``tool_describe`` / ``tool_call`` instead; ``auto`` is deferred above a tool-count
threshold (``core.runspec.AUTO_DEFERRED_ABOVE``). The choice is resolved and frozen into each RunSpec.
"""

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "ALTER TABLE agent_revisions ADD COLUMN tool_discovery text NOT NULL DEFAULT 'eager' "
        "CONSTRAINT agent_revisions_tool_discovery_check CHECK (tool_discovery IN ('eager', 'deferred', 'auto'))"
    )


def downgrade() -> None:
    op.execute("ALTER TABLE agent_revisions DROP COLUMN IF EXISTS tool_discovery")
