"""The in-process API tier: the real app over ``httpx.ASGITransport``, against a real PostgreSQL, with no
Temporal server and no sandbox (``make check`` runs it).

One embedded PostgreSQL serves the whole session (``tests/conftest.py``). A database migrated and seeded once
is the template; every test gets its own database cloned from it, and its own app built with
``create_app(settings, context=...)`` over that database. The Temporal side of every route sits behind
:class:`~services.run_control.InMemoryRunWorkflows`, which records what the routes told the runs' workflows
(``api.workflows``); nothing else of ours is replaced.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from asgi_lifespan import LifespanManager

from api.app import create_app
from config.settings import Settings
from db.engine import create_pool, ensure_database, migrate
from services.context import AppContext, build_context
from services.run_control import InMemoryRunWorkflows

TEMPLATE = "fluidbox_api_template"
ADMIN = "fbx_admin_" + secrets.token_hex(24)
CREDENTIAL_KEY = secrets.token_hex(32)
BASE_URL = "http://api.test:8787"


def database_url(server_url: str, name: str) -> str:
    base, _, query = server_url.partition("?")
    return base.rsplit("/", 1)[0] + f"/{name}" + (f"?{query}" if query else "")


@pytest.fixture(scope="session")
async def api_template(postgres_url: str) -> str:
    """A database at the newest migration, seeded as the API seeds at boot, for every test to be cloned from."""
    url = await ensure_database(postgres_url, TEMPLATE)
    await migrate(url)
    pool = await create_pool(url, min_size=1, max_size=2)
    try:
        settings = api_settings(url, Path("/nonexistent"))
        app = create_app(settings, context=test_context(settings, pool))
        async with LifespanManager(app):  # boot tenant, seeded policies and catalog: what every API boot writes
            pass
    finally:
        await pool.close()
    return url


@pytest.fixture
async def api_database(postgres_url: str, api_template: str) -> AsyncIterator[str]:
    name = f"t_{uuid.uuid4().hex[:16]}"
    admin = await asyncpg.connect(postgres_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{TEMPLATE}"')
    finally:
        await admin.close()
    try:
        yield database_url(postgres_url, name)
    finally:
        admin = await asyncpg.connect(postgres_url)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


def api_settings(url: str, home: Path, **extra: Any) -> Settings:
    return Settings(
        home=home,
        database_url=url,
        admin_token=ADMIN,
        credential_key=CREDENTIAL_KEY,
        allow_loopback_connectors=True,
        allow_loopback_callbacks=True,
        public_url="http://127.0.0.1:8787",
        **extra,
    )


def test_context(settings: Settings, pool: Any, workflows: InMemoryRunWorkflows | None = None) -> AppContext:
    async def no_temporal() -> Any:
        raise ConnectionError("the in-process API tier runs no Temporal server")

    return build_context(settings, pool, temporal=no_temporal, workflows=workflows or InMemoryRunWorkflows())


@dataclass
class Api:
    """One test's API: the client (holding the operator token), the context under it, what runs were told."""

    client: httpx.AsyncClient
    transport: httpx.ASGITransport
    ctx: AppContext
    workflows: InMemoryRunWorkflows
    admin: str

    def as_token(self, token: str | None) -> httpx.AsyncClient:
        """Another client on the same app, with ``token`` (None: no credential at all)."""
        headers = {"authorization": f"Bearer {token}"} if token else {}
        return httpx.AsyncClient(transport=self.transport, base_url=BASE_URL, headers=headers)


@pytest.fixture
async def api(api_database: str, tmp_path: Path) -> AsyncIterator[Api]:
    settings = api_settings(api_database, tmp_path)
    pool = await create_pool(api_database, min_size=1, max_size=6)
    workflows = InMemoryRunWorkflows()
    ctx = test_context(settings, pool, workflows)
    app = create_app(settings, context=ctx)
    try:
        async with LifespanManager(app):
            transport = httpx.ASGITransport(app=app)
            headers = {"authorization": f"Bearer {ADMIN}"}
            # An explicit port: the guard takes a request with no server port for one over the gateway socket.
            async with httpx.AsyncClient(transport=transport, base_url=BASE_URL, headers=headers) as client:
                yield Api(client, transport, ctx, workflows, ADMIN)
    finally:
        await pool.close()
