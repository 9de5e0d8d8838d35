"""Agents and their append-only revisions, in process: what a create and an append answer, what a revision
inherits, and the refusals (a clear 4xx naming the problem, nothing stored)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

from tests.api.admin_helpers import make_agent, member_with_token, unique
from tests.api.conftest import Api

REQUIREMENT = {
    "slot": "tracker",
    "connector": {"url": "https://mcp.example.com/mcp"},
    "required_tools": ["create_issue"],
    "when_unavailable": "fail",
}
CODES = {400: {"bad_request", "invalid_request"}, 404: {"not_found"}, 422: {"unprocessable"}}
REVISION_FIELDS = {
    "id", "agent_id", "rev", "harness", "runner_image", "model", "system_prompt", "policy_id", "policy", "budgets",
    "harness_config", "capability_bundles", "default_workspace", "connection_requirements", "network",
    "tool_discovery", "created_at",
}  # fmt: skip


async def agents_and_revisions(api: Api) -> list[tuple[str, int]]:
    """Every agent with how many revisions it has: what a refused call must leave as it was."""
    listed = (await api.client.get("/v1/agents")).json()["agents"]
    return [(a["name"], len((await api.client.get(f"/v1/agents/{a['id']}")).json()["revisions"])) for a in listed]


async def test_a_create_answers_the_agent_and_its_first_revision_with_the_policys_name(api: Api) -> None:
    name = unique("agent")
    r = await api.client.post(
        "/v1/agents",
        json={
            "name": name,
            "description": "triages",
            "policy": "demo",
            "system_prompt": "be brief",
            "budgets": {"max_tool_calls": 5},
            "default_workspace": {"kind": "git_repository", "url": "https://git.example.com/repo.git", "ref": "main"},
            "connection_requirements": [REQUIREMENT],
        },
    )
    assert r.status_code == 200, r.text
    agent, revision = r.json()["agent"], r.json()["revision"]
    assert set(agent) == {"id", "tenant_id", "name", "description", "created_at"}
    assert (agent["name"], agent["description"]) == (name, "triages")
    assert agent["created_at"].endswith("+00:00"), "times are isoformat, as clients of the API already parse"
    assert set(revision) == REVISION_FIELDS and revision["agent_id"] == agent["id"] and revision["rev"] == 1
    # The defaults: the Claude harness with its default model, eager tool discovery, no harness config.
    assert (revision["harness"], revision["model"], revision["tool_discovery"]) == (
        "claude-agent-sdk",
        "claude-haiku-4-5",
        "eager",
    )
    assert revision["harness_config"] == {} and revision["capability_bundles"] == []
    assert revision["policy"] == "demo" and revision["system_prompt"] == "be brief"
    assert revision["budgets"]["max_tool_calls"] == 5
    assert revision["default_workspace"] == {"kind": "git_repository", "url": "https://git.example.com/repo.git",
                                             "ref": "main"}  # fmt: skip
    assert revision["connection_requirements"] == [{**REQUIREMENT, "binding_mode": "organization"}]
    listed = (await api.client.get("/v1/agents")).json()["agents"]
    assert [a for a in listed if a["name"] == name] == [agent]
    for ref in (name, agent["id"]):
        detail = (await api.client.get(f"/v1/agents/{ref}")).json()
        assert detail == {"agent": agent, "revisions": [revision]}


async def test_a_duplicate_agent_name_is_a_conflict_and_revisions_append(api: Api) -> None:
    name = await make_agent(api.client, [{"say": "v1"}])
    before = await agents_and_revisions(api)
    again = await api.client.post("/v1/agents", json={"name": name, "harness": "replay"})
    assert (again.status_code, again.json()) == (
        409,
        {"error": f"an agent named '{name}' already exists", "code": "conflict"},
    )
    assert await agents_and_revisions(api) == before
    r = await api.client.post(f"/v1/agents/{name}/revisions", json={"system_prompt": "be careful"})
    assert r.status_code == 200 and r.json()["revision"]["rev"] == 2
    detail = (await api.client.get(f"/v1/agents/{name}")).json()
    revs = detail["revisions"]
    assert [r["rev"] for r in revs] == [1, 2]
    # Omitted fields inherit; the first revision is untouched.
    assert revs[1]["harness_config"] == revs[0]["harness_config"] == {"script": [{"say": "v1"}]}
    assert (revs[0]["system_prompt"], revs[1]["system_prompt"]) == (None, "be careful")
    by_id = (await api.client.get(f"/v1/agents/{detail['agent']['id']}")).json()
    assert by_id["agent"]["name"] == name


async def test_a_revision_inherits_what_it_omits_clears_what_it_empties_and_leaves_earlier_ones_alone(
    api: Api,
) -> None:
    name = await make_agent(api.client, [{"say": "hi"}], connection_requirements=[REQUIREMENT])
    first = (await api.client.get(f"/v1/agents/{name}")).json()["revisions"][0]
    kept = (await api.client.post(f"/v1/agents/{name}/revisions", json={"system_prompt": "x"})).json()["revision"]
    assert kept["connection_requirements"] == first["connection_requirements"]
    assert (kept["policy"], kept["harness"], kept["model"]) == ("demo", "replay", "replay")
    cleared = (await api.client.post(f"/v1/agents/{name}/revisions", json={"connection_requirements": []})).json()
    assert cleared["revision"]["connection_requirements"] == [] and cleared["revision"]["rev"] == 3
    assert cleared["revision"]["system_prompt"] == "x"
    # A harness change re-defaults the model unless one is named; the policy is named by its name.
    moved = await api.client.post(
        f"/v1/agents/{name}/revisions", json={"harness": "claude-agent-sdk", "policy": "standard"}
    )
    assert moved.status_code == 200, moved.text
    assert (moved.json()["revision"]["model"], moved.json()["revision"]["policy"]) == (
        "claude-haiku-4-5",
        "standard",
    )
    revisions = (await api.client.get(f"/v1/agents/{name}")).json()["revisions"]
    assert [r["rev"] for r in revisions] == [1, 2, 3, 4] and revisions[0] == first


BAD_REVISIONS: list[tuple[dict[str, Any], str]] = [
    ({"connection_requirements": [REQUIREMENT, REQUIREMENT]}, "declared more than once"),
    ({"connection_requirements": [{**REQUIREMENT, "slot": "Bad Slot"}]}, "connection_requirements.0.slot"),
    ({"connection_requirements": [{**REQUIREMENT, "binding_mode": "anyone"}]}, "binding_mode"),
    ({"capability_bundles": ["lint"]}, "unknown capability bundle 'lint'"),
    ({"capability_bundles": ["lint", "lint@2"]}, "unknown capability bundle 'lint'"),
    ({"capability_bundles": ["lint@two"]}, "unknown capability bundle 'lint@two'"),
    ({"policy": "nope"}, "unknown policy 'nope'"),
    ({"colour": "red"}, "unknown field 'colour'"),
    ({"tool_discovery": "lazy"}, "tool_discovery"),
]


async def test_a_bad_revision_is_400_naming_the_field_and_appends_nothing(api: Api) -> None:
    name = await make_agent(api.client, [{"say": "hi"}])
    for body, message in BAD_REVISIONS:
        r = await api.client.post(f"/v1/agents/{name}/revisions", json=body)
        assert r.status_code == 400 and message in r.json()["error"], (body, r.text)
        assert set(r.json()) == {"error", "code"} and r.json()["code"] in CODES[400], r.text
    assert await agents_and_revisions(api) == [(name, 1)]


# Moved from tests/integration/test_api_errors.py: the agents' cases of its bad-request table, and more.
BAD_REQUESTS: list[tuple[str, str, dict[str, Any] | None, int, str]] = [
    ("POST", "/v1/agents", {"name": "a b"}, 400, "name"),
    (
        "POST",
        "/v1/agents",
        {"name": "ok-name", "harness": "gpt"},
        422,
        "unknown harness 'gpt' (known: replay, claude-agent-sdk, codex)",
    ),
    (
        "POST",
        "/v1/agents",
        {"name": "ok-name", "harness": "replay", "model": "claude-opus-4-8"},
        422,
        "model 'claude-opus-4-8' is not valid for harness 'replay' (valid: replay)",
    ),
    (
        "POST",
        "/v1/agents",
        {"name": "ok-name", "harness": "replay", "policy": "nope"},
        400,
        "unknown policy 'nope'",
    ),
    (
        "POST",
        "/v1/agents",
        {"name": "ok-name", "harness": "replay", "harness_config": {"script": [{"say": "a", "sleep_ms": 1}]}},
        400,
        "exactly one of say, tool, sleep_ms",
    ),
    ("POST", "/v1/agents", {"harness": "replay"}, 400, "missing field 'name'"),
    ("GET", "/v1/agents/nobody", None, 404, "not found"),
    ("GET", f"/v1/agents/{uuid.uuid4()}", None, 404, "not found"),
    ("POST", "/v1/agents/nobody/revisions", {"system_prompt": "x"}, 404, "not found"),
]


async def test_a_bad_agent_request_gets_a_clear_error_and_changes_nothing(api: Api) -> None:
    await make_agent(api.client, [{"say": "hi"}])
    before = await agents_and_revisions(api)
    for method, path, body, status, message in BAD_REQUESTS:
        r = await api.client.request(method, path, json=body)
        assert r.status_code == status, (path, body, r.text)
        assert set(r.json()) == {"error", "code"} and message in r.json()["error"], (path, body, r.text)
        assert r.json()["code"] in CODES[status], r.text
    assert await agents_and_revisions(api) == before


async def test_a_chunked_body_without_a_length_is_held_to_the_same_limits(api: Api) -> None:
    """Moved from tests/integration/test_api_errors.py."""

    async def chunks(total: int, size: int = 64 * 1024) -> AsyncIterator[bytes]:
        yield b'{"name": "'
        for _ in range(total // size):
            yield b"x" * size
        yield b'"}'

    before = (await api.client.get("/v1/agents")).json()["agents"]
    # Over the 2 MiB ceiling with no Content-Length: refused before any route reads it.
    r = await api.client.post(
        "/v1/agents", content=chunks(3 * 1024 * 1024), headers={"content-type": "application/json"}
    )
    assert r.status_code == 413 and "byte limit" in r.json()["error"]
    # No declared length does not skip the JSON-only rule either.
    r = await api.client.post("/v1/agents", content=chunks(1024), headers={"content-type": "text/plain"})
    assert r.status_code == 415
    assert (await api.client.get("/v1/agents")).json()["agents"] == before

    async def small() -> AsyncIterator[bytes]:
        yield b'{"name": "chunked-'
        yield uuid.uuid4().hex[:8].encode() + b'", "harness": "replay", "policy": "demo"}'

    r = await api.client.post("/v1/agents", content=small(), headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text


async def test_agents_are_the_operators_a_member_token_is_refused_and_no_token_is_401(api: Api) -> None:
    owner = await member_with_token(api, ["owner"])
    async with owner.client as member, api.as_token(None) as anon:
        r = await member.post("/v1/agents", json={"name": unique("agent"), "harness": "replay"})
        assert r.status_code == 403 and "requires the operator (admin) token" in r.json()["error"], r.text
        r = await anon.get("/v1/agents")
        assert (r.status_code, r.json()) == (401, {"error": "unauthorized", "code": "unauthorized"})
    assert (await api.client.get("/v1/agents")).json()["agents"] == []
