"""Capability bundles in process: published as append-only versions, listed, described; bad ones refused naming
the problem and changing nothing; the operator's alone. Pins frozen into runs are in
``tests/integration/test_capabilities.py``."""

from __future__ import annotations

from typing import Any

from api.routes import capabilities as capability_routes
from tests.api.conftest import Api
from tests.api.connections_helpers import member, not_returning_their_model, refused


def test_every_handler_returns_the_model_it_declares() -> None:
    assert not_returning_their_model(capability_routes.router) == []


def bundle(name: str, server: str = "lint", **tool: Any) -> dict[str, Any]:
    return {
        "name": name,
        "description": "a linter",
        "servers": [
            {
                "class": "sandbox",
                "name": server,
                "command": "lint-mcp",
                "tools": [
                    {
                        "name": "check",
                        "description": "lint one file",
                        "input_schema": {
                            "type": "object",
                            "properties": {"path": {"type": "string"}},
                            "required": ["path"],
                            "additionalProperties": False,
                        },
                        **tool,
                    }
                ],
            }
        ],
    }


async def test_bundles_are_versioned_listed_and_described(api: Api) -> None:
    v1 = (await api.client.post("/v1/capabilities", json=bundle("lint"))).json()["bundle"]
    v2 = (await api.client.post("/v1/capabilities", json=bundle("lint", description="v2"))).json()["bundle"]
    assert set(v1) == {"id", "name", "version", "description", "definition_digest", "server_count", "tool_count",
                       "classes", "created_at"}  # fmt: skip
    assert (v1["version"], v2["version"]) == (1, 2) and v1["definition_digest"] != v2["definition_digest"]
    assert (v1["name"], v1["server_count"], v1["tool_count"], v1["classes"]) == ("lint", 1, 1, ["sandbox"])
    detail = (await api.client.get(f"/v1/capabilities/{v1['id']}")).json()
    assert detail["bundle"] == v1
    [server] = detail["servers"]
    assert (server["name"], server["class"], server["tool_count"]) == ("lint", "sandbox", 1)
    assert server["tools"] == [{"name": "check", "description": "lint one file"}]
    listed = (await api.client.get("/v1/capabilities")).json()["bundles"]
    assert [(b["name"], b["version"]) for b in listed] == [("lint", 2), ("lint", 1)]
    refused(await api.client.get("/v1/capabilities/00000000-0000-0000-0000-000000000000"), 404, "not found")


BAD_BUNDLES: list[tuple[dict[str, Any], str]] = [
    (
        {"name": "x", "servers": [{"class": "brokered", "name": "gh"}]},
        "brokered server 'gh' can no longer be published",
    ),
    (
        {
            "name": "x",
            "servers": [
                {
                    "class": "sandbox",
                    "name": "a",
                    "command": "c",
                    "tools": [{"name": "t", "description": "a\u202eb"}],
                }
            ],
        },
        "invisible or control characters",
    ),
    (
        {
            "name": "x",
            "servers": [
                {
                    "class": "sandbox",
                    "name": "a",
                    "command": "c",
                    "tools": [{"name": "t", "input_schema": {"type": 5}}],
                }
            ],
        },
        "not a valid JSON Schema",
    ),
    ({"name": "x", "servers": [{"class": "sandbox", "name": "A b", "command": "c"}]}, "servers.0.name"),
    ({"name": "x", "servers": [], "extra": 1}, "unknown field 'extra'"),
    ({"name": "x", "servers": [{"class": "sandbox", "name": "a"}]}, "needs a `command`"),
    (
        {"name": "x", "servers": [{"class": "sandbox", "name": "a", "command": "c"}]},
        "sandbox server 'a' declares no tools",
    ),
    (
        {"name": "x", "servers": [{"class": "sandbox", "name": "a", "command": "c", "tools": []}]},
        "sandbox server 'a' declares no tools",
    ),
]


async def test_bad_bundles_are_refused_and_change_nothing(api: Api) -> None:
    for body, message in BAD_BUNDLES:
        refused(await api.client.post("/v1/capabilities", json=body), 400, message)
    assert (await api.client.get("/v1/capabilities")).json() == {"bundles": []}


async def test_bundles_are_the_operators(api: Api) -> None:
    admin, _ = await member(api, "owner")
    for r in (await admin.get("/v1/capabilities"), await admin.post("/v1/capabilities", json=bundle("lint"))):
        refused(r, 403, "this endpoint requires the operator (admin) token")
    assert (await api.client.get("/v1/capabilities")).json() == {"bundles": []}
