"""LLM usage metering: reservations and usage entries (issue 5)

Revision ID: 0005
Revises: 0004

``usage_entries`` exists since 0001; this adds the facade's per-request reservations (domain §8):
one row per forwarded model request, id = request id = ``usage_entries.external_id``, moving one way
``reserved → charged | released``. A reservation that never drains is charged conservatively at expiry.
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE llm_reservations (
            id uuid PRIMARY KEY,
            tenant_id uuid NOT NULL REFERENCES tenants(id),
            session_id uuid NOT NULL REFERENCES sessions(id),
            model text NOT NULL,
            state text NOT NULL DEFAULT 'reserved' CHECK (state IN ('reserved', 'charged', 'released')),
            reserved_input_tokens bigint NOT NULL CHECK (reserved_input_tokens >= 0),
            reserved_output_tokens bigint NOT NULL CHECK (reserved_output_tokens >= 0),
            reserved_cost_usd numeric,
            created_at timestamptz NOT NULL DEFAULT now(),
            expires_at timestamptz NOT NULL,
            settled_at timestamptz,
            settle_reason text
        )
        """
    )
    op.execute("CREATE INDEX llm_reservations_live ON llm_reservations (session_id) WHERE state = 'reserved'")
    op.execute("CREATE INDEX llm_reservations_due ON llm_reservations (expires_at) WHERE state = 'reserved'")
    op.execute("CREATE INDEX usage_entries_session ON usage_entries (session_id)")
    op.execute(
        "ALTER TABLE usage_entries ADD CONSTRAINT usage_entries_source "
        "CHECK (source IN ('facade', 'litellm_callback', 'reservation_timeout'))"
    )
    op.execute(ADMIT)


# Admission in one round trip: the run's row lock is held only inside the server, for the few reads and
# the insert. Each statement of a VOLATILE plpgsql function takes a fresh snapshot, so after waiting for
# the lock it sees every reservation and charge the transactions ahead of it committed. The rule is the
# one in core.usage (exhausted / admit); the caller re-derives its messages from the returned spend.
ADMIT = """
CREATE FUNCTION llm_admit(
    p_session uuid, p_active text[], p_reserve boolean, p_id uuid, p_tenant uuid, p_model text,
    p_input bigint, p_output bigint, p_cost numeric, p_max_tokens bigint, p_max_cost numeric,
    p_ceiling integer, p_ttl_secs double precision
) RETURNS TABLE (verdict text, used_tokens bigint, used_cost numeric, live bigint, live_tokens bigint,
                 live_cost numeric)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    st text;
BEGIN
    SELECT status INTO st FROM sessions WHERE id = p_session FOR UPDATE;
    IF st IS NULL OR NOT (st = ANY (p_active))
       OR EXISTS (SELECT 1 FROM session_finalizations f WHERE f.session_id = p_session) THEN
        verdict := 'inactive';
        RETURN NEXT;
        RETURN;
    END IF;
    SELECT coalesce(sum(u.input_tokens + u.output_tokens + u.cache_read_tokens + u.cache_write_tokens), 0),
           sum(u.cost_usd)
      INTO used_tokens, used_cost FROM usage_entries u WHERE u.session_id = p_session;
    SELECT count(*), coalesce(sum(r.reserved_input_tokens + r.reserved_output_tokens), 0),
           coalesce(sum(r.reserved_cost_usd), 0)
      INTO live, live_tokens, live_cost
      FROM llm_reservations r WHERE r.session_id = p_session AND r.state = 'reserved';
    IF (p_max_cost IS NOT NULL AND used_cost IS NOT NULL AND used_cost >= p_max_cost)
       OR (p_max_tokens IS NOT NULL AND used_tokens >= p_max_tokens) THEN
        verdict := 'exhausted';
    ELSIF NOT p_reserve THEN
        verdict := 'checked';
    ELSIF live >= p_ceiling THEN
        verdict := 'refused';
    ELSIF live > 0 AND p_max_tokens IS NOT NULL AND used_tokens + live_tokens + p_input + p_output > p_max_tokens THEN
        verdict := 'refused';
    ELSIF live > 0 AND p_max_cost IS NOT NULL AND p_cost IS NOT NULL
          AND coalesce(used_cost, 0) + live_cost + p_cost > p_max_cost THEN
        verdict := 'refused';
    ELSE
        INSERT INTO llm_reservations (id, tenant_id, session_id, model, reserved_input_tokens,
                                      reserved_output_tokens, reserved_cost_usd, expires_at)
        VALUES (p_id, p_tenant, p_session, p_model, p_input, p_output, p_cost,
                now() + make_interval(secs => p_ttl_secs));
        verdict := 'admitted';
    END IF;
    RETURN NEXT;
END
$$
"""


def downgrade() -> None:
    op.execute("DROP FUNCTION IF EXISTS llm_admit(uuid, text[], boolean, uuid, uuid, text, bigint, bigint, numeric,"
               " bigint, numeric, integer, double precision)")
    op.execute("ALTER TABLE usage_entries DROP CONSTRAINT IF EXISTS usage_entries_source")
    op.execute("DROP INDEX IF EXISTS usage_entries_session")
    op.execute("DROP TABLE IF EXISTS llm_reservations")
