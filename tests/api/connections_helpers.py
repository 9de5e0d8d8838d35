"""Helpers for the connection, catalog, OAuth, managed app and capability tests of the in-process tier.

Members and their personal access tokens are made in process (``api.ctx.identity``, as ``fluidbox users`` does);
an app with other settings than the ``api`` fixture's (another public URL, managed apps configured) is built over
the same test database with :func:`app_with`.

The servers are module fixtures: a test module takes one by naming it (``mcp = open_server``), so each module
starts its own once: an MCP server without auth, one that takes only :data:`TOKEN`, and a real authorization server
(npm oidc-provider) with an MCP server it protects (``auth = authorization`` and ``signed = oauth_protected``).
"""

from __future__ import annotations

import secrets
import typing
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest_asyncio
from asgi_lifespan import LifespanManager
from fastapi import APIRouter

from api.app import create_app
from db.engine import create_pool
from services.run_control import InMemoryRunWorkflows
from tests.api.conftest import ADMIN, BASE_URL, Api, api_settings, test_context
from tests.mcp_servers import RunningServer, basic, bearer, serve
from tests.oauth_servers import AuthorizationServer, authorization_server, protected

TOKEN = "tok-" + secrets.token_hex(8)  # the one credential guarded_server takes


@pytest_asyncio.fixture(scope="module")
async def open_server() -> AsyncIterator[RunningServer]:
    async with serve(basic()) as srv:
        yield srv


@pytest_asyncio.fixture(scope="module")
async def guarded_server() -> AsyncIterator[RunningServer]:
    async with serve(bearer(TOKEN)) as srv:
        yield srv


@pytest_asyncio.fixture(scope="module")
async def authorization() -> AsyncIterator[AuthorizationServer]:
    async with authorization_server() as server:
        yield server


@pytest_asyncio.fixture(scope="module")
async def oauth_protected(auth: AuthorizationServer) -> AsyncIterator[RunningServer]:
    """An MCP server that takes only the tokens of the module's ``auth`` (its authorization server)."""
    async with serve(protected(auth)) as srv:
        yield srv


async def member(api: Api, *roles: str, read_only: bool = False) -> tuple[httpx.AsyncClient, str]:
    """A new member of the boot organization with ``roles`` (default: member) and a client holding its PAT;
    returns the client and the member's user id."""
    identity = api.ctx.identity
    tenant_id = await identity.boot_tenant()
    email = f"{uuid.uuid4().hex[:10]}@example.com"
    made = await identity.add_user(tenant_id, email, "Test User", roles or ("member",), actor=("system", "test"))
    token, _ = await identity.mint_pat(
        tenant_id, str(made.id), "test", None, actor=("system", "test"), read_only=read_only
    )
    return api.as_token(token), str(made.user_id)


async def listed(client: httpx.AsyncClient) -> list[dict[str, Any]]:
    r = await client.get("/v1/connections")
    assert r.status_code == 200, r.text
    return list(r.json()["connections"])


def not_returning_their_model(router: APIRouter) -> list[str]:
    """The handlers of ``router`` that declare a ``response_model`` and are not annotated to return it."""
    return [
        route.endpoint.__name__
        for route in router.routes
        if getattr(route, "response_model", None) is not None
        and typing.get_type_hints(route.endpoint)["return"] is not route.response_model  # type: ignore[attr-defined]
    ]


def refused(r: httpx.Response, status: int, *words: str) -> None:
    """``r`` is a ``status`` answer whose error names each of ``words``."""
    assert r.status_code == status, (r.status_code, r.text)
    error = r.json()["error"]
    for word in words:
        assert word in error, (word, error)


@asynccontextmanager
async def app_with(api: Api, home: Path, **settings: Any) -> AsyncIterator[Api]:
    """Another app over the test's database with ``settings`` changed (its operator client, its context)."""
    url = api.ctx.settings.database_url or ""
    changed = api_settings(url, home).model_copy(update=settings)
    pool = await create_pool(url, min_size=1, max_size=4)
    workflows = InMemoryRunWorkflows()
    ctx = test_context(changed, pool, workflows)
    app = create_app(changed, context=ctx)
    try:
        async with LifespanManager(app):
            transport = httpx.ASGITransport(app=app)
            headers = {"authorization": f"Bearer {ADMIN}"}
            async with httpx.AsyncClient(transport=transport, base_url=BASE_URL, headers=headers) as client:
                yield Api(client, transport, ctx, workflows, ADMIN)
    finally:
        await pool.close()
