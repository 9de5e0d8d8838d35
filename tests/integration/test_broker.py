"""Connections and brokered MCP tools end to end, against real MCP servers started by the tests.

The canary is the upstream credential: it must never appear in a response, the ledger, a RunSpec,
a log line or a sandbox.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.stack import Stack
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
from tests.mcp_servers import basic, bearer, changing, serve

pytestmark = pytest.mark.stack

BROKER_POLICY: dict[str, Any] = {
    "defaults": {"tool_action": "deny"},
    "tools": [
        {"match": ["mcp__calc__fail"], "action": "deny", "risk": "never fail on purpose"},
        {"match": ["mcp__*"], "action": "allow"},
        {"match": ["Bash"], "action": "approve"},
    ],
}


def requirement(url: str, tools: list[str], slot: str = "calc") -> dict[str, Any]:
    return {"slot": slot, "connector": {"url": url}, "required_tools": tools}


async def connect(api: httpx.AsyncClient, url: str, token: str) -> dict[str, Any]:
    r = await api.post(
        "/v1/connections", json={"provider": "mcp_http", "access": {"read": True}, "base_url": url, "token": token}
    )
    assert r.status_code == 200, r.text
    assert token not in r.text
    return dict(r.json())


async def idle_bound_run(api: httpx.AsyncClient, url: str, tools: list[str]) -> str:
    """Connect ``url``, then start an idle run whose agent requires ``tools`` from it; wait until running."""
    await connect(api, url, "tok-" + secrets.token_hex(8))
    agent = await make_agent(
        api, [{"sleep_ms": 600000}], policy=await make_policy(api, BROKER_POLICY),
        connection_requirements=[requirement(url, tools)],
    )  # fmt: skip
    run_id = await start_run(api, agent)
    await wait_status(api, run_id, {"running"})
    return run_id


async def plant_claimed(
    api: httpx.AsyncClient, stack: Stack, run_id: str, body: dict[str, Any], minutes_ago: int
) -> tuple[uuid.UUID, str, str]:
    """A ``claimed`` execution claim for ``body`` on the run's first binding, taken ``minutes_ago`` by the
    database's clock: what a dispatcher that is still working, or that died after claiming, leaves behind.
    Returns the claim's key (session, tool_call_id, input digest)."""
    from core.digests import input_digest
    from db.engine import create_pool

    binding_id = (await api.get(f"/v1/sessions/{run_id}")).json()["session"]["run_spec"]["brokered"][0]["binding_id"]
    key = (uuid.UUID(run_id), str(body["tool_call_id"]), input_digest(body["tool"], body["input"]))
    pool = await create_pool(stack.database_url or "", min_size=1, max_size=1)
    try:
        async with pool.acquire() as conn:
            await conn.execute(
                "INSERT INTO tool_execution_claims (session_id, tool_call_id, input_digest, binding_id, tool,"
                " input, state, attempts, claimed_at) VALUES ($1, $2, $3, $4, $5, $6, 'claimed', 1,"
                " now() - make_interval(mins => $7))",
                *key, uuid.UUID(binding_id), body["tool"], body["input"], minutes_ago,
            )  # fmt: skip
    finally:
        await pool.close()
    return key


def assert_no_canary(canary: str, *texts: str) -> None:
    for text in texts:
        assert canary not in text


async def test_a_brokered_call_runs_in_the_control_plane_and_the_credential_never_leaks(
    api: httpx.AsyncClient, stack: Stack
) -> None:
    canary = "canary-" + secrets.token_hex(16)
    async with serve(bearer(canary)) as srv:
        created = await connect(api, srv.url, canary)
        assert created["connection"]["status"] == "active" and created["snapshot"]["version"] == 1
        assert {t["name"] for t in created["snapshot"]["tools"]} >= {"add", "echo", "fail"}
        script = [
            {"tool": "mcp__calc__add", "input": {"a": 2, "b": 3}},
            {"tool": "mcp__calc__fail", "input": {"text": "x"}},
        ]
        agent = await make_agent(
            api, script, policy=await make_policy(api, BROKER_POLICY),
            connection_requirements=[requirement(srv.url, ["add", "fail"])],
        )  # fmt: skip
        run_id = await start_run(api, agent)
        row = await wait_status(api, run_id, {"completed", "failed"})
        assert row["result_summary"] == "Replay complete: 1 executed, 1 denied."
        assert srv.call_count("add") == 1 and srv.call_count("fail") == 0, "a policy deny sends nothing upstream"
        evs = await events(api, run_id)
        said = [e["payload"]["data"]["text"] for e in evs if e["type"] == "agent.message"]
        assert "mcp__calc__add → 5" in said
        brokered = [e["payload"]["data"] for e in evs if e["type"] == "tool.brokered"]
        assert len(brokered) == 1 and brokered[0]["outcome"] == "succeeded" and brokered[0]["ok"] is True
        assert brokered[0]["result_digest"].startswith("sha256:") and "result" not in brokered[0]
        surface = row["run_spec"]["brokered"][0]
        assert [t["name"] for t in surface["tools"]] == ["add", "fail"], "only the required tools are frozen"
        listed = (await api.get("/v1/connections")).text
        detail = (await api.get(f"/v1/connections/{created['connection']['id']}")).text
        logs = "".join(p.read_text(errors="replace") for p in Path(stack.logs).glob("*.log"))
        sandbox_logs = "".join(p.read_text(errors="replace") for p in (stack.home / "runs").glob("*/sandbox.log"))
        assert_no_canary(canary, listed, detail, json.dumps(evs), json.dumps(row), logs, sandbox_logs)


async def test_a_rejected_credential_rolls_everything_back(api: httpx.AsyncClient) -> None:
    async with serve(bearer("right-token")) as srv:
        before = (await api.get("/v1/connections")).json()["connections"]
        r = await api.post(
            "/v1/connections",
            json={"provider": "mcp_http", "access": {"read": True}, "base_url": srv.url, "token": "wrong-token"},
        )
        assert r.status_code == 400 and r.json()["error"].startswith(
            "the server rejected this credential (connection rolled back)"
        )
        assert "wrong-token" not in r.text
        assert (await api.get("/v1/connections")).json()["connections"] == before
    for url, message in [
        ("http://10.1.2.3/mcp", "private"),
        ("http://169.254.169.254/latest", "169.254.169.254"),
        ("ftp://example.com/x", "ftp"),
    ]:
        r = await api.post(
            "/v1/connections", json={"provider": "mcp_http", "access": {"read": True}, "base_url": url, "token": "t"}
        )
        assert r.status_code == 400 and message in r.json()["error"], r.text
    r = await api.post("/v1/connections", json={"provider": "slack", "base_url": "https://x", "token": "t"})
    assert r.status_code == 400 and r.json()["error"].startswith("unsupported provider 'slack' (supported: mcp_http")


async def test_an_unbindable_requirement_refuses_the_run_before_anything_starts(api: httpx.AsyncClient) -> None:
    async with serve(basic()) as srv:
        await connect(api, srv.url, "tok-" + secrets.token_hex(8))
        agent = await make_agent(
            api, [{"say": "hi"}], connection_requirements=[requirement(srv.url, ["add", "no_such_tool"])]
        )
        r = await api.post("/v1/sessions", json={"agent": agent, "task": "t"})
        assert r.status_code == 400 and "cannot be bound" in r.json()["error"]


async def test_duplicate_and_concurrent_brokered_calls_execute_upstream_exactly_once(
    api: httpx.AsyncClient, stack: Stack
) -> None:
    async with serve(basic()) as srv:
        run_id = await idle_bound_run(api, srv.url, ["add", "drop_connection"])
        token = await issue_token(stack.database_url or "", run_id, "tool")
        async with httpx.AsyncClient(
            base_url=stack.api_url, headers={"authorization": f"Bearer {token}"}, timeout=60
        ) as runner:
            body = {"tool_call_id": "dup-1", "tool": "mcp__calc__add", "input": {"a": 20, "b": 22}}
            answers = await asyncio.gather(
                *[runner.post(f"/internal/sessions/{run_id}/tools/call", json=body) for _ in range(5)]
            )
            texts = {a.text for a in answers}
            assert len(texts) == 1, "duplicates get byte-identical answers"
            assert answers[0].json()["ok"] is True and srv.call_count("add") == 1
            again = await runner.post(f"/internal/sessions/{run_id}/tools/call", json=body)
            assert again.text == answers[0].text and srv.call_count("add") == 1
            # An ambiguous outcome (the connection died after the request was sent) is never re-sent.
            drop = {"tool_call_id": "amb-1", "tool": "mcp__calc__drop_connection", "input": {}}
            first = (await runner.post(f"/internal/sessions/{run_id}/tools/call", json=drop)).json()
            second = (await runner.post(f"/internal/sessions/{run_id}/tools/call", json=drop)).json()
            assert first == second == {"ok": False, "error": "brokered call outcome ambiguous — not retried"}
            assert srv.executions.count("drop_connection") == 1
            # Arguments that break the frozen schema are denied before anything is sent.
            bad = {"tool_call_id": "bad-1", "tool": "mcp__calc__add", "input": {"a": "two"}}
            denied = (await runner.post(f"/internal/sessions/{run_id}/tools/call", json=bad)).json()
            assert denied["ok"] is False and denied["denied"] is True
            assert denied["message"].startswith("arguments rejected by frozen schema")
            assert srv.call_count("add") == 1
        await api.post(f"/v1/sessions/{run_id}/cancel")
        await wait_status(api, run_id, {"cancelled"})


async def test_sequential_brokered_calls_ride_one_kept_open_upstream_session(
    api: httpx.AsyncClient, stack: Stack
) -> None:
    async with serve(basic()) as srv:
        run_id = await idle_bound_run(api, srv.url, ["add"])
        token = await issue_token(stack.database_url or "", run_id, "tool")
        async with httpx.AsyncClient(
            base_url=stack.api_url, headers={"authorization": f"Bearer {token}"}, timeout=60
        ) as runner:
            for i in range(4):
                body = {"tool_call_id": f"kept-{i}", "tool": "mcp__calc__add", "input": {"a": i, "b": 1}}
                answer = (await runner.post(f"/internal/sessions/{run_id}/tools/call", json=body)).json()
                assert answer["ok"] is True and answer["result"]["content"][0]["text"] == str(i + 1)
        # The connection's photograph opened one session at connect time; the four calls shared one more.
        assert srv.methods.count("initialize") == 2
        assert srv.executions.count("add") == 4
        await api.post(f"/v1/sessions/{run_id}/cancel")
        await wait_status(api, run_id, {"cancelled"})


async def test_revoking_a_connection_mid_run_fails_the_next_call_closed(api: httpx.AsyncClient) -> None:
    async with serve(basic()) as srv:
        created = await connect(api, srv.url, "tok-" + secrets.token_hex(8))
        script = [
            {"tool": "mcp__calc__echo", "input": {"text": "one"}},
            {"tool": "Bash", "input": {"command": "./deploy.sh"}},
            {"tool": "mcp__calc__echo", "input": {"text": "two"}},
        ]
        # ``fail``: the call is refused at once (the default for API runs parks it: tests/integration/test_parked.py).
        agent = await make_agent(
            api, script, policy=await make_policy(api, BROKER_POLICY),
            connection_requirements=[{**requirement(srv.url, ["echo"]), "when_unavailable": "fail"}],
        )  # fmt: skip
        run_id = await start_run(api, agent)
        pending = await wait_pending(api, run_id)
        r = await api.post(f"/v1/connections/{created['connection']['id']}/revoke")
        assert r.status_code == 200 and r.json()["connection"]["status"] == "revoked"
        again = await api.post(f"/v1/connections/{created['connection']['id']}/revoke")
        assert (again.status_code, again.json()) == (
            409,
            {"error": "connection is already revoked", "code": "conflict"},
        )
        await api.post(f"/v1/approvals/{pending['id']}/decision", json={"decision": "deny"})
        row = await wait_status(api, run_id, {"completed", "failed"})
        assert row["result_summary"].startswith("Replay complete: 1 executed, 2 denied.")
        assert srv.call_count("echo") == 1
        refused = [
            e["payload"]["data"] for e in await events(api, run_id)
            if e["type"] == "tool.decision" and e["payload"]["data"]["source"] == "binding"
        ]  # fmt: skip
        assert refused and refused[0]["reason"] == "the bound connection is revoked"


async def test_refresh_gives_new_runs_the_new_snapshot_while_a_running_one_keeps_its_own(
    api: httpx.AsyncClient,
) -> None:
    async with serve(changing()) as srv:
        created = await connect(api, srv.url, "tok-" + secrets.token_hex(8))
        cid = created["connection"]["id"]
        first_tools = {t["name"] for t in created["snapshot"]["tools"]}
        assert srv.registry is not None
        srv.registry.add("brand_new", "a new tool")
        r = await api.post(f"/v1/connections/{cid}/tools/refresh")
        assert r.status_code == 200, r.text
        refreshed = r.json()["snapshot"]
        assert refreshed["version"] == 2 and {t["name"] for t in refreshed["tools"]} == first_tools | {"brand_new"}
        assert (await api.get(f"/v1/connections/{cid}/tools")).json()["snapshot"]["version"] == 2
        tool = sorted(first_tools)[0]
        agent = await make_agent(
            api, [{"sleep_ms": 600000}], policy=await make_policy(api, BROKER_POLICY),
            connection_requirements=[requirement(srv.url, [tool])],
        )  # fmt: skip
        run_id = await start_run(api, agent)
        spec = (await api.get(f"/v1/sessions/{run_id}")).json()["session"]["run_spec"]
        assert spec["brokered"][0]["snapshot_version"] == 2
        srv.registry.add("later", "added later")
        await api.post(f"/v1/connections/{cid}/tools/refresh")
        spec_after = (await api.get(f"/v1/sessions/{run_id}")).json()["session"]["run_spec"]
        assert spec_after["brokered"][0]["snapshot_version"] == 2, "an in-flight run keeps its frozen snapshot"
        await api.post(f"/v1/sessions/{run_id}/cancel")
        await wait_status(api, run_id, {"cancelled"})
        assert "tool.brokered" not in types(await events(api, run_id))


async def test_custom_header_auth_and_endless_pagination(api: httpx.AsyncClient) -> None:
    from tests.mcp_servers import endless, header

    value = "hv-" + secrets.token_hex(8)
    async with serve(header("X-Api-Key", value)) as srv:
        r = await api.post(
            "/v1/connections",
            json={
                "provider": "mcp_http",
                "access": {"read": True},
                "base_url": srv.url,
                "token": value,
                "header_name": "X-Api-Key",
                "scheme": "",
            },
        )
        assert r.status_code == 200 and value not in r.text, r.text
        wrong = await api.post(
            "/v1/connections",
            json={
                "provider": "mcp_http",
                "access": {"read": True},
                "base_url": srv.url,
                "token": value,
                "scheme": "Bearer",
            },
        )
        assert wrong.status_code == 400 and "rolled back" in wrong.json()["error"]
    async with serve(endless()) as srv:
        before = (await api.get("/v1/connections")).json()["connections"]
        r = await api.post(
            "/v1/connections",
            json={
                "provider": "mcp_http",
                "access": {"read": True},
                "base_url": srv.url,
                "token": "x-" + secrets.token_hex(4),
            },
        )
        assert r.status_code == 502 and "could not photograph" in r.json()["error"]
        assert (await api.get("/v1/connections")).json()["connections"] == before, "a partial listing stores nothing"


async def test_an_invoking_user_requirement_fails_closed_for_operator_runs(api: httpx.AsyncClient) -> None:
    async with serve(basic()) as srv:
        await connect(api, srv.url, "tok-" + secrets.token_hex(8))
        req = {**requirement(srv.url, ["add"]), "binding_mode": "invoking_user"}
        agent = await make_agent(api, [{"say": "hi"}], connection_requirements=[req])
        r = await api.post("/v1/sessions", json={"agent": agent, "task": "t"})
        assert r.status_code == 400 and "invoking user's personal connection" in r.json()["error"]


async def test_a_claim_whose_dispatcher_died_becomes_ambiguous_and_is_never_resent(
    api: httpx.AsyncClient, stack: Stack
) -> None:
    """A claim stuck in ``claimed`` past its TTL (the broker died mid-call) is settled ambiguous."""
    async with serve(basic()) as srv:
        run_id = await idle_bound_run(api, srv.url, ["add"])
        body = {"tool_call_id": "lost-1", "tool": "mcp__calc__add", "input": {"a": 1, "b": 1}}
        await plant_claimed(api, stack, run_id, body, minutes_ago=11)
        token = await issue_token(stack.database_url or "", run_id, "tool")
        async with httpx.AsyncClient(base_url=stack.api_url, headers={"authorization": f"Bearer {token}"}) as runner:
            answer = (await runner.post(f"/internal/sessions/{run_id}/tools/call", json=body)).json()
        assert answer == {"ok": False, "error": "brokered call outcome ambiguous — not retried"}
        assert srv.call_count("add") == 0
        lost = [e["payload"]["data"] for e in await events(api, run_id) if e["type"] == "tool.brokered"]
        assert [(d["tool_call_id"], d["outcome"]) for d in lost] == [("lost-1", "ambiguous")]
        await api.post(f"/v1/sessions/{run_id}/cancel")
        await wait_status(api, run_id, {"cancelled"})


async def test_a_claim_in_flight_within_its_ttl_is_left_to_its_dispatcher_and_lost_only_past_it(
    api: httpx.AsyncClient, stack: Stack
) -> None:
    """Whether a claimed call's dispatcher is lost is decided against ``claimed_at`` on the database's clock, at
    the claim TTL (600 s): a retry at 9 minutes re-attaches (in flight, never re-sent, never ambiguous); the
    same claim at 11 minutes is settled ambiguous."""
    from db.engine import create_pool

    async with serve(basic()) as srv:
        run_id = await idle_bound_run(api, srv.url, ["add"])
        body = {"tool_call_id": "slow-1", "tool": "mcp__calc__add", "input": {"a": 2, "b": 2}}
        key = await plant_claimed(api, stack, run_id, body, minutes_ago=9)  # a dispatcher still on a slow call
        token = await issue_token(stack.database_url or "", run_id, "tool")
        pool = await create_pool(stack.database_url or "", min_size=1, max_size=1)
        try:
            async with httpx.AsyncClient(
                base_url=stack.api_url, headers={"authorization": f"Bearer {token}"}
            ) as runner:
                answer = (await runner.post(f"/internal/sessions/{run_id}/tools/call", json=body)).json()
                assert answer == {"ok": False, "error": "execution in flight; retry later"}
                async with pool.acquire() as conn:
                    state = await conn.fetchval(
                        "SELECT state FROM tool_execution_claims WHERE session_id = $1 AND tool_call_id = $2"
                        " AND input_digest = $3",
                        *key,
                    )
                    assert state == "claimed"
                    # The dispatcher never finishes: two more minutes on the database's clock.
                    await conn.execute(
                        "UPDATE tool_execution_claims SET claimed_at = now() - interval '11 minutes'"
                        " WHERE session_id = $1 AND tool_call_id = $2 AND input_digest = $3",
                        *key,
                    )
                answer = (await runner.post(f"/internal/sessions/{run_id}/tools/call", json=body)).json()
                assert answer == {"ok": False, "error": "brokered call outcome ambiguous — not retried"}
        finally:
            await pool.close()
        assert srv.call_count("add") == 0
        lost = [e["payload"]["data"] for e in await events(api, run_id) if e["type"] == "tool.brokered"]
        assert [(d["tool_call_id"], d["outcome"]) for d in lost] == [("slow-1", "ambiguous")]
        await api.post(f"/v1/sessions/{run_id}/cancel")
        await wait_status(api, run_id, {"cancelled"})


async def test_settling_a_claim_records_its_outcome_and_one_redacted_event_only_once(
    api: httpx.AsyncClient, stack: Stack
) -> None:
    """``Connections.settle``: the claim's outcome and its ``tool.brokered`` event land together (next seq,
    redacted, NOTIFY), and only while the claim is still in flight; a second settle changes nothing, and a
    claim that does not exist is ``NotFound``."""
    import uuid

    from core import events as ev
    from core.digests import input_digest
    from core.errors import NotFound
    from core.redaction import Redactor
    from db.engine import create_pool
    from tests.helpers import context_over

    secret = "upstream-secret-" + secrets.token_hex(8)
    async with serve(basic()) as srv:
        run_id = await idle_bound_run(api, srv.url, ["add"])
        binding_id = (await api.get(f"/v1/sessions/{run_id}")).json()["session"]["run_spec"]["brokered"][0][
            "binding_id"
        ]
        tool, args = "mcp__calc__add", {"a": 1, "b": 2}
        digest = input_digest(tool, args)
        pool = await create_pool(stack.database_url or "", min_size=1, max_size=2)
        try:
            async with pool.acquire() as conn:  # a call the broker has claimed and is about to settle
                await conn.execute(
                    "INSERT INTO tool_execution_claims (session_id, tool_call_id, input_digest, binding_id, tool,"
                    " input, state, attempts, claimed_at) VALUES ($1, 's-1', $2, $3, $4, $5, 'claimed', 1, now())",
                    uuid.UUID(run_id), digest, uuid.UUID(binding_id), tool, args,
                )  # fmt: skip
            connections = context_over(pool, redactor=Redactor(extra_secrets=(secret,))).connections
            before = [e["seq"] for e in await events(api, run_id)]
            data = {"tool_call_id": "s-1", "tool": tool, "ok": True, "outcome": "succeeded", "note": secret}
            result = {"content": [{"type": "text", "text": "3"}], "is_error": False}
            row = await connections.settle(
                run_id, "s-1", digest, "succeeded", result, None, ev.NewEvent(type="tool.brokered", data=data)
            )
            assert (row.state, row.result) == ("succeeded", result)
            assert row.settled_at is not None
            again = await connections.settle(
                run_id, "s-1", digest, "ambiguous", None, "late", ev.NewEvent(type="tool.brokered", data=data)
            )
            assert (again.state, again.result, again.error) == (
                "succeeded",
                result,
                None,
            )
            with pytest.raises(NotFound):
                await connections.settle(
                    run_id, "nope", digest, "succeeded", None, None, ev.NewEvent(type="tool.brokered", data=data)
                )
        finally:
            await pool.close()
        after = await events(api, run_id)
        settled = [e for e in after if e["type"] == "tool.brokered"]
        # The idle run's runner may append its own events meanwhile: the settle's event takes the next free seq.
        assert len(settled) == 1 and settled[0]["seq"] > max(before)
        assert sorted(e["seq"] for e in after) == list(range(1, len(after) + 1))
        assert settled[0]["payload"]["data"]["outcome"] == "succeeded"
        assert secret not in json.dumps(after)
        await api.post(f"/v1/sessions/{run_id}/cancel")
        await wait_status(api, run_id, {"cancelled"})


async def test_tools_call_refuses_a_non_brokered_tool_before_the_gate(api: httpx.AsyncClient, stack: Stack) -> None:
    async with serve(basic()) as srv:
        run_id = await idle_bound_run(api, srv.url, ["add"])
        token = await issue_token(stack.database_url or "", run_id, "tool")
        async with httpx.AsyncClient(base_url=stack.api_url, headers={"authorization": f"Bearer {token}"}) as runner:
            for tool in ("Read", "mcp__other__add"):
                r = await runner.post(
                    f"/internal/sessions/{run_id}/tools/call", json={"tool_call_id": tool, "tool": tool, "input": {}}
                )
                assert r.status_code == 400 and "is not a brokered tool of this run" in r.json()["error"]
            drift = await runner.post(
                f"/internal/sessions/{run_id}/tools/call",
                json={"tool_call_id": "d1", "tool": "mcp__calc__echo", "input": {"text": "x"}},
            )
            assert drift.json()["denied"] is True and "not in this run's frozen tool set" in drift.json()["message"]
        assert srv.call_count() == 0
        requested = [
            e["payload"]["data"]["tool_call_id"] for e in await events(api, run_id) if e["type"] == "tool.requested"
        ]
        assert requested == ["d1"]
        await api.post(f"/v1/sessions/{run_id}/cancel")
        await wait_status(api, run_id, {"cancelled"})


async def test_basic_auth_pagination_and_explicit_bindings(api: httpx.AsyncClient) -> None:
    import base64

    from tests.mcp_servers import header, paginating

    secret = "me@example.com:" + secrets.token_hex(8)
    encoded = "Basic " + base64.b64encode(secret.encode()).decode()
    async with serve(header("Authorization", encoded)) as srv:
        r = await api.post(
            "/v1/connections",
            json={
                "provider": "mcp_http",
                "access": {"read": True},
                "base_url": srv.url,
                "token": secret,
                "scheme": "Basic",
            },
        )
        assert r.status_code == 200 and secret not in r.text and encoded not in r.text, r.text
    async with serve(paginating(n_tools=7, page_size=3)) as srv:
        first = await connect(api, srv.url, "tok-" + secrets.token_hex(8))
        assert len(first["snapshot"]["tools"]) == 7, "every page of tools/list is photographed"
        second = await connect(api, srv.url, "tok-" + secrets.token_hex(8))
        tool = first["snapshot"]["tools"][0]["name"]
        agent = await make_agent(api, [{"say": "hi"}], connection_requirements=[requirement(srv.url, [tool])])
        pinned = await api.post(
            "/v1/sessions", json={"agent": agent, "task": "t", "bindings": {"calc": first["connection"]["id"]}}
        )
        assert pinned.status_code == 200
        assert pinned.json()["session"]["run_spec"]["brokered"][0]["connection_id"] == first["connection"]["id"]
        default = (await api.post("/v1/sessions", json={"agent": agent, "task": "t"})).json()["session"]
        assert default["run_spec"]["brokered"][0]["connection_id"] == second["connection"]["id"], "newest wins"
        for bindings, message in [
            ({"nope": first["connection"]["id"]}, "unknown requirement slot(s) in bindings: nope"),
            ({"calc": "00000000-0000-0000-0000-000000000000"}, "is not an active organization connection"),
        ]:
            r = await api.post("/v1/sessions", json={"agent": agent, "task": "t", "bindings": bindings})
            assert r.status_code == 400 and message in r.json()["error"], r.text


async def test_a_call_that_was_never_sent_is_retried_at_most_three_times(api: httpx.AsyncClient, stack: Stack) -> None:
    async with serve(basic()) as srv:
        run_id = await idle_bound_run(api, srv.url, ["add"])
        await srv.stop()  # the server is gone: connect refused, provably nothing sent
        token = await issue_token(stack.database_url or "", run_id, "tool")
        async with httpx.AsyncClient(base_url=stack.api_url, headers={"authorization": f"Bearer {token}"}) as runner:
            body = {"tool_call_id": "down-1", "tool": "mcp__calc__add", "input": {"a": 1, "b": 2}}
            answers = [
                (await runner.post(f"/internal/sessions/{run_id}/tools/call", json=body)).json() for _ in range(4)
            ]
        assert all(a["ok"] is False and "denied" not in a for a in answers)
        assert "execution attempts exhausted" not in answers[0]["error"]
        assert answers[3]["error"] == (
            "brokered dispatch failed before send on 3 attempts — not retried (execution attempts exhausted)"
        )
        outcomes = [e["payload"]["data"]["outcome"] for e in await events(api, run_id) if e["type"] == "tool.brokered"]
        assert outcomes == ["failed_before_send"] * 3
        await api.post(f"/v1/sessions/{run_id}/cancel")
        await wait_status(api, run_id, {"cancelled"})


async def test_without_a_credential_key_the_server_boots_and_connection_routes_answer_503(stack: Stack) -> None:
    import os
    import subprocess
    import sys
    import tempfile

    from cli.stack import free_port

    port = free_port()
    env = {k: v for k, v in stack.env.items() if k != "FLUIDBOX_CREDENTIAL_KEY"}
    env |= {
        "FLUIDBOX_BIND": f"127.0.0.1:{port}",
        "FLUIDBOX_GATEWAY_SOCKET": tempfile.mkdtemp(prefix="fbxg-") + "/api.sock",
    }
    proc = subprocess.Popen([sys.executable, "-m", "api.serve"], env=env, cwd=str(Path(__file__).resolve().parents[2]),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        headers = {"authorization": f"Bearer {env['FLUIDBOX_ADMIN_TOKEN']}"}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=10) as keyless:
            for _ in range(200):
                try:
                    if (await keyless.get("/v1/health")).status_code == 200:
                        break
                except httpx.TransportError:
                    await asyncio.sleep(0.05)
            r = await keyless.post(
                "/v1/connections",
                json={"provider": "mcp_http", "access": {"read": True}, "base_url": "https://1.1.1.1/", "token": "x"},
            )
            assert r.status_code == 503 and "FLUIDBOX_CREDENTIAL_KEY" in r.json()["error"]
            assert (await keyless.get("/v1/connections")).status_code == 200, "reading needs no key"
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)
