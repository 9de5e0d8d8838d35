"""Binding rules shared by run creation and parked runs (core.bindings)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.bindings import DEFAULT_PARK_SECS, MAX_PARK_SECS, covering, freeze_binding, park_secs, same_url, url_key


@dataclass(frozen=True)
class Cand:
    """A binding candidate as ``core.bindings`` reads one (an organization connection, nothing held for review)."""

    id: str
    base_url: str
    tools_json: list[dict[str, Any]]
    authorization_generation: int = 1
    owner_type: str = "organization"
    owner_user_id: str | None = None
    access: dict[str, Any] | None = None
    transport: str | None = None
    snapshot_version: int = 1
    protocol_version: str = "p"
    approved: dict[str, Any] | None = None


def cand(cid: str, url: str, tools: list[str]) -> Cand:
    return Cand(cid, url, [{"name": t} for t in tools])


def test_urls_compare_without_case_in_scheme_and_host_or_a_trailing_slash() -> None:
    assert url_key("HTTPS://Mcp.Example.com/mcp/") == "https://mcp.example.com/mcp"
    assert same_url("https://a.example/mcp", "https://A.example/mcp/")
    assert not same_url("https://a.example/mcp", "https://a.example/MCP")


def test_the_newest_candidate_covering_every_required_tool_wins() -> None:
    cands = [cand("new", "https://a/mcp", ["add"]), cand("old", "https://a/mcp", ["add", "echo"])]
    assert covering(cands, "https://a/mcp", ["add"]) == cands[0]
    assert covering(cands, "https://a/mcp", ["add", "echo"]) == cands[1]
    assert covering(cands, "https://b/mcp", ["add"]) is None


def test_a_frozen_surface_holds_only_the_required_tools_and_the_park_choice() -> None:
    req = {"slot": "calc", "connector": {"url": "https://a/mcp"}, "required_tools": ["add"]}
    surface = freeze_binding(req, cand("c", "https://a/mcp", ["echo", "add"]), "b1", "park")
    assert [t["name"] for t in surface["tools"]] == ["add"] and surface["when_unavailable"] == "park"
    assert (
        freeze_binding({**req, "when_unavailable": "fail"}, cand("c", "https://a/mcp", ["add"]), "b2", "park")[
            "when_unavailable"
        ]
        == "fail"
    )


def test_a_park_lasts_the_budget_bounded_by_a_day_with_a_default() -> None:
    assert park_secs(None) == DEFAULT_PARK_SECS
    assert park_secs(5) == 5
    assert park_secs(10 * MAX_PARK_SECS) == MAX_PARK_SECS
