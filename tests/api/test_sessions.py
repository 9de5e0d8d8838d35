"""Runs over /v1/sessions, in process: create, list, read, cancel, and the refusals a client sees."""

from __future__ import annotations

import uuid
from typing import Any

from core.states import RunStatus
from core.tokens import Audience
from tests.api.conftest import Api
from tests.api.runs_helpers import make_agent, member, run_token, start_run

# The stable vocabulary of docs/api.md "Errors", by status.
CODES = {
    400: {"bad_request", "invalid_request"},
    403: {"forbidden"},
    404: {"not_found"},
    405: {"method_not_allowed"},
    413: {"too_large"},
    415: {"unsupported_media_type"},
    422: {"unprocessable"},
}


async def run_ids(api: Api) -> list[str]:
    return [s["id"] for s in (await api.client.get("/v1/sessions", params={"limit": 500})).json()["sessions"]]


async def test_a_run_is_created_with_its_runspec_frozen_and_its_workflow_started(api: Api) -> None:
    agent = await make_agent(api)
    r = await api.client.post("/v1/sessions", json={"agent": agent, "task": "fix the build"})
    assert r.status_code == 200, r.text
    session = r.json()["session"]
    assert (session["status"], session["task"], session["invoked_by_kind"]) == ("created", "fix the build", "operator")
    assert (session["trigger"]["kind"], session["trigger"]["actor"]) == ("manual", "operator")
    spec = session["run_spec"]
    assert (spec["run_id"], spec["agent_name"], spec["task"]) == (session["id"], agent, "fix the build")
    # The workflow was started with the very spec the row froze.
    started = api.workflows.started[session["id"]]
    assert started.model_dump(mode="json") == spec
    detail = (await api.client.get(f"/v1/sessions/{session['id']}")).json()
    assert detail["session"] == session
    assert detail["usage"] == {
        "input_tokens": 0,
        "output_tokens": 0,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
        "cost_usd": 0.0,
        "requests": 0,
    }
    assert await run_ids(api) == [session["id"]]


async def test_a_bad_run_body_is_a_4xx_naming_the_problem_and_stores_nothing(api: Api) -> None:
    agent = await make_agent(api)
    json_body = {"content-type": "application/json"}
    cases: list[tuple[dict[str, Any], int, str, str]] = [
        ({"content": b"{not json", "headers": json_body}, 400, "invalid_request", "malformed JSON body"),
        ({"json": {"agent": agent, "task": "t", "colour": "red"}}, 400, "invalid_request", "unknown field 'colour'"),
        ({"json": {"task": "t"}}, 400, "invalid_request", "missing field 'agent'"),
        ({"json": {"agent": agent, "task": ""}}, 400, "invalid_request", "task"),
        ({"json": {"agent": "no-such-agent", "task": "t"}}, 400, "bad_request", "unknown agent 'no-such-agent'"),
        ({"content": b"agent=x", "headers": {"content-type": "text/plain"}}, 415, "unsupported_media_type",
         "content-type: application/json"),
        ({"content": b"x" * (2 * 1024 * 1024 + 1), "headers": json_body}, 413, "too_large", "byte limit"),
        ({"json": {"agent": agent, "task": "t", "workspace": {"kind": "ftp"}}}, 400, "invalid_request",
         "workspace.kind"),
        ({"json": {"agent": agent, "task": "t", "workspace": {"kind": "scratch"}, "repo": {"kind": "scratch"}}},
         400, "bad_request", "provide either `workspace` or legacy `repo`, not both"),
        ({"json": {"agent": agent, "task": "t", "workspace": {"kind": "local_copy", "path": "rel"}}}, 400,
         "bad_request", "absolute"),
    ]  # fmt: skip
    for kwargs, status, code, message in cases:
        r = await api.client.post("/v1/sessions", **kwargs)
        assert r.status_code == status, (kwargs, r.text)
        body = r.json()
        assert set(body) == {"error", "code"} and body["code"] == code and message in body["error"], (kwargs, body)
    assert await run_ids(api) == []
    assert api.workflows.started == {}


async def test_an_agent_whose_harness_cannot_run_here_is_refused_at_run_creation(api: Api) -> None:
    r = await api.client.post("/v1/agents", json={"name": f"codex-{uuid.uuid4().hex[:6]}", "harness": "codex"})
    assert (r.status_code, r.json()["revision"]["model"]) == (200, "gpt-5.4-mini"), r.text
    run = await api.client.post("/v1/sessions", json={"agent": r.json()["agent"]["name"], "task": "t"})
    assert (run.status_code, run.json()["code"]) == (422, "unprocessable")
    assert "cannot run in this build yet" in run.json()["error"]
    assert await run_ids(api) == []
    harnesses = (await api.client.get("/v1/harnesses")).json()["harnesses"]
    assert {h["id"]: h["available"] for h in harnesses} == {"replay": True, "claude-agent-sdk": True, "codex": False}


async def test_unknown_runs_and_bad_queries_are_refused_with_the_error_shape(api: Api) -> None:
    unknown = str(uuid.uuid4())
    for method, path in [
        ("GET", f"/v1/sessions/{unknown}"),
        ("GET", "/v1/sessions/garbage"),
        ("POST", f"/v1/sessions/{unknown}/cancel"),
        ("GET", f"/v1/sessions/{unknown}/events"),
        ("GET", f"/v1/sessions/{unknown}/events/stream"),
        ("GET", f"/v1/sessions/{unknown}/outputs"),
        ("GET", f"/v1/sessions/{unknown}/artifacts"),
        ("GET", f"/v1/sessions/{unknown}/approvals"),
        ("GET", f"/v1/sessions/{unknown}/cost"),
        ("GET", f"/v1/sessions/{unknown}/deliveries"),
    ]:
        r = await api.client.request(method, path)
        assert (r.status_code, r.json()) == (404, {"error": "not found", "code": "not_found"}), (path, r.text)
    for params, message in [
        ({"limit": 0}, "limit"),
        ({"limit": "many"}, "limit"),
        ({"limit": 501}, "limit"),
        ({"status": "sleeping"}, "unknown status 'sleeping' (known: created,"),
    ]:
        r = await api.client.get("/v1/sessions", params=params)
        assert r.status_code == 400 and message in r.json()["error"], (params, r.text)
        assert r.json()["code"] in CODES[400]
    # Numbers past what PostgreSQL's bigint holds are a 400, not a driver error (found by fuzzing).
    r = await api.client.get(f"/v1/sessions/{unknown}/events", params={"after": 2**64})
    assert (r.status_code, r.json()["code"]) == (400, "invalid_request"), r.text
    r = await api.client.delete("/v1/sessions")
    assert (r.status_code, r.json()["code"]) == (405, "method_not_allowed")


async def test_a_stream_resuming_past_the_largest_sequence_number_is_400(api: Api) -> None:
    run = await start_run(api, await make_agent(api))
    for last in ("9" * 40, "9" * 5000, "-1", "abc"):
        r = await api.client.get(f"/v1/sessions/{run['id']}/events/stream", headers={"last-event-id": last})
        assert (r.status_code, r.json()) == (
            400,
            {"error": "Last-Event-ID must be a non-negative integer sequence number", "code": "bad_request"},
        ), last


async def test_runs_list_newest_first_and_filter_by_status(api: Api) -> None:
    agent = await make_agent(api)
    first = await start_run(api, agent)
    second = await start_run(api, agent)
    assert await run_ids(api) == [second["id"], first["id"]]
    one = (await api.client.get("/v1/sessions", params={"limit": 1})).json()["sessions"]
    assert [s["id"] for s in one] == [second["id"]]
    await api.ctx.runs.transition(first["id"], RunStatus.PROVISIONING)
    created = (await api.client.get("/v1/sessions", params={"status": "created"})).json()["sessions"]
    assert [s["id"] for s in created] == [second["id"]]
    provisioning = (await api.client.get("/v1/sessions", params={"status": "provisioning"})).json()["sessions"]
    assert [(s["id"], s["status"]) for s in provisioning] == [(first["id"], "provisioning")]


async def test_a_member_sees_only_the_runs_it_invoked(api: Api) -> None:
    agent = await make_agent(api)
    alice, bob, approver = await member(api), await member(api), await member(api, "approver")
    mine = await start_run(api, agent, alice.token)
    assert (mine["invoked_by_kind"], mine["invoked_by_user_id"]) == ("user", alice.user_id)
    assert mine["trigger"]["actor"] == f"user:{alice.user_id}"
    operators = await start_run(api, agent)
    async with api.as_token(alice.token) as as_alice, api.as_token(bob.token) as as_bob:
        listed = (await as_alice.get("/v1/sessions")).json()["sessions"]
        assert [s["id"] for s in listed] == [mine["id"]]
        assert (await as_bob.get("/v1/sessions")).json()["sessions"] == []
        for path in ("", "/events", "/outputs", "/artifacts", "/approvals"):
            assert (await as_alice.get(f"/v1/sessions/{mine['id']}{path}")).status_code == 200, path
            for client, run in ((as_bob, mine), (as_alice, operators)):
                r = await client.get(f"/v1/sessions/{run['id']}{path}")
                assert (r.status_code, r.json()["code"]) == (404, "not_found"), path
        r = await as_bob.post(f"/v1/sessions/{mine['id']}/cancel")
        assert r.status_code == 404
    async with api.as_token(approver.token) as as_approver:
        assert [s["id"] for s in (await as_approver.get("/v1/sessions")).json()["sessions"]] == [
            operators["id"],
            mine["id"],
        ]
        # Reading every run is not cancelling another member's.
        r = await as_approver.post(f"/v1/sessions/{mine['id']}/cancel")
        assert r.json() == {
            "error": "cancelling another member's run requires the admin or owner role",
            "code": "forbidden",
        }
    assert api.workflows.signals == []


async def test_cancel_records_the_intent_once_and_signals_the_run(api: Api) -> None:
    agent = await make_agent(api)
    alice = await member(api)
    run = await start_run(api, agent, alice.token)
    async with api.as_token(alice.token) as as_alice:
        r = await as_alice.post(f"/v1/sessions/{run['id']}/cancel")
    assert (r.status_code, r.json()) == (200, {"cancelled": True})
    assert api.workflows.signals == [(run["id"], "cancel", None)]
    # Already winding down: not an error, and the run is not woken again.
    assert (await api.client.post(f"/v1/sessions/{run['id']}/cancel")).json() == {"cancelled": False}
    assert api.workflows.signals == [(run["id"], "cancel", None)]
    # The intent is durable: the gate starts no new work for the run.
    token = await run_token(api, run["id"], Audience.TOOL)
    async with api.as_token(token) as runner:
        r = await runner.post(
            f"/internal/sessions/{run['id']}/permission", json={"tool_call_id": "t1", "tool": "Read", "input": {}}
        )
    assert r.json() == {"decision": "deny", "message": "session is not active"}


async def test_outputs_artifacts_and_events_of_a_fresh_run(api: Api) -> None:
    run = await start_run(api, await make_agent(api))
    outputs = (await api.client.get(f"/v1/sessions/{run['id']}/outputs")).json()
    assert outputs == {"status": "created", "diff": None, "summary": None, "gate_consulted": False, "artifacts": []}
    assert (await api.client.get(f"/v1/sessions/{run['id']}/artifacts")).json() == {"artifacts": []}
    events = (await api.client.get(f"/v1/sessions/{run['id']}/events")).json()["events"]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1)) and events
    assert all(set(e["payload"]) == {"type", "data"} and e["session_id"] == run["id"] for e in events)
    last = events[-1]["seq"]
    assert (await api.client.get(f"/v1/sessions/{run['id']}/events", params={"after": last})).json() == {"events": []}
    token = await run_token(api, run["id"], Audience.TOOL)
    async with api.as_token(token) as runner:
        await runner.post(
            f"/internal/sessions/{run['id']}/permission", json={"tool_call_id": "t1", "tool": "Read", "input": {}}
        )
    assert (await api.client.get(f"/v1/sessions/{run['id']}/outputs")).json()["gate_consulted"] is True
    later = (await api.client.get(f"/v1/sessions/{run['id']}/events", params={"after": last, "limit": 1})).json()
    assert [e["seq"] for e in later["events"]] == [last + 1]
