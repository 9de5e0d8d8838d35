"""Real servers shared by the service tests: oidc-provider and an OAuth-protected MCP server (one per module)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from integrations.sealing import Sealer, generate_key, parse_key
from tests.mcp_servers import RunningServer, serve
from tests.oauth_servers import AuthorizationServer, authorization_server, protected


@pytest.fixture(scope="module")
async def auth() -> AsyncIterator[AuthorizationServer]:
    async with authorization_server() as server:
        yield server


@pytest.fixture(scope="module")
async def mcp(auth: AuthorizationServer) -> AsyncIterator[RunningServer]:
    async with serve(protected(auth)) as server:
        yield server


@pytest.fixture
def sealer() -> Sealer:
    return Sealer(parse_key(generate_key()))
