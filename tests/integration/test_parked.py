"""Runs that wait for a connection (``waiting_for_connection``), end to end on the real stack.

Real MCP servers (tests/mcp_servers.py) count what reaches them, so "the parked call runs exactly once" is
checked where it matters: at the server. OAuth sign-ins go through the real oidc-provider.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import httpx
import pytest
from temporalio.client import Client

from cli.stack import Stack
from contracts.temporal import CONNECTION_READY_SIGNAL, workflow_id
from tests.helpers import eventually
from tests.integration.conftest import FAST
from tests.integration.helpers import DEMO_REPO, events, make_agent, make_policy, types, wait_pending, wait_status
from tests.integration.test_broker import BROKER_POLICY, connect, requirement
from tests.integration.test_oauth_connections import COOKIE, browser_client, create
from tests.mcp_servers import RunningServer, basic, bearer, serve
from tests.oauth_servers import AuthorizationServer

pytestmark = pytest.mark.stack

ADD = [{"tool": "mcp__calc__add", "input": {"a": 2, "b": 3}}]
# A pause point (the Bash approval) between two brokered calls: the connection changes while the run waits there.
ECHO_PAUSE_ECHO = [
    {"tool": "mcp__calc__echo", "input": {"text": "one"}},
    {"tool": "Bash", "input": {"command": "./deploy.sh"}},
    {"tool": "mcp__calc__echo", "input": {"text": "two"}},
]


@pytest.fixture
async def browser() -> Any:
    async with browser_client() as client:
        yield client


async def start(api: httpx.AsyncClient, agent: str) -> dict[str, Any]:
    r = await api.post(
        "/v1/sessions",
        json={"agent": agent, "task": "t", "workspace": {"kind": "local_copy", "path": str(DEMO_REPO)}},
    )
    assert r.status_code == 200, r.text
    return dict(r.json()["session"])


def echoed(srv: RunningServer, text: str) -> int:
    return sum(1 for tool, args in srv.recorder.calls if tool == "echo" and args.get("text") == text)


async def visible_in_temporal(stack: Stack, run_id: str, status: str) -> None:
    """The run's workflow is listed by the RunStatus search attribute (what the Temporal UI filters on)."""
    client = await Client.connect(stack.temporal_address or "", namespace="default")

    async def listed() -> bool:
        query = f"RunStatus = '{status}' AND WorkflowId = '{workflow_id(run_id)}'"
        return any([w async for w in client.list_workflows(query)])

    await eventually(listed, timeout=30, message=f"run {run_id} not visible as {status} in Temporal")


async def echo_pause_echo(api: httpx.AsyncClient, srv: RunningServer) -> tuple[str, dict[str, Any]]:
    """A run bound to ``srv`` that has made its first echo and waits on the approval before its second;
    returns (run id, that pending approval)."""
    agent = await make_agent(
        api, ECHO_PAUSE_ECHO, policy=await make_policy(api, BROKER_POLICY),
        connection_requirements=[requirement(srv.url, ["echo"])],
    )  # fmt: skip
    run_id = (await start(api, agent))["id"]
    return run_id, await wait_pending(api, run_id)


async def parked_mid_run(api: httpx.AsyncClient, srv: RunningServer) -> tuple[str, str]:
    """A run whose second echo parks on its revoked connection; returns (run id, connection id)."""
    created = await connect(api, srv.url, "tok-" + secrets.token_hex(8))
    connection_id = created["connection"]["id"]
    run_id, pending = await echo_pause_echo(api, srv)
    assert (await api.post(f"/v1/connections/{connection_id}/revoke")).status_code == 200
    await api.post(f"/v1/approvals/{pending['id']}/decision", json={"decision": "deny"})
    row = await wait_status(api, run_id, {"waiting_for_connection"})
    action = row["pending_action"]
    assert action["type"] == "mcp_connect" and action["slot"] == "calc"
    assert action["connection_id"] == connection_id and action["reason"] == "the bound connection is revoked"
    assert action["tool_call_id"] and action["expires_at"]
    required = [e["payload"]["data"] for e in await events(api, run_id) if e["type"] == "authorization.required"]
    assert len(required) == 1 and required[0]["tool"] == "mcp__calc__echo"
    assert required[0]["challenge"] == f"/v1/connections/authorize?connection={connection_id}"
    assert echoed(srv, "one") == 1 and echoed(srv, "two") == 0
    return run_id, connection_id


async def test_a_run_without_its_connection_parks_before_provisioning_and_runs_once_one_is_added(
    api: httpx.AsyncClient, stack: Stack
) -> None:
    async with serve(basic()) as srv:
        agent = await make_agent(
            api,
            ADD,
            policy=await make_policy(api, BROKER_POLICY),
            connection_requirements=[requirement(srv.url, ["add"])],
        )
        row = await start(api, agent)
        assert row["status"] == "waiting_for_connection"
        action = row["pending_action"]
        assert action["type"] == "mcp_connect" and action["slot"] == "calc" and action["connection_id"] is None
        assert action["reason"] == f"no connection to {srv.url} exists yet" and action["expires_at"]
        run_id = row["id"]
        listed = (await api.get("/v1/sessions", params={"status": "waiting_for_connection"})).json()["sessions"]
        assert run_id in [s["id"] for s in listed]
        bad = await api.get("/v1/sessions", params={"status": "napping"})
        assert bad.status_code == 400 and "unknown status 'napping'" in bad.json()["error"]
        await visible_in_temporal(stack, run_id, "waiting_for_connection")
        detail = (await api.get(f"/v1/sessions/{run_id}")).json()
        # Nothing provisioned, nothing spent, no binding frozen while it waits.
        assert detail["session"]["sandbox_handle"] is None and detail["usage"]["requests"] == 0
        assert detail["session"]["run_spec"]["brokered"] == []
        assert types(await events(api, run_id)).count("connection.required") == 1
        await connect(api, srv.url, "tok-" + secrets.token_hex(8))
        done = await wait_status(api, run_id, {"completed", "failed"})
        assert done["status"] == "completed", done["status_reason"]
        assert done["pending_action"] is None
        assert srv.call_count("add") == 1
        assert [b["slot"] for b in done["run_spec"]["brokered"]] == ["calc"]
        evs = await events(api, run_id)
        statuses = [(e["payload"]["data"]["from"], e["payload"]["data"]["to"]) for e in evs
                    if e["type"] == "session.status_changed"]  # fmt: skip
        assert statuses[:3] == [
            ("created", "waiting_for_connection"),
            ("waiting_for_connection", "created"),
            ("created", "provisioning"),
        ]


async def test_an_up_front_park_on_an_oauth_connection_resumes_after_sign_in_and_authorize_reuses_its_flow(
    api: httpx.AsyncClient, auth: AuthorizationServer, mcp: RunningServer, browser: httpx.AsyncClient
) -> None:
    connection = await create(api, mcp.url)
    agent = await make_agent(
        api, ADD, policy=await make_policy(api, BROKER_POLICY), connection_requirements=[requirement(mcp.url, ["add"])]
    )
    row = await start(api, agent)
    assert row["status"] == "waiting_for_connection"
    assert row["pending_action"]["connection_id"] == connection["id"]
    assert row["pending_action"]["reason"] == "the connection is not authorized yet"
    first = await api.get("/v1/connections/authorize", params={"connection": connection["id"]})
    assert first.status_code == 200, first.text
    again = await api.get("/v1/connections/authorize", params={"connection": connection["id"]})
    assert first.json()["status"] == "authorize" and again.json() == first.json(), "a pending flow is reused"
    go = await browser.get(first.json()["url"])
    assert go.status_code == 302 and browser.cookies.get(COOKIE)
    page = await browser.get(await auth.sign_in(go.headers["location"]))
    assert page.status_code == 200 and "Connected" in page.text
    done = await wait_status(api, row["id"], {"completed", "failed"})
    assert done["status"] == "completed", done["status_reason"]
    assert mcp.call_count("add") >= 1
    polled = await api.get("/v1/connections/authorize", params={"connection": connection["id"]})
    assert polled.json() == {"status": "connected", "connection_id": connection["id"]}


async def test_a_call_parked_on_a_revoked_credential_runs_exactly_once_when_wakes_fire_twice(
    api: httpx.AsyncClient, stack: Stack
) -> None:
    token = "tok-" + secrets.token_hex(8)
    async with serve(basic()) as srv:
        run_id, connection_id = await parked_mid_run(api, srv)
        await visible_in_temporal(stack, run_id, "waiting_for_connection")
        # Two credential replacements at once (two wakes, and the second moves the generation again), plus two
        # raw signals: the parked call still reaches the server exactly once.
        puts = await asyncio.gather(
            *(api.put(f"/v1/connections/{connection_id}/credential", json={"token": token}) for _ in range(2))
        )
        assert [p.status_code for p in puts] == [200, 200], [p.text for p in puts]
        assert puts[0].json()["connection"]["status"] == "active" and token not in puts[0].text
        client = await Client.connect(stack.temporal_address or "", namespace="default")
        for _ in range(2):
            await client.get_workflow_handle(workflow_id(run_id)).signal(CONNECTION_READY_SIGNAL)
        row = await wait_status(api, run_id, {"completed", "failed"})
        assert row["status"] == "completed", row["status_reason"]
        assert row["result_summary"].startswith("Replay complete: 2 executed, 1 denied.")
        assert echoed(srv, "two") == 1
        evs = await events(api, run_id)
        brokered = [e["payload"]["data"] for e in evs if e["type"] == "tool.brokered"]
        assert [b["outcome"] for b in brokered] == ["succeeded", "succeeded"]
        assert types(evs).count("connection.resumed") == 1


async def test_a_parked_call_runs_exactly_once_when_the_worker_dies_between_the_wake_and_the_call(
    api: httpx.AsyncClient, stack: Stack
) -> None:
    async with serve(basic()) as srv:
        run_id, connection_id = await parked_mid_run(api, srv)
        stack.kill_process("worker")
        try:
            r = await api.put(f"/v1/connections/{connection_id}/credential", json={"token": "tok-new"})
            assert r.status_code == 200, r.text  # the signal is in the history; no worker has acted on it
            assert echoed(srv, "two") == 0
        finally:
            stack.start_worker()
        row = await wait_status(api, run_id, {"completed", "failed"}, timeout=90)
        assert row["status"] == "completed", row["status_reason"]
        assert echoed(srv, "two") == 1


async def test_a_park_that_expires_ends_the_run_with_the_reason(api: httpx.AsyncClient) -> None:
    async with serve(basic()) as srv:
        agent = await make_agent(
            api, ADD, policy=await make_policy(api, BROKER_POLICY),
            connection_requirements=[requirement(srv.url, ["add"])], budgets={"max_park_secs": 2},
        )  # fmt: skip
        row = await start(api, agent)
        assert row["status"] == "waiting_for_connection"
        done = await wait_status(api, row["id"], {"failed", "completed", "cancelled"})
        assert done["status"] == "failed"
        assert done["status_reason"].startswith("waited for a connection for slot 'calc' until the park expired")
        assert f"no connection to {srv.url} exists yet" in done["status_reason"]
        assert done["pending_action"] is None and srv.call_count() == 0


async def test_a_parked_run_can_be_cancelled(api: httpx.AsyncClient) -> None:
    async with serve(basic()) as srv:
        agent = await make_agent(
            api,
            ADD,
            policy=await make_policy(api, BROKER_POLICY),
            connection_requirements=[requirement(srv.url, ["add"])],
        )
        row = await start(api, agent)
        assert row["status"] == "waiting_for_connection"
        r = await api.post(f"/v1/sessions/{row['id']}/cancel")
        assert r.status_code == 200 and r.json() == {"cancelled": True}
        done = await wait_status(api, row["id"], {"cancelled", "failed", "completed"})
        assert done["status"] == "cancelled" and done["pending_action"] is None
        # Connecting afterwards wakes nothing: the run stays cancelled and nothing is called.
        await connect(api, srv.url, "tok-" + secrets.token_hex(8))
        assert srv.call_count() == 0


async def test_a_requirement_that_says_fail_keeps_refusing_the_run(api: httpx.AsyncClient) -> None:
    async with serve(basic()) as srv:
        req = {**requirement(srv.url, ["add"]), "when_unavailable": "fail"}
        agent = await make_agent(api, ADD, connection_requirements=[req])
        r = await api.post("/v1/sessions", json={"agent": agent, "task": "t"})
        assert r.status_code == 400 and "cannot be bound" in r.json()["error"]


async def test_environment_credentials_are_configuration_and_a_missing_one_is_named(
    api: httpx.AsyncClient,
) -> None:
    async with serve(bearer(FAST["PARKTEST_MCP_TOKEN"])) as srv:
        r = await api.post(
            "/v1/connections",
            json={
                "provider": "mcp_http",
                "base_url": srv.url,
                "credential_env": "PARKTEST_MCP_TOKEN",
                "access": {"read": True},
            },
        )
        assert r.status_code == 200, r.text
        assert FAST["PARKTEST_MCP_TOKEN"] not in r.text
        connection_id = r.json()["connection"]["id"]
        polled = await api.get("/v1/connections/authorize", params={"connection": connection_id})
        assert polled.json() == {"status": "connected", "connection_id": connection_id}
        agent = await make_agent(
            api,
            ADD,
            policy=await make_policy(api, BROKER_POLICY),
            connection_requirements=[requirement(srv.url, ["add"])],
        )
        done = await wait_status(api, (await start(api, agent))["id"], {"completed", "failed"})
        assert done["status"] == "completed" and srv.call_count("add") == 1
        missing = await api.post(
            "/v1/connections",
            json={"provider": "mcp_http", "base_url": srv.url, "credential_env": "PARKTEST_ABSENT_MCP_TOKEN"},
        )
        assert missing.status_code == 409
        assert missing.json() == {
            "error": "Missing PARKTEST_ABSENT_MCP_TOKEN",
            "code": "conflict",
            "status": "unavailable",
            "reason": "Missing PARKTEST_ABSENT_MCP_TOKEN",
        }
    catalog = await api.get("/v1/connections/authorize", params={"connection": "sentry"})
    assert catalog.status_code == 409 and catalog.json()["reason"] == "Missing SENTRY_MCP_TOKEN"
    own = await api.post(
        "/v1/connections",
        json={
            "provider": "mcp_http",
            "base_url": "http://127.0.0.1:9/mcp",
            "credential_env": "FLUIDBOX_CREDENTIAL_KEY",
        },
    )
    assert own.status_code == 400, "the control plane's own secrets are never a connection credential"


async def test_authorize_answers_unavailable_with_the_reason(api: httpx.AsyncClient) -> None:
    async with serve(basic()) as srv:
        created = await connect(api, srv.url, "tok-" + secrets.token_hex(8))
        connection_id = created["connection"]["id"]
        ok = await api.get("/v1/connections/authorize", params={"connection": connection_id})
        assert ok.json() == {"status": "connected", "connection_id": connection_id}
        await api.post(f"/v1/connections/{connection_id}/revoke")
        revoked = await api.get("/v1/connections/authorize", params={"connection": connection_id})
        assert revoked.status_code == 409 and revoked.json()["status"] == "unavailable"
        assert "has no sign-in to start" in revoked.json()["reason"]
    personal = await api.get("/v1/connections/authorize", params={"connection": "linear", "owner": "personal"})
    assert personal.status_code == 409
    assert personal.json()["reason"] == "a personal connection needs a signed-in user; the operator token has none"
    unknown = await api.get("/v1/connections/authorize", params={"connection": "no-such-entry"})
    assert unknown.status_code == 404


async def test_a_subscription_chooses_whether_its_runs_park_and_fail_is_the_default(api: httpx.AsyncClient) -> None:
    async with serve(basic()) as srv, httpx.AsyncClient(base_url=str(api.base_url), timeout=60) as anon:
        agent = await make_agent(
            api,
            ADD,
            policy=await make_policy(api, BROKER_POLICY),
            connection_requirements=[requirement(srv.url, ["add"])],
        )
        outcomes: dict[str, Any] = {}
        for choice in ("fail", "park", None):
            body: dict[str, Any] = {"agent": agent, "name": f"sub-{secrets.token_hex(4)}", "task_template": "go"}
            if choice is not None:
                body["when_unavailable"] = choice
            made = (await api.post("/v1/triggers", json=body)).json()
            assert made["subscription"]["when_unavailable"] == (choice or "fail")
            r = await anon.post(
                f"/v1/triggers/{made['subscription']['id']}/invoke",
                json={},
                headers={"authorization": f"Bearer {made['token']}"},
            )
            outcomes[str(choice)] = r
        assert outcomes["fail"].status_code == 400 and "cannot be bound" in outcomes["fail"].json()["error"]
        assert outcomes["None"].status_code == 400, "a subscription's runs fail by default, as before"
        assert outcomes["park"].status_code == 200, outcomes["park"].text
        run_id = outcomes["park"].json()["session_id"]
        row = await wait_status(api, run_id, {"waiting_for_connection"})
        assert row["pending_action"]["slot"] == "calc"
        await api.post(f"/v1/sessions/{run_id}/cancel")
        await wait_status(api, run_id, {"cancelled"})


async def test_a_static_credential_the_server_stops_accepting_parks_the_call_until_a_new_one_is_supplied(
    api: httpx.AsyncClient,
) -> None:
    old, new = "tok-" + secrets.token_hex(8), "tok-" + secrets.token_hex(8)
    async with serve(bearer(old)) as srv:
        connection_id = (await connect(api, srv.url, old))["connection"]["id"]
        run_id, pending = await echo_pause_echo(api, srv)
        assert srv.executions == ["echo"], "the first echo ran with the credential the server still accepted"
        # The token is rotated upstream while the run waits: the second echo's tools/call is answered 401.
        srv.recorder.rotate_bearer(new)
        await api.post(f"/v1/approvals/{pending['id']}/decision", json={"decision": "deny"})
        row = await wait_status(api, run_id, {"waiting_for_connection", "failed", "completed"})
        assert row["status"] == "waiting_for_connection", row["status_reason"]
        rejected = "the server rejected the bound connection's credential (HTTP 401); supply a new one"
        action = row["pending_action"]
        assert action["connection_id"] == connection_id and action["reason"] == rejected and action["tool_call_id"]
        required = [e["payload"]["data"] for e in await events(api, run_id) if e["type"] == "authorization.required"]
        assert len(required) == 1 and required[0]["tool"] == "mcp__calc__echo"
        assert required[0]["connection_id"] == connection_id and required[0]["reason"] == rejected
        assert required[0]["challenge"] == f"/v1/connections/authorize?connection={connection_id}"
        assert ("POST", 401) in srv.recorder.http_requests and srv.executions == ["echo"], "refused, not run"
        shown = (await api.get(f"/v1/connections/{connection_id}")).json()["connection"]
        assert shown["status"] == "error", "the dead credential is not sent again, by this run or any other"
        r = await api.put(f"/v1/connections/{connection_id}/credential", json={"token": new})
        assert r.status_code == 200, r.text
        done = await wait_status(api, run_id, {"completed", "failed"})
        assert done["status"] == "completed", done["status_reason"]
        assert done["pending_action"] is None
        assert srv.executions == ["echo", "echo"] and echoed(srv, "two") == 2, srv.recorder.http_requests
        evs = await events(api, run_id)
        brokered = [e["payload"]["data"] for e in evs if e["type"] == "tool.brokered"]
        assert [b["outcome"] for b in brokered] == ["succeeded", "succeeded"], "the parked call ran exactly once"
        assert types(evs).count("connection.resumed") == 1
        assert old not in str(evs) and new not in str(evs)
