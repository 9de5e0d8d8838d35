"""db.connections on real PostgreSQL: the one create path, for every kind of new connection."""

from __future__ import annotations

import uuid

import pytest

from core.access import NONE, READ_ONLY
from core.digests import document_digest
from core.errors import NotFound
from db.connections import Connections, NewConnection
from services.context import AppContext

TOOLS = [{"name": "add", "description": "Add two integers.", "inputSchema": {"type": "object"}}]
PHOTO = {"protocol_version": "2025-11-25", "tools": TOOLS, "digest": document_digest(TOOLS)}


@pytest.fixture
def connections(ctx: AppContext) -> Connections:
    return ctx.connections


async def test_a_sealed_connection_is_active_photographed_and_bindable(connections: Connections, tenant: str) -> None:
    new = NewConnection(provider="mcp_http", display_name="Calc", base_url="https://calc.example.com/mcp")
    row, snapshot = await connections.create(tenant, new, PHOTO, (b"sealed-blob", "key-1"))

    assert (row.status, row.auth_kind, row.owner_type, row.access) == ("active", "static", "organization", NONE)
    assert snapshot is not None and (snapshot.snapshot_version, snapshot.tools_json) == (1, TOOLS)
    assert await connections.credential(str(row.id)) == (b"sealed-blob", "key-1")
    # The first photograph is approved as it stands, and the connection is offered to new runs.
    assert [a.tool_name for a in await connections.approved_tools(str(row.id))] == ["add"]
    assert [c.id for c in await connections.candidates(tenant)] == [row.id]


async def test_a_connection_without_a_photograph_waits_for_its_sign_in(connections: Connections, tenant: str) -> None:
    new = NewConnection(
        provider="mcp_http", display_name="Pending", base_url="https://oauth.example.com/mcp", auth_kind="oauth"
    )
    row, snapshot = await connections.create(tenant, new, None)

    assert (row.status, row.auth_kind, row.scheme, row.header_name) == ("pending", "oauth", "Bearer", None)
    assert snapshot is None and await connections.latest_snapshot(str(row.id)) is None
    assert await connections.candidates(tenant) == []  # not bindable until it is signed in
    with pytest.raises(NotFound):
        await connections.credential(str(row.id))


async def test_an_environment_credential_is_configuration_not_a_stored_secret(
    connections: Connections, ctx: AppContext, tenant: str
) -> None:
    new = NewConnection(
        provider="mcp_http",
        display_name="Env",
        base_url="https://env.example.com/mcp",
        header_name="X-Api-Key",
        scheme="",
        access=READ_ONLY,
        credential_env="ENVTEST_MCP_TOKEN",
    )
    row, snapshot = await connections.create(tenant, new, PHOTO)

    assert (row.status, row.header_name, row.scheme, row.access) == ("active", "X-Api-Key", "", READ_ONLY)
    assert snapshot is not None and snapshot.snapshot_version == 1
    with pytest.raises(NotFound):  # no sealed blob: each process reads the variable itself
        await connections.credential(str(row.id))
    async with ctx.pool.acquire() as conn:
        assert await conn.fetchval("SELECT credential_env FROM integration_connections WHERE id = $1", row.id) == (
            "ENVTEST_MCP_TOKEN"
        )


async def test_a_personal_connection_is_its_owners_alone(
    connections: Connections, ctx: AppContext, tenant: str
) -> None:
    async with ctx.pool.acquire() as conn:
        user_id = str(
            await conn.fetchval(
                "INSERT INTO users (id, tenant_id, email, email_normalized, name) "
                "VALUES (gen_random_uuid(), $1, 'owner@example.com', 'owner@example.com', 'Owner') RETURNING id",
                uuid.UUID(tenant),
            )
        )
    new = NewConnection(
        provider="mcp_http", display_name="Mine", base_url="https://mine.example.com/mcp", owner_user_id=user_id
    )
    row, _ = await connections.create(tenant, new, PHOTO, (b"blob", "key-1"))

    assert (row.owner_type, str(row.owner_user_id)) == ("user", user_id)
    assert await connections.all(tenant) == []  # the operator sees no one's personal connections
    assert [c.id for c in await connections.all(tenant, user_id)] == [row.id]
    assert await connections.candidates(tenant) == []
    assert [c.id for c in await connections.candidates(tenant, user_id)] == [row.id]
