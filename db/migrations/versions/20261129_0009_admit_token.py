"""LLM admission checks the caller's token in the same round trip

Revision ID: 0009
Revises: 0008

``llm_admit`` gains ``p_token`` (the sha256 of the caller's llm token, or NULL): the facade maps a token
to its run once per process (that mapping never changes) and leaves the validity check (revoked,
expired) to this statement, saving a round trip on every model request after the first. Admissions
of one run are serialized by an advisory lock instead of the run's row lock, so they no longer queue
behind ledger appends (the previous response's charge, the gate).
"""

import importlib.util
from pathlib import Path

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

OLD_SIGNATURE = (
    "llm_admit(uuid, text[], boolean, uuid, uuid, text, bigint, bigint, numeric, bigint, numeric, integer,"
    " double precision)"
)


def upgrade() -> None:
    op.execute(f"DROP FUNCTION {OLD_SIGNATURE}")
    op.execute(ADMIT)


def downgrade() -> None:
    op.execute(f"DROP FUNCTION IF EXISTS {OLD_SIGNATURE[:-1]}, text)")
    op.execute(_previous_admit())


def _previous_admit() -> str:
    """0005's function text, read from that revision's file (version files are not a package)."""
    path = Path(__file__).with_name("20261129_0005_usage.py")
    spec = importlib.util.spec_from_file_location("_fluidbox_usage_0005", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.ADMIT)


ADMIT = """
CREATE FUNCTION llm_admit(
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
