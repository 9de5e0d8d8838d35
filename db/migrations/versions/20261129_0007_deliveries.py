"""result deliveries (signed webhooks) (issue 6)

Revision ID: 0007
Revises: 0006
"""

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

# One row per (run, webhook destination). ``id`` is the receiver's dedup key (x-fluidbox-delivery),
# the same on every attempt. ``subscription_id`` has no foreign key: a delivery is history and stays
# readable whatever happens to the subscription later.
STATEMENTS = [
    """
    CREATE TABLE deliveries (
        id uuid PRIMARY KEY,
        tenant_id uuid NOT NULL REFERENCES tenants(id),
        session_id uuid NOT NULL REFERENCES sessions(id),
        destination_index integer NOT NULL,
        subscription_id uuid,
        destination jsonb NOT NULL,
        url text NOT NULL,
        status text NOT NULL DEFAULT 'pending'
            CHECK (status IN ('pending', 'delivered', 'failed', 'skipped')),
        attempts integer NOT NULL DEFAULT 0,
        last_status_code integer,
        last_error text,
        payload_digest text,
        next_attempt_at timestamptz,
        last_attempt_at timestamptz,
        delivered_at timestamptz,
        created_at timestamptz NOT NULL DEFAULT now(),
        updated_at timestamptz NOT NULL DEFAULT now(),
        UNIQUE (session_id, destination_index)
    )
    """,
    "CREATE INDEX deliveries_subscription ON deliveries (subscription_id, created_at DESC)",
]


def upgrade() -> None:
    for statement in STATEMENTS:
        op.execute(statement)


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS deliveries")
