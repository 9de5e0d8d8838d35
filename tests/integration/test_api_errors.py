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
    ("method", "path", "kwargs", "status", "code"),
    [
        ("GET", "/v1/no-such-route", {}, 404, "not_found"),
    ],
)  # fmt: skip
async def test_every_error_carries_a_machine_readable_code_beside_its_message(
    api: httpx.AsyncClient, method: str, path: str, kwargs: dict[str, object], status: int, code: str
) -> None:
    r = await api.request(method, path, **kwargs)  # type: ignore[arg-type]
    assert (r.status_code, r.json()["code"]) == (status, code), r.text
    assert set(r.json()) == {"error", "code"} and r.json()["error"]


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
