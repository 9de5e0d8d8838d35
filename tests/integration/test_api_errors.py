"""Bad input gets a clear 4xx with a JSON error naming the problem, and changes nothing."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
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
        ("POST", "/v1/agents", {"json": {"name": "a b"}}, 400, "name"),
        (
            "POST",
            "/v1/agents",
            {"json": {"name": "ok-name", "harness": "gpt"}},
            422,
            "unknown harness 'gpt' (known: replay, claude-agent-sdk, codex)",
        ),
        (
            "POST",
            "/v1/agents",
            {"json": {"name": "ok-name", "harness": "replay", "model": "claude-opus-4-8"}},
            422,
            "model 'claude-opus-4-8' is not valid for harness 'replay' (valid: replay)",
        ),
        (
            "POST",
            "/v1/agents",
            {"json": {"name": "ok-name", "harness": "replay", "policy": "nope"}},
            400,
            "unknown policy 'nope'",
        ),
        (
            "POST",
            "/v1/agents",
            {
                "json": {
                    "name": "ok-name",
                    "harness": "replay",
                    "harness_config": {"script": [{"say": "a", "sleep_ms": 1}]},
                }
            },
            400,
            "exactly one of say, tool, sleep_ms",
        ),
        ("GET", "/v1/agents/nobody", {}, 404, "not found"),
        (
            "POST",
            "/v1/policies",
            {
                "json": {
                    "name": "p1",
                    "yaml": "name: p1\ntools:\n  - match: [Read]\n    action: allow\n    colour: red\n",
                }
            },
            422,
            "unknown key 'tools.0.colour'",
        ),
        (
            "POST",
            "/v1/policies",
            {"json": {"name": "p2", "yaml": "name: other\n"}},
            400,
            "policy name must match yaml `name`",
        ),
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
        ("GET", "/v1/no-such-route", {}, 404, "not_found"),
        ("POST", "/v1/agents", {"json": {"name": "ok-name", "harness": "gpt"}}, 422, "unprocessable"),
    ],
)  # fmt: skip
async def test_every_error_carries_a_machine_readable_code_beside_its_message(
    api: httpx.AsyncClient, method: str, path: str, kwargs: dict[str, object], status: int, code: str
) -> None:
    r = await api.request(method, path, **kwargs)  # type: ignore[arg-type]
    assert (r.status_code, r.json()["code"]) == (status, code), r.text
    assert set(r.json()) == {"error", "code"} and r.json()["error"]


async def test_a_missing_credential_is_401_with_code_unauthorized(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=stack.api_url) as anon:
        r = await anon.get("/v1/agents")
    assert (r.status_code, r.json()) == (401, {"error": "unauthorized", "code": "unauthorized"})


@pytest.mark.parametrize(
    ("method", "path", "kwargs"),
    [
        ("GET", "/v1/policies/demo/versions/69926590546333499654144", {}),
        ("GET", "/v1/policies/demo/versions/2147483648", {}),
        ("POST", "/v1/policies/demo/revert", {"json": {"version": 2**40, "base_version": 1}}),
        ("POST", "/v1/policies/clone", {"json": {"name": "c-big", "from": "demo", "from_version": 2**40}}),
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


async def test_a_duplicate_agent_name_is_a_conflict_and_revisions_append(api: httpx.AsyncClient) -> None:
    name = await make_agent(api, [{"say": "v1"}])
    again = await api.post("/v1/agents", json={"name": name, "harness": "replay"})
    assert (again.status_code, again.json()) == (
        409,
        {"error": f"an agent named '{name}' already exists", "code": "conflict"},
    )
    r = await api.post(f"/v1/agents/{name}/revisions", json={"system_prompt": "be careful"})
    assert r.status_code == 200 and r.json()["revision"]["rev"] == 2
    detail = (await api.get(f"/v1/agents/{name}")).json()
    revs = detail["revisions"]
    assert [r["rev"] for r in revs] == [1, 2]
    # Omitted fields inherit; the first revision is untouched.
    assert revs[1]["harness_config"] == revs[0]["harness_config"] == {"script": [{"say": "v1"}]}
    assert (revs[0]["system_prompt"], revs[1]["system_prompt"]) == (None, "be careful")
    by_id = (await api.get(f"/v1/agents/{detail['agent']['id']}")).json()
    assert by_id["agent"]["name"] == name


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


async def test_a_chunked_body_without_a_length_is_held_to_the_same_limits(api: httpx.AsyncClient) -> None:
    async def chunks(total: int, size: int = 64 * 1024) -> AsyncIterator[bytes]:
        yield b'{"name": "'
        for _ in range(total // size):
            yield b"x" * size
        yield b'"}'

    before = (await api.get("/v1/agents")).json()["agents"]
    # Over the 2 MiB ceiling with no Content-Length: refused before any route reads it.
    r = await api.post("/v1/agents", content=chunks(3 * 1024 * 1024), headers={"content-type": "application/json"})
    assert r.status_code == 413 and "byte limit" in r.json()["error"]
    # No declared length does not skip the JSON-only rule either.
    r = await api.post("/v1/agents", content=chunks(1024), headers={"content-type": "text/plain"})
    assert r.status_code == 415
    assert (await api.get("/v1/agents")).json()["agents"] == before

    async def small() -> AsyncIterator[bytes]:
        yield b'{"name": "chunked-'
        yield uuid.uuid4().hex[:8].encode() + b'", "harness": "replay", "policy": "demo"}'

    r = await api.post("/v1/agents", content=small(), headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text


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
