"""Fixtures shared by the integration-client tests (real MCP servers, no stack)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from integrations.mcp_pool import SessionPool


@pytest.fixture
async def pool() -> AsyncIterator[SessionPool]:
    """A session pool of the test's own, closed afterwards."""
    p = SessionPool()
    try:
        yield p
    finally:
        await p.aclose()
