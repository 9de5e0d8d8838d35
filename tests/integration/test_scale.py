"""More live runs than the worker has slots: a run holds no worker slot while it waits.

A stack of its own with two worker processes, each running at most 4 activities, 4 local activities and 4
workflow tasks at once (8 of each in all), starts 12 runs that each wait on an approval; the two workers
share the task queue, so a run's steps move between them. Before issue 12 each run held a long-running
activity for its whole life, so 4 runs took every slot and the rest never provisioned (nor did the
approved 4 resume): this test deadlocked there.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from cli.stack import Stack
from tests.helpers import eventually
from tests.integration.conftest import FAST
from tests.integration.helpers import (
    TERMINAL,
    events,
    make_agent,
    make_policy,
    own_stack,
    pending_approvals,
    run_row,
    start_run,
    wait_status,
)

pytestmark = pytest.mark.stack

# More runs than the slots of both workers together. (30 runs on 8 slots also pass, but on a loaded 2-core machine the
# embedded Temporal dev server's SQLite store times out under that many concurrent updates.)
SLOTS = 4
WORKERS = 2
RUNS = 12
LIVE = {"provisioning", "initializing", "running", "awaiting_approval"}


@pytest.fixture(scope="module")
async def narrow() -> AsyncIterator[tuple[Stack, httpx.AsyncClient]]:
    env = {
        **FAST,
        "FLUIDBOX_WORKER_MAX_ACTIVITIES": str(SLOTS),
        "FLUIDBOX_WORKER_MAX_LOCAL_ACTIVITIES": str(SLOTS),
        "FLUIDBOX_WORKER_MAX_WORKFLOW_TASKS": str(SLOTS),
    }
    async with own_stack("fbxs-", env, workers=WORKERS) as stack:
        yield stack


async def test_more_runs_than_worker_slots_all_wait_then_all_complete(
    narrow: tuple[Stack, httpx.AsyncClient],
) -> None:
    _, api = narrow
    policy = await make_policy(api, {"defaults": {"tool_action": "approve"}})
    agent = await make_agent(api, [{"tool": "Bash", "input": {"command": "echo shipped"}}], policy=policy)
    runs = await asyncio.gather(*(start_run(api, agent, workspace=None) for _ in range(RUNS)))

    # Every run is live and waiting at once, far more than the worker's slots.
    pending = await pending_approvals(api, RUNS, runs=runs)
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


MAX_SANDBOXES = 2
QUEUED_RUNS = 5


@pytest.fixture(scope="module")
async def capped() -> AsyncIterator[tuple[Stack, httpx.AsyncClient]]:
    env = {**FAST, "FLUIDBOX_MAX_SANDBOXES": str(MAX_SANDBOXES), "FLUIDBOX_CAPACITY_RECHECK_SECS": "0.5"}
    async with own_stack("fbxq-", env) as stack:
        yield stack


async def test_runs_past_the_sandbox_maximum_wait_visibly_and_start_as_places_free(
    capped: tuple[Stack, httpx.AsyncClient],
) -> None:
    _, api = capped
    policy = await make_policy(api, {"defaults": {"tool_action": "approve"}})
    agent = await make_agent(api, [{"tool": "Bash", "input": {"command": "echo shipped"}}], policy=policy)
    runs = await asyncio.gather(*(start_run(api, agent, workspace=None) for _ in range(QUEUED_RUNS)))

    # Two runs hold the two places (each waits on its approval); the other three wait, and say so.
    await pending_approvals(api, MAX_SANDBOXES)
    rows: list[dict[str, Any]] = []

    async def three_queued() -> list[dict[str, Any]] | None:
        rows[:] = [await run_row(api, run) for run in runs]
        waiting = [r for r in rows if r["status"] == "created" and "sandbox capacity" in (r["status_reason"] or "")]
        return waiting if len(waiting) == QUEUED_RUNS - MAX_SANDBOXES else None

    waiting = await eventually(
        three_queued, timeout=120, message=lambda: str([(r["status"], r["status_reason"]) for r in rows])
    )
    assert waiting[0]["status_reason"] == f"waiting for sandbox capacity ({MAX_SANDBOXES} live, max {MAX_SANDBOXES})"

    # Approve whatever asks, as it asks: never more than two runs hold a sandbox, and all five complete.
    decided: set[str] = set()

    async def approve_what_asks() -> bool:
        r = await api.get("/v1/approvals")
        pending = [a for a in r.json()["approvals"] if a["id"] not in decided]
        live = [row for row in [await run_row(api, run) for run in runs] if row["status"] in LIVE]
        assert len(live) <= MAX_SANDBOXES, [row["status"] for row in live]
        for approval in pending:
            d = await api.post(f"/v1/approvals/{approval['id']}/decision", json={"decision": "approve"})
            assert d.status_code == 200, d.text
            decided.add(str(approval["id"]))
        return len(decided) >= QUEUED_RUNS

    await eventually(
        approve_what_asks, timeout=240, message=lambda: f"{len(decided)} of {QUEUED_RUNS} runs reached their approval"
    )
    rows = await asyncio.gather(*(wait_status(api, run, TERMINAL, timeout=120) for run in runs))
    assert [row["status"] for row in rows] == ["completed"] * QUEUED_RUNS
    # Each queued run's ledger says it waited, once.
    said = [
        [e for e in await events(api, run) if "waiting for sandbox capacity" in e["payload"]["data"].get("text", "")]
        for run in runs
    ]
    assert sorted(len(s) for s in said) == [0] * MAX_SANDBOXES + [1] * (QUEUED_RUNS - MAX_SANDBOXES)
