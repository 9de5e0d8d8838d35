"""db.oauth on real PostgreSQL: registration reuse, and one-time flows bound to the browser that opened them."""

from __future__ import annotations

import asyncio
import secrets
import uuid
from datetime import timedelta

import pytest

from core.errors import Conflict, Forbidden, NotFound
from core.tokens import token_digest
from db._base import Row
from db.ids import new_id
from db.oauth import SUPERSEDED, ClaimedFlow, OAuthRecords, flow_verifier_context, registration_secret_context
from integrations.sealing import Sealer, generate_key, parse_key
from services.context import AppContext

ISSUER = "https://auth.example.com"
REDIRECT = "https://fluidbox.example.com/v1/oauth/callback"


@pytest.fixture
def records(ctx: AppContext) -> OAuthRecords:
    return ctx.oauth_records


@pytest.fixture
def sealer() -> Sealer:
    return Sealer(parse_key(generate_key()))


def dcr(client_id: str, redirect_uri: str = REDIRECT, source: str = "dcr") -> Row:
    return {
        "issuer": ISSUER,
        "redirect_uri": redirect_uri,
        "source": source,
        "client_id": client_id,
        "token_endpoint_auth_method": "none",
    }


async def pending_connection(ctx: AppContext, tenant: str) -> str:
    cid = new_id()
    async with ctx.pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO integration_connections (id, tenant_id, provider, display_name, base_url, auth_kind, status) "
            "VALUES ($1, $2, 'mcp_http', 'oauth test', 'https://mcp.example.com/mcp', 'oauth', 'pending')",
            uuid.UUID(cid),
            uuid.UUID(tenant),
        )
    return cid


async def start(records: OAuthRecords, ctx: AppContext, sealer: Sealer, tenant: str, **kw: object) -> tuple[str, str]:
    """A flow on a fresh connection; returns (flow id, raw state)."""
    registration, _ = await records.save_registration(tenant, dcr(f"client-{new_id()}"))
    state = secrets.token_urlsafe(32)
    flow = await records.start_flow(
        tenant,
        await pending_connection(ctx, tenant),
        str(registration.id),
        state_hash=token_digest(state),
        verifier=(sealer.seal("the-verifier", context=flow_verifier_context(tenant)), sealer.key_id),
        resource="https://mcp.example.com/mcp",
        expected_generation=1,
        **kw,  # type: ignore[arg-type]
    )
    return str(flow.id), state


# --------------------------------------------------------------------------------------------------------------------
# Registrations


async def test_a_dynamic_registration_is_reused_per_issuer_and_redirect_uri(records: OAuthRecords, tenant: str) -> None:
    first, created = await records.save_registration(tenant, dcr("client-a"))
    assert created and first.client_id == "client-a"
    reusable = await records.reusable_registration(tenant, ISSUER, REDIRECT)
    assert reusable is not None and reusable.id == first.id

    again, created_again = await records.save_registration(tenant, dcr("client-b"))
    assert not created_again and again.id == first.id and again.client_id == "client-a"

    other, created_other = await records.save_registration(tenant, dcr("client-c", redirect_uri=REDIRECT + "2"))
    assert created_other and other.id != first.id


async def test_a_preregistered_client_never_takes_the_shared_slot(records: OAuthRecords, tenant: str) -> None:
    shared, _ = await records.save_registration(tenant, dcr("shared"))
    own, created = await records.save_registration(tenant, dcr("mine", source="preregistered"))
    assert created and own.id != shared.id
    reusable = await records.reusable_registration(tenant, ISSUER, REDIRECT)
    assert reusable is not None and reusable.client_id == "shared"


async def test_registrations_are_per_tenant(records: OAuthRecords, tenant: str, ctx: AppContext) -> None:
    await records.save_registration(tenant, dcr("tenant-one"))
    other_tenant = new_id()
    async with ctx.pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO tenants (id, name, slug) VALUES ($1, $2, $2)", uuid.UUID(other_tenant), "x" + other_tenant
        )
    assert await records.reusable_registration(other_tenant, ISSUER, REDIRECT) is None


async def test_concurrent_registrations_settle_on_one_winner(records: OAuthRecords, tenant: str) -> None:
    results = await asyncio.gather(*(records.save_registration(tenant, dcr(f"racer-{i}")) for i in range(5)))
    assert sum(created for _, created in results) == 1
    assert len({row.id for row, _ in results}) == 1


async def test_registration_secrets_are_stored_sealed(records: OAuthRecords, tenant: str, sealer: Sealer) -> None:
    context = registration_secret_context(tenant, "client_secret")
    row, _ = await records.save_registration(
        tenant,
        dcr("confidential") | {"token_endpoint_auth_method": "client_secret_basic"},
        client_secret=(sealer.seal("s3cret-value", context=context), sealer.key_id),
    )
    stored = await records.registration(tenant, str(row.id))
    assert stored is not None and stored.client_secret_sealed is not None
    assert b"s3cret-value" not in bytes(stored.client_secret_sealed)
    assert sealer.open(bytes(stored.client_secret_sealed), context=context) == b"s3cret-value"


# --------------------------------------------------------------------------------------------------------------------
# Flows


async def test_a_flow_is_claimed_once_by_the_browser_that_opened_it(
    records: OAuthRecords, ctx: AppContext, sealer: Sealer, tenant: str
) -> None:
    flow_id, state = await start(records, ctx, sealer, tenant)
    mine, theirs = token_digest("cookie-mine"), token_digest("cookie-theirs")

    bound = await records.bind_browser(flow_id, mine)
    assert bound.browser_bound and bound.consumed_at is None
    await records.bind_browser(flow_id, mine)  # opening the link again in the same browser is fine
    with pytest.raises(Forbidden, match="another browser"):
        await records.bind_browser(flow_id, theirs)

    with pytest.raises(Forbidden, match="another browser"):
        await records.claim_flow(token_digest(state), theirs)
    with pytest.raises(Forbidden):
        await records.claim_flow(token_digest(state), None)

    claimed = await records.claim_flow(token_digest(state), mine)  # the refusals above did not burn it
    assert str(claimed.id) == flow_id and claimed.expected_generation == 1
    verifier = sealer.open(bytes(claimed.pkce_verifier_sealed), context=flow_verifier_context(tenant))
    assert verifier == b"the-verifier"

    with pytest.raises(Conflict, match="already completed"):
        await records.claim_flow(token_digest(state), mine)
    with pytest.raises(Conflict):
        await records.bind_browser(flow_id, mine)


async def test_concurrent_callbacks_consume_a_flow_exactly_once(
    records: OAuthRecords, ctx: AppContext, sealer: Sealer, tenant: str
) -> None:
    flow_id, state = await start(records, ctx, sealer, tenant)
    browser = token_digest("cookie")
    await records.bind_browser(flow_id, browser)
    outcomes = await asyncio.gather(
        *(records.claim_flow(token_digest(state), browser) for _ in range(4)), return_exceptions=True
    )
    assert sum(isinstance(o, ClaimedFlow) for o in outcomes) == 1
    assert all(isinstance(o, Conflict) for o in outcomes if not isinstance(o, ClaimedFlow))


async def test_an_expired_flow_cannot_be_opened_or_claimed(
    records: OAuthRecords, ctx: AppContext, sealer: Sealer, tenant: str
) -> None:
    flow_id, state = await start(records, ctx, sealer, tenant, ttl=timedelta(seconds=-1))
    with pytest.raises(NotFound, match="expired"):
        await records.bind_browser(flow_id, token_digest("cookie"))
    with pytest.raises(NotFound, match="expired"):
        await records.claim_flow(token_digest(state), token_digest("cookie"))


async def test_unknown_flows_and_states_are_not_found(records: OAuthRecords) -> None:
    with pytest.raises(NotFound):
        await records.bind_browser(new_id(), token_digest("cookie"))
    with pytest.raises(NotFound):
        await records.bind_browser("not-a-uuid", token_digest("cookie"))
    with pytest.raises(NotFound):
        await records.claim_flow(token_digest("no such state"), token_digest("cookie"))


# --------------------------------------------------------------------------------------------------------------------
# Activation


PHOTO = {"protocol_version": "2025-11-25", "tools": [{"name": "add"}], "digest": "sha256:test"}
GRANT = {"issuer": ISSUER, "resource": "https://mcp.example.com/mcp", "scope": "mcp:tools offline_access"}


async def claimed_flow(
    records: OAuthRecords, ctx: AppContext, sealer: Sealer, tenant: str, connection_id: str
) -> ClaimedFlow:
    """Start a flow for ``connection_id`` at its current generation and claim it from the right browser."""
    async with ctx.pool.acquire() as conn:
        generation = await conn.fetchval(
            "SELECT authorization_generation FROM integration_connections WHERE id = $1", uuid.UUID(connection_id)
        )
    registration, _ = await records.save_registration(tenant, dcr("client"))
    state = secrets.token_urlsafe(32)
    flow = await records.start_flow(
        tenant,
        connection_id,
        str(registration.id),
        state_hash=token_digest(state),
        verifier=(sealer.seal("v", context=flow_verifier_context(tenant)), sealer.key_id),
        resource=GRANT["resource"],
        expected_generation=generation,
    )
    await records.bind_browser(str(flow.id), token_digest("cookie"))
    return await records.claim_flow(token_digest(state), token_digest("cookie"))


def refresh_credential(sealer: Sealer, tenant: str, token: str) -> tuple[bytes, str]:
    return sealer.seal(token, context=f"{tenant}:integration_connections.credential"), sealer.key_id


async def test_activation_stores_the_sealed_grant_and_the_photograph(
    records: OAuthRecords, ctx: AppContext, sealer: Sealer, tenant: str
) -> None:
    cid = await pending_connection(ctx, tenant)
    flow = await claimed_flow(records, ctx, sealer, tenant, cid)
    row, snapshot = await records.activate(
        tenant, flow, credential=refresh_credential(sealer, tenant, "rt-1"), oauth=GRANT, photo=PHOTO
    )
    assert row.status == "active" and row.authorization_generation == 1
    assert snapshot.snapshot_version == 1 and snapshot.authorization_generation == 1
    async with ctx.pool.acquire() as conn:
        stored = await conn.fetchrow(
            "SELECT credential_sealed, oauth, registration_id FROM integration_connections WHERE id = $1",
            uuid.UUID(cid),
        )
    assert stored["oauth"] == GRANT and stored["registration_id"] == flow.registration_id
    assert b"rt-1" not in bytes(stored["credential_sealed"])


async def test_of_two_concurrent_authorizations_exactly_one_wins(
    records: OAuthRecords, ctx: AppContext, sealer: Sealer, tenant: str
) -> None:
    cid = await pending_connection(ctx, tenant)
    first = await claimed_flow(records, ctx, sealer, tenant, cid)
    second = await claimed_flow(records, ctx, sealer, tenant, cid)
    outcomes = await asyncio.gather(
        *(
            records.activate(tenant, f, credential=refresh_credential(sealer, tenant, "rt"), oauth=GRANT, photo=PHOTO)
            for f in (first, second)
        ),
        return_exceptions=True,
    )
    winners = [o for o in outcomes if isinstance(o, tuple)]
    losers = [o for o in outcomes if isinstance(o, Conflict)]
    assert len(winners) == 1 and len(losers) == 1, outcomes
    assert losers[0].message == SUPERSEDED

    # A flow started before the activation stays superseded even if it arrives later.
    with pytest.raises(Conflict, match="superseded"):
        await records.activate(
            tenant, first, credential=refresh_credential(sealer, tenant, "rt"), oauth=GRANT, photo=PHOTO
        )


async def test_reconnecting_an_active_connection_bumps_the_generation(
    records: OAuthRecords, ctx: AppContext, sealer: Sealer, tenant: str
) -> None:
    cid = await pending_connection(ctx, tenant)
    flow = await claimed_flow(records, ctx, sealer, tenant, cid)
    await records.activate(tenant, flow, credential=refresh_credential(sealer, tenant, "a"), oauth=GRANT, photo=PHOTO)
    again = await claimed_flow(records, ctx, sealer, tenant, cid)
    row, snapshot = await records.activate(
        tenant, again, credential=refresh_credential(sealer, tenant, "b"), oauth=GRANT, photo=PHOTO
    )
    assert row.authorization_generation == 2
    assert (snapshot.snapshot_version, snapshot.authorization_generation) == (2, 2)

    # The broker's writes under the old generation change nothing.
    assert not await records.store_rotated(cid, 1, refresh_credential(sealer, tenant, "stale"))
    assert not await records.mark_error(cid, 1, "invalid_grant: stale")
    assert await records.store_rotated(cid, 2, refresh_credential(sealer, tenant, "c"))


async def test_a_failed_refresh_moves_the_connection_to_error_with_the_reason(
    records: OAuthRecords, ctx: AppContext, sealer: Sealer, tenant: str
) -> None:
    cid = await pending_connection(ctx, tenant)
    flow = await claimed_flow(records, ctx, sealer, tenant, cid)
    await records.activate(tenant, flow, credential=refresh_credential(sealer, tenant, "a"), oauth=GRANT, photo=PHOTO)
    assert await records.mark_error(cid, 1, "grant request is invalid")
    async with ctx.pool.acquire() as conn:
        row = await conn.fetchrow(
            "SELECT status, credential_sealed, oauth FROM integration_connections WHERE id = $1", uuid.UUID(cid)
        )
    assert row["status"] == "error" and row["credential_sealed"] is None
    assert row["oauth"]["last_error"] == "grant request is invalid"
    # A new sign-in revives it.
    again = await claimed_flow(records, ctx, sealer, tenant, cid)
    revived, _ = await records.activate(
        tenant, again, credential=refresh_credential(sealer, tenant, "b"), oauth=GRANT, photo=PHOTO
    )
    assert revived.status == "active" and revived.authorization_generation == 2


async def test_a_revoked_connection_cannot_be_activated(
    records: OAuthRecords, ctx: AppContext, sealer: Sealer, tenant: str
) -> None:
    cid = await pending_connection(ctx, tenant)
    flow = await claimed_flow(records, ctx, sealer, tenant, cid)
    async with ctx.pool.acquire() as conn:
        await conn.execute("UPDATE integration_connections SET status = 'revoked' WHERE id = $1", uuid.UUID(cid))
    with pytest.raises(Conflict, match="revoked"):
        await records.activate(
            tenant, flow, credential=refresh_credential(sealer, tenant, "a"), oauth=GRANT, photo=PHOTO
        )
