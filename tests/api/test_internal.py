"""The runner plane (/internal), in process: run-scoped tokens, the gate answered from PostgreSQL, brokered
calls, proposals, narration, heartbeats and results."""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from contracts import temporal as c
from core import events as ev
from core.digests import input_digest
from core.states import RunStatus
from core.tokens import Audience
from tests.api.conftest import Api
from tests.api.runs_helpers import brokered_agent, finish_run, make_agent, run_token, start_run

ADD = {"a": 1, "b": 2}


async def runner(api: Api, run_id: str, audience: Audience = Audience.TOOL) -> httpx.AsyncClient:
    return api.as_token(await run_token(api, run_id, audience))


async def permission(client: httpx.AsyncClient, run_id: str, tool: str, tool_input: dict[str, Any], tc: str) -> Any:
    r = await client.post(
        f"/internal/sessions/{run_id}/permission", json={"tool_call_id": tc, "tool": tool, "input": tool_input}
    )
    assert r.status_code == 200, r.text
    return r.json()


async def test_the_runner_plane_health_needs_no_token(api: Api) -> None:
    async with api.as_token(None) as anon:
        r = await anon.get("/internal/health")
    assert (r.status_code, r.json()) == (200, {"status": "ok"})


async def test_the_gate_answers_allow_and_deny_from_the_runs_policy(api: Api) -> None:
    run = await start_run(api, await make_agent(api))
    async with await runner(api, run["id"]) as tool:
        assert await permission(tool, run["id"], "Read", {"file_path": "/workspace/a"}, "tc-1") == {"decision": "allow"}
        denied = await permission(tool, run["id"], "Bash", {"command": "curl https://example.com"}, "tc-2")
        assert denied["decision"] == "deny" and "curl" in denied["message"], denied
        # A retried tool call id is answered as it was first decided.
        assert await permission(tool, run["id"], "Read", {"file_path": "/workspace/a"}, "tc-1") == {"decision": "allow"}
    events = (await api.client.get(f"/v1/sessions/{run['id']}/events")).json()["events"]
    decided = [e["payload"]["data"]["tool_call_id"] for e in events if e["type"] == ev.TOOL_REQUESTED]
    assert decided == ["tc-1", "tc-2"]


async def test_a_held_call_is_answered_from_the_decided_approval_on_retry(api: Api) -> None:
    run = await start_run(api, await make_agent(api))
    deploy = {"command": "./deploy.sh"}
    # The run's workflow answers the wait: here, the run accepts no more work.
    async with await runner(api, run["id"]) as tool:
        assert await permission(tool, run["id"], "Bash", deploy, "tc-1") == {
            "decision": "deny",
            "message": "session is not active",
        }
        approval = await api.ctx.approvals.open_approval(run["id"], "tc-1")
        r = await api.client.post(f"/v1/approvals/{approval.id}/decision", json={"decision": "approve"})
        assert r.status_code == 200, r.text
        # The decision is a compare-and-swap in PostgreSQL: the retry is answered from the row.
        assert await permission(tool, run["id"], "Bash", deploy, "tc-1") == {"decision": "allow"}
        # And a wait the workflow answers carries the human's message.
        api.workflows.verdicts["tc-2"] = c.ApprovalVerdict(decision="deny", message="not today")
        assert await permission(tool, run["id"], "Bash", deploy, "tc-2") == {
            "decision": "deny",
            "message": "not today",
        }


async def test_a_run_token_works_only_for_its_run_and_its_audience(api: Api) -> None:
    agent = await make_agent(api)
    run, other = await start_run(api, agent), await start_run(api, agent)
    body = {"tool_call_id": "tc-1", "tool": "Read", "input": {}}
    path = f"/internal/sessions/{run['id']}/permission"
    async with await runner(api, run["id"], Audience.CONTROL) as control:
        r = await control.post(path, json=body)
        # Byte-stable: runners abort on exactly this body.
        assert (r.status_code, r.content) == (403, b'{"error":"wrong_audience"}')
        r = await control.post(f"/internal/sessions/{run['id']}/events", json={"body": {"type": "agent.message"}})
        assert r.status_code == 200
    async with await runner(api, run["id"]) as tool:
        r = await tool.post(f"/internal/sessions/{run['id']}/heartbeat")
        assert (r.status_code, r.content) == (403, b'{"error":"wrong_audience"}')
    async with await runner(api, other["id"]) as others:
        r = await others.post(path, json=body)
        assert (r.status_code, r.json()) == (404, {"error": "not found", "code": "not_found"})
    for token in (None, "fbx_sess_" + "0" * 32, api.admin):
        async with api.as_token(token) as client:
            r = await client.post(path, json=body)
            assert (r.status_code, r.json()) == (401, {"error": "unauthorized", "code": "unauthorized"}), token
    assert (await api.client.get(f"/v1/sessions/{run['id']}/outputs")).json()["gate_consulted"] is False


async def test_a_brokered_call_is_gated_registered_and_dispatched_once(api: Api) -> None:
    run = await start_run(api, await brokered_agent(api))
    call = {"tool_call_id": "tc-1", "tool": "mcp__calc__add", "input": ADD}
    path = f"/internal/sessions/{run['id']}/tools/call"
    digest = input_digest("mcp__calc__add", ADD)
    async with await runner(api, run["id"]) as tool:
        r = await tool.post(path, json=call)
        # The workflow executes it; until its claim is settled the runner is told to retry.
        assert (r.status_code, r.json()) == (200, {"ok": False, "error": "execution in flight; retry later"})
        assert api.workflows.brokered == [(run["id"], "tc-1", digest, 1)]
        # The broker activity takes and settles the claim (what the run's workflow does).
        claim = await api.ctx.connections.take(run["id"], "tc-1", digest)
        assert claim is not None and claim.attempts == 1
        result = {"content": [{"type": "text", "text": "3"}], "isError": False}
        event = ev.NewEvent(type="tool.brokered", data={"tool_call_id": "tc-1", "ok": True})
        await api.ctx.connections.settle(run["id"], "tc-1", digest, "succeeded", result, None, event)
        r = await tool.post(path, json=call)
        assert r.json() == {"ok": True, "result": result}
        assert len(api.workflows.brokered) == 1  # a settled call is answered, never executed again


async def test_a_lapsed_claim_becomes_ambiguous_and_is_never_dispatched_again(api: Api) -> None:
    run = await start_run(api, await brokered_agent(api))
    call = {"tool_call_id": "tc-1", "tool": "mcp__calc__add", "input": ADD}
    digest = input_digest("mcp__calc__add", ADD)
    async with await runner(api, run["id"]) as tool:
        await tool.post(f"/internal/sessions/{run['id']}/tools/call", json=call)
        assert await api.ctx.connections.take(run["id"], "tc-1", digest) is not None
        # Its dispatcher died mid-call: the claim has been in flight past its TTL.
        async with api.ctx.pool.acquire() as conn:
            await conn.execute(
                "UPDATE tool_execution_claims SET claimed_at = now() - interval '1 hour' WHERE session_id = $1",
                uuid.UUID(run["id"]),
            )
        r = await tool.post(f"/internal/sessions/{run['id']}/tools/call", json=call)
    assert r.json() == {"ok": False, "error": "brokered call outcome ambiguous — not retried"}
    assert len(api.workflows.brokered) == 1
    events = (await api.client.get(f"/v1/sessions/{run['id']}/events")).json()["events"]
    [lost] = [e["payload"]["data"] for e in events if e["type"] == "tool.brokered"]
    assert (lost["tool_call_id"], lost["outcome"], lost["ok"]) == ("tc-1", "ambiguous", False)


async def test_a_brokered_call_the_run_may_not_make_is_refused_before_anything_is_registered(api: Api) -> None:
    agent = await brokered_agent(api, policy="demo")
    run = await start_run(api, agent)
    path = f"/internal/sessions/{run['id']}/tools/call"
    async with await runner(api, run["id"]) as tool:
        for name, message in [
            ("Bash", "tool 'Bash' is not a brokered tool of this run (brokered tools are mcp__<slot>__<tool>)"),
            ("mcp__other__add", "tool 'mcp__other__add' is not a brokered tool of this run"),
        ]:
            r = await tool.post(path, json={"tool_call_id": "tc-x", "tool": name, "input": {}})
            assert (r.status_code, r.json()["code"]) == (400, "bad_request") and message in r.json()["error"], r.text
        # The demo policy holds mcp__ tools for a human; the workflow says the run accepts no more work.
        r = await tool.post(path, json={"tool_call_id": "tc-1", "tool": "mcp__calc__add", "input": ADD})
        assert r.json() == {"ok": False, "denied": True, "message": "session is not active"}
    assert api.workflows.brokered == []
    digest = input_digest("mcp__calc__add", ADD)
    assert await api.ctx.connections.claim(run["id"], "tc-1", digest) is None
    # A run that accepts no more work brokers nothing.
    await api.ctx.runs.transition(run["id"], RunStatus.CANCELLING)
    async with await runner(api, run["id"]) as tool:
        r = await tool.post(path, json={"tool_call_id": "tc-2", "tool": "mcp__calc__add", "input": ADD})
    assert (r.status_code, r.json()) == (400, {"error": "session is not active", "code": "bad_request"})


async def test_deferred_discovery_searches_and_describes_the_frozen_tools(api: Api) -> None:
    run = await start_run(api, await brokered_agent(api, tool_discovery="deferred"))
    async with await runner(api, run["id"]) as tool:
        r = await tool.post(f"/internal/sessions/{run['id']}/tools/search", json={"query": "add"})
        assert r.json() == {
            "tools": [
                {
                    "name": "mcp__calc__add",
                    "description": "Add two integers.",
                    "connection": "calc",
                    "access": "write",
                    "needsAuthorization": False,
                }
            ]
        }
        r = await tool.post(f"/internal/sessions/{run['id']}/tools/describe", json={"name": "mcp__calc__add"})
        assert r.json() == {
            "name": "mcp__calc__add",
            "description": "Add two integers.",
            "connection": "calc",
            "access": "write",
            "needsAuthorization": False,
            "input_schema": {"type": "object"},
        }
        r = await tool.post(f"/internal/sessions/{run['id']}/tools/describe", json={"name": "mcp__calc__sub"})
        assert r.status_code == 400 and "is not in this run's frozen tool set" in r.json()["error"]
    eager = await start_run(api, await brokered_agent(api))
    async with await runner(api, eager["id"]) as tool:
        r = await tool.post(f"/internal/sessions/{eager['id']}/tools/search", json={"query": "add"})
    assert r.json() == {
        "error": "this run sees its brokered tools directly: tool discovery is not deferred",
        "code": "bad_request",
    }


async def test_a_proposed_connection_is_refused_with_its_reason_or_saved_pending(api: Api) -> None:
    off = await start_run(api, await make_agent(api))
    proposal = {"transport": "mcp_http", "base_url": "http://127.0.0.1:9/mcp", "display_name": "Local"}
    async with await runner(api, off["id"]) as tool:
        r = await tool.post(
            f"/internal/sessions/{off['id']}/connections/propose", json={"tool_call_id": "p1", "connection": proposal}
        )
    assert (r.status_code, r.json()["code"]) == (403, "forbidden")
    assert "dynamic connections are off for this agent" in r.json()["error"]

    dynamic = {"enabled": True, "allowedHosts": ["127.0.0.1"], "require_approval": False}
    run = await start_run(api, await make_agent(api, "unrestricted", harness_config={"dynamic_connections": dynamic}))
    path = f"/internal/sessions/{run['id']}/connections/propose"
    async with await runner(api, run["id"]) as tool:
        r = await tool.post(path, json={"tool_call_id": "p1", "connection": {**proposal, "token": "sk-1"}})
        assert r.status_code == 400 and "can never carry a secret (token)" in r.json()["error"]
        r = await tool.post(path, json={"tool_call_id": "p2", "connection": {**proposal, "base_url": "http://x.io/"}})
        assert r.status_code == 400 and "allowedHosts" in r.json()["error"], r.text
        r = await tool.post(path, json={"tool_call_id": "p3", "connection": proposal})
        saved = r.json()
        assert (r.status_code, saved["ok"], saved["status"], set(saved)) == (
            200,
            True,
            "pending",
            {"ok", "connection_id", "status"},
        )
    connection = (await api.client.get(f"/v1/connections/{saved['connection_id']}")).json()["connection"]
    assert (connection["status"], connection["base_url"]) == ("pending", "http://127.0.0.1:9/mcp")


async def test_narration_is_stored_and_what_only_the_server_writes_is_refused(api: Api) -> None:
    run = await start_run(api, await make_agent(api))
    path = f"/internal/sessions/{run['id']}/events"
    async with await runner(api, run["id"], Audience.CONTROL) as control:
        r = await control.post(path, json={"actor": "human", "body": {"type": "agent.message", "data": {"t": "hi"}}})
        assert r.status_code == 200 and set(r.json()) == {"seq"} and isinstance(r.json()["seq"], int)
        seq = r.json()["seq"]
        r = await control.post(path, json={"body": {"type": ev.TOOL_REQUESTED, "data": {}}})
        assert r.json() == {"seq": None, "dropped": "tool.requested"}
        r = await control.post(path, json={"body": {"type": "run.completed", "data": {}}})
        assert r.json() == {
            "error": "event type 'run.completed' cannot be posted by a runner (allowed: agent.message, run.error, "
            "tool.completed)",
            "code": "bad_request",
        }
    [stored] = (await api.client.get(f"/v1/sessions/{run['id']}/events", params={"after": seq - 1})).json()["events"]
    # A runner never speaks as a human.
    assert (stored["type"], stored["actor"], stored["payload"]["data"]) == ("agent.message", "agent", {"t": "hi"})


async def test_heartbeats_say_quiesce_while_the_run_is_cancelled(api: Api) -> None:
    run = await start_run(api, await make_agent(api))
    path = f"/internal/sessions/{run['id']}/heartbeat"
    async with await runner(api, run["id"], Audience.CONTROL) as control:
        assert (await control.post(path)).json() == {"ok": True, "action": None}
        await api.ctx.runs.transition(run["id"], RunStatus.CANCELLING)  # what the workflow does on a cancel
        assert (await control.post(path)).json() == {"ok": True, "action": "quiesce"}
    assert (await api.client.get(f"/v1/sessions/{run['id']}")).json()["session"]["last_heartbeat_at"] is not None


async def test_the_runners_result_is_recorded_once_and_wakes_the_run(api: Api) -> None:
    run = await start_run(api, await make_agent(api))
    path = f"/internal/sessions/{run['id']}/result"
    async with await runner(api, run["id"], Audience.CONTROL) as control:
        r = await control.post(path, json={"outcome": "completed", "summary": "done"})
        assert (r.status_code, r.json()) == (200, {"ok": True})
        assert api.workflows.signals == [(run["id"], "runner_finished", None)]
        assert (await control.post(path, json={"outcome": "failed"})).json() == {"ok": True, "note": "finalizing"}
        await finish_run(api, run["id"], RunStatus.COMPLETED, "done")
        # The run's tokens are revoked once it ends; a late result is still acknowledged.
        assert (await control.post(path, json={"outcome": "completed"})).json() == {
            "ok": True,
            "note": "already terminal",
        }
    assert api.workflows.signals == [(run["id"], "runner_finished", None)]


async def test_a_token_renewal_extends_the_runs_tokens_within_the_ceiling(api: Api) -> None:
    run = await start_run(api, await make_agent(api))
    async with await runner(api, run["id"], Audience.CONTROL) as control:
        assert (await control.post("/internal/token/renew", json={"ttl_secs": 60})).json() == {
            "renewed": True,
            "ttl_secs": 60,
        }
        r = await control.post("/internal/token/renew", json={})
        assert r.json() == {"renewed": True, "ttl_secs": api.ctx.settings.token_ttl_secs}
        r = await control.post("/internal/token/renew", json={"ttl_secs": -5})
        assert r.json() == {"error": "ttl_secs must be a positive integer", "code": "bad_request"}
