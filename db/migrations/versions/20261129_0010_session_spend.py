"""Recorded spend per run in one row, kept by a trigger: LLM admission reads it instead of summing

Revision ID: 0010
Revises: 0009

``llm_admit`` summed every ``usage_entries`` row of the run on each model request, so admission grew
with the run's length. ``session_spend`` holds the same totals (tokens of every kind; the cost as the
sum of priced entries, NULL while none is priced, exactly what ``sum(cost_usd)`` gave), maintained by
an AFTER INSERT trigger on ``usage_entries`` in the inserting transaction, so every writer (the
facade's charge, the expiry sweep, any later source) keeps it exact. Existing entries are backfilled.
"""

import importlib.util
from pathlib import Path

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE session_spend (
            session_id uuid PRIMARY KEY REFERENCES sessions(id),
            used_tokens bigint NOT NULL DEFAULT 0,
            used_cost numeric,
            entries bigint NOT NULL DEFAULT 0
        )
        """
    )
    op.execute(
        """
        INSERT INTO session_spend (session_id, used_tokens, used_cost, entries)
        SELECT session_id, sum(input_tokens + output_tokens + cache_read_tokens + cache_write_tokens),
               sum(cost_usd), count(*)
          FROM usage_entries GROUP BY session_id
        """
    )
    op.execute(SPEND_TRIGGER_FUNCTION)
    op.execute(
        "CREATE TRIGGER usage_entries_spend AFTER INSERT ON usage_entries "
        "FOR EACH ROW EXECUTE FUNCTION usage_entries_spend()"
    )
    op.execute(ADMIT)


def downgrade() -> None:
    op.execute(_previous_admit())
    op.execute("DROP TRIGGER IF EXISTS usage_entries_spend ON usage_entries")
    op.execute("DROP FUNCTION IF EXISTS usage_entries_spend()")
    op.execute("DROP TABLE IF EXISTS session_spend")


def _previous_admit() -> str:
    """0009's function text, read from that revision's file (version files are not a package)."""
    path = Path(__file__).with_name("20261129_0009_admit_token.py")
    spec = importlib.util.spec_from_file_location("_fluidbox_admit_0009", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.ADMIT).replace("CREATE FUNCTION llm_admit(", "CREATE OR REPLACE FUNCTION llm_admit(")


SPEND_TRIGGER_FUNCTION = """
CREATE FUNCTION usage_entries_spend() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO session_spend AS s (session_id, used_tokens, used_cost, entries)
    VALUES (NEW.session_id, NEW.input_tokens + NEW.output_tokens + NEW.cache_read_tokens + NEW.cache_write_tokens,
            NEW.cost_usd, 1)
    ON CONFLICT (session_id) DO UPDATE SET
        used_tokens = s.used_tokens + EXCLUDED.used_tokens,
        used_cost = CASE WHEN EXCLUDED.used_cost IS NULL THEN s.used_cost
                         ELSE coalesce(s.used_cost, 0) + EXCLUDED.used_cost END,
        entries = s.entries + 1;
    RETURN NULL;
END
$$
"""

ADMIT = """
CREATE OR REPLACE FUNCTION llm_admit(
    p_session uuid, p_active text[], p_reserve boolean, p_id uuid, p_tenant uuid, p_model text,
    p_input bigint, p_output bigint, p_cost numeric, p_max_tokens bigint, p_max_cost numeric,
    p_ceiling integer, p_ttl_secs double precision, p_token text
) RETURNS TABLE (verdict text, used_tokens bigint, used_cost numeric, live bigint, live_tokens bigint,
                 live_cost numeric)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    st text;
BEGIN
    -- The caller's token, checked in the same round trip (the facade knows which run a token names,
    -- which never changes; whether it is still valid is read here, now).
    IF p_token IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM api_tokens t WHERE t.token_sha256 = p_token AND t.session_id = p_session
           AND t.audience = 'llm' AND t.revoked_at IS NULL AND t.expires_at > now()) THEN
        verdict := 'unauthorized';
        RETURN NEXT;
        RETURN;
    END IF;
    -- Admissions of one run are serialized by a transaction-scoped advisory lock rather than the run's
    -- row lock: every ledger append holds that row lock (the previous response's charge, the gate), and
    -- admission need not wait for them. A charge in flight still shows as a live reservation here
    -- (counted, so never under-counted); each statement below takes a fresh snapshot after the lock.
    PERFORM pg_advisory_xact_lock(hashtextextended(p_session::text, 7405));
    SELECT status INTO st FROM sessions WHERE id = p_session;
    IF st IS NULL OR NOT (st = ANY (p_active))
       OR EXISTS (SELECT 1 FROM session_finalizations f WHERE f.session_id = p_session) THEN
        verdict := 'inactive';
        RETURN NEXT;
        RETURN;
    END IF;
    -- The run's recorded spend, one row kept current by the usage_entries trigger (was: a sum per request).
    SELECT s.used_tokens, s.used_cost INTO used_tokens, used_cost FROM session_spend s WHERE s.session_id = p_session;
    used_tokens := coalesce(used_tokens, 0);
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
