"""Run tokens outlive their TTL only because the runner renews them: a stack of its own with 4 s tokens."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from tests.integration.conftest import FAST
from tests.integration.helpers import events, make_agent, make_policy, own_stack, start_run, wait_status

pytestmark = pytest.mark.stack

TTL_SECS = 4


@pytest.fixture(scope="module")
async def short_lived() -> AsyncIterator[httpx.AsyncClient]:
    async with own_stack("fbxr-", {**FAST, "FLUIDBOX_TOKEN_TTL_SECS": str(TTL_SECS)}) as (_, client):
        yield client


async def test_a_run_longer_than_its_token_ttl_renews_its_tokens_and_completes(
    short_lived: httpx.AsyncClient,
) -> None:
    api = short_lived
    # Three TTLs of work, then a tool call and the result: each needs a live token at the end.
    policy = await make_policy(api, {"defaults": {"tool_action": "allow"}, "tools": []})
    script = [{"sleep_ms": 3 * TTL_SECS * 1000}, {"tool": "Bash", "input": {"command": "echo still-here"}}]
    agent = await make_agent(api, script, policy=policy)
    run_id = await start_run(api, agent, workspace=None)
    row = await wait_status(api, run_id, {"completed", "failed"}, timeout=90)
    evs = await events(api, run_id)
    assert row["status"] == "completed", [e["payload"] for e in evs if e["type"] in ("run.error", "status.changed")]
    said = "\n".join(e["payload"]["data"].get("text", "") for e in evs if e["type"] == "agent.message")
    assert "still-here" in said
