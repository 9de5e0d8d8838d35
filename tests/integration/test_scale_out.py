"""A scaled-out control plane: two API processes and two workers against one PostgreSQL and one Temporal.

The stack of this module runs API A (the one the sandboxes' gateway socket belongs to) and API B (its own port
and socket), two worker processes, and separate task queues for sandbox work and brokered calls. Nothing is
shared between the processes but PostgreSQL and Temporal: a decision posted to B wakes a ``/permission`` held on
A, B's event stream shows what A wrote, and a worker killed mid-run loses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import shutil
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from api.hub import EventHub
from cli.stack import Stack, admin_token
from config.settings import Settings
from config.temporal import connect_client
from tests.helpers import eventually
from tests.integration.conftest import FAST
from tests.integration.helpers import (
    events,
    issue_token,
    make_agent,
    make_policy,
    start_run,
    types,
    wait_pending,
    wait_status,
)
from tests.integration.test_oauth_connections import browser_client, create
from tests.mcp_servers import RunningServer, basic, bearer, serve
from tests.oauth_servers import AuthorizationServer

pytestmark = pytest.mark.stack

DEPLOY = [{"tool": "Bash", "input": {"command": "./deploy.sh"}}]
IDLE = [{"sleep_ms": 600000}]
SUFFIX = secrets.token_hex(3)
SANDBOX_QUEUE = f"fluidbox-sandbox-{SUFFIX}"
BROKER_QUEUE = f"fluidbox-broker-{SUFFIX}"


@pytest.fixture(scope="module")
async def plane() -> AsyncIterator[Stack]:
    env = {**FAST, "FLUIDBOX_SANDBOX_TASK_QUEUE": SANDBOX_QUEUE, "FLUIDBOX_BROKER_TASK_QUEUE": BROKER_QUEUE}
    stack = Stack.ephemeral("fbxo-", env)
    stack.api_processes = stack.worker_processes = 2
    # Behind a load balancer every replica names the same public URL (OAuth redirect URIs, invoke URLs): A's here.
    stack.extra_env["FLUIDBOX_PUBLIC_URL"] = stack.api_url
    stack.any_api_port = False
    try:
        await stack.start()
        yield stack
    finally:
        stack.stop()
        shutil.rmtree(stack.home, ignore_errors=True)


def client_of(url: str, token: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, headers={"authorization": f"Bearer {token}"}, timeout=60)


@pytest.fixture
async def apis(plane: Stack) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    """Admin clients of API A and API B."""
    token = admin_token(plane.home)[0]
    a_url, b_url = plane.api_urls
    async with client_of(a_url, token) as a, client_of(b_url, token) as b:
        yield a, b


@pytest.fixture
async def temporal(plane: Stack) -> Client:
    return await connect_client(Settings(temporal_address=plane.temporal_address))


async def history(temporal: Client, run_id: str) -> list[Any]:
    return [e async for e in temporal.get_workflow_handle(f"run-{run_id}").fetch_history_events()]


def scheduled_queues(evs: list[Any]) -> dict[str, set[str]]:
    """Activity name → the task queues it was scheduled on, in one workflow history."""
    out: dict[str, set[str]] = {}
    for e in evs:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = e.activity_task_scheduled_event_attributes
            out.setdefault(attrs.activity_type.name, set()).add(attrs.task_queue.name)
    return out


def worker_names_by_pid(stack: Stack) -> dict[int, str]:
    return {proc.pid: name for name, proc in stack.procs.items() if name == "worker" or name.startswith("worker-")}


async def test_two_api_processes_serve_the_same_control_plane(
    plane: Stack, apis: tuple[httpx.AsyncClient, httpx.AsyncClient]
) -> None:
    a, b = apis
    assert len(plane.api_urls) == 2 and plane.api_urls[0] != plane.api_urls[1]
    agent = await make_agent(a, IDLE)
    # An agent made through A is there on B, and a run started on B is seen, and cancelled, through A.
    assert (await b.get(f"/v1/agents/{agent}")).status_code == 200
    run_id = await start_run(b, agent, workspace=None)
    await wait_status(a, run_id, {"running"})
    assert (await a.post(f"/v1/sessions/{run_id}/cancel")).json() == {"cancelled": True}
    await wait_status(b, run_id, {"cancelled"})


async def test_a_decision_posted_to_one_api_wakes_a_permission_held_on_another(
    plane: Stack, apis: tuple[httpx.AsyncClient, httpx.AsyncClient]
) -> None:
    a, b = apis
    run_id = await start_run(a, await make_agent(a, [*DEPLOY, {"say": "after the deploy"}]))
    # The run's runner holds its /permission on API A (the gateway socket the sandboxes reach is A's).
    pending = await wait_pending(b, run_id)
    tool = await issue_token(plane.database_url or "", run_id, "tool")
    body = {"tool_call_id": "rp_001", "tool": "Bash", "input": {"command": "./deploy.sh"}}
    async with client_of(plane.api_urls[0], tool) as runner_on_a:
        held = asyncio.create_task(runner_on_a.post(f"/internal/sessions/{run_id}/permission", json=body))
        await asyncio.wait({held}, timeout=0.5)
        assert not held.done(), "the tool call must wait for a human decision"
        r = await b.post(f"/v1/approvals/{pending['id']}/decision", json={"decision": "approve"})
        assert r.status_code == 200, r.text
        answer = await asyncio.wait_for(held, 60)
        assert answer.json() == {"decision": "allow"}
    row = await wait_status(a, run_id, {"completed", "failed"})
    assert row["status"] == "completed", row["status_reason"]
    assert row["result_summary"] == "Replay complete: 1 executed, 0 denied."
    evs = await events(b, run_id)
    assert types(evs).count("approval.decided") == 1 and types(evs).count("tool.decision") == 1


async def test_the_event_stream_on_one_api_sees_events_written_through_another(
    plane: Stack, apis: tuple[httpx.AsyncClient, httpx.AsyncClient]
) -> None:
    a, b = apis
    run_id = await start_run(a, await make_agent(a, IDLE), workspace=None)
    await wait_status(a, run_id, {"running"})
    seen: list[dict[str, Any]] = []

    async def read_stream() -> None:
        async with b.stream("GET", f"/v1/sessions/{run_id}/events/stream", timeout=None) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    seen.append(json.loads(line[6:]))

    # A listener of our own on the ledger's NOTIFY channel: a third process hears what A's transaction sent.
    hub = EventHub(plane.database_url or "")
    await hub.start()
    reader = asyncio.create_task(read_stream())
    try:
        await eventually(lambda: _has(seen, "session.created"), message="the stream on B did not start")
        control = await issue_token(plane.database_url or "", run_id, "control")
        with hub.subscribe(run_id) as moved:
            async with client_of(plane.api_urls[0], control) as runner_on_a:
                said = f"written through A {secrets.token_hex(4)}"
                post = {"body": {"type": "agent.message", "data": {"text": said}}}
                r = await runner_on_a.post(f"/internal/sessions/{run_id}/events", json=post)
                assert r.status_code == 200, r.text
                written = r.json()["seq"]
            await asyncio.wait_for(moved.wait(), 30)
        got = await eventually(
            lambda: _has(seen, "agent.message", text=said), message=lambda: f"B's stream never showed A's event: {seen}"
        )
        assert got["seq"] == written
        assert (await a.post(f"/v1/sessions/{run_id}/cancel")).json() == {"cancelled": True}
        await eventually(lambda: _has(seen, "session.status_changed", to="cancelled"), timeout=60)
        # What the stream on B delivered is exactly the ledger as A pages it: same order, no gap, no duplicate.
        ledger = await events(a, run_id)
        assert [e["seq"] for e in seen] == [e["seq"] for e in ledger][: len(seen)] == list(range(1, len(seen) + 1))
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
            await reader
        await hub.stop()


async def _has(seen: list[dict[str, Any]], kind: str, **data: Any) -> dict[str, Any] | None:
    for e in seen:
        if e["type"] == kind and all(e["payload"].get("data", {}).get(k) == v for k, v in data.items()):
            return e
    return None


async def test_sandbox_work_and_brokered_calls_run_on_their_own_task_queues(
    plane: Stack, apis: tuple[httpx.AsyncClient, httpx.AsyncClient], temporal: Client
) -> None:
    a, b = apis
    async with serve(basic()) as srv:
        run_id = await brokered_run(a, srv)
        row = await wait_status(b, run_id, {"completed", "failed"})
        assert row["status"] == "completed", row["status_reason"]
        assert row["result_summary"] == "Replay complete: 1 executed, 0 denied."
        assert srv.call_count("add") == 1
    queues = scheduled_queues(await history(temporal, run_id))
    assert queues["provision_run"] == {SANDBOX_QUEUE}
    assert queues["finalize_run"] == {SANDBOX_QUEUE}
    assert queues["broker_call"] == {BROKER_QUEUE}
    assert queues["begin_finalize"] == {plane.task_queue}


async def test_a_call_brokered_on_the_broker_queue_parks_and_resumes_there_once(
    plane: Stack, apis: tuple[httpx.AsyncClient, httpx.AsyncClient], temporal: Client
) -> None:
    a, b = apis
    old, new = "tok-" + secrets.token_hex(8), "tok-" + secrets.token_hex(8)
    async with serve(bearer(old)) as srv:
        made = await a.post(
            "/v1/connections",
            json={"provider": "mcp_http", "base_url": srv.url, "token": old, "access": {"read": True}},
        )
        assert made.status_code == 200, made.text
        connection_id = made.json()["connection"]["id"]
        policy = await make_policy(
            a,
            {
                "defaults": {"tool_action": "deny"},
                "tools": [{"match": ["mcp__*"], "action": "allow"}, {"match": ["Bash"], "action": "approve"}],
            },
        )
        steps = [
            {"tool": "mcp__calc__echo", "input": {"text": "one"}},
            {"tool": "Bash", "input": {"command": "./deploy.sh"}},
            {"tool": "mcp__calc__echo", "input": {"text": "two"}},
        ]
        requirement = {"slot": "calc", "connector": {"url": srv.url}, "required_tools": ["echo"]}
        agent = await make_agent(a, steps, policy=policy, connection_requirements=[requirement])
        run_id = await start_run(a, agent)
        pending = await wait_pending(a, run_id)
        srv.recorder.rotate_bearer(new)  # the second echo meets a credential the server stopped accepting
        await b.post(f"/v1/approvals/{pending['id']}/decision", json={"decision": "deny"})
        row = await wait_status(b, run_id, {"waiting_for_connection", "failed", "completed"})
        assert row["status"] == "waiting_for_connection", row["status_reason"]
        assert row["pending_action"]["connection_id"] == connection_id
        put = await b.put(f"/v1/connections/{connection_id}/credential", json={"token": new})
        assert put.status_code == 200, put.text
        done = await wait_status(a, run_id, {"completed", "failed"})
        assert done["status"] == "completed", done["status_reason"]
        assert srv.recorder.executions == ["echo", "echo"], "the parked call ran once"
    scheduled: dict[str, set[str]] = {}
    async for execution in temporal.list_workflows(f"WorkflowId = 'run-{run_id}'"):  # every continued run
        handle = temporal.get_workflow_handle(execution.id, run_id=execution.run_id)
        for name, on in scheduled_queues([e async for e in handle.fetch_history_events()]).items():
            scheduled.setdefault(name, set()).update(on)
    assert scheduled["broker_call"] == {BROKER_QUEUE}, "parked and resumed where it was brokered"


async def test_workers_started_for_some_roles_only_share_a_run_between_them(
    plane: Stack, apis: tuple[httpx.AsyncClient, httpx.AsyncClient], temporal: Client
) -> None:
    a, _ = apis
    general = [n for n in list(plane.procs) if n == "worker" or n.startswith("worker-")]
    for name in general:
        plane.stop_process(name)
    runs_only = plane.start_worker("worker-runs", queues="runs").pid
    sandbox_only = plane.start_worker("worker-sandbox", queues="sandbox").pid
    broker_only = plane.start_worker("worker-broker", queues="broker").pid
    try:
        async with serve(basic()) as srv:
            run_id = await brokered_run(a, srv)
            row = await wait_status(a, run_id, {"completed", "failed"}, timeout=120)
            assert row["status"] == "completed", row["status_reason"]
            assert srv.call_count("add") == 1
        evs = await history(temporal, run_id)
        by_activity = {
            scheduled.activity_task_scheduled_event_attributes.activity_type.name: started_by
            for scheduled, started_by in _activity_workers(evs)
        }
        assert by_activity["provision_run"] == by_activity["finalize_run"] == sandbox_only
        assert by_activity["broker_call"] == broker_only
        assert by_activity["begin_finalize"] == runs_only
        tasks = {
            _pid(e.workflow_task_completed_event_attributes.identity)
            for e in evs
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
        }
        assert tasks == {runs_only}
    finally:
        for name in ("worker-runs", "worker-sandbox", "worker-broker"):
            plane.stop_process(name)
        for name in general:
            plane.start_worker(name)


def _pid(identity: str) -> int:
    return int(identity.split("@", 1)[0])


def _activity_workers(evs: list[Any]) -> list[tuple[Any, int]]:
    """(the ActivityTaskScheduled event, the pid of the worker that started it) for every activity."""
    scheduled = {e.event_id: e for e in evs if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED}
    return [
        (scheduled[e.activity_task_started_event_attributes.scheduled_event_id],
         _pid(e.activity_task_started_event_attributes.identity))
        for e in evs
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
    ]  # fmt: skip


async def brokered_run(api: httpx.AsyncClient, srv: RunningServer) -> str:
    """A run whose one step is a brokered call of ``add`` on ``srv`` (connected first)."""
    r = await api.post(
        "/v1/connections",
        json={"provider": "mcp_http", "base_url": srv.url, "token": "tok-x", "access": {"read": True}},
    )
    assert r.status_code == 200, r.text
    policy = await make_policy(
        api, {"defaults": {"tool_action": "deny"}, "tools": [{"match": ["mcp__*"], "action": "allow"}]}
    )
    agent = await make_agent(
        api,
        [{"tool": "mcp__calc__add", "input": {"a": 2, "b": 3}}],
        policy=policy,
        connection_requirements=[{"slot": "calc", "connector": {"url": srv.url}, "required_tools": ["add"]}],
    )
    return await start_run(api, agent)


async def test_an_oauth_flow_started_on_one_api_completes_on_another(
    plane: Stack, apis: tuple[httpx.AsyncClient, httpx.AsyncClient], auth: AuthorizationServer, mcp: RunningServer
) -> None:
    a, _ = apis
    a_url, b_url = plane.api_urls
    connection = await create(a, mcp.url)
    r = await a.post(f"/v1/connections/{connection['id']}/oauth/start")
    assert r.status_code == 200, r.text
    go_url = r.json()["go_url"]
    assert go_url.startswith(a_url + "/")
    # The load balancer sends the browser's two requests to B: the flow, its verifier and its browser binding
    # live in PostgreSQL, not in the process that started the flow.
    async with browser_client() as browser:
        go = await browser.get(b_url + go_url.removeprefix(a_url))
        assert go.status_code == 302, go.text
        landed = await auth.sign_in(go.headers["location"])
        assert landed.startswith(f"{a_url}/v1/oauth/callback?"), landed
        page = await browser.get(b_url + landed.removeprefix(a_url))
        assert page.status_code == 200, page.text
        assert "Connected" in page.text
        # The same browser replaying the callback on A is refused: the flow was claimed once, in the database.
        again = await browser.get(landed)
        assert (again.status_code, again.json()["code"]) == (409, "conflict"), again.text
        assert again.json()["error"] == "this sign-in was already completed; start the connection again"
    row = (await a.get(f"/v1/connections/{connection['id']}")).json()["connection"]
    assert row["status"] == "active"


async def test_killing_the_worker_that_holds_a_run_loses_nothing(
    plane: Stack, apis: tuple[httpx.AsyncClient, httpx.AsyncClient], temporal: Client
) -> None:
    a, b = apis
    run_id = await start_run(a, await make_agent(a, [*DEPLOY, {"say": "after the deploy"}]))
    pending = await wait_pending(a, run_id)
    # The worker that completed the run's last workflow task holds it (its cached state, its sticky queue).
    identities = [
        e.workflow_task_completed_event_attributes.identity
        for e in await history(temporal, run_id)
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    ]
    holder = worker_names_by_pid(plane)[int(identities[-1].split("@", 1)[0])]
    survivor = next(iter(set(worker_names_by_pid(plane).values()) - {holder}))
    plane.kill_process(holder)
    try:
        r = await b.post(f"/v1/approvals/{pending['id']}/decision", json={"decision": "approve"})
        assert r.status_code == 200, r.text
        row = await wait_status(a, run_id, {"completed", "failed"}, timeout=120)
        assert row["status"] == "completed", row["status_reason"]
        assert row["result_summary"] == "Replay complete: 1 executed, 0 denied."
        evs = await events(b, run_id)
        assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1))
        for kind in ("tool.requested", "approval.requested", "approval.decided", "tool.decision", "run.result"):
            assert types(evs).count(kind) == 1, kind
        diff = (await b.get(f"/v1/sessions/{run_id}/outputs")).json()["diff"]
        assert diff.count("+deployed") == 1
        # The run was finished by the other worker.
        survivor_pid = plane.procs[survivor].pid
        finished_by = {
            e.activity_task_started_event_attributes.identity
            for e in await history(temporal, run_id)
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
        }
        assert any(identity.startswith(f"{survivor_pid}@") for identity in finished_by)
    finally:
        plane.start_worker(holder)
