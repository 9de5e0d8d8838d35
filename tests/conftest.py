"""Shared test setup: a private XDG runtime dir for embedded PostgreSQL's lock files, and (for repository and
service tests that need no stack) one embedded PostgreSQL per session, migrated to head once, with a tenant of
its own per test (``tenant``), so tests share the database without seeing each other's rows."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from cli.stack import Postgres, ensure_database
from db.engine import create_pool, migrate
from db.ids import new_id
from services.context import AppContext
from tests.helpers import context_over
from tests.mcp_servers import RunningServer, serve
from tests.oauth_servers import AuthorizationServer, authorization_server, protected

os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="fbx-xdg-"))


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    # Short path: the server's unix socket lives in the data directory (107-byte limit).
    home = Path(tempfile.mkdtemp(prefix="fbxdb-"))
    pg = Postgres(home / "pg")
    try:
        url = pg.start()
        _durability_off(url)
        yield url
    finally:
        pg.stop()
        shutil.rmtree(home, ignore_errors=True)


def _durability_off(url: str) -> None:
    """A throwaway server need not survive a crash: no fsync, no synchronous commit (every write path is faster)."""

    async def alter() -> None:
        conn = await asyncpg.connect(url)
        try:
            for setting in ("fsync = off", "synchronous_commit = off", "full_page_writes = off"):
                await conn.execute(f"ALTER SYSTEM SET {setting}")
            await conn.execute("SELECT pg_reload_conf()")
        finally:
            await conn.close()

    asyncio.run(alter())


@pytest.fixture(scope="session")
async def db_pool(postgres_url: str) -> AsyncIterator[asyncpg.Pool[Any]]:
    url = await ensure_database(postgres_url, "fluidbox_db_tests")
    await migrate(url)
    p = await create_pool(url, min_size=1, max_size=8)
    try:
        yield p
    finally:
        await p.close()


@pytest.fixture
def ctx(db_pool: asyncpg.Pool[Any]) -> AppContext:
    """The object graph over the session's database, with no Temporal server (runs' workflows in memory)."""
    return context_over(db_pool)


@pytest.fixture
async def tenant(db_pool: asyncpg.Pool[Any]) -> str:
    tid = new_id()
    async with db_pool.acquire() as conn:
        await conn.execute("INSERT INTO tenants (id, name, slug) VALUES ($1, $2, $2)", uuid.UUID(tid), f"t-{tid}")
    return tid


# Real OAuth servers for the tests that connect through them: npm oidc-provider and an MCP server that only
# accepts its tokens (tests/oauth_servers.py), one of each per test module that asks.
@pytest.fixture(scope="module")
async def auth() -> AsyncIterator[AuthorizationServer]:
    async with authorization_server() as server:
        yield server


@pytest.fixture(scope="module")
async def mcp(auth: AuthorizationServer) -> AsyncIterator[RunningServer]:
    async with serve(protected(auth)) as server:
        yield server
