"""Input the database or an HTTP header cannot hold is refused at the edge: a 400 naming it, and nothing stored.

Found by the review of issue 24: a NUL in a JSON string or a path reached PostgreSQL (500), a credential that
cannot be a header value surfaced as "cannot reach MCP server" (502), and ``POST /v1/catalog`` answered a 422
its OpenAPI document did not name.
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from cli.stack import Stack
from tests.integration.helpers import issue_token, make_agent, start_run, unique, wait_status
from tests.mcp_servers import bearer, serve

pytestmark = pytest.mark.stack

NUL = "\u0000"
REFUSED = "contains a NUL character (\\u0000), which cannot be stored"


async def counts(api: httpx.AsyncClient) -> tuple[int, int, int]:
    """What these requests could have made (runs are counted per agent: schedules of the session's other
    tests make runs of their own meanwhile)."""
    agents = (await api.get("/v1/agents")).json()["agents"]
    policies = (await api.get("/v1/policies")).json()["policies"]
    connections = (await api.get("/v1/connections")).json()["connections"]
    return len(agents), len(policies), len(connections)


async def runs_of(api: httpx.AsyncClient, agent: str) -> list[str]:
    agent_id = (await api.get(f"/v1/agents/{agent}")).json()["agent"]["id"]
    runs = (await api.get("/v1/sessions", params={"limit": 500})).json()["sessions"]
    return [r["id"] for r in runs if r["agent_id"] == agent_id]


def refused(r: httpx.Response, where: str) -> None:
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["code"] == "invalid_request", body
    assert body["error"] == f"invalid request: {where}: {REFUSED}", body


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "where"),
    [
        ("POST", "/v1/agents", {"json": {"name": "nul-agent", "harness": "replay", "system_prompt": f"a{NUL}b"}},
         "system_prompt"),
        ("POST", "/v1/agents", {"json": {"name": "nul-agent", "harness": "replay",
                                         "harness_config": {"script": [{"say": "ok"}, {"say": f"x{NUL}"}]}}},
         "harness_config.script.1.say"),
        ("POST", "/v1/policies", {"json": {"name": "nul-pol", "yaml": f"name: nul-pol\n# {NUL}\n"}}, "yaml"),
        ("POST", "/v1/connections", {"json": {"provider": "mcp_http", "base_url": "http://127.0.0.1:9/mcp",
                                              "token": "t", "display_name": f"n{NUL}"}}, "display_name"),
        ("GET", "/v1/agents/a%00b", {}, "path.ref"),
        ("GET", "/v1/policies/p%00", {}, "path.name"),
        ("GET", "/v1/sessions", {"params": {"status": f"running{NUL}"}}, "query.status"),
    ],
)  # fmt: skip
async def test_a_nul_in_a_json_string_or_a_parameter_is_400_naming_it(
    api: httpx.AsyncClient, method: str, path: str, kwargs: dict[str, Any], where: str
) -> None:
    before = await counts(api)
    refused(await api.request(method, path, **kwargs), where)
    assert await counts(api) == before


async def test_a_nul_in_a_runs_task_or_a_key_is_400_and_no_run_is_made(api: httpx.AsyncClient) -> None:
    agent = await make_agent(api, [{"say": "hi"}])
    refused(await api.post("/v1/sessions", json={"agent": agent, "task": f"do{NUL}it"}), "task")
    refused(await api.post("/v1/sessions", json={"agent": agent, "task": "t", "bindings": {f"s{NUL}": "x"}}),
            "bindings.s\\u0000")  # fmt: skip
    assert await runs_of(api, agent) == []


async def test_a_nul_a_runner_posts_is_400_not_a_server_error_it_would_retry(
    api: httpx.AsyncClient, stack: Stack
) -> None:
    run_id = await start_run(api, await make_agent(api, [{"sleep_ms": 600000}]), workspace=None)
    await wait_status(api, run_id, {"running"})
    try:
        control = await issue_token(stack.database_url or "", run_id, "control")
        before = (await api.get(f"/v1/sessions/{run_id}/events")).json()["events"]
        async with httpx.AsyncClient(base_url=stack.api_url, headers={"authorization": f"Bearer {control}"}) as runner:
            r = await runner.post(
                f"/internal/sessions/{run_id}/events",
                json={"actor": "agent", "body": {"type": "agent.message", "data": {"text": f"bin{NUL}ary"}}},
            )
        refused(r, "data.text")  # (the field named `body` is the envelope)
        assert (await api.get(f"/v1/sessions/{run_id}/events")).json()["events"] == before
    finally:
        await api.post(f"/v1/sessions/{run_id}/cancel")


@pytest.mark.parametrize("token", ["tök-" + uuid.uuid4().hex, "line\r\nX-Injected: 1"])
async def test_a_credential_that_cannot_be_a_header_value_is_400_and_nothing_is_contacted(
    api: httpx.AsyncClient, token: str
) -> None:
    before = await counts(api)
    async with serve(bearer(token)) as srv:
        r = await api.post("/v1/connections", json={"provider": "mcp_http", "base_url": srv.url, "token": token})
        assert r.status_code == 400, r.text
        assert r.json()["code"] == "bad_request"
        assert r.json()["error"] == (
            "the credential cannot be sent in the Authorization header: it must be printable ASCII "
            "(no line breaks, control or non-ASCII characters) (nothing was stored)"
        )
        assert token not in r.text
        # The same through the one-call server add (which makes a catalog entry first) and a custom header.
        r = await api.post(
            "/v1/mcp/servers",
            json={"url": srv.url, "name": unique("srv"), "token": token, "header_name": "X-Key", "scheme": ""},
        )
        assert r.status_code == 400 and "in the X-Key header" in r.json()["error"], r.text
        assert srv.recorder.http_requests == [], "nothing was sent to the server"
    assert await counts(api) == before
    assert not [c for c in (await api.get("/v1/catalog")).json()["connectors"] if c["url"] == srv.url]


async def test_replacing_a_credential_with_one_that_cannot_be_sent_changes_nothing(api: httpx.AsyncClient) -> None:
    good = "tok-" + uuid.uuid4().hex
    async with serve(bearer(good)) as srv:
        made = await api.post("/v1/connections", json={"provider": "mcp_http", "base_url": srv.url, "token": good})
        assert made.status_code == 200, made.text
        connection = made.json()["connection"]
        srv.recorder.reset()
        r = await api.put(f"/v1/connections/{connection['id']}/credential", json={"token": "naïve-" + good})
        assert r.status_code == 400 and "printable ASCII" in r.json()["error"], r.text
        assert srv.recorder.http_requests == []
        assert (await api.get(f"/v1/connections/{connection['id']}")).json()["connection"] == connection
        await api.post(f"/v1/connections/{connection['id']}/revoke")


async def test_a_catalog_entry_whose_transport_cannot_use_it_is_a_documented_422(api: httpx.AsyncClient) -> None:
    before = (await api.get("/v1/catalog")).json()
    slug = unique("bad")
    r = await api.post("/v1/catalog", json={"slug": slug, "name": "Bad", "transport": "openapi"})
    assert (r.status_code, r.json()) == (
        422,
        {"error": "an openapi catalog entry needs `transport_config`", "code": "unprocessable"},
    )
    assert (await api.get("/v1/catalog")).json() == before
    doc = (await api.get("/openapi.json")).json()
    for path in ("/v1/catalog", "/v1/mcp/servers"):
        documented = doc["paths"][path]["post"]["responses"]
        assert documented["422"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorBody"}
