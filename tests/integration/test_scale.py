"""More live runs than the worker has slots: a run holds no worker slot while it waits.

A stack of its own whose worker runs at most 8 activities and 8 local activities at once starts 30 runs
that each wait on an approval. Before liveness moved to workflow timers each run held a long-running
activity for its whole life, so 8 runs took every slot and the rest never provisioned (nor did the
approved 8 resume): this test deadlocked there.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from cli.stack import Stack
from tests.integration.conftest import FAST
from tests.integration.helpers import TERMINAL, events, make_agent, make_policy, own_stack, start_run, wait_status

pytestmark = pytest.mark.stack

SLOTS = 8
RUNS = 30


@pytest.fixture(scope="module")
async def narrow() -> AsyncIterator[tuple[Stack, httpx.AsyncClient]]:
    env = {
        **FAST,
        "FLUIDBOX_WORKER_MAX_ACTIVITIES": str(SLOTS),
        "FLUIDBOX_WORKER_MAX_LOCAL_ACTIVITIES": str(SLOTS),
        "FLUIDBOX_WORKER_MAX_WORKFLOW_TASKS": str(SLOTS),
    }
    async with own_stack("fbxs-", env) as stack:
        yield stack


async def pending_approvals(api: httpx.AsyncClient, want: int, timeout: float = 240) -> list[dict[str, object]]:
    """Wait until ``want`` approvals are pending across the stack (the approvals inbox)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        r = await api.get("/v1/approvals")
        assert r.status_code == 200, r.text
        rows = list(r.json()["approvals"])
        if len(rows) >= want:
            return rows
        assert loop.time() < deadline, f"only {len(rows)} of {want} runs reached their approval"
        await asyncio.sleep(0.2)


async def test_more_runs_than_worker_slots_all_wait_then_all_complete(
    narrow: tuple[Stack, httpx.AsyncClient],
) -> None:
    _, api = narrow
    policy = await make_policy(api, {"defaults": {"tool_action": "approve"}})
    agent = await make_agent(api, [{"tool": "Bash", "input": {"command": "echo shipped"}}], policy=policy)
    runs = await asyncio.gather(*(start_run(api, agent, workspace=None) for _ in range(RUNS)))

    # Every run is live and waiting at once, far more than the worker's slots.
    pending = await pending_approvals(api, RUNS)
    assert {str(p["session_id"]) for p in pending} == set(runs)
    for approval in pending:
        r = await api.post(f"/v1/approvals/{approval['id']}/decision", json={"decision": "approve"})
        assert r.status_code == 200, r.text

    rows = await asyncio.gather(*(wait_status(api, run, TERMINAL, timeout=240) for run in runs))
    assert [row["status"] for row in rows] == ["completed"] * RUNS
    # Each run asked once, was allowed once by a human, and its command ran.
    for run in runs:
        evs = await events(api, run)
        decisions = [e["payload"]["data"] for e in evs if e["type"] == "tool.decision"]
        assert [(d["verdict"], d["source"]) for d in decisions] == [("allow", "human")]
        said = "\n".join(e["payload"]["data"].get("text", "") for e in evs if e["type"] == "agent.message")
        assert "shipped" in said
