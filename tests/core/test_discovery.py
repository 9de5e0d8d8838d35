"""Deferred discovery's ranker and its views over a RunSpec's frozen tools (``core.discovery``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from core import discovery, wire
from core.policy import Budgets
from core.runner_env import runner_env
from core.runspec import AUTO_DEFERRED_ABOVE, RunSpec, WorkspaceSpec, resolve_tool_discovery
from tests.mcp_servers import MANY_NOUNS, MANY_VERBS, many_tool


def frozen(verb: str, noun: str) -> dict[str, Any]:
    tool = many_tool(verb, noun)
    return {"name": tool.name, "description": tool.description, "input_schema": tool.input_schema}


def surface(slot: str, tools: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"slot": slot, "connection_id": f"conn-{slot}", "tools": tools, **extra}


def make_spec(brokered: list[dict[str, Any]]) -> RunSpec:
    return RunSpec(
        run_id="run-1", tenant_id="t", agent_id="a", agent_revision_id="r", agent_name="n", harness="replay",
        model="replay", task="t", workspace=WorkspaceSpec(), autonomy="supervised", budgets=Budgets(),
        policy_id="p", policy_name="p", policy_version=1, policy_snapshot={"name": "p"}, brokered=brokered,
        tool_discovery="deferred",
    )  # fmt: skip


BIG = make_spec([surface("big", [frozen(v, n) for n in MANY_NOUNS for v in MANY_VERBS])])


def names(results: list[dict[str, Any]]) -> list[str]:
    return [r["name"] for r in results]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("archive an invoice", "mcp__big__archive_invoice"),
        ("permanently remove a webhook", "mcp__big__delete_webhook"),
        ("list shipments", "mcp__big__list_shipment"),
        ("rename milestone", "mcp__big__update_milestone"),
        ("create_customer", "mcp__big__create_customer"),
        ("mcp__big__get_certificate", "mcp__big__get_certificate"),
        ("fetch deploymentId", "mcp__big__get_deployment"),  # camelCase is split into words
        ("deployment reason", "mcp__big__archive_deployment"),  # a parameter name finds its tool
    ],
)
def test_the_right_tool_ranks_first_among_300(query: str, expected: str) -> None:
    assert names(discovery.search(BIG, query, limit=5))[0] == expected


def test_a_search_lists_name_one_line_description_connection_access_and_authorization() -> None:
    [hit] = discovery.search(BIG, "archive invoice", limit=1)
    assert hit == {
        "name": "mcp__big__archive_invoice",
        "description": "Archive an invoice: it leaves the active list but can be restored.",
        "connection": "big",
        "access": "write",  # a binding frozen before access classes: a write left to the policy (core.access)
        "needsAuthorization": False,
    }


def test_a_query_matching_nothing_finds_nothing_and_limits_are_clamped() -> None:
    assert discovery.search(BIG, "xyzzy frobnicate") == []
    assert len(discovery.search(BIG, "invoice", limit=3)) == 3
    assert len(discovery.search(BIG, "create", limit=1000)) == discovery.MAX_LIMIT
    # One query always answers in one order.
    assert discovery.search(BIG, "create") == discovery.search(BIG, "create")


def test_search_covers_only_the_frozen_tools_of_the_run() -> None:
    spec = make_spec([surface("big", [frozen("get", "invoice"), frozen("list", "invoice")])])
    assert set(names(discovery.search(spec, "invoice archive delete"))) == {
        "mcp__big__get_invoice", "mcp__big__list_invoice",
    }  # fmt: skip
    assert discovery.describe(spec, "mcp__big__delete_invoice") is None
    assert discovery.describe(spec, "get_invoice") is None, "describe takes the canonical name only"


def test_describe_returns_the_frozen_schema_and_full_description() -> None:
    tool = frozen("update", "ticket")
    tool["description"] = "Rename a ticket.\nThe old title stays in its history."
    spec = make_spec([surface("desk", [tool])])
    found = discovery.describe(spec, "mcp__desk__update_ticket")
    assert found is not None
    assert found["input_schema"] == tool["input_schema"]
    assert found["description"] == tool["description"]
    assert discovery.search(spec, "ticket")[0]["description"] == "Rename a ticket."


def test_a_connection_that_needs_authorization_is_listed_and_flagged_not_omitted() -> None:
    spec = make_spec(
        [
            surface("crm", [frozen("get", "customer")], needs_authorization=True),
            surface("desk", [frozen("get", "ticket")]),
            surface("ops", [frozen("get", "incident")]),
        ]
    )
    found = discovery.search(spec, "get", unusable_slots=frozenset({"ops"}))
    flags = {r["name"]: r["needsAuthorization"] for r in found}
    assert flags == {"mcp__crm__get_customer": True, "mcp__desk__get_ticket": False, "mcp__ops__get_incident": True}
    described = discovery.describe(spec, "mcp__crm__get_customer")
    assert described is not None and described["needsAuthorization"] is True


def test_an_unclassified_tool_is_not_discoverable_and_a_classified_one_shows_its_class() -> None:
    read, write, unclassified = frozen("get", "order"), frozen("delete", "order"), frozen("archive", "order")
    read["access"], write["access"], unclassified["access"] = "read", "write", None
    spec = make_spec([surface("shop", [read, write, unclassified])])
    found = {r["name"]: r["access"] for r in discovery.search(spec, "order")}
    assert found == {"mcp__shop__get_order": "read", "mcp__shop__delete_order": "write"}
    assert discovery.describe(spec, "mcp__shop__archive_order") is None


def test_tokens_split_words_camel_case_and_fold_plurals() -> None:
    assert discovery.tokens("listIssues for GitHub-repos") == ["list", "issue", "for", "git", "hub", "repo"]
    assert discovery.tokens("access") == ["access"]


def test_auto_is_deferred_only_above_the_threshold_and_explicit_modes_win() -> None:
    assert resolve_tool_discovery("auto", AUTO_DEFERRED_ABOVE) == "eager"
    assert resolve_tool_discovery("auto", AUTO_DEFERRED_ABOVE + 1) == "deferred"
    assert resolve_tool_discovery("deferred", 1) == "deferred"
    assert resolve_tool_discovery("eager", 10_000) == "eager"
    assert resolve_tool_discovery(None, 10_000) == "eager"


def test_the_index_is_built_once_per_spec() -> None:
    spec = make_spec([surface("big", [frozen("get", "invoice")])])
    assert discovery.index_for(spec) is discovery.index_for(spec)


class _EnvSettings:
    socket_path = Path("/tmp/fluidbox/api.sock")
    heartbeat_secs = 10.0
    token_ttl_secs = 3600
    gateway_staleness_secs = 600.0
    replay_delay_ms = 0


def test_an_eager_sandbox_gets_every_schema_and_a_deferred_one_none() -> None:
    tools = [frozen("get", "invoice"), frozen("list", "invoice")]
    eager = make_spec([surface("big", tools)]).model_copy(update={"tool_discovery": "eager"})
    env = runner_env(eager, _EnvSettings())
    assert wire.ENV_TOOL_DISCOVERY not in env
    assert json.loads(env[wire.ENV_CAPABILITIES]) == {"servers": [{"class": "brokered", "name": "big", "tools": tools}]}
    deferred = runner_env(make_spec([surface("big", tools)]), _EnvSettings())
    assert deferred[wire.ENV_TOOL_DISCOVERY] == "deferred" and wire.ENV_CAPABILITIES not in deferred
    assert "get_invoice" not in json.dumps(deferred), "no tool name or schema reaches a deferred sandbox"
