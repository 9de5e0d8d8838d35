"""Bad input gets a clear 4xx with a JSON error naming the problem, and changes nothing.

The agents' and policies' cases that need no worker run in process: ``tests/api/test_agents.py``,
``tests/api/test_policies.py`` (and the 401s in ``tests/api/test_auth.py``)."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from cli.stack import Stack
from tests.integration.helpers import make_agent, unique
from tests.mcp_servers import bearer, serve

pytestmark = pytest.mark.stack


async def snapshot(api: httpx.AsyncClient) -> tuple[int, int, int]:
    agents = (await api.get("/v1/agents")).json()["agents"]
    runs = (await api.get("/v1/sessions", params={"limit": 500})).json()["sessions"]
    pending = (await api.get("/v1/approvals")).json()["approvals"]
    return len(agents), len(runs), len(pending)


async def test_missing_or_wrong_admin_token_is_401(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=stack.api_url) as anon:
        for path in ("/v1/sessions", "/v1/agents", "/v1/approvals"):
            r = await anon.get(path)
            assert (r.status_code, r.json()) == (401, {"error": "unauthorized", "code": "unauthorized"})
        r = await anon.get("/v1/sessions", headers={"authorization": "Bearer fbx_admin_wrong"})
        assert r.status_code == 401
        r = await anon.get("/v1/sessions", headers={"authorization": "Basic abc"})
        assert r.status_code == 401
        assert (await anon.get("/v1/health")).json() == {"status": "ok"}
        ready = await anon.get("/v1/ready")
        assert ready.status_code == 200 and ready.json()["db"] is True and ready.json()["temporal"] is True


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status", "message"),
    [
        (
            "POST",
            "/v1/sessions",
            {"content": b"{not json", "headers": {"content-type": "application/json"}},
            400,
            "malformed JSON body",
        ),
        ("POST", "/v1/sessions", {"json": {"agent": "x", "task": "t", "colour": "red"}}, 400, "unknown field 'colour'"),
        ("POST", "/v1/sessions", {"json": {"task": "t"}}, 400, "missing field 'agent'"),
        (
            "POST",
            "/v1/sessions",
            {"json": {"agent": "no-such-agent", "task": "t"}},
            400,
            "unknown agent 'no-such-agent'",
        ),
        (
            "POST",
            "/v1/sessions",
            {"content": b"agent=x", "headers": {"content-type": "text/plain"}},
            415,
            "content-type: application/json",
        ),
        (
            "POST",
            "/v1/sessions",
            {"json": {"agent": "x", "task": "t", "workspace": {"kind": "ftp"}}},
            400,
            "workspace.kind",
        ),
        ("POST", f"/v1/approvals/{uuid.uuid4()}/decision", {"json": {"decision": "approve"}}, 404, "not found"),
        ("POST", "/v1/approvals/not-a-uuid/decision", {"json": {"decision": "approve"}}, 404, "not found"),
        (
            "POST",
            f"/v1/approvals/{uuid.uuid4()}/decision",
            {"json": {"decision": "maybe"}},
            400,
            "unknown decision 'maybe'",
        ),
        ("GET", f"/v1/sessions/{uuid.uuid4()}", {}, 404, "not found"),
        ("GET", "/v1/sessions/garbage", {}, 404, "not found"),
        ("POST", f"/v1/sessions/{uuid.uuid4()}/cancel", {}, 404, "not found"),
        ("GET", f"/v1/sessions/{uuid.uuid4()}/events", {}, 404, "not found"),
        ("GET", "/v1/sessions", {"params": {"limit": 0}}, 400, "limit"),
    ],
)
async def test_bad_requests_get_a_clear_error_and_change_nothing(
    api: httpx.AsyncClient, method: str, path: str, kwargs: dict[str, object], status: int, message: str
) -> None:
    before = await snapshot(api)
    r = await api.request(method, path, **kwargs)  # type: ignore[arg-type]
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error", "code"} and message in body["error"], body
    assert body["code"] in CODES[status], body
    assert await snapshot(api) == before


# The stable vocabulary of docs/api.md "Errors", by status.
CODES = {
    400: {"bad_request", "invalid_request"},
    403: {"forbidden"},
    404: {"not_found"},
    409: {"conflict", "invalid_transition"},
    415: {"unsupported_media_type"},
    422: {"unprocessable"},
}


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status", "code"),
    [
        ("POST", "/v1/sessions", {"content": b"{not", "headers": {"content-type": "application/json"}}, 400,
         "invalid_request"),
        ("POST", "/v1/sessions", {"json": {"agent": "x", "task": "t", "colour": "red"}}, 400, "invalid_request"),
        ("GET", "/v1/sessions", {"params": {"limit": "many"}}, 400, "invalid_request"),
        ("POST", "/v1/sessions", {"json": {"agent": "no-such-agent", "task": "t"}}, 400, "bad_request"),
        ("POST", "/v1/sessions", {"content": b"x", "headers": {"content-type": "text/plain"}}, 415,
         "unsupported_media_type"),
        ("POST", "/v1/sessions", {"content": b"x" * (2 * 1024 * 1024 + 1),
                                  "headers": {"content-type": "application/json"}}, 413, "too_large"),
        ("DELETE", "/v1/sessions", {}, 405, "method_not_allowed"),
        ("GET", "/v1/no-such-route", {}, 404, "not_found"),
        ("GET", f"/v1/sessions/{uuid.uuid4()}", {}, 404, "not_found"),
    ],
)  # fmt: skip
async def test_every_error_carries_a_machine_readable_code_beside_its_message(
    api: httpx.AsyncClient, method: str, path: str, kwargs: dict[str, object], status: int, code: str
) -> None:
    r = await api.request(method, path, **kwargs)  # type: ignore[arg-type]
    assert (r.status_code, r.json()["code"]) == (status, code), r.text
    assert set(r.json()) == {"error", "code"} and r.json()["error"]


@pytest.mark.parametrize(
    ("method", "path", "kwargs"),
    [
        ("GET", f"/v1/sessions/{uuid.uuid4()}/events", {"params": {"after": 2**64}}),
    ],
)
async def test_numbers_past_what_the_database_stores_are_400_not_a_server_error(
    api: httpx.AsyncClient, method: str, path: str, kwargs: dict[str, object]
) -> None:
    """Found by the schemathesis pass: a version past PostgreSQL's integer range reached the driver (500)."""
    before = await snapshot(api)
    r = await api.request(method, path, **kwargs)  # type: ignore[arg-type]
    assert (r.status_code, r.json()["code"]) == (400, "invalid_request"), r.text
    assert await snapshot(api) == before


async def test_a_stream_resuming_past_the_largest_sequence_number_is_400(api: httpx.AsyncClient) -> None:
    agent = await make_agent(api, [{"say": "hi"}])
    run = (await api.post("/v1/sessions", json={"agent": agent, "task": "t"})).json()["session"]["id"]
    for last in ("9" * 40, "9" * 5000):
        r = await api.get(f"/v1/sessions/{run}/events/stream", headers={"last-event-id": last})
        assert (r.status_code, r.json()["code"]) == (400, "bad_request"), r.text


async def test_an_agent_whose_harness_cannot_run_here_is_refused_at_run_creation(api: httpx.AsyncClient) -> None:
    name = unique("codex")
    r = await api.post("/v1/agents", json={"name": name, "harness": "codex"})
    assert r.status_code == 200 and r.json()["revision"]["model"] == "gpt-5.4-mini"
    run = await api.post("/v1/sessions", json={"agent": name, "task": "t"})
    assert run.status_code == 422 and "cannot run in this build yet" in run.json()["error"]
    harnesses = (await api.get("/v1/harnesses")).json()["harnesses"]
    assert {h["id"]: h["available"] for h in harnesses} == {"replay": True, "claude-agent-sdk": True, "codex": False}


async def test_a_local_copy_workspace_must_exist(api: httpx.AsyncClient) -> None:
    name = await make_agent(api, [{"say": "hi"}])
    r = await api.post(
        "/v1/sessions", json={"agent": name, "task": "t", "workspace": {"kind": "local_copy", "path": "rel"}}
    )
    assert r.status_code == 400 and "absolute" in r.json()["error"]
    both = await api.post(
        "/v1/sessions", json={"agent": name, "task": "t", "workspace": {"kind": "scratch"}, "repo": {"kind": "scratch"}}
    )
    assert both.status_code == 400 and "not both" in both.json()["error"]


async def test_revisions_carry_connection_requirements_that_fail_closed_until_bound(api: httpx.AsyncClient) -> None:
    # ``fail``: refused at creation (without it an API run parks until a connection exists: test_parked.py).
    req = {
        "slot": "tracker",
        "connector": {"url": "https://mcp.example.com/mcp"},
        "required_tools": ["create_issue"],
        "when_unavailable": "fail",
    }
    name = await make_agent(api, [{"say": "hi"}], connection_requirements=[req])
    detail = (await api.get(f"/v1/agents/{name}")).json()
    assert detail["revisions"][0]["connection_requirements"] == [{**req, "binding_mode": "organization"}]
    before = len((await api.get("/v1/sessions", params={"limit": 500})).json()["sessions"])
    r = await api.post("/v1/sessions", json={"agent": name, "task": "t"})
    assert r.status_code == 400
    assert r.json()["error"] == (
        "requirement slot 'tracker' cannot be bound: no active connection covers create_issue on "
        "https://mcp.example.com/mcp"
    )
    assert len((await api.get("/v1/sessions", params={"limit": 500})).json()["sessions"]) == before
    # An omitted field inherits; an explicit [] clears.
    kept = (await api.post(f"/v1/agents/{name}/revisions", json={"system_prompt": "x"})).json()["revision"]
    assert kept["connection_requirements"] == detail["revisions"][0]["connection_requirements"]
    cleared = (await api.post(f"/v1/agents/{name}/revisions", json={"connection_requirements": []})).json()
    assert cleared["revision"]["connection_requirements"] == [] and cleared["revision"]["rev"] == 3
    assert (await api.post("/v1/sessions", json={"agent": name, "task": "t"})).status_code == 200
    for bad, message in [
        ({"connection_requirements": [req, req]}, "declared more than once"),
        ({"connection_requirements": [{**req, "slot": "Bad Slot"}]}, "connection_requirements.0.slot"),
        ({"connection_requirements": [{**req, "binding_mode": "anyone"}]}, "binding_mode"),
        ({"capability_bundles": ["lint"]}, "unknown capability bundle 'lint'"),
        ({"capability_bundles": ["lint", "lint@2"]}, "unknown capability bundle 'lint'"),
    ]:
        r = await api.post(f"/v1/agents/{name}/revisions", json=bad)
        assert r.status_code == 400 and message in r.json()["error"], (bad, r.text)
    assert len((await api.get(f"/v1/agents/{name}")).json()["revisions"]) == 3


async def test_every_create_answers_200_as_clients_of_the_reference_expect(api: httpx.AsyncClient) -> None:
    """spec/api-surface.md: creates answer 200 (a client written for the reference checks for 200)."""
    policy, agent, token = unique("p"), unique("agent"), "tok-" + uuid.uuid4().hex
    created: dict[str, dict[str, Any]] = {}
    async with serve(bearer(token)) as srv:
        creates: list[tuple[str, dict[str, Any]]] = [
            ("/v1/policies/clone", {"name": policy}),
            ("/v1/agents", {"name": agent, "harness": "replay", "policy": policy}),
            (f"/v1/agents/{agent}/revisions", {"system_prompt": "second"}),
            ("/v1/sessions", {"agent": agent, "task": "t"}),
            ("/v1/catalog", {"slug": unique("entry"), "name": "Entry"}),
            ("/v1/connections", {"provider": "mcp_http", "base_url": srv.url, "token": token}),
            ("/v1/triggers", {"agent": agent, "name": unique("trig"), "task_template": "t"}),
        ]
        for path, body in creates:
            r = await api.post(path, json=body)
            assert r.status_code == 200, (path, r.status_code, r.text)
            created[path] = r.json()
    await api.post(f"/v1/sessions/{created['/v1/sessions']['session']['id']}/cancel")
    await api.post(f"/v1/connections/{created['/v1/connections']['connection']['id']}/revoke")
